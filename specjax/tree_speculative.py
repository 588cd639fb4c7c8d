"""Tree speculative decoding: draft a token tree, verify all its nodes in one pass, keep one path.

The loop is `specjax.decode`'s; `TreeVerifier` is its verify plug-in. Each iteration of the
`lax.while_loop` (compare `specjax.speculative`, the chain special case):
  1. the tree drafter proposes an N-node `TokenTree` per row (node 0 = the last committed token);
  2. the target reads the N nodes in one forward pass at slots L .. L + N - 1 of its cache
     (L = seq_len - 1), RoPE positions L + depth, attending to the cache and the node's ancestors;
  3. a tree rule (`specjax.tree_acceptance`), vmapped over rows, picks the accepted root-to-node
     path of n_b nodes and one more token;
  4. every row commits its n_b + 1 tokens (cut at a stop token or its budget): the K/V of the
     accepted nodes are moved from their node slots to the contiguous slots L + 1 .. L + n_b on
     every layer (one gather and one scatter per row), the rest are dropped by the cache length,
     and the drafter gets the target's hidden states along the accepted path.
The loop ends when every row is done; nothing syncs with the host inside it.

With an `AdaptiveConfig` (choices (0, max_depth)) each step instead runs either the tree step or a
plain AR step, chosen on device from running per-row acceptance-per-depth estimates and a cost
table (`specjax.adaptive`, `adaptive_tree_loop` below).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from specjax import adaptive as adp
from specjax.config import ModelConfig
from specjax.decode import (
  DecodeState,
  Verified,
  check_capacity,
  finish,
  row_budgets,
  run,
  spec_step,
  start,
)
from specjax.drafters.base import (  # noqa: F401 - re-exported: the tree protocol's old home
  TreeDrafter,
  TreeProposal,
  TreeStepResult,
)
from specjax.generate import GenerateConfig
from specjax.kv_cache import compact_path
from specjax.metrics import SpecMetrics
from specjax.model import Params
from specjax.sampling import SamplingConfig
from specjax.speculative import SpecOutput, ar_fallback, step_keywords
from specjax.target import TargetModel, as_target
from specjax.tree_acceptance import (
  DRAWS,
  TreeGreedyRule,
  TreePointMassRule,
  TreeSpeculativeRule,
)
from specjax.trees import gather_path


@dataclasses.dataclass(frozen=True)
class TreeVerifier:
  """The tree loop's verify plug-in: the target reads the N nodes in one pass (RoPE positions
  L + depth, attending to the cache and the node's ancestors), the tree rule picks the accepted
  path, and the accepted nodes' K/V move to contiguous slots L + 1 .. L + n_b (`compact_path`).

  Attributes:
    rule: a tree rule (`specjax.tree_acceptance`).
    sampling: how the target's logits are processed before the rule sees them.
    max_depth: the drafter's deepest node.
  """

  rule: Any
  sampling: SamplingConfig
  max_depth: int

  def verify(self, key, s: DecodeState, prop, *, params, cfg, hidden_layers) -> Verified:
    B, D = s.seq.shape[0], self.max_depth
    tree = prop.tree
    base = s.seq_len - 1  # == s.cache.lengths
    out = as_target(cfg).forward(
      params, tree.tokens, s.cache, positions=base[:, None] + tree.depth, new_mask=tree.mask,
      hidden_layers=hidden_layers,
    )  # fmt: skip
    logp = self.sampling.logprobs(out.logits)  # [B, N, V]
    rule_fn = functools.partial(self.rule, max_depth=D)
    path, n_acc, nxt = jax.vmap(rule_fn)(jax.random.split(key, B), tree, logp)
    # Candidates: the accepted nodes' tokens, then the rule's token at index n (junk past it).
    cand = gather_path(tree.tokens, path)[:, 1:]
    cand = jnp.concatenate([cand, jnp.zeros((B, 1), jnp.int32)], 1)
    cand = jnp.where(jnp.arange(D + 1)[None, :] == n_acc[:, None], nxt[:, None], cand)
    layer_hidden = None
    if out.layer_hidden is not None:
      layer_hidden = jax.vmap(lambda h: gather_path(h, path))(out.layer_hidden)
    n_drafted = jnp.full((B,), tree.n_nodes - 1, jnp.int32)
    if prop.n_drafted is not None:
      n_drafted = prop.n_drafted
    cache = compact_path(out.cache, base, path)
    hidden = gather_path(out.hidden, path)
    return Verified(cand, n_acc, n_drafted, cache, hidden, layer_hidden, path)

  def account(self, metrics: SpecMetrics, live, v: Verified, m) -> SpecMetrics:
    return metrics.update(live, v.n_drafted, v.n_accepted, m)


def _tree_step(s: DecodeState, *, gen, rule, **kw) -> DecodeState:
  """One tree step (`decode.spec_step` with the tree verifier)."""
  verifier = TreeVerifier(rule, gen.sampling, kw["drafter"].max_depth)
  return spec_step(
    s, verifier=verifier, draft_sampling=gen.sampling, stop_tokens=gen.stop_tokens, **kw
  )


def tree_capacity(prompt_width: int, gen: GenerateConfig, drafter) -> int:
  """Cache slots per row: prompt + budget + one tree of N nodes + the drafter's slack."""
  return (
    gen.capacity or prompt_width + gen.max_new_tokens + drafter.n_nodes + drafter.capacity_slack()
  )


def adaptive_tree_loop(state, step_kw: dict, stateless: bool, adaptive, step_costs):
  """`adp.run_adaptive` over [`adp.ar_step`, `_tree_step`]: an AR step or the drafter's tree."""
  drafter, gen = step_kw["drafter"], step_kw["gen"]
  width = drafter.max_depth + 1
  observe = adp.observer(drafter, step_kw["draft_params"], width, stateless, gen.sampling, True)
  ar = functools.partial(
    adp.ar_step, params=step_kw["params"], cfg=step_kw["cfg"], gen=gen,
    prompt_lens=step_kw["prompt_lens"], budgets=step_kw["budgets"], observe=observe,
    hidden_layers=drafter.hidden_layers,
  )  # fmt: skip
  tree = functools.partial(_tree_step, **{**step_kw, "drafter": adp.Adapted(drafter, width)})
  return adp.run_adaptive(state, (ar, tree), adaptive, step_costs, gen.max_new_tokens)


@functools.partial(jax.jit, static_argnames=("cfg", "drafter", "rule", "gen", "adaptive"))
def _tree_speculative(
  params, draft_params, prompts, prompt_lens, budgets, key, cfg, drafter, rule, gen,
  adaptive=None, step_costs=None,
):  # fmt: skip
  B, Tp = prompts.shape
  state = start(
    params, cfg, prompts, prompt_lens, budgets, key, capacity=tree_capacity(Tp, gen, drafter),
    sampling=gen.sampling, stop_tokens=gen.stop_tokens,
    metrics=SpecMetrics.zeros(B, drafter.max_depth), drafter=drafter, draft_params=draft_params,
  )  # fmt: skip
  kw = step_keywords(params, draft_params, cfg, drafter, rule, gen, prompt_lens, budgets)
  if adaptive is None:
    state, trace = run(state, functools.partial(_tree_step, **kw)), None
  else:
    stateless = not jax.tree.leaves(state.draft_state)
    state, trace = adaptive_tree_loop(state, kw, stateless, adaptive, step_costs)
  tokens, n_new = finish(state, prompt_lens, gen.max_new_tokens)
  return SpecOutput(tokens, n_new, state.metrics, trace)


def default_tree_rule(drafter, sampling: SamplingConfig):
  """Greedy at temperature 0; otherwise the q-aware rule if the children were sampled, else q = 1."""
  if sampling.greedy:
    return TreeGreedyRule()
  if drafter.draws in DRAWS:
    return TreeSpeculativeRule(drafter.draws)
  return TreePointMassRule()


def check_rule(rule, drafter, sampling: SamplingConfig) -> None:
  """Raises ValueError for rule/drafter/sampling combinations that would not be what they claim."""
  if isinstance(rule, TreeGreedyRule) and not sampling.greedy:
    raise ValueError(
      "TreeGreedyRule is exact only at temperature 0; use TreeSpeculativeRule or TreePointMassRule"
    )
  if isinstance(rule, TreeSpeculativeRule) and not sampling.greedy and drafter.draws != rule.draws:
    raise ValueError(
      f"TreeSpeculativeRule(draws={rule.draws!r}) is lossless only for children drawn that way, but "
      f"the drafter's children are {drafter.draws!r}; use TreePointMassRule"
    )


def tree_speculative_generate(
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
  """Tree speculative decoding of a batch of prompts.

  Args:
    params: target weights.
    cfg: the target model (static): a ModelConfig for specjax's Llama forward, or any
      `specjax.target.TargetModel` (e.g. `specjax.nnx_target.NNXTarget`).
    drafter: a static tree drafter (`specjax.drafters.tree_draft_model`, `HeadTreeDrafter`, ...).
    draft_params: the drafter's parameters.
    prompts: [B, Tp] right-padded prompts (`specjax.generate.pad_prompts`).
    prompt_lens: [B] prompt lengths.
    gen: static generation settings shared with the AR baseline.
    rule: a tree rule (`specjax.tree_acceptance`); default from `default_tree_rule`.
    key: PRNG key.
    max_new_per_row: optional [B] budgets.
    adaptive: adaptive speculation with choices (0, drafter.max_depth): each step is an AR step
      or a tree step (`specjax.adaptive`); None: every step drafts a tree.
    costs: the cost table for `adaptive`; required with it. If under it the loop would never
      draft (`adp.never_drafts`), the plain AR loop runs (`specjax.speculative.ar_fallback`)
      unless `adaptive.ar_fallback` is False.

  Returns:
    A `SpecOutput`; metrics count N - 1 drafted nodes per pass and per-depth acceptance (and
    the choice trace when adaptive).
  """
  B, Tp = prompts.shape
  rule = default_tree_rule(drafter, gen.sampling) if rule is None else rule
  check_rule(rule, drafter, gen.sampling)
  check_capacity(Tp, gen.max_new_tokens, drafter.n_nodes + drafter.capacity_slack(), gen.capacity)
  budgets = row_budgets(B, gen.max_new_tokens, max_new_per_row)
  key = jax.random.PRNGKey(0) if key is None else key
  prompt_lens = jnp.asarray(prompt_lens, jnp.int32)
  step_costs = None
  if adaptive is not None:
    if adaptive.ks != (0, drafter.max_depth):
      raise ValueError(f"the tree loop chooses K in (0, max_depth={drafter.max_depth})")
    step_costs = adp.check_costs(adaptive, costs)
    if adaptive.ar_fallback and adp.never_drafts(adaptive, costs):
      return ar_fallback(
        params, cfg, prompts, prompt_lens, gen, key, max_new_per_row, adaptive.ks,
        drafter.max_depth,
      )  # fmt: skip
  return _tree_speculative(
    params, draft_params, prompts, prompt_lens, budgets, key, cfg, drafter, rule, gen, adaptive,
    step_costs,
  )  # fmt: skip
