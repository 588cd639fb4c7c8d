"""GGUF files (llama.cpp): config from metadata, every tensor dequantized to float, strictly mapped.

Quantized tensors (Q4_1, Q8_0, ...) are dequantized with `gguf.quants.dequantize`; the result is
what the model *is* in specjax (e.g. "SmolLM2-135M-Instruct (Q4_1, dequantized)"). llama.cpp's
converter permutes the rows of `attn_q`/`attn_k` of Llama-architecture models for its interleaved
RoPE; we undo that so the weights are in the Hugging Face rotate-half layout `specjax.model` uses.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from specjax.config import ModelConfig
from specjax.loading.keymap import GGUF_NAMES, CheckpointError, build_params
from specjax.model import Params

# Architectures we map, and whether llama.cpp permuted their q/k rows (Qwen2 uses NeoX RoPE there,
# which is already the rotate-half layout).
SUPPORTED_ARCHITECTURES = {"llama": True, "qwen2": False}


def read_metadata(reader: Any, key: str, default: Any = None) -> Any:
  """One metadata value of an open `gguf.GGUFReader` (Python scalar, str or list), or `default`."""
  field = reader.fields.get(key)
  return default if field is None else field.contents()


def unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
  """Undoes llama.cpp's q/k row permutation: interleaved RoPE pairs -> rotate-half halves.

  Works on a weight [rows, cols] or a bias [rows]; rows = n_head * head_dim.
  """
  rows = w.shape[0]
  rest = w.shape[1:]
  return w.reshape(n_head, rows // n_head // 2, 2, *rest).swapaxes(1, 2).reshape(rows, *rest)


def permute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
  """llama.cpp's q/k permutation (the inverse of `unpermute_rows`); used to write test files."""
  rows = w.shape[0]
  rest = w.shape[1:]
  return w.reshape(n_head, 2, rows // n_head // 2, *rest).swapaxes(1, 2).reshape(rows, *rest)


def _f32(x: float) -> float:
  """A float32 metadata value as the shortest decimal that rounds to it (1e-5, not 9.9999997e-6)."""
  return float(str(np.float32(x)))


def config_from_gguf(reader: Any, dtype: str = "float32") -> ModelConfig:
  """Builds a `ModelConfig` from the `{arch}.*` metadata of an open `gguf.GGUFReader`.

  Raises:
    CheckpointError: for an unsupported architecture or an unsupported RoPE variant.
  """
  arch = read_metadata(reader, "general.architecture")
  if arch not in SUPPORTED_ARCHITECTURES:
    raise CheckpointError(
      f"GGUF architecture {arch!r} is not supported; supported: {sorted(SUPPORTED_ARCHITECTURES)}"
    )

  def need(key: str) -> Any:
    value = read_metadata(reader, f"{arch}.{key}")
    if value is None:
      raise CheckpointError(f"GGUF metadata lacks {arch}.{key}")
    return value

  names = {t.name for t in reader.tensors}
  d_model = int(need("embedding_length"))
  n_heads = int(need("attention.head_count"))
  n_kv_heads = int(read_metadata(reader, f"{arch}.attention.head_count_kv", n_heads))
  head_dim = int(read_metadata(reader, f"{arch}.attention.key_length", d_model // n_heads))
  rope_dim = int(read_metadata(reader, f"{arch}.rope.dimension_count", head_dim))
  if rope_dim != head_dim:
    raise CheckpointError(
      f"partial rotary embeddings (rope dim {rope_dim} of {head_dim}) unsupported"
    )
  if "rope_freqs.weight" in names:
    raise CheckpointError("GGUF carries rope_freqs.weight (Llama-3.1 RoPE scaling); not supported")
  scaling = None
  kind = read_metadata(reader, f"{arch}.rope.scaling.type")
  if kind not in (None, "none"):
    if kind != "linear":
      raise CheckpointError(f"GGUF RoPE scaling type {kind!r} is not supported (only 'linear')")
    scaling = (("factor", _f32(need("rope.scaling.factor"))), ("rope_type", "linear"))

  vocab = read_metadata(reader, f"{arch}.vocab_size")
  if vocab is None:
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is None:
      raise CheckpointError(f"GGUF metadata has neither {arch}.vocab_size nor a token list")
    vocab = len(tokens.data)
  return ModelConfig(
    vocab_size=int(vocab),
    d_model=d_model,
    n_layers=int(need("block_count")),
    n_heads=n_heads,
    n_kv_heads=n_kv_heads,
    head_dim=head_dim,
    ffn_dim=int(need("feed_forward_length")),
    rope_theta=_f32(read_metadata(reader, f"{arch}.rope.freq_base", 10000.0)),
    rope_scaling=scaling,
    norm_eps=_f32(need("attention.layer_norm_rms_epsilon")),
    tie_embeddings="output.weight" not in names,
    qkv_bias="blk.0.attn_q.bias" in names,
    max_position=int(read_metadata(reader, f"{arch}.context_length", 2048)),
    dtype=dtype,
  )


def _dequantized(reader: Any) -> Iterator[tuple[str, np.ndarray]]:
  import gguf

  for t in reader.tensors:
    try:
      arr = gguf.quants.dequantize(t.data, t.tensor_type)
    except NotImplementedError as e:
      raise CheckpointError(f"tensor {t.name!r}: cannot dequantize {t.tensor_type.name}") from e
    yield t.name, np.asarray(arr, np.float32)


def open_gguf(path: str) -> Any:
  """An open `gguf.GGUFReader`, after checking that every tensor's bytes lie inside the file.

  Raises:
    CheckpointError: naming the file, its size and the first tensor that does not fit, for a
      truncated file or one that is not GGUF (the reader's own errors name neither).
  """
  import gguf

  size = os.path.getsize(path)
  fix = "the file is truncated or corrupt; download it again"
  try:
    reader = gguf.GGUFReader(path)
  except (ValueError, IndexError, KeyError, OverflowError, TypeError) as e:
    raise CheckpointError(
      f"{path} ({size} bytes) is not a complete GGUF file ({type(e).__name__}: {e}); {fix}"
    ) from e
  for t in reader.tensors:
    end = int(t.data_offset) + int(t.n_bytes)
    if end > size or t.data.nbytes != int(t.n_bytes):
      raise CheckpointError(
        f"{path} ({size} bytes) ends before tensor {t.name!r}, which needs bytes up to {end}; {fix}"
      )
  return reader


def load_gguf(path: str, dtype: str = "float32") -> tuple[Params, ModelConfig]:
  """Loads a Llama or Qwen2 GGUF file, dequantizing every tensor, strictly.

  Args:
    path: the .gguf file.
    dtype: parameter dtype name ("float32", "bfloat16", "float16").

  Returns:
    (params, cfg) in the Hugging Face layout.

  Raises:
    CheckpointError: for a truncated file, an unsupported architecture, or a missing, unexpected,
      duplicated, mis-shaped or non-finite tensor.
  """
  reader = open_gguf(path)
  cfg = config_from_gguf(reader, dtype=dtype)
  permuted = SUPPORTED_ARCHITECTURES[read_metadata(reader, "general.architecture")]
  heads = {"attn_q": cfg.n_heads, "attn_k": cfg.n_kv_heads}

  def transform(name: str, arr: np.ndarray) -> np.ndarray:
    kind = name.split(".")[-2] if name.startswith("blk.") else ""
    if not permuted or kind not in heads:
      return arr
    if arr.shape[0] != heads[kind] * cfg.head_dim:
      return arr  # wrong shape: the builder reports it by name
    return unpermute_rows(arr, heads[kind])

  params = build_params(_dequantized(reader), cfg, GGUF_NAMES, transform=transform)
  return params, cfg
