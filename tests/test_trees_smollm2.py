"""Greedy tree decoding on the real SmolLM2 target is token-identical to AR greedy."""

from __future__ import annotations

import numpy as np
import pytest

from specjax.drafters.tree_draft_model import DynamicTreeDrafter, StaticTreeDrafter
from specjax.metrics import summarize
from specjax.tree_speculative import tree_speculative_generate
from specjax.trees import StaticTree


@pytest.mark.parametrize("kind", ["static", "dynamic", "eagle1_dynamic"])
def test_greedy_tree_identical_batch(smollm2_chat, smollm2, kind):
  b = smollm2_chat
  dparams, dcfg = b.draft_params, b.draft_cfg
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
  out = tree_speculative_generate(
    smollm2.params, smollm2.cfg, drafter, dparams, b.prompts, b.lens, b.gen
  )
  np.testing.assert_array_equal(np.asarray(out.lengths), b.ar_lens)
  np.testing.assert_array_equal(np.asarray(out.tokens), b.ar_tokens)
  s = summarize(out.metrics)
  assert s["accepted"] > 0, s  # the 4-layer draft is weak (the chain drafter accepts ~3%) but real
