"""Speculative decoding: draft, verify and accept, all rows and all steps in one compiled loop.

The loop is `specjax.decode`'s; `ChainVerifier` is its verify plug-in. Each iteration of the
`lax.while_loop`:
  1. the drafter proposes K tokens per row (with their draft distributions q, or none);
  2. the target scores [last token, d_1 .. d_K] in one forward pass over K + 1 positions per row;
  3. the acceptance rule, vmapped over rows, keeps n_b drafts and draws one more token;
  4. every row commits its own n_b + 1 tokens (truncated at a stop token or its budget): sequence
     buffer, cache length and drafter state advance per row; finished rows stay put.
The loop ends when every row is done. Nothing syncs with the host inside it.

With an `AdaptiveConfig` the loop instead picks K each step among precompiled step variants,
including K = 0 (a plain AR step), from running acceptance estimates and a cost table
(`specjax.adaptive`, `adaptive_loop` below).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from specjax import adaptive as adp
from specjax.acceptance import GreedyRule, SpeculativeSamplingRule
from specjax.config import ModelConfig
from specjax.decode import (
  DecodeState,
  Verified,
  check_capacity,
  commit_count,  # noqa: F401 - re-exported
  finish,
  last_tokens,
  row_budgets,
  run,
  spec_step,
  start,
)
from specjax.generate import GenerateConfig, generate
from specjax.metrics import SpecMetrics
from specjax.model import Params
from specjax.sampling import SamplingConfig
from specjax.target import TargetModel, as_target


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SpecOutput:
  """Result of `speculative_generate`.

  Attributes:
    tokens: [B, max_new_tokens] generated tokens (0 past `lengths`).
    lengths: [B] generated tokens per row, including the prefill's first token.
    metrics: per-row counters (see `specjax.metrics`).
    adaptive: the K chosen per step and per row (adaptive mode only, else None).
  """

  tokens: jax.Array
  lengths: jax.Array
  metrics: SpecMetrics
  adaptive: adp.AdaptiveTrace | None = None


def hidden_layers_of(drafter) -> tuple[int, ...]:
  """Target layers a drafter consumes (`Drafter.hidden_layers`)."""
  return tuple(drafter.hidden_layers)


@dataclasses.dataclass(frozen=True)
class ChainVerifier:
  """The chain loop's verify plug-in: the target scores [last token, d_1 .. d_K] in one pass and
  the acceptance rule, vmapped over rows, keeps n_b drafts and draws one more token.

  Attributes:
    rule: an acceptance rule (`specjax.acceptance`).
    sampling: how the target's logits are processed before the rule sees them.
  """

  rule: Any
  sampling: SamplingConfig

  def verify(self, key, s: DecodeState, prop, *, params, cfg, hidden_layers) -> Verified:
    B = s.seq.shape[0]
    verify_tokens = jnp.concatenate([last_tokens(s), prop.tokens], 1)  # [B, K + 1]
    out = as_target(cfg).forward(params, verify_tokens, s.cache, hidden_layers=hidden_layers)
    logp = self.sampling.logprobs(out.logits)  # [B, K + 1, V]
    in_q = None if prop.logq is None else 0
    n_acc, nxt = jax.vmap(self.rule, in_axes=(0, 0, in_q, 0, 0))(
      jax.random.split(key, B), prop.tokens, prop.logq, logp, prop.n_drafted
    )
    # Candidates: d_1 .. d_n then the rule's token at index n (entries past n are junk).
    cand = jnp.concatenate([prop.tokens, jnp.zeros((B, 1), jnp.int32)], 1)
    cand = jnp.where(jnp.arange(cand.shape[1])[None, :] == n_acc[:, None], nxt[:, None], cand)
    return Verified(cand, n_acc, prop.n_drafted, out.cache, out.hidden, out.layer_hidden)

  def account(self, metrics: SpecMetrics, live, v: Verified, m) -> SpecMetrics:
    return metrics.update(live, v.n_drafted, v.n_accepted, m)


def _spec_step(s: DecodeState, *, gen, rule, **kw) -> DecodeState:
  """One chain step (`decode.spec_step` with the chain verifier)."""
  verifier = ChainVerifier(rule, gen.sampling)
  return spec_step(
    s, verifier=verifier, draft_sampling=gen.sampling, stop_tokens=gen.stop_tokens, **kw
  )


def step_keywords(params, draft_params, cfg, drafter, rule, gen, prompt_lens, budgets) -> dict:
  """The keyword arguments of a speculative loop's step function (and of `adaptive_loop`)."""
  return dict(
    params=params, draft_params=draft_params, cfg=cfg, drafter=drafter, rule=rule, gen=gen,
    prompt_lens=prompt_lens, budgets=budgets,
  )  # fmt: skip


def adaptive_loop(state, step_kw: dict, drafter, stateless: bool, adaptive, step_costs):
  """`adp.run_adaptive` over one `_spec_step` per K > 0 (the drafter with k = K, see
  `adp.Adapted`) and `adp.ar_step` for K = 0."""
  width = drafter.k + 1  # drafter.k = K_max
  gen, dp = step_kw["gen"], step_kw["draft_params"]
  observe = adp.observer(drafter, dp, width, stateless, gen.sampling)
  ar = functools.partial(
    adp.ar_step, params=step_kw["params"], cfg=step_kw["cfg"], gen=gen,
    prompt_lens=step_kw["prompt_lens"], budgets=step_kw["budgets"], observe=observe,
    hidden_layers=drafter.hidden_layers,
  )  # fmt: skip

  def make_step(k):
    adapted = adp.Adapted(dataclasses.replace(drafter, k=k), width)
    return functools.partial(_spec_step, **{**step_kw, "drafter": adapted})

  steps = adp.branches(make_step, ar, adaptive.ks)
  return adp.run_adaptive(state, steps, adaptive, step_costs, gen.max_new_tokens)


def ar_fallback(params, cfg, prompts, prompt_lens, gen, key, max_new_per_row, ks, k) -> SpecOutput:
  """What an adaptive loop that never drafts (`adp.never_drafts`) returns, from the plain AR loop:
  the same tokens, counters with one target pass per committed token, and a trace of K = 0 steps.

  Args:
    ks: the adaptive choices; k: the per-depth counters' width (the loop's K_max or tree depth).
  """
  out = generate(params, cfg, prompts, prompt_lens, gen, key, max_new_per_row)
  passes = out.target_passes
  zeros, zk = jnp.zeros_like(passes), jnp.zeros((passes.shape[0], k), jnp.int32)
  metrics = SpecMetrics(passes, zeros, zeros, passes, zk, zk)
  return SpecOutput(out.tokens, out.lengths, metrics, adp.ar_trace(passes, ks, gen.max_new_tokens))


@functools.partial(jax.jit, static_argnames=("cfg", "drafter", "rule", "gen", "adaptive"))
def _speculative(
  params, draft_params, prompts, prompt_lens, budgets, key, cfg, drafter, rule, gen,
  adaptive=None, step_costs=None,
):  # fmt: skip
  B, Tp = prompts.shape
  capacity = gen.capacity or Tp + gen.max_new_tokens + drafter.k + 1 + drafter.capacity_slack()
  state = start(
    params, cfg, prompts, prompt_lens, budgets, key, capacity=capacity, sampling=gen.sampling,
    stop_tokens=gen.stop_tokens, metrics=SpecMetrics.zeros(B, drafter.k), drafter=drafter,
    draft_params=draft_params,
  )  # fmt: skip
  kw = step_keywords(params, draft_params, cfg, drafter, rule, gen, prompt_lens, budgets)
  trace = None
  if adaptive is None:
    state = run(state, functools.partial(_spec_step, **kw))
  else:
    stateless = not jax.tree.leaves(state.draft_state)
    state, trace = adaptive_loop(state, kw, drafter, stateless, adaptive, step_costs)
  tokens, n_new = finish(state, prompt_lens, gen.max_new_tokens)
  return SpecOutput(tokens, n_new, state.metrics, trace)


def speculative_generate(
  params: Params,
  cfg: ModelConfig | TargetModel,
  drafter,
  draft_params,
  prompts: jax.Array,
  prompt_lens: jax.Array,
  gen: GenerateConfig,
  rule=None,
  key: jax.Array | None = None,
  max_new_per_row: jax.Array | None = None,
  adaptive: adp.AdaptiveConfig | None = None,
  costs: adp.CostTable | None = None,
) -> SpecOutput:
  """Speculative decoding of a batch of prompts with any drafter and acceptance rule.

  Args:
    params: target weights.
    cfg: the target model (static): a ModelConfig for specjax's Llama forward, or any
      `specjax.target.TargetModel` (e.g. `specjax.nnx_target.NNXTarget`).
    drafter: a static drafter object (see `specjax.drafters`).
    draft_params: the drafter's parameters pytree (() for prompt lookup).
    prompts: [B, Tp] right-padded prompts (`specjax.generate.pad_prompts`).
    prompt_lens: [B] prompt lengths.
    gen: static generation settings shared with the AR baseline.
    rule: acceptance rule (`specjax.acceptance`); default GreedyRule at temperature 0 and
      SpeculativeSamplingRule otherwise. GreedyRule needs temperature 0.
    key: PRNG key.
    max_new_per_row: optional [B] budgets.
    adaptive: adaptive speculation (`specjax.adaptive`): each step picks K among
      `adaptive.ks` (0 = an AR step); the drafter runs with k = K, and caches are sized for
      K_max. None: every step drafts `drafter.k`.
    costs: the cost table for `adaptive` (same choices); required with it. If under it the loop
      would never draft (`adp.never_drafts`), the plain AR loop runs (`ar_fallback`) unless
      `adaptive.ar_fallback` is False.

  Returns:
    A `SpecOutput` with tokens, lengths and per-row metrics (and the K trace when adaptive).
  """
  B, Tp = prompts.shape
  step_costs = None
  if adaptive is not None:
    step_costs = adp.check_costs(adaptive, costs)
    drafter = dataclasses.replace(drafter, k=max(*adaptive.ks, 1))
  if rule is None:
    rule = GreedyRule() if gen.sampling.greedy else SpeculativeSamplingRule()
  if isinstance(rule, GreedyRule) and not gen.sampling.greedy:
    raise ValueError(
      "GreedyRule is exact only at temperature 0; use SpeculativeSamplingRule for sampling"
    )
  if adaptive is not None and adaptive.ar_fallback and adp.never_drafts(adaptive, costs):
    return ar_fallback(
      params, cfg, prompts, prompt_lens, gen, key, max_new_per_row, adaptive.ks, drafter.k
    )
  slack = drafter.k + 1 + drafter.capacity_slack()
  check_capacity(Tp, gen.max_new_tokens, slack, gen.capacity)
  budgets = row_budgets(B, gen.max_new_tokens, max_new_per_row)
  key = jax.random.PRNGKey(0) if key is None else key
  prompt_lens = jnp.asarray(prompt_lens, jnp.int32)
  return _speculative(
    params, draft_params, prompts, prompt_lens, budgets, key, cfg, drafter, rule, gen, adaptive,
    step_costs,
  )  # fmt: skip
