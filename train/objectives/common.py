"""Helpers more than one kind's objective uses: the target's frozen tables, the distillation
terms, warm starts from shipped drafters and the parallel kinds' mask embeddings."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from specjax.config import ModelConfig
from specjax.model import Params
from train.losses import entropy, masked_mean, soft_cross_entropy


def output_matrix(target: Params) -> jax.Array:
  """[V, D] the target's output matrix (its embedding when the LM head is tied)."""
  return target.embed if target.lm_head is None else target.lm_head


def frozen_tables(target: Params, d2t: jax.Array) -> dict:
  """The frozen pytree the objectives start from: the target's embedding, its output rows of the
  draft vocabulary d2t ("head") and d2t."""
  d2t = jnp.asarray(d2t, jnp.int32)
  return {"embed": target.embed, "head": output_matrix(target)[d2t], "d2t": d2t}


def fuse_norm_init(target: Params, tcfg: ModelConfig, layers) -> jax.Array:
  """[n, D] starting RMSNorm weights of fused target layers: what the target's next layer reads
  of each stream (its input norm)."""
  nxt = jnp.asarray([min(i + 1, tcfg.n_layers - 1) for i in layers])
  return target.layers.attn_norm[nxt]


def kl_terms(logits, tlogp, mask):
  """(cross-entropy, KL) of draft logits against the target's log-probabilities tlogp, each the
  mean over the positions of mask."""
  ce = soft_cross_entropy(logits, tlogp)
  return masked_mean(ce, mask), masked_mean(ce - entropy(tlogp), mask)


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
