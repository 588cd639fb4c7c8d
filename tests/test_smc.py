"""SMC speculative decoding: the pieces against hand-computed values, and consistency on toy models."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from toy_models import exact_continuation_probs, tiny_model

from specjax import smc as smc_lib
from specjax.drafters import DraftModelDrafter, PromptLookupDrafter
from specjax.generate import pad_prompts
from specjax.sampling import SamplingConfig
from specjax.smc import (
  SMCConfig,
  effective_sample_size,
  incremental_log_weight,
  multinomial_resample,
  smc_generate,
  systematic_resample,
)


def test_effective_sample_size():
  assert float(effective_sample_size(jnp.zeros(8))) == pytest.approx(8.0)
  assert float(effective_sample_size(jnp.array([0.0, -jnp.inf, -jnp.inf]))) == pytest.approx(1.0)
  w = np.array([0.5, 0.25, 0.25])
  assert float(effective_sample_size(jnp.log(w))) == pytest.approx(1 / np.sum(w**2), rel=1e-6)


def test_systematic_resampling_counts_are_floor_or_ceil():
  w = np.array([0.05, 0.4, 0.3, 0.15, 0.1])
  n = len(w)
  for seed in range(200):
    idx = np.asarray(systematic_resample(jax.random.PRNGKey(seed), jnp.log(w)))
    counts = np.bincount(idx, minlength=n)
    assert counts.sum() == n
    assert ((counts == np.floor(n * w)) | (counts == np.ceil(n * w))).all(), counts


@pytest.mark.parametrize("resampler", [systematic_resample, multinomial_resample])
def test_resampling_is_unbiased(resampler):
  """E[copies of particle i] = N * w_i."""
  w = np.array([0.05, 0.4, 0.3, 0.15, 0.1, 0.0, 0.0, 0.0])
  n, reps = len(w), 20_000
  keys = jax.random.split(jax.random.PRNGKey(0), reps)
  idx = np.asarray(jax.vmap(resampler, in_axes=(0, None))(keys, jnp.log(w)))
  counts = np.stack([np.bincount(r, minlength=n) for r in idx])
  mean = counts.mean(0)
  se = counts.std(0) / np.sqrt(reps) + 1e-9
  assert (np.abs(mean - n * w) < 5 * se + 1e-6).all(), (mean, n * w)
  assert counts[:, w == 0].sum() == 0


def test_incremental_log_weight_by_hand():
  lp = jnp.log(jnp.array([0.5, 0.2, 0.1]))
  lq = jnp.log(jnp.array([0.25, 0.4, 0.1]))
  log_z = jnp.float32(0.3)
  # All three drafts and the bonus committed: sum(log p - log q) + log Z.
  full = np.log(0.5 / 0.25) + np.log(0.2 / 0.4) + np.log(0.1 / 0.1) + 0.3
  assert float(incremental_log_weight(lp, lq, log_z, 4, 1.0)) == pytest.approx(full, abs=1e-5)
  # A stop token at the second draft: only the first two tokens count (here they cancel), no bonus.
  part = np.log(0.5 / 0.25) + np.log(0.2 / 0.4)
  assert float(incremental_log_weight(lp, lq, log_z, 2, 1.0)) == pytest.approx(part, abs=1e-5)
  # Power alpha = 2 scales log p only.
  pow2 = 2 * np.log(0.5) - np.log(0.25)
  got = float(incremental_log_weight(lp, lq, log_z, 1, 2.0))
  assert got == pytest.approx(pow2, abs=1e-6)
  assert float(incremental_log_weight(lp, lq, log_z, 1, 1.0)) == pytest.approx(
    np.log(2.0), abs=1e-5
  )
  assert float(incremental_log_weight(lp, lq, log_z, 0, 1.0)) == 0.0


# ---- consistency on an enumerable toy: 4-token vocabulary ----

V = 4
R = 20_000
PROMPT = [1, 2, 3, 1]


@pytest.fixture(scope="module")
def toy():
  kw = dict(vocab=V, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1)
  target, cfg = tiny_model(20, scale=0.3, **kw)
  draft, dcfg = tiny_model(21, scale=0.15, **kw)
  return target, cfg, draft, dcfg


def _power_target(target, cfg, n, alpha):
  probs = exact_continuation_probs(target, cfg, PROMPT, n, SamplingConfig(temperature=1.0))
  pi = np.array([probs[s] for s in itertools.product(range(V), repeat=n)]) ** alpha
  return (pi / pi.sum()).reshape((V,) * n)


def _run(toy, n_particles, max_new, seed, **kw):
  target, cfg, draft, dcfg = toy
  P, L = pad_prompts([PROMPT] * R, bucket=len(PROMPT))
  smc = SMCConfig(n_particles=n_particles, max_new_tokens=max_new, draft_temperature=1.0, **kw)
  out = smc_generate(
    target, cfg, DraftModelDrafter(dcfg, k=1), draft, P, L, smc, jax.random.PRNGKey(seed)
  )
  assert (np.asarray(out.lengths) == max_new).all()
  return np.asarray(out.tokens)[:, :max_new], out


def _tv(tokens, pi):
  codes = np.ravel_multi_index(tokens.T, pi.shape)
  emp = np.bincount(codes, minlength=pi.size) / len(tokens)
  return 0.5 * np.abs(emp - pi.ravel()).sum()


def test_consistency_tv_shrinks_with_particles(toy):
  """One cycle (first token, one draft, a bonus): TV to p falls as N grows, below 0.05 at N = 32.

  With R = 20,000 samples over 64 sequences the TV of exact samples is about 0.02 (sampling noise).
  """
  pi = _power_target(toy[0], toy[1], 3, 1.0)
  tv = {n: _tv(_run(toy, n, 3, seed=n)[0], pi) for n in (1, 4, 32)}
  assert tv[1] > tv[4] > tv[32], tv
  assert tv[1] > 0.15, tv  # the draft alone is far from the target: the test has something to fix
  assert tv[32] < 0.05, tv


def test_power_alpha_targets_the_power_distribution(toy):
  """With alpha = 2 the output approaches prod p^2 (normalised), and not p itself."""
  tokens = _run(toy, 32, 3, seed=5, alpha=2.0)[0]
  assert _tv(tokens, _power_target(toy[0], toy[1], 3, 2.0)) < 0.05
  assert _tv(tokens, _power_target(toy[0], toy[1], 3, 1.0)) > 0.1


def test_consistency_over_cycles_with_resampling(toy):
  """Two cycles with resampling after each (threshold 1): the drafted tokens' joint law is pi's."""
  pi = _power_target(toy[0], toy[1], 5, 1.0)
  tokens, out = _run(toy, 32, 5, seed=3, ess_threshold=1.0)
  assert (np.asarray(out.resamples) == 2).all()
  assert (np.asarray(out.target_passes) == 2).all()
  marg = pi.sum(axis=(0, 2, 4))  # (t2, t4): the two drafted positions
  assert _tv(tokens[:, [1, 3]], marg) < 0.03
  ess = np.asarray(out.ess)
  assert ((ess[:, :2] >= 1) & (ess[:, :2] <= 32)).all()


def test_broken_weight_is_caught(toy, monkeypatch):
  """Dropping log q from the weight must fail the same consistency check (power of the test)."""
  pi = _power_target(toy[0], toy[1], 3, 1.0)

  def no_q(logp, logq, log_z, n, alpha):
    return incremental_log_weight(logp, jnp.zeros_like(logq), log_z, n, alpha)

  jax.clear_caches()
  monkeypatch.setattr(smc_lib, "incremental_log_weight", no_q)
  try:
    tv = _tv(_run(toy, 32, 3, seed=32)[0], pi)
  finally:
    jax.clear_caches()
  assert tv > 0.1, tv


def test_stops_mask_weights_and_end_particles(toy):
  target, cfg, draft, dcfg = toy
  P, L = pad_prompts([PROMPT] * 64, bucket=len(PROMPT))
  smc = SMCConfig(n_particles=4, max_new_tokens=12, stop_tokens=(0,), draft_temperature=1.0)
  out = smc_generate(
    target, cfg, DraftModelDrafter(dcfg, k=2), draft, P, L, smc, jax.random.PRNGKey(0)
  )
  toks, lens = np.asarray(out.particle_tokens), np.asarray(out.particle_lengths)
  for r in range(toks.shape[0]):
    for n in range(toks.shape[1]):
      row = toks[r, n, : lens[r, n]]
      stops = np.flatnonzero(row == 0)
      assert len(stops) == 0 or stops[0] == len(row) - 1  # nothing after a stop token
      assert lens[r, n] == 12 or row[-1] == 0
  assert np.isfinite(np.asarray(out.log_z)).all()


def test_drafter_without_q_is_an_error(toy):
  target, cfg, _, _ = toy
  P, L = pad_prompts([PROMPT], bucket=4)
  with pytest.raises(TypeError, match="draft distributions"):
    smc_generate(
      target,
      cfg,
      PromptLookupDrafter(k=2),
      (),
      P,
      L,
      SMCConfig(max_new_tokens=4),
      jax.random.PRNGKey(0),
    )
