"""Which prompts an experiment runs: Spec-Bench from a file, or the packaged default suite.

`data.suite = "auto"` (the default) reads Spec-Bench when its file is found (an explicit path,
`$SPECJAX_SPEC_BENCH`, or `../shared/data/spec_bench/` beside the clone) and otherwise falls back
to the always-available suite from PyPI data packages (`specjax.experiment.packaged`).
"""

from __future__ import annotations

from specjax.experiment import packaged
from specjax.experiment.settings import ExperimentSettings
from specjax.experiment.tasks import SPEC_BENCH_CATEGORIES, Prompt, find_spec_bench, load_spec_bench


def load_prompts(settings: ExperimentSettings, spec_bench: str = "") -> tuple[str, list[Prompt]]:
  """(a description of the source, the prompts) for `settings.data`.

  Raises:
    FileNotFoundError: for suite "spec_bench" when the file is not found.
    ValueError: for categories the chosen suite does not have.
  """
  suite = settings.suite
  if suite == "auto":
    try:
      find_spec_bench(spec_bench)
      suite = "spec_bench"
    except FileNotFoundError:
      suite = "packaged"
  if suite == "spec_bench":
    path = find_spec_bench(spec_bench)
    cats = settings.categories or SPEC_BENCH_CATEGORIES
    return path, load_spec_bench(path, cats, settings.per_category, settings.turns)
  cats = settings.categories or packaged.DEFAULT_CATEGORIES
  prompts = packaged.load_default_suite(cats, settings.per_category, settings.turns)
  return "PyPI data packages (" + ", ".join(cats) + ")", prompts
