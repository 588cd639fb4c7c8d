"""Forward passes of published EAGLE heads (`specjax.loading.heads` layouts), over whole sequences.

These compute what the published heads compute, for T positions per row with causal attention
among them and no cache: enough to check a loaded checkpoint numerically and to build drafters on.

EAGLE-1/2: x = fc([embed(x_{t+1}); f_t]) (+ bias), then the decoder layers (layer 0 without an
input norm); the output regresses the target's next feature and is scored by the target's LM head.
EAGLE-3: g = fuse([f^(1)_t; ...; f^(n)_t]) (or the head's own previous output, already of width D),
attention reads [attn_norm(embed(x_{t+1})); hidden_norm(g)] (2D wide), the residual stream starts
at g, and logits over the draft vocabulary are head(norm(output)); d2t maps them to target ids.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.config import ModelConfig, rope_inv_freq
from specjax.kernels import take_rows
from specjax.kernels.cache_attention import grouped_query_attention
from specjax.loading.heads import Eagle3HeadParams, EagleHeadParams
from specjax.model import apply_rope, rms_norm


def _linear(x, w, b=None):
  y = jnp.einsum("...i,oi->...o", x, w.astype(jnp.float32))
  return y if b is None else y + b


def _causal_attention(h_in, wq, wk, wv, wo, positions, cfg: ModelConfig):
  """Self-attention of h_in [B, T, Din] with RoPE at positions [B, T] and a causal mask."""
  B, T, _ = h_in.shape
  H, Hkv, Dh = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
  inv = rope_inv_freq(cfg)
  q = apply_rope(_linear(h_in, wq).reshape(B, T, H, Dh), positions, inv)
  k = apply_rope(_linear(h_in, wk).reshape(B, T, Hkv, Dh), positions, inv)
  v = _linear(h_in, wv).reshape(B, T, Hkv, Dh)
  o = grouped_query_attention(q, k, v, jnp.tril(jnp.ones((1, T, T), bool)))  # all float32
  return _linear(o.reshape(B, T, H * Dh), wo)


def _mlp(x, w_gate, w_up, w_down):
  return _linear(jax.nn.silu(_linear(x, w_gate)) * _linear(x, w_up), w_down)


def eagle_forward(
  params: EagleHeadParams, cfg: ModelConfig, embed: jax.Array, tokens, features, positions
) -> jax.Array:
  """EAGLE-1/2 head outputs [B, T, D] (score them with the target's LM head).

  Args:
    params: loaded head.
    cfg: the head's layer config (`HeadConfig.layer`).
    embed: [V, D] the target's token embedding.
    tokens: [B, T] the tokens x_{t+1} paired with each feature.
    features: [B, T, D] the target's final (post-norm) hidden states f_t.
    positions: [B, T] RoPE positions.
  """
  e = take_rows(embed, tokens).astype(jnp.float32)
  x = _linear(jnp.concatenate([e, features.astype(jnp.float32)], -1), params.w_in, params.b_in)
  lp = params.layers
  for i in range(lp.wq.shape[0]):
    h = x if i == 0 else rms_norm(x, lp.attn_norm[i], cfg.norm_eps)
    x = x + _causal_attention(h, lp.wq[i], lp.wk[i], lp.wv[i], lp.wo[i], positions, cfg)
    x = x + _mlp(rms_norm(x, lp.mlp_norm[i], cfg.norm_eps), lp.w_gate[i], lp.w_up[i], lp.w_down[i])
  return x


def eagle3_forward(
  params: Eagle3HeadParams, cfg: ModelConfig, embed: jax.Array, tokens, features, positions
):
  """EAGLE-3 head: (outputs [B, T, D], draft-vocabulary logits [B, T, Vd]).

  Args:
    params: loaded head.
    cfg: the head's layer config (`HeadConfig.layer`).
    embed: [V, D] the target's token embedding.
    tokens: [B, T] the tokens x_{t+1} paired with each feature.
    features: [B, T, n*Dt] the concatenated target layer outputs (`HeadConfig.target_layers`, in
      that order), or [B, T, D] head outputs being fed back while drafting.
    positions: [B, T] RoPE positions.
  """
  g = features.astype(jnp.float32)
  if g.shape[-1] != params.layer.hidden_norm.shape[0]:
    g = _linear(g, params.fuse)
  lp = params.layer
  e = rms_norm(take_rows(embed, tokens).astype(jnp.float32), lp.attn_norm, cfg.norm_eps)
  h = jnp.concatenate([e, rms_norm(g, lp.hidden_norm, cfg.norm_eps)], -1)
  x = g + _causal_attention(h, lp.wq, lp.wk, lp.wv, lp.wo, positions, cfg)
  x = x + _mlp(rms_norm(x, lp.mlp_norm, cfg.norm_eps), lp.w_gate, lp.w_up, lp.w_down)
  return x, _linear(rms_norm(x, params.norm, cfg.norm_eps), params.head)
