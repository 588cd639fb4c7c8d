"""Trained drafters shipped with specjax, and the loader that checks them.

Each drafter is `<name>.safetensors` (its own trained weights and the draft vocabulary map `d2t`;
never the target's arrays) plus `<name>.json`: the kind and its configuration, the target it was
trained for, the data recipe, training settings and time, held-out metrics, the tensor shapes and
the file's sha256. `load_shipped(name, target_params, target_cfg)` verifies the checksum, the
target, and every tensor shape, then assembles the drafter's parameter pytree with the target's
embedding / LM-head rows (shared, not copied) where the kind reuses them. A drafter that extends
another (a P-EAGLE head over an EAGLE-3 head) ships only its own part; its metadata's `base` names
the other drafter and its sha256, and the loader reads and checks both. What each kind's tensors
become is its `specjax.drafters.registry.DrafterKind`.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from safetensors.numpy import load_file

from specjax.config import ModelConfig
from specjax.drafters import registry
from specjax.drafters.registry import ShippedDrafterError
from specjax.loading.registry import sha256_of
from specjax.model import LayerParams, Params

SHIPPED_DIR = os.path.dirname(os.path.abspath(__file__))


@dataclasses.dataclass(frozen=True)
class ShippedDrafter:
  """A loaded drafter: `drafter(k)` makes the static drafter object; `params` its pytree."""

  name: str
  kind: str
  params: Any
  metadata: dict
  head_cfg: ModelConfig | None

  def drafter(self, k: int):
    """The chain drafter at draft length k (its kind's `DrafterKind.chain`)."""
    return registry.get(self.kind).chain(self, k)

  def tree_drafter(self, tree, vocab_size: int):
    """The kind's tree form over this drafter (`DrafterKind.tree`; `tree`: n_nodes, depth, top_k).

    Raises:
      ValueError: for a kind without a tree form.
    """
    kind = registry.get(self.kind)
    if kind.tree is None:
      raise ValueError(f"{self.name} is a {self.kind} drafter, which has no tree form")
    return kind.tree(self, tree, vocab_size)


def list_shipped(directory: str = SHIPPED_DIR) -> list[str]:
  return sorted(os.path.basename(p)[: -len(".json")] for p in glob.glob(f"{directory}/*.json"))


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


def read_metadata(name: str, directory: str = SHIPPED_DIR) -> dict:
  """The JSON metadata of shipped drafter `name` (kind, config, recipe, held-out metrics).

  Raises:
    ShippedDrafterError: for an unknown name, listing the shipped ones.
  """
  meta_path = os.path.join(directory, f"{name}.json")
  if not os.path.exists(meta_path):
    raise ShippedDrafterError(f"no shipped drafter {name!r}; available: {list_shipped(directory)}")
  with open(meta_path) as f:
    return json.load(f)


def _verified_tensors(meta: dict, directory: str, target_cfg: ModelConfig) -> dict:
  path = os.path.join(directory, meta["file"])
  digest = sha256_of(path)
  if digest != meta["sha256"]:
    raise ShippedDrafterError(f"{path}: sha256 {digest} != recorded {meta['sha256']}")
  tensors = load_file(path)
  _check(meta, tensors, target_cfg)
  return tensors


def own_tensors(name: str, target_cfg: ModelConfig, directory: str = SHIPPED_DIR) -> tuple:
  """(metadata, tensors) of shipped drafter `name`'s own file, checksum and shapes verified, without
  the drafter it extends: what a retraining over a changed base warm-starts from."""
  meta = read_metadata(name, directory)
  return meta, _verified_tensors(meta, directory, target_cfg)


WEIGHTS_DTYPES = ("float32", "bfloat16")


def cast_weights(params, dtype: str, keep: Params):
  """`params` with every float matrix (>= 2-D) in `dtype`, except the arrays of `keep` (the
  target's, which a drafter may share) and vectors (norms, biases), which stay as they are.

  bfloat16 halves the bytes a drafting step streams. The CPU kernels read bfloat16 weights
  against float32 activations, and the drafts change slightly. Acceptance keeps the output the
  target's either way.
  """
  if dtype not in WEIGHTS_DTYPES:
    raise ValueError(f"drafter weights dtype {dtype!r}: choose from {WEIGHTS_DTYPES}")
  if dtype == "float32":
    return params
  shared = {id(x) for x in jax.tree.leaves(keep)}

  def cast(x):
    if id(x) in shared or x.ndim < 2 or not jnp.issubdtype(x.dtype, jnp.floating):
      return x
    return x.astype(dtype)

  return jax.tree.map(cast, params)


def load_shipped(
  name: str, target_params: Params, target_cfg: ModelConfig, directory: str = SHIPPED_DIR,
  weights_dtype: str = "float32",
) -> ShippedDrafter:  # fmt: skip
  """Loads and verifies shipped drafter `name` for the given target.

  weights_dtype: "float32" (the default), or "bfloat16" for the drafter's own matrices
  (`cast_weights`).

  Raises:
    ShippedDrafterError: unknown name, checksum mismatch, wrong target, or a shape mismatch.
    ValueError: an unknown weights_dtype.
  """
  meta = read_metadata(name, directory)
  tensors = _verified_tensors(meta, directory, target_cfg)
  if "base" in meta:  # it extends another shipped drafter: that one's tensors, then its own
    base = read_metadata(meta["base"]["name"], directory)
    if base["sha256"] != meta["base"]["sha256"]:
      raise ShippedDrafterError(
        f"{name} extends {base['name']} with sha256 {meta['base']['sha256']}, but the shipped "
        f"{base['name']} has {base['sha256']}; retrain {name} on it or restore that version"
      )
    tensors = {**_verified_tensors(base, directory, target_cfg), **tensors}
  t = {k: jnp.asarray(v, jnp.int32 if k == "d2t" else jnp.float32) for k, v in tensors.items()}
  out_matrix = target_params.embed if target_params.lm_head is None else target_params.lm_head
  d2t = t["d2t"].astype(jnp.int32)
  try:
    kind = registry.get(meta["kind"])
  except ValueError as e:
    raise ShippedDrafterError(str(e)) from None
  cfg = head_config(meta) if kind.head_cfg else None
  params = cast_weights(
    kind.params(t, d2t, out_matrix, target_params), weights_dtype, target_params
  )
  return ShippedDrafter(name, kind.name, params, meta, cfg)


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
