"""Lookup first, a trained drafter otherwise: prompt lookup's continuation where the row's recent
tokens occurred before, the trained drafter's chain everywhere else.

Prompt lookup and the trained heads are right in different places: a copy of the context (a
summary quoting its article, a translation carrying names and numbers over, an answer repeating
the question's terms) is drafted exactly by an n-gram match and poorly by a small head, while free
prose has no match to copy. Each step, per row, the draft is the continuation of the longest
earlier match of the row's last n tokens (n from max_ngram down to min_ngram, as
`PromptLookupDrafter`) when there is one, else the trained drafter's K tokens.

The trained drafter proposes whenever some row of the batch needs its draft, so its state is the
same as if it had drafted alone: a drafter's `commit` reads only the verified tokens and the
target's features of them, never which tokens were proposed. When every row copies (at batch 1,
every copying step) it only keeps current (`sit_out`: EAGLE feeds its pending window in one head
pass instead of drafting K tokens; drafters without a cheaper way propose and discard).

Which draft a row gets is a function of its context alone, so each row's draft comes from one
well-defined proposal q: a point mass for copied tokens, the drafter's distribution otherwise. The
lossless rules stay exact.

Params are the trained drafter's; prompt lookup has none.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from specjax.branching import run_one_of
from specjax.drafters.base import Proposal, StepResult
from specjax.drafters.prompt_lookup import PromptLookupDrafter
from specjax.sampling import SamplingConfig


def point_mass_logq(tokens: jax.Array, vocab_size: int) -> jax.Array:
  """log q of deterministic drafts [..., K]: 0 at each drafted token, -inf elsewhere [..., K, V]."""
  return jnp.where(jax.nn.one_hot(tokens, vocab_size, dtype=jnp.bool_), 0.0, -jnp.inf)


@dataclasses.dataclass(frozen=True)
class LookupFirstDrafter:
  """Prompt lookup where it matches, `model` (a chain drafter) elsewhere, both at draft length k.

  Attributes:
    model: the trained chain drafter (EAGLE, Medusa, a draft model, ...); its own k is replaced.
    k: draft length K of both.
    max_ngram: longest suffix prompt lookup tries first.
    min_ngram: shortest suffix that counts as a match (1 would copy after any repeated token).
  """

  model: Any
  k: int = 2
  max_ngram: int = 3
  min_ngram: int = 2

  def __post_init__(self):
    self.lookup()  # validates k and the n-gram range
    if not hasattr(self.model, "k") or not callable(getattr(self.model, "propose", None)):
      raise TypeError(f"model must be a chain drafter (with k and propose), got {self.model!r}")

  def lookup(self) -> PromptLookupDrafter:
    return PromptLookupDrafter(self.k, self.max_ngram, self.min_ngram)

  def trained(self) -> Any:
    return dataclasses.replace(self.model, k=self.k)

  @property
  def hidden_layers(self) -> tuple[int, ...]:
    return tuple(self.model.hidden_layers)

  def capacity_slack(self) -> int:
    return max(self.lookup().capacity_slack(), self.trained().capacity_slack())

  def init(self, params, prefill, prompts, prompt_lens, capacity: int):
    return self.trained().init(params, prefill, prompts, prompt_lens, capacity)

  def propose(self, params, state, seq, seq_len, key, sampling: SamplingConfig) -> Proposal:
    copied = self.lookup().propose((), (), seq, seq_len, key, sampling)
    use = copied.n_drafted > 0  # [B]: a match of at least min_ngram tokens
    model = self.trained()

    def draft(p: Proposal) -> Proposal:
      return model.propose(params, p.state, seq, seq_len, key, sampling)

    def sit_out(p: Proposal) -> Proposal:  # every row copies: the model only keeps current
      return dataclasses.replace(
        p, state=model.sit_out(params, p.state, seq, seq_len, key, sampling)
      )

    shape = jax.eval_shape(lambda: model.propose(params, state, seq, seq_len, key, sampling))
    blank = jax.tree.map(
      lambda a: jnp.zeros(a.shape, a.dtype), dataclasses.replace(shape, state=())
    )
    start = dataclasses.replace(blank, state=state)
    drafted = run_one_of(jnp.all(use).astype(jnp.int32), (draft, sit_out), start)
    tokens = jnp.where(use[:, None], copied.tokens, drafted.tokens)
    n_drafted = jnp.where(use, copied.n_drafted, drafted.n_drafted)
    logq = drafted.logq
    if logq is not None:
      logq = jnp.where(use[:, None, None], point_mass_logq(copied.tokens, logq.shape[-1]), logq)
    return Proposal(tokens, logq, n_drafted.astype(jnp.int32), drafted.state)

  def commit(self, params, state, seq, seq_len, step: StepResult):
    return self.trained().commit(params, state, seq, seq_len, step)

  def catch_up(self, params, state, seq, seq_len, width: int):
    return self.trained().catch_up(params, state, seq, seq_len, width)

  def observe(self, params, state, seq, seq_len, new_seq, new_seq_len, step, key, sampling):
    return self.trained().observe(
      params, state, seq, seq_len, new_seq, new_seq_len, step, key, sampling
    )
