"""Choosing among step functions on device without copying the state they update.

XLA cannot update a conditional's operands in place: a `lax.switch` (or `lax.cond`) over steps
that write KV caches copies every cache into and out of the chosen branch. A `while_loop`'s carry
is updated in place, so each branch here is a loop that runs once or not at all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax


def run_one_of(i: jax.Array, steps: Sequence[Callable[[Any], Any]], state: Any) -> Any:
  """steps[i](state) for a traced scalar i (`lax.switch` semantics, no copies of `state`).

  `tests/test_adaptive.py` checks that the adaptive loop built on it copies no cache.
  """
  for j, step in enumerate(steps):
    state, _ = jax.lax.while_loop(
      lambda c: c[1], lambda c, f=step: (f(c[0]), False), (state, i == j)
    )
  return state
