"""The K policy: closed-form expected tokens, the walltime factor and K choices on known numbers."""

from __future__ import annotations

import numpy as np
import pytest

from specjax import k_policy as kp


def test_expected_tokens_closed_form():
  assert kp.expected_tokens(0.5, 0) == 1.0
  assert kp.expected_tokens(0.5, 1) == pytest.approx(1.5)
  assert kp.expected_tokens(0.5, 3) == pytest.approx(1.875)
  assert kp.expected_tokens(0.0, 5) == 1.0
  assert kp.expected_tokens(1.0, 5) == 6.0
  assert kp.expected_tokens(1 - 1e-12, 5) == pytest.approx(6.0, rel=1e-6)
  with pytest.raises(ValueError):
    kp.expected_tokens(1.5, 2)


def test_expected_tokens_matches_simulated_acceptance():
  """E(alpha, K) is the mean of min(first rejection, K) + 1 under i.i.d. acceptance."""
  rng = np.random.default_rng(0)
  alpha, k = 0.7, 4
  accepted = rng.random((200_000, k)) < alpha
  n_acc = np.where(accepted.all(1), k, np.argmin(accepted, 1))
  assert np.mean(n_acc + 1) == pytest.approx(kp.expected_tokens(alpha, k), abs=0.01)


def test_alpha_round_trips_through_tokens_per_step():
  for alpha in (0.1, 0.55, 0.9):
    tau = kp.expected_tokens(alpha, 4)
    assert kp.alpha_from_tokens_per_step(tau, 4) == pytest.approx(alpha, abs=1e-8)
  assert kp.alpha_from_tokens_per_step(1.0, 4) == pytest.approx(0.0, abs=1e-8)
  assert kp.alpha_from_tokens_per_step(7.0, 4) == pytest.approx(1.0, abs=1e-8)  # clipped


def test_walltime_factor_and_best_k_on_hand_computed_numbers():
  # alpha 0.8, verify (1, 1, 1, 1.2, 1.6), 0.1 per drafted token:
  # S(1) = 1.8 / 1.1 = 1.636, S(2) = 2.44 / 1.2 = 2.033, S(3) = 2.952 / 1.5 = 1.968,
  # S(4) = 3.3616 / 2.0 = 1.681.
  costs = kp.StepCosts((1.0, 1.0, 1.0, 1.2, 1.6), draft_per_token=0.1)
  want = [1.0, 1.8 / 1.1, 2.44 / 1.2, 2.952 / 1.5, 3.3616 / 2.0]
  got = [kp.walltime_factor(0.8, k, costs) for k in range(5)]
  np.testing.assert_allclose(got, want, rtol=1e-12)
  assert kp.best_k(0.8, costs) == 2
  assert kp.best_k(0.8, costs, k_max=1) == 1
  # alpha 0.5 with a compute-bound verify (cost grows like K + 1): S(K) < 1 for all K > 0.
  bound = kp.StepCosts((1.0, 2.0, 3.0, 4.0))
  assert [kp.walltime_factor(0.5, k, bound) for k in range(4)] == pytest.approx(
    [1.0, 0.75, 1.75 / 3, 1.875 / 4]
  )
  assert kp.best_k(0.5, bound) == 0


def test_fixed_draft_cost_and_min_gain_keep_speculation_off_when_it_barely_pays():
  costs = kp.StepCosts((1.0, 1.0, 1.0), draft_fixed=0.25)
  # S(1) = 1.3 / 1.25 = 1.04, S(2) = 1.39 / 1.25 = 1.112
  assert kp.best_k(0.3, costs) == 2
  assert kp.best_k(0.3, costs, min_gain=0.2) == 0
  assert kp.best_k(0.0, kp.StepCosts((1.0, 1.0, 1.0))) == 0  # a tie with AR is not a gain


def test_costs_from_measurements_interpolate_without_extrapolating():
  c = kp.costs_from_measurements([(4, 3.0), (0, 1.0)], draft_per_token=0.2)
  assert c.verify == pytest.approx((1.0, 1.5, 2.0, 2.5, 3.0))
  assert c.k_max == 4 and c.draft_per_token == 0.2
  with pytest.raises(ValueError, match="k = 0"):
    kp.costs_from_measurements([(2, 1.0), (4, 3.0)])
  with pytest.raises(ValueError):
    kp.StepCosts((0.0, 1.0))


def test_policy_turns_speculation_off_as_batch_grows():
  """Flat verify costs at batch 1 (memory-bound), linear ones at 32 (compute-bound)."""
  policy = kp.KPolicy(
    costs=(
      (1, kp.StepCosts((1.0, 1.02, 1.04, 1.06, 1.08), draft_per_token=0.05)),
      (32, kp.StepCosts((4.0, 8.0, 12.0, 16.0, 20.0), draft_per_token=0.2)),
    ),
    k_max=4,
  )
  alpha = 0.7
  assert policy.choose(alpha, 1) == 4
  assert policy.choose(alpha, 32) == 0
  assert policy.choose(alpha, 64) == 0  # nearest measurement beyond the range
  # Halfway in log2(batch) between 1 and 32 (batch ~5.7 -> use 4 and check the interpolation).
  mid = policy.costs_at(4)
  w = 2 / 5
  assert mid.verify[2] == pytest.approx((1 - w) * 1.04 + w * 12.0)
  for batch in (1, 2, 4, 8, 16, 32, 64):
    for a in (0.0, 0.3, 0.7, 0.95):
      assert policy.predicted_factor(a, batch) >= 1.0  # never predicted worse than AR
  with pytest.raises(ValueError, match="sorted"):
    kp.KPolicy(costs=((4, mid), (1, mid)))
