"""Throughput against batch size: AR vs chain speculation vs SMC-SD, and the K policy, on CPU.

SmolLM2-135M-Instruct (Q4_1, dequantized, float32), the first Spec-Bench first turns (round-robin
over categories) whose chat prompt fits one 64-token bucket, no stop tokens (every row generates
exactly --max_new_tokens, so all methods do the same work per row). For each batch size B:

  AR            greedy autoregressive decoding;
  PL            chain speculation with prompt lookup, K = --k, greedy;
  DM            chain speculation with a 4-layer draft (the target's first layers, its own final
                norm and head: `params.layers` sliced, `cfg.replace(n_layers=4)`), K = --k, greedy;
  SMC           SMC-SD with the same draft, gamma = --k, B requests x --n_particles particles
                (draft temperature 0.7, target temperature 1; throughput counts one particle per
                request, so it is not a like-for-like comparison of outputs with greedy AR);
  <drafter>     with --drafter: that shipped drafter (e.g. eagle3-smollm2-135m, bfloat16 matrices),
                K = --k, greedy;
  adaptive      with --adaptive_ks: PL, DM and the shipped drafter choosing K per step in the loop
                (`specjax.adaptive`) among those K, from a cost table `measure_costs` times at that
                batch size first (not counted in the decode time); where that table makes the
                loop never draft (`adp.never_drafts`), the run is the plain AR loop;
  policy PL/DM  `specjax.k_policy`: K in [0, --k] from the acceptance measured in that batch's K run
                (alpha solving E(alpha, K) = tokens per pass) and the measured costs at that batch
                (verify(0) = an AR step, verify(K) = a PL pass, interpolated linearly; draft cost per
                token = (DM pass - PL pass) / K); K = 0 runs the AR loop. A chosen K other than 0 and
                --k is compiled and timed too.

Every loop is compiled ahead of time (the adaptive runs' cost tables calibrated first) and timed
without compilation, round-robin: --repeats rounds at B <= 8 (one above), every other round in
reverse order, each run keeping its best, so the host's drift in speed over the run falls on all
runs alike. "decode tok/s" excludes the target's prefill over the prompts (timed in the same
rounds); speedups are decode throughput over AR's at the same B.

  python benchmarks/batch_size.py --out=/tmp/batch_size.json
  python benchmarks/batch_size.py --batches=1,8 --max_new_tokens=16   # a quick look
  python benchmarks/batch_size.py --batches=1,8 --k=2 --drafter=eagle3-smollm2-135m \
    --adaptive_ks=0,2,4 --n_particles=0                              # adaptive K at batch 8
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time

import jax
import numpy as np
from absl import app, flags

from specjax import adaptive as adp
from specjax import k_policy
from specjax.drafters import DraftModelDrafter, PromptLookupDrafter
from specjax.experiment.calibrate import measure_costs, round_robin_times
from specjax.experiment.methods import Method, load_shipped_drafter, load_target, truncate_layers
from specjax.experiment.tasks import (
  SPEC_BENCH_CATEGORIES,
  conversation,
  find_spec_bench,
  load_spec_bench,
)
from specjax.generate import GenerateConfig, generate, pad_prompts, prefill
from specjax.metrics import summarize
from specjax.smc import SMCConfig, smc_generate
from specjax.speculative import speculative_generate

_MODEL = flags.DEFINE_string("model", "smollm2-135m-instruct", "Registry name, HF dir or .gguf.")
_SPEC_BENCH = flags.DEFINE_string("spec_bench", "", "Spec-Bench question.jsonl (default: shared).")
_CATEGORIES = flags.DEFINE_list(
  "categories", list(SPEC_BENCH_CATEGORIES), "Spec-Bench categories of the prompt pool."
)
_BATCHES = flags.DEFINE_list("batches", ["1", "2", "4", "8", "16", "32"], "Batch sizes.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 32, "Tokens generated per row.")
_K = flags.DEFINE_integer("k", 4, "Draft length of the fixed-K runs (and the policy's largest K).")
_DRAFT_LAYERS = flags.DEFINE_integer("draft_layers", 4, "Layers of the truncated-target draft.")
_PARTICLES = flags.DEFINE_integer("n_particles", 4, "SMC-SD particles per request (0: no SMC-SD).")
_SMC_MAX_ROWS = flags.DEFINE_integer("smc_max_rows", 128, "Skip SMC-SD above this many rows.")
_BUCKET = flags.DEFINE_integer("prompt_bucket", 64, "Prompt width; longer prompts are not used.")
_MIN_GAIN = flags.DEFINE_float("min_gain", 0.05, "Policy: predicted gain needed to speculate.")
_OUT = flags.DEFINE_string("out", "", "Write all measurements as JSON here.")
_DRAFTER = flags.DEFINE_string("drafter", "", "A shipped drafter to run too (chain of --k).")
_ADAPTIVE = flags.DEFINE_list("adaptive_ks", [], "Adaptive runs choose K among these (0 first).")
_REPEATS = flags.DEFINE_integer(
  "repeats",
  3,
  "Timed rounds at B <= 8 (one above), round-robin over all runs; each keeps its best.",
)
_CLOCK = flags.DEFINE_enum(
  "clock",
  "wall",
  ["wall", "cpu"],
  "Time the policy and the first table use (cpu: process CPU time,"
  " steadier than wall time on a shared machine).",
)


@dataclasses.dataclass
class Run:
  wall: float  # best wall-clock seconds of the compiled call
  cpu: float  # best process CPU seconds (user + system, all threads) of the compiled call
  tokens: int  # generated tokens (all rows; SMC: the chosen particle of each request)
  iterations: int  # while-loop iterations (max verify passes over rows)
  tau: float = 0.0  # tokens per verify pass (speculative runs)
  k_share: dict | None = None  # adaptive runs: share of row steps at each K

  def seconds(self, clock: str) -> float:
    return self.cpu if clock == "cpu" else self.wall


def compiled(fn, args):
  """fn AOT-compiled for args, with the args: a call `round_robin` times without compilation."""
  return jax.jit(fn).lower(*args).compile(), args


def round_robin(calls: dict, repeats: int) -> dict:
  """{name: (best wall s, best CPU s, output)} of every compiled call, timed in `repeats`
  round-robin rounds by `calibrate.round_robin_times` (every other round in reverse order, so
  drift of the shared host's speed over the run falls on all calls alike)."""
  cpu, outs = {m: [] for m in calls}, {}

  def call(m):
    fn, args = calls[m]

    def run():
      c0 = time.process_time()
      outs[m] = jax.block_until_ready(fn(*args))
      cpu[m].append(time.process_time() - c0)
      return outs[m]

    return run

  walls = round_robin_times({m: call(m) for m in calls}, repeats)
  return {m: (float(walls[m].min()), min(cpu[m]), outs[m]) for m in calls}


def short_prompts(tokenizer, n: int, bucket: int) -> list[list[int]]:
  path = find_spec_bench(_SPEC_BENCH.value)
  prompts = load_spec_bench(path, _CATEGORIES.value, turns=1)
  by_cat: dict[str, list[list[int]]] = {}
  for p in prompts:
    ids = tokenizer.encode_chat(conversation(p.turns[:1], []))
    if len(ids) <= bucket:
      by_cat.setdefault(p.category, []).append(ids)
  out, i = [], 0
  while len(out) < n:
    row = [c[i] for c in by_cat.values() if i < len(c)]
    if not row:
      raise ValueError(f"only {len(out)} Spec-Bench prompts fit {bucket} tokens, need {n}")
    out.extend(row)
    i += 1
  return out[:n]


def main(argv):
  del argv
  t0 = time.perf_counter()
  target = load_target(_MODEL.value)
  params, cfg = target.params, target.cfg
  draft, dcfg = truncate_layers(params, cfg, _DRAFT_LAYERS.value)
  K, max_new = _K.value, _MAX_NEW.value
  batches = [int(b) for b in _BATCHES.value]
  pool = short_prompts(target.tokenizer, max(batches), _BUCKET.value)
  gen = GenerateConfig(max_new)
  pl, dm = PromptLookupDrafter(K), DraftModelDrafter(dcfg, K)
  smc = (
    SMCConfig(n_particles=_PARTICLES.value, max_new_tokens=max_new) if _PARTICLES.value else None
  )
  print(
    f"{_MODEL.value}: loaded in {time.perf_counter() - t0:.1f} s; {os.cpu_count()} CPUs, load "
    f"average {os.getloadavg()[0]:.1f}; max_new_tokens {max_new}, K {K}, draft "
    f"{_DRAFT_LAYERS.value}/{cfg.n_layers} layers",
    flush=True,
  )

  chains = {"pl": (pl, ()), "dm": (dm, draft)}
  if _DRAFTER.value:
    shipped = load_shipped_drafter(_DRAFTER.value, target, "bfloat16")
    chains[_DRAFTER.value.split("-smollm2")[0]] = (shipped.drafter(K), shipped.params)
  config = adp.AdaptiveConfig(tuple(int(k) for k in _ADAPTIVE.value)) if _ADAPTIVE.value else None

  def spec_call(drafter, dp, x, n, costs=None):
    a = None if costs is None else config
    fn = lambda p, dp, x, n: speculative_generate(  # noqa: E731
      p, cfg, drafter, dp, x, n, gen, adaptive=a, costs=costs
    )
    return compiled(fn, (params, dp, x, n))

  def spec_result(wall, cpu, out) -> Run:
    s = summarize(out.metrics)
    iters = int(np.max(out.metrics.target_passes))
    share = None
    if out.adaptive is not None:
      counts = np.asarray(out.adaptive.counts).sum(0)
      share = {int(k): float(c / counts.sum()) for k, c in zip(config.ks, counts) if c}
    return Run(wall, cpu, int(np.sum(out.lengths)), iters, s["tau"], share)

  def plain_result(wall, cpu, out) -> Run:
    return Run(wall, cpu, int(np.sum(out.lengths)), int(np.max(out.target_passes)))

  clock = _CLOCK.value
  results = []
  for B in batches:
    reps = _REPEATS.value if B <= 8 else 1
    x, n = pad_prompts(pool[:B], _BUCKET.value)
    pre_fn = functools.partial(_prefill_logits, cfg=cfg, capacity=x.shape[1] + max_new)
    calls = {"prefill": compiled(pre_fn, (params, x, n))}
    calls["ar"] = compiled(functools.partial(_ar, cfg=cfg, gen=gen), (params, x, n))
    for m, (drafter, dp) in chains.items():
      calls[m] = spec_call(drafter, dp, x, n)
    for m, (drafter, dp) in chains.items() if config else ():
      drafter = dataclasses.replace(drafter, k=max(config.ks))
      method = Method(m, drafter, dp, adaptive=config)
      costs = measure_costs(target, method, batch=B, width=x.shape[1], max_new_tokens=max_new)
      print(f"  B={B} {m}: adaptive costs {costs.to_json()}", flush=True)
      calls[f"{m}_adaptive"] = spec_call(drafter, dp, x, n, costs)
    if smc and B * smc.n_particles <= _SMC_MAX_ROWS.value:
      fn = functools.partial(_smc, cfg=cfg, drafter=dm, smc=smc, key=jax.random.PRNGKey(0))
      calls["smc"] = compiled(fn, (params, draft, x, n))
    timings = round_robin(calls, reps)
    pre = Run(*timings.pop("prefill")[:2], tokens=0, iterations=1)
    runs = {
      m: plain_result(*t) if m in ("ar", "smc") else spec_result(*t) for m, t in timings.items()
    }

    def decode(r: Run, c: str = clock, pre: Run = pre) -> float:
      return r.tokens / max(r.seconds(c) - pre.seconds(c), 1e-9)

    step = {m: (r.seconds(clock) - pre.seconds(clock)) / r.iterations for m, r in runs.items()}
    verify = [(0, step["ar"]), (K, step["pl"])]
    costs = {
      "pl": k_policy.costs_from_measurements(verify),
      "dm": k_policy.costs_from_measurements(
        verify, draft_per_token=max(step["dm"] - step["pl"], 0.0) / K
      ),
    }
    row = {"batch": B, "prefill": dataclasses.asdict(pre)}
    row["runs"] = {m: dataclasses.asdict(r) for m, r in runs.items()}
    row["decode_tok_s"] = {c: {m: decode(r, c) for m, r in runs.items()} for c in ("wall", "cpu")}
    for m, drafter, dp in (("pl", pl, ()), ("dm", dm, draft)):
      alpha = k_policy.alpha_from_tokens_per_step(runs[m].tau, K)
      policy = k_policy.KPolicy(((B, costs[m]),), k_max=K, min_gain=_MIN_GAIN.value)
      k = policy.choose(alpha, B)
      chosen = runs["ar"] if k == 0 else runs[m] if k == K else None
      if chosen is None:  # timed on its own, after the round-robin
        call = spec_call(dataclasses.replace(drafter, k=k), dp, x, n)
        chosen = spec_result(*round_robin({"policy": call}, reps)["policy"])
      row[f"policy_{m}"] = {
        "alpha": alpha,
        "k": k,
        "predicted": policy.predicted_factor(alpha, B),
        "decode_tok_s": {c: decode(chosen, c) for c in ("wall", "cpu")},
      }
    results.append(row)
    print(json.dumps(row), flush=True)

  for c in (clock, "wall" if clock == "cpu" else "cpu"):
    label = "tokens per CPU-second" if c == "cpu" else "tokens per wall-clock second"
    print(
      f"\nDecode throughput, {label} ({'the policy used this clock' if c == clock else 'for reference'}):"
    )
    print(table(results, K, c))
  print(f"\ntotal {time.perf_counter() - t0:.0f} s")
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump({"flags": flags.FLAGS.flag_values_dict(), "results": results}, f, indent=1)


def _prefill_logits(p, x, n, *, cfg, capacity):
  return prefill(p, cfg, x, n, capacity).logits


def _ar(p, x, n, *, cfg, gen):
  return generate(p, cfg, x, n, gen)


def _smc(p, dp, x, n, *, cfg, drafter, smc, key):
  return smc_generate(p, cfg, drafter, dp, x, n, smc, key)


def table(results, K: int, clock: str) -> str:
  """Decode throughput of every run as a ratio to AR at the same B (adaptive runs with the share
  of row steps at each K), then the offline policy's picks."""
  runs = [m for m in results[0]["decode_tok_s"][clock] if m != "ar"]

  def label(m: str) -> str:
    fixed = not (m.endswith("_adaptive") or m == "smc")
    return m.replace("_adaptive", " adaptive").upper() + (f" K={K}" if fixed else "")

  head = ["B", "AR tok/s", *map(label, runs), "policy PL: K, alpha, x", "policy DM: K, alpha, x"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in results:
    d = r["decode_tok_s"][clock]
    ar = d["ar"]

    def x(v, ar=ar):
      return f"{v / ar:.2f}x"

    cells = [str(r["batch"]), f"{ar:.1f}"]
    for m in runs:
      share = r["runs"][m].get("k_share") if m in r["runs"] else None
      ks = " (" + " ".join(f"{k}:{v:.0%}" for k, v in share.items()) + ")" if share else ""
      cells.append(x(d[m]) + ks if m in d else "-")
    for m in ("pl", "dm"):
      p = r[f"policy_{m}"]
      cells.append(f"{p['k']}, {p['alpha']:.2f}, {x(p['decode_tok_s'][clock])}")
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


if __name__ == "__main__":
  app.run(main)
