"""The EAGLE objective (`specjax.drafters.eagle`): one decoder layer on the target's feature
(EAGLE-1) or fused layers (EAGLE-3), unrolled over its own outputs."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax.config import ModelConfig
from specjax.drafters.decoder_layer import attend_and_mlp, layer_at, project_qkv
from specjax.drafters.eagle import EagleDrafter, EagleParams, feature, head_logits, layer_inputs
from specjax.model import Params, init_params
from train.data import Batch
from train.losses import (
  ahead,
  depth_agreement,
  doc_causal_mask,
  greedy_target,
  masked_mean,
  scored,
  smooth_l1,
  target_logp,
)
from train.objectives.common import frozen_tables, fuse_norm_init, kl_terms, warm_start


@dataclasses.dataclass(frozen=True)
class EagleObjective:
  """An EAGLE head; EAGLE-1 when `fuse_layers` is empty, EAGLE-3 style otherwise.

  Training unrolls `steps` draft steps on the head's own outputs (step 1 is EAGLE-1's
  teacher-forced objective; more steps are EAGLE-3's training-time test): at step j the query for
  anchor t reads (x_{t+j}, o^{j-1}_t) at position t + j - 1 and attends to the step-1 keys of
  positions <= t and to its own keys of steps 2..j, exactly what the drafting cache holds.

  Attributes:
    cfg: the head layer's config (n_layers = 1, vocab_size = the target's V).
    steps: unrolled draft steps.
    fuse_layers: target layers fused into the feature (EAGLE-3), or ().
    fuse_norm: normalise each fused layer (RMSNorm, weights initialised from the input norm of
      the target layer that reads it) before fusing; False fuses the raw outputs.
    w_reg: weight of the feature regression (EAGLE-1; 0 for EAGLE-3).
    w_cls: weight of the distillation cross-entropy.
    decay: step j's weight is decay ** (j - 1).
    init_layer: target layer whose weights initialise the head's layer (-1: random).
    init_from: a shipped EAGLE head whose weights start the training (training continued on other
      data); its draft vocabulary must be the run's (`train.pipeline` takes it from the head).
    grow_vocab: with `init_from`, the draft vocabulary grows to this size (0: it stays the head's):
      `train.pipeline` appends the corpus's most frequent tokens outside it, and their LM-head
      rows are the target's own, frozen (nothing more to ship); the head's rows train as before.
  """

  cfg: ModelConfig
  steps: int = 1
  fuse_layers: tuple[int, ...] = ()
  w_reg: float = 1.0
  w_cls: float = 0.1
  decay: float = 0.8
  init_layer: int = -1
  fuse_norm: bool = True
  init_from: str = ""
  grow_vocab: int = 0
  name = "eagle"

  def init(self, key, target: Params, tcfg: ModelConfig, d2t, shipped_dir="") -> tuple[dict, dict]:
    if self.init_from:
      return self._continued(target, tcfg, d2t, shipped_dir)
    D = tcfg.d_model
    k1, k2 = jax.random.split(key)
    if self.init_layer >= 0:
      layer = layer_at(target.layers, self.init_layer)
    else:
      layer = layer_at(init_params(k1, self.cfg.replace(n_layers=1)).layers, 0)
    # W_in starts by passing the feature through: x_in = g (+ a small embedding term).
    w_in = jnp.concatenate([0.02 * jax.random.normal(k2, (D, D)), jnp.eye(D)], 1)
    trainable = {"w_in": w_in, "layer": layer}
    frozen = frozen_tables(target, d2t)
    if self.fuse_layers:
      n = len(self.fuse_layers)
      trainable["fuse"] = jnp.tile(jnp.eye(D), (1, n)) / n  # starts as the mean of the layers
      if self.fuse_norm:
        trainable["fuse_norm"] = fuse_norm_init(target, tcfg, self.fuse_layers)
      trainable["norm"] = target.final_norm
      trainable["head"] = frozen["head"]
    return trainable, frozen

  def _continued(self, target: Params, tcfg: ModelConfig, d2t, shipped_dir: str):
    """The trainable arrays of the shipped head `init_from` (same fused layers and options)."""
    shipped = warm_start(self.init_from, "eagle", target, tcfg, d2t, shipped_dir, self.grow_vocab)
    p = shipped.params
    if (p.fuse is not None) != bool(self.fuse_layers) or (p.fuse_norm is not None) != (
      bool(self.fuse_layers) and self.fuse_norm
    ):
      raise ValueError(
        f"objective.init_from={self.init_from!r} fuses differently from this objective "
        f"(fuse_layers={self.fuse_layers}, fuse_norm={self.fuse_norm})"
      )
    trainable = {"w_in": p.w_in, "layer": p.layer}
    if self.fuse_layers:
      trainable.update(
        fuse=p.fuse, norm=p.norm, head=p.head[: shipped.metadata["shapes"]["head"][0]]
      )
      if self.fuse_norm:
        trainable["fuse_norm"] = p.fuse_norm
    return jax.tree.map(jnp.asarray, trainable), frozen_tables(target, d2t)

  def params(self, trainable, frozen) -> EagleParams:
    head = trainable.get("head", frozen["head"])
    if head.shape[0] < frozen["head"].shape[0]:  # a grown vocabulary: the target's rows follow
      head = jnp.concatenate([head, frozen["head"][head.shape[0] :]], 0)
    return EagleParams(
      w_in=trainable["w_in"],
      layer=trainable["layer"],
      head=head,
      d2t=frozen["d2t"],
      embed=frozen["embed"],
      fuse=trainable.get("fuse"),
      norm=trainable.get("norm"),
      fuse_norm=trainable.get("fuse_norm"),
    )

  def unroll(self, trainable, frozen, batch: Batch) -> list[jax.Array]:
    """Head outputs o^j [B, T, D] for j = 1..steps (o^j_t aims at f_{t+j})."""
    p = self.params(trainable, frozen)
    T = batch.tokens.shape[1]
    g = feature(p, batch.hidden, batch.layers)
    ctx_mask = doc_causal_mask(batch.doc)
    eye = jnp.broadcast_to(jnp.eye(T, dtype=bool)[None], ctx_mask.shape)
    keys, values, outs = [], [], []
    for j in range(1, self.steps + 1):
      x = layer_inputs(p, ahead(batch.tokens, j), g)
      q, k, v = project_qkv(p.layer, x, batch.pos + (j - 1), self.cfg)
      keys.append(k)
      values.append(v)
      mask = jnp.concatenate([ctx_mask] + [eye] * (j - 1), -1)  # [B, T, j*T]
      o = attend_and_mlp(
        p.layer, x, q, jnp.concatenate(keys, 1), jnp.concatenate(values, 1), mask, self.cfg
      )
      outs.append(o)
      g = o
    return outs

  def loss(self, trainable, frozen, batch: Batch):
    p = self.params(trainable, frozen)
    tlogp = target_logp(batch.hidden, frozen["head"])
    total, aux = 0.0, {}
    for j, o in enumerate(self.unroll(trainable, frozen, batch), 1):
      mask = scored(batch, j, j)
      ce, kl = kl_terms(head_logits(p, o, self.cfg.norm_eps), ahead(tlogp, j), mask)
      step_loss = self.w_cls * ce
      if self.w_reg:
        reg = masked_mean(smooth_l1(o, ahead(batch.hidden, j)), mask)
        step_loss = step_loss + self.w_reg * reg
        aux[f"reg_{j}"] = reg
      total = total + self.decay ** (j - 1) * step_loss
      aux[f"kl_{j}"] = kl
    return total, aux

  def evaluate(self, trainable, frozen, batch: Batch) -> dict:
    p = self.params(trainable, frozen)
    depths = [
      (head_logits(p, o, self.cfg.norm_eps), *greedy_target(batch, j + 1))
      for j, o in enumerate(self.unroll(trainable, frozen, batch), 1)
    ]
    return depth_agreement(depths, frozen["d2t"])

  def draft_params(self, trainable, frozen) -> EagleParams:
    return self.params(trainable, frozen)

  def drafter(self, k: int) -> EagleDrafter:
    return EagleDrafter(self.cfg, k, hidden_layers=self.fuse_layers)


def make(o: dict, tcfg: ModelConfig):
  """The `EagleObjective` the config dict `o` (`configs/train_eagle*.py`) describes, for
  target config tcfg (`DrafterKind.objective`)."""
  if o.get("grow_vocab") and not o.get("init_from"):
    raise ValueError(
      "objective.grow_vocab grows a shipped head's draft vocabulary: set objective.init_from to "
      "that head, or data.draft_vocab for a head trained from scratch"
    )
  return EagleObjective(
    tcfg.replace(n_layers=1),
    steps=o["steps"],
    fuse_layers=tuple(o.get("fuse_layers", ())),
    w_reg=o.get("w_reg", 1.0),
    w_cls=o.get("w_cls", 0.1),
    decay=o.get("decay", 0.8),
    init_layer=o.get("init_layer", -1),
    fuse_norm=o.get("fuse_norm", True),
    init_from=o.get("init_from", ""),
    grow_vocab=o.get("grow_vocab", 0),
  )
