"""Projections x @ w[layer].T with a weight-streaming C++ kernel on CPU and plain JAX elsewhere.

On XLA:CPU a dot with a handful of rows (a decode step, a verify step over K+1 tokens) packs the
weight matrix before multiplying, which costs more memory traffic than the multiply, and a weight
sliced out of a stacked [L, N, D] array inside `lax.scan` is copied before every layer. The kernel
reads the chosen layer's [N, D] weights in place, each row once, against all rows of x, and can
serve several projections of the same x (Q/K/V, or gate/up with the SwiGLU product) in one call.
Other backends, computations partitioned over several devices, and row counts where a packed GEMM
wins use `einsum`; the choice is made at lowering time (`specjax.kernels.dispatch`), so one jitted
function serves every backend and mesh.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax.kernels import amx, build
from specjax.kernels.dispatch import kernel_or_fallback

# Rows of x up to which the kernel beats XLA's GEMM on CPU (measured: benchmarks/RESULTS.md).
MAX_KERNEL_ROWS = 64
# Threads per kernel call (0: XLA's intra-op pool size); for experiments on shared machines.
MAX_THREADS = int(os.environ.get("SPECJAX_KERNEL_THREADS", "0"))
# AMX tiles for bfloat16 x and weights where the CPU has them; SPECJAX_AMX=0 keeps `vdpbf16ps`.
USE_AMX = os.environ.get("SPECJAX_AMX", "1") != "0"

_NONE, _SWIGLU = 0, 1


def _pick(w: jax.Array, layer: jax.Array | None) -> jax.Array:
  return w if layer is None else w[layer]


def _xla(x, ws, layer, epilogue):
  ys = [
    jnp.einsum("...d,nd->...n", x, _pick(w, layer), preferred_element_type=jnp.float32) for w in ws
  ]
  if epilogue == _SWIGLU:
    return jax.nn.silu(ys[0]) * ys[1]
  return jnp.concatenate(ys, -1) if len(ys) > 1 else ys[0]


def _call(x, ws, layer, epilogue):
  n = ws[0].shape[-2] if epilogue == _SWIGLU else sum(w.shape[-2] for w in ws)
  out = jax.ShapeDtypeStruct(x.shape[:-1] + (n,), jnp.float32)
  call = jax.ffi.ffi_call("specjax_cpu_linear", out, vmap_method="sequential")
  bf16 = x.dtype == jnp.bfloat16 and all(w.dtype == jnp.bfloat16 for w in ws)
  return call(
    x if bf16 else x.astype(jnp.float32),
    layer,
    *ws,
    max_threads=np.int64(MAX_THREADS),
    epilogue=np.int64(epilogue),
    amx=np.int64(bf16 and amx_enabled()),
  )


def amx_enabled() -> bool:
  """Whether bfloat16 projections use AMX tiles in this process: the CPU, the OS and the Linux
  permission allow them (`amx.amx_available`), the kernels were built with them, and `SPECJAX_AMX`
  is not "0". Fixed per process: a verify pass and a decode step must take the same path to give
  the same bits."""
  return USE_AMX and amx.amx_available()[0] and build.library().SpecjaxLinearHasAmx() == 1


def kernel_enabled(rows: int) -> bool:
  """Whether the projections lower to the kernel on CPU for x with `rows` rows (static)."""
  return rows <= MAX_KERNEL_ROWS and build.load()


def _project(x, ws, layer, epilogue):
  usable = all(w.dtype in (jnp.float32, jnp.bfloat16) for w in ws)
  if not usable or not kernel_enabled(x.size // x.shape[-1]):
    return _xla(x, ws, layer, epilogue)
  idx = jnp.zeros((), jnp.int32) if layer is None else jnp.asarray(layer, jnp.int32)
  stacked = layer is not None

  def cpu(x, i, *ws):
    return _call(x, ws, i, epilogue)

  def default(x, i, *ws):
    return _xla(x, ws, i if stacked else None, epilogue)

  return kernel_or_fallback(cpu, default, x, idx, *ws)


def linear(x: jax.Array, w: jax.Array, layer: jax.Array | None = None) -> jax.Array:
  """Returns x @ w[layer].T (or x @ w.T when `layer` is None) in float32.

  Args:
    x: [..., D] activations (any float dtype).
    w: [N, D], or [L, N, D] with `layer` picking one (read in place on CPU).
    layer: int32 scalar index into a stacked w.

  Returns:
    [..., N] float32.
  """
  return _project(x, (w,), layer, _NONE)


def linear_multi(
  x: jax.Array, ws: Sequence[jax.Array], layer: jax.Array | None = None
) -> tuple[jax.Array, ...]:
  """`linear` of one x against several weights (e.g. Q, K, V) in one pass; float32 outputs."""
  y = _project(x, tuple(ws), layer, _NONE)
  cuts = np.cumsum([w.shape[-2] for w in ws])[:-1]
  return tuple(jnp.split(y, cuts, axis=-1))


def swiglu(x: jax.Array, w_gate: jax.Array, w_up: jax.Array, layer: jax.Array | None = None):
  """silu(x @ w_gate[layer].T) * (x @ w_up[layer].T) in float32, fused on CPU."""
  return _project(x, (w_gate, w_up), layer, _SWIGLU)
