"""Statistical tests that the lossless acceptance rules reproduce the target distribution.

Rule level: with fixed target distributions p_0, p_1 and draft distributions q_0, q_1 over a small
vocabulary, the first emitted token must follow p_0 and, given the first draft was accepted, the
second must follow p_1. The same test must reject a deliberately wrong rule (resampling from p
instead of the residual max(0, p - q)), which shows it has power.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from specjax.acceptance import GreedyRule, SpeculativeSamplingRule, TypicalAcceptanceRule
from specjax.sampling import sample_from_logprobs

N = 200_000
ALPHA = 1e-4  # per-test significance; seeds are fixed, so a pass is reproducible


@dataclasses.dataclass(frozen=True)
class ResampleFromPRule(SpeculativeSamplingRule):
  """A WRONG rule for negative controls: on rejection it draws from p, not the residual."""

  def __call__(self, key, draft, logq, logp, n_drafted):
    n, _ = super().__call__(key, draft, logq, logp, n_drafted)
    return n, sample_from_logprobs(jax.random.fold_in(key, 7), logp[n])


def chi2_pvalue(samples: np.ndarray, probs: np.ndarray) -> float:
  counts = np.bincount(samples, minlength=len(probs)).astype(np.float64)
  expected = probs * counts.sum()
  keep = expected > 0
  assert counts[~keep].sum() == 0, "samples outside the target's support"
  return stats.chisquare(counts[keep], expected[keep]).pvalue


def _dists(seed, V=6, K=2, sharp=1.5):
  rng = np.random.RandomState(seed)
  p = rng.dirichlet(np.full(V, sharp), size=K + 1)
  q = rng.dirichlet(np.full(V, sharp), size=K)
  return p, q


def run_rule(rule, p, q, point_mass_draft=None, n=N, seed=0):
  """Simulates one speculative step N times; returns (first token, second token or -1)."""
  K = q.shape[0] if q is not None else len(point_mass_draft)
  keys = jax.random.split(jax.random.PRNGKey(seed), 2 * n).reshape(n, 2, -1)
  logp = jnp.log(jnp.asarray(p, jnp.float32))
  if q is not None:
    logq = jnp.log(jnp.asarray(q, jnp.float32))
    draft = jax.vmap(lambda k: jax.random.categorical(k, logq, -1))(keys[:, 0])
    logq_b = jnp.broadcast_to(logq, (n,) + logq.shape)
  else:
    draft = jnp.broadcast_to(jnp.asarray(point_mass_draft, jnp.int32), (n, K))
    logq_b = None
  in_q = None if logq_b is None else 0
  n_acc, nxt = jax.vmap(rule, in_axes=(0, 0, in_q, None, None))(
    keys[:, 1], draft.astype(jnp.int32), logq_b, logp, jnp.int32(K)
  )
  n_acc, nxt, draft = map(np.asarray, (n_acc, nxt, draft))
  first = np.where(n_acc >= 1, draft[:, 0], nxt)
  second = np.where(n_acc >= 2, draft[:, 1], np.where(n_acc == 1, nxt, -1))
  return first, second


@pytest.mark.parametrize("seed", [0, 1])
def test_speculative_sampling_matches_target(seed):
  p, q = _dists(seed)
  first, second = run_rule(SpeculativeSamplingRule(), p, q, seed=seed)
  assert chi2_pvalue(first, p[0]) > ALPHA
  assert chi2_pvalue(second[second >= 0], p[1]) > ALPHA


def test_point_mass_draft_matches_target():
  p, _ = _dists(3)
  first, second = run_rule(SpeculativeSamplingRule(), p, None, point_mass_draft=[2, 4])
  assert chi2_pvalue(first, p[0]) > ALPHA
  assert chi2_pvalue(second[second >= 0], p[1]) > ALPHA


def test_negative_control_resample_from_p_fails():
  """The same test has the power to catch a real bug."""
  p, q = _dists(0)
  first, second = run_rule(ResampleFromPRule(), p, q)
  assert chi2_pvalue(first, p[0]) < 1e-12
  assert chi2_pvalue(second[second >= 0], p[1]) < 1e-8
  first, _ = run_rule(ResampleFromPRule(), p, None, point_mass_draft=[2, 4])
  assert chi2_pvalue(first, p[0]) < 1e-12


def test_n_drafted_caps_acceptance_and_stays_exact():
  p, q = _dists(5)
  keys = jax.random.split(jax.random.PRNGKey(0), N)
  logp, logq = jnp.log(jnp.asarray(p, jnp.float32)), jnp.log(jnp.asarray(q, jnp.float32))
  draft = jax.vmap(lambda k: jax.random.categorical(k, logq, -1))(keys).astype(jnp.int32)
  rule = SpeculativeSamplingRule()
  n_acc, nxt = jax.vmap(rule, in_axes=(0, 0, None, None, None))(
    keys, draft, logq, logp, jnp.int32(1)
  )
  n_acc, nxt, draft = map(np.asarray, (n_acc, nxt, draft))
  assert n_acc.max() == 1
  # Given the first draft accepted (n = cap = 1), the next token is a bonus drawn from p_1.
  assert chi2_pvalue(nxt[n_acc == 1], p[1]) > ALPHA


def test_greedy_rule_exact():
  logp = jnp.log(jnp.asarray([[0.1, 0.7, 0.2], [0.5, 0.2, 0.3], [0.1, 0.1, 0.8]]))
  rule = GreedyRule()
  assert tuple(map(int, rule(None, jnp.array([1, 0]), None, logp, jnp.int32(2)))) == (2, 2)
  assert tuple(map(int, rule(None, jnp.array([1, 2]), None, logp, jnp.int32(2)))) == (1, 0)
  assert tuple(map(int, rule(None, jnp.array([0, 0]), None, logp, jnp.int32(2)))) == (0, 1)
  assert tuple(map(int, rule(None, jnp.array([1, 0]), None, logp, jnp.int32(1)))) == (1, 0)


def test_typical_acceptance_threshold():
  p = np.array([[0.05, 0.9, 0.05], [0.34, 0.33, 0.33], [0.2, 0.2, 0.6]])
  logp = jnp.log(jnp.asarray(p, jnp.float32))
  rule = TypicalAcceptanceRule(epsilon=0.09, delta=0.3)
  # Position 0 is confident (low entropy): token 1 passes; position 1 is flat: threshold is
  # min(0.09, 0.3 * exp(-ln 3)) ~ 0.09 < 0.33, so any token passes.
  n, _ = rule(jax.random.PRNGKey(0), jnp.array([1, 2]), None, logp, jnp.int32(2))
  assert int(n) == 2
  n, _ = rule(jax.random.PRNGKey(0), jnp.array([0, 2]), None, logp, jnp.int32(2))
  assert int(n) == 0  # p = 0.05 < min(0.09, 0.3 * exp(-H)) with H ~ 0.39
  assert not TypicalAcceptanceRule.lossless
