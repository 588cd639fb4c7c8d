"""The speculative decode loop: exact greedy equivalence, exact sampling distribution, no host sync."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats
from test_acceptance import ResampleFromPRule
from toy_models import exact_continuation_probs, tiny_model

from specjax.acceptance import GreedyRule, SpeculativeSamplingRule
from specjax.drafters import DraftModelDrafter, PromptLookupDrafter, VocabularyMismatchError
from specjax.drafters.draft_model import check_same_vocabulary
from specjax.generate import GenerateConfig, generate, pad_prompts
from specjax.metrics import summarize
from specjax.sampling import SamplingConfig
from specjax.speculative import _speculative, speculative_generate


@pytest.fixture(scope="module")
def models():
  target, cfg = tiny_model(0, vocab=64)
  draft, dcfg = tiny_model(1, vocab=64, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1)
  return target, cfg, draft, dcfg


@pytest.fixture(scope="module")
def stop_token(models):
  """A token the target emits at a different first position in each row (so rows end apart)."""
  target, cfg, _, _ = models
  P, L = pad_prompts(_prompts(), bucket=8)
  toks = np.asarray(generate(target, cfg, P, L, GenerateConfig(max_new_tokens=40)).tokens)
  best, best_spread = None, 0
  for t in range(cfg.vocab_size):
    first = [np.flatnonzero(r == t)[0] if (r == t).any() else 99 for r in toks]
    spread = len(set(first))
    if sum(f < 99 for f in first) >= 2 and spread > best_spread:
      best, best_spread = t, spread
  assert best is not None
  return best


def _prompts():
  rng = np.random.RandomState(0)
  # Repeated n-grams so prompt lookup has something to find.
  base = [list(rng.randint(8, 20, n)) for n in (5, 11, 3, 17)]
  return [b + b[:4] for b in base]


def _drafters(cfg, dcfg, k):
  return [
    ("lookup", PromptLookupDrafter(k=k), None),
    ("draft", DraftModelDrafter(dcfg, k=k), "draft"),
    ("self", DraftModelDrafter(cfg, k=k), "target"),
  ]


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_greedy_token_identical_to_ar(models, stop_token, k):
  target, cfg, draft, dcfg = models
  P, L = pad_prompts(_prompts(), bucket=8)
  gen = GenerateConfig(max_new_tokens=40, stop_tokens=(stop_token,))
  ar = generate(target, cfg, P, L, gen)
  ar_tokens, ar_lens = np.asarray(ar.tokens), np.asarray(ar.lengths)
  assert len(set(ar_lens.tolist())) > 1, "rows should stop at different times"
  params = {"draft": draft, "target": target, None: ()}
  for name, drafter, which in _drafters(cfg, dcfg, k):
    out = speculative_generate(target, cfg, drafter, params[which], P, L, gen)
    np.testing.assert_array_equal(np.asarray(out.lengths), ar_lens, err_msg=name)
    np.testing.assert_array_equal(np.asarray(out.tokens), ar_tokens, err_msg=name)
    s = summarize(out.metrics)
    assert s["emitted"] == int(ar_lens.sum()) - len(ar_lens)  # the prefill token is not counted
    if name == "self":  # the target drafting for itself: every draft it reaches is accepted
      assert s["alpha_at"] == [1.0] * k
      # Only committed drafts count: each pass commits its drafts and a bonus token, except a
      # last pass cut by the stop token or the budget (so acceptance can be below 1).
      m = jax.tree.map(np.asarray, out.metrics)
      extra = m.emitted - m.accepted
      assert ((extra == m.target_passes) | (extra == m.target_passes - 1)).all()


def test_batch_equals_rows_alone(models, stop_token):
  target, cfg, draft, dcfg = models
  prompts = _prompts()
  gen = GenerateConfig(max_new_tokens=24, stop_tokens=(stop_token,))
  drafter = DraftModelDrafter(dcfg, k=3)
  P, L = pad_prompts(prompts, bucket=8)
  batch = speculative_generate(target, cfg, drafter, draft, P, L, gen)
  for i, p in enumerate(prompts):
    Pi, Li = pad_prompts([p], bucket=8)
    alone = speculative_generate(target, cfg, drafter, draft, Pi, Li, gen)
    assert int(alone.lengths[0]) == int(batch.lengths[i])
    np.testing.assert_array_equal(np.asarray(alone.tokens[0]), np.asarray(batch.tokens[i]))


def test_per_row_budgets(models):
  target, cfg, _, _ = models
  P, L = pad_prompts(_prompts(), bucket=8)
  gen = GenerateConfig(max_new_tokens=20)
  budgets = jnp.array([3, 20, 1, 9])
  ar = generate(target, cfg, P, L, gen, max_new_per_row=budgets)
  out = speculative_generate(
    target, cfg, PromptLookupDrafter(k=4), (), P, L, gen, max_new_per_row=budgets
  )
  np.testing.assert_array_equal(np.asarray(out.lengths), [3, 20, 1, 9])
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ar.tokens))


def test_metrics_are_consistent(models):
  target, cfg, draft, dcfg = models
  P, L = pad_prompts(_prompts(), bucket=8)
  out = speculative_generate(
    target, cfg, DraftModelDrafter(dcfg, k=4), draft, P, L, GenerateConfig(max_new_tokens=30)
  )
  m = jax.tree.map(np.asarray, out.metrics)
  assert (m.accepted <= m.drafted).all() and (m.drafted == 4 * m.target_passes).all()
  assert (m.emitted <= m.accepted + m.target_passes).all()
  assert (m.accepted == m.accepted_at.sum(1)).all()
  assert (m.accepted_at <= m.reached_at).all()
  np.testing.assert_array_equal(m.reached_at[:, 0], m.target_passes)


def test_vocabulary_mismatch_is_an_error(models):
  _, cfg, _, dcfg = models
  with pytest.raises(VocabularyMismatchError, match="vocabulary"):
    check_same_vocabulary(cfg, dcfg.replace(vocab_size=65))


def test_greedy_rule_refuses_sampling(models):
  target, cfg, _, _ = models
  P, L = pad_prompts(_prompts(), bucket=8)
  gen = GenerateConfig(max_new_tokens=4, sampling=SamplingConfig(temperature=1.0))
  with pytest.raises(ValueError, match="temperature 0"):
    speculative_generate(target, cfg, PromptLookupDrafter(k=2), (), P, L, gen, rule=GreedyRule())


def test_prompt_longer_than_cache_is_an_error(models):
  target, cfg, _, _ = models
  P, L = pad_prompts([list(range(8, 40))], bucket=8)
  gen = GenerateConfig(max_new_tokens=16, capacity=40)
  with pytest.raises(ValueError, match="exceeds the cache capacity"):
    speculative_generate(target, cfg, PromptLookupDrafter(k=4), (), P, L, gen)
  with pytest.raises(ValueError, match="exceeds the cache capacity"):
    generate(target, cfg, P, L, gen)


def test_no_host_callbacks_or_transfers_in_loop(models):
  """The whole loop is one XLA computation: no callbacks in its jaxpr, no transfers when run."""
  target, cfg, draft, dcfg = models
  P, L = pad_prompts(_prompts(), bucket=8)
  gen = GenerateConfig(max_new_tokens=12)
  drafter = DraftModelDrafter(dcfg, k=3)
  budgets = jnp.full((P.shape[0],), 12, jnp.int32)
  key = jax.random.PRNGKey(0)
  args = (target, draft, P, L, budgets, key)
  jaxpr = jax.make_jaxpr(_speculative, static_argnums=(6, 7, 8, 9))(
    *args, cfg, drafter, GreedyRule(), gen
  )
  text = str(jaxpr)
  assert "while" in text
  assert "callback" not in text
  _speculative(*args, cfg, drafter, GreedyRule(), gen)  # compile outside the guard
  with jax.transfer_guard("disallow"):
    out = _speculative(*args, cfg, drafter, GreedyRule(), gen)
  jax.block_until_ready(out)


# ---- distribution: sequences of 3 tokens over a 6-token vocabulary, enumerated exactly ----

N_SAMPLES = 100_000
V_SMALL = 6
SAMPLINGS = [
  SamplingConfig(temperature=1.0),
  SamplingConfig(temperature=0.8, top_k=4),
  SamplingConfig(temperature=1.0, top_p=0.8),
]


P4 = np.array([0.5, 0.3, 0.15, 0.05])


@pytest.mark.parametrize(
  "sampling,expected",
  [
    (SamplingConfig(temperature=1.0), P4),
    (SamplingConfig(temperature=0.5), P4**2 / np.sum(P4**2)),
    (SamplingConfig(temperature=1.0, top_k=3), [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0]),
    (SamplingConfig(temperature=1.0, top_p=0.7), [0.625, 0.375, 0.0, 0.0]),  # mass before: .5 < .7
    (SamplingConfig(temperature=1.0, top_p=0.85), [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0]),
    (SamplingConfig(temperature=0.0), [1.0, 0.0, 0.0, 0.0]),
  ],
  ids=["t1", "t05", "topk3", "topp07", "topp085", "greedy"],
)
def test_sampling_filters_match_hand_computed_distributions(sampling, expected):
  """The distribution tests take their expected probabilities from `SamplingConfig.logprobs`
  itself, so a wrong temperature, top-k or top-p would move both sides alike; here each is checked
  against probabilities worked out by hand, on shuffled vocabulary order."""
  order = np.array([2, 0, 3, 1])  # token i has probability P4[order[i]]
  logits = jnp.log(jnp.asarray(P4[order], jnp.float32))[None] + 1.7  # any shift
  got = np.exp(np.asarray(sampling.logprobs(logits)))[0]
  np.testing.assert_allclose(got, np.asarray(expected)[order], atol=1e-6)


@pytest.fixture(scope="module")
def small_vocab_models():
  kw = dict(vocab=V_SMALL, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1)
  target, cfg = tiny_model(10, scale=0.2, **kw)
  draft, dcfg = tiny_model(11, scale=0.2, **kw)
  return target, cfg, draft, dcfg


def _sample_sequences(target, cfg, drafter, dparams, prompt, sampling, rule, n=N_SAMPLES):
  P, L = pad_prompts([prompt] * n, bucket=len(prompt))
  gen = GenerateConfig(max_new_tokens=3, sampling=sampling)
  out = speculative_generate(
    target, cfg, drafter, dparams, P, L, gen, rule=rule, key=jax.random.PRNGKey(1)
  )
  assert (np.asarray(out.lengths) == 3).all()
  return np.asarray(out.tokens)[:, :3], summarize(out.metrics)


def _gof_pvalue(tokens, probs: dict) -> float:
  V = V_SMALL
  codes = tokens[:, 0] * V * V + tokens[:, 1] * V + tokens[:, 2]
  counts = np.bincount(codes, minlength=V**3).astype(np.float64)
  expected = np.zeros(V**3)
  for (a, b, c), pr in probs.items():
    expected[a * V * V + b * V + c] = pr * len(tokens)
  assert counts[expected == 0].sum() == 0, "a sequence outside the target's support was produced"
  # Pool the cells with small expectations so the chi-square approximation holds.
  small = expected < 5
  obs = np.append(counts[~small], counts[small].sum())
  exp = np.append(expected[~small], expected[small].sum())
  keep = exp > 0
  return stats.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["t1", "topk", "topp"])
def test_speculative_sampling_distribution(small_vocab_models, sampling):
  target, cfg, draft, dcfg = small_vocab_models
  prompt = [1, 2, 4, 1, 2]
  probs = exact_continuation_probs(target, cfg, prompt, 3, sampling)
  cases = [(DraftModelDrafter(dcfg, k=2), draft), (PromptLookupDrafter(k=2, max_ngram=2), ())]
  for drafter, dparams in cases:
    tokens, summary = _sample_sequences(
      target, cfg, drafter, dparams, prompt, sampling, SpeculativeSamplingRule()
    )
    assert summary["accepted"] > 1000 and summary["acceptance_rate"] < 0.98  # both paths taken
    assert _gof_pvalue(tokens, probs) > 1e-4, type(drafter).__name__


def test_distribution_negative_control_fails(small_vocab_models):
  """Resampling from p instead of the residual must be caught by the same test."""
  target, cfg, draft, dcfg = small_vocab_models
  prompt = [1, 2, 4, 1, 2]
  sampling = SAMPLINGS[0]
  probs = exact_continuation_probs(target, cfg, prompt, 3, sampling)
  tokens, _ = _sample_sequences(
    target, cfg, DraftModelDrafter(dcfg, k=2), draft, prompt, sampling, ResampleFromPRule()
  )
  assert _gof_pvalue(tokens, probs) < 1e-8
