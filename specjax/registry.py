"""A registry of named entries: the one pattern behind specjax's lookup tables.

`specjax.experiment.registry` (experiment methods), `specjax.drafters.registry` (trained drafter
kinds) and `specjax.deploy` (deployed drafter layouts) each keep one `Registry`: entries registered
by name where they are defined, filled lazily by importing the module that registers the built-in
ones, listed in registration or sorted order, and looked up with an error that lists the known
names. This module imports nothing from specjax (it sits below everything).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
  """Entries (anything with a `name`) by name.

  Args:
    what: what an entry is, in the "registered twice" error (e.g. "drafter kind").
    populate: the module whose import registers the built-in entries (imported by `names` and
      `get`), or "" when they register beside the registry.
    sort: whether `names` lists the names sorted rather than in registration order.
    module: entry -> the module defining it; registering a name again from the same module
      replaces the entry (a reloaded module), from another is an error. None: any second
      registration of a name is an error.
    unknown: (name, known names) -> the message of `get`'s ValueError for an unknown name.
  """

  def __init__(
    self,
    what: str,
    *,
    unknown: Callable[[str, tuple[str, ...]], str],
    populate: str = "",
    sort: bool = False,
    module: Callable[[T], str] | None = None,
  ):
    self._what = what
    self._unknown = unknown
    self._populate = populate
    self._sort = sort
    self._module = module
    self._entries: dict[str, T] = {}

  def register(self, entry: T) -> T:
    """Adds `entry` under its name.

    Raises:
      ValueError: if the name is registered already (from another module, when `module` is set).
    """
    name: str = entry.name  # type: ignore[attr-defined]
    old = self._entries.get(name)
    if old is not None and (self._module is None or self._module(old) != self._module(entry)):
      raise ValueError(f"{self._what} {name!r} is registered twice")
    self._entries[name] = entry
    return entry

  def names(self) -> tuple[str, ...]:
    """The registered names, sorted or in registration order."""
    if self._populate:
      importlib.import_module(self._populate)
    return tuple(sorted(self._entries)) if self._sort else tuple(self._entries)

  def get(self, name: str) -> T:
    """The entry called `name`.

    Raises:
      ValueError: for an unknown name, with the `unknown` message listing the known ones.
    """
    known = self.names()
    if name not in self._entries:
      raise ValueError(self._unknown(name, known))
    return self._entries[name]
