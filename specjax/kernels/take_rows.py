"""`take_rows(table, ids)`: rows of a table (an embedding) by id, without touching the rest.

XLA:CPU computes 16-bit float ops in float32, so a gather from a bfloat16 table reads a float32
copy of the whole table. Outside loops XLA fuses that copy into the gather and it costs nothing,
but inside a `while` (a drafter's `lax.scan` over draft steps, the decode loop) the copy is loop
invariant and XLA hoists it: 113 MB written for SmolLM2's 49,152 x 576 embedding on every call,
~40 ms, which made an EAGLE head's K = 4 proposal under a bfloat16 target 8x its float32 cost. On
CPU a small kernel copies the rows' bytes instead; float32 tables, other platforms and computations
partitioned over several devices (`specjax.kernels.dispatch`) use plain indexing.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.kernels import build
from specjax.kernels.dispatch import kernel_or_fallback


def _xla(table, ids):
  return table[ids]


def _cpu(table, ids):
  out = jax.ShapeDtypeStruct(ids.shape + table.shape[1:], table.dtype)
  return jax.ffi.ffi_call("specjax_cpu_take_rows", out, vmap_method="sequential")(table, ids)


def take_rows(table: jax.Array, ids: jax.Array) -> jax.Array:
  """table[ids]: [V, ...] table, int ids of any shape -> [*ids.shape, ...] in table's dtype.

  Ids index like `table[ids]`: negative ones count from the end, out-of-range ones are clamped.
  """
  ids = jnp.asarray(ids, jnp.int32)
  if jnp.dtype(table.dtype).itemsize != 2 or not build.load():
    return _xla(table, ids)
  return kernel_or_fallback(_cpu, _xla, table, ids)
