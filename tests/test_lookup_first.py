"""Copy first, a trained drafter otherwise (`specjax.drafters.lookup_first`).

(a) Each row's draft is the copier's (prompt lookup's continuation, or suffix decoding's chain over
the row and a global cache of earlier outputs) where its last tokens occurred before and the
trained drafter's chain elsewhere, with q a point mass on copied tokens; (b) greedy decoding is
token-identical to AR at batch 1 and on a ragged batch, fixed and adaptive K, with either copier;
(c) at temperature > 0 speculative sampling reproduces the target's distribution with either
copier, and a version that reports the trained drafter's q for copied tokens fails the same test
(negative control); (d) rebuilding the copier's cache from outputs leaves the trained drafter's
parameters alone.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_drafters_heads import (  # the heads' toy drafters, target and chi-square helpers
  V_SMALL,
  _gof,
  _prompts,
  _Protocol,
  _sample,
  ar_reference,  # noqa: F401 (fixture)
  make_drafter,
  target,  # noqa: F401 (fixture)
)
from toy_models import exact_continuation_probs, tiny_config

from specjax import adaptive as adp
from specjax.drafters import StepResult
from specjax.drafters.lookup_first import CopyFirstParams, LookupFirstDrafter
from specjax.drafters.suffix import SEP, SuffixDrafter
from specjax.metrics import summarize
from specjax.model import init_params
from specjax.sampling import SamplingConfig
from specjax.speculative import speculative_generate


def test_invalid_settings(target):  # noqa: F811
  model, _ = make_drafter("medusa", *target, 2, np.arange(64))
  with pytest.raises(ValueError, match="min_ngram"):
    LookupFirstDrafter(model, k=2, max_ngram=2, min_ngram=3)
  with pytest.raises(ValueError, match="k must be"):
    LookupFirstDrafter(model, k=0)
  with pytest.raises(TypeError, match="chain drafter"):
    LookupFirstDrafter(object())
  with pytest.raises(TypeError, match="SuffixDrafter"):
    LookupFirstDrafter(model, suffix=object())


def _first_proposal(model, drafter, dparams, rows):
  """`drafter`'s proposal for rows of 7 tokens, after a prefill of their first 6 by the target
  `model` (params, cfg)."""
  tparams, cfg = model
  prompts = jnp.asarray([r[:-1] for r in rows], jnp.int32)
  lens = jnp.full((len(rows),), 6, jnp.int32)
  capacity, key = 32, jax.random.PRNGKey(0)
  seq = jnp.zeros((len(rows), capacity), jnp.int32).at[:, :7].set(jnp.asarray(rows))
  run = _Protocol(drafter, tparams, cfg, width=6, capacity=capacity)
  _, state = run.init(dparams, tparams, prompts, lens)
  return run.propose(dparams, state, seq, jnp.full((len(rows),), 7, jnp.int32), key)


def test_copies_where_the_row_matches_and_drafts_elsewhere(target):  # noqa: F811
  """Row 0 ends with "5 6", which occurred before ("7 8 9" follows it); row 1 repeats no pair."""
  model, dparams = make_drafter("eagle3", *target, 3, np.arange(64), seed=2)
  drafter = LookupFirstDrafter(model, k=3, max_ngram=3, min_ngram=2)
  rows = [[5, 6, 7, 8, 9, 5, 6], [1, 2, 3, 4, 10, 11, 12]]
  both = _first_proposal(target, drafter, drafter.params(dparams), rows)
  alone = _first_proposal(target, model, dparams, rows)
  np.testing.assert_array_equal(np.asarray(both.tokens[0]), [7, 8, 9])
  np.testing.assert_array_equal(np.asarray(both.tokens[1]), np.asarray(alone.tokens[1]))
  np.testing.assert_array_equal(np.asarray(both.n_drafted), [3, 3])
  q = np.exp(np.asarray(both.logq))
  np.testing.assert_array_equal(q[0], np.asarray(jax.nn.one_hot(jnp.asarray([7, 8, 9]), 64)))
  np.testing.assert_allclose(q[1], np.exp(np.asarray(alone.logq[1])), rtol=1e-6)
  # The trained drafter's state moves as if it had drafted alone.
  jax.tree.map(np.testing.assert_array_equal, both.state, alone.state)


def test_suffix_copier_copies_from_earlier_outputs(target):  # noqa: F811
  """Neither row repeats a pair of its own; row 0's last pair "5 6" is in an earlier output
  ("5 6 7 8 9"), so suffix decoding copies "7 8 9" there, and prompt lookup would not."""
  model, dparams = make_drafter("eagle3", *target, 3, np.arange(64), seed=2)
  suffix = SuffixDrafter(k=3, spec_factor=2.0, min_prob=0.0, global_size=16, min_match=2)
  rows = [[1, 2, 3, 4, 10, 5, 6], [1, 2, 3, 4, 10, 11, 12]]
  first = LookupFirstDrafter(model, k=3, suffix=suffix)
  params = first.params(dparams, [[5, 6, 7, 8, 9]])
  both = _first_proposal(target, first, params, rows)
  alone = _first_proposal(target, model, dparams, rows)
  np.testing.assert_array_equal(np.asarray(both.tokens[0]), [7, 8, 9])
  np.testing.assert_array_equal(np.asarray(both.tokens[1]), np.asarray(alone.tokens[1]))
  q = np.exp(np.asarray(both.logq))
  np.testing.assert_array_equal(q[0], np.asarray(jax.nn.one_hot(jnp.asarray([7, 8, 9]), 64)))
  lookup = LookupFirstDrafter(model, k=3)
  by_lookup = _first_proposal(target, lookup, lookup.params(dparams), rows)
  # prompt lookup has no match in the rows: the model drafts both
  np.testing.assert_array_equal(np.asarray(by_lookup.tokens), np.asarray(alone.tokens))
  # The runner's refill (`with_outputs`) rebuilds the cache and keeps the model's parameters.
  later = first.with_outputs(params, [[1, 2], [3, 4, 5]])
  assert isinstance(later, CopyFirstParams) and later.model is params.model
  np.testing.assert_array_equal(later.copier.tokens[-7:], [1, 2, SEP, 3, 4, 5, SEP])
  assert lookup.with_outputs(lookup.params(dparams), [[1, 2]]).copier == ()


@pytest.mark.parametrize("kind", ["eagle1", "eagle3", "peagle", "medusa", "draft_lm"])
def test_sitting_out_leaves_the_state_a_proposal_would(target, kind):  # noqa: F811
  """After `sit_out` (every row copied) and `commit`, the drafter proposes exactly what it proposes
  after its own proposal and the same commit; steps accept 2, 0 and all 3 drafts."""
  tparams, cfg = target
  k, capacity, key = 3, 64, jax.random.PRNGKey(0)
  model, dparams = make_drafter(kind, tparams, cfg, k, np.arange(64), seed=3)
  run = _Protocol(model, tparams, cfg, width=48, capacity=capacity)
  sit_out = jax.jit(lambda *a: model.sit_out(*a, SamplingConfig(temperature=1.0)))
  prompt = _prompts()[1]
  seq = jnp.zeros((1, capacity), jnp.int32).at[0, : len(prompt)].set(jnp.asarray(prompt))
  seq_len = jnp.asarray([len(prompt)], jnp.int32)
  pre, state = run.init(dparams, tparams, run.pad(seq[:, : len(prompt)]), seq_len)
  seq, seq_len = seq.at[0, len(prompt)].set(jnp.argmax(pre.logits[0])), seq_len + 1
  for n_acc in (2, 0, 3):
    n = int(seq_len[0])
    drafted = run.propose(dparams, state, seq, seq_len, key)
    idle = sit_out(dparams, state, seq, seq_len, key)
    block = jnp.concatenate([seq[:, : n - 1], seq[:, n - 1 : n], drafted.tokens], 1)
    out = run.verify(tparams, run.pad(block))
    layers = None if out.layer_hidden is None else out.layer_hidden[:, :, n - 1 : n + k]
    nxt = jnp.argmax(out.logits[0, n - 1 + n_acc])
    seq = seq.at[0, n : n + n_acc + 1].set(jnp.concatenate([drafted.tokens[0, :n_acc], nxt[None]]))
    m = jnp.asarray([n_acc + 1], jnp.int32)
    step = StepResult(seq_len, jnp.asarray([n_acc]), m, out.hidden[:, n - 1 : n + k], layers)
    seq_len = seq_len + m
    state = run.commit(dparams, drafted.state, seq, seq_len, step)
    after_idle = run.commit(dparams, idle, seq, seq_len, step)
    a = run.propose(dparams, state, seq, seq_len, key)
    b = run.propose(dparams, after_idle, seq, seq_len, key)
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens), err_msg=str(n_acc))
    np.testing.assert_allclose(np.asarray(a.logq), np.asarray(b.logq), atol=2e-5, rtol=1e-5)


KINDS = [("eagle3", 3), ("medusa", 2), ("draft_lm", 4)]


@pytest.mark.parametrize("kind,k", KINDS)
def test_greedy_identical_to_ar(target, ar_reference, kind, k):  # noqa: F811
  params, cfg = target
  P, L, gen, ar = ar_reference
  model, dparams = make_drafter(kind, params, cfg, k, np.arange(64))
  drafter = LookupFirstDrafter(model, k=k, min_ngram=1)  # 1: copies often on these short rows
  dparams = drafter.params(dparams)
  out = speculative_generate(params, cfg, drafter, dparams, P, L, gen)  # ragged batch of 4
  np.testing.assert_array_equal(np.asarray(out.lengths), np.asarray(ar.lengths))
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ar.tokens))
  assert summarize(out.metrics)["accepted"] > 0
  for b in (1, 3):  # batch 1
    one = speculative_generate(params, cfg, drafter, dparams, P[b : b + 1], L[b : b + 1], gen)
    n = int(ar.lengths[b])
    assert int(one.lengths[0]) == n
    np.testing.assert_array_equal(np.asarray(one.tokens[0, :n]), np.asarray(ar.tokens[b, :n]))


def test_suffix_first_greedy_identical_to_ar(target, ar_reference):  # noqa: F811
  """Suffix decoding's chain first, with a global cache of the batch's own AR outputs (so most
  steps copy), EAGLE-3 otherwise: identical to AR on the ragged batch and at batch 1."""
  params, cfg = target
  P, L, gen, ar = ar_reference
  model, dparams = make_drafter("eagle3", params, cfg, 3, np.arange(64))
  suffix = SuffixDrafter(k=3, global_size=256, min_match=2)
  drafter = LookupFirstDrafter(model, k=3, suffix=suffix)
  outputs = [np.asarray(t[:n]).tolist() for t, n in zip(ar.tokens, ar.lengths)]
  for cache in ([], outputs):
    dp = drafter.params(dparams, cache)
    out = speculative_generate(params, cfg, drafter, dp, P, L, gen)
    np.testing.assert_array_equal(np.asarray(out.lengths), np.asarray(ar.lengths))
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ar.tokens))
    if cache:  # the answers are in the cache: long copies are accepted
      assert summarize(out.metrics)["tau"] > 2.0, summarize(out.metrics)
  for b in (1, 3):  # batch 1
    one = speculative_generate(params, cfg, drafter, dp, P[b : b + 1], L[b : b + 1], gen)
    n = int(ar.lengths[b])
    np.testing.assert_array_equal(np.asarray(one.tokens[0, :n]), np.asarray(ar.tokens[b, :n]))


def test_adaptive_greedy_identical_to_ar(target, ar_reference):  # noqa: F811
  """In adaptive mode under a cost table that makes drafting pay only when drafts are accepted
  often: identical to AR, with AR steps and drafting steps both taken."""
  params, cfg = target
  P, L, gen, ar = ar_reference
  ks = (0, 2, 3)
  model, dparams = make_drafter("eagle3", params, cfg, 3, np.arange(64))
  drafter = LookupFirstDrafter(model, k=max(ks), min_ngram=1)
  dparams = drafter.params(dparams)
  costs = adp.CostTable(ks, (1.0, 1.3, 1.4), (0.0, 0.0, 0.0))
  out = speculative_generate(
    params, cfg, drafter, dparams, P, L, gen, adaptive=adp.AdaptiveConfig(ks, decay=0.8),
    costs=costs,
  )  # fmt: skip
  np.testing.assert_array_equal(np.asarray(out.lengths), np.asarray(ar.lengths))
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ar.tokens))
  trace = jax.tree.map(np.asarray, out.adaptive)
  chosen = set(trace.choices[: int(trace.n_steps)].tolist())
  assert 0 in chosen and len(chosen) >= 2, chosen


@dataclasses.dataclass(frozen=True)
class MisreportingLookupFirst(LookupFirstDrafter):
  """A WRONG drafter for the negative control: copies where lookup matches but reports the
  trained drafter's q for the copied tokens instead of a point mass."""

  def propose(self, params, state, seq, seq_len, key, sampling):
    prop = super().propose(params, state, seq, seq_len, key, sampling)
    drafted = self.trained().propose(params.model, state, seq, seq_len, key, sampling)
    return dataclasses.replace(prop, logq=drafted.logq)


def _small_target():
  cfg = tiny_config(vocab=V_SMALL, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1)
  return init_params(jax.random.PRNGKey(10), cfg, scale=0.3), cfg


@pytest.mark.parametrize("copier", ["prompt_lookup", "suffix"])
@pytest.mark.parametrize("wrong", [False, True], ids=["lossless", "negative_control"])
def test_sampling_matches_target_distribution(wrong, copier):
  """Prompt [1, 2, 4, 1, 2] ends with a pair seen before, so the first step copies "4 1"; later
  steps copy or draft by what was sampled (the suffix copier also from an earlier output). The
  emitted 3-token sequences must follow the target's exact distribution; reporting the model's q
  for copies must be caught."""
  tparams, cfg = _small_target()
  sampling = SamplingConfig(temperature=1.0)
  prompt = [1, 2, 4, 1, 2]
  probs = exact_continuation_probs(tparams, cfg, prompt, 3, sampling)
  model, dparams = make_drafter("eagle3", tparams, cfg, 2, [0, 2, 3, 5], scale=0.5)
  cls = MisreportingLookupFirst if wrong else LookupFirstDrafter
  suffix = SuffixDrafter(k=2, global_size=32, min_match=2) if copier == "suffix" else None
  drafter = cls(model, k=2, max_ngram=2, min_ngram=2, suffix=suffix)
  dparams = drafter.params(dparams, [[4, 2, 5, 1, 4, 5, 3]])  # ignored by prompt lookup
  tokens, s = _sample(tparams, cfg, drafter, dparams, prompt, sampling)
  if wrong:
    assert _gof(tokens, probs) < 1e-8
  else:
    assert s["accepted"] > 1000 and s["acceptance_rate"] < 0.98, s
    assert _gof(tokens, probs) > 1e-4
