"""Verify-and-accept rules on token trees: which root-to-node path a row keeps, and the next token.

Each rule is a small frozen dataclass with one method, written for a single row and vmapped over
the batch by the tree decode loop:

    rule(key, tree, logp, max_depth) -> (path [max_depth + 1], n_accepted, next_token)

`tree` is one row of a `specjax.trees.TokenTree` (tokens [N], parent [N], depth [N], mask [N, N],
children [N, C], logq [N, V] or None); `logp` [N, V] is the target's processed distribution after
each node (temperature / top-k / top-p applied). `path[0]` is the root (node 0) and `path[1..n]`
the accepted nodes; entries past n are junk but valid node ids. The emitted tokens are the
accepted nodes' tokens followed by `next_token`.

Why the sampling rules are lossless. Everything rests on one step, recursive rejection sampling
(RRS): let r be a distribution (initially the target's p at node u) and let proposals
x_1, x_2, ... arrive one at a time, x_i drawn from a distribution q_i that may depend on the
earlier proposals but not on the verifier's coins. Accept x_i with probability
min(1, r_i(x_i) / q_i(x_i)); otherwise continue with r_{i+1} = normalize(max(0, r_i - q_i)); when
the proposals run out, draw the token from the current r. For a single proposal,
P(out = y) = q(y) min(1, r(y)/q(y)) + (1 - sum_x min(q(x), r(x))) * max(0, r(y) - q(y)) / Z, and
Z = sum_y max(0, r(y) - q(y)) = 1 - sum_x min(q(x), r(x)), so P(out = y) = min(q(y), r(y)) +
max(0, r(y) - q(y)) = r(y). Since r_{i+1} depends only on r_i and q_i (not on which x_i was
rejected), induction from the last proposal backwards shows the output follows r_1 = p for any
number of proposals, even one that depends on earlier proposals. Applied at the root, then at the
accepted child (whose own children were proposed from the draft's distribution at that child, with
fresh coins), and so on, every emitted token follows the target's conditional distribution given
the tokens before it: the emitted sequence is distributed exactly as target sampling.

Which q_i is right depends on how the drafter chose the children of a node:
  * `TreeSpeculativeRule(draws="without_replacement")`: children drawn in order without
    replacement from the draft's q_u (Gumbel-top-k), so q_i = q_u with the earlier children
    removed and renormalized (SpecTr / Recursive Speculative Decoding style);
  * `TreeSpeculativeRule(draws="iid")`: children drawn i.i.d. from q_u, q_i = q_u
    (SpecInfer's multi-step speculative sampling);
  * `TreePointMassRule`: q_i = a point mass on the child's token, i.e. accept it with probability
    r(x_i) and otherwise zero r(x_i) and renormalize. This is EAGLE's "q = 1" shortcut for top-k
    drafts. The RRS argument holds for ANY proposal mechanism whose choices do not see the
    verifier's coins (condition on the whole drafted tree: every proposal is then deterministic),
    so it is lossless for top-k children, for dynamic trees and for sampled children alike; it only
    accepts less than the q-aware rule when the children really were sampled from q.
What is NOT lossless is feeding the q-aware rule children that were not drawn the way it assumes
(e.g. deterministic top-k children scored with q_u(x) instead of 1); the tests use that, and a rule
that draws the fallback token from p instead of the residual, as negative controls.

`TreeTypicalRule` (Medusa's typical acceptance) is LOSSY.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax.sampling import sample_from_logprobs
from specjax.trees import TokenTree, path_of

DRAWS = ("without_replacement", "iid")


def longest_ok_path(ok: jax.Array, tree: TokenTree, max_depth: int):
  """The deepest node whose whole root path is ok (lowest id on ties): (path, depth, node).

  Args:
    ok: [N] bool, whether each node's token is acceptable given its parent (root: ignored).
    tree: one row of a `TokenTree`.
    max_depth: static bound on depths.
  """
  ok = ok.at[0].set(True)
  full = jnp.all(jnp.where(tree.mask, ok[None, :], True), -1)  # [N]
  best = jnp.argmax(jnp.where(full, tree.depth, -1)).astype(jnp.int32)
  return path_of(tree.mask, tree.depth, best, max_depth), tree.depth[best].astype(jnp.int32), best


def _parent_probs(tree: TokenTree, p: jax.Array) -> jax.Array:
  """p[parent(j), token(j)] for every node j ([N]; the root gets p[0, token 0], unused)."""
  par = jnp.maximum(tree.parent, 0)
  return p[par, tree.tokens]


@dataclasses.dataclass(frozen=True)
class TreeGreedyRule:
  """Lossless at temperature 0: the longest path whose tokens are the target's argmax at each step."""

  lossless = True
  needs_logq = False

  def __call__(self, key, tree: TokenTree, logp, max_depth: int):
    del key
    target = jnp.argmax(logp, -1).astype(jnp.int32)  # [N]
    ok = tree.tokens == target[jnp.maximum(tree.parent, 0)]
    path, n, best = longest_ok_path(ok, tree, max_depth)
    return path, n, target[best]


@dataclasses.dataclass(frozen=True)
class TreeTypicalRule:
  """Medusa's typical acceptance on trees. LOSSY: the output distribution is not the target's.

  A node is acceptable when p_parent(token) > min(epsilon, delta * exp(-H(p_parent))); the row keeps
  the longest path of acceptable nodes and then draws the next token from p at its end.
  """

  epsilon: float = 0.09
  delta: float = 0.3
  lossless = False
  needs_logq = False

  def __call__(self, key, tree: TokenTree, logp, max_depth: int):
    p = jnp.exp(logp)
    entropy = -jnp.sum(jnp.where(p > 0, p * logp, 0.0), -1)  # [N]
    threshold = jnp.minimum(self.epsilon, self.delta * jnp.exp(-entropy))
    ok = _parent_probs(tree, p) > threshold[jnp.maximum(tree.parent, 0)]
    path, n, best = longest_ok_path(ok, tree, max_depth)
    return path, n, sample_from_logprobs(key, logp[best])


def _rrs_walk(key, tree: TokenTree, logp, max_depth: int, proposal: str):
  """Recursive rejection sampling down the tree (see the module docstring).

  proposal: "point_mass", "iid" or "without_replacement" (how q_i is formed at each child).
  """
  N, V = logp.shape
  C = tree.children.shape[-1]
  p = jnp.exp(logp)
  p = p / jnp.sum(p, -1, keepdims=True)
  q_all = None if proposal == "point_mass" else jnp.exp(tree.logq)

  def try_child(carry, inp):
    r, drawn, chosen, u = carry
    i, k = inp
    c = tree.children[u, i]
    x = tree.tokens[jnp.maximum(c, 0)]
    active = (c >= 0) & (chosen < 0)
    if proposal == "point_mass":
      qi = jax.nn.one_hot(x, V, dtype=r.dtype)
    elif proposal == "iid":
      qi = q_all[u]
    else:
      rem = jnp.where(drawn, 0.0, q_all[u])
      z = jnp.sum(rem)
      # A child with q = 0 could not have been drawn (its parent's support was exhausted).
      active = active & (z > 0) & (rem[x] > 0)
      qi = rem / jnp.where(z > 0, z, 1.0)
    accept = active & (jax.random.uniform(k) * qi[x] < r[x])
    reject = active & ~accept
    res = jnp.maximum(r - qi, 0.0)
    s = jnp.sum(res)
    # s == 0 means r <= q_i everywhere, i.e. r == q_i: rejection had probability 0.
    res = jnp.where(s > 0, res / jnp.where(s > 0, s, 1.0), r)
    r = jnp.where(reject, res, r)
    drawn = drawn | (reject & (jnp.arange(V) == x))
    chosen = jnp.where(accept, c, chosen)
    return (r, drawn, chosen, u), None

  def level(carry, inp):
    u, stopped, r_stop, path, n = carry
    d, k = inp
    ks = jax.random.split(k, C)
    init = (p[u], jnp.zeros((V,), bool), jnp.int32(-1), u)
    (r, _, chosen, _), _ = jax.lax.scan(try_child, init, (jnp.arange(C), ks))
    moved = ~stopped & (chosen >= 0)
    stop_now = ~stopped & (chosen < 0)
    r_stop = jnp.where(stop_now, r, r_stop)
    u = jnp.where(moved, chosen, u)
    path = path.at[d + 1].set(jnp.where(moved, chosen, 0))
    return (u, stopped | stop_now, r_stop, path, n + moved.astype(jnp.int32)), None

  k_walk, k_last = jax.random.split(key)
  path0 = jnp.zeros((max_depth + 1,), jnp.int32)
  init = (jnp.int32(0), jnp.bool_(False), p[0], path0, jnp.int32(0))
  keys = jax.random.split(k_walk, max_depth)
  (u, stopped, r_stop, path, n), _ = jax.lax.scan(level, init, (jnp.arange(max_depth), keys))
  r_final = jnp.where(stopped, r_stop, p[u])  # a path to max depth ends at a leaf: bonus from p
  nxt = sample_from_logprobs(k_last, jnp.log(r_final))
  return path, n, nxt


@dataclasses.dataclass(frozen=True)
class TreeSpeculativeRule:
  """Lossless multi-candidate speculative sampling, for children drawn from the draft's q.

  Attributes:
    draws: "without_replacement" (children are successive draws without replacement from q_u,
      e.g. Gumbel-top-k) or "iid" (independent draws from q_u). The drafter must match.
  """

  draws: str = "without_replacement"
  lossless = True
  needs_logq = True

  def __post_init__(self):
    if self.draws not in DRAWS:
      raise ValueError(f"draws must be one of {DRAWS}, got {self.draws!r}")

  def __call__(self, key, tree: TokenTree, logp, max_depth: int):
    if tree.logq is None:
      raise ValueError("TreeSpeculativeRule needs the drafter's distributions (tree.logq)")
    return _rrs_walk(key, tree, logp, max_depth, self.draws)


@dataclasses.dataclass(frozen=True)
class TreePointMassRule:
  """Lossless for any drafted tree: each child is verified as a point-mass proposal (q = 1).

  EAGLE's rule for top-k drafts. Accepts child x with probability r(x), otherwise removes x from r
  and renormalizes; see the module docstring for why this preserves the target distribution no
  matter how the children were chosen (top-k, dynamic selection or sampling).
  """

  lossless = True
  needs_logq = False

  def __call__(self, key, tree: TokenTree, logp, max_depth: int):
    return _rrs_walk(key, tree, logp, max_depth, "point_mass")


TREE_RULES = {
  "greedy": TreeGreedyRule,
  "speculative": TreeSpeculativeRule,
  "point_mass": TreePointMassRule,
  "typical": TreeTypicalRule,
}
