"""How much a verify step over k tokens costs relative to one decode step, and AR speed vs memory.

Speculative decoding pays only if scoring k draft tokens in one target pass costs about what
scoring one token costs. For the target model this script measures, on a warm cache of `--context`
tokens, the time of one jitted `forward` over k new tokens per row (logits at all k positions, as a
verify step computes them, the cache donated and updated in place as in the decode loop) for each
k, batch and dtype, and prints each cost relative to k=1 of the same batch and dtype. It also
times greedy batch-1 AR generation with the jitted `specjax.generate.generate` and compares its
decode rate with the rate at which this machine can stream the weights (weight bytes over the
read bandwidth that the script measures with a jitted reduction over a large array).

Timing: every configuration is compiled and warmed first; then `--rounds` rounds each time every k
once, in an order that alternates direction between rounds, so slow drifts on a shared machine hit
all k alike. Ratios are medians over rounds of within-round ratios; the spread columns give the
25th-75th percentile of those ratios, a direct measure of how noisy the machine was.

Examples:
  python benchmarks/verify_cost.py                        # full table, random SmolLM2-shaped weights
  python benchmarks/verify_cost.py --quick                # k=1,2,4,8, batch 1, float32, 5 rounds
  python benchmarks/verify_cost.py --model smollm2-135m-instruct --skip-verify
  SPECJAX_CPU_KERNELS=0 python benchmarks/verify_cost.py  # the plain-JAX formulation on CPU
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

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


def read_bandwidth(nbytes: int = 1 << 29, rounds: int = 9) -> float:
  """Bytes per second of a jitted float32 sum over an `nbytes` array (median of rounds)."""
  a = _sync(jnp.ones((nbytes // 4,), jnp.float32))
  f = jax.jit(jnp.sum)
  _sync(f(a))
  ts = []
  for _ in range(rounds):
    t = time.perf_counter()
    _sync(f(a))
    ts.append(time.perf_counter() - t)
  del a
  return nbytes / float(np.median(ts))


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


@functools.partial(jax.jit, static_argnames=("cfg",), donate_argnames=("cache",))
def verify_step(params, tokens, cache, cfg):
  """One verify pass: k new tokens per row, logits at every one of them, cache updated."""
  B, T = tokens.shape
  pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
  out = forward(params, tokens, cache, cfg, logit_positions=pos)
  return out.logits, out.cache


def _spread(r: np.ndarray) -> str:
  lo, mid, hi = np.percentile(r, [25, 50, 75])
  return f"{mid:5.2f} [{lo:4.2f}-{hi:4.2f}]"


def measure_verify(params, cfg, batch, ks, context, rounds, key) -> dict[int, np.ndarray]:
  """Per-k arrays of per-round seconds for one verify step."""
  capacity = context + max(ks)
  cache = warm_cache(cfg, batch, context, capacity, key)
  toks = {
    k: jax.random.randint(jax.random.fold_in(key, k), (batch, k), 0, cfg.vocab_size) for k in ks
  }
  lengths = np.asarray(cache.lengths)  # the cache (lengths too) is donated at every call

  def run(k):
    nonlocal cache
    logits, c = verify_step(params, toks[k], cache, cfg)
    _sync(logits)
    cache = c.with_lengths(lengths)

  for k in ks:  # compile + warm
    run(k)
    run(k)
  times = {k: [] for k in ks}
  for r in range(rounds):
    for k in ks if r % 2 == 0 else ks[::-1]:
      t = time.perf_counter()
      run(k)
      times[k].append(time.perf_counter() - t)
  return {k: np.asarray(v) for k, v in times.items()}


def measure_ar(params, cfg, new_tokens, prompt_len, rounds, key) -> dict[str, float]:
  """Greedy batch-1 AR: seconds for `new_tokens` tokens and per decode step (prefill excluded).

  The decode-step time is (T(new_tokens) - T(1)) / (new_tokens - 1), both calls the same compiled
  function (per-row budgets are dynamic), so prefill and dispatch cancel.
  """
  prompt = jax.random.randint(key, (1, prompt_len), 0, cfg.vocab_size).astype(jnp.int32)
  lens = jnp.asarray([prompt_len], jnp.int32)
  gen = GenerateConfig(max_new_tokens=new_tokens)

  def run(budget):
    out = generate(params, cfg, prompt, lens, gen, max_new_per_row=jnp.asarray([budget]))
    _sync(out.tokens)
    return int(out.lengths[0])

  assert run(new_tokens) == new_tokens and run(1) == 1  # compile; no stop tokens, so full length
  full, one = [], []
  for _ in range(rounds):
    for budget, acc in ((new_tokens, full), (1, one)):
      t = time.perf_counter()
      run(budget)
      acc.append(time.perf_counter() - t)
  full_s, one_s = float(np.median(full)), float(np.median(one))
  step = (full_s - one_s) / (new_tokens - 1)
  return {"total_s": full_s, "prefill_s": one_s, "step_s": step}


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
  p.add_argument("--quick", action="store_true", help="k=1,2,4,8, batch 1, float32, 5 rounds")
  p.add_argument("--json", default=None, help="also write the raw results here")
  a = p.parse_args()
  if a.quick:
    a.ks, a.batches, a.dtypes, a.rounds = "1,2,4,8", "1", "float32", 5
  ks = tuple(int(k) for k in a.ks.split(","))
  if ks[0] != 1:
    ks = (1,) + ks
  batches = [int(b) for b in a.batches.split(",")]
  dtypes = a.dtypes.split(",")

  from specjax import kernels

  kernels_on = kernels.kernel_enabled(1) and jax.default_backend() == "cpu"
  print(
    f"# backend {jax.default_backend()} ({platform.processor() or platform.machine()}, "
    f"{os.cpu_count()} cpus); jax {jax.__version__}; CPU kernels: "
    f"{'on' if kernels_on else 'off (' + str(kernels.unavailable_reason()) + ')'}"
  )
  bw = read_bandwidth()
  print(f"# read bandwidth (jitted sum over 512 MiB): {bw / 1e9:.1f} GB/s")
  key = jax.random.PRNGKey(0)
  results = {"read_bandwidth": bw, "kernels": kernels_on, "verify": {}, "ar": {}}

  for dtype in dtypes:
    if a.model:
      from specjax.loading import load_model

      params, cfg, _ = load_model(a.model, dtype=dtype)
    else:
      cfg = dataclasses.replace(SMOLLM2_135M, dtype=dtype)
      params = init_params(key, cfg)
    wb = weight_bytes(params)
    print(
      f"\n## {dtype}: {wb / 1e6:.0f} MB of weights; bandwidth bound {wb / bw * 1e3:.1f} ms/pass"
    )
    if not a.skip_verify:
      for b in batches:
        t = measure_verify(params, cfg, b, ks, a.context, a.rounds, key)
        base = t[1]
        print(f"batch {b}: k | median ms | cost / cost(k=1) median [IQR]")
        for k in ks:
          print(f"  {k:3d} | {np.median(t[k]) * 1e3:8.1f} | {_spread(t[k] / base)}")
        results["verify"][f"{dtype}/b{b}"] = {k: v.tolist() for k, v in t.items()}
    if not a.skip_ar:
      r = measure_ar(params, cfg, a.ar_tokens, 32, a.ar_rounds, key)
      bound = wb / bw
      print(
        f"AR greedy batch 1, {a.ar_tokens} new tokens: {a.ar_tokens / r['total_s']:.1f} tok/s "
        f"end to end; decode step {r['step_s'] * 1e3:.1f} ms = {1 / r['step_s']:.1f} tok/s "
        f"= {bound / r['step_s'] * 100:.0f}% of the bandwidth bound ({1 / bound:.1f} tok/s)"
      )
      results["ar"][dtype] = {**r, "bound_s": bound}
    del params
  if a.json:
    with open(a.json, "w") as f:
      json.dump(results, f, indent=1)


if __name__ == "__main__":
  main()
