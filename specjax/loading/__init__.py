"""Strict loaders for real checkpoints: Hugging Face safetensors directories and GGUF files."""

from specjax.loading.hf import load_hf
from specjax.loading.keymap import CheckpointError, build_params

__all__ = ["CheckpointError", "build_params", "load_hf"]
