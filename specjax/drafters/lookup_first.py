"""Copy first, a trained drafter otherwise: a model-free copier's continuation where the row's
recent tokens occurred before, the trained drafter's chain everywhere else.

Copying and the trained heads are right in different places: a copy of the context (a summary
quoting its article, a translation carrying names and numbers over, an answer repeating the
question's terms, a second answer to a task already answered) is drafted exactly by a match and
poorly by a small head, while free prose has no match to copy. Each step, per row, the draft is the
copier's when it drafts anything, else the trained drafter's K tokens. Two copiers:
  * prompt lookup (the default): the continuation of the longest earlier match of the row's last n
    tokens, n from max_ngram down to min_ngram (`PromptLookupDrafter`);
  * suffix decoding's chain (`SuffixDrafter`, its `min_match` playing min_ngram's part): the most
    frequent continuation of the longest matched suffix in the row and in the outputs of earlier
    requests (its global cache, rebuilt between calls by `with_outputs`).

The trained drafter proposes whenever some row of the batch needs its draft, so its state is the
same as if it had drafted alone: a drafter's `commit` reads only the verified tokens and the
target's features of them, never which tokens were proposed. When every row copies (at batch 1,
every copying step) it only keeps current (`sit_out`: EAGLE feeds its pending window in one head
pass instead of drafting K tokens; drafters without a cheaper way propose and discard).

Which draft a row gets is a function of its context (and the copier's fixed cache) alone, so each
row's draft comes from one well-defined proposal q: a point mass for copied tokens, the drafter's
distribution otherwise. The lossless rules stay exact.

Params: `CopyFirstParams` (the copier's, () for prompt lookup, and the trained drafter's).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from specjax.branching import run_one_of
from specjax.drafters.base import Proposal, StepResult
from specjax.drafters.prompt_lookup import PromptLookupDrafter
from specjax.drafters.suffix import SuffixDrafter
from specjax.sampling import SamplingConfig


def point_mass_logq(tokens: jax.Array, vocab_size: int) -> jax.Array:
  """log q of deterministic drafts [..., K]: 0 at each drafted token, -inf elsewhere [..., K, V]."""
  return jnp.where(jax.nn.one_hot(tokens, vocab_size, dtype=jnp.bool_), 0.0, -jnp.inf)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class CopyFirstParams:
  """Draft parameters of `LookupFirstDrafter`.

  Attributes:
    copier: the copier's: () for prompt lookup, a `specjax.drafters.suffix.SuffixCache` (or ())
      for suffix decoding.
    model: the trained drafter's.
  """

  copier: Any
  model: Any


@dataclasses.dataclass(frozen=True)
class LookupFirstDrafter:
  """A copier's draft where it has one, `model` (a chain drafter) elsewhere, both at draft length k.

  Attributes:
    model: the trained chain drafter (EAGLE, Medusa, a draft model, ...); its own k is replaced.
    k: draft length K of both.
    max_ngram: longest suffix prompt lookup tries first.
    min_ngram: shortest suffix that counts as a match (1 would copy after any repeated token).
    suffix: None to copy with prompt lookup (max_ngram, min_ngram); a `SuffixDrafter` to copy with
      suffix decoding's chain instead (its own max_match and min_match; its k is replaced).
  """

  model: Any
  k: int = 2
  max_ngram: int = 3
  min_ngram: int = 2
  suffix: SuffixDrafter | None = None

  def __post_init__(self):
    if self.suffix is not None and not isinstance(self.suffix, SuffixDrafter):
      raise TypeError(f"suffix must be a SuffixDrafter (the chain form), got {self.suffix!r}")
    self.copier()  # validates k and the match settings
    if not hasattr(self.model, "k") or not callable(getattr(self.model, "propose", None)):
      raise TypeError(f"model must be a chain drafter (with k and propose), got {self.model!r}")

  def copier(self) -> PromptLookupDrafter | SuffixDrafter:
    if self.suffix is None:
      return PromptLookupDrafter(self.k, self.max_ngram, self.min_ngram)
    return dataclasses.replace(self.suffix, k=self.k)

  def params(self, model_params: Any, outputs: Sequence[Sequence[int]] = ()) -> CopyFirstParams:
    """The draft parameters: the trained drafter's, and the copier's built from earlier outputs."""
    copier = () if self.suffix is None else self.suffix.cache_from_outputs(outputs)
    return CopyFirstParams(copier, model_params)

  def with_outputs(self, params: CopyFirstParams, outputs: Sequence[Sequence[int]]):
    """`DraftsFromOutputs`: the copier's part rebuilt (suffix decoding's global cache)."""
    return self.params(params.model, outputs)

  def trained(self) -> Any:
    return dataclasses.replace(self.model, k=self.k)

  @property
  def hidden_layers(self) -> tuple[int, ...]:
    return tuple(self.model.hidden_layers)

  def capacity_slack(self) -> int:
    return max(self.copier().capacity_slack(), self.trained().capacity_slack())

  def init(self, params: CopyFirstParams, prefill, prompts, prompt_lens, capacity: int):
    return self.trained().init(params.model, prefill, prompts, prompt_lens, capacity)

  def propose(
    self, params: CopyFirstParams, state, seq, seq_len, key, sampling: SamplingConfig
  ) -> Proposal:
    copied = self.copier().propose(params.copier, (), seq, seq_len, key, sampling)
    use = copied.n_drafted > 0  # [B]: the copier matched (prompt lookup: >= min_ngram tokens)
    model, mp = self.trained(), params.model

    def draft(p: Proposal) -> Proposal:
      return model.propose(mp, p.state, seq, seq_len, key, sampling)

    def sit_out(p: Proposal) -> Proposal:  # every row copies: the model only keeps current
      return dataclasses.replace(p, state=model.sit_out(mp, p.state, seq, seq_len, key, sampling))

    shape = jax.eval_shape(lambda: model.propose(mp, state, seq, seq_len, key, sampling))
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

  def commit(self, params: CopyFirstParams, state, seq, seq_len, step: StepResult):
    return self.trained().commit(params.model, state, seq, seq_len, step)

  def catch_up(self, params: CopyFirstParams, state, seq, seq_len, width: int):
    return self.trained().catch_up(params.model, state, seq, seq_len, width)

  def observe(self, params, state, seq, seq_len, new_seq, new_seq_len, step, key, sampling):
    return self.trained().observe(
      params.model, state, seq, seq_len, new_seq, new_seq_len, step, key, sampling
    )
