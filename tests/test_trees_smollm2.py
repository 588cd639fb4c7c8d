"""Greedy tree decoding on the real SmolLM2 target is token-identical to AR greedy."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from specjax.drafters.tree_draft_model import DynamicTreeDrafter, StaticTreeDrafter
from specjax.generate import GenerateConfig, generate, pad_prompts
from specjax.metrics import summarize
from specjax.tree_speculative import tree_speculative_generate
from specjax.trees import StaticTree

pytestmark = pytest.mark.slow

QUESTIONS = [
  "What is the capital of France?",
  "Write a Python function that returns the sum of a list of numbers.",
  "Repeat after me: the quick brown fox jumps over the lazy dog. The quick brown fox",
  "List three colors.",
]


def first_layers(params, cfg, n):
  """A draft sharing the target's vocabulary: its first n layers, final norm and LM head."""
  layers = jax.tree.map(lambda a: a[:n], params.layers)
  return dataclasses.replace(params, layers=layers), cfg.replace(n_layers=n)


@pytest.fixture(scope="module")
def batch(smollm2):
  tok = smollm2.tokenizer
  prompts = [tok.encode_chat([{"role": "user", "content": q}]) for q in QUESTIONS]
  P, L = pad_prompts(prompts, bucket=32)
  gen = GenerateConfig(max_new_tokens=32, stop_tokens=tok.stop_ids)
  ar = generate(smollm2.params, smollm2.cfg, P, L, gen)
  lengths = np.asarray(ar.lengths)
  assert len(set(np.asarray(L).tolist())) > 1 and lengths.min() < lengths.max()
  return P, L, gen, np.asarray(ar.tokens), lengths


@pytest.mark.parametrize("kind", ["static", "dynamic", "eagle1_dynamic"])
def test_greedy_tree_identical_batch(batch, smollm2, kind):
  P, L, gen, ar_tokens, ar_lens = batch
  dparams, dcfg = first_layers(smollm2.params, smollm2.cfg, 4)
  if kind == "static":
    tree = StaticTree.from_paths(
      [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 0, 0, 0)]
    )
    drafter = StaticTreeDrafter(dcfg, tree)
  elif kind == "dynamic":
    drafter = DynamicTreeDrafter(dcfg, top_k=3, depth=4, n_nodes=16)
  else:  # EAGLE-2 trees from the shipped EAGLE-1 head
    from specjax.drafters.shipped import load_shipped
    from specjax.drafters.tree_eagle import EagleTreeDrafter

    shipped = load_shipped("eagle1-smollm2-135m", smollm2.params, smollm2.cfg)
    drafter = EagleTreeDrafter(shipped.head_cfg, top_k=4, depth=4, n_nodes=16)
    dparams = shipped.params
  out = tree_speculative_generate(smollm2.params, smollm2.cfg, drafter, dparams, P, L, gen)
  np.testing.assert_array_equal(np.asarray(out.lengths), ar_lens)
  np.testing.assert_array_equal(np.asarray(out.tokens), ar_tokens)
  s = summarize(out.metrics)
  assert s["accepted"] > 0, s  # the 4-layer draft is weak (the chain drafter accepts ~3%) but real
