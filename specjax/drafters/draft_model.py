"""A separate small draft model (Leviathan et al. 2023; Chen et al. 2023).

Any Llama-family model sharing the target's vocabulary, with its own per-row cache. Invariant at
each propose: the draft cache holds seq[:c] with c in {seq_len - 2, seq_len - 1}; the first draft
step feeds the two-token window seq[c : c + 2] (the second slot is junk when c = seq_len - 1 and is
overwritten later), so no step is wasted re-feeding the last accepted draft after a full accept.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from specjax.config import ModelConfig
from specjax.drafters.base import LazyDrafterDefaults, Proposal, StepResult
from specjax.kv_cache import KVCache, init_cache, read_rows
from specjax.model import forward
from specjax.sampling import SamplingConfig


class VocabularyMismatchError(ValueError):
  """Draft and target do not share a vocabulary."""


def check_same_vocabulary(
  target_cfg: ModelConfig, draft_cfg: ModelConfig, target_tok=None, draft_tok=None
):
  """Raises `VocabularyMismatchError` unless the two models can exchange token ids."""
  if target_cfg.vocab_size != draft_cfg.vocab_size:
    raise VocabularyMismatchError(
      f"draft vocabulary has {draft_cfg.vocab_size} tokens but the target's has "
      f"{target_cfg.vocab_size}; a draft model must share the target's tokenizer"
    )
  if target_tok is not None and draft_tok is not None:
    if target_tok.backend.get_vocab() != draft_tok.backend.get_vocab():
      raise VocabularyMismatchError("draft and target tokenizers map tokens to different ids")


@dataclasses.dataclass(frozen=True)
class DraftModelDrafter(LazyDrafterDefaults):
  """Autoregressive drafting with a small LM.

  Attributes:
    cfg: the draft model's config.
    k: draft length K.
  """

  cfg: ModelConfig
  k: int = 4
  hidden_layers: ClassVar[tuple[int, ...]] = ()  # reads no target layers

  def capacity_slack(self) -> int:
    return 1  # the junk slot of the two-token catch-up window

  def init(self, params, prefill, prompts, prompt_lens, capacity: int) -> KVCache:
    """Prefills the draft cache with the prompts (everything but the target's first token)."""
    del prefill
    cache = init_cache(self.cfg, prompts.shape[0], capacity)
    first = jnp.zeros((prompts.shape[0], 1), jnp.int32)
    out = forward(params, prompts, cache, self.cfg, logit_positions=first)
    return out.cache.with_lengths(prompt_lens)

  def propose(
    self, params, cache: KVCache, seq, seq_len, key, sampling: SamplingConfig
  ) -> Proposal:
    tokens, logq, cache = draft_chain(params, self.cfg, cache, seq, seq_len, key, sampling, self.k)
    return Proposal(tokens, logq, jnp.full((seq.shape[0],), self.k, jnp.int32), cache)

  def catch_up(self, params, cache: KVCache, seq, seq_len, width: int) -> KVCache:
    """The cache after the adaptive loop's AR steps, caught up (`catch_up_cache`)."""
    return catch_up_cache(params, self.cfg, cache, seq, seq_len, width)

  def commit(self, params, cache: KVCache, seq, seq_len, step: StepResult) -> KVCache:
    return commit_chain(cache, step, self.k)


def draft_chain(model, cfg: ModelConfig, cache: KVCache, seq, seq_len, key, sampling, k: int,
                d2t=None):  # fmt: skip
  """K autoregressive drafts from a draft LM whose cache holds seq[:c], c in {seq_len - 2,
  seq_len - 1} (the module docstring's invariant).

  Args:
    model: the draft's `Params`; its logits are over the target's vocabulary, or over a draft
      vocabulary whose ids d2t maps to the target's (`specjax.drafters.draft_vocab`).

  Returns:
    (tokens [B, K] target ids, logq [B, K, V'] the processed draft distributions over the
    model's vocabulary, the cache holding d_1..d_{K-1} past seq_len).
  """
  to_target = (lambda i: i) if d2t is None else (lambda i: d2t[i].astype(jnp.int32))
  keys = jax.random.split(key, k)
  c = cache.lengths
  window = read_rows(seq, c, 2)  # [B, 2]
  out = forward(model, window, cache, cfg, logit_positions=(seq_len - 1 - c)[:, None])
  logq0 = sampling.logprobs(out.logits[:, 0])
  tok0 = to_target(sampling.draw(keys[0], logq0))
  cache = out.cache.with_lengths(seq_len)

  def step(carry, key):
    cache, tok = carry
    out = forward(model, tok[:, None], cache, cfg)
    logq = sampling.logprobs(out.logits[:, 0])
    nxt = to_target(sampling.draw(key, logq))
    return (out.cache, nxt), (nxt, logq)

  (cache, _), (toks, logqs) = jax.lax.scan(step, (cache, tok0), keys[1:])
  tokens = jnp.concatenate([tok0[:, None], jnp.moveaxis(toks, 0, 1)], 1)
  logq = jnp.concatenate([logq0[:, None], jnp.moveaxis(logqs, 0, 1)], 1)
  return tokens, logq, cache


def commit_chain(cache: KVCache, step: StepResult, k: int) -> KVCache:
  """A chain draft's cache after verification: everything before the drafts plus the accepted
  drafts d_1..d_{K-1} (d_K was drawn but never fed); finished rows (n_committed = 0) keep
  seq_len - 1."""
  return cache.with_lengths(step.prev_seq_len + jnp.minimum(step.n_committed - 1, k - 1))


def catch_up_cache(params, cfg: ModelConfig, cache: KVCache, seq, seq_len, width: int) -> KVCache:
  """Feeds a draft cache seq[c : seq_len - 1] in windows of `width` tokens until every row has
  c >= seq_len - 2 again (the AR steps of the adaptive loop, `specjax.adaptive`, do not feed the
  draft). Rows already there rewrite their own tokens and keep c; slots past a row's length get
  junk, as with the two-token window. The caller guarantees c + width <= capacity."""
  first = jnp.zeros((seq.shape[0], 1), jnp.int32)

  def feed(cache: KVCache) -> KVCache:
    c = cache.lengths
    out = forward(params, read_rows(seq, c, width), cache, cfg, logit_positions=first)
    return out.cache.with_lengths(
      jnp.where(c < seq_len - 2, jnp.minimum(c + width, seq_len - 1), c)
    )

  return jax.lax.while_loop(lambda cache: jnp.any(cache.lengths < seq_len - 2), feed, cache)
