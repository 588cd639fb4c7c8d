"""Static model configuration for Llama-family decoders (Llama 2/3, SmolLM2, Mistral, Qwen2)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import jax.numpy as jnp
import numpy as np

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyper-parameters of a Llama-family decoder. Frozen and hashable: pass it as a static argument.

  Attributes:
    vocab_size: V.
    d_model: D.
    n_layers: L.
    n_heads: H, query heads.
    n_kv_heads: Hkv, key/value heads (grouped-query attention when < n_heads).
    head_dim: Dh.
    ffn_dim: F, SwiGLU hidden width.
    rope_theta: RoPE base.
    rope_scaling: None, or sorted (key, value) pairs of the HF `rope_scaling` dict
      (types "linear" and "llama3" are supported).
    norm_eps: RMSNorm epsilon.
    tie_embeddings: the LM head reuses the token embedding.
    qkv_bias: q/k/v projections carry a bias (Qwen2).
    max_position: the model's context length (informational; caches may be shorter).
    dtype: weight and activation dtype name; norms, softmax and logits are computed in float32.
  """

  vocab_size: int
  d_model: int
  n_layers: int
  n_heads: int
  n_kv_heads: int
  head_dim: int
  ffn_dim: int
  rope_theta: float = 10000.0
  rope_scaling: tuple[tuple[str, Any], ...] | None = None
  norm_eps: float = 1e-5
  tie_embeddings: bool = False
  qkv_bias: bool = False
  max_position: int = 2048
  dtype: str = "float32"

  def __post_init__(self):
    if self.n_heads % self.n_kv_heads:
      raise ValueError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
    if self.dtype not in _DTYPES:
      raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")
    if self.rope_scaling is not None:
      kind = dict(self.rope_scaling).get("rope_type", dict(self.rope_scaling).get("type"))
      if kind not in ("linear", "llama3", "default"):
        raise ValueError(f"unsupported rope_scaling type {kind!r}")

  @property
  def jnp_dtype(self):
    return _DTYPES[self.dtype]

  def replace(self, **kw) -> "ModelConfig":
    return dataclasses.replace(self, **kw)

  def num_params(self) -> int:
    """Parameter count (embedding counted once when tied)."""
    d, f, h, kv, dh = self.d_model, self.ffn_dim, self.n_heads, self.n_kv_heads, self.head_dim
    attn = d * h * dh * 2 + d * kv * dh * 2 + (h * dh + 2 * kv * dh if self.qkv_bias else 0)
    layer = attn + 3 * d * f + 2 * d
    head = 0 if self.tie_embeddings else self.vocab_size * d
    return self.vocab_size * d + self.n_layers * layer + d + head

  @classmethod
  def from_hf_dict(cls, c: dict, dtype: str = "float32") -> "ModelConfig":
    """Builds a config from a Hugging Face `config.json` dict (Llama, Mistral, Qwen2)."""
    archs = c.get("architectures") or []
    supported = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"}
    if archs and not set(archs) & supported:
      raise ValueError(f"unsupported architecture {archs}; supported: {sorted(supported)}")
    n_heads = c["num_attention_heads"]
    head_dim = c.get("head_dim") or c["hidden_size"] // n_heads
    # transformers >= 5 writes RoPE settings only inside `rope_parameters`.
    rp = c.get("rope_parameters") or {}
    scaling = c.get("rope_scaling")
    if scaling is None and rp.get("rope_type", rp.get("type", "default")) != "default":
      scaling = {k: v for k, v in rp.items() if k != "rope_theta"}
    rope_theta = c.get("rope_theta", rp.get("rope_theta", 10000.0))
    if scaling is not None:
      scaling = tuple(sorted((k, v) for k, v in scaling.items() if not isinstance(v, (list, dict))))
      if dict(scaling).get("rope_type", dict(scaling).get("type")) == "default":
        scaling = None
    is_qwen = c.get("model_type") == "qwen2" or "Qwen2ForCausalLM" in archs
    if c.get("sliding_window") and c.get("use_sliding_window", not is_qwen):
      raise ValueError("sliding-window attention is not supported")
    return cls(
      vocab_size=c["vocab_size"],
      d_model=c["hidden_size"],
      n_layers=c["num_hidden_layers"],
      n_heads=n_heads,
      n_kv_heads=c.get("num_key_value_heads", n_heads),
      head_dim=head_dim,
      ffn_dim=c["intermediate_size"],
      rope_theta=float(rope_theta),
      rope_scaling=scaling,
      norm_eps=c.get("rms_norm_eps", 1e-6),
      tie_embeddings=bool(c.get("tie_word_embeddings", False)),
      qkv_bias=bool(c.get("attention_bias", is_qwen)),
      max_position=c.get("max_position_embeddings", 2048),
      dtype=dtype,
    )

  @classmethod
  def from_json(cls, path: str, dtype: str = "float32") -> "ModelConfig":
    with open(path) as f:
      return cls.from_hf_dict(json.load(f), dtype=dtype)


def rope_inv_freq(cfg: ModelConfig) -> np.ndarray:
  """Inverse RoPE frequencies [Dh/2], with linear or Llama-3 scaling applied (numpy, trace time)."""
  dh = cfg.head_dim
  inv = 1.0 / (cfg.rope_theta ** (np.arange(0, dh, 2, dtype=np.float64) / dh))
  if cfg.rope_scaling is None:
    return inv.astype(np.float32)
  s = dict(cfg.rope_scaling)
  kind = s.get("rope_type", s.get("type"))
  if kind == "linear":
    return (inv / s["factor"]).astype(np.float32)
  if kind == "llama3":
    factor, lo, hi = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_ctx = s["original_max_position_embeddings"]
    wavelen = 2 * np.pi / inv
    smooth = (old_ctx / wavelen - lo) / (hi - lo)
    scaled = np.where(wavelen > old_ctx / lo, inv / factor, inv)
    mid = (1 - smooth) * inv / factor + smooth * inv
    is_mid = (wavelen <= old_ctx / lo) & (wavelen >= old_ctx / hi)
    return np.where(is_mid, mid, scaled).astype(np.float32)
  return inv.astype(np.float32)
