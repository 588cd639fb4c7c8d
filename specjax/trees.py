"""Token trees: static topologies from index paths, and the per-row trees the decode loop verifies.

A tree drafts several continuations at once. Node 0 is the root: the row's last committed token,
which the target has not yet read. Every other node is one drafted token; its parent is the token
before it, its depth the number of drafted tokens up to and including it. The target scores all N
nodes of a row in one forward pass: node j is written at cache slot L + j (L = the row's cache
length), gets RoPE position L + depth[j] and attends to the whole cache and to its ancestors only
(`TokenTree.mask`). Its logits are then the target's distribution for the token after node j.

Static trees are given as index paths in the style of Medusa's `medusa_choices`: the path
(0, 2) is "the 3rd-ranked candidate after the 1st-ranked candidate after the root". `StaticTree`
turns a tuple of paths into numpy buffers once, at trace time (`StaticTree.buffers`). Nodes are
numbered by (depth, path), so parents precede children and the nodes of depth <= d are the
prefix 0 .. n_upto[d] - 1. Dynamic trees (EAGLE-2) are built per row inside the loop; both kinds
reach the loop and the acceptance rules as the same `TokenTree` pytree.

Axis letters: B batch, N nodes (root included), C most children of a node, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class TreeBuffers:
  """Numpy buffers of a static topology (root = node 0).

  Attributes:
    depth: [N] int32, 0 for the root.
    parent: [N] int32, -1 for the root.
    rank: [N] int32, the node's candidate rank at its parent (last path element; 0 for the root).
    mask: [N, N] bool, mask[i, j] = j is an ancestor of i or i itself.
    children: [N, C] int32 child node ids in rank order, -1 padded (C >= 1).
    retrieve: [n_leaves, max_depth + 1] int32, root-to-leaf node ids, -1 padded.
    n_upto: [max_depth + 1] int32, n_upto[d] = number of nodes of depth <= d.
  """

  depth: np.ndarray
  parent: np.ndarray
  rank: np.ndarray
  mask: np.ndarray
  children: np.ndarray
  retrieve: np.ndarray
  n_upto: np.ndarray

  @property
  def n_nodes(self) -> int:
    return int(self.depth.shape[0])

  @property
  def max_depth(self) -> int:
    return int(self.depth.max())


def _check_paths(paths: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
  norm = [tuple(int(i) for i in p) for p in paths]
  if not norm:
    raise ValueError("a tree needs at least one path")
  seen = set()
  for p in norm:
    if not p:
      raise ValueError("empty path: the root is implicit, list only drafted nodes")
    if min(p) < 0:
      raise ValueError(f"negative candidate rank in path {p}")
    if p in seen:
      raise ValueError(f"path {p} listed twice")
    seen.add(p)
  for p in norm:
    if len(p) > 1 and p[:-1] not in seen:
      raise ValueError(f"path {p} has no parent path {p[:-1]}")
  return tuple(sorted(norm, key=lambda p: (len(p), p)))


@dataclasses.dataclass(frozen=True)
class StaticTree:
  """A fixed tree topology given by index paths (hashable: pass it inside static configs).

  Attributes:
    paths: sorted, prefix-closed tuple of candidate-rank paths, one per drafted node.
  """

  paths: tuple[tuple[int, ...], ...]

  @classmethod
  def from_paths(cls, paths: Sequence[Sequence[int]]) -> StaticTree:
    """Validates (prefix-closed, no duplicates, ranks >= 0) and sorts by (depth, path)."""
    return cls(_check_paths(paths))

  @classmethod
  def chain(cls, k: int) -> StaticTree:
    """The degenerate tree of one path of length k (plain speculative decoding)."""
    return cls.from_paths([(0,) * d for d in range(1, k + 1)])

  @classmethod
  def full(cls, branching: Sequence[int]) -> StaticTree:
    """Every node at depth d gets branching[d] children: (3, 2) gives 3 + 6 drafted nodes."""
    paths, level = [], [()]
    for b in branching:
      level = [p + (r,) for p in level for r in range(b)]
      paths += level
    return cls.from_paths(paths)

  @property
  def n_nodes(self) -> int:
    """N, drafted nodes plus the root."""
    return len(self.paths) + 1

  @property
  def max_depth(self) -> int:
    return max(len(p) for p in self.paths)

  def buffers(self) -> TreeBuffers:
    return _buffers(self.paths)

  def ranks_are_contiguous(self) -> bool:
    """Whether each node's children have ranks 0 .. c - 1 (needed to sample children in order)."""
    b = self.buffers()
    for row in b.children:
      ranks = sorted(int(b.rank[c]) for c in row if c >= 0)
      if ranks != list(range(len(ranks))):
        return False
    return True


@functools.lru_cache(maxsize=64)
def _buffers(paths: tuple[tuple[int, ...], ...]) -> TreeBuffers:
  N = len(paths) + 1
  index = {(): 0} | {p: i + 1 for i, p in enumerate(paths)}
  depth = np.zeros(N, np.int32)
  parent = np.full(N, -1, np.int32)
  rank = np.zeros(N, np.int32)
  mask = np.eye(N, dtype=bool)
  kids: list[list[int]] = [[] for _ in range(N)]
  for p, i in index.items():
    if not p:
      continue
    depth[i], rank[i], parent[i] = len(p), p[-1], index[p[:-1]]
    mask[i] = mask[parent[i]]  # parents come first in (depth, path) order
    mask[i, i] = True
    kids[parent[i]].append(i)
  C = max(1, max(len(k) for k in kids))
  children = np.full((N, C), -1, np.int32)
  for i, k in enumerate(kids):
    k = sorted(k, key=lambda c: rank[c])
    children[i, : len(k)] = k
  D = int(depth.max())
  leaves = [i for i in range(N) if not kids[i]]
  retrieve = np.full((len(leaves), D + 1), -1, np.int32)
  for r, leaf in enumerate(leaves):
    anc = np.flatnonzero(mask[leaf])
    retrieve[r, : len(anc)] = anc[np.argsort(depth[anc])]
  n_upto = np.array([(depth <= d).sum() for d in range(D + 1)], np.int32)
  for a in (depth, parent, rank, mask, children, retrieve, n_upto):
    a.setflags(write=False)
  return TreeBuffers(depth, parent, rank, mask, children, retrieve, n_upto)


def tree_from_rank_probs(
  rank_probs: np.ndarray, n_nodes: int, greedy_first: bool = False
) -> StaticTree:
  """The static tree with n_nodes - 1 drafted nodes of highest estimated reach probability.

  A node's score is the product over its path of rank_probs[depth - 1, rank], an estimate that
  the candidate of that rank at that depth is the accepted one (Medusa builds its trees the same
  way from measured head accuracies). Best-first search, so the result is prefix-closed whenever
  probabilities do not increase with rank.

  Args:
    rank_probs: [D, R] estimated acceptance probability of the rank-r candidate at depth d + 1.
    n_nodes: N, including the root.
    greedy_first: only the top-1 depth-1 node has children (a drafter whose later depths read
      its greedy depth-1 draft, like P-EAGLE's first-token masks, guesses them for that one).

  Returns:
    The tree, with ties broken towards shallower, lower-rank paths.
  """
  rank_probs = np.asarray(rank_probs, np.float64)
  D, R = rank_probs.shape
  heap = [(-rank_probs[0, r], (r,)) for r in range(R)]
  heapq.heapify(heap)
  chosen = []
  while heap and len(chosen) < n_nodes - 1:
    neg, path = heapq.heappop(heap)
    chosen.append(path)
    if len(path) < D and not (greedy_first and path[0] > 0):
      for r in range(R):
        heapq.heappush(heap, (neg * rank_probs[len(path), r], path + (r,)))
  return StaticTree.from_paths(chosen)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TokenTree:
  """The drafted trees of a batch, as verified by the target (all rows share N and C).

  Attributes:
    tokens: [B, N] int32, tokens[:, 0] is each row's last committed token.
    parent: [B, N] int32, -1 for the root.
    depth: [B, N] int32.
    mask: [B, N, N] bool ancestor-or-self mask (the target's attention mask among the nodes).
    children: [B, N, C] int32 child node ids in the order they were proposed, -1 padded.
    logq: [B, N, V] float32 log of the drafter's processed distribution at each node from which
      its children were drawn, or None when the children were chosen deterministically.
  """

  tokens: jax.Array
  parent: jax.Array
  depth: jax.Array
  mask: jax.Array
  children: jax.Array
  logq: jax.Array | None = None

  @property
  def n_nodes(self) -> int:
    return self.tokens.shape[-1]


def static_token_tree(tree: StaticTree, tokens: jax.Array, logq: jax.Array | None = None):
  """A `TokenTree` with a static topology broadcast over the batch of tokens [B, N]."""
  b = tree.buffers()
  B = tokens.shape[0]

  def bcast(a):
    return jnp.broadcast_to(jnp.asarray(a), (B,) + a.shape)

  return TokenTree(
    tokens.astype(jnp.int32),
    bcast(b.parent),
    bcast(b.depth),
    bcast(b.mask),
    bcast(b.children),
    logq,
  )


def path_of(mask_row: jax.Array, depth_row: jax.Array, node: jax.Array, max_depth: int):
  """Root-to-node ids [max_depth + 1] of one row's tree (entries past the node's depth are 0)."""
  anc = mask_row[node]  # [N]
  levels = jnp.arange(max_depth + 1)[:, None]
  hit = anc[None, :] & (depth_row[None, :] == levels)  # [D + 1, N]
  return jnp.argmax(hit, 1).astype(jnp.int32)


def ancestor_mask(parent: jax.Array, max_depth: int) -> jax.Array:
  """[..., N, N] ancestor-or-self mask from parent ids [..., N] (-1 for roots)."""
  N = parent.shape[-1]
  eye = jnp.broadcast_to(jnp.eye(N, dtype=bool), parent.shape + (N,))
  safe = jnp.maximum(parent, 0)
  mask = eye
  for _ in range(max_depth):  # each round adds one more generation of ancestors
    up = jnp.take_along_axis(mask, jnp.broadcast_to(safe[..., None], mask.shape), -2)
    mask = eye | (up & (parent >= 0)[..., None])
  return mask


def children_table(parent: jax.Array, n_children: int) -> jax.Array:
  """[..., N, C] ids of each node's children in increasing id order, -1 padded."""
  N = parent.shape[-1]
  ids = jnp.arange(N)
  is_child = parent[..., None, :] == ids[:, None]  # [..., N(node), N(candidate)]
  key = jnp.where(is_child, ids, N + ids)
  first = jnp.sort(key, -1)[..., :n_children]
  return jnp.where(first < N, first, -1).astype(jnp.int32)


def gather_path(x: jax.Array, path: jax.Array) -> jax.Array:
  """x [B, N, ...] gathered along per-row node paths [B, P] -> [B, P, ...]."""
  idx = path.reshape(path.shape + (1,) * (x.ndim - 2))
  return jnp.take_along_axis(x, idx, 1)


def describe(tree: StaticTree) -> dict[str, Any]:
  """Shape summary of a static tree (for logs and benchmark tables)."""
  b = tree.buffers()
  per_depth = np.bincount(b.depth, minlength=b.max_depth + 1)[1:]
  return {
    "nodes": tree.n_nodes,
    "max_depth": b.max_depth,
    "per_depth": per_depth.tolist(),
    "leaves": int(b.retrieve.shape[0]),
  }


TREE_RANKS = 8  # candidates per depth a fitted static tree may use


def default_static_tree(
  n_nodes: int, depth: int, depth_top1=None, greedy_first: bool = False
) -> StaticTree:
  """A Medusa-style sparse tree: the `n_nodes` best paths of depth <= `depth`.

  The rank-r candidate at depth d is estimated to be accepted, once its parent was, with
  probability depth_top1[d - 1] * 0.5**r: the drafter's held-out top-1 accuracy at depth d given
  depths < d were right (as Medusa fits its trees to measured head accuracies;
  `heldout_depth_top1` reads it from a shipped drafter's metadata) and a prior for lower ranks.
  Without depth_top1, every depth's top-1 is taken as 0.6 (a fixed prior, not fitted to a
  drafter). greedy_first: see `tree_from_rank_probs`.
  """
  top1 = np.full(depth, 0.6) if depth_top1 is None else np.asarray(depth_top1, np.float64)
  if top1.shape != (depth,):
    raise ValueError(
      f"depth_top1 has {top1.size} entries for a tree of depth {depth}; give one per depth"
    )
  return tree_from_rank_probs(np.outer(top1, 0.5 ** np.arange(TREE_RANKS)), n_nodes, greedy_first)


def heldout_rank_rates(metadata: dict, depth: int) -> np.ndarray | None:
  """[depth, TREE_RANKS] held-out share of positions whose target token is head d's rank-r
  candidate (`top1_head{d}` for rank 0, `rank{r}_head{d}` for the others, as Medusa heads'
  evaluation records them: `train.losses.rank_agreement`), or None when any is missing."""
  held = metadata.get("heldout") or {}
  keys = [
    [f"top1_head{d}" if r == 0 else f"rank{r}_head{d}" for r in range(TREE_RANKS)]
    for d in range(depth)
  ]
  if not all(isinstance(held.get(k), (int, float)) for row in keys for k in row):
    return None
  return np.asarray([[float(held[k]) for k in row] for row in keys])


def heldout_depth_top1(metadata: dict, depth: int) -> list[float] | None:
  """A shipped drafter's held-out top-1 accuracy at depths 1..depth, from its metadata's
  `heldout`: given the earlier depths were right where it records `prefix_step{j}` (the
  drafts at depths 1..j all right; `conditional_rates`), else each depth's own rate
  (`top1_head{i}` for Medusa heads, `top1_step{i + 1}` for block and EAGLE drafters), or None
  when it records neither for every depth."""
  held = metadata.get("heldout") or {}
  for key, first in (("prefix_step{}", 1), ("top1_head{}", 0), ("top1_step{}", 1)):
    values = [held.get(key.format(first + i)) for i in range(depth)]
    if all(isinstance(v, (int, float)) for v in values):
      values = [float(v) for v in values]
      return conditional_rates(values) if key.startswith("prefix") else values
  return None


def conditional_rates(prefix: list[float]) -> list[float]:
  """Per-depth acceptance given the earlier depths were accepted, from prefix agreements
  (prefix_1, prefix_1 * c_2, ...): c_j = prefix_j / prefix_{j-1}, clipped to [0, 1]."""
  rates, before = [], 1.0
  for p in prefix:
    rates.append(min(max(p / before, 0.0), 1.0) if before > 0 else 0.0)
    before = p
  return rates
