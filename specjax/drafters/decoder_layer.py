"""One Llama decoder layer on unstacked weights, with explicit keys, values and attention mask.

The speculative heads (EAGLE) and the training code of small drafters need attention patterns
that a KV cache alone does not express (several unrolled draft steps attending to a shared
context, documents packed into one window), so the layer is split at the attention: `project_qkv`
gives the new queries, keys and values; `attend_and_mlp` attends over any keys/values under any
mask and finishes the layer. The arithmetic is that of `specjax.model` (RMSNorm, RoPE, GQA,
SwiGLU).
"""

from __future__ import annotations

import jax

from specjax.config import ModelConfig, rope_inv_freq
from specjax.kernels import linear, linear_multi, swiglu
from specjax.kernels.cache_attention import grouped_query_attention
from specjax.model import LayerParams, apply_rope, rms_norm


def project_qkv(lp: LayerParams, x, positions, cfg: ModelConfig):
  """Pre-norm Q [B,T,H,Dh], K and V [B,T,Hkv,Dh] of the head's layer (RoPE applied)."""
  B, T, _ = x.shape
  h = rms_norm(x, lp.attn_norm, cfg.norm_eps)
  q, k, v = linear_multi(h, (lp.wq, lp.wk, lp.wv))
  inv = rope_inv_freq(cfg)
  q = apply_rope(q.reshape(B, T, cfg.n_heads, cfg.head_dim), positions, inv)
  k = apply_rope(k.reshape(B, T, cfg.n_kv_heads, cfg.head_dim), positions, inv)
  return q, k, v.reshape(B, T, cfg.n_kv_heads, cfg.head_dim)


def attend_and_mlp(lp: LayerParams, x, q, keys, values, mask, cfg: ModelConfig):
  """Rest of the layer: attention of q over keys/values [B,S,Hkv,Dh] under mask [B,T,S], MLP."""
  B, T = x.shape[:2]
  attn = grouped_query_attention(q, keys, values, mask)  # float32 probabilities mix the values
  return finish_layer(lp, x, attn.reshape(B, T, -1), cfg)


def finish_layer(lp: LayerParams, x, attn, cfg: ModelConfig):
  """The layer after attention: output projection of attn [..., H*Dh], residual, MLP."""
  x = x + linear(attn, lp.wo)
  h = rms_norm(x, lp.mlp_norm, cfg.norm_eps)
  return x + linear(swiglu(h, lp.w_gate, lp.w_up), lp.w_down)


def self_attention_layer(lp: LayerParams, x, positions, mask, cfg: ModelConfig):
  """The whole layer on x [B, T, D] attending among its own T positions under mask [B, T, T]."""
  q, k, v = project_qkv(lp, x, positions, cfg)
  return attend_and_mlp(lp, x, q, k, v, mask, cfg)


def layer_at(layers: LayerParams, i: int) -> LayerParams:
  """Layer i of weights stacked on a leading L axis."""
  return jax.tree.map(lambda a: a[i], layers)
