"""PARD-style parallel draft LM (An et al. 2025, "PARD: Accelerating LLM Inference with Low-Cost
PARallel Draft Model Adaptation"): a small draft LM that proposes K tokens in one drafting step.

The draft is `specjax.drafters.draft_lm`'s (a few Llama layers on the target's embedding, a reduced
draft vocabulary), frozen, plus mask layers (a copy of its layers, trained) and a learned mask
embedding per depth. Each propose feeds the tokens the draft has not seen (at most K + 1:
everything the last step committed) through the draft LM, which gives draft token 1 at the last
of them, then the K - 1 mask embeddings through the mask layers at the next slots, attending to
the draft LM's keys and values (`specjax.drafters.parallel`): token j + 1 is read at mask j. PARD
trains one set of layers for every depth; keeping the draft LM frozen keeps draft token 1 exactly
the draft LM's (sharing the layers pulled the draft's own next-token agreement down in training
here, as it did for P-EAGLE). The draft never feeds its own guesses, so its cache only ever holds
committed tokens: after a propose it holds seq[:seq_len], and `commit` has nothing to roll back.
Trained by `train.objectives.pard.PardObjective` (the mask-token objective over K depths,
`train.streams`); a shipped PARD holds only its mask layers and embeddings and names the draft LM
it extends (`base`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax.config import ModelConfig
from specjax.drafters.base import LazyDrafterDefaults, StepResult
from specjax.drafters.draft_lm import DraftLMDrafter, DraftLMParams, params_from_tensors
from specjax.drafters.draft_model import catch_up_cache
from specjax.drafters.parallel import BlockProposals, mask_rows
from specjax.drafters.registry import DrafterKind, layer_params, register
from specjax.drafters.tree_heads import block_tree
from specjax.kv_cache import KVCache, read_rows
from specjax.model import LayerParams, Params, forward


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PardParams:
  """Weights of a PARD draft.

  Attributes:
    lm: the (frozen) draft LM: depth 1, the final norm and the draft-vocabulary head.
    mask_layers: the decoder layers the masks go through (stacked [L, ...] like lm.layers).
    mask_embed: [K_max - 1, D] the input of the mask of each depth 2..K_max (a block of
      K <= K_max uses the first K - 1).
  """

  lm: DraftLMParams
  mask_layers: LayerParams
  mask_embed: jax.Array

  def mask_model(self) -> Params:
    """The mask path as a `Params` (the draft LM's norm and head over the mask layers)."""
    return dataclasses.replace(self.lm.as_model(), layers=self.mask_layers)


@dataclasses.dataclass(frozen=True)
class PardDrafter(BlockProposals, LazyDrafterDefaults):
  """Block drafting with a PARD draft LM: K tokens per propose from two short draft passes.

  Attributes:
    cfg: the draft's config (vocab_size is the target's V; n_layers the draft's).
    k: block size K.
  """

  cfg: ModelConfig
  k: int = 8
  hidden_layers: tuple[int, ...] = ()

  def capacity_slack(self) -> int:
    return self.k  # K + 1 window slots from the cache length, then K - 1 masks after the valid ones

  def block_logits(self, params: PardParams, cache: KVCache, seq, seq_len):
    """(logits [B, K, Vd], d2t, cache holding seq[:seq_len])."""
    c = cache.lengths
    n_valid = seq_len - c  # 1 .. K + 1 unseen tokens (0 for a finished row)
    window = read_rows(seq, c, self.k + 1)
    last = jnp.maximum(n_valid, 1)[:, None] - 1
    out = forward(params.lm.as_model(), window, cache, self.cfg, logit_positions=last)
    cache = out.cache.with_lengths(seq_len)
    logits = out.logits  # [B, 1, Vd]: depth 1
    if self.k > 1:  # the masks at slots seq_len .., over that context
      rows = mask_rows(params.mask_embed, self.k)
      masks = jnp.broadcast_to(rows, (seq.shape[0],) + rows.shape)
      tokens = jnp.zeros(masks.shape[:2], jnp.int32)  # shape only: `embeds` are the inputs
      rest = forward(params.mask_model(), tokens, cache, self.cfg, embeds=masks).logits
      logits = jnp.concatenate([logits, rest], 1)
    return logits, params.lm.d2t, cache

  def init(self, params: PardParams, prefill, prompts, prompt_lens, capacity: int) -> KVCache:
    """The draft LM's cache holding the prompts (`DraftLMDrafter.init`)."""
    return DraftLMDrafter(self.cfg, self.k).init(params.lm, prefill, prompts, prompt_lens, capacity)

  def catch_up(self, params: PardParams, cache: KVCache, seq, seq_len, width: int) -> KVCache:
    """After the adaptive loop's AR steps: fed until at most two tokens are unseen."""
    return catch_up_cache(params.lm.as_model(), self.cfg, cache, seq, seq_len, width)

  def commit(self, params, cache: KVCache, seq, seq_len, step: StepResult) -> KVCache:
    del params, seq, seq_len
    return cache.with_lengths(step.prev_seq_len)  # drafts were never fed


register(
  DrafterKind(
    "pard",
    params=lambda t, d2t, out_matrix, target_params: PardParams(
      params_from_tensors(t, d2t, out_matrix, target_params),
      layer_params(t, "mask_layers"),
      t["mask_embed"],
    ),
    chain=lambda shipped, k: PardDrafter(shipped.head_cfg, k),
    tree=block_tree,
    objective="train.objectives.pard:make",
  )
)
