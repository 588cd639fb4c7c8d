"""`write_layer(buf, layer, new, starts)`: one layer's new K/V into the stacked cache, in place.

On CPU a small kernel copies each row's new slots into the [L, B, S, ...] buffer, which it aliases:
XLA:CPU computes 16-bit float ops in float32, so a bfloat16 `dynamic_update_slice` into the
stacked cache would convert all of it every layer. Elsewhere (other platforms, or a computation
partitioned over several devices: see `specjax.kernels.dispatch`) it is a scatter of the new
slots. Either way nothing but the new slots is written.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.kernels import build
from specjax.kernels.dispatch import kernel_or_fallback


def _slots(new, starts):
  B, T = new.shape[:2]
  rows = jnp.arange(B, dtype=jnp.int32)[:, None]
  return rows, starts[:, None] + jnp.arange(T, dtype=jnp.int32)[None, :]


def _xla(buf, new, layer, starts):
  rows, slots = _slots(new, starts)
  return buf.at[layer, rows, slots].set(new, mode="promise_in_bounds")


def _cpu(buf, new, layer, starts):
  out = jax.ShapeDtypeStruct(buf.shape, buf.dtype)
  call = jax.ffi.ffi_call(
    "specjax_cpu_cache_write", out, vmap_method="sequential", input_output_aliases={0: 0}
  )
  return call(buf, new, layer, starts)


def write_layer(buf: jax.Array, layer: jax.Array, new: jax.Array, starts: jax.Array) -> jax.Array:
  """buf[layer, b, starts[b] : starts[b] + T] = new[b] for every row b.

  Args:
    buf: [L, B, S, ...] stacked cache.
    layer: int32 scalar.
    new: [B, T, ...] values (cast to buf's dtype).
    starts: [B] int32 first slot per row; the caller guarantees starts[b] + T <= S.

  Returns:
    The updated buffer (in place when the input is donated or loop-carried).
  """
  new = new.astype(buf.dtype)
  layer = jnp.asarray(layer, jnp.int32)
  starts = starts.astype(jnp.int32)
  if not build.load():
    return _xla(buf, new, layer, starts)
  return kernel_or_fallback(_cpu, _xla, buf, new, layer, starts)
