"""Hugging Face checkpoint directories: `config.json` + `model.safetensors` (or a sharded index)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import numpy as np
from safetensors import safe_open

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
  for path in paths:
    with safe_open(path, framework="flax") as f:
      for name in f.keys():
        yield name, f.get_tensor(name)


def load_hf(directory: str, dtype: str = "float32") -> tuple[Params, ModelConfig]:
  """Loads a `LlamaForCausalLM` / `MistralForCausalLM` / `Qwen2ForCausalLM` directory, strictly."""
  cfg_path = os.path.join(directory, "config.json")
  if not os.path.exists(cfg_path):
    raise CheckpointError(f"no config.json in {directory}")
  cfg = ModelConfig.from_json(cfg_path, dtype=dtype)
  params = build_params(iter_safetensors(safetensors_files(directory)), cfg, HF_NAMES)
  return params, cfg
