"""Plots (PNG, matplotlib) and TensorBoard scalars of a run's records.

  acceptance_per_position.png  alpha_i (accepted / reached at draft position i, pooled over all
                               prompts) per method.
  speedup_per_task.png         speedup over AR per category and method (bars).
  tensorboard/                 scalars per method (tag "<category>/<metric>", overall under
                               "overall/"), readable by `tensorboard --logdir WORKDIR/tensorboard`.

Every plot has a title naming the metric and what was run (`context`, e.g. the target and the
suite). Methods get distinct colours from colormaps of up to 20 colours, with a line style (and
bar hatch) per further group of colours, so no two methods of a run look alike.

matplotlib and tensorboardX are optional (the `plots` extra); without them nothing is written and
the returned list says why. A run that compiles many programs can use up the process's memory
mappings (`vm.max_map_count`) before it ends, after which loading those libraries' shared objects
fails ("OSError: ... failed to map segment from shared object", seen at the end of a 21-method
Spec-Bench table): `experiments/paper_tables.py` calls `preload` before compiling, and
`write_plots` reports such a failure instead of raising it.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence

from specjax.experiment.tables import OVERALL, summary_rows

SCALARS = ("speedup", "tau", "acceptance_rate", "tok_s", "ar_tok_s")


LINE_STYLES = ("-", "--", ":", "-.")
HATCHES = ("", "//", "..", "xx")


def _method_rows(records: Sequence[dict]) -> list[dict]:
  return [r for r in summary_rows(records) if "tok_s" in r]


def method_style(j: int, n: int) -> tuple[tuple[float, ...], int]:
  """(RGBA colour, style index) of method j of n: tab10 up to 10 methods, then tab20 (20 distinct
  colours); past 20 the colours repeat with the next line style / hatch (style index j // 20)."""
  from matplotlib import colormaps

  cmap = colormaps["tab10" if n <= 10 else "tab20"]
  return cmap(j % cmap.N), j // cmap.N


def _title(what: str, context: str) -> str:
  return f"{what}\n{context}" if context else what


def plot_acceptance(records: Sequence[dict], path: str, context: str = "") -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(6, 4))
  rows = [r for r in _method_rows(records) if r["category"] == OVERALL and r["alpha_at"]]
  for j, r in enumerate(rows):
    color, style = method_style(j, len(rows))
    xs = range(1, len(r["alpha_at"]) + 1)
    ls = LINE_STYLES[style % len(LINE_STYLES)]
    ax.plot(xs, r["alpha_at"], marker="o", color=color, linestyle=ls, label=r["method"])
  ax.set_xlabel("draft position i")
  ax.set_ylabel("alpha_i (accepted / reached)")
  ax.set_ylim(0, 1)
  ax.set_title(_title("acceptance alpha_i per draft position, all prompts", context), fontsize=9)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def plot_speedup(records: Sequence[dict], path: str, context: str = "") -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import numpy as np

  rows = _method_rows(records)
  cats = list(dict.fromkeys(r["category"] for r in rows))
  methods = list(dict.fromkeys(r["method"] for r in rows))
  cell = {(r["category"], r["method"]): r["speedup"] for r in rows}
  width = 0.8 / max(len(methods), 1)
  fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(cats)), 4))
  for j, m in enumerate(methods):
    ys = [cell.get((c, m), 0.0) for c in cats]
    color, style = method_style(j, len(methods))
    hatch = HATCHES[style % len(HATCHES)]
    ax.bar(np.arange(len(cats)) + j * width, ys, width, color=color, hatch=hatch, label=m)
  ax.axhline(1.0, color="k", lw=0.8)
  ax.set_xticks(np.arange(len(cats)) + 0.4 - width / 2, cats, rotation=30, ha="right")
  ax.set_ylabel("speedup over AR")
  ax.set_title(_title("speedup over AR per task (mean over prompts)", context), fontsize=9)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def write_scalars(records: Sequence[dict], logdir: str) -> None:
  """One TensorBoard run per method; step = draft position for alpha_i, 0 otherwise."""
  from tensorboardX import SummaryWriter

  rows = _method_rows(records)
  for method in dict.fromkeys(r["method"] for r in rows):
    with SummaryWriter(os.path.join(logdir, method)) as w:
      for r in (r for r in rows if r["method"] == method):
        for name in SCALARS:
          w.add_scalar(f"{r['category']}/{name}", r[name], 0)
        for i, a in enumerate(r["alpha_at"]):
          w.add_scalar(f"{r['category']}/alpha_at", a, i + 1)


def preload() -> None:
  """Loads matplotlib (Agg) and tensorboardX, when installed, while the process can still map
  their shared objects."""
  for name in ("matplotlib", "matplotlib.pyplot", "tensorboardX"):
    try:
      module = importlib.import_module(name)
    except ImportError:
      continue
    if name == "matplotlib":
      module.use("Agg")


def write_plots(records: Sequence[dict], workdir: str, context: str = "") -> list[str]:
  """Writes the PNGs and TensorBoard scalars into `workdir`; returns what it wrote (or why not).

  Args:
    records: the run's records.
    workdir: where to write.
    context: what was run, for the plot titles (e.g. "smollm2-135m-instruct on Spec-Bench").
  """
  if not _method_rows(records):
    return []
  out = []
  try:
    plot_acceptance(records, os.path.join(workdir, "acceptance_per_position.png"), context)
    plot_speedup(records, os.path.join(workdir, "speedup_per_task.png"), context)
    out += ["acceptance_per_position.png", "speedup_per_task.png"]
  except ImportError:
    out.append("(no plots: pip install -e '.[plots]')")
  except OSError as e:
    out.append(f"(no plots: {e})")
  try:
    write_scalars(records, os.path.join(workdir, "tensorboard"))
    out.append("tensorboard/")
  except ImportError:
    out.append("(no TensorBoard scalars: pip install -e '.[plots]')")
  except OSError as e:
    out.append(f"(no TensorBoard scalars: {e})")
  return out
