"""Choosing the draft length K (0 = speculation off) from measured acceptance and measured costs.

Model (Leviathan et al. 2023, section 3): each drafted token is accepted with probability alpha,
independently, until the first rejection. A step drafts K tokens and verifies K + 1 positions, and
commits the accepted drafts plus one token from the target, so the expected tokens per step are

    E(alpha, K) = (1 - alpha^(K+1)) / (1 - alpha)            (K + 1 when alpha = 1; 1 at K = 0).

A step costs T(K) = verify(K) + draft_fixed + K * draft_per_token, where verify(K) is the measured
time of one target pass over K + 1 tokens per row at the current batch size (verify(0) is an AR
step) and the draft terms are the drafter's measured costs (zero for K = 0: no drafting). The
walltime factor against AR decoding is

    S(K) = E(alpha, K) * verify(0) / T(K),

and the policy picks the K that maximises S, keeping K = 0 unless the best K beats AR by a margin.
On accelerators verify(K) is nearly flat in K at small batch (a pass is bound by reading weights),
so long drafts pay; as the batch grows a pass becomes compute-bound, verify(K) grows like K + 1,
and S(K) drops below 1 for every K: then speculation is switched off.

Everything here is host-side arithmetic on measured numbers; nothing is traced. K is static in
the compiled loops, so a deployment compiles the few K values the policy can return.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence

import numpy as np


def expected_tokens(alpha: float, k: int) -> float:
  """Expected tokens committed per step with K drafts and acceptance rate alpha."""
  if not 0.0 <= alpha <= 1.0:
    raise ValueError(f"alpha must be in [0, 1], got {alpha}")
  if k < 0:
    raise ValueError(f"k must be >= 0, got {k}")
  if alpha == 1.0:
    return float(k + 1)
  return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def alpha_from_tokens_per_step(tau: float, k: int, tol: float = 1e-10) -> float:
  """The alpha whose E(alpha, K) equals a measured tokens-per-step tau (1 <= tau <= K + 1).

  For drafters that sometimes propose fewer than K tokens (prompt lookup without a match) this is
  an effective alpha that folds the misses in.
  """
  if k < 1:
    raise ValueError("alpha is only identifiable with k >= 1")
  tau = float(np.clip(tau, 1.0, k + 1.0))
  lo, hi = 0.0, 1.0
  while hi - lo > tol:  # E is increasing in alpha
    mid = 0.5 * (lo + hi)
    lo, hi = (mid, hi) if expected_tokens(mid, k) < tau else (lo, mid)
  return 0.5 * (lo + hi)


@dataclasses.dataclass(frozen=True)
class StepCosts:
  """Measured costs of one decode step at one batch size (any time unit, consistently).

  Attributes:
    verify: verify[k] = time of a target pass over k + 1 tokens per row, k = 0 .. len - 1
      (verify[0] is an AR step); the policy considers K up to len(verify) - 1.
    draft_per_token: drafting time per drafted token (e.g. one draft-model forward).
    draft_fixed: drafting time per step independent of K (e.g. a prompt-lookup search).
  """

  verify: tuple[float, ...]
  draft_per_token: float = 0.0
  draft_fixed: float = 0.0

  def __post_init__(self):
    if not self.verify or min(self.verify) <= 0:
      raise ValueError("verify costs must be positive, starting with k = 0")
    if self.draft_per_token < 0 or self.draft_fixed < 0:
      raise ValueError("draft costs must be >= 0")

  @property
  def k_max(self) -> int:
    return len(self.verify) - 1

  def step_time(self, k: int) -> float:
    """T(K): verify pass plus drafting (no drafting at K = 0)."""
    if k == 0:
      return self.verify[0]
    return self.verify[k] + self.draft_fixed + k * self.draft_per_token


def walltime_factor(alpha: float, k: int, costs: StepCosts) -> float:
  """S(K): throughput of speculation with K drafts relative to AR decoding (1.0 at K = 0)."""
  return expected_tokens(alpha, k) * costs.verify[0] / costs.step_time(k)


def best_k(alpha: float, costs: StepCosts, k_max: int | None = None, min_gain: float = 0.0) -> int:
  """The K in [0, k_max] with the largest walltime factor; 0 unless it beats AR by `min_gain`.

  Ties go to the smaller K.
  """
  k_max = costs.k_max if k_max is None else min(k_max, costs.k_max)
  factors = [walltime_factor(alpha, k, costs) for k in range(k_max + 1)]
  k = int(np.argmax(factors))
  return k if factors[k] > 1.0 + min_gain else 0


def interpolate(costs_a: StepCosts, costs_b: StepCosts, w: float) -> StepCosts:
  """(1 - w) * a + w * b, component-wise (same number of verify entries)."""
  if len(costs_a.verify) != len(costs_b.verify):
    raise ValueError("cannot interpolate costs measured for different K ranges")
  mix = lambda x, y: (1.0 - w) * x + w * y  # noqa: E731
  return StepCosts(
    tuple(mix(x, y) for x, y in zip(costs_a.verify, costs_b.verify)),
    mix(costs_a.draft_per_token, costs_b.draft_per_token),
    mix(costs_a.draft_fixed, costs_b.draft_fixed),
  )


@dataclasses.dataclass(frozen=True)
class KPolicy:
  """Picks K for a batch from the measured acceptance rate and costs measured at a few batch sizes.

  Frozen and stateless: feed it the current alpha (e.g. `alpha_from_tokens_per_step` over recent
  steps) and batch size. Between measured batch sizes costs are interpolated linearly in log2(batch);
  outside them the nearest measurement is used.

  Attributes:
    costs: (batch size, StepCosts) pairs, sorted by batch size.
    k_max: largest K returned (also bounded by each measurement's range).
    min_gain: required predicted gain over AR before speculation is switched on, e.g. 0.05 for 5%
      (a guard against noise in the measurements).
  """

  costs: tuple[tuple[int, StepCosts], ...]
  k_max: int = 8
  min_gain: float = 0.05

  def __post_init__(self):
    batches = [b for b, _ in self.costs]
    if not batches or batches != sorted(set(batches)) or batches[0] < 1:
      raise ValueError(f"costs need distinct, sorted, positive batch sizes, got {batches}")

  def costs_at(self, batch: int) -> StepCosts:
    batches = [b for b, _ in self.costs]
    i = bisect.bisect_left(batches, batch)
    if i < len(batches) and batches[i] == batch:
      return self.costs[i][1]
    if i == 0:
      return self.costs[0][1]
    if i == len(batches):
      return self.costs[-1][1]
    (b0, c0), (b1, c1) = self.costs[i - 1], self.costs[i]
    w = (np.log2(batch) - np.log2(b0)) / (np.log2(b1) - np.log2(b0))
    return interpolate(c0, c1, float(w))

  def choose(self, alpha: float, batch: int) -> int:
    """K to use for `batch` rows at acceptance rate `alpha` (0: decode autoregressively)."""
    return best_k(alpha, self.costs_at(batch), self.k_max, self.min_gain)

  def predicted_factor(self, alpha: float, batch: int, k: int | None = None) -> float:
    """Predicted throughput relative to AR with K = `k` (default: the chosen K)."""
    k = self.choose(alpha, batch) if k is None else k
    return walltime_factor(alpha, k, self.costs_at(batch))


def costs_from_measurements(
  verify_by_k: Sequence[tuple[int, float]], draft_per_token: float = 0.0, draft_fixed: float = 0.0
) -> StepCosts:
  """StepCosts from verify times measured at a few K (including 0), linear in between.

  The K range ends at the largest measured K: nothing is extrapolated.
  """
  pts = sorted(verify_by_k)
  if pts[0][0] != 0:
    raise ValueError("the verify costs need a measurement at k = 0 (an AR step)")
  ks, ts = zip(*pts)
  verify = tuple(float(np.interp(k, ks, ts)) for k in range(ks[-1] + 1))
  return StepCosts(verify, draft_per_token, draft_fixed)
