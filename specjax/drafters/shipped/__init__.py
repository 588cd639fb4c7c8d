"""Trained drafters shipped with specjax, and the loader that checks them.

Each drafter is `<name>.safetensors` (its own trained weights and the draft vocabulary map `d2t`;
never the target's arrays) plus `<name>.json`: the kind and its configuration, the target it was
trained for, the data recipe, training settings and time, held-out metrics, the tensor shapes and
the file's sha256. `load_shipped(name, target_params, target_cfg)` verifies the checksum, the
target, and every tensor shape, then assembles the drafter's parameter pytree with the target's
embedding / LM-head rows (shared, not copied) where the kind reuses them.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from typing import Any

import jax.numpy as jnp
import numpy as np
from safetensors.numpy import load_file

from specjax.config import ModelConfig
from specjax.drafters.draft_lm import DraftLMDrafter, DraftLMParams
from specjax.drafters.eagle import EagleDrafter, EagleParams
from specjax.drafters.medusa import MedusaDrafter, MedusaParams
from specjax.loading.registry import sha256_of
from specjax.model import LayerParams, Params

SHIPPED_DIR = os.path.dirname(os.path.abspath(__file__))


class ShippedDrafterError(ValueError):
  """A shipped drafter is missing, corrupted, or does not fit the given target."""


@dataclasses.dataclass(frozen=True)
class ShippedDrafter:
  """A loaded drafter: `drafter(k)` makes the static drafter object; `params` its pytree."""

  name: str
  kind: str
  params: Any
  metadata: dict
  head_cfg: ModelConfig | None

  def drafter(self, k: int):
    if self.kind == "draft_lm":
      return DraftLMDrafter(self.head_cfg, k)
    if self.kind == "medusa":
      n_heads = self.params.w.shape[0]
      if k > n_heads:
        raise ShippedDrafterError(f"{self.name} has {n_heads} Medusa heads; k={k} is too many")
      return MedusaDrafter(self.metadata["target"]["vocab_size"], k)
    return EagleDrafter(self.head_cfg, k, tuple(self.metadata["config"].get("fuse_layers", ())))


def list_shipped(directory: str = SHIPPED_DIR) -> list[str]:
  return sorted(os.path.basename(p)[: -len(".json")] for p in glob.glob(f"{directory}/*.json"))


def _layer(t: dict, prefix: str) -> LayerParams:
  names = [f.name for f in dataclasses.fields(LayerParams)]
  return LayerParams(**{n: jnp.asarray(t[f"{prefix}/{n}"]) for n in names if f"{prefix}/{n}" in t})


def head_config(meta: dict) -> ModelConfig:
  """The draft/head layer config recorded in the metadata."""
  c = dict(meta["head_cfg"])
  if c.get("rope_scaling") is not None:
    c["rope_scaling"] = tuple(tuple(kv) for kv in c["rope_scaling"])
  return ModelConfig(**c)


def _check(meta: dict, tensors: dict, target_cfg: ModelConfig) -> None:
  t = meta["target"]
  if (t["vocab_size"], t["d_model"], t["n_layers"]) != (
    target_cfg.vocab_size,
    target_cfg.d_model,
    target_cfg.n_layers,
  ):
    raise ShippedDrafterError(
      f"drafter was trained for a target with V={t['vocab_size']}, D={t['d_model']}, "
      f"L={t['n_layers']}; got V={target_cfg.vocab_size}, D={target_cfg.d_model}, "
      f"L={target_cfg.n_layers}"
    )
  shapes = {k: tuple(v) for k, v in meta["shapes"].items()}
  if set(shapes) != set(tensors):
    raise ShippedDrafterError(f"tensor names {sorted(tensors)} != recorded {sorted(shapes)}")
  for k, a in tensors.items():
    if a.shape != shapes[k]:
      raise ShippedDrafterError(f"tensor {k} has shape {a.shape}, expected {shapes[k]}")
  d2t = tensors["d2t"]
  if d2t.min() < 0 or d2t.max() >= target_cfg.vocab_size:
    raise ShippedDrafterError("d2t holds ids outside the target vocabulary")


def load_shipped(
  name: str, target_params: Params, target_cfg: ModelConfig, directory: str = SHIPPED_DIR
) -> ShippedDrafter:
  """Loads and verifies shipped drafter `name` for the given target.

  Raises:
    ShippedDrafterError: unknown name, checksum mismatch, wrong target, or a shape mismatch.
  """
  meta_path = os.path.join(directory, f"{name}.json")
  if not os.path.exists(meta_path):
    raise ShippedDrafterError(f"no shipped drafter {name!r}; available: {list_shipped(directory)}")
  with open(meta_path) as f:
    meta = json.load(f)
  path = os.path.join(directory, meta["file"])
  digest = sha256_of(path)
  if digest != meta["sha256"]:
    raise ShippedDrafterError(f"{path}: sha256 {digest} != recorded {meta['sha256']}")
  tensors = load_file(path)
  _check(meta, tensors, target_cfg)
  t = {k: jnp.asarray(v, jnp.int32 if k == "d2t" else jnp.float32) for k, v in tensors.items()}
  out_matrix = target_params.embed if target_params.lm_head is None else target_params.lm_head
  d2t = t["d2t"].astype(jnp.int32)
  kind = meta["kind"]
  cfg = None
  if kind == "draft_lm":
    cfg = head_config(meta)
    head = t["lm_head"] if "lm_head" in t else out_matrix[d2t]
    params = DraftLMParams(target_params.embed, _layer(t, "layers"), t["final_norm"], head, d2t)
  elif kind == "medusa":
    params = MedusaParams(t["w"], t["b"], out_matrix[d2t], d2t)
  elif kind == "eagle":
    cfg = head_config(meta)
    params = EagleParams(
      w_in=t["w_in"],
      layer=_layer(t, "layer"),
      head=t["head"] if "head" in t else out_matrix[d2t],
      d2t=d2t,
      embed=target_params.embed,
      fuse=t.get("fuse"),
      norm=t.get("norm"),
      fuse_norm=t.get("fuse_norm"),
    )
  else:
    raise ShippedDrafterError(f"unknown drafter kind {kind!r}")
  return ShippedDrafter(name, kind, params, meta, cfg)


def flatten_trainable(tree: dict) -> dict[str, np.ndarray]:
  """{"a/b": array} from a nested dict of arrays and `LayerParams` (None fields skipped)."""
  out = {}
  for key, value in tree.items():
    if isinstance(value, LayerParams):
      for f in dataclasses.fields(LayerParams):
        v = getattr(value, f.name)
        if v is not None:
          out[f"{key}/{f.name}"] = np.asarray(v, np.float32)
    elif isinstance(value, dict):
      out.update({f"{key}/{k}": v for k, v in flatten_trainable(value).items()})
    else:
      out[key] = np.asarray(value)
  return out
