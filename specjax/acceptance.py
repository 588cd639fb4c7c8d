"""Verify-and-accept rules: which drafted tokens a row keeps, and which token it adds after them.

Each rule is a small frozen dataclass with one method, `__call__`, written for a single row and
vmapped over the batch by the decode loop:

    rule(key, draft [K], logq [K, V] | None, logp [K + 1, V], n_drafted) -> (n_accepted, next_token)

`logp` is the target's processed distribution (temperature / top-k / top-p applied) at the K + 1
verified positions; `logq` the drafter's processed distribution for each drafted token, or None for
a deterministic proposal (prompt lookup), which is a point mass q = 1 on the drafted token.
`n_drafted` <= K caps acceptance: positions at or past it were not really proposed, so the token
after them is drawn from p as a bonus (equivalent to proposing fewer tokens; lossless).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax.sampling import sample_from_logprobs


def _first_false(ok: jax.Array, cap: jax.Array) -> jax.Array:
  """Length of the all-True prefix of ok [K], at most cap."""
  n = jnp.sum(jnp.cumprod(ok.astype(jnp.int32)))
  return jnp.minimum(n, cap).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class GreedyRule:
  """Lossless at temperature 0: keep drafted tokens while they equal the target's argmax."""

  lossless = True

  def __call__(self, key, draft, logq, logp, n_drafted):
    del key, logq
    target = jnp.argmax(logp, -1).astype(jnp.int32)  # [K + 1]
    n = _first_false(draft == target[:-1], n_drafted)
    return n, target[n]


@dataclasses.dataclass(frozen=True)
class SpeculativeSamplingRule:
  """Lossless speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

  Accept drafted token x_i with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection
  draw the next token from the residual normalize(max(0, p_i - q_i)); if every proposed token is
  accepted, draw a bonus token from p. Each emitted token is then distributed exactly as the
  target's. With a point-mass q (deterministic drafts) the residual is p with x_i removed.
  At temperature 0 both p and q are point masses and the rule reduces to `GreedyRule`.
  """

  lossless = True

  def __call__(self, key, draft, logq, logp, n_drafted):
    K = draft.shape[0]
    k_acc, k_res = jax.random.split(key)
    p = jnp.exp(logp)  # [K + 1, V]
    p_draft = jnp.take_along_axis(p[:K], draft[:, None], 1)[:, 0]
    if logq is None:
      q = jax.nn.one_hot(draft, p.shape[-1], dtype=p.dtype)
      q_draft = jnp.ones((K,), p.dtype)
    else:
      q = jnp.exp(logq)
      q_draft = jnp.take_along_axis(q, draft[:, None], 1)[:, 0]
    u = jax.random.uniform(k_acc, (K,))
    accept = u * q_draft < p_draft  # u < p / q without dividing by a zero q
    n = _first_false(accept, n_drafted)
    p_n = p[n]
    q_n = jnp.where(n < K, q[jnp.minimum(n, K - 1)], 0.0)
    rejected = n < n_drafted
    residual = jnp.where(rejected, jnp.maximum(p_n - q_n, 0.0), p_n)
    # If p == q up to rounding the residual can vanish; rejection then had probability ~0.
    residual = jnp.where(jnp.sum(residual) > 0, residual, p_n)
    nxt = sample_from_logprobs(k_res, jnp.log(residual))
    return n, nxt


@dataclasses.dataclass(frozen=True)
class TypicalAcceptanceRule:
  """Medusa's typical acceptance. LOSSY: the output distribution is not the target's.

  Accept drafted token x_i while p_i(x_i) > min(epsilon, delta * exp(-H(p_i))), where H is the
  entropy of the target's processed distribution; then draw the next token from p (its argmax at
  temperature 0). Defaults follow Medusa (posterior_threshold 0.09, posterior_alpha 0.3).
  """

  epsilon: float = 0.09
  delta: float = 0.3
  lossless = False

  def __call__(self, key, draft, logq, logp, n_drafted):
    del logq
    K = draft.shape[0]
    p = jnp.exp(logp)
    entropy = -jnp.sum(jnp.where(p > 0, p * logp, 0.0), -1)[:K]
    threshold = jnp.minimum(self.epsilon, self.delta * jnp.exp(-entropy))
    p_draft = jnp.take_along_axis(p[:K], draft[:, None], 1)[:, 0]
    n = _first_false(p_draft > threshold, n_drafted)
    return n, sample_from_logprobs(key, logp[n])


RULES = {
  "greedy": GreedyRule,
  "speculative": SpeculativeSamplingRule,
  "typical": TypicalAcceptanceRule,
}
