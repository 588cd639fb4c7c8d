"""A small draft LM that shares the target's embedding and scores a reduced draft vocabulary.

The draft is a few Llama decoder layers reading the target's own token embedding (not a copy: the
same array is passed in at load time), with its own final norm and an LM head over Vd draft tokens
mapped to target ids by `d2t` (`specjax.drafters.draft_vocab`). Drafting is `DraftModelDrafter`'s
(`draft_model.draft_chain`, with the d2t map): the draft cache holds seq[:c] with c in
{seq_len - 2, seq_len - 1} at each propose and the first step feeds the two-token window
seq[c : c + 2].
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax.config import ModelConfig
from specjax.drafters.base import LazyDrafterDefaults, Proposal, StepResult
from specjax.drafters.draft_model import catch_up_cache, commit_chain, draft_chain
from specjax.drafters.draft_vocab import scatter_logq
from specjax.drafters.registry import DrafterKind, layer_params, register
from specjax.kv_cache import KVCache, init_cache
from specjax.model import LayerParams, Params, forward
from specjax.sampling import SamplingConfig


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DraftLMParams:
  """Weights of a draft LM (shapes omit the stacked layer axis of `layers`).

  Attributes:
    embed: [V, D] the target's token embedding (frozen, shared).
    layers: the draft's decoder layers, stacked [L, ...].
    final_norm: [D].
    lm_head: [Vd, D] scores of the draft vocabulary.
    d2t: [Vd] int32 target id of each draft token.
  """

  embed: jax.Array
  layers: LayerParams
  final_norm: jax.Array
  lm_head: jax.Array
  d2t: jax.Array

  def as_model(self) -> Params:
    """A `Params` whose forward pass returns draft-vocabulary logits [.., Vd]."""
    return Params(self.embed, self.layers, self.final_norm, self.lm_head)


@dataclasses.dataclass(frozen=True)
class DraftLMDrafter(LazyDrafterDefaults):
  """Autoregressive drafting with a reduced-vocabulary draft LM.

  Attributes:
    cfg: the draft's config (vocab_size is the target's V; n_layers the draft's).
    k: draft length K.
  """

  cfg: ModelConfig
  k: int = 4
  hidden_layers: tuple[int, ...] = ()

  def capacity_slack(self) -> int:
    return 1  # the junk slot of the two-token catch-up window

  def init(self, params: DraftLMParams, prefill, prompts, prompt_lens, capacity: int) -> KVCache:
    del prefill
    cache = init_cache(self.cfg, prompts.shape[0], capacity)
    first = jnp.zeros((prompts.shape[0], 1), jnp.int32)
    out = forward(params.as_model(), prompts, cache, self.cfg, logit_positions=first)
    return out.cache.with_lengths(prompt_lens)

  def propose(
    self, params: DraftLMParams, cache: KVCache, seq, seq_len, key, sampling: SamplingConfig
  ) -> Proposal:
    model, d2t = params.as_model(), params.d2t
    tokens, logq_d, cache = draft_chain(model, self.cfg, cache, seq, seq_len, key, sampling,
                                        self.k, d2t)  # fmt: skip
    logq = None if sampling.greedy else scatter_logq(logq_d, d2t, self.cfg.vocab_size)
    return Proposal(tokens, logq, jnp.full((seq.shape[0],), self.k, jnp.int32), cache)

  def catch_up(self, params: DraftLMParams, cache: KVCache, seq, seq_len, width: int) -> KVCache:
    """The cache after the adaptive loop's AR steps, caught up (`catch_up_cache`)."""
    return catch_up_cache(params.as_model(), self.cfg, cache, seq, seq_len, width)

  def commit(self, params, cache: KVCache, seq, seq_len, step: StepResult) -> KVCache:
    return commit_chain(cache, step, self.k)


def params_from_tensors(t, d2t, out_matrix, target_params) -> DraftLMParams:
  head = t["lm_head"] if "lm_head" in t else out_matrix[d2t]
  return DraftLMParams(target_params.embed, layer_params(t, "layers"), t["final_norm"], head, d2t)


register(
  DrafterKind(
    "draft_lm",
    params=params_from_tensors,
    chain=lambda shipped, k: DraftLMDrafter(shipped.head_cfg, k),
    objective="train.objectives.draft_lm:make",
  )
)
