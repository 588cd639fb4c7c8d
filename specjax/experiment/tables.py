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
  K chosen                  adaptive methods (`specjax.adaptive`): share of decode steps that ran
                            each K (0 = an AR step), pooled.
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
    if all("k_steps" in m for m in ms):
      rows[-1]["k_share"] = k_share([m["k_steps"] for m in ms])
  return rows


def k_share(k_steps: Sequence[dict]) -> dict[str, float]:
  """Pooled share of steps per chosen K, from records' {"K": steps} counts, by ascending K."""
  total: dict[str, int] = {}
  for d in k_steps:
    for k, n in d.items():
      total[k] = total.get(k, 0) + n
  n_all = max(sum(total.values()), 1)
  return {k: total[k] / n_all for k in sorted(total, key=int)}


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
  adaptive = any("k_share" in r for r in rows)
  lines = [
    "| category | method | prompts | AR tok/s | method tok/s | speedup | tau | acceptance "
    "| same as AR |" + " K chosen |" * adaptive,
    "|---|---|---:|---:|---:|---:|---:|---:|---:|" + "---|" * adaptive,
  ]
  for r in rows:
    k = " ".join(f"{k}:{100 * v:.0f}%" for k, v in r.get("k_share", {}).items())
    lines.append(
      f"| {r['category']} | {r['method']} | {r['prompts']} | {r['ar_tok_s']:.2f} "
      f"| {r['tok_s']:.2f} | {r['speedup']:.2f}x | {r['tau']:.2f} | {r['acceptance_rate']:.3f} "
      f"| {r['same_as_ar']}/{r['prompts']} |" + f" {k} |" * adaptive
    )
  return "\n".join(lines)


def write_csv(rows: Sequence[dict], path: str) -> None:
  """Writes `summary_rows` to CSV; per-position alpha as alpha_1 .. alpha_K columns."""
  k = max((len(r.get("alpha_at", [])) for r in rows), default=0)
  chosen = sorted({c for r in rows for c in r.get("k_share", {})}, key=int)
  fields = ["category", "method", "prompts", "ar_tok_s", "tok_s", "speedup", "tau"]
  fields += ["acceptance_rate", "same_as_ar"] + [f"alpha_{i + 1}" for i in range(k)]
  fields += [f"share_k{c}" for c in chosen]
  with open(path, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
    w.writeheader()
    for r in rows:
      alphas = {f"alpha_{i + 1}": a for i, a in enumerate(r.get("alpha_at", []))}
      shares = {f"share_k{c}": v for c, v in r.get("k_share", {}).items()}
      w.writerow({**r, **alphas, **shares})
