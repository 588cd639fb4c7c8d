"""Hugging Face checkpoint directories: `config.json` + `model.safetensors` (or a sharded index)."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator

import numpy as np
from safetensors import SafetensorError, safe_open

from specjax.config import ModelConfig
from specjax.loading.keymap import HF_NAMES, CheckpointError, build_params
from specjax.model import Params


def safetensors_files(directory: str) -> list[str]:
  """The safetensors files of a checkpoint directory (single file or sharded index)."""
  index = os.path.join(directory, "model.safetensors.index.json")
  single = os.path.join(directory, "model.safetensors")
  if os.path.exists(index):
    with open(index) as f:
      shards = sorted(set(json.load(f)["weight_map"].values()))
    return [os.path.join(directory, s) for s in shards]
  if os.path.exists(single):
    return [single]
  bins = [f for f in os.listdir(directory) if f.endswith((".bin", ".pt", ".pth"))]
  if bins:
    raise CheckpointError(
      f"{directory} holds only pickle checkpoints ({bins[0]}); specjax loads safetensors only. "
      "Convert with safetensors first."
    )
  raise CheckpointError(f"no model.safetensors or model.safetensors.index.json in {directory}")


def iter_safetensors(paths: list[str]) -> Iterator[tuple[str, np.ndarray]]:
  """(name, array) of every tensor of the files, in order.

  Raises:
    CheckpointError: naming the file (and tensor) when a file is truncated or not safetensors.
  """
  for path in paths:
    fix = "it is truncated or corrupt; download or convert the checkpoint again"
    try:
      handle = safe_open(path, framework="flax")
    except (SafetensorError, OSError) as e:
      size = os.path.getsize(path) if os.path.exists(path) else 0
      raise CheckpointError(f"cannot read {path} ({size} bytes): {e}; {fix}") from e
    with handle as f:
      for name in f.keys():
        try:
          arr = f.get_tensor(name)
        except (SafetensorError, OSError) as e:
          raise CheckpointError(f"cannot read tensor {name!r} of {path}: {e}; {fix}") from e
        yield name, arr


def load_hf(directory: str, dtype: str = "float32") -> tuple[Params, ModelConfig]:
  """Loads a `LlamaForCausalLM` / `MistralForCausalLM` / `Qwen2ForCausalLM` directory, strictly."""
  cfg_path = os.path.join(directory, "config.json")
  if not os.path.exists(cfg_path):
    raise CheckpointError(f"no config.json in {directory}")
  with open(cfg_path) as f:
    cfg = ModelConfig.from_hf_dict(json.load(f), dtype=dtype)
  params = build_params(iter_safetensors(safetensors_files(directory)), cfg, HF_NAMES)
  return params, cfg


def hf_config_dict(cfg: ModelConfig) -> dict:
  """A Hugging Face `config.json` dict for `cfg` (Llama, or Qwen2 when it has q/k/v biases)."""
  qwen = cfg.qkv_bias
  c = {
    "architectures": ["Qwen2ForCausalLM" if qwen else "LlamaForCausalLM"],
    "model_type": "qwen2" if qwen else "llama",
    "vocab_size": cfg.vocab_size,
    "hidden_size": cfg.d_model,
    "num_hidden_layers": cfg.n_layers,
    "num_attention_heads": cfg.n_heads,
    "num_key_value_heads": cfg.n_kv_heads,
    "head_dim": cfg.head_dim,
    "intermediate_size": cfg.ffn_dim,
    "hidden_act": "silu",
    "rope_theta": cfg.rope_theta,
    "rope_scaling": dict(cfg.rope_scaling) if cfg.rope_scaling else None,
    "rms_norm_eps": cfg.norm_eps,
    "tie_word_embeddings": cfg.tie_embeddings,
    "max_position_embeddings": cfg.max_position,
    "torch_dtype": cfg.dtype,
  }
  if not qwen:
    c["attention_bias"] = False
    c["mlp_bias"] = False
  return c


def named_tensors(params: Params, cfg: ModelConfig, names: dict[str, str] = HF_NAMES):
  """The inverse of `build_params`: (checkpoint name, numpy array) for every parameter."""
  for field in ("embed", "final_norm", "lm_head"):
    value = getattr(params, field)
    if value is not None:
      yield names[field], np.asarray(value)
  for field, stacked in dataclasses.asdict(params.layers).items():
    if stacked is not None:
      for i in range(cfg.n_layers):
        yield names[field].format(i=i), np.asarray(stacked[i])


def save_hf(directory: str, params: Params, cfg: ModelConfig) -> None:
  """Writes `config.json` + `model.safetensors` that `load_hf` (and transformers) read back."""
  from safetensors.numpy import save_file

  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(hf_config_dict(cfg), f, indent=2)
  tensors = {name: np.ascontiguousarray(arr) for name, arr in named_tensors(params, cfg)}
  save_file(tensors, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
