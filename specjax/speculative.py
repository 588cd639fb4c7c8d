"""Speculative decoding: draft, verify and accept, all rows and all steps in one compiled loop.

Each iteration of the `lax.while_loop`:
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
from specjax.drafters.base import StepResult
from specjax.generate import (
  GenerateConfig,
  check_capacity,
  extract_new_tokens,
  init_sequence,
  is_stop,
  prefill,
)
from specjax.kv_cache import KVCache, write_rows
from specjax.metrics import SpecMetrics
from specjax.model import Params, forward


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
  """Target layers a drafter consumes (its optional `hidden_layers` attribute)."""
  return tuple(getattr(drafter, "hidden_layers", ()))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _SpecState:
  seq: jax.Array  # [B, S]
  seq_len: jax.Array  # [B]
  cache: KVCache  # target cache, holds seq[:, :seq_len - 1]
  draft_state: Any
  done: jax.Array  # [B]
  metrics: SpecMetrics
  key: jax.Array


def commit_count(candidates, n_accepted, n_new, budgets, stop_tokens):
  """Tokens each row appends: n_accepted + 1, cut after the first stop token and at the budget."""
  k1 = candidates.shape[1]
  pos = jnp.arange(k1)[None, :]
  stops = is_stop(candidates, stop_tokens) & (pos <= n_accepted[:, None])
  first_stop = jnp.where(jnp.any(stops, 1), jnp.argmax(stops, 1), k1)
  return jnp.minimum(jnp.minimum(n_accepted + 1, first_stop + 1), budgets - n_new)


def _spec_step(
  s: _SpecState, *, params, draft_params, cfg, drafter, rule, gen, prompt_lens, budgets
):
  B = s.seq.shape[0]
  key, k_draft, k_rule = jax.random.split(s.key, 3)
  prop = drafter.propose(draft_params, s.draft_state, s.seq, s.seq_len, k_draft, gen.sampling)
  last = jnp.take_along_axis(s.seq, (s.seq_len - 1)[:, None], 1)
  verify_tokens = jnp.concatenate([last, prop.tokens], 1)  # [B, K + 1]
  out = forward(params, verify_tokens, s.cache, cfg, hidden_layers=hidden_layers_of(drafter))
  logp = gen.sampling.logprobs(out.logits)  # [B, K + 1, V]
  rule_keys = jax.random.split(k_rule, B)
  in_q = None if prop.logq is None else 0
  n_acc, nxt = jax.vmap(rule, in_axes=(0, 0, in_q, 0, 0))(
    rule_keys, prop.tokens, prop.logq, logp, prop.n_drafted
  )
  # Candidates: d_1 .. d_n then the rule's token at index n (entries past n are junk).
  cand = jnp.concatenate([prop.tokens, jnp.zeros((B, 1), jnp.int32)], 1)
  cand = jnp.where(jnp.arange(cand.shape[1])[None, :] == n_acc[:, None], nxt[:, None], cand)
  live = ~s.done
  n_new = s.seq_len - prompt_lens
  m = jnp.where(live, commit_count(cand, n_acc, n_new, budgets, gen.stop_tokens), 0)
  seq = write_rows(s.seq, cand, s.seq_len)  # past seq_len + m (and for done rows) it stays stale
  seq_len = s.seq_len + m
  committed = jnp.arange(cand.shape[1])[None, :] < m[:, None]
  hit_stop = jnp.any(is_stop(cand, gen.stop_tokens) & committed, 1)
  done = s.done | hit_stop | (seq_len - prompt_lens >= budgets)
  step = StepResult(s.seq_len, n_acc, m, out.hidden, out.layer_hidden)
  draft_state = drafter.commit(draft_params, prop.state, seq, seq_len, step)
  metrics = s.metrics.update(live, prop.n_drafted, n_acc, m)
  return _SpecState(
    seq, seq_len, out.cache.with_lengths(seq_len - 1), draft_state, done, metrics, key
  )


def adaptive_loop(state, step_kw: dict, drafter, stateless: bool, adaptive, step_costs):
  """`adp.run_adaptive` over one `_spec_step` per K > 0 (the drafter with k = K, see
  `adp.Adapted`) and `adp.ar_step` for K = 0."""
  width = drafter.k + 1  # drafter.k = K_max
  gen, dp = step_kw["gen"], step_kw["draft_params"]
  observe = adp.observer(drafter, dp, width, stateless, gen.sampling)
  ar = functools.partial(
    adp.ar_step, params=step_kw["params"], cfg=step_kw["cfg"], gen=gen,
    prompt_lens=step_kw["prompt_lens"], budgets=step_kw["budgets"], observe=observe,
    hidden_layers=hidden_layers_of(drafter),
  )  # fmt: skip

  def make_step(k):
    adapted = adp.Adapted(dataclasses.replace(drafter, k=k), width)
    return functools.partial(_spec_step, **{**step_kw, "drafter": adapted})

  steps = adp.branches(make_step, ar, adaptive.ks)
  return adp.run_adaptive(state, steps, adaptive, step_costs, gen.max_new_tokens)


@functools.partial(jax.jit, static_argnames=("cfg", "drafter", "rule", "gen", "adaptive"))
def _speculative(
  params, draft_params, prompts, prompt_lens, budgets, key, cfg, drafter, rule, gen,
  adaptive=None, step_costs=None,
):  # fmt: skip
  B, Tp = prompts.shape
  capacity = gen.capacity or Tp + gen.max_new_tokens + drafter.k + 1 + drafter.capacity_slack()
  pre = prefill(params, cfg, prompts, prompt_lens, capacity, hidden_layers_of(drafter))
  key, sub = jax.random.split(key)
  first = gen.sampling.sample(sub, pre.logits)
  seq = init_sequence(prompts, prompt_lens, capacity)
  seq = seq.at[jnp.arange(B), prompt_lens].set(first)
  draft_state = drafter.init(draft_params, pre, prompts, prompt_lens, capacity)
  done = is_stop(first, gen.stop_tokens) | (budgets <= 1)
  state = _SpecState(
    seq, prompt_lens + 1, pre.cache, draft_state, done, SpecMetrics.zeros(B, drafter.k), key
  )
  body = functools.partial(
    _spec_step,
    params=params,
    draft_params=draft_params,
    cfg=cfg,
    drafter=drafter,
    rule=rule,
    gen=gen,
    prompt_lens=prompt_lens,
    budgets=budgets,
  )
  trace = None
  if adaptive is None:
    state = jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, state)
  else:
    stateless = not jax.tree.leaves(draft_state)
    state, trace = adaptive_loop(state, body.keywords, drafter, stateless, adaptive, step_costs)
  n_new = state.seq_len - prompt_lens
  tokens = extract_new_tokens(state.seq, prompt_lens, n_new, gen.max_new_tokens)
  return SpecOutput(tokens, n_new, state.metrics, trace)


def speculative_generate(
  params: Params,
  cfg: ModelConfig,
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
    cfg: target config (static).
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
    costs: the cost table for `adaptive` (same choices); required with it.

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
  slack = drafter.k + 1 + drafter.capacity_slack()
  check_capacity(Tp, gen.max_new_tokens, slack, gen.capacity)
  budgets = jnp.full((B,), gen.max_new_tokens, jnp.int32)
  if max_new_per_row is not None:
    budgets = jnp.minimum(budgets, jnp.asarray(max_new_per_row, jnp.int32))
  key = jax.random.PRNGKey(0) if key is None else key
  prompt_lens = jnp.asarray(prompt_lens, jnp.int32)
  return _speculative(
    params, draft_params, prompts, prompt_lens, budgets, key, cfg, drafter, rule, gen, adaptive,
    step_costs,
  )  # fmt: skip
