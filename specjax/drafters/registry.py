"""The registry of trained drafter kinds: one entry per kind, registered by the kind's own module.

A kind (`DrafterKind`) says, in one place, how a drafter of that kind is built: its parameter pytree
from shipped tensors (`specjax.drafters.shipped.load_shipped`), its chain drafter at a draft length,
optionally its tree form (`specjax.drafters.tree_*`), and optionally the training objective that
fits it (`train/`, named by import path so this layer imports nothing above it). The shipped loader,
the experiment methods (`shipped`, `tree.kind=eagle|heads`, by `tree_kind`) and the training
pipeline look kinds up here instead of listing them.

Adding a trained kind: one drafter module that calls `register(DrafterKind(...))` at import (and is
imported by `specjax.drafters`), its objective module `train/objectives/<kind>.py` (the objective
and its factory `make`), and a `configs/train_<kind>.py`.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp

from specjax.model import LayerParams
from specjax.registry import Registry


class ShippedDrafterError(ValueError):
  """A shipped drafter is missing, corrupted, or does not fit the given target."""


def layer_params(tensors: dict, prefix: str) -> LayerParams:
  """A decoder layer's `LayerParams` from flat tensors named "<prefix>/<field>"."""
  names = [f.name for f in dataclasses.fields(LayerParams)]
  return LayerParams(
    **{n: jnp.asarray(tensors[f"{prefix}/{n}"]) for n in names if f"{prefix}/{n}" in tensors}
  )


@dataclasses.dataclass(frozen=True)
class DrafterKind:
  """How one kind of trained drafter is built.

  Attributes:
    name: the kind's name in shipped metadata and training configs (e.g. "eagle").
    params: (tensors, d2t, out_matrix, target_params) -> the drafter's parameter pytree, from a
      shipped file's float32 tensors (`d2t` int32; `out_matrix` the target's [V, D] LM head).
    chain: (shipped, k) -> the chain drafter at draft length k (`shipped` a `ShippedDrafter`).
    tree: (shipped, tree, vocab_size) -> the tree drafter, or None for a kind without a tree form;
      `tree` carries n_nodes, depth and top_k (`specjax.experiment.settings.TreeSettings`).
    tree_kind: the experiment's `tree.kind` that drafts with the tree form: "heads" (a static
      Medusa-style tree over per-depth candidates) or "eagle" (EAGLE-2's dynamic tree).
    head_cfg: whether the shipped metadata records a layer config (`head_cfg`).
    objective: "module:function" of the training objective factory (o: dict, target cfg) ->
      objective ("train.objectives.<kind>:make"), or "" for a kind nothing trains.
  """

  name: str
  params: Callable[..., Any]
  chain: Callable[..., Any]
  tree: Callable[..., Any] | None = None
  tree_kind: str = "heads"
  head_cfg: bool = True
  objective: str = ""

  def make_objective(self, o: dict, target_cfg) -> Any:
    """The training objective the config dict `o` describes (imports its module)."""
    if not self.objective:
      raise ValueError(f"drafter kind {self.name!r} has no training objective")
    module, _, fn = self.objective.partition(":")
    return getattr(importlib.import_module(module), fn)(o, target_cfg)


_KINDS: Registry[DrafterKind] = Registry(
  "drafter kind",
  populate="specjax.drafters",  # its modules register the kinds
  sort=True,
  module=lambda kind: kind.chain.__module__,
  unknown=lambda name, known: f"unknown drafter kind {name!r}; registered: {', '.join(known)}",
)


def register(kind: DrafterKind) -> DrafterKind:
  """Adds `kind` (a second kind of the same name, from another module, is an error)."""
  return _KINDS.register(kind)


def names() -> tuple[str, ...]:
  """The registered kinds, sorted."""
  return _KINDS.names()


def get(name: str) -> DrafterKind:
  """The kind called `name`.

  Raises:
    ValueError: for an unknown kind, listing the known ones.
  """
  return _KINDS.get(name)
