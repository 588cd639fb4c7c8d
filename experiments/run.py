"""Runs one experiment config: the AR baseline and a speculative method on the same prompts.

Prompts are Spec-Bench's (from --spec_bench, $SPECJAX_SPEC_BENCH or ../shared/data beside the
clone) or, when that file is absent or --config.data.suite=packaged, the default suite from PyPI
data packages (MT-bench, HumanEval, GSM8K, WritingBench, FreshQA).

  python experiments/run.py --config=configs/prompt_lookup.py:small --workdir=/tmp/specjax_run

Prints a line per prompt, then a Markdown table per category and overall, which it also writes to
WORKDIR/summary.md and WORKDIR/summary.csv; per-prompt records go to WORKDIR/records.jsonl as they
finish, and rerunning the same command resumes where a killed run stopped. Override any config
field with --config.FIELD=VALUE (e.g. --config.drafter.k=8); unknown fields are an error. The
logic lives in `specjax.experiment`; this file only wires flags to it.
"""

import os
import platform
import sys
import time

import jax
from absl import app, flags
from ml_collections import config_flags

from specjax.drafters.shipped import ShippedDrafterError
from specjax.experiment import plots
from specjax.experiment.methods import build_method, load_target
from specjax.experiment.runner import Runner, run_suite
from specjax.experiment.settings import field_names, settings_from_config
from specjax.experiment.suites import load_prompts
from specjax.experiment.tables import markdown, summary_rows, write_csv

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "Experiment config file, e.g. configs/prompt_lookup.py:small.", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for records and summaries.")
_SPEC_BENCH = flags.DEFINE_string(
  "spec_bench",
  "",
  "Spec-Bench question.jsonl (default: $SPECJAX_SPEC_BENCH, then ../shared/data/spec_bench/ "
  "beside the repository).",
)
flags.mark_flags_as_required(["config", "workdir"])


def parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing with a readable error for an unknown --config.FIELD override."""
  try:
    return flags.FLAGS(argv)
  except AttributeError as e:  # raised by the locked ConfigDict
    field = str(e).strip("\"'")
    sys.exit(f"FATAL: unknown config field {field!r}; known fields: {', '.join(field_names())}")


def header(settings, target, method, n_prompts: int, source: str) -> str:
  d = settings.drafter
  method = "ar" if method is None else f"{method.name} ({settings.method}, {method.loop} loop)"
  tree_draft = settings.method == "tree" and settings.tree.kind != "heads"
  if settings.method in ("draft_model", "smc") or tree_draft:
    method += f", draft {d.model or settings.model}" + (
      f" first {d.n_layers} layers" * bool(d.n_layers)
    )
  if d.shipped:
    method += f", shipped drafter {d.shipped}"
  device = jax.devices()[0]
  return "\n".join(
    [
      f"# specjax: {method} vs AR",
      "",
      f"- target: {target.name} ({target.cfg.num_params():,} params, {settings.dtype})",
      f"- prompts: {n_prompts} from {source} ({settings.per_category} per category, "
      f"MT-bench turns: {settings.turns})",
      f"- max_new_tokens {settings.max_new_tokens}, temperature {settings.sampling.temperature}, "
      f"rule {settings.rule}, batch 1",
      f"- device: {device.platform} {device.device_kind}, {os.cpu_count()} CPUs "
      f"({platform.processor() or platform.machine()}), jax {jax.__version__}",
    ]
  )


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  settings = settings_from_config(_CONFIG.value)
  source, prompts = load_prompts(settings, _SPEC_BENCH.value)
  t0 = time.perf_counter()
  target = load_target(settings.model, settings.dtype)
  try:
    method = build_method(settings, target)
  except ShippedDrafterError as e:
    sys.exit(f"FATAL: {e}")
  print(f"loaded {settings.model} in {time.perf_counter() - t0:.1f} s", flush=True)
  gen = settings.generate_config(target.tokenizer.stop_ids)
  methods = [method] if method is not None else []
  log = lambda s: print(s, flush=True)
  runner = Runner(target, methods, gen, settings.seed, settings.prompt_bucket, log=log)
  records = run_suite(runner, prompts, _WORKDIR.value, settings.as_dict(), log=log)
  rows = summary_rows(records)
  text = header(settings, target, method, len(prompts), source) + "\n\n" + markdown(rows) + "\n"
  print("\n" + text)
  with open(os.path.join(_WORKDIR.value, "summary.md"), "w") as f:
    f.write(text)
  write_csv(rows, os.path.join(_WORKDIR.value, "summary.csv"))
  written = plots.write_plots(records, _WORKDIR.value)
  print(
    f"wrote {_WORKDIR.value}/summary.md, summary.csv, records.jsonl"
    + "".join(f", {p}" for p in written)
  )


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
