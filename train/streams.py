"""Training parallel drafters: every anchor's K draft depths in one pass, as K streams.

A parallel drafter (`specjax.drafters.parallel`) drafts depth 1 from its ordinary input at anchor
t and depth j + 1 from a mask input at position t + j that sees the context up to t and the masks
1..j of the same anchor. Training runs all anchors of a [B, T] window at once: stream 0 holds the
ordinary inputs, stream j the depth-(j + 1) mask inputs of every anchor, and query (j, t) attends

    stream-0 keys s allowed by ctx_mask[b, t, s]   (the causal, same-document context)
    stream-i keys at the same anchor t, 1 <= i <= j

which is exactly what the drafting cache holds when that mask is read. The scores are computed
as one [T, T] context block and one [T, K] local block per stream, not as a [K T, K T] mask.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from specjax.config import ModelConfig
from specjax.drafters.decoder_layer import finish_layer, project_qkv
from specjax.model import LayerParams


def stream_layer(
  lp: LayerParams, x: jax.Array, pos: jax.Array, ctx_mask: jax.Array, cfg: ModelConfig,
  mask_lp: LayerParams | None = None, first_out: jax.Array | None = None, n_lp: int = 1,
) -> jax.Array:  # fmt: skip
  """One decoder layer over the streams.

  Args:
    lp: the layer's weights (no stacked axis).
    x: [B, K, T, D] inputs; stream j at anchor t sits at position pos + j.
    pos: [B, T] positions of stream 0.
    ctx_mask: [B, T, T] which stream-0 keys each anchor sees (includes the anchor itself).
    cfg: the layer's config.
    mask_lp: weights of the mask streams 1..K-1, if they have their own (P-EAGLE's mask layer:
      their queries, keys, values and MLP; the context keys stay stream 0's); default lp.
    first_out: [B, T, D] stream 0's outputs when the caller already has them (this layer over
      stream 0 alone: stream 0 attends to nothing else); only the mask streams then attend and
      run the MLP.
    n_lp: with mask_lp, streams 0..n_lp - 1 go through lp and the rest through mask_lp (P-EAGLE's
      `head_depth2`: stream 1 is the head's own step 2).

  Returns:
    [B, K, T, D] layer outputs.
  """
  B, K, T, D = x.shape
  Hkv, Dh = cfg.n_kv_heads, cfg.head_dim
  G = cfg.n_heads // Hkv

  def project(w, xs, first_depth):
    n = xs.shape[1]
    depth = first_depth + jnp.arange(n, dtype=pos.dtype)
    positions = (pos[:, None, :] + depth[None, :, None]).reshape(B * n, T)
    q, k, v = project_qkv(w, xs.reshape(B * n, T, D), positions, cfg)
    return q.reshape(B, n, T, Hkv, G, Dh), k.reshape(B, n, T, Hkv, Dh), v.reshape(B, n, T, Hkv, Dh)

  n = K if mask_lp is None else n_lp  # streams 0..n - 1 through lp, n.. through mask_lp
  weights = [(w, a, b) for w, a, b in ((lp, 0, n), (mask_lp, n, K)) if b > a]
  parts = [project(w, x[:, a:b], a) for w, a, b in weights]
  q, k, v = (jnp.concatenate(a, 1) for a in zip(*parts))
  if first_out is not None:
    q = q[:, 1:]
  f32 = jnp.float32
  s_ctx = jnp.einsum("bjtkgd,bskd->bjkgts", q, k[:, 0], preferred_element_type=f32)
  s_loc = jnp.einsum("bjtkgd,bitkd->bjkgti", q, k, preferred_element_type=f32)
  depth, rows = np.arange(K), np.arange(K - q.shape[1], K)  # the streams that attend
  local = jnp.asarray((depth[None, :] >= 1) & (depth[None, :] <= rows[:, None]))  # [j, i]
  s_ctx = jnp.where(ctx_mask[:, None, None, None], s_ctx * Dh**-0.5, -1e30)
  s_loc = jnp.where(local[None, :, None, None, None, :], s_loc * Dh**-0.5, -1e30)
  p = jax.nn.softmax(jnp.concatenate([s_ctx, s_loc], -1), -1)
  attn = jnp.einsum("bjkgts,bskd->bjtkgd", p[..., :T], v[:, 0]) + jnp.einsum(
    "bjkgti,bitkd->bjtkgd", p[..., T:], v
  )
  attn = attn.reshape(B, q.shape[1], T, -1)

  def finish(w, xs, a):
    n = xs.shape[1]
    return finish_layer(w, xs.reshape(B * n, T, D), a.reshape(B * n, T, -1), cfg).reshape(
      B, n, T, D
    )

  skip = K - q.shape[1]  # 1 when stream 0's outputs were given: it did not attend
  outs = []
  for w, a, b in weights:
    a = max(a, skip)
    if b > a:
      outs.append(finish(w, x[:, a:b], attn[:, a - skip : b - skip]))
  if first_out is not None:
    outs.insert(0, first_out[:, None].astype(outs[0].dtype))
  return jnp.concatenate(outs, 1)


def stack_streams(first: jax.Array, masks: jax.Array) -> jax.Array:
  """[B, K, T, D]: stream 0 = first [B, T, D], stream j = the depth-(j + 1) mask inputs, given per
  anchor [B, K - 1, T, D] or the same at every anchor [K - 1, D]."""
  B, T, D = first.shape
  if masks.ndim == 2:
    masks = masks[None, :, None, :]
  rest = jnp.broadcast_to(masks.astype(first.dtype), (B, masks.shape[1], T, D))
  return jnp.concatenate([first[:, None], rest], 1)
