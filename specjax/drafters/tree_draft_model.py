"""A draft model that drafts token trees: static topologies (Medusa-style) or dynamic (EAGLE-2).

Both expand level by level. Level 1: the draft reads the row's pending tokens (a two-token window,
as in `DraftModelDrafter`) and scores the root's children. Level d > 1: the draft reads every
already drafted node of depth < d in one pass, with RoPE position = seq_len - 1 + depth and an
ancestor mask among them, on top of its cache of committed tokens, and scores the children of the
depth d - 1 nodes. The nodes are re-read at every level because `forward` masks only inside the new
block (the cache before it is fully visible); that costs sum_d (nodes of depth < d) token rows
through the draft's layers, but logits (the expensive part for a small draft with a large
vocabulary) are computed only where children are needed.

Children at a node u:
  * static tree, `sample_children=False` or greedy: the top-ranked tokens of the draft's logits at
    u, child of rank r = r-th best (deterministic: verify with `TreeGreedyRule` or, when sampling,
    `TreePointMassRule`);
  * static tree, `sample_children=True` and sampling: successive draws without replacement
    from the processed draft distribution q_u (Gumbel-top-k), child of rank r = (r+1)-th draw, and
    q_u is reported in `TokenTree.logq` for `TreeSpeculativeRule("without_replacement")`;
  * dynamic tree (EAGLE-2): level 1 is the root's top_k children; each further level expands the
    top_k children of each of the top_k frontier nodes with the highest cumulative draft log-prob
    and keeps the top_k of those k * k as the next frontier; after `depth` levels the
    n_nodes - 1 candidates with the highest cumulative log-prob form the tree (closed under
    parents, since a child's score never exceeds its parent's). Deterministic children.

After verification the accepted nodes' draft K/V, written by the last level's pass, are moved to
contiguous slots like the target's; the draft cache then holds seq[:c] with c in
{seq_len - 2, seq_len - 1}, which the next two-token window catches up.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from specjax.config import ModelConfig
from specjax.drafters.base import LazyDrafterDefaults, StaticTreeShape, TreeProposal, TreeStepResult
from specjax.drafters.draft_model import catch_up_cache
from specjax.kv_cache import KVCache, compact_path, init_cache, read_rows
from specjax.model import forward
from specjax.sampling import SamplingConfig
from specjax.trees import StaticTree, TokenTree, ancestor_mask, children_table


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TreeDraftState:
  """Per-row drafting state.

  Attributes:
    cache: the draft's KV cache; lengths = committed tokens whose K/V it holds.
    fed: [B, N] int32 slot offset (from seq_len at propose) of each node's K/V written by the last
      drafting pass, -1 for nodes never read by the draft (the deepest ones).
  """

  cache: KVCache
  fed: jax.Array


def _init_cache(params, cfg: ModelConfig, prompts, prompt_lens, capacity: int, n_nodes: int):
  B = prompts.shape[0]
  cache = init_cache(cfg, B, capacity)
  out = forward(params, prompts, cache, cfg, logit_positions=jnp.zeros((B, 1), jnp.int32))
  return TreeDraftState(out.cache.with_lengths(prompt_lens), jnp.full((B, n_nodes), -1, jnp.int32))


def _read_pending(params, cfg: ModelConfig, cache: KVCache, seq, seq_len):
  """Feeds the window seq[c : c + 2] and returns (root logits [B, V], cache with lengths seq_len)."""
  c = cache.lengths
  window = read_rows(seq, c, 2)
  out = forward(params, window, cache, cfg, logit_positions=(seq_len - 1 - c)[:, None])
  return out.logits[:, 0], out.cache.with_lengths(seq_len)


def _commit(state: TreeDraftState, step: TreeStepResult, max_depth: int) -> TreeDraftState:
  """Moves the accepted nodes' draft K/V into place and sets the valid length."""
  prev = step.prev_seq_len
  nodes = step.path[:, 1:]  # [B, D]
  slot = jnp.take_along_axis(state.fed, nodes, 1)
  j = jnp.arange(1, max_depth + 1)[None, :]
  has = (slot >= 0) & (j <= step.n_accepted[:, None])
  n_fed = jnp.sum(jnp.cumprod(has.astype(jnp.int32), 1), 1)
  # Root is at prev - 1 already; node of depth j goes to prev - 1 + j.
  path = jnp.concatenate([jnp.zeros_like(prev)[:, None], jnp.where(has, slot + 1, 0)], 1)
  cache = compact_path(state.cache, prev - 1, path)
  valid = prev + jnp.minimum(step.n_committed - 1, n_fed)
  return TreeDraftState(cache.with_lengths(valid), state.fed)


def _gumbel_top(key, logq: jax.Array, n: int) -> jax.Array:
  """n successive draws without replacement from softmax(logq) [..., V] (Gumbel-top-k)."""
  g = jax.random.gumbel(key, logq.shape, jnp.float32)
  return jax.lax.top_k(logq + g, n)[1].astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class StaticTreeDrafter(StaticTreeShape, LazyDrafterDefaults):
  """A draft model drafting a fixed tree topology.

  Attributes:
    cfg: the draft model's config (same vocabulary as the target).
    tree: the topology.
    sample_children: when sampling, draw children without replacement from q instead of top-k.
  """

  cfg: ModelConfig
  tree: StaticTree
  sample_children: bool = True
  hidden_layers: tuple[int, ...] = ()

  def capacity_slack(self) -> int:
    return 1

  def init(self, params, prefill, prompts, prompt_lens, capacity: int) -> TreeDraftState:
    del prefill
    return _init_cache(params, self.cfg, prompts, prompt_lens, capacity, self.n_nodes)

  def propose(
    self, params, state: TreeDraftState, seq, seq_len, key, sampling: SamplingConfig
  ) -> TreeProposal:
    b = self.tree.buffers()
    B, N, D = seq.shape[0], self.n_nodes, self.max_depth
    sampled = self.sample_children and not sampling.greedy
    keys = jax.random.split(key, D)
    root_logits, cache = _read_pending(params, self.cfg, state.cache, seq, seq_len)
    tokens = jnp.zeros((B, N), jnp.int32)
    tokens = tokens.at[:, 0].set(jnp.take_along_axis(seq, (seq_len - 1)[:, None], 1)[:, 0])
    logq = jnp.zeros((B, N, self.cfg.vocab_size), jnp.float32) if sampled else None
    base = seq_len - 1
    for d in range(1, D + 1):
      level = np.flatnonzero(b.depth == d)
      parents = np.unique(b.parent[level])  # nodes of depth d - 1 with children
      if d == 1:
        logits = root_logits[:, None]
      else:
        fed = np.arange(1, b.n_upto[d - 1])  # every node of depth 1 .. d - 1
        out = forward(
          params,
          tokens[:, fed],
          cache,
          self.cfg,
          positions=base[:, None] + jnp.asarray(b.depth[fed])[None, :],
          new_mask=jnp.asarray(b.mask[np.ix_(fed, fed)]),
          logit_positions=jnp.broadcast_to(jnp.asarray(parents - 1), (B, len(parents))),
        )
        logits = out.logits  # [B, P, V]
        cache = out.cache.with_lengths(seq_len)
      # Each child at this level: its parent's position among `parents`, and its rank.
      par_pos = np.searchsorted(parents, b.parent[level])
      n_draw = int(b.rank[level].max()) + 1
      if sampled:
        lq = sampling.logprobs(logits)
        logq = logq.at[:, parents].set(lq)
        picks = _gumbel_top(keys[d - 1], lq, n_draw)  # [B, P, n_draw]
      else:
        picks = jax.lax.top_k(logits, n_draw)[1].astype(jnp.int32)
      tokens = tokens.at[:, level].set(picks[:, par_pos, b.rank[level]])
    fed_slots = np.where((b.depth >= 1) & (b.depth < D), np.arange(N) - 1, -1).astype(np.int32)
    fed = jnp.broadcast_to(jnp.asarray(fed_slots), (B, N))
    tree = TokenTree(
      tokens,
      *(jnp.broadcast_to(jnp.asarray(a), (B,) + a.shape) for a in (b.parent, b.depth, b.mask)),
      jnp.broadcast_to(jnp.asarray(b.children), (B,) + b.children.shape),
      logq,
    )
    return TreeProposal(tree, TreeDraftState(cache, fed))

  def commit(self, params, state: TreeDraftState, seq, seq_len, step: TreeStepResult):
    del params, seq, seq_len
    return _commit(state, step, self.max_depth)

  def catch_up(self, params, state: TreeDraftState, seq, seq_len, width: int) -> TreeDraftState:
    """After the adaptive loop's AR steps: the draft cache caught up (`catch_up_cache`)."""
    return TreeDraftState(catch_up_cache(params, self.cfg, state.cache, seq, seq_len, width),
                          state.fed)  # fmt: skip


def select_dynamic_tree(seq, seq_len, pool_tok, pool_score, pool_parent, top_k, depth, n_nodes):
  """The EAGLE-2 tree: the n_nodes - 1 candidates with the best cumulative draft log-prob.

  Args:
    seq, seq_len: the rows' sequences; the root is seq[seq_len - 1].
    pool_tok: [B, P] candidate tokens, level by level: top_k at depth 1, then top_k**2 per level.
    pool_score: [B, P] cumulative draft log-probabilities (a child's never exceeds its parent's).
    pool_parent: [B, P] pool index of each candidate's parent, -1 for the root's children.
    top_k, depth, n_nodes: the drafter's settings (P = top_k + (depth - 1) * top_k**2).

  Returns:
    (TokenTree with deterministic children, sel [B, n_nodes - 1] pool index of nodes 1..N-1).
    The selected set is closed under parents; kept in pool order, parents precede children.
  """
  B, P = pool_tok.shape
  rows = jnp.arange(B)[:, None]
  pool_depth = np.concatenate(
    [np.ones(top_k, np.int32)] + [np.full(top_k**2, d, np.int32) for d in range(2, depth + 1)]
  )
  _, sel = jax.lax.top_k(pool_score, n_nodes - 1)
  sel = jnp.sort(sel, 1)  # parents precede children
  node_of = (
    jnp.full((B, P), -1, jnp.int32).at[rows, sel].set(jnp.arange(1, n_nodes, dtype=jnp.int32))
  )
  par_pool = pool_parent[rows, sel]
  parent = jnp.where(par_pool >= 0, node_of[rows, jnp.maximum(par_pool, 0)], 0)
  parent = jnp.concatenate([jnp.full((B, 1), -1, jnp.int32), jnp.maximum(parent, 0)], 1)
  node_depth = jnp.concatenate([jnp.zeros((B, 1), jnp.int32), jnp.asarray(pool_depth)[sel]], 1)
  root = jnp.take_along_axis(seq, (seq_len - 1)[:, None], 1)
  tokens = jnp.concatenate([root, pool_tok[rows, sel]], 1)
  tree = TokenTree(
    tokens, parent, node_depth, ancestor_mask(parent, depth), children_table(parent, top_k), None
  )
  return tree, sel


def check_dynamic_tree_size(top_k: int, depth: int, n_nodes: int) -> None:
  """Raises ValueError unless an EAGLE-2 tree of `depth` levels, `top_k` wide, can hold n_nodes."""
  pool = top_k + (depth - 1) * top_k**2
  if not 1 < n_nodes <= pool + 1:
    raise ValueError(f"n_nodes must be in 2 .. {pool + 1} for top_k={top_k}, depth={depth}")


@dataclasses.dataclass(frozen=True)
class DynamicTreeDrafter(LazyDrafterDefaults):
  """A draft model drafting EAGLE-2 dynamic trees (deterministic children).

  Attributes:
    cfg: the draft model's config (same vocabulary as the target).
    top_k: children expanded per frontier node, and frontier width.
    depth: levels; the deepest node has depth `depth`.
    n_nodes: N, nodes per tree including the root (<= 1 + top_k + (depth - 1) * top_k**2).
  """

  cfg: ModelConfig
  top_k: int = 4
  depth: int = 4
  n_nodes: int = 24
  hidden_layers: tuple[int, ...] = ()
  draws = "deterministic"

  def __post_init__(self):
    check_dynamic_tree_size(self.top_k, self.depth, self.n_nodes)
    if self.top_k > self.cfg.vocab_size:
      raise ValueError("top_k exceeds the vocabulary")

  @property
  def max_depth(self) -> int:
    return self.depth

  def capacity_slack(self) -> int:
    return 1

  def init(self, params, prefill, prompts, prompt_lens, capacity: int) -> TreeDraftState:
    del prefill
    return _init_cache(params, self.cfg, prompts, prompt_lens, capacity, self.n_nodes)

  def propose(
    self, params, state: TreeDraftState, seq, seq_len, key, sampling: SamplingConfig
  ) -> TreeProposal:
    del key, sampling  # children are the draft's top-k by raw log-probability at any temperature
    B, k, D = seq.shape[0], self.top_k, self.depth
    rows = jnp.arange(B)[:, None]
    base = seq_len - 1
    root_logits, cache = _read_pending(params, self.cfg, state.cache, seq, seq_len)
    score, tok = jax.lax.top_k(jax.nn.log_softmax(root_logits, -1), k)  # [B, k]
    pool_tok, pool_score = [tok], [score]
    pool_parent = [jnp.full((B, k), -1, jnp.int32)]  # pool ids; -1 = the root
    front_ids = jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32), (B, k))  # pool ids of the frontier
    front_score = score
    feed_ids = front_ids  # pool ids read by the next pass: frontiers of levels 1 .. d - 1
    feed_mask = jnp.broadcast_to(jnp.eye(k, dtype=bool), (B, k, k))
    n_pool = k
    for d in range(2, D + 1):
      T = feed_ids.shape[1]
      depths = np.repeat(np.arange(1, d), k)  # level j's frontier sits at feed [(j-1)k, jk)
      out = forward(
        params,
        jnp.concatenate(pool_tok, 1)[rows, feed_ids],
        cache,
        self.cfg,
        positions=base[:, None] + jnp.asarray(depths)[None, :],
        new_mask=feed_mask,
        logit_positions=jnp.broadcast_to(jnp.arange(T - k, T), (B, k)),
      )
      cache = out.cache.with_lengths(seq_len)
      lp, ctok = jax.lax.top_k(jax.nn.log_softmax(out.logits, -1), k)  # [B, k, k]
      cum = (front_score[:, :, None] + lp).reshape(B, k * k)
      pool_tok.append(ctok.reshape(B, k * k))
      pool_score.append(cum)
      pool_parent.append(jnp.repeat(front_ids, k, axis=1))
      if d == D:
        break
      front_score, pick = jax.lax.top_k(cum, k)  # next frontier: positions in this level's k*k
      new_ids = n_pool + pick
      par_feed = (T - k) + pick // k  # parent's index in the feed
      new_rows = jnp.take_along_axis(feed_mask, par_feed[:, :, None], 1)  # [B, k, T]
      grown = jnp.zeros((B, T + k, T + k), bool)
      grown = grown.at[:, :T, :T].set(feed_mask).at[:, T:, :T].set(new_rows)
      feed_mask = grown.at[:, T:, T:].set(jnp.eye(k, dtype=bool))
      feed_ids = jnp.concatenate([feed_ids, new_ids], 1)
      front_ids = new_ids
      n_pool += k * k
    fed_pool = feed_ids if D > 1 else jnp.zeros((B, 0), jnp.int32)  # read by the last pass
    return self._select(
      seq,
      seq_len,
      jnp.concatenate(pool_tok, 1),
      jnp.concatenate(pool_score, 1),
      jnp.concatenate(pool_parent, 1),
      fed_pool,
      cache,
    )

  def _select(self, seq, seq_len, pool_tok, pool_score, pool_parent, fed_pool, cache):
    """Keeps the n_nodes - 1 best pool entries (in pool order) as the tree."""
    B, P = pool_tok.shape
    rows = jnp.arange(B)[:, None]
    tree, sel = select_dynamic_tree(
      seq, seq_len, pool_tok, pool_score, pool_parent, self.top_k, self.depth, self.n_nodes
    )
    # Draft K/V slot of each node: its position in the last pass's feed, if it was read.
    feed_pos = jnp.full((B, P), -1, jnp.int32)
    if fed_pool.shape[1]:
      feed_pos = feed_pos.at[rows, fed_pool].set(jnp.arange(fed_pool.shape[1], dtype=jnp.int32))
    fed = jnp.concatenate([jnp.full((B, 1), -1, jnp.int32), feed_pos[rows, sel]], 1)
    return TreeProposal(tree, TreeDraftState(cache, fed))

  def commit(self, params, state: TreeDraftState, seq, seq_len, step: TreeStepResult):
    del params, seq, seq_len
    return _commit(state, step, self.depth)

  def catch_up(self, params, state: TreeDraftState, seq, seq_len, width: int) -> TreeDraftState:
    """After the adaptive loop's AR steps: the draft cache caught up (`catch_up_cache`)."""
    return TreeDraftState(catch_up_cache(params, self.cfg, state.cache, seq, seq_len, width),
                          state.fed)  # fmt: skip
