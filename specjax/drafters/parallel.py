"""Parallel drafting: a whole block of K draft tokens from one pass of the drafter.

A parallel drafter (PARD's draft LM, P-EAGLE's head) feeds the inputs it has not yet seen (a window
of W slots of which n_valid per row are real) followed by K - 1 learned mask inputs, and reads the
K draft distributions at the last real input and at the masks (`with_masks` builds PARD's single
pass; P-EAGLE feeds its masks through their own layer as a second pass at the same slots). The masks are placed right after
each row's last real input, so positions stay contiguous and the ordinary causal mask is exactly
the training mask (`train.streams`): mask j (depth j + 1) sees the real context and masks 1..j.
Each depth has its own learned mask input, so a query knows its depth without inferring it from
positions.

    slot:   0 .. n_valid - 1 | n_valid .. n_valid + K - 2 | rest
    input:  real inputs      | masks of depths 2 .. K     | junk nothing reads
    output: draft 1 at n_valid - 1, draft j + 1 at mask j

The pass covers W + K - 1 slots from the drafter's cache length, so a parallel drafter asks the
loops for K more cache slots than its window needs (`capacity_slack`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.drafters.base import Proposal
from specjax.drafters.draft_vocab import draw, scatter_logq


def with_masks(window: jax.Array, n_valid: jax.Array, masks: jax.Array) -> jax.Array:
  """[B, W + K - 1, D]: each row's first n_valid window inputs, then its K - 1 mask inputs.

  Args:
    window: [B, W, D] inputs; slots at or past n_valid[b] are junk.
    n_valid: [B] real inputs per row (<= W).
    masks: [B, K - 1, D] or [K - 1, D] the mask inputs of depths 2..K.
  """
  B, W, D = window.shape
  masks = jnp.broadcast_to(masks.astype(window.dtype), (B,) + masks.shape[-2:])
  n_masks = masks.shape[1]
  slot = jnp.arange(W + n_masks)[None, :]
  src = jnp.where(
    slot < n_valid[:, None], slot, W + jnp.clip(slot - n_valid[:, None], 0, n_masks - 1)
  )
  both = jnp.concatenate([window, masks], 1)
  return jnp.take_along_axis(both, src[..., None], 1)


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
