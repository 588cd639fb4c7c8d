"""Tree speculative decoding: draft a token tree, verify all its nodes in one pass, keep one path.

Each iteration of the `lax.while_loop` (compare `specjax.speculative`, the chain special case):
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
from typing import Any, Protocol

import jax
import jax.numpy as jnp

from specjax import adaptive as adp
from specjax.config import ModelConfig
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
from specjax.sampling import SamplingConfig
from specjax.speculative import SpecOutput, commit_count, hidden_layers_of
from specjax.tree_acceptance import (
  DRAWS,
  TreeGreedyRule,
  TreePointMassRule,
  TreeSpeculativeRule,
)
from specjax.trees import TokenTree, gather_path


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TreeProposal:
  """A drafted tree per row and the drafter state after drafting it.

  Attributes:
    tree: the rows' trees.
    state: the drafter state after drafting.
    n_drafted: optional [B] real drafted nodes, for the metrics of a drafter whose trees leave
      slots unused (default: all N - 1).
  """

  tree: TokenTree
  state: Any
  n_drafted: jax.Array | None = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TreeStepResult:
  """What the loop tells a tree drafter after verification (a superset of `StepResult`).

  Attributes:
    prev_seq_len: [B] sequence lengths before this step.
    n_accepted: [B] accepted drafted nodes (the depth of the accepted path).
    n_committed: [B] tokens appended this step (0 for finished rows).
    hidden: [B, P, D] the target's final hidden states along the accepted path (P = max depth + 1;
      index 0 is the root, index i the accepted node of depth i), as in the chain loop.
    layer_hidden: [n, B, P, D] the requested layer outputs along the path, or None.
    path: [B, P] node ids of the accepted path (entries past n_accepted are junk).
  """

  prev_seq_len: jax.Array
  n_accepted: jax.Array
  n_committed: jax.Array
  hidden: jax.Array
  layer_hidden: jax.Array | None
  path: jax.Array


class TreeDrafter(Protocol):
  """Structural type of a tree drafter.

  Attributes:
    n_nodes: N, nodes per drafted tree including the root (static).
    max_depth: the deepest node's depth (static).
    draws: how children are chosen when sampling: "deterministic" (top-k), or "without_replacement"
      / "iid" draws from the logq the proposal reports.
    hidden_layers: target layers the drafter consumes (see `specjax.drafters.base.Drafter`).
  """

  n_nodes: int
  max_depth: int
  draws: str
  hidden_layers: tuple[int, ...]

  def capacity_slack(self) -> int: ...

  def init(self, params, prefill, prompts, prompt_lens, capacity: int) -> Any: ...

  def propose(self, params, state, seq, seq_len, key, sampling: SamplingConfig) -> TreeProposal: ...

  def commit(self, params, state, seq, seq_len, step: TreeStepResult) -> Any: ...


def compact_path(cache: KVCache, base: jax.Array, path: jax.Array) -> KVCache:
  """Moves the K/V at slots base + path[:, j] to base + j on every layer (per row).

  Args:
    cache: [L, B, S, ...] keys and values; lengths untouched.
    base: [B] slot of node 0 (the root) in each row.
    path: [B, P] node ids, path[:, 0] = 0.

  Returns:
    The cache with the path's entries contiguous from `base`. Gathers before it scatters, so
    overlapping sources and destinations are fine; slots past the committed length get junk.
  """
  B, P = path.shape
  rows = jnp.arange(B)[:, None]
  src = base[:, None] + path
  dst = base[:, None] + jnp.arange(P, dtype=jnp.int32)[None, :]

  def move(buf):
    return buf.at[:, rows, dst].set(buf[:, rows, src], mode="promise_in_bounds")

  return KVCache(move(cache.k), move(cache.v), cache.lengths)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _TreeState:
  seq: jax.Array  # [B, S]
  seq_len: jax.Array  # [B]
  cache: KVCache  # target cache, holds seq[:, :seq_len - 1]
  draft_state: Any
  done: jax.Array  # [B]
  metrics: SpecMetrics
  key: jax.Array


def _tree_step(
  s: _TreeState, *, params, draft_params, cfg, drafter, rule, gen, prompt_lens, budgets
):
  B = s.seq.shape[0]
  D = drafter.max_depth
  key, k_draft, k_rule = jax.random.split(s.key, 3)
  prop = drafter.propose(draft_params, s.draft_state, s.seq, s.seq_len, k_draft, gen.sampling)
  tree = prop.tree
  base = s.seq_len - 1  # == s.cache.lengths
  out = forward(
    params,
    tree.tokens,
    s.cache,
    cfg,
    positions=base[:, None] + tree.depth,
    new_mask=tree.mask,
    hidden_layers=hidden_layers_of(drafter),
  )
  logp = gen.sampling.logprobs(out.logits)  # [B, N, V]
  rule_fn = functools.partial(rule, max_depth=D)
  path, n_acc, nxt = jax.vmap(rule_fn)(jax.random.split(k_rule, B), tree, logp)
  # Candidates: the accepted nodes' tokens, then the rule's token at index n (junk past it).
  cand = jnp.concatenate([gather_path(tree.tokens, path)[:, 1:], jnp.zeros((B, 1), jnp.int32)], 1)
  cand = jnp.where(jnp.arange(D + 1)[None, :] == n_acc[:, None], nxt[:, None], cand)
  live = ~s.done
  n_new = s.seq_len - prompt_lens
  m = jnp.where(live, commit_count(cand, n_acc, n_new, budgets, gen.stop_tokens), 0)
  seq = write_rows(s.seq, cand, s.seq_len)
  seq_len = s.seq_len + m
  committed = jnp.arange(D + 1)[None, :] < m[:, None]
  hit_stop = jnp.any(is_stop(cand, gen.stop_tokens) & committed, 1)
  done = s.done | hit_stop | (seq_len - prompt_lens >= budgets)
  cache = compact_path(out.cache, base, path).with_lengths(seq_len - 1)
  layer_hidden = None
  if out.layer_hidden is not None:
    layer_hidden = jax.vmap(lambda h: gather_path(h, path))(out.layer_hidden)
  step = TreeStepResult(s.seq_len, n_acc, m, gather_path(out.hidden, path), layer_hidden, path)
  draft_state = drafter.commit(draft_params, prop.state, seq, seq_len, step)
  n_drafted = jnp.full((B,), tree.n_nodes - 1, jnp.int32)
  if prop.n_drafted is not None:
    n_drafted = prop.n_drafted
  metrics = s.metrics.update(live, n_drafted, n_acc, m)
  return _TreeState(seq, seq_len, cache, draft_state, done, metrics, key)


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
    hidden_layers=hidden_layers_of(drafter),
  )  # fmt: skip
  tree = functools.partial(_tree_step, **{**step_kw, "drafter": adp.Adapted(drafter, width)})
  return adp.run_adaptive(state, (ar, tree), adaptive, step_costs, gen.max_new_tokens)


@functools.partial(jax.jit, static_argnames=("cfg", "drafter", "rule", "gen", "adaptive"))
def _tree_speculative(
  params, draft_params, prompts, prompt_lens, budgets, key, cfg, drafter, rule, gen,
  adaptive=None, step_costs=None,
):  # fmt: skip
  B, Tp = prompts.shape
  capacity = tree_capacity(Tp, gen, drafter)
  pre = prefill(params, cfg, prompts, prompt_lens, capacity, hidden_layers_of(drafter))
  key, sub = jax.random.split(key)
  first = gen.sampling.sample(sub, pre.logits)
  seq = init_sequence(prompts, prompt_lens, capacity)
  seq = seq.at[jnp.arange(B), prompt_lens].set(first)
  draft_state = drafter.init(draft_params, pre, prompts, prompt_lens, capacity)
  done = is_stop(first, gen.stop_tokens) | (budgets <= 1)
  metrics = SpecMetrics.zeros(B, drafter.max_depth)
  state = _TreeState(seq, prompt_lens + 1, pre.cache, draft_state, done, metrics, key)
  body = functools.partial(
    _tree_step,
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
    state, trace = adaptive_tree_loop(state, body.keywords, stateless, adaptive, step_costs)
  n_new = state.seq_len - prompt_lens
  tokens = extract_new_tokens(state.seq, prompt_lens, n_new, gen.max_new_tokens)
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
  """Tree speculative decoding of a batch of prompts.

  Args:
    params: target weights.
    cfg: target config (static).
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
    costs: the cost table for `adaptive`; required with it.

  Returns:
    A `SpecOutput`; metrics count N - 1 drafted nodes per pass and per-depth acceptance (and
    the choice trace when adaptive).
  """
  B, Tp = prompts.shape
  rule = default_tree_rule(drafter, gen.sampling) if rule is None else rule
  check_rule(rule, drafter, gen.sampling)
  check_capacity(Tp, gen.max_new_tokens, drafter.n_nodes + drafter.capacity_slack(), gen.capacity)
  budgets = jnp.full((B,), gen.max_new_tokens, jnp.int32)
  if max_new_per_row is not None:
    budgets = jnp.minimum(budgets, jnp.asarray(max_new_per_row, jnp.int32))
  key = jax.random.PRNGKey(0) if key is None else key
  prompt_lens = jnp.asarray(prompt_lens, jnp.int32)
  step_costs = None
  if adaptive is not None:
    if adaptive.ks != (0, drafter.max_depth):
      raise ValueError(f"the tree loop chooses K in (0, max_depth={drafter.max_depth})")
    step_costs = adp.check_costs(adaptive, costs)
  return _tree_speculative(
    params, draft_params, prompts, prompt_lens, budgets, key, cfg, drafter, rule, gen, adaptive,
    step_costs,
  )  # fmt: skip
