"""EAGLE-2 dynamic token trees drafted by an EAGLE-1 or EAGLE-3 head (`specjax.drafters.eagle`).

The head's cache and its pending verified features are those of the chain `EagleDrafter` (same
`init` and `commit`; see that module for the notation): after the pending window is fed, the head
cache holds pairs up to position seq_len - 2 and its output there, o_root, scores the root's
children. The tree then grows level by level as in EAGLE-2 (Li et al. 2024):

  * level 1: the top_k tokens of the head's distribution at the root;
  * level d > 1: every frontier node of levels 1 .. d - 1 is (re)read by the head in one pass, node
    u at depth j as the pair (token_u, o_parent(u)) at position seq_len - 2 + j, attending to the
    head's cache and to its ancestors among the fed nodes; the outputs of the newest frontier score
    its children; the top_k children of each of the top_k frontier nodes are the candidates of
    level d (cumulative log-probability = parent's + child's), and the top_k of those k * k are the
    next frontier;
  * after `depth` levels the n_nodes - 1 candidates with the best cumulative log-probability form
    the tree (`select_dynamic_tree`).

Each level writes its fed nodes at the same cache slots (from seq_len - 1), so nothing stays behind:
`commit` rolls the head cache back to prev_seq_len - 1 and stores the target's features along the
accepted path as the next pending window, exactly like the chain drafter. Children are the head's
top-k at any temperature ("deterministic" draws: verify with `TreeGreedyRule` or, when sampling,
`TreePointMassRule`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from specjax.config import ModelConfig
from specjax.drafters.base import TreeDrafterDefaults, TreeProposal, TreeStepResult
from specjax.drafters.eagle import (
  EagleDrafter,
  EagleParams,
  EagleState,
  cached_layer,
  head_logits,
  layer_inputs,
)
from specjax.drafters.tree_draft_model import check_dynamic_tree_size, select_dynamic_tree
from specjax.kv_cache import KVCache, read_rows
from specjax.sampling import SamplingConfig


def tree_layer(params: EagleParams, x, positions, new_mask, cache: KVCache, cfg: ModelConfig):
  """The head layer on T fed nodes per row [B, T, D] at slots cache.lengths + [0, T).

  Each node sees the whole cache before its block and, inside the block, the nodes allowed by
  `new_mask` [B, T, T] (its ancestors and itself). Returns (o [B, T, D], cache with K/V written
  and its lengths unchanged).
  """
  o, out = cached_layer(params, x, cache, cfg, positions, new_mask)
  return o, out.with_lengths(cache.lengths)


@dataclasses.dataclass(frozen=True)
class EagleTreeDrafter(TreeDrafterDefaults):
  """EAGLE-2 dynamic trees from an EAGLE head (deterministic children).

  Attributes:
    cfg: the head layer's config (as for `EagleDrafter`).
    top_k: children expanded per frontier node, and frontier width.
    depth: levels; the deepest node has depth `depth`.
    n_nodes: N, nodes per tree including the root (<= 1 + top_k + (depth - 1) * top_k**2).
    hidden_layers: target layers fused by an EAGLE-3 head; () for EAGLE-1.
  """

  cfg: ModelConfig
  top_k: int = 4
  depth: int = 4
  n_nodes: int = 16
  hidden_layers: tuple[int, ...] = ()
  draws = "deterministic"

  def __post_init__(self):
    check_dynamic_tree_size(self.top_k, self.depth, self.n_nodes)

  @property
  def max_depth(self) -> int:
    return self.depth

  @property
  def _chain(self) -> EagleDrafter:
    """The chain drafter whose cache/pending bookkeeping (K + 1 = depth + 1 features) is shared."""
    return EagleDrafter(self.cfg, self.depth, self.hidden_layers)

  def capacity_slack(self) -> int:
    # the pending window reads one token past the tree; level passes feed (depth - 1) * top_k nodes
    return max(1, (self.depth - 1) * self.top_k - self.n_nodes + 1)

  def init(self, params: EagleParams, prefill, prompts, prompt_lens, capacity: int) -> EagleState:
    return self._chain.init(params, prefill, prompts, prompt_lens, capacity)

  def propose(
    self, params: EagleParams, state: EagleState, seq, seq_len, key, sampling: SamplingConfig
  ) -> TreeProposal:
    del key, sampling  # children are the head's top-k by raw log-probability at any temperature
    B, k, D = seq.shape[0], self.top_k, self.depth
    c, m = state.cache.lengths, state.n_pending
    window = read_rows(seq, c + 1, self.depth + 1)
    o, cache = cached_layer(
      params, layer_inputs(params, window, state.pending), state.cache, self.cfg
    )
    o_root = o[jnp.arange(B), jnp.maximum(m - 1, 0)]  # [B, D], at position seq_len - 2
    cache = cache.with_lengths(c + m)  # = seq_len - 1: the fed nodes go from here
    base = seq_len - 2

    def children(o_parents):  # [B, n, D] -> top-k (log-prob, target token) [B, n, k]
      lp = jax.nn.log_softmax(head_logits(params, o_parents, self.cfg.norm_eps), -1)
      score, idx = jax.lax.top_k(lp, k)
      return score, params.d2t[idx].astype(jnp.int32)

    score, tok = children(o_root[:, None])
    score, tok = score[:, 0], tok[:, 0]  # [B, k]
    pool_tok, pool_score = [tok], [score]
    pool_parent = [jnp.full((B, k), -1, jnp.int32)]
    front_ids = jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32), (B, k))
    front_score = score
    feed_tok, feed_g = tok, jnp.broadcast_to(o_root[:, None], (B, k, o_root.shape[-1]))
    feed_mask = jnp.broadcast_to(jnp.eye(k, dtype=bool), (B, k, k))
    n_pool = k
    for d in range(2, D + 1):
      T = feed_tok.shape[1]
      depths = np.repeat(np.arange(1, d), k)  # level j's frontier sits at feed [(j-1)k, jk)
      o, _ = tree_layer(
        params,
        layer_inputs(params, feed_tok, feed_g),
        base[:, None] + jnp.asarray(depths)[None, :],
        feed_mask,
        cache,
        self.cfg,
      )
      o_front = o[:, T - k :]  # [B, k, D]
      lp, ctok = children(o_front)  # [B, k, k]
      cum = (front_score[:, :, None] + lp).reshape(B, k * k)
      pool_tok.append(ctok.reshape(B, k * k))
      pool_score.append(cum)
      pool_parent.append(jnp.repeat(front_ids, k, axis=1))
      if d == D:
        break
      front_score, pick = jax.lax.top_k(cum, k)  # next frontier: positions in this level's k*k
      par = pick // k  # parent's index in the current frontier
      par_feed = (T - k) + par
      new_rows = jnp.take_along_axis(feed_mask, par_feed[:, :, None], 1)  # [B, k, T]
      grown = jnp.zeros((B, T + k, T + k), bool)
      grown = grown.at[:, :T, :T].set(feed_mask).at[:, T:, :T].set(new_rows)
      feed_mask = grown.at[:, T:, T:].set(jnp.eye(k, dtype=bool))
      feed_tok = jnp.concatenate(
        [feed_tok, jnp.take_along_axis(ctok.reshape(B, k * k), pick, 1)], 1
      )
      feed_g = jnp.concatenate([feed_g, jnp.take_along_axis(o_front, par[:, :, None], 1)], 1)
      front_ids = n_pool + pick
      n_pool += k * k
    tree, _ = select_dynamic_tree(
      seq,
      seq_len,
      jnp.concatenate(pool_tok, 1),
      jnp.concatenate(pool_score, 1),
      jnp.concatenate(pool_parent, 1),
      k,
      D,
      self.n_nodes,
    )
    return TreeProposal(tree, EagleState(cache, state.pending, state.n_pending))

  def commit(self, params: EagleParams, state: EagleState, seq, seq_len, step: TreeStepResult):
    return self._chain.commit(params, state, seq, seq_len, step)

  def observe(
    self, params, state, seq, seq_len, new_seq, new_seq_len, step, key, sampling
  ) -> EagleState:
    """After an AR step of the adaptive loop: as the chain drafter (`EagleDrafter.observe`)."""
    return self._chain.observe(
      params, state, seq, seq_len, new_seq, new_seq_len, step, key, sampling
    )
