"""Static token trees from per-position candidate sources, such as Medusa heads.

A candidate source scores every draft depth at once from the target's newest hidden state h (at
position seq_len - 2, after the target read the token before the root) and, for sources that read
them, the outputs of the target layers the drafter names in `hidden_layers` there:

    source(params, h [B, D], layers [n, B, D] or None) -> (logits [B, K, Vd] float32, d2t or None)

where head i (0-based) scores the token at depth i + 1 (Medusa head i predicts x_{t+i+2} from h_t),
over the target vocabulary (d2t None) or a draft vocabulary mapped to target ids by d2t. The source
is a static callable (a module-level function), so it can sit inside the drafter's static config.

`HeadTreeDrafter` builds a `StaticTree` from it the Medusa way: the child of rank r at depth d is
head d - 1's r-th best token, whatever its parent (the heads do not see the path), or, with
`sample_children` while sampling, each parent's children are successive draws without replacement
from head d - 1's processed distribution (then `TreeSpeculativeRule("without_replacement")` applies).

Two sources are provided: `published_medusa_logits` for heads in the published Medusa format
(`MedusaHeadParams`, see `specjax.loading.heads`), and `medusa_logits_source` for the shared-head
`specjax.drafters.medusa.MedusaParams`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specjax.drafters.base import StaticTreeShape, TreeDrafterDefaults, TreeProposal, TreeStepResult
from specjax.drafters.medusa import (
  MedusaState,
  committed_state,
  head_logits,
  initial_state,
  medusa_logits,
)
from specjax.loading.heads import MedusaHeadParams  # noqa: F401 - also exported here
from specjax.sampling import SamplingConfig
from specjax.trees import (
  StaticTree,
  default_static_tree,
  heldout_depth_top1,
  heldout_rank_rates,
  static_token_tree,
  tree_from_rank_probs,
)

CandidateSource = Callable[..., tuple[jax.Array, jax.Array | None]]


def published_medusa_logits(params: MedusaHeadParams, h: jax.Array, layers=None):
  """Logits [B, K, V] of published Medusa heads: per head, R x (x + SiLU(W x + b)), then its head
  (they read h alone)."""
  del layers
  f32 = jnp.float32
  logits = head_logits(
    h, params.w.astype(f32), params.b, params.lm_head.astype(f32), broadcast_input=True
  )
  return logits, None


def medusa_logits_source(params, h: jax.Array, layers: jax.Array | None = None):
  """Adapter for `specjax.drafters.medusa.MedusaParams` (shared head over a draft vocabulary)."""
  return medusa_logits(params, h, layers), params.d2t


def tree_from_depth_logits(
  tree: StaticTree, logits, d2t, seq, seq_len, key, sampling: SamplingConfig,
  sample_children: bool, vocab_size: int,
):  # fmt: skip
  """The static `tree` filled the Medusa way from per-depth logits [B, K, Vd] (K >= depth): the
  child of rank r at depth d is depth d's r-th best token, or, with `sample_children` while
  sampling, each parent's children are draws without replacement from depth d's distribution."""
  b = tree.buffers()
  B, D = seq.shape[0], tree.max_depth
  if logits.shape[1] < D:
    raise ValueError(f"the tree has depth {D} but the source scores only {logits.shape[1]} depths")
  to_target = (lambda i: i) if d2t is None else (lambda i: d2t[i].astype(jnp.int32))
  sampled = sample_children and not sampling.greedy
  root = jnp.take_along_axis(seq, (seq_len - 1)[:, None], 1)[:, 0]
  tokens = jnp.zeros((B, tree.n_nodes), jnp.int32).at[:, 0].set(root)
  logq = None
  if sampled:
    lq = sampling.logprobs(logits[:, :D])  # [B, D, Vd]
    if d2t is not None:
      full = jnp.full(lq.shape[:-1] + (vocab_size,), -jnp.inf, jnp.float32)
      lq_full = full.at[..., d2t].set(lq)
    else:
      lq_full = lq
    # A node at depth d - 1 draws its children from depth d's row (leaves' rows are unused).
    logq = lq_full[:, jnp.asarray(np.minimum(b.depth, D - 1))]
  keys = jax.random.split(key, D)
  for d in range(1, D + 1):
    level = np.flatnonzero(b.depth == d)
    n_draw = int(b.rank[level].max()) + 1
    if sampled:
      parents = np.unique(b.parent[level])
      par_pos = np.searchsorted(parents, b.parent[level])
      lq_d = jnp.broadcast_to(lq[:, d - 1, None], (B, len(parents), lq.shape[-1]))
      g = jax.random.gumbel(keys[d - 1], lq_d.shape, jnp.float32)
      picks = jax.lax.top_k(lq_d + g, n_draw)[1]
      tokens = tokens.at[:, level].set(to_target(picks[:, par_pos, b.rank[level]]))
    else:
      top = jax.lax.top_k(logits[:, d - 1], n_draw)[1]  # [B, n_draw]
      tokens = tokens.at[:, level].set(to_target(top[:, b.rank[level]]))
  return static_token_tree(tree, tokens, logq)


@dataclasses.dataclass(frozen=True)
class HeadTreeDrafter(StaticTreeShape, TreeDrafterDefaults):
  """Static-tree drafting from a per-position candidate source (Medusa-style).

  Attributes:
    source: static callable (params, h, layers) -> (logits [B, K, Vd], d2t or None), K >= tree
      depth.
    tree: the static topology.
    vocab_size: the target's V.
    sample_children: when sampling, draw each parent's children without replacement.
    hidden_layers: target layers whose outputs the source reads (heads that fuse them).
  """

  source: CandidateSource
  tree: StaticTree
  vocab_size: int
  sample_children: bool = False
  hidden_layers: tuple[int, ...] = ()

  def capacity_slack(self) -> int:
    return 0

  def init(self, params, prefill, prompts, prompt_lens, capacity: int) -> MedusaState:
    del params, prompts, capacity
    return initial_state(prefill, prompt_lens)

  def propose(self, params, state: MedusaState, seq, seq_len, key, sampling: SamplingConfig):
    logits, d2t = self.source(params, state.h, state.layers)
    tree = tree_from_depth_logits(
      self.tree, logits, d2t, seq, seq_len, key, sampling, self.sample_children, self.vocab_size
    )
    return TreeProposal(tree, state)

  def commit(self, params, state: MedusaState, seq, seq_len, step: TreeStepResult) -> MedusaState:
    del params, seq, seq_len
    return committed_state(state, step)

  def observe(
    self, params, state, seq, seq_len, new_seq, new_seq_len, step, key, sampling
  ) -> MedusaState:
    """After an AR step of the adaptive loop: the heads need only its hidden state."""
    return self.commit(params, state, new_seq, new_seq_len, step)


@dataclasses.dataclass(frozen=True)
class BlockTreeDrafter(StaticTreeShape, TreeDrafterDefaults):
  """Static-tree drafting from a parallel drafter's block (`specjax.drafters.pard`, `peagle`):
  one drafter pass scores every depth, the tree is filled as `HeadTreeDrafter` fills it, and the
  drafter's own state follows the accepted path (its commit reads `StepResult` along the path).

  Attributes:
    block: a parallel drafter with `block_logits(params, state, seq, seq_len) -> (logits
      [B, K, Vd], d2t, state)`; its K is the tree depth (its state is sized by K + 1 = the path).
    tree: the static topology.
    vocab_size: the target's V.
    sample_children: when sampling, draw each parent's children without replacement.
  """

  block: Any
  tree: StaticTree
  vocab_size: int
  sample_children: bool = False

  def __post_init__(self):
    if self.block.k != self.tree.max_depth:
      raise ValueError(f"block size {self.block.k} != tree depth {self.tree.max_depth}")
    super().__post_init__()

  @property
  def hidden_layers(self) -> tuple[int, ...]:
    return self.block.hidden_layers

  def capacity_slack(self) -> int:
    return self.block.capacity_slack()

  def init(self, params, prefill, prompts, prompt_lens, capacity: int):
    return self.block.init(params, prefill, prompts, prompt_lens, capacity)

  def propose(self, params, state, seq, seq_len, key, sampling: SamplingConfig):
    logits, d2t, state = self.block.block_logits(params, state, seq, seq_len)
    tree = tree_from_depth_logits(
      self.tree, logits, d2t, seq, seq_len, key, sampling, self.sample_children, self.vocab_size
    )
    return TreeProposal(tree, state)

  def catch_up(self, params, state, seq, seq_len, width: int):
    return self.block.catch_up(params, state, seq, seq_len, width)

  def observe(self, params, state, seq, seq_len, new_seq, new_seq_len, step, key, sampling):
    return self.block.observe(
      params, state, seq, seq_len, new_seq, new_seq_len, step, key, sampling
    )

  def commit(self, params, state, seq, seq_len, step: TreeStepResult):
    return self.block.commit(params, state, seq, seq_len, step)


def fitted_tree(shipped, t) -> StaticTree:
  """The static tree of t.n_nodes nodes and depth <= t.depth for the shipped drafter: fitted to
  its held-out per-rank rates where its metadata records them (`trees.heldout_rank_rates`, Medusa
  heads), else `trees.default_static_tree` fitted to its held-out per-depth top-1 accuracies
  (`trees.heldout_depth_top1`), or the fixed prior when it records neither; with children under
  the greedy depth-1 node only when its later depths read that draft (`config.first_token`)."""
  greedy_first = bool((shipped.metadata.get("config") or {}).get("first_token"))
  rates = heldout_rank_rates(shipped.metadata, t.depth)
  if rates is not None:
    return tree_from_rank_probs(rates, t.n_nodes, greedy_first)
  top1 = heldout_depth_top1(shipped.metadata, t.depth)
  return default_static_tree(t.n_nodes, t.depth, top1, greedy_first)


def block_tree(shipped, t, vocab_size: int) -> BlockTreeDrafter:
  """A parallel drafter's tree form: `fitted_tree(shipped, t)` over its chain drafter's block, one
  position per tree depth (the fitted tree may stop short of t.depth, its largest allowed depth);
  t carries n_nodes and depth (`TreeSettings`)."""
  tree = fitted_tree(shipped, t)
  return BlockTreeDrafter(shipped.drafter(tree.max_depth), tree, vocab_size)
