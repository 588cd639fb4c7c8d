"""What each drafter kind trains and how: parameters, losses, held-out agreement, the drafter.

An objective is a frozen (hashable, static) object; `init(key, target, tcfg, d2t, shipped_dir)`
makes its parameters (shipped_dir: where a shipped drafter it starts from or extends is read,
"" for the package's). Its parameters come in two pytrees: `trainable`
(differentiated, in the optimizer state) and `frozen` (the target's embedding and LM-head rows,
the draft vocabulary map; an ordinary argument, never differentiated, never copied into the
optimizer). Soft targets are the target's distribution restricted to the draft vocabulary,
log_softmax(h @ head.T) with head = rows d2t of the target's (tied) output matrix, computed from
the cached features; agreement is measured against the target's greedy token, which in the
self-distilled responses is the next token of the document.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specjax.config import ModelConfig
from specjax.drafters.decoder_layer import (
  attend_and_mlp,
  layer_at,
  project_qkv,
  self_attention_layer,
)
from specjax.drafters.draft_lm import DraftLMDrafter, DraftLMParams
from specjax.drafters.eagle import (
  EagleDrafter,
  EagleParams,
  feature,
  fused_layers,
  head_logits,
  layer_inputs,
)
from specjax.drafters.medusa import MedusaDrafter, MedusaParams, medusa_logits
from specjax.drafters.pard import PardDrafter, PardParams
from specjax.drafters.peagle import (
  PEagleDrafter,
  PEagleParams,
  first_tokens,
  head_state,
  mask_inputs,
)
from specjax.model import Params, init_params, rms_norm
from specjax.trees import TREE_RANKS
from train.data import Batch
from train.losses import (
  agreement,
  ahead,
  depth_agreement,
  doc_causal_mask,
  entropy,
  greedy_target,
  masked_mean,
  rank_agreement,
  scored,
  smooth_l1,
  soft_cross_entropy,
  target_logp,
)
from train.streams import stack_streams, stream_layer


def output_matrix(target: Params) -> jax.Array:
  return target.embed if target.lm_head is None else target.lm_head


def _frozen(target: Params, d2t: jax.Array) -> dict:
  d2t = jnp.asarray(d2t, jnp.int32)
  return {"embed": target.embed, "head": output_matrix(target)[d2t], "d2t": d2t}


def fuse_norm_init(target: Params, tcfg: ModelConfig, layers) -> jax.Array:
  """[n, D] starting RMSNorm weights of fused target layers: what the target's next layer reads
  of each stream (its input norm)."""
  nxt = jnp.asarray([min(i + 1, tcfg.n_layers - 1) for i in layers])
  return target.layers.attn_norm[nxt]


def _kl_terms(logits, tlogp, mask):
  ce = soft_cross_entropy(logits, tlogp)
  return masked_mean(ce, mask), masked_mean(ce - entropy(tlogp), mask)


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
    frozen = _frozen(target, d2t)
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
    ce, kl = _kl_terms(logits, tlogp, scored(batch, 0, 0))
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
    frozen = _frozen(target, d2t)
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
      ce, kl = _kl_terms(logits[:, :, k], ahead(tlogp, k + 1), scored(batch, k + 1, k + 1))
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
    frozen = _frozen(target, d2t)
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
    return jax.tree.map(jnp.asarray, trainable), _frozen(target, d2t)

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
      ce, kl = _kl_terms(head_logits(p, o, self.cfg.norm_eps), ahead(tlogp, j), mask)
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


def warm_start(
  name: str, kind: str, target: Params, tcfg: ModelConfig, d2t, shipped_dir: str, grow: int = 0
):
  """Shipped drafter `name` (from `shipped_dir`, "" for the package's), checked to be of `kind` and
  to use draft vocabulary d2t (a parallel drafter extends a sequential one of the same
  vocabulary), or, with `grow`, a vocabulary that d2t extends to `grow` tokens."""
  from specjax.drafters.shipped import SHIPPED_DIR, load_shipped

  shipped = load_shipped(name, target, tcfg, shipped_dir or SHIPPED_DIR)
  if shipped.kind != kind:
    raise ValueError(f"objective.base={name!r} is a {shipped.kind!r} drafter, not {kind!r}")
  own = np.asarray(shipped.params.d2t)
  if grow and len(d2t) == grow and np.array_equal(own, np.asarray(d2t)[: len(own)]):
    return shipped
  if not np.array_equal(own, np.asarray(d2t)):
    raise ValueError(
      f"objective.base={name!r} has a draft vocabulary of {len(shipped.params.d2t)} tokens "
      f"that differs from this run's ({len(d2t)}); train on the corpus and data.draft_vocab it "
      "was trained with, or pick another base"
    )
  return shipped


def shipped_part(name: str, kind: str, tcfg: ModelConfig, shipped_dir: str) -> tuple[dict, dict]:
  """(metadata, own tensors) of shipped drafter `name` (without a base it extends), checked to be
  of `kind`: what a parallel drafter's `init_from` continues."""
  from specjax.drafters.shipped import SHIPPED_DIR, own_tensors

  meta, t = own_tensors(name, tcfg, shipped_dir or SHIPPED_DIR)
  if meta["kind"] != kind:
    raise ValueError(f"objective.init_from={name!r} is a {meta['kind']!r} drafter, not {kind}")
  return meta, t


def shaped_like(name: str, start: dict, like: dict, detail: str) -> dict:
  """`start` (arrays read from shipped drafter `name`) as float32, checked to have `like`'s
  shapes (this objective's initialisation; `detail` names the settings that fix them)."""
  got = jax.tree.map(jnp.shape, start)
  if got != jax.tree.map(jnp.shape, like):
    raise ValueError(
      f"objective.init_from={name!r} has mask shapes {got}, this objective "
      f"{jax.tree.map(jnp.shape, like)} ({detail})"
    )
  return jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), start)


def mask_embeddings(frozen: dict, k: int) -> jax.Array:
  """[K - 1, D] per-depth mask embeddings, each starting at the mean embedding of the draft
  vocabulary."""
  mean = jnp.mean(frozen["embed"][frozen["d2t"]].astype(jnp.float32), 0)
  return jnp.tile(mean[None], (k - 1, 1))


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
      ce, kl = _kl_terms(logits[:, j], ahead(tlogp, j), scored(batch, j, j))
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
      ce, kl = _kl_terms(head_logits(e, o[:, j], self.cfg.norm_eps), ahead(tlogp, j + 1), mask)
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


Objective = Any  # one of the objectives above
