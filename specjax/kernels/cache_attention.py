"""`attention(q, k_all, v_all, layer, mask)`: new tokens attending to one layer of the stacked cache.

XLA:CPU runs the two batched dots of attention on copies of the layer's cache, transposed so that
the (row, kv-head) batch axes lead; at batch 8 those copies cost as much as the projections. On CPU
a kernel reads the [L, B, S, Hkv, Dh] cache in place, scores a block of queries of one kv head
against its keys, takes the masked softmax and mixes the values, skipping slots after the last
visible one. It serves prefills too: for a 1,024-token prompt it is 2.1-2.3x faster than the einsums
(benchmarks/RESULTS.md), which build every [T, S] score block and copy the layer's cache. Elsewhere
(other platforms, computations partitioned over several devices) it is the plain einsum
formulation, `grouped_query_attention`, which the drafters' layers use over keys and values of
their own.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from specjax.kernels import build, projection
from specjax.kernels.dispatch import kernel_or_fallback


def grouped_query_attention(q, k, v, mask, probs_dtype=None):
  """Plain-JAX attention of q [B, T, H, Dh] over k, v [B, S, Hkv, Dh] under mask [B, T, S].

  The H query heads are grouped over the Hkv key/value heads; the mask is boolean and broadcasts
  against [B, T, S] (a [1, T, S] mask serves every row). Scores and softmax are float32; the
  probabilities are cast to probs_dtype (None: kept float32) for the value mix, whose dtype the
  output [B, T, H, Dh] has. A fully masked query averages all slots.
  """
  B, T, H, Dh = q.shape
  Hkv = k.shape[2]
  qg = q.reshape(B, T, Hkv, H // Hkv, Dh)
  scores = jnp.einsum("btkgd,bskd->bkgts", qg, k, preferred_element_type=jnp.float32)
  scores = jnp.where(mask[:, None, None], scores * (Dh**-0.5), -1e30)
  probs = jax.nn.softmax(scores, axis=-1)
  if probs_dtype is not None:
    probs = probs.astype(probs_dtype)
  return jnp.einsum("bkgts,bskd->btkgd", probs, v).reshape(B, T, H, Dh)


def reference(q, k_all, v_all, layer, mask):
  """Plain-JAX attention: q [B, T, H, Dh], caches [L, B, S, Hkv, Dh], mask [B, T, S] -> [B, T, H, Dh].

  `grouped_query_attention` over the layer's cache, probabilities cast to q's dtype for the value
  mix. A fully masked query averages all slots (the kernel gives it zeros).
  """
  out = grouped_query_attention(q, k_all[layer], v_all[layer], mask, probs_dtype=q.dtype)
  return out.astype(q.dtype)


def _call(q, k_all, v_all, layer, mask):
  out = jax.ShapeDtypeStruct(q.shape, jnp.float32)
  call = jax.ffi.ffi_call("specjax_cpu_attention", out, vmap_method="sequential")
  Dh = q.shape[-1]
  y = call(
    q.astype(jnp.float32),
    k_all,
    v_all,
    layer,
    mask,
    scale=np.float32(Dh**-0.5),
    max_threads=np.int64(projection.MAX_THREADS),
  )
  return y.astype(q.dtype)


def attention(q, k_all, v_all, layer, mask):
  """Attention of new queries over cache layer `layer`.

  Args:
    q: [B, T, H, Dh] queries (RoPE applied).
    k_all: [L, B, S, Hkv, Dh] keys of every layer (this step's already written).
    v_all: [L, B, S, Hkv, Dh] values.
    layer: int32 scalar.
    mask: [B, T, S] bool, which slots each query may see.

  Returns:
    [B, T, H, Dh] in q's dtype.
  """
  Dh = q.shape[-1]
  usable = Dh % 16 == 0 and k_all.dtype in (jnp.float32, jnp.bfloat16)
  if not usable or not build.load():
    return reference(q, k_all, v_all, layer, mask)
  layer = jnp.asarray(layer, jnp.int32)
  return kernel_or_fallback(_call, reference, q, k_all, v_all, layer, mask)
