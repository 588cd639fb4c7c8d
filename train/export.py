"""Writes a trained drafter as shipped files: float16 safetensors plus JSON metadata."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
from safetensors.numpy import save_file

from specjax.config import ModelConfig
from specjax.drafters.shipped import flatten_trainable
from specjax.loading.registry import sha256_of


def objective_config(objective) -> dict:
  """The objective's fields as JSON-able values (its `cfg` goes under head_cfg instead)."""
  out = {}
  for f in dataclasses.fields(objective):
    v = getattr(objective, f.name)
    if isinstance(v, ModelConfig):
      continue
    out[f.name] = list(v) if isinstance(v, tuple) else v
  return out


# What says which data order a stage read.
STAGE_DATA = ("target_weights", "corpus", "recipe", "spec")


def stage_record(meta: dict) -> dict:
  """One training stage of a drafter, compact: its name and sha256, the data it read (without the
  read-through logs), its training settings and held-out metrics."""
  data = meta.get("data") or {}
  return {
    "name": meta.get("name"),
    "sha256": meta.get("sha256"),
    "data": {k: data.get(k) for k in STAGE_DATA},
    "training": meta.get("training"),
    "heldout": meta.get("heldout"),
  }


def lineage(old: dict) -> list[dict]:
  """The stages behind a drafter continued from `old` (the metadata of the head it starts from):
  every stage `old` descends from, oldest first, then `old` itself. A head shipped before this
  record existed gives only the stage it continued (`continued_from`)."""
  before = old.get("stages")
  if before is None:
    before = [stage_record(old["continued_from"])] if old.get("continued_from") else []
  return [*before, stage_record(old)]


def check_shippable(objective) -> None:
  """Raises a ValueError for an objective whose trained part cannot stand alone: a parallel
  drafter (an objective with a `base` field) trained over an unshipped initialisation."""
  if getattr(objective, "base", None) == "":
    raise ValueError(
      f"a {objective.name} drafter ships only what it adds to a shipped base drafter; set "
      "objective.base to that drafter's name, or ship.name='' to train without shipping"
    )


def export_drafter(
  directory: str,
  name: str,
  objective,
  trainable,
  frozen,
  target_name: str,
  target_cfg: ModelConfig,
  extra: dict,
) -> dict:
  """Saves `<name>.safetensors` (trainable weights as float16, d2t as int32) and `<name>.json`.

  Args:
    directory: destination (e.g. specjax/drafters/shipped).
    name: file stem.
    objective: the trained objective (its kind and configuration are recorded).
    trainable: trained weights.
    frozen: frozen pytree (only its `d2t` is saved).
    target_name: how the target is named (registry key).
    target_cfg: the target's config (vocabulary and width are checked at load).
    extra: more metadata (data recipe, training settings and time, held-out metrics).

  Returns:
    The metadata written.
  """
  check_shippable(objective)
  os.makedirs(directory, exist_ok=True)
  tensors = {k: v.astype(np.float16) for k, v in flatten_trainable(trainable).items()}
  tensors["d2t"] = np.asarray(frozen["d2t"], np.int32)
  file = f"{name}.safetensors"
  path = os.path.join(directory, file)
  save_file(tensors, path + ".part")
  os.chmod(path + ".part", 0o644)
  os.replace(path + ".part", path)
  head_cfg = getattr(objective, "cfg", None)
  base = getattr(objective, "base", "")  # a drafter that extends a shipped one ships its part only
  start = getattr(objective, "init_from", "")  # training continued from a shipped drafter
  if base or start:
    from specjax.drafters.shipped import read_metadata
  if base:
    extra = {**extra, "base": {"name": base, "sha256": read_metadata(base, directory)["sha256"]}}
  if start:  # read before this drafter's metadata replaces it (same name)
    old = read_metadata(start, directory)
    extra = {
      **extra,
      "continued_from": {k: old.get(k) for k in ("name", "sha256", "data", "training", "heldout")},
      "stages": lineage(old),
    }
  meta = {
    "name": name,
    "kind": objective.name,
    "file": file,
    "sha256": sha256_of(path),
    "size_bytes": os.path.getsize(path),
    "shapes": {k: list(v.shape) for k, v in tensors.items()},
    "dtype": "float16 weights (loaded as float32), int32 d2t",
    "config": objective_config(objective),
    "head_cfg": dataclasses.asdict(head_cfg) if head_cfg is not None else None,
    "target": {
      "name": target_name,
      "vocab_size": target_cfg.vocab_size,
      "d_model": target_cfg.d_model,
      "n_layers": target_cfg.n_layers,
    },
    **extra,
  }
  with open(os.path.join(directory, f"{name}.json.part"), "w") as f:
    json.dump(meta, f, indent=1)
  os.replace(os.path.join(directory, f"{name}.json.part"), os.path.join(directory, f"{name}.json"))
  return meta
