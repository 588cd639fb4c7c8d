"""Per-category and overall statistics of a run's records, as Markdown and CSV.

Per category (and over all prompts):
  AR tok/s, <method> tok/s  mean over prompts of generated tokens / wall seconds.
  speedup                   mean over prompts of (method tok/s / AR tok/s), Spec-Bench's convention.
  tau                       sum of emitted tokens / sum of target verify passes (see
                            `specjax.metrics`), pooled over the prompts.
  acceptance                sum accepted (committed drafts, see `specjax.metrics`) / sum
                            drafted, pooled.
  alpha_i                   per draft position: passes that accepted position i / passes that
                            reached it, pooled (in the CSV).
  same as AR                prompts whose output equals the AR baseline's token for token.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence

import numpy as np

OVERALL = "overall"


def _rows_for(records: Sequence[dict], label: str, methods: Sequence[str]) -> list[dict]:
  ar_tok_s = float(np.mean([r["ar"]["tok_s"] for r in records]))
  base = {"category": label, "prompts": len(records), "ar_tok_s": ar_tok_s}
  if not methods:
    return [{**base, "method": "ar"}]
  rows = []
  for name in methods:
    ms = [r["methods"][name] for r in records]
    passes = sum(m["target_passes"] for m in ms)
    accepted_at = np.sum([m["accepted_at"] for m in ms], 0)
    reached_at = np.sum([m["reached_at"] for m in ms], 0)
    rows.append(
      {
        **base,
        "method": name,
        "tok_s": float(np.mean([m["tok_s"] for m in ms])),
        "speedup": float(np.mean([m["speedup"] for m in ms])),
        "tau": sum(m["emitted"] for m in ms) / max(passes, 1),
        "acceptance_rate": sum(m["accepted"] for m in ms) / max(sum(m["drafted"] for m in ms), 1),
        "alpha_at": (accepted_at / np.maximum(reached_at, 1)).tolist(),
        "same_as_ar": sum(bool(m["same_as_ar"]) for m in ms),
      }
    )
  return rows


def method_names(records: Sequence[dict]) -> list[str]:
  names: list[str] = []
  for r in records:
    names += [n for n in r["methods"] if n not in names]
  return names


def summary_rows(records: Sequence[dict]) -> list[dict]:
  """One row per (category, method) in first-seen category order, then the overall rows."""
  if not records:
    return []
  methods = method_names(records)
  cats = list(dict.fromkeys(r["category"] for r in records))
  rows = []
  for c in cats:
    rows += _rows_for([r for r in records if r["category"] == c], c, methods)
  return rows + _rows_for(records, OVERALL, methods)


def markdown(rows: Sequence[dict]) -> str:
  """A Markdown table of `summary_rows`."""
  if not rows:
    return "(no records)"
  if "tok_s" not in rows[0]:
    lines = ["| category | prompts | AR tok/s |", "|---|---:|---:|"]
    lines += [f"| {r['category']} | {r['prompts']} | {r['ar_tok_s']:.2f} |" for r in rows]
    return "\n".join(lines)
  lines = [
    "| category | method | prompts | AR tok/s | method tok/s | speedup | tau | acceptance "
    "| same as AR |",
    "|---|---|---:|---:|---:|---:|---:|---:|---:|",
  ]
  for r in rows:
    lines.append(
      f"| {r['category']} | {r['method']} | {r['prompts']} | {r['ar_tok_s']:.2f} "
      f"| {r['tok_s']:.2f} | {r['speedup']:.2f}x | {r['tau']:.2f} | {r['acceptance_rate']:.3f} "
      f"| {r['same_as_ar']}/{r['prompts']} |"
    )
  return "\n".join(lines)


def write_csv(rows: Sequence[dict], path: str) -> None:
  """Writes `summary_rows` to CSV; per-position alpha as alpha_1 .. alpha_K columns."""
  k = max((len(r.get("alpha_at", [])) for r in rows), default=0)
  fields = ["category", "method", "prompts", "ar_tok_s", "tok_s", "speedup", "tau"]
  fields += ["acceptance_rate", "same_as_ar"] + [f"alpha_{i + 1}" for i in range(k)]
  with open(path, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
    w.writeheader()
    for r in rows:
      alphas = {f"alpha_{i + 1}": a for i, a in enumerate(r.get("alpha_at", []))}
      w.writerow({**r, **alphas})
