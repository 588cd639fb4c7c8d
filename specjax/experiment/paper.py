"""Paper-shaped tables built from run records (`records.jsonl` of `specjax.experiment.runner`).

  spec_bench_table  Spec-Bench (Xia et al. 2024), Table 1 shape: a row per method, the speedup per
                    category, the mean accepted tokens (tau over all prompts) and the overall speedup.
  eagle3_table      EAGLE-3 (Li et al. 2025), Table 1 shape: a column per task with
                    "speedup / tau", and their means over tasks.
  paired_table      every method against one of them, prompt by prompt: the geometric mean over
                    prompts of (method tok/s / base tok/s), with a bootstrap 95% interval (the
                    runner times every method on the same prompt, so prompts pair; machine noise
                    shared by a prompt's runs cancels).
  leviathan_rows    Leviathan et al. (2023) theory next to measurement: per method and K, the
                    measured alpha (pooled conditional acceptance: accepted draft positions over
                    reached ones, the i.i.d. estimate) and cost ratio c, the predicted tokens per
                    pass (1 - a^(K+1)) / (1 - a) and walltime factor (1 - a^(K+1)) / ((1 - a)(K c + 1)),
                    beside the measured tau and speedup.
Speedups and tau follow `specjax.experiment.tables` (mean over prompts of tok/s ratios; pooled tau).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specjax.experiment.tables import OVERALL, method_names, summary_rows


def _cells(records: Sequence[dict]) -> dict[tuple[str, str], dict]:
  return {(r["category"], r["method"]): r for r in summary_rows(records) if "method" in r}


def spec_bench_table(records: Sequence[dict], categories: Sequence[str]) -> str:
  """Rows: methods; columns: speedup per category, mean accepted tokens, overall speedup."""
  cells, methods = _cells(records), method_names(records)
  head = ["method", *categories, "mean accepted tokens", OVERALL]
  lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
  for m in methods:
    row = [m]
    for c in categories:
      row.append(f"{cells[(c, m)]['speedup']:.2f}x" if (c, m) in cells else "-")
    overall = cells[(OVERALL, m)]
    row += [f"{overall['tau']:.2f}", f"{overall['speedup']:.2f}x"]
    lines.append("| " + " | ".join(row) + " |")
  return "\n".join(lines)


def eagle3_table(records: Sequence[dict], tasks: Sequence[tuple[str, str]]) -> str:
  """Columns: one per (category, label) in `tasks`, each "speedup / tau", then their means."""
  cells, methods = _cells(records), method_names(records)
  present = [(c, label) for c, label in tasks if any((c, m) in cells for m in methods)]
  head = ["method", *(f"{label} speedup / tau" for _, label in present), "mean speedup / tau"]
  lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
  for m in methods:
    row, sp, tau = [m], [], []
    for c, _ in present:
      cell = cells.get((c, m))
      row.append(f"{cell['speedup']:.2f}x / {cell['tau']:.2f}" if cell else "-")
      if cell:
        sp.append(cell["speedup"])
        tau.append(cell["tau"])
    row.append(f"{np.mean(sp):.2f}x / {np.mean(tau):.2f}")
    lines.append("| " + " | ".join(row) + " |")
  return "\n".join(lines)


def paired_ratio(
  records: Sequence[dict], method: str, base: str, n_boot: int = 2000, seed: int = 0
):
  """(geometric mean over prompts of method tok/s / base tok/s, 2.5th and 97.5th percentiles of
  that mean over `n_boot` resamplings of the prompts); "ar" names the AR baseline."""
  tok_s = lambda r, m: r["ar"]["tok_s"] if m == "ar" else r["methods"][m]["tok_s"]
  logs = np.log([tok_s(r, method) / tok_s(r, base) for r in records])
  idx = np.random.default_rng(seed).integers(0, len(logs), (n_boot, len(logs)))
  lo, hi = np.exp(np.percentile(logs[idx].mean(1), [2.5, 97.5]))
  return float(np.exp(logs.mean())), float(lo), float(hi)


def paired_table(records: Sequence[dict], base: str) -> str:
  """Rows: every method, as `paired_ratio` against `base` (a method name or "ar")."""
  lines = [f"| method | paired vs {base} | 95% interval |", "|---|---:|---|"]
  for m in ["ar", *method_names(records)]:
    r, lo, hi = paired_ratio(records, m, base)
    lines.append(f"| {m} | {r:.3f} | [{lo:.3f}, {hi:.3f}] |")
  return "\n".join(lines)


def expected_tokens(alpha: float, k: int) -> float:
  """Leviathan et al. eq. (1): expected tokens per target pass, (1 - a^(K+1)) / (1 - a)."""
  return float(k + 1) if alpha >= 1.0 else (1 - alpha ** (k + 1)) / (1 - alpha)


def walltime_factor(alpha: float, k: int, c: float) -> float:
  """Leviathan et al. Theorem 3.8: expected walltime improvement, E[tokens] / (K c + 1)."""
  return expected_tokens(alpha, k) / (k * c + 1)


def leviathan_rows(records: Sequence[dict], costs: dict[str, dict], ks: dict[str, int]) -> list:
  """One row per method: K, measured alpha and c, predictions and measurements.

  Args:
    records: run records holding every method.
    costs: method name -> `specjax.experiment.costs.draft_cost_ratio` result.
    ks: method name -> draft length K.
  """
  rows = []
  for m in method_names(records):
    ms = [r["methods"][m] for r in records]
    reached = np.sum([x["reached_at"] for x in ms], 0)
    accepted = np.sum([x["accepted_at"] for x in ms], 0)
    alpha = float(accepted.sum() / max(reached.sum(), 1))
    c, k = costs[m]["c"], ks[m]
    overall = _cells(records)[(OVERALL, m)]
    rows.append(
      {
        "method": m,
        "k": k,
        "alpha": alpha,
        "c": c,
        "pred_tau": expected_tokens(alpha, k),
        "tau": overall["tau"],
        "pred_speedup": walltime_factor(alpha, k, c),
        "speedup": overall["speedup"],
      }
    )
  return rows


def leviathan_table(rows: Sequence[dict]) -> str:
  head = "| method | K | alpha | c | predicted tau | measured tau | predicted speedup | measured speedup |"
  lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|"]
  for r in rows:
    lines.append(
      f"| {r['method']} | {r['k']} | {r['alpha']:.3f} | {r['c']:.3f} | {r['pred_tau']:.2f} "
      f"| {r['tau']:.2f} | {r['pred_speedup']:.2f}x | {r['speedup']:.2f}x |"
    )
  return "\n".join(lines)
