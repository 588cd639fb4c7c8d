"""The registry of experiment methods (`config.method`): one entry per method, registered where the
method is built.

A `MethodKind` says, in one place, how a method is built from the experiment's settings and a
loaded target, how records and tables label it, what a report's header adds about what drafts,
what its config must hold beyond the common checks, whether it can adapt K, and how
`SpeculativeLM` sets it up when asked for it by name. `settings.settings_from_config`,
`methods.build_method`, `methods.method_label`, `methods.describe_method` and `specjax.api` look
entries up here instead of listing methods.

The built-in methods (ar, prompt_lookup, draft_model, shipped, tree, smc, suffix) register in
`specjax.experiment.methods`, in that order (the order error messages list them). Trained drafters
are not methods of their own: they run through `shipped` and `tree`, which look their kinds up in
`specjax.drafters.registry`. The registry sits in the experiment layer, not beside the drafters,
because an entry builds an experiment `Method` from `ExperimentSettings`, which the drafters below
must not import; so an untrained drafter becomes a method through one `register(MethodKind(...))`
in `specjax.experiment.methods`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from specjax.registry import Registry


@dataclasses.dataclass(frozen=True)
class MethodKind:
  """One experiment method.

  Attributes:
    name: its `config.method` value.
    build: (settings, target, load_model) -> the `Method` to time, or None for the AR baseline
      alone (`settings` an `ExperimentSettings`, `target` a `methods.Target`, `load_model` the
      draft-model loader or None for `specjax.loading.registry.load_model`).
    label: settings -> its name in records and tables; None for "<name>_k<K>".
    describe: settings -> what a report's header adds after "<label> (<name>, <loop> loop)" (what
      drafts); None for the shipped drafter, when `drafter.shipped` names one.
    check: config -> None, raising ValueError for what the method needs of the (ConfigDict)
      config beyond the common checks; None for nothing more.
    adapts: whether in-loop adaptive K applies (it has a draft length to choose).
    by_name: (config, tree) -> None, for a method `SpeculativeLM` takes by name (it needs no
      weights or draft model named): sets the config's fields for its chain (tree False) or tree
      form, raising ValueError if it has no such form; None for the other methods.
  """

  name: str
  build: Callable[..., Any]
  label: Callable[[Any], str] | None = None
  describe: Callable[[Any], str] | None = None
  check: Callable[[Any], None] | None = None
  adapts: bool = True
  by_name: Callable[[Any, bool], None] | None = None


_KINDS: Registry[MethodKind] = Registry(
  "experiment method",
  populate="specjax.experiment.methods",  # registers the built-in methods
  module=lambda kind: kind.build.__module__,
  unknown=lambda name, known: f"config.method must be one of {known}, got {name!r}",
)


def register(kind: MethodKind) -> MethodKind:
  """Adds `kind` (a second method of the same name, from another module, is an error)."""
  return _KINDS.register(kind)


def names() -> tuple[str, ...]:
  """The registered methods, in registration order."""
  return _KINDS.names()


def get(name: str) -> MethodKind:
  """The method called `name`.

  Raises:
    ValueError: for an unknown method, listing the known ones.
  """
  return _KINDS.get(name)
