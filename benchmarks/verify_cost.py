"""How much a verify step over k tokens costs relative to one decode step, and AR speed vs memory.

Speculative decoding pays only if scoring k draft tokens in one target pass costs about what
scoring one token costs. For the target model this script measures, on a warm cache of `--context`
tokens, the time of one jitted `forward` over k new tokens per row (logits at all k positions, as a
verify step computes them, the cache donated and updated in place as in the decode loop) for each
k, batch and dtype, and prints each cost relative to k=1 of the same batch and dtype. It also
times greedy batch-1 AR generation with the jitted `specjax.generate.generate` and compares its
decode rate with the rate at which this machine can stream the weights (weight bytes over the
read bandwidth that the script measures on a 512 MiB array: the faster of a jitted sum and a
jitted matrix-vector product).

Timing: every configuration is compiled and warmed first; then `--rounds` rounds each time every k
once, in an order that alternates direction between rounds, so slow drifts on a shared machine hit
all k alike. Ratios are medians over rounds of within-round ratios; the IQR columns give the
25th-75th percentile of those ratios, a direct measure of how noisy the machine was.

`--baseline-model FILE` loads `forward` from another version of `specjax/model.py` (for example
`git show a3ff7d5:specjax/model.py > /tmp/model_before.py`) and times it interleaved with the
current one, call by call, so before/after comparisons see the same machine load; the AR loop is
the same `generate` code traced with the baseline `forward`.

Examples:
  python benchmarks/verify_cost.py                        # full table, random SmolLM2-shaped weights
  python benchmarks/verify_cost.py --quick                # k=1,2,4,8, batch 1, float32, 5 rounds
  python benchmarks/verify_cost.py --model smollm2-135m-instruct --skip-verify
  python benchmarks/verify_cost.py --quick --baseline-model /tmp/model_before.py
  python benchmarks/verify_cost.py --model smollm2-135m-instruct --skip-verify --skip-ar \
    --ar-dtype-race                                       # float32 vs bfloat16 AR, interleaved
  SPECJAX_CPU_KERNELS=0 python benchmarks/verify_cost.py  # the plain-JAX formulation on CPU
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import json
import os
import platform
import sys
import time
import types

import jax
import jax.numpy as jnp
import numpy as np

import specjax.generate
from specjax.config import ModelConfig
from specjax.generate import GenerateConfig, generate
from specjax.kv_cache import KVCache
from specjax.model import forward, init_params

# SmolLM2-135M: the target the project benchmarks against.
SMOLLM2_135M = ModelConfig(
  vocab_size=49152,
  d_model=576,
  n_layers=30,
  n_heads=9,
  n_kv_heads=3,
  head_dim=64,
  ffn_dim=1536,
  rope_theta=100000.0,
  tie_embeddings=True,
  max_position=8192,
)
DEFAULT_KS = (1, 2, 3, 4, 6, 8, 12, 16, 32, 64)


def _sync(x):
  return jax.block_until_ready(x)


def read_bandwidth(nbytes: int = 1 << 29, rounds: int = 9) -> dict[str, float]:
  """Bytes per second at which jitted code reads an `nbytes` float32 array (median of rounds).

  Two readers, interleaved: a full `jnp.sum`, and a matrix-vector product over the array viewed as
  [N, 1024] (`specjax.kernels.linear`: the weight-streaming path itself, on all cores). The larger
  rate is the better estimate of what the memory system delivers.
  """
  from specjax import kernels

  a = _sync(jnp.ones((nbytes // 4,), jnp.float32))
  x = jnp.ones((1, 1024), jnp.float32)
  readers = {
    "sum": jax.jit(jnp.sum),
    "matvec": jax.jit(lambda a, x: kernels.linear(x, a.reshape(-1, 1024))),
  }
  ts = {name: [] for name in readers}
  for name, f in readers.items():
    _sync(f(a) if name == "sum" else f(a, x))
  for _ in range(rounds):
    for name, f in readers.items():
      t = time.perf_counter()
      _sync(f(a) if name == "sum" else f(a, x))
      ts[name].append(time.perf_counter() - t)
  del a
  return {name: nbytes / float(np.median(t)) for name, t in ts.items()}


def weight_bytes(params) -> int:
  """Bytes one forward pass reads: every parameter once (a tied embedding is read as the head)."""
  return sum(int(x.nbytes) for x in jax.tree.leaves(params))


def warm_cache(cfg: ModelConfig, batch: int, context: int, capacity: int, key) -> KVCache:
  """A cache whose first `context` slots per row hold random keys/values (cost ignores values)."""
  shape = (cfg.n_layers, batch, capacity, cfg.n_kv_heads, cfg.head_dim)
  kk, kv = jax.random.split(key)
  k = jax.random.normal(kk, shape, jnp.float32).astype(cfg.jnp_dtype)
  v = jax.random.normal(kv, shape, jnp.float32).astype(cfg.jnp_dtype)
  return KVCache(k, v, jnp.full((batch,), context, jnp.int32))


def load_forward(path: str):
  """`forward` of another version of specjax/model.py (same signature), for before/after runs."""
  spec = importlib.util.spec_from_file_location("specjax_baseline_model", path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # dataclasses look their module up while the file executes
  spec.loader.exec_module(module)
  return module.forward


def make_verify_step(fwd):
  """One verify pass: k new tokens per row, logits at every one of them, cache updated."""

  @functools.partial(jax.jit, static_argnames=("cfg",), donate_argnames=("cache",))
  def step(params, tokens, cache, cfg):
    B, T = tokens.shape
    pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    out = fwd(params, tokens, cache, cfg, logit_positions=pos)
    return out.logits, out.cache

  return step


def make_generate(fwd):
  """`specjax.generate.generate` whose compiled loop calls `fwd` (the real one: itself)."""
  if fwd is forward:
    return generate
  inner = specjax.generate._generate.__wrapped__
  scope = {**inner.__globals__, "forward": fwd}
  swapped = types.FunctionType(inner.__code__, scope, inner.__name__, inner.__defaults__)
  jitted = jax.jit(swapped, static_argnames=("cfg", "gen"))
  outer = generate
  scope = {**outer.__globals__, "_generate": jitted}
  return types.FunctionType(outer.__code__, scope, outer.__name__, outer.__defaults__)


def _spread(r: np.ndarray) -> str:
  lo, mid, hi = np.percentile(r, [25, 50, 75])
  return f"{mid:5.2f} [{lo:4.2f}-{hi:4.2f}]"


def measure_verify(params, cfg, batch, ks, context, rounds, key, impls):
  """{impl: {k: per-round seconds}} for one verify step, impls and ks interleaved per round."""
  capacity = context + max(ks)
  toks = {
    k: jax.random.randint(jax.random.fold_in(key, k), (batch, k), 0, cfg.vocab_size) for k in ks
  }
  steps = {name: make_verify_step(f) for name, f in impls.items()}
  caches = {name: warm_cache(cfg, batch, context, capacity, key) for name in impls}
  lengths = np.full((batch,), context, np.int32)  # the cache (lengths too) is donated every call

  def run(name, k):
    logits, c = steps[name](params, toks[k], caches[name], cfg)
    _sync(logits)
    caches[name] = c.with_lengths(lengths)

  for name in impls:  # compile + warm
    for k in ks:
      run(name, k)
      run(name, k)
  times = {name: {k: [] for k in ks} for name in impls}
  for r in range(rounds):
    for k in ks if r % 2 == 0 else ks[::-1]:
      for name in impls if r % 2 == 0 else list(impls)[::-1]:
        t = time.perf_counter()
        run(name, k)
        times[name][k].append(time.perf_counter() - t)
  return {name: {k: np.asarray(v) for k, v in ts.items()} for name, ts in times.items()}


def measure_ar(params, cfg, new_tokens, prompt_len, rounds, key, impls):
  """Greedy batch-1 AR per impl: seconds for `new_tokens` tokens and per decode step.

  The decode-step time is (T(new_tokens) - T(1)) / (new_tokens - 1), both calls the same compiled
  function (per-row budgets are dynamic), so prefill and dispatch cancel.
  """
  runs = {name: (params, cfg, f) for name, f in impls.items()}
  return measure_ar_runs(runs, new_tokens, prompt_len, rounds, key)


def measure_ar_runs(runs, new_tokens, prompt_len, rounds, key):
  """`measure_ar` for {name: (params, cfg, forward)}, all timed interleaved round by round (e.g.
  the same model in float32 and bfloat16)."""
  vocab = min(cfg.vocab_size for _, cfg, _ in runs.values())
  prompt = jax.random.randint(key, (1, prompt_len), 0, vocab).astype(jnp.int32)
  lens = jnp.asarray([prompt_len], jnp.int32)
  gen = GenerateConfig(max_new_tokens=new_tokens)
  gens = {name: make_generate(f) for name, (_, _, f) in runs.items()}

  def run(name, budget):
    params, cfg, _ = runs[name]
    out = gens[name](params, cfg, prompt, lens, gen, max_new_per_row=jnp.asarray([budget]))
    _sync(out.tokens)
    return int(out.lengths[0])

  for name in runs:  # compile; no stop tokens, so every row runs to its budget
    assert run(name, new_tokens) == new_tokens and run(name, 1) == 1
  full = {name: [] for name in runs}
  one = {name: [] for name in runs}
  for _ in range(rounds):
    for name in runs:
      for budget, acc in ((new_tokens, full), (1, one)):
        t = time.perf_counter()
        run(name, budget)
        acc[name].append(time.perf_counter() - t)
  out = {}
  for name in runs:
    full_s, one_s = float(np.median(full[name])), float(np.median(one[name]))
    out[name] = {
      "total_s": full_s,
      "prefill_s": one_s,
      "step_s": (full_s - one_s) / (new_tokens - 1),
    }
  return out


def _print_verify(t, ks):
  names = list(t)
  head = " | ".join(f"{n} ms | {n} cost/cost(k=1) [IQR]" for n in names)
  print(f"    k | {head}" + (" | after/before" if len(names) > 1 else ""))
  for k in ks:
    cells = [f"{np.median(t[n][k]) * 1e3:8.1f} | {_spread(t[n][k] / t[n][1])}" for n in names]
    row = f"  {k:3d} | " + " | ".join(cells)
    if len(names) > 1:
      row += f" | {_spread(t[names[0]][k] / t[names[1]][k])}"
    print(row)


def _load(model: str | None, dtype: str, key):
  """The named model's weights in `dtype`, or random SmolLM2-135M-shaped ones when model is None."""
  if model:
    from specjax.loading import load_model

    params, cfg, _ = load_model(model, dtype=dtype)
    return params, cfg
  cfg = dataclasses.replace(SMOLLM2_135M, dtype=dtype)
  return init_params(key, cfg), cfg


def main():
  p = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  p.add_argument("--model", default=None, help="registry name, HF dir or .gguf (default: random)")
  p.add_argument("--ks", default=",".join(map(str, DEFAULT_KS)))
  p.add_argument("--batches", default="1,8")
  p.add_argument("--dtypes", default="float32,bfloat16")
  p.add_argument("--context", type=int, default=256)
  p.add_argument("--rounds", type=int, default=9)
  p.add_argument("--ar-tokens", type=int, default=128)
  p.add_argument("--ar-rounds", type=int, default=3)
  p.add_argument("--skip-verify", action="store_true")
  p.add_argument("--skip-ar", action="store_true")
  p.add_argument("--baseline-model", default=None, help="a model.py to time interleaved with ours")
  p.add_argument("--quick", action="store_true", help="k=1,2,4,8, batch 1, float32, 5 rounds")
  p.add_argument(
    "--ar-dtype-race",
    action="store_true",
    help="also time AR in every --dtypes interleaved in one loop (which dtype is faster)",
  )
  p.add_argument("--json", default=None, help="also write the raw results here")
  a = p.parse_args()
  if a.quick:
    a.ks, a.batches, a.dtypes, a.rounds = "1,2,4,8", "1", "float32", 5
  ks = tuple(int(k) for k in a.ks.split(","))
  if ks[0] != 1:
    ks = (1,) + ks
  batches = [int(b) for b in a.batches.split(",")]
  dtypes = a.dtypes.split(",")
  impls = {"after": forward} if a.baseline_model else {"specjax": forward}
  if a.baseline_model:
    impls["before"] = load_forward(a.baseline_model)

  from specjax import kernels

  kernels_on = kernels.kernel_enabled(1) and jax.default_backend() == "cpu"
  print(
    f"# backend {jax.default_backend()} ({platform.processor() or platform.machine()}, "
    f"{os.cpu_count()} cpus); jax {jax.__version__}; CPU kernels: "
    f"{'on' if kernels_on else 'off (' + str(kernels.unavailable_reason()) + ')'}"
  )
  print(f"# load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
  rates = read_bandwidth()
  bw = max(rates.values())
  print(
    "# read bandwidth over 512 MiB: "
    + ", ".join(f"{n} {r / 1e9:.1f} GB/s" for n, r in rates.items())
    + f"; bound uses {bw / 1e9:.1f}"
  )
  key = jax.random.PRNGKey(0)
  results = {"read_bandwidth": rates, "kernels": kernels_on, "verify": {}, "ar": {}}

  for dtype in dtypes:
    params, cfg = _load(a.model, dtype, key)
    wb = weight_bytes(params)
    bound = wb / bw
    print(f"\n## {dtype}: {wb / 1e6:.0f} MB of weights; bandwidth bound {bound * 1e3:.1f} ms/pass")
    if not a.skip_verify:
      for b in batches:
        t = measure_verify(params, cfg, b, ks, a.context, a.rounds, key, impls)
        print(f"batch {b}, context {a.context}, {a.rounds} rounds:")
        _print_verify(t, ks)
        results["verify"][f"{dtype}/b{b}"] = {
          n: {k: v.tolist() for k, v in tn.items()} for n, tn in t.items()
        }
    if not a.skip_ar:
      r = measure_ar(params, cfg, a.ar_tokens, 32, a.ar_rounds, key, impls)
      for name, rn in r.items():
        print(
          f"AR greedy batch 1 [{name}], {a.ar_tokens} new tokens: "
          f"{a.ar_tokens / rn['total_s']:.1f} tok/s end to end; decode step "
          f"{rn['step_s'] * 1e3:.1f} ms = {1 / rn['step_s']:.1f} tok/s = "
          f"{bound / rn['step_s'] * 100:.0f}% of the bandwidth bound ({1 / bound:.1f} tok/s)"
        )
      results["ar"][dtype] = {n: {**rn, "bound_s": bound} for n, rn in r.items()}
    del params
  if a.ar_dtype_race:
    runs = {}
    for dtype in dtypes:
      params, cfg = _load(a.model, dtype, key)
      runs[dtype] = (params, cfg, forward)
    r = measure_ar_runs(runs, a.ar_tokens, 32, a.ar_rounds, key)
    print(f"\nAR greedy batch 1, {a.ar_tokens} new tokens, dtypes interleaved in one loop:")
    for name, rn in r.items():
      print(
        f"  {name}: decode step {rn['step_s'] * 1e3:.1f} ms = {1 / rn['step_s']:.1f} tok/s = "
        f"{weight_bytes(runs[name][0]) / bw / rn['step_s'] * 100:.0f}% of its bandwidth bound"
      )
    results["ar_dtype_race"] = r
  print(f"\n# load average at end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
  if a.json:
    with open(a.json, "w") as f:
      json.dump(results, f, indent=1)


if __name__ == "__main__":
  main()
