"""PARD's objective (`specjax.drafters.pard`): mask layers and embeddings over a frozen draft LM,
all K depths trained at once."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from specjax.config import ModelConfig
from specjax.drafters.decoder_layer import layer_at
from specjax.drafters.pard import PardDrafter, PardParams
from specjax.model import Params, rms_norm
from train.data import Batch
from train.losses import ahead, depth_agreement, doc_causal_mask, greedy_target, scored, target_logp
from train.objectives.common import kl_terms, mask_embeddings, shaped_like, shipped_part, warm_start
from train.objectives.draft_lm import DraftLMObjective
from train.streams import stack_streams, stream_layer


@dataclasses.dataclass(frozen=True)
class PardObjective:
  """PARD's mask-token objective for a parallel draft LM (`specjax.drafters.pard`).

  The draft LM is frozen (the shipped `base`, or its initialisation for tests); what trains is the
  mask layers (initialised from its layers) and the per-depth mask embeddings. Every anchor t of a
  window is trained at all K depths at once (`train.streams`): depth 1 is the draft LM reading
  x_0..x_t (predicting x_{t+1}); depth j + 1 reads mask j at position t + j through the mask
  layers, seeing the draft LM's keys of x_0..x_t and the masks before it, and predicts x_{t+j+1}.
  Depths 2..K are distilled towards the target's distribution there (KL, weight decay ** (j - 1)).

  Attributes:
    cfg: the draft's config (vocab_size = the target's V).
    k: depths trained (the block size drafting uses; smaller blocks work too).
    init_layers: without a base, target layers copied as the draft LM's layers.
    train_head: whether the draft LM has its own head (else the target's rows); must match base.
    base: name of the shipped `draft_lm` drafter this one extends (frozen, not shipped again); ""
      starts from `DraftLMObjective`'s initialisation and cannot be shipped.
    decay: depth j + 1's loss weight is decay ** (j - 1).
    init_from: a shipped PARD drafter over the same base whose mask layers and embeddings start
      the training (continued on other data); "" starts them from the draft LM's layers.
  """

  cfg: ModelConfig
  k: int = 8
  init_layers: tuple[int, ...] = ()
  train_head: bool = False
  base: str = ""
  decay: float = 0.8
  init_from: str = ""
  name = "pard"

  def _lm(self) -> DraftLMObjective:
    return DraftLMObjective(self.cfg, self.init_layers, self.train_head)

  def init(self, key, target: Params, tcfg: ModelConfig, d2t, shipped_dir="") -> tuple[dict, dict]:
    lm, frozen = self._lm().init(key, target, tcfg, d2t)
    if self.base:
      p = warm_start(self.base, "draft_lm", target, tcfg, d2t, shipped_dir).params
      lm = {"layers": p.layers, "final_norm": p.final_norm}
      if self.train_head:
        lm["lm_head"] = p.lm_head
    frozen = {**frozen, "lm": lm}
    trainable = {"mask_layers": lm["layers"], "mask_embed": mask_embeddings(frozen, self.k)}
    if self.init_from:
      trainable = self._mask_path_of(self.init_from, trainable, tcfg, d2t, shipped_dir)
    return trainable, frozen

  def _mask_path_of(self, name: str, like: dict, tcfg: ModelConfig, d2t, shipped_dir: str):
    """The mask layers and embeddings of shipped PARD `name`, checked against this run's base,
    draft vocabulary and `like`'s shapes."""
    from specjax.drafters.registry import layer_params

    meta, t = shipped_part(name, self.name, tcfg, shipped_dir)
    if meta.get("base", {}).get("name") != self.base:
      raise ValueError(
        f"objective.init_from={name!r} extends {meta.get('base', {}).get('name')!r}, but this "
        f"run's objective.base is {self.base!r}; continue it over its own base"
      )
    if not np.array_equal(t["d2t"], np.asarray(d2t)):
      raise ValueError(f"objective.init_from={name!r} has another draft vocabulary than this run")
    start = {"mask_layers": layer_params(t, "mask_layers"), "mask_embed": t["mask_embed"]}
    return shaped_like(name, start, like, f"k={self.k}, n_layers={self.cfg.n_layers}")

  def logits(self, trainable: dict, frozen: dict, batch: Batch) -> jax.Array:
    """[B, K, T, Vd]: depth j + 1's draft logits at every anchor."""
    lm = frozen["lm"]
    x0 = frozen["embed"][batch.tokens].astype(jnp.float32)
    x = stack_streams(x0, trainable["mask_embed"])
    mask = doc_causal_mask(batch.doc)
    for i in range(self.cfg.n_layers):
      lp, mlp = layer_at(lm["layers"], i), layer_at(trainable["mask_layers"], i)
      x = stream_layer(lp, x, batch.pos, mask, self.cfg, mask_lp=mlp)
    h = rms_norm(x, lm["final_norm"], self.cfg.norm_eps)
    return jnp.einsum("bjtd,vd->bjtv", h, lm.get("lm_head", frozen["head"]))

  def loss(self, trainable, frozen, batch: Batch):
    logits = self.logits(trainable, frozen, batch)
    tlogp = target_logp(batch.hidden, frozen["head"])
    total, aux = 0.0, {}
    for j in range(1, self.k):  # depth 1 is the frozen draft LM's
      ce, kl = kl_terms(logits[:, j], ahead(tlogp, j), scored(batch, j, j))
      total = total + self.decay ** (j - 1) * ce
      aux[f"kl_{j + 1}"] = kl
    return total, aux

  def evaluate(self, trainable, frozen, batch: Batch) -> dict:
    logits = self.logits(trainable, frozen, batch)
    depths = [(logits[:, j], *greedy_target(batch, j + 1)) for j in range(self.k)]
    return depth_agreement(depths, frozen["d2t"])

  def draft_params(self, trainable, frozen) -> PardParams:
    lm = self._lm().draft_params(frozen["lm"], frozen)
    return PardParams(lm, trainable["mask_layers"], trainable["mask_embed"])

  def drafter(self, k: int) -> PardDrafter:
    return PardDrafter(self.cfg, k)


def make(o: dict, tcfg: ModelConfig):
  """The `PardObjective` the config dict `o` (`configs/train_pard.py`) describes, for
  target config tcfg (`DrafterKind.objective`)."""
  return PardObjective(
    tcfg.replace(n_layers=o["n_layers"]),
    k=o.get("k", 8),
    init_layers=tuple(o.get("init_layers", ())),
    train_head=o.get("train_head", False),
    base=o.get("base", ""),
    decay=o.get("decay", 0.8),
    init_from=o.get("init_from", ""),
  )
