"""Held-out learning curves of training runs, as markdown tables.

  python train/curve.py /tmp/specjax_train_eagle3 [/tmp/other_run ...]

For each work directory: one row per held-out evaluation in `metrics.jsonl` (step, each
per-position top-1 agreement, the chained agreement `prefix_step{j}` (depths 1..j all right),
simulated tau, and the same over each response's first N tokens when the run scored them,
`train.eval_first`) and the step kept as best (`best/best.json`);
with several directories, a last table of each run's training positions and best row (a
data-scaling table when the runs differ only in `data.train_positions`).
"""

from __future__ import annotations

import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from train.loop import read_metrics  # noqa: E402


def evaluations(workdir: str) -> list[dict]:
  """{"step", metric: value} per evaluation, in step order (a later record of a step wins)."""
  by_step = {}
  for r in read_metrics(os.path.join(workdir, "metrics.jsonl")):
    if "eval" in r:
      by_step[r["step"]] = r["eval"]
  return [{"step": step, **by_step[step]} for step in sorted(by_step)]


def _rate_keys(rows: list[dict]) -> list[str]:
  keys = {k for r in rows for k in r if k.startswith(("top1", "prefix"))}
  return sorted(keys, key=lambda k: (len(k), k))


def best(workdir: str) -> dict | None:
  path = os.path.join(workdir, "best", "best.json")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def run_info(workdir: str) -> dict:
  with open(os.path.join(workdir, "run.json")) as f:
    return json.load(f)


def curve_table(workdir: str) -> str:
  rows = evaluations(workdir)
  if not rows:
    return f"{workdir}: no held-out evaluation yet"
  keys = _rate_keys(rows)
  cols = keys + ["simulated_tau"]
  if any("first_simulated_tau" in r for r in rows):  # the run scored each response's opening too
    cols += ["first_" + k for k in cols]
  kept = (best(workdir) or {}).get("step")
  lines = [
    f"**{os.path.basename(os.path.normpath(workdir))}**",
    "",
    "| step | " + " | ".join(cols) + " |",
    "|---:|" + "---:|" * len(cols),
  ]
  for r in rows:
    mark = " (kept)" if r["step"] == kept else ""
    cells = " | ".join(f"{r[k]:.3f}" if k in r else "" for k in cols)
    lines.append(f"| {r['step']}{mark} | {cells} |")
  return "\n".join(lines)


def scaling_table(workdirs: list[str]) -> str:
  lines = ["| run | training positions | best step | per-position top-1 | simulated tau |"]
  lines.append("|---|---:|---:|---|---:|")
  for w in workdirs:
    b, info = best(w), run_info(w)
    if b is None:
      continue
    keys = _rate_keys([b["eval"]])
    rates = " / ".join(f"{b['eval'][k]:.3f}" for k in keys)
    n = info.get("train_positions") or "all"
    name = os.path.basename(os.path.normpath(w))
    lines.append(f"| {name} | {n} | {b['step']} | {rates} | {b['simulated_tau']:.3f} |")
  return "\n".join(lines)


def main(argv: list[str]) -> None:
  if not argv:
    sys.exit(__doc__)
  for w in argv:
    print(curve_table(w) + "\n")
  if len(argv) > 1:
    print(scaling_table(argv))


if __name__ == "__main__":
  main(sys.argv[1:])
