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
  lp: LayerParams, x: jax.Array, pos: jax.Array, ctx_mask: jax.Array, cfg: ModelConfig
):
  """One decoder layer over the streams.

  Args:
    lp: the layer's weights (no stacked axis).
    x: [B, K, T, D] inputs; stream j at anchor t sits at position pos + j.
    pos: [B, T] positions of stream 0.
    ctx_mask: [B, T, T] which stream-0 keys each anchor sees (includes the anchor itself).
    cfg: the layer's config.

  Returns:
    [B, K, T, D] layer outputs.
  """
  B, K, T, D = x.shape
  Hkv, Dh = cfg.n_kv_heads, cfg.head_dim
  G = cfg.n_heads // Hkv
  positions = (pos[:, None, :] + jnp.arange(K, dtype=pos.dtype)[None, :, None]).reshape(B * K, T)
  q, k, v = project_qkv(lp, x.reshape(B * K, T, D), positions, cfg)
  q = q.reshape(B, K, T, Hkv, G, Dh)
  k, v = k.reshape(B, K, T, Hkv, Dh), v.reshape(B, K, T, Hkv, Dh)
  f32 = jnp.float32
  s_ctx = jnp.einsum("bjtkgd,bskd->bjkgts", q, k[:, 0], preferred_element_type=f32)
  s_loc = jnp.einsum("bjtkgd,bitkd->bjkgti", q, k, preferred_element_type=f32)
  depth = np.arange(K)
  local = jnp.asarray((depth[None, :] >= 1) & (depth[None, :] <= depth[:, None]))  # [j, i]
  s_ctx = jnp.where(ctx_mask[:, None, None, None], s_ctx * Dh**-0.5, -1e30)
  s_loc = jnp.where(local[None, :, None, None, None, :], s_loc * Dh**-0.5, -1e30)
  p = jax.nn.softmax(jnp.concatenate([s_ctx, s_loc], -1), -1)
  attn = jnp.einsum("bjkgts,bskd->bjtkgd", p[..., :T], v[:, 0]) + jnp.einsum(
    "bjkgti,bitkd->bjtkgd", p[..., T:], v
  )
  out = finish_layer(lp, x.reshape(B * K, T, D), attn.reshape(B * K, T, -1), cfg)
  return out.reshape(B, K, T, D)


def stack_streams(first: jax.Array, masks: jax.Array) -> jax.Array:
  """[B, K, T, D]: stream 0 = first [B, T, D], stream j = the mask input masks[j - 1] ([K - 1, D])
  at every anchor."""
  B, T, D = first.shape
  rest = jnp.broadcast_to(masks.astype(first.dtype)[None, :, None, :], (B, masks.shape[0], T, D))
  return jnp.concatenate([first[:, None], rest], 1)
