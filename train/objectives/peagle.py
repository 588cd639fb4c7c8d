"""The P-EAGLE objective (`specjax.drafters.peagle`): a mask layer and embeddings over a frozen
EAGLE head, all K depths trained at once."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from specjax.config import ModelConfig
from specjax.drafters.eagle import feature, head_logits, layer_inputs
from specjax.drafters.peagle import (
  PEagleDrafter,
  PEagleParams,
  first_tokens,
  head_state,
  mask_inputs,
)
from specjax.model import Params
from train.data import Batch
from train.losses import ahead, depth_agreement, doc_causal_mask, greedy_target, scored, target_logp
from train.objectives.common import kl_terms, mask_embeddings, shaped_like, shipped_part, warm_start
from train.objectives.eagle import EagleObjective
from train.streams import stack_streams, stream_layer


@dataclasses.dataclass(frozen=True)
class PEagleObjective:
  """A parallel EAGLE head (`specjax.drafters.peagle`): all K depths of every anchor in one pass.

  The EAGLE head is frozen (the shipped `base`, or its initialisation for tests); what trains is
  the mask layer (initialised from the head's layer) and the per-depth mask embeddings. Depth 1 is
  the head's own step 1 (the pair (x_{t+1}, g_t) at position t predicts x_{t+2}); depth j + 1 is
  the mask pair (depth j + 1's embedding, g_t) at position t + j, through the mask layer, seeing
  the context keys up to t and the shallower masks, and predicts x_{t+j+2} (`train.streams`).
  Depths 2..K are distilled towards the target (KL, weight decay ** (j - 1)).

  Attributes:
    cfg: the head layer's config (n_layers = 1, vocab_size = the target's V).
    k: depths trained.
    fuse_layers: target layers fused into the feature (EAGLE-3).
    fuse_norm: normalise each fused layer first (`EagleObjective.fuse_norm`).
    base: name of the shipped `eagle` drafter this one extends (its weights are frozen and not
      shipped again); "" starts from `EagleObjective`'s initialisation and cannot be shipped.
    init_layer: without a base, the target layer that initialises the head (-1 random).
    decay: depth j + 1's loss weight is decay ** (j - 1).
    init_from: a shipped P-EAGLE drafter whose mask layer and mask embeddings start the training
      (its base may since have changed: retraining over a continued base), instead of the base's
      layer and the mean embedding. From a drafter trained without `first_token` into one with
      it, only the mask layer carries over (the embeddings start at zero).
    first_token: the masks also read the embedding of the depth-1 token (`peagle.mask_inputs`):
      in training the true x_{t+2} (depths past 1 only matter once depth 1 was accepted), in
      evaluation and drafting the head's greedy draft. Off, depth j + 1 must guess x_{t+j+2}
      without x_{t+2}.
    head_state: the masks also read the frozen head's depth-1 output at the anchor (the state
      EAGLE's sequential step 2 reads as its feature), through a trained [D, D] projection that
      starts at zero (`peagle.mask_inputs`); the block still costs two passes.
    head_depth2: depth 2 is the frozen head's own step 2 (the pair (x_{t+2}, its depth-1
      output) through its layer, in the masks' pass), so it is exactly the sequential head's;
      the mask layer trains depths 3..K, which attend to that step's key (needs first_token).
  """

  cfg: ModelConfig
  k: int = 8
  fuse_layers: tuple[int, ...] = ()
  fuse_norm: bool = True
  base: str = ""
  init_layer: int = -1
  decay: float = 0.8
  init_from: str = ""
  first_token: bool = False
  head_state: bool = False
  head_depth2: bool = False
  name = "peagle"

  def __post_init__(self):
    if self.head_depth2 and not self.first_token:
      raise ValueError(
        "objective.head_depth2 feeds the depth-1 draft to the head's own step 2: set "
        "objective.first_token=True"
      )
    if self.head_depth2 and self.k < 3:
      raise ValueError(f"objective.head_depth2 trains depths 3..k: k={self.k} leaves none")

  def _eagle(self) -> EagleObjective:
    return EagleObjective(
      self.cfg, 1, self.fuse_layers, w_reg=0.0, w_cls=1.0, init_layer=self.init_layer,
      fuse_norm=self.fuse_norm,
    )  # fmt: skip

  def init(self, key, target: Params, tcfg: ModelConfig, d2t, shipped_dir="") -> tuple[dict, dict]:
    eagle, frozen = self._eagle().init(key, target, tcfg, d2t)
    if self.base:
      shipped = warm_start(self.base, "eagle", target, tcfg, d2t, shipped_dir)
      fused = tuple(shipped.metadata["config"].get("fuse_layers", ()))
      if fused != tuple(self.fuse_layers):
        raise ValueError(
          f"objective.base={self.base!r} fuses target layers {fused}, this objective "
          f"{tuple(self.fuse_layers)}; set objective.fuse_layers to match"
        )
      eagle = {k: getattr(shipped.params, k) for k in eagle}
    frozen = {**frozen, "eagle": eagle}
    if self.first_token:  # the mask reads embed(x_{t+2}) + its depth's offset
      embed = jnp.zeros((self.k - 1, tcfg.d_model), jnp.float32)
    else:
      embed = mask_embeddings(frozen, self.k)
    trainable = {"mask_layer": eagle["layer"], "mask_embed": embed}
    if self.head_state:  # starts as a head that does not read it
      trainable["mask_state"] = jnp.zeros((tcfg.d_model, tcfg.d_model), jnp.float32)
    if self.init_from:
      trainable = self._mask_path_of(self.init_from, trainable, tcfg, d2t, shipped_dir)
    return trainable, frozen

  def _mask_path_of(self, name: str, like: dict, tcfg: ModelConfig, d2t, shipped_dir: str):
    """The mask layer and embeddings of shipped P-EAGLE `name`, checked against `like`'s shapes
    and this run's draft vocabulary."""
    from specjax.drafters.registry import layer_params

    meta, t = shipped_part(name, self.name, tcfg, shipped_dir)
    own, d2t = np.asarray(t["d2t"]), np.asarray(d2t)
    if not (len(own) <= len(d2t) and np.array_equal(own, d2t[: len(own)])):
      raise ValueError(
        f"objective.init_from={name!r} has a draft vocabulary that this run's does not begin with "
        "(only a base whose vocabulary grew, `grow_vocab`, may extend it)"
      )
    same_inputs = bool(meta["config"].get("first_token", False)) == self.first_token
    start = {
      "mask_layer": layer_params(t, "mask_layer"),
      "mask_embed": jnp.asarray(t["mask_embed"]) if same_inputs else like["mask_embed"],
    }
    if "mask_state" in t and not self.head_state:
      raise ValueError(
        f"objective.init_from={name!r} reads the head's depth-1 state; set objective.head_state"
        "=True to continue it"
      )
    if self.head_state:  # a drafter trained without it starts reading it from zero
      start["mask_state"] = jnp.asarray(t.get("mask_state", like["mask_state"]))
    return shaped_like(name, start, like, f"k={self.k}")

  def params(self, trainable, frozen) -> PEagleParams:
    eagle = self._eagle().params(frozen["eagle"], frozen)
    return PEagleParams(
      eagle, trainable["mask_layer"], trainable["mask_embed"], trainable.get("mask_state")
    )

  def outputs(self, p: PEagleParams, batch: Batch, first=None) -> jax.Array:
    """[B, K, T, D] head outputs of weights p: depth j + 1 of every anchor; first [B, T]: the
    depth-1 tokens the masks read (`first_token`; default the true x_{t+2})."""
    e = p.eagle
    g = feature(e, batch.hidden, batch.layers)
    if self.first_token and first is None:
      first = ahead(batch.tokens, 2)
    x1 = layer_inputs(e, ahead(batch.tokens, 1), g)  # [B, T, D]
    mask = doc_causal_mask(batch.doc)
    o1 = state = None
    if p.mask_state is not None or self.head_depth2:  # depth 1's output, which they read
      o1 = stream_layer(e.layer, x1[:, None], batch.pos, mask, self.cfg)[:, 0]  # the head alone
      state = head_state(p, o1, self.cfg.norm_eps)
    masks = mask_inputs(p, g, self.k, first if self.first_token else None, state)
    masks = jnp.moveaxis(masks, 2, 1)  # [B, K - 1, T, D]: anchor t's
    if self.head_depth2:  # stream 1 is the head's step 2: (x_{t+2} or the draft, o1)
      masks = masks.at[:, 0].set(layer_inputs(e, first, o1))
    x = stack_streams(x1, masks)
    return stream_layer(
      e.layer, x, batch.pos, mask, self.cfg, mask_lp=p.mask_layer, first_out=o1,
      n_lp=2 if self.head_depth2 else 1,
    )  # fmt: skip

  def loss(self, trainable, frozen, batch: Batch):
    p = self.params(trainable, frozen)
    e, o = p.eagle, self.outputs(p, batch)
    tlogp = target_logp(batch.hidden, frozen["head"])
    total, aux = 0.0, {}
    # depth 1 is the frozen head's, and with head_depth2 depth 2 too: nothing of them trains
    for j in range(2 if self.head_depth2 else 1, self.k):
      mask = scored(batch, j + 1, j + 1)
      ce, kl = kl_terms(head_logits(e, o[:, j], self.cfg.norm_eps), ahead(tlogp, j + 1), mask)
      total = total + self.decay ** (j - 1) * ce
      aux[f"kl_{j + 1}"] = kl
    return total, aux

  def evaluate(self, trainable, frozen, batch: Batch) -> dict:
    """Held-out top-1 of every depth as drafting runs: the masks read the head's greedy depth-1
    draft, right or wrong."""
    p = self.params(trainable, frozen)
    e, o = p.eagle, self.outputs(p, batch)
    if self.first_token:  # depth 1 does not read the masks: its outputs stand
      first = first_tokens(p, head_logits(e, o[:, 0], self.cfg.norm_eps))
      o = self.outputs(p, batch, first)
    depths = [
      (head_logits(e, o[:, j], self.cfg.norm_eps), *greedy_target(batch, j + 2))
      for j in range(self.k)
    ]
    return depth_agreement(depths, frozen["d2t"])

  def draft_params(self, trainable, frozen) -> PEagleParams:
    return self.params(trainable, frozen)

  def drafter(self, k: int) -> PEagleDrafter:
    return PEagleDrafter(self.cfg, k, self.fuse_layers, self.first_token, self.head_depth2)


def make(o: dict, tcfg: ModelConfig):
  """The `PEagleObjective` the config dict `o` (`configs/train_peagle.py`) describes, for
  target config tcfg (`DrafterKind.objective`)."""
  return PEagleObjective(
    tcfg.replace(n_layers=1),
    k=o.get("k", 8),
    fuse_layers=tuple(o.get("fuse_layers", ())),
    fuse_norm=o.get("fuse_norm", True),
    base=o.get("base", ""),
    init_layer=o.get("init_layer", -1),
    decay=o.get("decay", 0.8),
    init_from=o.get("init_from", ""),
    first_token=o.get("first_token", False),
    head_state=o.get("head_state", False),
    head_depth2=o.get("head_depth2", False),
  )
