"""Greedy speculative decoding on the real SmolLM2 target is token-identical to AR greedy."""

from __future__ import annotations

import numpy as np
import pytest

from specjax.drafters import DraftModelDrafter, PromptLookupDrafter
from specjax.metrics import summarize
from specjax.speculative import speculative_generate


def test_ar_rows_end_at_different_times(smollm2_chat, smollm2):
  b = smollm2_chat
  assert b.ar_lens.min() < b.ar_lens.max() <= 32
  text = smollm2.tokenizer.decode(b.ar_tokens[0, : b.ar_lens[0]].tolist())
  assert "Paris" in text


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_greedy_identical_batch(smollm2_chat, smollm2, k):
  b = smollm2_chat
  drafts = [(PromptLookupDrafter(k=k), ()), (DraftModelDrafter(b.draft_cfg, k=k), b.draft_params)]
  for drafter, dp in drafts:
    out = speculative_generate(smollm2.params, smollm2.cfg, drafter, dp, b.prompts, b.lens, b.gen)
    np.testing.assert_array_equal(np.asarray(out.lengths), b.ar_lens, err_msg=repr(drafter)[:40])
    np.testing.assert_array_equal(np.asarray(out.tokens), b.ar_tokens, err_msg=repr(drafter)[:40])
    assert summarize(out.metrics)["accepted"] > 0


def test_greedy_identical_batch_of_one(smollm2_chat, smollm2):
  b = smollm2_chat
  P, L = b.prompts[2:3], b.lens[2:3]
  out = speculative_generate(smollm2.params, smollm2.cfg, PromptLookupDrafter(k=4), (), P, L, b.gen)
  assert int(out.lengths[0]) == b.ar_lens[2]
  np.testing.assert_array_equal(np.asarray(out.tokens[0]), b.ar_tokens[2])
