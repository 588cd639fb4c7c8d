"""Suffix decoding (SuffixDecoding, Oliaro et al., NeurIPS 2025): model-free drafting of a token tree
scored by how often each continuation followed the context's longest matched suffix.

Two structures are searched each step, inside the compiled loop:
  * per row, the row's own prompt and generated tokens (`seq[b, :seq_len[b]]`): its token buffer is
    the structure, scanned on device at every start position (like prompt lookup), so it is always
    up to date and costs no state;
  * globally, a `SuffixCache`: earlier outputs of the same process, concatenated on the host between
    generate calls (`suffix_cache_from_outputs`) into a fixed-size token buffer [G] with separators,
    and passed in as the drafter's parameters (same shape every call: no recompilation).

Drafting one row (all static shapes; L = seq_len, the root is the last token seq[L - 1]):
  1. The corpus is [global tokens, SEP, row tokens] (C = G + 1 + S positions). For every corpus
     position c, m[c] is the number of trailing context tokens (up to `max_match`) equal to the
     tokens ending at c; c is an occurrence if it also has a continuation (global: tokens before the
     next separator; row: positions before the root, so the current suffix is not its own match).
  2. M = the longest match length; the occurrences are the (at most `max_occurrences`, the most
     recent first) positions with m = M: the longest suffix of the context seen before.
  3. A candidate node is a distinct path p (continuation prefix of some occurrence, length <= depth);
     its score is count(p) / n, the fraction of the n occurrences whose continuation starts with p.
     Nodes with score >= `min_prob` are kept, best first by (count desc, depth asc); a parent's count
     is >= its children's, so every prefix of that order is closed under ancestors. The tree size
     adapts to the match: at most min(N - 1, floor(spec_factor * M)) drafted nodes, and none when
     M < `min_match`.
  4. The chain form drafts the single most frequent path instead: at each depth the most frequent
     next token among the occurrences that agree with the path so far (score as above), up to K
     tokens under the same threshold and size rule.
Unused tree slots get parent -1, depth 0 and token 0: no node lists them as a child and their mask
row sees only themselves, so no rule can accept them (greedy prefers the root among depth-0 nodes;
the rejection-sampling walk only visits children) and no drafted node attends to them.

The children are deterministic (no q): greedy rules at temperature 0, `TreePointMassRule` (trees) or
`SpeculativeSamplingRule` with a point mass (chains) otherwise; both are lossless.

Axis letters: B batch, S sequence slots, G global cache slots, C corpus positions, O occurrences,
D draft depth, N tree nodes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax.drafters.base import (
  DrafterDefaults,
  Proposal,
  StepResult,
  TreeDrafterDefaults,
  TreeProposal,
  TreeStepResult,
)
from specjax.sampling import SamplingConfig
from specjax.trees import TokenTree, ancestor_mask, children_table

SEP = -1  # separator and padding in the global buffer (never equal to a token id)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SuffixCache:
  """The global structure: earlier outputs, oldest first, each followed by SEP; SEP padded in front.

  Attributes:
    tokens: [G] int32 token ids or SEP.
    run: [G] int32, tokens after position g before the next SEP (the continuation available there).
  """

  tokens: jax.Array
  run: jax.Array

  @property
  def size(self) -> int:
    return int(self.tokens.shape[0])


def _runs(tokens: np.ndarray) -> np.ndarray:
  """Tokens after each position before the next SEP (or the end)."""
  seps = np.flatnonzero(np.append(tokens == SEP, True))  # a virtual SEP past the end
  g = np.arange(len(tokens))
  return (seps[np.searchsorted(seps, g, side="right")] - g - 1).astype(np.int32)


def suffix_cache_from_outputs(outputs: Sequence[Sequence[int]], size: int) -> SuffixCache:
  """Builds the global cache of `size` slots from earlier outputs (host side, between calls).

  The newest outputs are kept whole while they fit (each takes its length + 1 separator); the first
  that does not fit is cut to the room left, keeping its beginning, and older ones are dropped.

  Args:
    outputs: token lists, oldest first.
    size: G, slots of the buffer (static: every cache of one size shares one compiled loop).

  Raises:
    ValueError: for size < 1 or a negative token id.
  """
  if size < 1:
    raise ValueError(f"size must be >= 1, got {size}")
  kept: list[list[int]] = []
  room = size
  for out in reversed(outputs):
    toks = [int(t) for t in out]
    if any(t < 0 for t in toks):
      raise ValueError("token ids must be >= 0")
    if not toks:
      continue
    if room < 2:
      break
    kept.append(toks[: room - 1] + [SEP])
    room -= len(kept[-1])
  body = [t for doc in reversed(kept) for t in doc]
  tokens = np.array([SEP] * (size - len(body)) + body, np.int32)
  return SuffixCache(jnp.asarray(tokens), jnp.asarray(_runs(tokens)))


def empty_cache(size: int = 1) -> SuffixCache:
  """A global cache with no outputs (drafting from the row alone)."""
  return suffix_cache_from_outputs([], size)


def match_lengths(corpus: jax.Array, context: jax.Array, n_context: jax.Array) -> jax.Array:
  """m[c]: how many trailing context tokens equal the corpus tokens ending at c.

  Args:
    corpus: [C] token ids (SEP never matches).
    context: [X] the context's last X tokens, newest first (context[0] is the root).
    n_context: scalar, how many of them are real (a short row has fewer than X).

  Returns:
    [C] int32 match lengths in 0 .. min(X, n_context).
  """
  X, C = context.shape[0], corpus.shape[0]
  padded = jnp.concatenate([jnp.full((X,), SEP, corpus.dtype), corpus])
  # One [C] pass per context token, extending the matches still alive: elementwise passes fuse on
  # a CPU, where a [C, X] block and its cumprod cost ~8x as much.
  m, alive = jnp.zeros((C,), jnp.int32), jnp.ones((C,), jnp.bool_)
  for i in range(X):
    alive = alive & (padded[X - i : X - i + C] == context[i]) & (i < n_context)
    m = m + alive
  return m


def latest(hit: jax.Array, n: int) -> tuple[jax.Array, jax.Array]:
  """The last `n` positions where `hit` [C] holds, latest first: (positions [n], ok [n]); slots
  past the number of hits have position 0 and ok False. (`lax.top_k` over the positions gives
  the same and costs ~10x as much on a CPU, where it sorts.)"""
  C = hit.shape[0]
  rank = jnp.cumsum(hit[::-1].astype(jnp.int32))[::-1]  # 1 at the latest hit, 2 at the one before
  slot = jnp.where(hit & (rank <= n), rank - 1, n)  # n: dropped
  pos = jnp.zeros((n,), jnp.int32).at[slot].set(jnp.arange(C, dtype=jnp.int32), mode="drop")
  return pos, jnp.arange(n) < jnp.sum(hit)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Occurrences:
  """The occurrences of one row's longest matched suffix and their continuations.

  Attributes:
    cont: [O, D] continuation tokens (junk where `valid` is False).
    valid: [O, D] whether occurrence o has a d + 1-th continuation token.
    same: [O, O, D] whether occurrences o and o' both continue for d + 1 tokens, identically.
    n: scalar, the number of occurrences.
    match_len: scalar M (0: the root was never seen before with a continuation).
  """

  cont: jax.Array
  valid: jax.Array
  same: jax.Array
  n: jax.Array
  match_len: jax.Array


def find_occurrences(
  corpus: jax.Array, avail: jax.Array, context: jax.Array, n_context, n_occ: int, depth: int
) -> Occurrences:
  """Matches the context in the corpus and gathers the continuations of its longest suffix.

  Args:
    corpus: [C] token ids.
    avail: [C] continuation tokens available after each position (0: not an occurrence).
    context: [X] newest-first context tokens; n_context how many are real.
    n_occ: O, occurrences kept (the latest corpus positions win).
    depth: D, continuation tokens gathered.
  """
  C = corpus.shape[0]
  m = jnp.where(avail > 0, match_lengths(corpus, context, n_context), 0)
  M = jnp.max(m)
  idx, ok = latest((m == M) & (M > 0), min(n_occ, C))
  steps = jnp.arange(depth)
  cont = corpus[jnp.minimum(idx[:, None] + 1 + steps[None, :], C - 1)]
  valid = ok[:, None] & (steps[None, :] < avail[idx][:, None])
  eq = (cont[:, None, :] == cont[None, :, :]) & valid[:, None, :] & valid[None, :, :]
  same = jnp.cumprod(eq.astype(jnp.int32), -1).astype(bool)
  return Occurrences(cont.astype(jnp.int32), valid, same, jnp.sum(ok).astype(jnp.int32), M)


def row_corpus(cache: SuffixCache, row: jax.Array, length: jax.Array):
  """The corpus [G + 1 + S] of one row and the continuation available after each position."""
  S = row.shape[0]
  corpus = jnp.concatenate([cache.tokens, jnp.full((1,), SEP, jnp.int32), row.astype(jnp.int32)])
  local = jnp.maximum(length - 1 - jnp.arange(S), 0)  # positions before the root only
  avail = jnp.concatenate([cache.run, jnp.zeros((1,), jnp.int32), local.astype(jnp.int32)])
  return corpus, avail


def row_context(row: jax.Array, length: jax.Array, max_match: int):
  """The row's last `max_match` tokens, newest first (the root first)."""
  i = jnp.arange(max_match)
  return row[jnp.clip(length - 1 - i, 0, row.shape[0] - 1)].astype(jnp.int32)


def size_budget(
  match_len: jax.Array, spec_factor: float, cap: int, min_match: int = 1
) -> jax.Array:
  """Drafted tokens allowed for a match of length M: min(cap, floor(spec_factor * M)), and none for
  a match shorter than `min_match`."""
  budget = jnp.minimum(cap, jnp.floor(spec_factor * match_len + 1e-6).astype(jnp.int32))
  return jnp.where(match_len >= min_match, budget, 0)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RowTree:
  """One row's drafted tree before masks: node 0 is the root.

  Attributes:
    tokens, parent, depth: [N] int32 (unused slots: token 0, parent -1, depth 0).
    score: [N] float32, each drafted node's continuation frequency (root 1, unused 0).
    n_drafted: scalar, real drafted nodes (they are nodes 1 .. n_drafted).
    match_len: scalar M.
  """

  tokens: jax.Array
  parent: jax.Array
  depth: jax.Array
  score: jax.Array
  n_drafted: jax.Array
  match_len: jax.Array


def build_tree(
  occ: Occurrences,
  root: jax.Array,
  n_nodes: int,
  spec_factor: float,
  min_prob: float,
  min_match: int = 1,
) -> RowTree:
  """The frequency-scored tree of one row (see the module docstring, steps 3 and 4)."""
  n_occ, D = occ.cont.shape  # O, D
  OD = n_occ * D
  count = jnp.sum(occ.same, 1)  # [O, D]: occurrences sharing o's first d + 1 tokens
  first = jnp.argmax(occ.same, 1)  # [O, D]: the latest occurrence sharing them (representative)
  rep = occ.valid & (first == jnp.arange(n_occ)[:, None])
  score = count / jnp.maximum(occ.n, 1)
  flat = jnp.arange(OD)
  d_of = flat % D
  keep = rep.reshape(-1) & (score.reshape(-1) >= min_prob)
  rank = (count.reshape(-1) * (D + 1) + (D - 1 - d_of)) * OD + (OD - 1 - flat)
  top, cand = jax.lax.top_k(jnp.where(keep, rank, -1), min(n_nodes - 1, OD))
  budget = size_budget(occ.match_len, spec_factor, n_nodes - 1, min_match)
  real = (top >= 0) & (jnp.arange(top.shape[0]) < budget)
  o, d = cand // D, cand % D
  node_of = jnp.zeros((OD,), jnp.int32).at[cand].set(jnp.arange(1, top.shape[0] + 1))
  par = node_of[first[o, jnp.maximum(d - 1, 0)] * D + jnp.maximum(d - 1, 0)]
  par = jnp.where(d == 0, 0, par)
  pad = n_nodes - 1 - top.shape[0]

  def nodes(root_value, values, unused, dtype):
    body = jnp.concatenate([jnp.where(real, values, unused), jnp.full((pad,), unused)])
    return jnp.concatenate([jnp.full((1,), root_value), body]).astype(dtype)

  return RowTree(
    nodes(root, occ.cont[o, d], 0, jnp.int32),
    nodes(-1, par, -1, jnp.int32),
    nodes(0, d + 1, 0, jnp.int32),
    nodes(1.0, score[o, d], 0.0, jnp.float32),
    jnp.sum(real).astype(jnp.int32),
    occ.match_len,
  )


def build_chain(occ: Occurrences, k: int, spec_factor: float, min_prob: float, min_match: int = 1):
  """The most frequent path of one row: (tokens [k], scores [k], n_drafted)."""
  alive = occ.valid[:, 0]  # the occurrences that agree with the path so far
  toks, scores = [], []
  for d in range(k):
    v = alive & occ.valid[:, d]
    cnt = jnp.where(v, jnp.sum((occ.cont[:, None, d] == occ.cont[None, :, d]) & v[None, :], 1), 0)
    best = jnp.argmax(cnt)  # ties: the latest occurrence
    toks.append(occ.cont[best, d])
    scores.append(cnt[best] / jnp.maximum(occ.n, 1))
    alive = v & (occ.cont[:, d] == occ.cont[best, d])
  scores = jnp.stack(scores).astype(jnp.float32)
  good = (
    (scores >= min_prob)
    & (scores > 0)
    & (jnp.arange(k) < size_budget(occ.match_len, spec_factor, k, min_match))
  )
  n = jnp.sum(jnp.cumprod(good.astype(jnp.int32))).astype(jnp.int32)
  return jnp.stack(toks).astype(jnp.int32), scores, n


@dataclasses.dataclass(frozen=True)
class _SuffixSettings:
  """Settings shared by the chain and tree forms.

  Attributes:
    max_match: longest context suffix matched (X).
    spec_factor: drafted tokens per matched token (the size rule's alpha).
    min_prob: smallest continuation frequency drafted.
    max_occurrences: O, occurrences of the matched suffix scored (the latest ones).
    global_size: G, slots of the global cache `cache_from_outputs` builds (0: none, the row alone).
    min_match: shortest matched suffix that drafts anything (1: any seen root token).
  """

  max_match: int = 16
  spec_factor: float = 1.0
  min_prob: float = 0.1
  max_occurrences: int = 16
  global_size: int = 4096
  min_match: int = 1
  hidden_layers: tuple[int, ...] = ()

  def _check(self, depth: int) -> None:
    if depth < 1 or self.max_match < 1 or self.max_occurrences < 1 or self.global_size < 0:
      raise ValueError("need draft depth, max_match, max_occurrences >= 1 and global_size >= 0")
    if not 1 <= self.min_match <= self.max_match:
      raise ValueError(f"need 1 <= min_match <= max_match, got {self.min_match}, {self.max_match}")
    if self.spec_factor <= 0 or not 0 <= self.min_prob <= 1:
      raise ValueError(f"need spec_factor > 0 and 0 <= min_prob <= 1, got {self}")

  def cache_from_outputs(self, outputs: Sequence[Sequence[int]]) -> SuffixCache | tuple:
    """The drafter parameters for a call that may draft from these earlier outputs (host side)."""
    if self.global_size == 0:
      return ()
    return suffix_cache_from_outputs(outputs, self.global_size)

  def with_outputs(self, params, outputs: Sequence[Sequence[int]]) -> SuffixCache | tuple:
    """`DraftsFromOutputs`: the parameters are the global cache alone."""
    del params
    return self.cache_from_outputs(outputs)

  def capacity_slack(self) -> int:
    return 0

  def init(self, params, prefill, prompts, prompt_lens, capacity: int):
    del params, prefill, prompts, prompt_lens, capacity
    return ()

  def commit(self, params, state, seq, seq_len, step: StepResult | TreeStepResult):
    return state

  def _occurrences(self, params, seq, seq_len, depth: int) -> Occurrences:
    cache = params if isinstance(params, SuffixCache) else empty_cache()

    def one(row, length):
      corpus, avail = row_corpus(cache, row, length)
      ctx = row_context(row, length, self.max_match)
      return find_occurrences(corpus, avail, ctx, length, self.max_occurrences, depth)

    return jax.vmap(one)(seq, seq_len)


@dataclasses.dataclass(frozen=True)
class SuffixDrafter(_SuffixSettings, DrafterDefaults):
  """Chain suffix decoding: the most frequent continuation path, up to k tokens (chain loop).

  Draft parameters: a `SuffixCache` (or () for none).
  """

  k: int = 4

  def __post_init__(self):
    self._check(self.k)

  def draft_chains(self, params, seq, seq_len):
    """([B, k] tokens, [B, k] scores, [B] n_drafted)."""
    occ = self._occurrences(params, seq, seq_len, self.k)
    fn = lambda o: build_chain(o, self.k, self.spec_factor, self.min_prob, self.min_match)  # noqa: E731
    return jax.vmap(fn)(occ)

  def propose(self, params, state, seq, seq_len, key, sampling: SamplingConfig) -> Proposal:
    del key, sampling
    tokens, _, n = self.draft_chains(params, seq, seq_len)
    return Proposal(tokens, None, n, state)


@dataclasses.dataclass(frozen=True)
class SuffixTreeDrafter(_SuffixSettings, TreeDrafterDefaults):
  """Tree suffix decoding: a frequency-scored tree of adaptive size (tree loop).

  Attributes:
    n_nodes: N, tree slots including the root (the verify width).
    max_depth: deepest drafted node.
  Draft parameters: a `SuffixCache` (or () for none).
  """

  n_nodes: int = 16
  max_depth: int = 6
  draws = "deterministic"

  def __post_init__(self):
    self._check(self.max_depth)
    if self.n_nodes < 2:
      raise ValueError(f"n_nodes must be >= 2 (root + one draft), got {self.n_nodes}")

  def draft_trees(self, params, seq, seq_len) -> RowTree:
    """The rows' trees [B, N] with scores (what `propose` verifies)."""
    occ = self._occurrences(params, seq, seq_len, self.max_depth)
    root = jnp.take_along_axis(seq, (seq_len - 1)[:, None], 1)[:, 0].astype(jnp.int32)
    fn = lambda o, r: build_tree(  # noqa: E731
      o, r, self.n_nodes, self.spec_factor, self.min_prob, self.min_match
    )
    return jax.vmap(fn)(occ, root)

  def propose(self, params, state, seq, seq_len, key, sampling: SamplingConfig) -> TreeProposal:
    del key, sampling
    t = self.draft_trees(params, seq, seq_len)
    mask = ancestor_mask(t.parent, self.max_depth)
    children = children_table(t.parent, min(self.n_nodes - 1, self.max_occurrences))
    tree = TokenTree(t.tokens, t.parent, t.depth, mask, children)
    return TreeProposal(tree, state, t.n_drafted)
