"""Paper-shaped tables, one command each: every method and the AR baseline on the same prompts.

  # Spec-Bench Table 1 shape: speedup per category, mean accepted tokens, overall.
  python experiments/paper_tables.py --table=spec_bench --workdir=/tmp/specjax_t_spec_bench --small
  # EAGLE-3 Table 1 shape: MT-bench, HumanEval, GSM8K (PyPI packages) and summarization
  # (Spec-Bench, when its file is found): "speedup / tau" per method.
  python experiments/paper_tables.py --table=eagle3 --workdir=/tmp/specjax_t_eagle3 --small
  # Leviathan et al.: measured alpha and c, predicted vs measured tau and speedup, several K.
  python experiments/paper_tables.py --table=leviathan --workdir=/tmp/specjax_t_leviathan --small

`--paired_base=NAME` adds every method against method NAME (or ar), prompt by prompt: the
geometric mean of the tok/s ratios with a bootstrap 95% interval (`paper.paired_table`).

Methods come from the experiment configs (`configs/*.py`), built by `specjax.experiment.methods`
and run by one `specjax.experiment.runner.Runner`, so every method is timed against the same AR
run of each prompt in this process (greedy, batch 1). Records go to WORKDIR/records.jsonl as prompts
finish (a rerun resumes); the table is printed and written to WORKDIR/table.md, plots to WORKDIR
(`specjax.experiment.plots`). `--small`: 1 prompt per category and 32 new tokens.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time

from absl import app, flags

from specjax.drafters.shipped import list_shipped
from specjax.experiment import paper, plots
from specjax.experiment.calibrate import with_costs
from specjax.experiment.costs import draft_cost_ratio
from specjax.experiment.methods import build_method, load_target
from specjax.experiment.packaged import load_default_suite
from specjax.experiment.runner import (
  ResumeError,
  Runner,
  run_suite,
  skipped_records,
  skipped_summary,
)
from specjax.experiment.settings import (
  load_config_file,
  parse_method_entry,
  settings_from_config,
)
from specjax.experiment.tasks import (
  DEFAULT_SOURCE,
  SPEC_BENCH_CATEGORIES,
  find_spec_bench,
  load_spec_bench,
  spec_bench_source,
)

_TABLE = flags.DEFINE_enum("table", None, ["spec_bench", "eagle3", "leviathan"], "Which table.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for records, table and plots.")
_SMALL = flags.DEFINE_bool("small", False, "1 prompt per category, 32 new tokens.")
_PER_CATEGORY = flags.DEFINE_integer("per_category", 0, "Prompts per category (0: by size).")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 0, "New tokens per prompt (0: by size).")
_CATEGORIES = flags.DEFINE_list("categories", [], "Restrict to these categories.")
_METHODS = flags.DEFINE_list(
  "methods",
  [],
  "Method configs as FILE[:ARG][@FIELD=VALUE]... under configs/, e.g. eagle.py:eagle3@drafter.k=2 "
  "(default: the table's list).",
)
_KS = flags.DEFINE_list("ks", ["2", "4", "8"], "Leviathan table: draft lengths K.")
_MODEL = flags.DEFINE_string("model", "smollm2-135m-instruct", "Target model.")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Target dtype (AR too).")
_SPEC_BENCH = flags.DEFINE_string("spec_bench", "", "Spec-Bench question.jsonl (default: shared).")
_PAIRED = flags.DEFINE_string(
  "paired_base",
  "",
  "Also print every method against this one (a method name or ar), paired by prompt.",
)
flags.mark_flags_as_required(["table", "workdir"])

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
ADAPTIVE = {"adaptive": True, "adaptive_ks": "0,2,3,4"}  # in-loop adaptive K (specjax.adaptive)
# EAGLE-2 tree of 6 nodes (top-2, depth 3): on a 2-core CPU, where verifying 16 nodes costs ~2.6
# AR steps, the fastest of the shapes `benchmarks/trees.py --dynamic` compared (RESULTS.md).
SMALL_TREE = {"tree.top_k": 2, "tree.depth": 3, "tree.n_nodes": 6}
# The block drafters' fastest shapes here (RESULTS.md, twenty-eighth to thirty-third sessions):
# P-EAGLE as a 4-node tree (top-2 at depth 1, the first's top-1 at depth 2), PARD as a K = 4 chain.
BLOCK_TREE = {"tree.n_nodes": 4, "tree.depth": 2}
# P-EAGLE's 5-node tree (a second depth-2 token under the first): its tau reaches EAGLE-3 K = 4's at
# 64 tokens while it stays faster (issue 13's goal; RESULTS.md, forty-fourth session).
BLOCK_TREE_5 = {"tree.n_nodes": 5, "tree.depth": 2}
SPEC_BENCH_METHODS = [  # (config spec, overrides)
  ("prompt_lookup.py", {}),
  ("draft_model.py:draft_lm2", {}),
  ("medusa.py:chain", {}),
  ("medusa.py:tree", {}),
  ("eagle.py:eagle1", {}),
  ("eagle.py:eagle1", {"drafter.k": 3}),
  ("eagle.py:eagle3", {}),
  ("eagle.py:eagle3", {"drafter.k": 2}),
  ("eagle.py:eagle2", {}),
  ("eagle.py:eagle3_tree", {}),
  ("eagle.py:eagle3_tree", SMALL_TREE),
  ("parallel.py:peagle_tree", BLOCK_TREE),
  ("parallel.py:peagle_tree", BLOCK_TREE_5),
  ("parallel.py:pard", {"drafter.k": 4}),
  ("trees.py:dynamic", {}),
  ("suffix.py:tree", {}),
  ("suffix.py:chain", {}),
  ("lookup_first.py", {}),
  ("lookup_first.py", {"drafter.copier": "suffix"}),
  ("prompt_lookup.py", ADAPTIVE),
  ("eagle.py:eagle3", ADAPTIVE),
  ("lookup_first.py", ADAPTIVE),
]
EAGLE3_TASKS = [
  ("mt_bench", "MT-bench"),
  ("humaneval", "HumanEval"),
  ("gsm8k", "GSM8K"),
  ("summarization", "CNN/DM"),
]
LEVIATHAN_METHODS = ["prompt_lookup.py", "draft_model.py:draft_lm2", "eagle.py:eagle1", "medusa.py"]


def load_config(spec: str, overrides: dict):
  """`configs/FILE` get_config(ARG) with `overrides` ({"drafter.k": 8, ...}) applied."""
  name, _, arg = spec.partition(":")
  config = load_config_file(os.path.join(CONFIGS, name), arg)
  for key, value in overrides.items():
    node = config
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  return config


def method_specs(table: str) -> list[tuple[str, dict]]:
  """(config spec, overrides) per method of `table`; EAGLE-3 and the block drafters only when
  their weights are shipped."""
  shipped = list_shipped()
  if _METHODS.value:
    return [parse_method_entry(m) for m in _METHODS.value]
  available = {
    "eagle.py:eagle3": "eagle3-smollm2-135m" in shipped,
    "eagle.py:eagle3_tree": "eagle3-smollm2-135m" in shipped,
    "eagle.py:eagle2": importlib.util.find_spec("specjax.drafters.tree_eagle") is not None,
    "parallel.py:peagle_tree": "peagle-smollm2-135m" in shipped,
    "parallel.py:pard": "pard-smollm2-135m" in shipped,
  }
  if table != "leviathan":
    return [(s, o) for s, o in SPEC_BENCH_METHODS if available.get(s, True)]
  out = []
  for s in LEVIATHAN_METHODS:
    for k in map(int, _KS.value):
      if s.startswith("medusa") and k > 4:
        continue  # 4 shipped Medusa heads
      out.append((s, {"drafter.k": k}))
  return out


def load_table_prompts(table: str, per_category: int):
  """Prompts of the table's tasks: Spec-Bench's categories, or EAGLE-3's task mix."""
  if table != "eagle3":
    path = find_spec_bench(_SPEC_BENCH.value)
    cats = _CATEGORIES.value or SPEC_BENCH_CATEGORIES
    return load_spec_bench(path, cats, per_category, 2), path
  cats = _CATEGORIES.value or [c for c, _ in EAGLE3_TASKS]
  prompts = load_default_suite([c for c in cats if c != "summarization"], per_category)
  source = "PyPI data packages"
  if "summarization" in cats:
    path, how = spec_bench_source(_SPEC_BENCH.value)
    if how == DEFAULT_SOURCE and not os.path.isfile(path):  # a path that was given must exist
      print(f"no summarization column: no Spec-Bench file given and none at {path}", flush=True)
    else:
      path = find_spec_bench(_SPEC_BENCH.value)
      prompts += load_spec_bench(path, ("summarization",), per_category)
      source += f" + {path}"
  return prompts, source


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  table, workdir = _TABLE.value, _WORKDIR.value
  plots.preload()  # before the compiles use up the process's memory mappings
  per_category = _PER_CATEGORY.value or (1 if _SMALL.value else 10)
  max_new = _MAX_NEW.value or (32 if _SMALL.value else 128)
  common = {
    "model": _MODEL.value,
    "dtype": _DTYPE.value,
    "max_new_tokens": max_new,
    "data.per_category": per_category,
  }
  try:
    specs = method_specs(table)
    settings = [settings_from_config(load_config(s, {**common, **o})) for s, o in specs]
    prompts, source = load_table_prompts(table, per_category)
    t0 = time.perf_counter()
    target = load_target(_MODEL.value, _DTYPE.value)
    methods = [build_method(s, target) for s in settings]
  except (ValueError, OSError) as e:
    sys.exit(f"FATAL: {e}")
  names = ["ar", *(m.name for m in methods)]
  if _PAIRED.value and _PAIRED.value not in names:
    sys.exit(f"FATAL: --paired_base={_PAIRED.value!r} is not a method of this run: {names}")
  print(f"loaded {_MODEL.value} and {len(methods)} methods in {time.perf_counter() - t0:.1f} s")
  log = lambda s: print(s, flush=True)
  # Adaptive methods get their cost tables (calibrated once per machine and cached).
  methods = [with_costs(s, target, m, log) for s, m in zip(settings, methods)]
  gen = settings[0].generate_config(target.tokenizer.stop_ids)
  runner = Runner(target, methods, gen, 0, 64, log=log)
  run_settings = {
    "table": table,
    "model": _MODEL.value,
    "dtype": _DTYPE.value,
    "methods": [m.name for m in methods],
    "max_new_tokens": max_new,
    "prompts": [p.prompt_id for p in prompts],
  }
  try:
    records = run_suite(runner, prompts, workdir, run_settings, log=log)
  except ResumeError as e:
    sys.exit(f"FATAL: {e}")
  title = (
    f"{table}: {target.name} ({_DTYPE.value}), {len(prompts)} prompts from {source}, "
    f"{max_new} new tokens, greedy"
  )
  if table == "spec_bench":
    cats = list(dict.fromkeys(p.category for p in prompts))
    body = paper.spec_bench_table(records, cats)
  elif table == "eagle3":
    body = paper.eagle3_table(records, EAGLE3_TASKS)
  else:
    ids = target.tokenizer.encode_chat([{"role": "user", "content": prompts[0].turns[0]}])
    costs = {m.name: draft_cost_ratio(target, m, ids) for m in methods}
    for name, c in costs.items():
      log(f"  cost {name}: propose {c['draft_s'] * 1e3:.1f} ms, target step "
          f"{c['target_step_s'] * 1e3:.1f} ms, c = {c['c']:.3f}")  # fmt: skip
    ks = {m.name: m.drafter.k for m in methods}
    body = paper.leviathan_table(paper.leviathan_rows(records, costs, ks))
  if _PAIRED.value:
    ok = [r for r in records if "methods" in r]  # error records have no timings
    body += "\n\nPaired by prompt (geometric mean of tok/s ratios, bootstrap 95% interval):\n\n"
    body += paper.paired_table(ok, _PAIRED.value)
  skipped = skipped_summary(skipped_records(workdir, prompts), len(prompts))
  text = f"# {title}\n\n" + (f"{skipped}\n\n" if skipped else "") + f"{body}\n"
  print("\n" + text)
  with open(os.path.join(workdir, "table.md"), "w") as f:
    f.write(text)
  written = plots.write_plots(records, workdir, f"{target.name} on {source}, {max_new} new tokens")
  print(f"wrote {workdir}/table.md, records.jsonl" + "".join(f", {p}" for p in written))


if __name__ == "__main__":
  app.run(main)
