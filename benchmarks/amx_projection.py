"""AMX tiles against AVX512-BF16 `vdpbf16ps` for bfloat16 projections, alternated in one process.

The bfloat16 projection kernel (`specjax/kernels/cpu_linear.cc`) takes the tile path when its
`amx` attribute is 1 (`projection.amx_enabled()` decides it per process). This script calls the
kernel directly with amx = 0 and amx = 1 on SmolLM2-135M's projection shapes (the 49,152-row LM
head, and 30 stacked layers of the MLP's up and down projections, one call per layer in a
`fori_loop` so that the weights stream from memory as in a decode step), for M rows of x: M = 1 is
a decode step, M = K + 1 a verify pass over K drafts. The two paths alternate call by call, in an
order that flips every round, so drifts of a shared machine hit both; each cell is the median
time, and the ratio is AMX over vector (below 1: tiles faster).

Needs a CPU with AMX-BF16 and the Linux tile permission (`specjax.kernels.amx_available()`).

  python benchmarks/amx_projection.py
  python benchmarks/amx_projection.py --rows=1,4,8 --rounds=20
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from specjax.kernels import amx, build

LAYERS = 30
SHAPES = {"lm_head": (1, 49152, 576), "up": (LAYERS, 1536, 576), "down": (LAYERS, 576, 1536)}


def _kernel(x, w, layer, tiles: int):
  out = jax.ShapeDtypeStruct(x.shape[:-1] + (w.shape[-2],), jnp.float32)
  call = jax.ffi.ffi_call("specjax_cpu_linear", out, vmap_method="sequential")
  return call(x, layer, w, max_threads=np.int64(0), epilogue=np.int64(0), amx=np.int64(tiles))


def _all_layers(tiles: int):
  """One jitted pass over every layer of a stacked weight (a scalar result, to keep it cheap)."""

  @jax.jit
  def run(x, w):
    def body(i, acc):
      return acc + _kernel(x, w, i.reshape(()), tiles)[:, :8].sum()

    return jax.lax.fori_loop(0, w.shape[0], body, jnp.float32(0))

  return run


def interleaved_medians(fns, args, rounds: int) -> list[float]:
  """Median seconds of each compiled fn(*args), the fns called in turn, order flipped each round."""
  for fn in fns:
    jax.block_until_ready(fn(*args))  # compile and warm
  times = [[] for _ in fns]
  for r in range(rounds):
    order = range(len(fns)) if r % 2 == 0 else reversed(range(len(fns)))
    for i in order:
      t0 = time.perf_counter()
      jax.block_until_ready(fns[i](*args))
      times[i].append(time.perf_counter() - t0)
  return [float(np.median(t)) for t in times]


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--rows", default="1,2,4,8,16", help="rows of x (M) per call")
  p.add_argument("--rounds", type=int, default=12)
  args = p.parse_args()
  if not build.load():
    raise SystemExit(f"CPU kernels unavailable: {build.unavailable_reason()}")
  ok, why = amx.amx_available()
  if not ok:
    raise SystemExit(f"no AMX in this process: {why}")
  rows = [int(r) for r in args.rows.split(",")]
  rng = np.random.default_rng(0)
  print(f"# load average at start: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
  print("| weights | M | vector ms | AMX ms | AMX / vector |")
  print("|---|---:|---:|---:|---:|")
  for name, (layers, n, k) in SHAPES.items():
    w = jnp.asarray(rng.standard_normal((layers, n, k)) * 0.05, jnp.bfloat16)
    for m in rows:
      x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
      fns = [_all_layers(0), _all_layers(1)]
      t_vec, t_amx = interleaved_medians(fns, (x, w), args.rounds)
      print(f"| {name} {layers}x{n}x{k} | {m} | {1e3 * t_vec:.2f} | {1e3 * t_amx:.2f} "
            f"| {t_amx / t_vec:.2f} |")  # fmt: skip
  print(f"# load average at end: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")


if __name__ == "__main__":
  main()
