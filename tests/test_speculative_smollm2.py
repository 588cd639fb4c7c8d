"""Greedy speculative decoding on the real SmolLM2 target is token-identical to AR greedy."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from specjax.drafters import DraftModelDrafter, PromptLookupDrafter
from specjax.generate import GenerateConfig, generate, pad_prompts
from specjax.metrics import summarize
from specjax.speculative import speculative_generate

pytestmark = pytest.mark.slow

QUESTIONS = [
  "What is the capital of France?",
  "Write a Python function that returns the sum of a list of numbers.",
  "Repeat after me: the quick brown fox jumps over the lazy dog. The quick brown fox",
  "List three colors.",
]


def first_layers(params, cfg, n):
  """A real draft model sharing the target's vocabulary: its first n layers, norm and LM head."""
  layers = jax.tree.map(lambda a: a[:n], params.layers)
  return dataclasses.replace(params, layers=layers), cfg.replace(n_layers=n)


@pytest.fixture(scope="module")
def batch(smollm2):
  tok = smollm2.tokenizer
  prompts = [tok.encode_chat([{"role": "user", "content": q}]) for q in QUESTIONS]
  P, L = pad_prompts(prompts, bucket=32)
  gen = GenerateConfig(max_new_tokens=32, stop_tokens=tok.stop_ids)
  ar = generate(smollm2.params, smollm2.cfg, P, L, gen)
  return P, L, gen, np.asarray(ar.tokens), np.asarray(ar.lengths)


def test_ar_rows_end_at_different_times(batch, smollm2):
  _, _, _, tokens, lengths = batch
  assert lengths.min() < lengths.max() <= 32
  text = smollm2.tokenizer.decode(tokens[0, : lengths[0]].tolist())
  assert "Paris" in text


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_greedy_identical_batch(batch, smollm2, k):
  P, L, gen, ar_tokens, ar_lens = batch
  dparams, dcfg = first_layers(smollm2.params, smollm2.cfg, 4)
  for drafter, dp in [(PromptLookupDrafter(k=k), ()), (DraftModelDrafter(dcfg, k=k), dparams)]:
    out = speculative_generate(smollm2.params, smollm2.cfg, drafter, dp, P, L, gen)
    np.testing.assert_array_equal(np.asarray(out.lengths), ar_lens, err_msg=repr(drafter)[:40])
    np.testing.assert_array_equal(np.asarray(out.tokens), ar_tokens, err_msg=repr(drafter)[:40])
    assert summarize(out.metrics)["accepted"] > 0


def test_greedy_identical_batch_of_one(batch, smollm2):
  P, L, gen, ar_tokens, ar_lens = batch
  out = speculative_generate(
    smollm2.params, smollm2.cfg, PromptLookupDrafter(k=4), (), P[2:3], L[2:3], gen
  )
  assert int(out.lengths[0]) == ar_lens[2]
  np.testing.assert_array_equal(np.asarray(out.tokens[0]), ar_tokens[2])
