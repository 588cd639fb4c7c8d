"""Per-row speculative decoding counters and the statistics derived from them.

Definitions (Spec-Bench / vLLM conventions):
  target_passes   verify forward passes of the target after prefill.
  drafted         draft tokens proposed (vLLM `num_draft_tokens`).
  accepted        draft tokens accepted by the rule *and committed* (vLLM `num_accepted_tokens`):
                  a draft the rule accepted but a stop token or the length budget then cut off is
                  not counted, so accepted <= emitted and emitted - accepted is the number of
                  passes that also committed a correction or bonus token (every pass but a cut
                  last one).
  emitted         tokens appended by the decode loop, i.e. accepted drafts plus one correction or
                  bonus token per pass, after stop/budget truncation. The prefill's first token is
                  not counted (it costs no verify pass).
  tau             emitted / target_passes: Spec-Bench's "mean accepted tokens" per target pass,
                  including the bonus token (AR decoding has tau = 1).
  acceptance rate accepted / drafted (vLLM's draft acceptance rate).
  accepted_at[i]  passes in which draft position i (0-based) was accepted; accepted_at / target_passes
                  is vLLM's per-position acceptance rate.
  reached_at[i]   passes in which position i was proposed, every earlier position accepted and
                  committed, and the pass committed a token at position i (a position past a stop
                  token or the budget is not reached); accepted_at / reached_at is the conditional
                  rate alpha_i that EAGLE reports.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SpecMetrics:
  """Counters per row: [B] each, and [B, K] for the per-position ones."""

  target_passes: jax.Array
  drafted: jax.Array
  accepted: jax.Array
  emitted: jax.Array
  accepted_at: jax.Array
  reached_at: jax.Array

  @classmethod
  def zeros(cls, batch: int, k: int) -> "SpecMetrics":
    z = jnp.zeros((batch,), jnp.int32)
    zk = jnp.zeros((batch, k), jnp.int32)
    return cls(z, z, z, z, zk, zk)

  def update(self, live, n_drafted, n_accepted, n_committed) -> "SpecMetrics":
    """Adds one verify pass for the live rows.

    Args:
      live: [B] rows that ran this pass.
      n_drafted: [B] drafts proposed.
      n_accepted: [B] drafts the rule accepted.
      n_committed: [B] tokens appended (<= n_accepted + 1; fewer when a stop or the budget cuts).
    """
    k = self.accepted_at.shape[1]
    pos = jnp.arange(k)[None, :]
    live_i = live.astype(jnp.int32)
    kept = jnp.minimum(n_accepted, n_committed)  # accepted drafts that were committed
    acc_at = (pos < kept[:, None]) & live[:, None]
    reached = (pos < n_committed[:, None]) & (pos < n_drafted[:, None]) & live[:, None]
    return SpecMetrics(
      self.target_passes + live_i,
      self.drafted + n_drafted * live_i,
      self.accepted + kept * live_i,
      self.emitted + n_committed,
      self.accepted_at + acc_at,
      self.reached_at + reached,
    )


def summarize(m: SpecMetrics) -> dict:
  """Batch totals and derived rates as plain Python numbers (host side, after the loop)."""
  g = jax.tree.map(lambda x: np.asarray(x).sum(0), m)
  passes = max(int(g.target_passes), 1)
  return {
    "target_passes": int(g.target_passes),
    "drafted": int(g.drafted),
    "accepted": int(g.accepted),
    "emitted": int(g.emitted),
    "tau": float(g.emitted) / passes,
    "acceptance_rate": float(g.accepted) / max(int(g.drafted), 1),
    "accept_per_pass_at": (g.accepted_at / passes).tolist(),
    "alpha_at": (g.accepted_at / np.maximum(g.reached_at, 1)).tolist(),
  }
