"""Runs one experiment config: the AR baseline and a speculative method on the same prompts.

Prompts are Spec-Bench's (from --spec_bench, $SPECJAX_SPEC_BENCH or ../shared/data beside the
clone) or, when no path was given and the shared file is absent, or with
--config.data.suite=packaged, the default suite from PyPI data packages (MT-bench, HumanEval,
GSM8K, WritingBench, FreshQA); the first line says which and why. A path that was given but does
not exist is an error.

  python experiments/run.py --config=configs/prompt_lookup.py:small --workdir=/tmp/specjax_run

Prints a line per prompt, then a Markdown table per category and overall, which it also writes to
WORKDIR/summary.md and WORKDIR/summary.csv; per-prompt records go to WORKDIR/records.jsonl as they
finish, and rerunning the same command resumes where a killed run stopped. A prompt that cannot
run is recorded there with its error and skipped; the summary says how many and why. Override any
config field with --config.FIELD=VALUE (e.g. --config.drafter.k=8). Bad input (an unknown field, a
value out of range, a missing file, a workdir that cannot be written) stops the run before any
model loads, with one `FATAL:` line and a non-zero exit status. The logic lives in
`specjax.experiment`; this file only wires flags to it.
"""

import os
import platform
import sys
import time

import jax
from absl import app, flags
from ml_collections import config_flags

from specjax.experiment import plots
from specjax.experiment.calibrate import with_costs
from specjax.experiment.methods import build_method, describe_method, load_target
from specjax.experiment.runner import (
  ResumeError,
  Runner,
  check_settings,
  run_suite,
  skipped_records,
  skipped_summary,
)
from specjax.experiment.settings import settings_from_config, unknown_field_message
from specjax.experiment.suites import load_prompts
from specjax.experiment.tables import markdown, summary_rows, write_csv
from specjax.loading.registry import ModelUnavailableError
from specjax.packages import PackageDataError

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


# Errors of bad input (a value, a file, a model or data package that cannot be had): one line each.
USER_ERRORS = (ValueError, OSError, ModelUnavailableError, PackageDataError)


def parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing; a bad flag or --config.FIELD override exits with one `FATAL:` line."""
  try:
    return flags.FLAGS(argv)
  except (AttributeError, KeyError, flags.Error) as e:  # the locked ConfigDict raises the first two
    sys.exit(f"FATAL: {config_override_error(argv) or one_line(str(e))}")


def one_line(message: str) -> str:
  """A (possibly multi-line, traceback-carrying) message as its first and last lines."""
  lines = [line.strip() for line in message.strip('"').splitlines() if line.strip()]
  return " ".join(lines[:1] + lines[-1:] if len(lines) > 1 else lines)


def config_override_error(argv: list[str]) -> str:
  """Why the first --config.FIELD override of `argv` that is not a config field is wrong ("")."""
  for arg in argv:
    if arg.startswith("--config.") and len(arg) > len("--config."):
      message = unknown_field_message(arg[len("--config.") :].split("=", 1)[0])
      if message:
        return message
  return ""


def header(settings, target, method, n_prompts: int, source: str) -> str:
  method = describe_method(settings, method)
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


def set_up(log):
  """Settings, prompts, target and method, checked in that order (the cheap checks first)."""
  settings = settings_from_config(_CONFIG.value)
  source, prompts = load_prompts(settings, _SPEC_BENCH.value, log=log)
  check_settings(_WORKDIR.value, settings.as_dict())  # the workdir is writable, a resume matches
  t0 = time.perf_counter()
  target = load_target(settings.model, settings.dtype)
  method = with_costs(settings, target, build_method(settings, target), log)  # adaptive: its costs
  log(f"loaded {settings.model} in {time.perf_counter() - t0:.1f} s")
  return settings, source, prompts, target, method


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  log = lambda s: print(s, flush=True)
  try:
    settings, source, prompts, target, method = set_up(log)
  except USER_ERRORS as e:
    sys.exit(f"FATAL: {one_line(str(e))}")
  try:
    run_and_report(settings, source, prompts, target, method, log)
  except ResumeError as e:  # the workdir's records were decoded with other weights
    sys.exit(f"FATAL: {one_line(str(e))}")
  except OSError as e:  # e.g. a full disk: the records written so far are kept
    sys.exit(f"FATAL: {one_line(str(e))}")


def run_and_report(settings, source, prompts, target, method, log) -> None:
  """Runs the suite (resuming), then prints and writes the summary, the CSV and the plots."""
  gen = settings.generate_config(target.tokenizer.stop_ids)
  methods = [method] if method is not None else []
  runner = Runner(target, methods, gen, settings.seed, settings.min_prompt_width, log=log)
  workdir = _WORKDIR.value
  records = run_suite(runner, prompts, workdir, settings.as_dict(), log=log)
  skipped = skipped_summary(skipped_records(workdir, prompts), len(prompts))
  rows = summary_rows(records)
  text = header(settings, target, method, len(prompts), source)
  text += f"\n- {skipped}" if skipped else ""
  text += "\n\n" + markdown(rows) + "\n"
  print("\n" + text)
  try:
    with open(os.path.join(workdir, "summary.md"), "w") as f:
      f.write(text)
    write_csv(rows, os.path.join(workdir, "summary.csv"))
    context = f"{target.name} on {source}, {settings.max_new_tokens} new tokens"
    written = plots.write_plots(records, workdir, context)
  except OSError as e:
    raise OSError(
      e.errno,
      f"cannot write the summary into {workdir} ({e.strerror}); records.jsonl keeps every "
      "record: make room and rerun the same command to write it",
    ) from e
  print(
    f"wrote {workdir}/summary.md, summary.csv, records.jsonl" + "".join(f", {p}" for p in written)
  )
  if not records and skipped:
    sys.exit(f"FATAL: none of the {len(prompts)} prompts could run ({skipped.splitlines()[0]})")


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
