"""Parallel drafting: a whole block of K draft tokens from one pass of the drafter.

A parallel drafter (PARD's draft LM, P-EAGLE's head) feeds the inputs it has not yet seen (a window
of W slots of which n_valid per row are real) followed by K - 1 learned mask inputs, and reads the
K draft distributions at the last real input and at the masks. The masks are placed right after
each row's last real input, so positions stay contiguous and the ordinary causal mask is exactly
the training mask (`train.streams`): mask j (depth j + 1) sees the real context and masks 1..j.

    slot:   0 .. n_valid - 1 | n_valid .. n_valid + K - 2 | rest
    input:  real inputs      | mask input (K - 1 times)   | junk nothing reads
    output: draft 1 at n_valid - 1, draft j + 1 at mask j

The pass covers W + K - 1 slots from the drafter's cache length, so a parallel drafter asks the
loops for K more cache slots than its window needs (`capacity_slack`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def with_masks(window: jax.Array, n_valid: jax.Array, mask: jax.Array, k: int) -> jax.Array:
  """[B, W + K - 1, D]: each row's first n_valid window inputs, then the mask input.

  Args:
    window: [B, W, D] inputs; slots at or past n_valid[b] are junk.
    n_valid: [B] real inputs per row (<= W).
    mask: [D] the learned mask input.
    k: block size K.
  """
  B, W, D = window.shape
  T = W + k - 1
  padded = jnp.concatenate([window, jnp.zeros((B, k - 1, D), window.dtype)], 1)
  real = jnp.arange(T)[None, :] < n_valid[:, None]
  return jnp.where(real[..., None], padded, mask.astype(window.dtype)[None, None])


def block_outputs(out: jax.Array, n_valid: jax.Array, k: int) -> jax.Array:
  """[B, K, ...]: the outputs at slots n_valid - 1 .. n_valid + K - 2 of out [B, T, ...]."""
  idx = jnp.maximum(n_valid, 1)[:, None] - 1 + jnp.arange(k)[None, :]
  return jnp.take_along_axis(out, idx.reshape(idx.shape + (1,) * (out.ndim - 2)), 1)
