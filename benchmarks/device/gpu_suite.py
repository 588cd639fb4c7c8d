"""Accelerator suite: verify cost curve, AR step against the bandwidth bound, decode-loop overhead.

For a SmolLM2-135M-shaped and a Llama-3-8B-shaped model with random bfloat16 weights (cost does not
depend on the values, so nothing is loaded or carried), on whatever device JAX runs on:

  bandwidth  bytes/s of a large device copy (read + write) and of a full reduction (read); the
             bound uses the faster, and the report also compares with the device's stated peak.
  verify     a `forward` over k new tokens per row on a cache holding `context` tokens, logits
             at all k positions, for every k and batch: milliseconds per pass and
             cost(k) / cost(1). A pass is timed inside one compiled loop of n passes (each
             feeding its greedy tokens to the next, the cache fill reset), as
             (T(n) - T(1)) / (n - 1): device time, without the per-call dispatch that
             dominates a small model's step on a fast device.
  ar         the decode step at batch 1: that pass at k = 1; the per-token step of the compiled
             `specjax.generate.generate` loop, (T(N) - T(1)) / (N - 1); one jitted call from
             Python; against the bound (weights read once + the cache read) / bandwidth.
  loop       time per iteration of the speculative `lax.while_loop` with trivial drafters (a
             constant drafter; prompt lookup), (T(N) - T(1)) / passes, against the bare verify
             pass over K + 1 tokens on a cache of the same capacity and average fill.

Each T is a median over `rounds` calls, each ended with `jax.block_until_ready`, after compiling
and warming. What is still to run when `--budget-s` is spent is skipped and listed.

Only jax, numpy and specjax's core modules are imported (no ml_collections, no gguf). The CPU
kernels are switched off on accelerators (XLA handles them); `--tiny` runs tiny shapes anywhere
(the CPU test in tests/test_device_suite.py).

Examples:
  python benchmarks/device/gpu_suite.py --out /tmp/suite          # H200: meant to take < 8 min
  python benchmarks/device/gpu_suite.py --tiny --out /tmp/suite   # CPU: 10-30 s
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repo root, for specjax

from specjax.config import ModelConfig  # noqa: E402
from specjax.drafters.base import Proposal  # noqa: E402
from specjax.drafters.prompt_lookup import PromptLookupDrafter  # noqa: E402
from specjax.generate import GenerateConfig, generate  # noqa: E402
from specjax.kv_cache import KVCache  # noqa: E402
from specjax.model import forward, init_params  # noqa: E402
from specjax.speculative import speculative_generate  # noqa: E402

SHAPES = {
  "smollm2-135m": ModelConfig(
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
    dtype="bfloat16",
  ),
  "llama3-8b": ModelConfig(
    vocab_size=128256,
    d_model=4096,
    n_layers=32,
    n_heads=32,
    n_kv_heads=8,
    head_dim=128,
    ffn_dim=14336,
    rope_theta=500000.0,
    norm_eps=1e-5,
    max_position=8192,
    dtype="bfloat16",
  ),
}
TINY_SHAPES = {
  "tiny-smollm2": ModelConfig(
    vocab_size=256,
    d_model=64,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    head_dim=16,
    ffn_dim=128,
    tie_embeddings=True,
    dtype="bfloat16",
  ),
  "tiny-llama": ModelConfig(
    vocab_size=320,
    d_model=96,
    n_layers=2,
    n_heads=6,
    n_kv_heads=2,
    head_dim=16,
    ffn_dim=160,
    dtype="bfloat16",
  ),
}
# Stated HBM bandwidth of the devices this suite is meant for (bytes/s), by `device_kind` prefix.
STATED_PEAK = {"NVIDIA H200": 4.8e12, "NVIDIA H100": 3.35e12}


@dataclasses.dataclass(frozen=True)
class Settings:
  """What one run measures (the full default and the `--tiny` variant)."""

  ks: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
  batches: tuple[int, ...] = (1, 8, 32)
  context: int = 512
  rounds: int = 7
  passes: int = 10
  ar_tokens: int = 64
  loop_k: int = 4
  loop_prompt: int = 64
  loop_tokens: int = 64
  bandwidth_bytes: int = 4 << 30


TINY = Settings(
  ks=(1, 2, 4),
  batches=(1, 2),
  context=16,
  rounds=3,
  passes=8,
  ar_tokens=24,
  loop_k=2,
  loop_prompt=8,
  loop_tokens=16,
  bandwidth_bytes=16 << 20,
)


@dataclasses.dataclass(frozen=True)
class ConstantDrafter:
  """Proposes `k` copies of one token and keeps no state: the decode loop's cost with no drafter."""

  k: int = 4
  token: int = 0
  hidden_layers: tuple[int, ...] = ()

  def capacity_slack(self) -> int:
    return 0

  def init(self, params, prefill, prompts, prompt_lens, capacity):
    del params, prefill, prompts, prompt_lens, capacity
    return ()

  def propose(self, params, state, seq, seq_len, key, sampling) -> Proposal:
    del params, seq_len, key, sampling
    B = seq.shape[0]
    tokens = jnp.full((B, self.k), self.token, jnp.int32)
    return Proposal(tokens, None, jnp.full((B,), self.k, jnp.int32), state)

  def commit(self, params, state, seq, seq_len, step):
    return state

  def reorder(self, state, rows):
    return state


class Clock:
  """Wall time since the start, the budget left, and what was skipped for lack of it."""

  def __init__(self, budget_s: float):
    self.start, self.budget_s, self.skipped = time.perf_counter(), budget_s, []

  def elapsed(self) -> float:
    return time.perf_counter() - self.start

  def allows(self, item: str) -> bool:
    if self.elapsed() < self.budget_s:
      return True
    self.skipped.append(item)
    log(f"skip {item}: time budget of {self.budget_s:.0f} s spent")
    return False


def log(msg: str) -> None:
  print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def coarse_first(ks: tuple[int, ...]) -> tuple[int, ...]:
  """The ks in the order to time them: 1 and the powers of two first, so that a run cut short by
  its time budget still spans the whole range; then the rest."""
  powers = [k for k in ks if k & (k - 1) == 0]
  return tuple(powers + [k for k in ks if k not in powers])


def median_s(f, rounds: int) -> float:
  """Median wall seconds of `rounds` calls of f(), each synchronised with the device."""
  ts = []
  for _ in range(rounds):
    t = time.perf_counter()
    jax.block_until_ready(f())
    ts.append(time.perf_counter() - t)
  return float(np.median(ts))


def bandwidth(nbytes: int, rounds: int) -> dict[str, float]:
  """Bytes/s of a device copy (x + 1: reads and writes nbytes) and of a full sum (reads them)."""
  x = jax.block_until_ready(jnp.ones((nbytes // 2,), jnp.bfloat16))
  copy = jax.jit(lambda x: x + 1)
  total = jax.jit(lambda x: jnp.sum(x, dtype=jnp.float32))
  jax.block_until_ready((copy(x), total(x)))
  out = {
    "copy": 2 * nbytes / median_s(lambda: copy(x), rounds),
    "read": nbytes / median_s(lambda: total(x), rounds),
  }
  return out


def stated_peak(device_kind: str) -> float | None:
  return next((v for k, v in STATED_PEAK.items() if device_kind.startswith(k)), None)


def weight_bytes_per_step(params) -> int:
  """Bytes of weights one decode step reads: all, less an untied embedding (only rows gathered)."""
  total = sum(int(x.nbytes) for x in jax.tree.leaves(params))
  return total - (int(params.embed.nbytes) if params.lm_head is not None else 0)


def cache_bytes(cfg: ModelConfig, batch: int, slots: int) -> int:
  """Bytes of keys and values in `slots` cache slots of every layer and row."""
  per_slot = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * jnp.dtype(cfg.jnp_dtype).itemsize
  return batch * slots * per_slot


def filled_cache(cfg: ModelConfig, batch: int, context: int, capacity: int) -> KVCache:
  """A cache of `capacity` slots per row, `context` of them counted as filled.

  The values do not change the cost (nothing in the forward depends on them but the results), so
  they are a constant: cheaper to make than random ones, which need a compiled RNG per shape.
  """
  shape = (cfg.n_layers, batch, capacity, cfg.n_kv_heads, cfg.head_dim)
  k = jnp.full(shape, 0.5, cfg.jnp_dtype)
  return KVCache(k, k + 0, jnp.full((batch,), context, jnp.int32))


def random_tokens(cfg: ModelConfig, shape: tuple[int, ...], seed: int) -> jax.Array:
  """Random token ids drawn on the host (no compiled RNG)."""
  return jnp.asarray(np.random.default_rng(seed).integers(0, cfg.vocab_size, shape), jnp.int32)


@functools.partial(jax.jit, static_argnames=("cfg",), donate_argnames=("cache",))
def verify_step(params, tokens, cache, cfg):
  """One verify pass: k new tokens per row, logits at every one, the cache updated in place."""
  B, T = tokens.shape
  pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
  out = forward(params, tokens, cache, cfg, logit_positions=pos)
  return out.logits, out.cache


@functools.partial(jax.jit, static_argnames=("cfg",), donate_argnames=("cache",))
def verify_passes(params, tokens, cache, n, cfg):
  """`n` verify passes in one compiled loop, each on the cache as given (its fill reset every pass).

  Each pass's greedy tokens feed the next, as in decoding, so the logits are used and the passes
  run in order. One compiled loop serves every n (it is traced), so the difference between two
  n is device time per pass, free of the per-call dispatch that a Python loop would add.
  """
  B, T = tokens.shape
  pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
  fill = cache.lengths

  def body(_, carry):
    toks, c = carry
    out = forward(params, toks, c, cfg, logit_positions=pos)
    return jnp.argmax(out.logits, -1).astype(jnp.int32), out.cache.with_lengths(fill)

  return jax.lax.fori_loop(0, n, body, (tokens, cache))


def time_passes(params, cfg, batch, ks, context, capacity, s: "Settings", allows=None):
  """{k: seconds per verify pass} on a cache holding `context` tokens, from (T(n) - T(1)) / (n - 1).

  `allows(k)` is asked before each k; the ks after a refusal are left out.
  """
  state = {"cache": filled_cache(cfg, batch, context, capacity)}
  out = {}
  for k in ks:
    if allows is not None and not allows(k):
      break
    toks = random_tokens(cfg, (batch, k), k)

    def run(n, toks=toks):
      last, state["cache"] = verify_passes(params, toks, state["cache"], n, cfg)
      return last

    jax.block_until_ready(run(1))  # compile + warm
    t_n, t_1 = median_s(lambda: run(s.passes), s.rounds), median_s(lambda: run(1), s.rounds)
    out[k] = max(t_n - t_1, 0.0) / (s.passes - 1)
  return out


def time_calls(params, cfg, batch, k, context, capacity, rounds) -> float:
  """Median seconds of one `verify_step` call from Python (device time plus dispatch)."""
  state = {"cache": filled_cache(cfg, batch, context, capacity)}
  lengths = np.full((batch,), context, np.int32)  # host copy: the lengths are donated too
  toks = random_tokens(cfg, (batch, k), 0)

  def run():
    logits, cache = verify_step(params, toks, state["cache"], cfg)
    state["cache"] = cache.with_lengths(lengths)  # donated: keep the new one, reset its fill
    return logits

  jax.block_until_ready(run())  # compile + warm
  return median_s(run, rounds)


def time_loop(run, rounds: int, tokens: int) -> dict[str, float]:
  """Per-iteration seconds of a decode loop: run(budget) -> (output, passes) for budgets N and 1."""
  _, passes = run(tokens)  # compile (budgets are dynamic: one compiled loop serves both)
  run(1)
  t_full = median_s(lambda: run(tokens)[0], rounds)
  t_one = median_s(lambda: run(1)[0], rounds)
  return {
    "total_s": t_full,
    "prefill_s": t_one,
    "passes": passes,
    "step_s": max(t_full - t_one, 0.0) / max(passes, 1),
  }


def measure_ar(params, cfg, s: Settings) -> dict[str, float]:
  """The compiled AR loop's per-token step at batch 1 (prompt of `context` tokens)."""
  prompt = random_tokens(cfg, (1, s.context), 1)
  lens = jnp.asarray([s.context], jnp.int32)
  gen = GenerateConfig(max_new_tokens=s.ar_tokens)

  def run(budget):
    out = generate(params, cfg, prompt, lens, gen, max_new_per_row=jnp.asarray([budget]))
    return out.tokens, int(jax.device_get(out.target_passes)[0])

  return time_loop(run, s.rounds, s.ar_tokens)


def measure_loop(params, cfg, s: Settings) -> dict:
  """Speculative-loop iteration time with trivial drafters vs the bare verify forward (batch 1)."""
  K = s.loop_k
  prompt = random_tokens(cfg, (1, s.loop_prompt), 2)
  lens = jnp.asarray([s.loop_prompt], jnp.int32)
  gen = GenerateConfig(max_new_tokens=s.loop_tokens)
  capacity = s.loop_prompt + s.loop_tokens + K + 1  # what the loop allocates
  fill = s.loop_prompt + s.loop_tokens // 2  # the loop's average cache fill
  bare = time_passes(params, cfg, 1, (K + 1,), fill, capacity, s)[K + 1]
  out = {"k": K, "bare_forward_s": bare, "drafters": {}}
  for name, drafter in (
    ("constant", ConstantDrafter(K)),
    ("prompt_lookup", PromptLookupDrafter(K)),
  ):

    def run(budget, drafter=drafter):
      o = speculative_generate(
        params, cfg, drafter, (), prompt, lens, gen, max_new_per_row=jnp.asarray([budget])
      )
      return o.tokens, int(jax.device_get(o.metrics.target_passes)[0])

    r = time_loop(run, s.rounds, s.loop_tokens)
    r["overhead_s"] = r["step_s"] - bare
    r["overhead_frac"] = r["overhead_s"] / max(bare, 1e-12)
    out["drafters"][name] = r
    log(
      f"  loop [{name}] K={K}: {r['step_s'] * 1e3:.3f} ms/iteration ({r['passes']} passes) vs "
      f"bare forward {bare * 1e3:.3f} ms: overhead {r['overhead_frac'] * 100:+.1f}%"
    )
  return out


def run_model(name: str, cfg: ModelConfig, s: Settings, bw: float, clock: Clock, key) -> dict:
  """Everything measured for one model shape."""
  params = jax.block_until_ready(jax.jit(init_params, static_argnums=1)(key, cfg))
  wbytes = weight_bytes_per_step(params)
  res = {"config": dataclasses.asdict(cfg), "weight_bytes_per_step": wbytes, "verify": {}}
  log(f"{name}: {cfg.num_params() / 1e6:.0f}M parameters, {wbytes / 1e9:.2f} GB read per step")
  if clock.allows(f"{name}/ar"):
    ar = measure_ar(params, cfg, s)
    fwd = time_passes(params, cfg, 1, (1,), s.context, s.context + s.ar_tokens, s)[1]
    call = time_calls(params, cfg, 1, 1, s.context, s.context + s.ar_tokens, s.rounds)
    bound = (wbytes + cache_bytes(cfg, 1, s.context + s.ar_tokens)) / bw
    ar.update(
      forward_s=fwd,
      call_s=call,
      bound_s=bound,
      forward_of_bound=bound / max(fwd, 1e-12),
      loop_of_bound=bound / max(ar["step_s"], 1e-12),
    )
    res["ar"] = ar
    log(
      f"  AR step: forward {fwd * 1e3:.3f} ms ({ar['forward_of_bound'] * 100:.0f}% of the bound "
      f"{bound * 1e3:.3f} ms), in the generate loop {ar['step_s'] * 1e3:.3f} ms, one call from "
      f"Python {call * 1e3:.3f} ms"
    )
  if clock.allows(f"{name}/loop"):
    res["loop"] = measure_loop(params, cfg, s)
  for b in s.batches:
    if not clock.allows(f"{name}/verify/b{b}"):
      continue
    capacity = s.context + max(s.ks)
    allows = functools.partial(lambda b, k: clock.allows(f"{name}/verify/b{b}/k{k}"), b)
    t = time_passes(params, cfg, b, coarse_first(s.ks), s.context, capacity, s, allows)
    ks = sorted(t)
    if not ks:
      continue
    res["verify"][f"b{b}"] = {
      "k": ks,
      "ms": [t[k] * 1e3 for k in ks],
      "ratio": [t[k] / max(t[ks[0]], 1e-12) for k in ks],
      "tokens_per_s": [b * k / max(t[k], 1e-12) for k in ks],
    }
    log(f"  verify b{b}: " + " ".join(f"k{k} {t[k] * 1e3:.3f} ms" for k in ks))
  del params
  return res


def markdown(report: dict) -> str:
  """The report as Markdown tables."""
  m, bw = report["meta"], report["bandwidth"]
  peak = bw["stated_peak"]
  lines = [
    f"# Device suite: {m['device_kind']} ({m['backend']}), jax {m['jax_version']}",
    "",
    f"{m['date']}; wall time {m['wall_s']:.0f} s; settings: {m['settings']}.",
    "",
    f"Bandwidth: copy {bw['copy'] / 1e9:.0f} GB/s, read {bw['read'] / 1e9:.0f} GB/s; the bound "
    f"uses {bw['bound'] / 1e9:.0f} GB/s"
    + (f" (stated peak {peak / 1e9:.0f} GB/s: {bw['bound'] / peak * 100:.0f}%)." if peak else "."),
  ]
  if m["skipped"]:
    lines += ["", f"Skipped for lack of time: {', '.join(m['skipped'])}."]
  for name, r in report["models"].items():
    lines += ["", f"## {name}: {r['weight_bytes_per_step'] / 1e9:.2f} GB of weights per step", ""]
    if "ar" in r:
      a = r["ar"]
      lines += [
        "| AR step (batch 1) | ms | of the bound |",
        "|---|---|---|",
        f"| bandwidth bound | {a['bound_s'] * 1e3:.3f} | 100% |",
        f"| forward, k = 1 | {a['forward_s'] * 1e3:.3f} | {a['forward_of_bound'] * 100:.0f}% |",
        f"| one call from Python (+ dispatch) | {a['call_s'] * 1e3:.3f} | "
        f"{a['bound_s'] / a['call_s'] * 100:.0f}% |",
        f"| `generate` loop step | {a['step_s'] * 1e3:.3f} | {a['loop_of_bound'] * 100:.0f}% |",
        "",
      ]
    if "loop" in r:
      lp = r["loop"]
      lines += [
        f"Speculative loop, K = {lp['k']}, batch 1: bare forward over K + 1 tokens "
        f"{lp['bare_forward_s'] * 1e3:.3f} ms.",
        "",
        "| drafter | ms / iteration | passes | overhead |",
        "|---|---|---|---|",
      ]
      for dn, d in lp["drafters"].items():
        lines.append(
          f"| {dn} | {d['step_s'] * 1e3:.3f} | {d['passes']} | "
          f"{d['overhead_s'] * 1e3:+.3f} ms ({d['overhead_frac'] * 100:+.0f}%) |"
        )
      lines.append("")
    if r["verify"]:
      batches = list(r["verify"])
      ks = r["verify"][batches[0]]["k"]
      lines += [
        "| k | " + " | ".join(f"{b} ms | {b} cost/cost(1)" for b in batches) + " |",
        "|---" * (1 + 2 * len(batches)) + "|",
      ]
      for i, k in enumerate(ks):
        cells = [
          f"{r['verify'][b]['ms'][i]:.3f} | {r['verify'][b]['ratio'][i]:.2f}" for b in batches
        ]
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
  p = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  p.add_argument("--out", required=True, help="directory for report.json and report.md")
  p.add_argument("--tiny", action="store_true", help="tiny shapes and settings (CPU test)")
  p.add_argument("--models", default=None, help="comma-separated subset of the shapes")
  p.add_argument("--budget-s", type=float, default=420.0, help="skip what is left after this")
  a = p.parse_args(argv)
  clock = Clock(a.budget_s)
  backend = jax.default_backend()
  if backend != "cpu":
    os.environ["SPECJAX_CPU_KERNELS"] = "0"  # never build the CPU kernels for an accelerator run
  s, shapes = (TINY, TINY_SHAPES) if a.tiny else (Settings(), SHAPES)
  if a.models:
    shapes = {n: shapes[n] for n in a.models.split(",")}
  kind = jax.devices()[0].device_kind
  log(f"backend {backend}, device {kind} x{jax.device_count()}, jax {jax.__version__}")
  bw = bandwidth(s.bandwidth_bytes, s.rounds)
  peak = stated_peak(kind)
  bw.update(bound=max(bw.values()), stated_peak=peak)
  log(f"bandwidth: copy {bw['copy'] / 1e9:.0f} GB/s, read {bw['read'] / 1e9:.0f} GB/s")
  key = jax.random.PRNGKey(0)
  models = {n: run_model(n, cfg, s, bw["bound"], clock, key) for n, cfg in shapes.items()}
  meta = {
    "backend": backend,
    "device_kind": kind,
    "jax_version": jax.__version__,
    "tiny": a.tiny,
    "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    "wall_s": clock.elapsed(),
    "skipped": clock.skipped,
    "settings": dataclasses.asdict(s),
  }
  report = {"meta": meta, "bandwidth": bw, "models": models}
  out = pathlib.Path(a.out)
  out.mkdir(parents=True, exist_ok=True)
  (out / "report.json").write_text(json.dumps(report, indent=1))
  (out / "report.md").write_text(markdown(report))
  log(f"wrote {out / 'report.json'} and {out / 'report.md'} after {clock.elapsed():.0f} s")
  return report


if __name__ == "__main__":
  main()
