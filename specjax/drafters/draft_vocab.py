"""Reduced draft vocabularies (as in EAGLE-3): a drafter scores Vd << V target tokens.

`d2t` [Vd] int32 lists the target ids a drafter can propose (draft index i is target token
d2t[i]). Its LM head is Vd rows instead of V, which matters on small targets: SmolLM2's 49,152 x 576
head is ~21% of the model's weight bytes. For the lossless rules the drafter's distribution is
scattered back to the full vocabulary with q = 0 (log q = -inf) outside d2t.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from specjax.sampling import SamplingConfig


def scatter_logq(logq_d: jax.Array, d2t: jax.Array, vocab_size: int) -> jax.Array:
  """[..., Vd] log-probabilities over the draft vocabulary -> [..., V] (-inf outside d2t)."""
  full = jnp.full(logq_d.shape[:-1] + (vocab_size,), -jnp.inf, jnp.float32)
  return full.at[..., d2t].set(logq_d.astype(jnp.float32))


def draw(key: jax.Array, logits_d: jax.Array, d2t: jax.Array, sampling: SamplingConfig):
  """Draws from the processed draft distribution over Vd: (target ids [...], logq_d [..., Vd])."""
  logq_d = sampling.logprobs(logits_d)
  return d2t[sampling.draw(key, logq_d)], logq_d


def top_tokens(counts: np.ndarray, size: int, always: tuple[int, ...] = ()) -> np.ndarray:
  """The `size` most frequent ids (ties by id), plus `always` (e.g. stop tokens), sorted by id."""
  if size > counts.shape[0]:
    raise ValueError(f"draft vocabulary of {size} exceeds the vocabulary of {counts.shape[0]}")
  order = np.lexsort((np.arange(counts.shape[0]), -counts))
  chosen = list(dict.fromkeys(list(always) + order.tolist()))[:size]
  return np.sort(np.asarray(chosen, np.int32))


def target_to_draft(d2t: np.ndarray, vocab_size: int) -> np.ndarray:
  """[V] int32 map from target id to draft index, -1 for ids outside the draft vocabulary."""
  t2d = np.full(vocab_size, -1, np.int32)
  t2d[np.asarray(d2t)] = np.arange(len(d2t), dtype=np.int32)
  return t2d
