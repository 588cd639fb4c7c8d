"""Strict loaders for real checkpoints: Hugging Face safetensors directories and GGUF files."""

from specjax.loading.gguf_file import load_gguf
from specjax.loading.hf import load_hf, save_hf
from specjax.loading.keymap import CheckpointError, build_params
from specjax.loading.registry import MODELS, ModelUnavailableError, load_model, load_named

__all__ = [
  "MODELS",
  "CheckpointError",
  "ModelUnavailableError",
  "build_params",
  "load_gguf",
  "load_hf",
  "load_model",
  "load_named",
  "save_hf",
]
