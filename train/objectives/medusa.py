"""The Medusa objective (`specjax.drafters.medusa`): K heads on the target's last hidden state,
head k distilled towards the target's distribution k + 2 tokens ahead."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from specjax.config import ModelConfig
from specjax.drafters.eagle import fused_layers
from specjax.drafters.medusa import MedusaDrafter, MedusaParams, medusa_logits
from specjax.model import Params
from specjax.trees import TREE_RANKS
from train.data import Batch
from train.losses import ahead, depth_agreement, greedy_target, rank_agreement, scored, target_logp
from train.objectives.common import frozen_tables, fuse_norm_init, kl_terms, warm_start


@dataclasses.dataclass(frozen=True)
class MedusaObjective:
  """K Medusa-1 heads, head k distilled towards the target's distribution for x_{t+k+2}.

  Attributes:
    n_heads: K.
    decay: head k's loss weight is decay ** k (0.8 in Medusa).
    vocab_size: the target's V.
    init_from: shipped Medusa heads whose weights start the training (training continued on other
      data); their draft vocabulary must be the run's (`train.pipeline` takes it from them).
    fuse_layers: target layers whose outputs the heads read besides h (`MedusaParams.fuse`), or
      (). The fusion starts at zero, so heads continued from plain ones (`init_from`) start as
      they were.
  """

  n_heads: int
  vocab_size: int
  decay: float = 0.8
  init_from: str = ""
  fuse_layers: tuple[int, ...] = ()
  name = "medusa"

  def init(self, key, target: Params, tcfg: ModelConfig, d2t, shipped_dir="") -> tuple[dict, dict]:
    del key
    D, n = tcfg.d_model, len(self.fuse_layers)
    trainable = {  # zero weights: every residual block starts as the identity
      "w": jnp.zeros((self.n_heads, D, D), jnp.float32),
      "b": jnp.zeros((self.n_heads, D), jnp.float32),
    }
    if n:
      trainable["fuse"] = jnp.zeros((D, n * D), jnp.float32)
      trainable["fuse_norm"] = fuse_norm_init(target, tcfg, self.fuse_layers)
    if self.init_from:
      shipped = warm_start(self.init_from, "medusa", target, tcfg, d2t, shipped_dir)
      p, layers = shipped.params, fused_layers(shipped)
      if p.w.shape != trainable["w"].shape:
        raise ValueError(
          f"objective.init_from={self.init_from!r} has {p.w.shape[0]} heads of width "
          f"{p.w.shape[-1]}; this objective {self.n_heads} of {D}"
        )
      if layers and layers != tuple(self.fuse_layers):
        raise ValueError(
          f"objective.init_from={self.init_from!r} fuses target layers {layers}, this objective "
          f"{tuple(self.fuse_layers)}: set objective.fuse_layers to the layers it fuses"
        )
      trainable["w"], trainable["b"] = jnp.asarray(p.w, jnp.float32), jnp.asarray(p.b, jnp.float32)
      if p.fuse is not None:
        trainable["fuse"] = jnp.asarray(p.fuse, jnp.float32)
        trainable["fuse_norm"] = jnp.asarray(p.fuse_norm, jnp.float32)
    frozen = frozen_tables(target, d2t)
    del frozen["embed"]
    return trainable, frozen

  def _params(self, trainable, frozen) -> MedusaParams:
    return MedusaParams(
      trainable["w"], trainable["b"], frozen["head"], frozen["d2t"],
      trainable.get("fuse"), trainable.get("fuse_norm"),
    )  # fmt: skip

  def loss(self, trainable, frozen, batch: Batch):
    tlogp = target_logp(batch.hidden, frozen["head"])  # [B, T, Vd]
    logits = medusa_logits(self._params(trainable, frozen), batch.hidden, batch.layers)
    total, aux = 0.0, {}
    for k in range(self.n_heads):
      ce, kl = kl_terms(logits[:, :, k], ahead(tlogp, k + 1), scored(batch, k + 1, k + 1))
      total = total + self.decay**k * ce
      aux[f"kl_{k}"] = kl
    return total, aux

  def evaluate(self, trainable, frozen, batch: Batch) -> dict:
    logits = medusa_logits(self._params(trainable, frozen), batch.hidden, batch.layers)
    depths = [(logits[:, :, k], *greedy_target(batch, k + 2)) for k in range(self.n_heads)]
    d2t = frozen["d2t"]
    out = depth_agreement(depths, d2t, key="top1_head{}", first=0)
    return {**out, **rank_agreement(depths, d2t, TREE_RANKS)}

  def draft_params(self, trainable, frozen) -> MedusaParams:
    return self._params(trainable, frozen)

  def drafter(self, k: int) -> MedusaDrafter:
    return MedusaDrafter(self.vocab_size, k, self.fuse_layers)


def make(o: dict, tcfg: ModelConfig):
  """The `MedusaObjective` the config dict `o` (`configs/train_medusa.py`) describes, for
  target config tcfg (`DrafterKind.objective`)."""
  return MedusaObjective(
    o["n_heads"],
    tcfg.vocab_size,
    o.get("decay", 0.8),
    o.get("init_from", ""),
    tuple(o.get("fuse_layers", ())),
  )
