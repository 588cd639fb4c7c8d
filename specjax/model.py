"""A Llama-family decoder as pure functions over explicit pytrees.

`forward(params, tokens, cache, cfg, ...)` runs T new tokens per row at each row's own positions on
top of a per-row KV cache and returns logits, the final (post-norm) hidden state, optionally the
outputs of chosen layers, and the updated cache. Weights are stored in the Hugging Face [out, in]
layout; layers are stacked on a leading L axis and run with `lax.scan`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax.config import ModelConfig, rope_inv_freq
from specjax.kernels import attention, linear, linear_multi, swiglu, take_rows, write_layer
from specjax.kv_cache import KVCache


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LayerParams:
  """Weights of all decoder layers, stacked on a leading L axis (shapes below omit it)."""

  attn_norm: jax.Array  # [D]
  wq: jax.Array  # [H*Dh, D]
  wk: jax.Array  # [Hkv*Dh, D]
  wv: jax.Array  # [Hkv*Dh, D]
  wo: jax.Array  # [D, H*Dh]
  mlp_norm: jax.Array  # [D]
  w_gate: jax.Array  # [F, D]
  w_up: jax.Array  # [F, D]
  w_down: jax.Array  # [D, F]
  bq: jax.Array | None = None  # [H*Dh] (qkv_bias only)
  bk: jax.Array | None = None  # [Hkv*Dh]
  bv: jax.Array | None = None  # [Hkv*Dh]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Params:
  """All weights of a decoder. `lm_head` is None when the embedding is tied."""

  embed: jax.Array  # [V, D]
  layers: LayerParams
  final_norm: jax.Array  # [D]
  lm_head: jax.Array | None = None  # [V, D]


# Logical axis names of every parameter, for sharding rules (`jax.sharding` / flax partitioning).
LOGICAL_AXES = Params(
  embed=("vocab", "embed"),
  layers=LayerParams(
    attn_norm=("layers", "embed"),
    wq=("layers", "q_heads", "embed"),
    wk=("layers", "kv_heads", "embed"),
    wv=("layers", "kv_heads", "embed"),
    wo=("layers", "embed", "q_heads"),
    mlp_norm=("layers", "embed"),
    w_gate=("layers", "mlp", "embed"),
    w_up=("layers", "mlp", "embed"),
    w_down=("layers", "embed", "mlp"),
    bq=("layers", "q_heads"),
    bk=("layers", "kv_heads"),
    bv=("layers", "kv_heads"),
  ),
  final_norm=("embed",),
  lm_head=("vocab", "embed"),
)


def param_shapes(cfg: ModelConfig) -> Params:
  """The expected shape of every parameter (tuples), in the structure of `Params`."""
  L, D, F, V = cfg.n_layers, cfg.d_model, cfg.ffn_dim, cfg.vocab_size
  q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
  bias = cfg.qkv_bias
  return Params(
    embed=(V, D),
    layers=LayerParams(
      attn_norm=(L, D),
      wq=(L, q, D),
      wk=(L, kv, D),
      wv=(L, kv, D),
      wo=(L, D, q),
      mlp_norm=(L, D),
      w_gate=(L, F, D),
      w_up=(L, F, D),
      w_down=(L, D, F),
      bq=(L, q) if bias else None,
      bk=(L, kv) if bias else None,
      bv=(L, kv) if bias else None,
    ),
    final_norm=(D,),
    lm_head=None if cfg.tie_embeddings else (V, D),
  )


def init_params(key: jax.Array, cfg: ModelConfig, scale: float = 0.02) -> Params:
  """Random weights for unit tests and for training draft models from scratch."""
  shapes = param_shapes(cfg)
  leaves, treedef = jax.tree.flatten(shapes, is_leaf=lambda x: isinstance(x, tuple))
  keys = jax.random.split(key, len(leaves))
  rand = [(scale * jax.random.normal(k, s)).astype(cfg.jnp_dtype) for k, s in zip(keys, leaves)]
  params = jax.tree.unflatten(treedef, rand)
  lp = params.layers
  ones = lambda a: jnp.ones_like(a)  # noqa: E731  (RMSNorm scales start at one)
  layers = dataclasses.replace(lp, attn_norm=ones(lp.attn_norm), mlp_norm=ones(lp.mlp_norm))
  return dataclasses.replace(params, layers=layers, final_norm=ones(params.final_norm))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Output:
  """What `forward` returns.

  Attributes:
    logits: [B, T', V] float32, T' = T or the number of `logit_positions`.
    hidden: [B, T, D] final hidden state after the last RMSNorm (what the LM head reads).
    layer_hidden: [n, B, T, D] outputs of the layers in `hidden_layers` (None if none requested).
    cache: the cache with the T new keys/values written and lengths advanced by T.
  """

  logits: jax.Array
  hidden: jax.Array
  layer_hidden: jax.Array | None
  cache: KVCache


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
  """RMSNorm over the last axis, computed in float32, returned in x's dtype.

  The sum of squares is a `linear` against a row of ones: on CPU its kernel reduces every row in
  one fixed order whatever the number of rows, where XLA:CPU's own row reduction does not (it gave
  different bits for some rows of a 33-row call than for the same rows alone at D = 128, and from 8
  rows on at D = 576), so a verify pass normalises each token exactly as a decode step does.
  """
  x32 = x.astype(jnp.float32)
  ss = linear(x32 * x32, jnp.ones((1, x.shape[-1]), jnp.float32))  # [..., 1]
  y = x32 * jax.lax.rsqrt(ss / x.shape[-1] + eps)
  return (y * scale.astype(jnp.float32)).astype(x.dtype)


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: np.ndarray) -> jax.Array:
  """Rotate-half RoPE (HF layout). x: [B, T, h, Dh]; positions: [B, T]."""
  ang = positions[..., None].astype(jnp.float32) * jnp.asarray(inv_freq)  # [B, T, Dh/2]
  cos = jnp.concatenate([jnp.cos(ang)] * 2, -1)[:, :, None, :]
  sin = jnp.concatenate([jnp.sin(ang)] * 2, -1)[:, :, None, :]
  x32 = x.astype(jnp.float32)
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], -1)
  return (x32 * cos + rotated * sin).astype(x.dtype)


def attention_mask(lengths: jax.Array, T: int, S: int, new_mask: jax.Array | None) -> jax.Array:
  """Which cache slots each new token may attend to: [B, T, S] bool.

  New token t of row b is written at slot lengths[b] + t. It sees every slot before lengths[b]
  and, among the new slots, those allowed by `new_mask[b, t, :]` (causal by default; an ancestor
  mask for token trees).
  """
  if new_mask is None:
    new_mask = jnp.tril(jnp.ones((T, T), bool))
  new_mask = jnp.broadcast_to(new_mask, (lengths.shape[0], T, T))
  slot = jnp.arange(S)[None, None, :]
  rel = slot - lengths[:, None, None]  # index within the new block
  in_new = (rel >= 0) & (rel < T)
  rel_c = jnp.clip(rel, 0, T - 1)
  allowed_new = jnp.take_along_axis(new_mask, jnp.broadcast_to(rel_c, (new_mask.shape[0], T, S)), 2)
  return (rel < 0) | (in_new & allowed_new)


def _layer(x, lp: LayerParams, i, k_all, v_all, positions, mask, lengths, cfg, inv_freq):
  """Decoder layer i on new tokens x [B, T, D]; writes its K/V into the stacked cache.

  `lp` holds every layer's weights and `i` (a traced scalar) picks this layer's, so that the CPU
  kernel reads them in place instead of a copy sliced out per layer.
  """
  B, T, _ = x.shape
  H, Hkv, Dh = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
  dt = x.dtype

  def proj(h, w):
    return linear(h, w, i).astype(dt)

  h = rms_norm(x, lp.attn_norm[i], cfg.norm_eps)
  q, k, v = linear_multi(h, (lp.wq, lp.wk, lp.wv), i)
  if lp.bq is not None:
    q, k, v = q + lp.bq[i], k + lp.bk[i], v + lp.bv[i]
  q, k, v = q.astype(dt), k.astype(dt), v.astype(dt)
  q = apply_rope(q.reshape(B, T, H, Dh), positions, inv_freq)
  k = apply_rope(k.reshape(B, T, Hkv, Dh), positions, inv_freq)
  v = v.reshape(B, T, Hkv, Dh)

  k_all = write_layer(k_all, i, k, lengths)
  v_all = write_layer(v_all, i, v, lengths)
  attn = attention(q, k_all, v_all, i, mask).reshape(B, T, H * Dh)
  x = x + proj(attn, lp.wo)

  h = rms_norm(x, lp.mlp_norm[i], cfg.norm_eps)
  x = x + proj(swiglu(h, lp.w_gate, lp.w_up, i).astype(dt), lp.w_down)
  return x, k_all, v_all


def lm_head(params: Params, hidden: jax.Array) -> jax.Array:
  """Logits [..., V] in float32 from final hidden states [..., D]."""
  return linear(hidden, params.embed if params.lm_head is None else params.lm_head)


def forward(
  params: Params,
  tokens: jax.Array,
  cache: KVCache,
  cfg: ModelConfig,
  *,
  positions: jax.Array | None = None,
  new_mask: jax.Array | None = None,
  hidden_layers: Sequence[int] = (),
  logit_positions: jax.Array | None = None,
  embeds: jax.Array | None = None,
) -> Output:
  """Runs T new tokens per row on top of the cache.

  Args:
    params: model weights.
    tokens: [B, T] int32 new tokens; row b's are written at slots cache.lengths[b] + [0, T).
    cache: per-row KV cache; the caller guarantees lengths + T <= capacity.
    cfg: static model config.
    positions: [B, T] RoPE positions; default cache.lengths[:, None] + arange(T). Token trees pass
      depths here while slots stay contiguous.
    new_mask: optional [T, T] or [B, T, T] bool mask among the new tokens (default causal).
    hidden_layers: indices of layers whose outputs to return in `layer_hidden` (static).
    logit_positions: optional [B, n] indices into T; logits are computed only there.
    embeds: optional [B, T, D] input vectors used instead of embed[tokens] (learned mask
      embeddings of parallel drafters); `tokens` then only gives the shape.

  Returns:
    An `Output`; the cache's lengths are advanced by T (callers set them to what they commit).
  """
  B, T = tokens.shape
  S = cache.capacity
  lengths = cache.lengths
  if positions is None:
    positions = lengths[:, None] + jnp.arange(T, dtype=jnp.int32)[None, :]
  mask = attention_mask(lengths, T, S, new_mask)
  inv_freq = rope_inv_freq(cfg)
  x = (take_rows(params.embed, tokens) if embeds is None else embeds).astype(cfg.jnp_dtype)

  def body(carry, i):
    x, k_all, v_all = carry
    x, k_all, v_all = _layer(
      x, params.layers, i, k_all, v_all, positions, mask, lengths, cfg, inv_freq
    )
    return (x, k_all, v_all), (x if hidden_layers else None)

  (x, k_all, v_all), per_layer = jax.lax.scan(
    body, (x, cache.k, cache.v), jnp.arange(cfg.n_layers, dtype=jnp.int32)
  )
  layer_hidden = per_layer[jnp.asarray(list(hidden_layers))] if hidden_layers else None
  hidden = rms_norm(x, params.final_norm, cfg.norm_eps)
  h_for_logits = hidden
  if logit_positions is not None:
    h_for_logits = jnp.take_along_axis(hidden, logit_positions[..., None], axis=1)
  logits = lm_head(params, h_for_logits)
  new_cache = KVCache(k_all, v_all, lengths + T)
  return Output(logits, hidden, layer_hidden, new_cache)
