"""Prompt lookup (n-gram) drafting: copy the continuation of an earlier occurrence of the suffix.

No model and no distribution: the proposal is deterministic, so acceptance rules treat it as a point
mass (q = 1 on each drafted token), which keeps speculative sampling exact at temperature > 0.
The search is vectorised on device over every start position of the prompt and generated text.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from specjax.drafters.base import DrafterDefaults, Proposal, StepResult
from specjax.kv_cache import read_rows
from specjax.sampling import SamplingConfig


def find_continuation(seq: jax.Array, seq_len: jax.Array, n: int, k: int):
  """For one row: the best earlier match of the last n tokens and how much continuation it offers.

  Args:
    seq: [S] tokens of one row.
    seq_len: scalar, valid tokens.
    n: n-gram length (static).
    k: tokens wanted (static).

  Returns:
    (found, start, avail): start of the continuation (j + n for match position j) and the number of
    valid continuation tokens min(k, seq_len - start). Among matches the one offering the most
    continuation wins, ties broken by the latest.
  """
  S = seq.shape[0]
  suffix = jax.lax.dynamic_slice(seq, (jnp.maximum(seq_len - n, 0),), (n,))
  starts = jnp.arange(S - n + 1)
  windows = jnp.stack([seq[i : S - n + 1 + i] for i in range(n)], -1)  # [S - n + 1, n]
  match = jnp.all(windows == suffix[None, :], -1) & (starts + n <= seq_len - 1) & (seq_len > n)
  avail = jnp.minimum(k, seq_len - (starts + n))
  score = jnp.where(match, avail * S + starts, -1)
  best = jnp.argmax(score)
  return score[best] >= 0, best + n, jnp.where(score[best] >= 0, avail[best], 0)


@dataclasses.dataclass(frozen=True)
class PromptLookupDrafter(DrafterDefaults):
  """Proposes up to k tokens by matching n-grams (n from max_ngram down to min_ngram).

  Attributes:
    k: draft length K.
    max_ngram: longest suffix tried first.
    min_ngram: shortest suffix tried.
  """

  k: int = 4
  max_ngram: int = 3
  min_ngram: int = 1
  hidden_layers: ClassVar[tuple[int, ...]] = ()  # reads no target layers

  def __post_init__(self):
    if not 1 <= self.min_ngram <= self.max_ngram:
      raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {self.min_ngram}, {self.max_ngram}")
    if self.k < 1:
      raise ValueError(f"k must be >= 1, got {self.k}")

  def capacity_slack(self) -> int:
    return 0

  def init(self, params, prefill, prompts, prompt_lens, capacity: int):
    del params, prefill, prompts, prompt_lens, capacity
    return ()

  def propose(self, params, state, seq, seq_len, key, sampling: SamplingConfig) -> Proposal:
    del params, key, sampling

    def one_row(row, length):
      found, start, avail = jnp.array(False), jnp.int32(0), jnp.int32(0)
      for n in range(self.min_ngram, self.max_ngram + 1):  # longer n-grams override shorter ones
        f, s, a = find_continuation(row, length, n, self.k)
        found, start, avail = f | found, jnp.where(f, s, start), jnp.where(f, a, avail)
      return start, avail

    start, avail = jax.vmap(one_row)(seq, seq_len)
    tokens = read_rows(seq, jnp.minimum(start, seq.shape[1] - self.k), self.k)
    return Proposal(tokens.astype(jnp.int32), None, avail.astype(jnp.int32), state)

  def commit(self, params, state, seq, seq_len, step: StepResult):
    return state
