"""The draft LM's objective (`specjax.drafters.draft_lm`): a few decoder layers on the target's
embedding, distilled from the target."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax.config import ModelConfig
from specjax.drafters.decoder_layer import layer_at, self_attention_layer
from specjax.drafters.draft_lm import DraftLMDrafter, DraftLMParams
from specjax.model import Params, init_params, rms_norm
from train.data import Batch
from train.losses import agreement, doc_causal_mask, greedy_target, scored, target_logp
from train.objectives.common import frozen_tables, kl_terms


@dataclasses.dataclass(frozen=True)
class DraftLMObjective:
  """A few decoder layers on the target's embedding, distilled from the target (KL on p).

  Attributes:
    cfg: the draft's config (vocab_size = the target's V).
    init_layers: target layers copied as the initial draft layers (len = cfg.n_layers), or ()
      for random initialisation.
    train_head: train the draft-vocabulary LM head (initialised from the target's rows); when
      False the draft scores with the target's own rows, frozen (and not shipped).
  """

  cfg: ModelConfig
  init_layers: tuple[int, ...] = ()
  train_head: bool = False
  name = "draft_lm"

  def init(self, key, target: Params, tcfg: ModelConfig, d2t, shipped_dir="") -> tuple[dict, dict]:
    frozen = frozen_tables(target, d2t)
    if self.init_layers:
      idx = jnp.asarray(self.init_layers)
      layers = jax.tree.map(lambda a: a[idx], target.layers)
    else:
      layers = init_params(key, self.cfg).layers
    trainable = {"layers": layers, "final_norm": target.final_norm}
    if self.train_head:
      trainable["lm_head"] = frozen["head"]
    return trainable, frozen

  def logits(self, trainable: dict, frozen: dict, batch: Batch) -> jax.Array:
    x = frozen["embed"][batch.tokens].astype(jnp.float32)
    mask = doc_causal_mask(batch.doc)
    for i in range(self.cfg.n_layers):
      x = self_attention_layer(layer_at(trainable["layers"], i), x, batch.pos, mask, self.cfg)
    h = rms_norm(x, trainable["final_norm"], self.cfg.norm_eps)
    return jnp.einsum("btd,vd->btv", h, trainable.get("lm_head", frozen["head"]))

  def loss(self, trainable, frozen, batch: Batch):
    logits = self.logits(trainable, frozen, batch)
    tlogp = target_logp(batch.hidden, frozen["head"])
    ce, kl = kl_terms(logits, tlogp, scored(batch, 0, 0))
    return ce, {"kl": kl}

  def evaluate(self, trainable, frozen, batch: Batch) -> dict:
    logits = self.logits(trainable, frozen, batch)
    return {"top1": agreement(logits, frozen["d2t"], *greedy_target(batch, 1))}

  def draft_params(self, trainable, frozen) -> DraftLMParams:
    head = trainable.get("lm_head", frozen["head"])
    return DraftLMParams(
      frozen["embed"], trainable["layers"], trainable["final_norm"], head, frozen["d2t"]
    )

  def drafter(self, k: int) -> DraftLMDrafter:
    return DraftLMDrafter(self.cfg, k)


def make(o: dict, tcfg: ModelConfig):
  """The `DraftLMObjective` the config dict `o` (`configs/train_draft_lm.py`) describes, for
  target config tcfg (`DrafterKind.objective`)."""
  cfg = tcfg.replace(n_layers=o["n_layers"])
  return DraftLMObjective(cfg, tuple(o["init_layers"]), o.get("train_head", False))
