"""Every shipped drafter on Spec-Bench (or held-out corpus) prompts: cost, acceptance, tau, speedup.

  python benchmarks/drafters_report.py --per_category=2 --max_new_tokens=128 \
    --workdir=/tmp/specjax_drafters_report

Greedy, batch 1, chain drafting with K=4 (or each drafter's own K, `--drafters=NAME:K`), the first user turn of the first `per_category`
prompts of each Spec-Bench category (the file is read from ../shared/data/spec_bench or
$SPECJAX_SPEC_BENCH, never copied). For each drafter it prints:

  c           measured cost ratio: seconds per drafted token (one `propose` of K tokens / K)
              over seconds per target decode step (one token, batch 1), both jitted and timed
              after compilation at the same cache length (the median of `--reps` calls); the
              target's step and verify passes are timed once per run, so rows share them;
  propose     seconds of one whole `propose` (a block of K) over one decode step;
  verify      seconds of one K+1-token target verify pass over one decode step;
  accept@i    per-pass acceptance of draft position i (accepted_at / target passes; vLLM's
              per-position rate), and alpha_i (accepted_at / reached_at, EAGLE's conditional);
  tau         emitted tokens per target pass (bonus token included);
  speedup     Spec-Bench's mean over prompts of method tok/s over AR tok/s, same prompts.

`--prompts=heldout` runs the held-out prompts of the committed training corpus instead (ShareGPT
first turns and GSM8K train questions, `--per_category` of each): the drafters' own distribution,
so the gap to Spec-Bench separates drafter quality from distribution shift.

Every speculative output is checked against the AR output (`same as AR`). Per-prompt records go to
WORKDIR/records.jsonl and a rerun with the same settings and weights (`weights.json`) resumes
(other ones stop with an error asking for a new --workdir); each cost line is also appended to
WORKDIR/costs.jsonl (with the time and load average), so a lost terminal capture loses nothing.
Timings on a shared CPU are noisy; the script prints the machine's load average next to them.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from specjax.drafters.shipped import list_shipped, load_shipped
from specjax.experiment.methods import Method, load_target
from specjax.experiment.runner import ResumeError, Runner, run_suite
from specjax.experiment.tables import markdown, summary_rows
from specjax.experiment.tasks import (
  SPEC_BENCH_CATEGORIES,
  find_spec_bench,
  load_spec_bench,
)
from specjax.generate import GenerateConfig, pad_prompts, prefill
from specjax.model import forward
from specjax.sampling import SamplingConfig
from train import corpus

_PER_CATEGORY = flags.DEFINE_integer("per_category", 2, "Prompts per Spec-Bench category.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 128, "Tokens generated per prompt.")
_K = flags.DEFINE_integer("k", 4, "Draft length K (chain).")
_REPS = flags.DEFINE_integer("reps", 20, "Timed calls per cost measurement.")
_DRAFTERS = flags.DEFINE_list(
  "drafters", [], "Shipped drafter names, each optionally NAME:K for its own draft length "
  "(a block size for the parallel drafters); default: all, at --k."
)  # fmt: skip
_WORKDIR = flags.DEFINE_string("workdir", "/tmp/specjax_drafters_report", "Records directory.")
_SPEC_BENCH = flags.DEFINE_string("spec_bench", "", "Spec-Bench question.jsonl path.")
_PROMPTS = flags.DEFINE_enum(
  "prompts", "spec_bench", ["spec_bench", "heldout"],
  "spec_bench: Spec-Bench's first turns; heldout: the held-out prompts of the committed training "
  "corpus (`--per_category` per source), the distribution the drafters were trained on.",
)  # fmt: skip
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Target dtype (AR too).")
_WEIGHTS = flags.DEFINE_list(
  "weights_dtype", ["float32"],
  "Drafter weight dtypes to run, each drafter in each (bfloat16 runs are named NAME_kK_bf16w; "
  "experiments default to bfloat16, this report to float32 so that its earlier runs repeat).",
)  # fmt: skip


def _median_time(fn, *args, reps: int) -> float:
  jax.block_until_ready(fn(*args))  # compile
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def _context(target, context: int, layers=()):
  """A random `context`-token prompt prefilled (capacity for 64 more): (prompts, lens, seq, pre)."""
  params, cfg = target.params, target.cfg
  ids = np.random.RandomState(0).randint(100, 20000, context).tolist()
  prompts, lens = pad_prompts([ids], bucket=context)
  capacity = context + 64
  pre = jax.jit(lambda p, x, n: prefill(p, cfg, x, n, capacity, layers))(params, prompts, lens)
  seq = jnp.zeros((1, capacity), jnp.int32).at[:, :context].set(prompts)
  seq = seq.at[0, context].set(jnp.argmax(pre.logits[0]))
  return prompts, lens, seq, pre


def target_times(target, ks, reps: int, context: int = 256) -> dict:
  """Seconds of one target decode step (one token) and of a K+1-token verify pass per K, at one
  cache length: timed once per run, so every drafter's ratios share the same denominators."""
  params, cfg = target.params, target.cfg
  _, _, seq, pre = _context(target, context)
  step = jax.jit(lambda p, t, c: forward(p, t, c, cfg).logits)
  t = lambda n: _median_time(step, params, seq[:, context : context + n], pre.cache, reps=reps)
  return {"step": t(1), "verify": {k: t(k + 1) for k in sorted(set(ks))}}


def cost_ratios(target, shipped, k: int, reps: int, times: dict, context: int = 256) -> dict:
  """Measured c = (propose time / K) / (one-token target step) and the verify-pass ratio, over the
  run's shared target times (`target_times`)."""
  drafter = shipped.drafter(k)
  prompts, lens, seq, pre = _context(target, context, tuple(drafter.hidden_layers))
  state = jax.jit(lambda dp, pre: drafter.init(dp, pre, prompts, lens, context + 64))(
    shipped.params, pre
  )
  greedy = SamplingConfig()
  propose = jax.jit(lambda dp, st, s, n, key: drafter.propose(dp, st, s, n, key, greedy).tokens)
  t_draft = _median_time(
    propose, shipped.params, state, seq, lens + 1, jax.random.PRNGKey(0), reps=reps
  )
  t_step = times["step"]
  return {
    "c": t_draft / k / t_step,
    "block": t_draft / t_step,
    "verify": times["verify"][k] / t_step,
  }


def parse_drafters(entries: list[str], default_k: int) -> list[tuple[str, int]]:
  """[(name, K)] from "NAME" or "NAME:K" entries (a name may come with several K)."""
  out = []
  for e in entries:
    name, _, k = e.partition(":")
    if k and not k.isdigit():
      raise SystemExit(f"--drafters entry {e!r}: K must be a positive integer (NAME:K)")
    out.append((name, int(k) if k else default_k))
  return out


def heldout_summary(heldout: dict) -> str:
  """The held-out metrics a drafter's metadata records, one table cell: top-1 per depth on its
  own, the chained agreement (depths 1..j all right) where recorded, and the simulated tau."""
  rates = lambda prefix: "/".join(
    f"{v:.3f}" for k, v in heldout.items() if k.startswith(prefix) and k[len(prefix) :].isdigit()
  )
  cell = rates("top1_step") or rates("top1_head") or f"{heldout.get('top1', float('nan')):.3f}"
  if "prefix_step1" in heldout:
    cell += f"; chained {rates('prefix_step')}"
  if "simulated_tau" in heldout:
    cell += f"; simulated tau {heldout['simulated_tau']:.2f}"
  return cell


def main(argv):
  del argv
  target = load_target("smollm2-135m-instruct", _DTYPE.value)
  runs = parse_drafters(_DRAFTERS.value or list_shipped(), _K.value)
  if not runs:
    raise SystemExit("no shipped drafters in specjax/drafters/shipped")
  names, k = list(dict.fromkeys(n for n, _ in runs)), max(k for _, k in runs)
  tag = {"float32": "", "bfloat16": "_bf16w"}
  if set(_WEIGHTS.value) - set(tag):
    raise SystemExit(f"--weights_dtype {_WEIGHTS.value}: each must be float32 or bfloat16")
  shipped = {
    (n, w): load_shipped(n, target.params, target.cfg, weights_dtype=w)
    for n in names
    for w in _WEIGHTS.value
  }
  runs = [(n, kn, w) for n, kn in runs for w in _WEIGHTS.value]
  suite = "Spec-Bench" if _PROMPTS.value == "spec_bench" else "held-out corpus prompts"
  print(f"# Shipped drafters on {suite} (greedy, batch 1, {_DTYPE.value}, chain: {runs})\n")
  print(f"device: {jax.devices()[0].device_kind}, load average {os.getloadavg()[0]:.1f}\n")
  times = target_times(target, [kn for _, kn, _ in runs], _REPS.value)
  step_ms = 1e3 * times["step"]
  print(f"target decode step: {step_ms:.1f} ms (one timing for every row)\n")
  print(
    "| drafter | kind | K | held-out top-1 per depth; chained (training metric) | c | propose/step "
    "| verify/step |"
  )
  print("|---|---|---:|---|---:|---:|---:|")
  for n, kn, w in runs:
    s = shipped[n, w]
    cst = cost_ratios(target, s, kn, _REPS.value, times)
    held = heldout_summary(s.metadata["heldout"])
    print(
      f"| {n}{tag[w]} | {s.kind} | {kn} | {held} | {cst['c']:.3f} | {cst['block']:.3f} "
      f"| {cst['verify']:.2f} |"
    )
    os.makedirs(_WORKDIR.value, exist_ok=True)
    with open(os.path.join(_WORKDIR.value, "costs.jsonl"), "a") as f:
      line = {"drafter": n, "k": kn, "weights": w, **cst, "step_ms": step_ms}
      line["load"] = os.getloadavg()[0]
      f.write(json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S"), **line}) + "\n")
  methods = [
    Method(f"{n}_k{kn}{tag[w]}", shipped[n, w].drafter(kn), shipped[n, w].params)
    for n, kn, w in runs
  ]
  gen = GenerateConfig(max_new_tokens=_MAX_NEW.value, stop_tokens=target.tokenizer.stop_ids)
  if _PROMPTS.value == "heldout":
    prompts = corpus.heldout_prompts(corpus.SHIPPED, target.tokenizer, _PER_CATEGORY.value)
  else:
    prompts = load_spec_bench(
      find_spec_bench(_SPEC_BENCH.value), SPEC_BENCH_CATEGORIES, _PER_CATEGORY.value, turns=1
    )
  runner = Runner(target, methods, gen, log=lambda line: print(line, flush=True))
  settings = {
    "drafters": names,
    "k": [(n, kn) for n, kn, _ in runs],
    **({"weights_dtype": _WEIGHTS.value} if _WEIGHTS.value != ["float32"] else {}),
    "per_category": _PER_CATEGORY.value,
    "max_new": _MAX_NEW.value,
    **({"dtype": _DTYPE.value} if _DTYPE.value != "float32" else {}),
    **({"prompts": "heldout"} if _PROMPTS.value == "heldout" else {}),
  }
  try:  # run_suite also checks the weights: a drafter retrained since is not resumed
    records = run_suite(runner, prompts, _WORKDIR.value, settings, lambda x: print(x, flush=True))
  except ResumeError as e:
    sys.exit(f"FATAL: {e}")
  rows = summary_rows(records)
  print("\n" + markdown(rows) + "\n")
  print(
    "| category | drafter | "
    + " | ".join(f"accept@{i + 1}" for i in range(k))
    + " | "
    + " | ".join(f"alpha_{i + 1}" for i in range(k))
    + " |"
  )
  print("|---|---|" + "---:|" * (2 * k))
  cats = list(dict.fromkeys(r["category"] for r in records)) + ["overall"]
  for cat in cats:
    recs = records if cat == "overall" else [r for r in records if r["category"] == cat]
    for m in methods:
      ms = [r["methods"][m.name] for r in recs]
      passes = max(sum(x["target_passes"] for x in ms), 1)
      pad = lambda a: np.pad(np.asarray(a, float), (0, k - len(a)))  # noqa: E731 - shorter K
      acc = np.sum([pad(x["accepted_at"]) for x in ms], 0)
      reach = np.maximum(np.sum([pad(x["reached_at"]) for x in ms], 0), 1)
      print(
        f"| {cat} | {m.name} | "
        + " | ".join(f"{a / passes:.3f}" for a in acc)
        + " | "
        + " | ".join(f"{a:.3f}" for a in acc / reach)
        + " |"
      )
  print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
  app.run(main)
