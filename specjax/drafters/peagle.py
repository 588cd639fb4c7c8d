"""P-EAGLE-style parallel EAGLE head: an EAGLE-3 head that drafts a whole block in one pass.

P-EAGLE (parallel-drafting EAGLE; followed here as NVIDIA NeMo AutoModel implements it in
`nemo_automodel/components/speculative/eagle/peagle_draft.py`) keeps the EAGLE-3 head and replaces
its K sequential steps by one pass: depths past the first get placeholder inputs in place of the
(unknown) token and feature, sit at position anchor + depth, and see the context and the
shallower placeholders only. P-EAGLE's placeholder is one learned hidden state shared by every
depth. Here the mask pair of depth j + 1 is (a learned embedding of that depth, the anchor's own
verified feature), fed through the head's W_in like a real (token, feature) pair, so every mask
query starts from the context's summary and knows its depth. (With a shared placeholder and a
shared mask embedding, warm-started from the EAGLE-3 head, depths 2..8 stayed at the same
held-out top-1 of 0.07, an unconditional guess, after 50 of the 300 steps this CPU affords.)

Drafting keeps `specjax.drafters.eagle`'s state and invariant: the pending verified features are
fed as a window of K + 1 pairs, followed by K - 1 mask pairs in the same pass
(`specjax.drafters.parallel`); draft 1 is read at the last real pair (position seq_len - 2, whose
feature is the anchor's), draft j + 1 at mask j. `commit` is EAGLE's (the cache rolls back to the
verified pairs). Trained by `train.objectives.PEagleObjective`, usually starting from a trained
EAGLE-3 head.

Why this and not DFlash: DFlash's drafter is a block-diffusion model that reads the target's
features as context in every layer and needs its own multi-layer architecture trained from
scratch; P-EAGLE reuses the EAGLE-3 head, its fused features and its trained weights, which on
this CPU (a few CPU-hours of training) is the difference between fine-tuning and pretraining.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax.config import ModelConfig
from specjax.drafters.base import DrafterDefaults, StepResult
from specjax.drafters.eagle import (
  EagleDrafter,
  EagleParams,
  EagleState,
  cached_layer,
  fused_layers,
  head_logits,
  layer_inputs,
  params_from_tensors,
)
from specjax.drafters.parallel import BlockProposals, block_outputs, mask_rows, with_masks
from specjax.drafters.registry import DrafterKind, register
from specjax.drafters.tree_heads import block_tree
from specjax.kernels import linear
from specjax.kv_cache import read_rows


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PEagleParams:
  """eagle: the head's weights; mask_embed: [K_max - 1, D] the learned embedding of the mask of
  each depth 2..K_max (a block of K <= K_max uses the first K - 1)."""

  eagle: EagleParams
  mask_embed: jax.Array


def mask_inputs(params: PEagleParams, g: jax.Array, k: int) -> jax.Array:
  """[..., K - 1, D]: W_in [mask_embed_j; g] for depths j + 1 = 2..K, g [..., D] the anchor's
  feature."""
  m = mask_rows(params.mask_embed, k).astype(jnp.float32)  # [K - 1, D]
  g = jnp.broadcast_to(g.astype(jnp.float32)[..., None, :], g.shape[:-1] + m.shape)
  pair = jnp.concatenate([jnp.broadcast_to(m, g.shape), g], -1)
  return linear(pair, params.eagle.w_in)


@dataclasses.dataclass(frozen=True)
class PEagleDrafter(BlockProposals, DrafterDefaults):
  """Block drafting with a parallel EAGLE head: K tokens per propose, one head pass.

  Attributes:
    cfg: the head layer's config (n_layers = 1; vocab_size = the target's V).
    k: block size K.
    hidden_layers: target layers the head fuses (EAGLE-3); () for an EAGLE-1 feature.
  """

  cfg: ModelConfig
  k: int = 8
  hidden_layers: tuple[int, ...] = ()

  @property
  def eagle(self) -> EagleDrafter:
    """The sequential head with the same state: init, observe and commit are its own."""
    return EagleDrafter(self.cfg, self.k, self.hidden_layers)

  def capacity_slack(self) -> int:
    return self.k  # a pass covers K + 1 window slots and K - 1 masks from the cache length

  def block_logits(self, params: PEagleParams, state: EagleState, seq, seq_len):
    """(logits [B, K, Vd], d2t, state after the pass)."""
    del seq_len
    e = params.eagle
    c, m = state.cache.lengths, state.n_pending
    tokens = read_rows(seq, c + 1, state.pending.shape[1])
    anchor = state.pending[jnp.arange(seq.shape[0]), jnp.maximum(m - 1, 0)]  # f at seq_len - 2
    masks = mask_inputs(params, anchor, self.k)
    x = with_masks(layer_inputs(e, tokens, state.pending), m, masks)
    o, cache = cached_layer(e, x, state.cache, self.cfg)
    logits = head_logits(e, block_outputs(o, m, self.k), self.cfg.norm_eps)
    return logits, e.d2t, EagleState(cache.with_lengths(c + m), state.pending, state.n_pending)

  def init(self, params: PEagleParams, prefill, prompts, prompt_lens, capacity: int):
    return self.eagle.init(params.eagle, prefill, prompts, prompt_lens, capacity)

  def observe(self, params: PEagleParams, state, seq, seq_len, new_seq, new_seq_len,
              step: StepResult, key, sampling) -> EagleState:  # fmt: skip
    return self.eagle.observe(
      params.eagle, state, seq, seq_len, new_seq, new_seq_len, step, key, sampling
    )

  def commit(self, params: PEagleParams, state: EagleState, seq, seq_len, step: StepResult):
    return self.eagle.commit(params.eagle, state, seq, seq_len, step)


register(
  DrafterKind(
    "peagle",
    params=lambda t, d2t, out_matrix, target_params: PEagleParams(
      params_from_tensors(t, d2t, out_matrix, target_params), t["mask_embed"]
    ),
    chain=lambda shipped, k: PEagleDrafter(shipped.head_cfg, k, fused_layers(shipped)),
    tree=lambda shipped, t, vocab_size: block_tree(
      PEagleDrafter(shipped.head_cfg, t.depth, fused_layers(shipped)), t, vocab_size
    ),
    objective="train.pipeline:peagle_objective",
  )
)
