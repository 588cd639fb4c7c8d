"""PARD-style parallel draft LM (An et al. 2025, "PARD: Accelerating LLM Inference with Low-Cost
PARallel Draft Model Adaptation"): a small draft LM that proposes K tokens in one forward pass.

The draft is `specjax.drafters.draft_lm`'s (a few Llama layers on the target's embedding, a reduced
draft vocabulary) plus a learned mask embedding per depth. Each propose feeds the tokens the draft has not
seen (at most K + 1: everything the last step committed) followed by K - 1 mask inputs
(`specjax.drafters.parallel`); draft token 1 is read at the last real token, token j + 1 at mask j.
The draft never feeds its own guesses, so its cache only ever holds committed tokens: after a
propose it holds seq[:seq_len], and `commit` has nothing to roll back. Trained by `train.objectives.
PardObjective` (mask-token objective over K depths, `train.streams`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax.config import ModelConfig
from specjax.drafters.base import LazyDrafterDefaults, StepResult
from specjax.drafters.draft_lm import DraftLMDrafter, DraftLMParams, params_from_tensors
from specjax.drafters.draft_model import catch_up_cache
from specjax.drafters.parallel import BlockProposals, mask_rows, with_masks
from specjax.drafters.registry import DrafterKind, register
from specjax.drafters.tree_heads import block_tree
from specjax.kv_cache import KVCache, read_rows
from specjax.model import forward


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PardParams:
  """lm: the draft LM's weights; mask_embed: [K_max - 1, D] the input of the mask of each depth
  2..K_max (a block of K <= K_max uses the first K - 1)."""

  lm: DraftLMParams
  mask_embed: jax.Array


@dataclasses.dataclass(frozen=True)
class PardDrafter(BlockProposals, LazyDrafterDefaults):
  """Block drafting with a PARD draft LM: K tokens per propose, one draft forward pass.

  Attributes:
    cfg: the draft's config (vocab_size is the target's V; n_layers the draft's).
    k: block size K.
  """

  cfg: ModelConfig
  k: int = 8
  hidden_layers: tuple[int, ...] = ()

  def capacity_slack(self) -> int:
    return self.k  # a pass covers K + 1 window slots and K - 1 masks from the cache length

  def block_logits(self, params: PardParams, cache: KVCache, seq, seq_len):
    """(logits [B, K, Vd], d2t, cache holding seq[:seq_len])."""
    model = params.lm.as_model()
    c = cache.lengths
    n_valid = seq_len - c  # 1 .. K + 1 unseen tokens (0 for a finished row)
    window = params.lm.embed[read_rows(seq, c, self.k + 1)]
    x = with_masks(window, n_valid, mask_rows(params.mask_embed, self.k))
    tokens = jnp.zeros(x.shape[:2], jnp.int32)  # shape only: `embeds` are the inputs
    at = jnp.maximum(n_valid, 1)[:, None] - 1 + jnp.arange(self.k)[None, :]
    out = forward(model, tokens, cache, self.cfg, logit_positions=at, embeds=x)
    return out.logits, params.lm.d2t, out.cache.with_lengths(seq_len)

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
      params_from_tensors(t, d2t, out_matrix, target_params), t["mask_embed"]
    ),
    chain=lambda shipped, k: PardDrafter(shipped.head_cfg, k),
    tree=lambda shipped, t, vocab_size: block_tree(
      PardDrafter(shipped.head_cfg, t.depth), t, vocab_size
    ),
    objective="train.pipeline:pard_objective",
  )
)
