"""Masked losses and agreement metrics over [B, T] windows of packed documents."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from train.data import Batch


def ahead(x: jax.Array, k: int, fill=0) -> jax.Array:
  """x[:, t + k] at every t (axis 1), `fill` past the end of the window."""
  if k == 0:
    return x
  pad = jnp.full((x.shape[0], k) + x.shape[2:], fill, x.dtype)
  return jnp.concatenate([x[:, k:], pad], 1)


def same_doc(batch: Batch, k: int) -> jax.Array:
  """[B, T] position t + k exists in the window and belongs to t's document."""
  return (ahead(batch.doc, k, -1) == batch.doc) & (batch.doc >= 0)


def scored(batch: Batch, d: int, r: int) -> jax.Array:
  """[B, T] float32 weight of position t's loss term: 0 unless position t + d is in t's document
  and response[t + r] is set (x_{t+r+1} is a response token), else the batch's weight at t + r."""
  mask = (same_doc(batch, d) & ahead(batch.response, r, False)).astype(jnp.float32)
  return mask if batch.weight is None else mask * ahead(batch.weight, r, 0.0)


def greedy_target(batch: Batch, n: int) -> tuple[jax.Array, jax.Array]:
  """([B, T] the target's greedy token n positions ahead of t, [B, T] where it is scored: in t's
  document and a response token, x_{t+n} with response[t + n - 1] set)."""
  return ahead(batch.tokens, n), same_doc(batch, n) & ahead(batch.response, n - 1, False)


def doc_causal_mask(doc: jax.Array) -> jax.Array:
  """[B, T, T] causal attention that stays inside each document."""
  T = doc.shape[1]
  causal = jnp.tril(jnp.ones((T, T), bool))[None]
  return causal & (doc[:, :, None] == doc[:, None, :]) & (doc[:, None, :] >= 0)


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
  m = mask.astype(jnp.float32)
  return jnp.sum(x * m) / jnp.maximum(jnp.sum(m), 1.0)


def soft_cross_entropy(logits: jax.Array, target_logp: jax.Array) -> jax.Array:
  """-sum_v p(v) log q(v) per position ([..., V] -> [...]); p given as log-probabilities."""
  logq = jax.nn.log_softmax(logits.astype(jnp.float32), -1)
  return -jnp.sum(jnp.exp(target_logp) * logq, -1)


def entropy(logp: jax.Array) -> jax.Array:
  return -jnp.sum(jnp.exp(logp) * logp, -1)


def smooth_l1(pred: jax.Array, target: jax.Array, beta: float = 1.0) -> jax.Array:
  """Huber-style smooth L1 averaged over the last axis ([..., D] -> [...])."""
  d = jnp.abs(pred.astype(jnp.float32) - target.astype(jnp.float32))
  return jnp.mean(jnp.where(d < beta, 0.5 * d * d / beta, d - 0.5 * beta), -1)


def target_logp(hidden: jax.Array, head: jax.Array) -> jax.Array:
  """The target's distribution restricted to the draft vocabulary: log_softmax(h @ head.T)."""
  return jax.nn.log_softmax(jnp.einsum("...d,vd->...v", hidden.astype(jnp.float32), head), -1)


def agreement(logits: jax.Array, d2t: jax.Array, labels: jax.Array, mask: jax.Array):
  """(hits, count): positions where d2t[argmax logits] equals the target's greedy token."""
  pred = d2t[jnp.argmax(logits, -1)]
  m = mask.astype(jnp.float32)
  return jnp.sum((pred == labels) * m), jnp.sum(m)


def depth_agreement(depths, d2t: jax.Array, key: str = "top1_step{}", first: int = 1) -> dict:
  """Held-out agreement of a drafter's greedy drafts at depths 1..K of every anchor position.

  Args:
    depths: K (logits [B, T, V'], labels [B, T], mask [B, T]) triples, depth 1 first, each
      aligned by anchor position t.
    d2t: [V'] draft-to-target token ids.
    key: the per-depth key, formatted with depth - 1 + first (`top1_step{}` from 1, Medusa's
      `top1_head{}` from 0).

  Returns:
    {key(j): (hits, count)} for each depth j alone, and {"prefix_step{j}": (hits, count)}: the
    positions whose drafts at depths 1..j all equal the target's greedy tokens, that is, where a
    greedy chain of >= j drafts accepts at least j of them (`loop.simulated_tau`).
  """
  out, run = {}, None
  for j, (logits, labels, mask) in enumerate(depths):
    hit = d2t[jnp.argmax(logits, -1)] == labels
    run = hit if run is None else run & hit
    m = mask.astype(jnp.float32)
    out[key.format(j + first)] = (jnp.sum(hit * m), jnp.sum(m))
    out[f"prefix_step{j + 1}"] = (jnp.sum(run * m), jnp.sum(m))
  return out


def rank_agreement(depths, d2t: jax.Array, ranks: int) -> dict:
  """Held-out shares of positions where the target's greedy token is the drafter's r-th best
  candidate (r = 1 .. ranks - 1, 0-based: rank 1 is the second best; rank 0 is
  `depth_agreement`'s top-1) at each depth, whatever the other depths drafted: the per-rank rates
  a static tree over Medusa heads is fitted to (`specjax.trees.heldout_rank_rates`).

  Args:
    depths: as `depth_agreement`'s.
    d2t: [V'] draft-to-target token ids.
    ranks: R.

  Returns:
    {f"rank{r}_head{depth - 1}": (hits, count)}.
  """
  out = {}
  for j, (logits, labels, mask) in enumerate(depths):
    hit = d2t[jax.lax.top_k(logits, ranks)[1]] == labels[..., None]  # [B, T, R]
    m = mask.astype(jnp.float32)
    for r in range(1, ranks):
      out[f"rank{r}_head{j}"] = (jnp.sum(hit[..., r] * m), jnp.sum(m))
  return out
