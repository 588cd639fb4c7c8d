"""The high-level entry (`specjax.api.SpeculativeLM`): methods by name, batches of chat prompts,
texts and per-row metrics; greedy outputs equal AR's row by row on the real target."""

from __future__ import annotations

import pytest

from specjax.api import SpeculativeLM, method_settings
from specjax.experiment.methods import Target

QUESTIONS = ["Why is the sky blue?", "Write a haiku about rain.", "What is 12 times 7?"]


@pytest.fixture(scope="module")
def target(smollm2):
  return Target(smollm2.params, smollm2.cfg, smollm2.tokenizer, "smollm2-135m-instruct")


@pytest.fixture(scope="module")
def ar(target):
  """AR's completions of QUESTIONS, by name, 24 new tokens."""
  return SpeculativeLM(target, "ar", max_new_tokens=24).generate(QUESTIONS)


def test_ar_by_name_gives_texts_and_counts_passes(ar):
  assert [c.metrics.keys() for c in ar] == [{"target_passes"}] * 3
  assert all(c.text and c.tokens for c in ar)


@pytest.mark.parametrize(
  "method,tree",
  [
    ("prompt_lookup", False),
    ("eagle3-smollm2-135m", False),
    ("eagle3-smollm2-135m", True),
    ("peagle-smollm2-135m", True),  # its block drafts as deep as its fitted 16-node tree goes
    ("lookup_first", False),
  ],
)
def test_methods_by_name_equal_ar_row_by_row(target, ar, method, tree):
  lm = SpeculativeLM(target, method, k=3, tree=tree, max_new_tokens=24)
  assert lm.method.loop == ("tree" if tree else "chain")
  if method == "peagle-smollm2-135m":
    assert lm.method.drafter.tree.max_depth == lm.method.drafter.block.k
  out = lm.generate(QUESTIONS)
  assert [c.tokens for c in out] == [c.tokens for c in ar], (method, tree)
  assert [c.text for c in out] == [c.text for c in ar]
  assert all(c.metrics["target_passes"] >= 1 and c.metrics["tau"] >= 1 for c in out)
  if method != "prompt_lookup":  # a trained head is accepted sometimes on every row
    assert sum(c.metrics["accepted"] for c in out) > 0, method


@pytest.mark.parametrize(
  "name", ["eagle3-smollm2-135m", "medusa4-smollm2-135m", "pard-smollm2-135m"]
)
def test_bfloat16_drafter_weights_keep_the_output(target, ar, name):
  import jax
  import jax.numpy as jnp

  config = {"drafter.weights_dtype": "bfloat16"}
  lm = SpeculativeLM(target, name, k=3, max_new_tokens=24, config=config)
  target_ids = {id(x) for x in jax.tree.leaves(target.params)}
  own = [x for x in jax.tree.leaves(lm.method.draft_params) if id(x) not in target_ids]
  matrices = [x for x in own if x.ndim >= 2 and jnp.issubdtype(x.dtype, jnp.floating)]
  assert matrices and all(x.dtype == jnp.bfloat16 for x in matrices)
  assert all(x.dtype != jnp.bfloat16 for x in own if x.ndim < 2)  # norms and biases stay
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(target.params))
  out = lm.generate(QUESTIONS)
  assert [c.tokens for c in out] == [c.tokens for c in ar]
  assert sum(c.metrics["accepted"] for c in out) > 0
  with pytest.raises(ValueError, match="weights_dtype must be one of"):
    method_settings("smollm2-135m-instruct", name, config={"drafter.weights_dtype": "fp8"})


def test_a_multi_turn_chat_is_a_list_of_messages(target):
  lm = SpeculativeLM(target, "ar", max_new_tokens=8)
  chat = [
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Blue."},
    {"role": "user", "content": "Another one?"},
  ]
  (c,) = lm.generate([chat])
  assert c.tokens and c.text == target.tokenizer.decode(c.tokens)
  (alone,) = lm.generate([chat[-1:]])
  assert c.tokens != alone.tokens, c.text  # the earlier turns reach the model


def test_bad_requests_name_the_problem():
  with pytest.raises(ValueError, match="unknown method 'nope'.*shipped drafter"):
    method_settings("smollm2-135m-instruct", "nope")
  with pytest.raises(ValueError, match="no tree form"):
    method_settings("smollm2-135m-instruct", "prompt_lookup", tree=True)
  with pytest.raises(ValueError, match="config field 'tree.nodes' does not exist"):
    method_settings("smollm2-135m-instruct", "ar", config={"tree.nodes": 3})
  s = method_settings("smollm2-135m-instruct", "medusa4-smollm2-135m", tree=True,
                      config={"tree.n_nodes": 8})  # fmt: skip
  assert (s.method, s.tree.kind, s.tree.n_nodes) == ("tree", "heads", 8)


def test_smc_reports_the_returned_particles_counters(target):
  # SMC-SD keeps every draft: each whole cycle commits k drafts and a bonus token, and the counters
  # are those the loop kept for the particle it returns (not derived after the loop).
  lm = SpeculativeLM(
    target, "smc", k=3, temperature=0.7, max_new_tokens=12, config={"smc.n_particles": 2}
  )
  for c in lm.generate(QUESTIONS[:2]):
    m, n = c.metrics, len(c.tokens)
    assert 1 <= n <= 12 and m["emitted"] == n - 1
    assert m["drafted"] == 3 * m["target_passes"] and m["accepted"] <= m["drafted"]
    assert m["accepted"] + m["target_passes"] >= m["emitted"]  # a cut last cycle commits fewer
