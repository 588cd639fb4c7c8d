"""Parallel drafting: a whole block of K draft tokens from one drafting step.

A parallel drafter (PARD's draft LM, P-EAGLE's head) extends a sequential drafter that stays
frozen. Each propose feeds the inputs the drafter has not yet seen (a window of W slots of which
n_valid per row are real) through the sequential drafter, which gives draft 1 at the last real
input, then the K - 1 learned mask inputs through the drafter's own mask layer(s) at the next
slots, attending to the keys and values the window left in the cache; draft j + 1 is read at mask
j. The masks sit right after each row's last real input, so positions stay contiguous and the
ordinary causal mask is exactly the training mask (`train.streams`): mask j (depth j + 1) sees
the real context and masks 1..j. Each depth has its own learned mask input.

    slot:   .. c - 1 | c .. c + n_valid - 1      | c + n_valid .. c + n_valid + K - 2
    pass:   cached   | window (drafter, frozen)  | masks of depths 2 .. K (mask layers)
    output:          | draft 1 at the last slot  | draft j + 1 at mask j

The window covers W slots from the drafter's cache length and the masks K - 1 more after the valid
ones, so a parallel drafter asks the loops for K more cache slots than its window needs
(`capacity_slack`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.drafters.base import Proposal
from specjax.drafters.draft_vocab import draw, scatter_logq


def mask_rows(mask_params: jax.Array, k: int) -> jax.Array:
  """The first K - 1 rows of a parallel drafter's per-depth mask parameters [K_max - 1, ...].

  Raises:
    ValueError: for a block larger than the drafter was trained for.
  """
  if k - 1 > mask_params.shape[0]:
    raise ValueError(
      f"block size {k} exceeds the {mask_params.shape[0] + 1} depths this drafter was trained for"
    )
  return mask_params[: k - 1]


class BlockProposals:
  """A parallel drafter's chain `propose`: the K tokens of one `block_logits` pass, drawn from
  the processed draft distributions (the drafter defines `cfg`, `k` and `block_logits(params,
  state, seq, seq_len) -> (logits [B, K, Vd], d2t, state)`)."""

  def propose(self, params, state, seq, seq_len, key, sampling) -> Proposal:
    logits, d2t, state = self.block_logits(params, state, seq, seq_len)
    tokens, logq_d = draw(key, logits, d2t, sampling)
    logq = None if sampling.greedy else scatter_logq(logq_d, d2t, self.cfg.vocab_size)
    return Proposal(tokens, logq, jnp.full((seq.shape[0],), self.k, jnp.int32), state)
