"""Which prompts an experiment runs: Spec-Bench from a file, or the packaged default suite.

`data.suite = "auto"` (the default) reads Spec-Bench from an explicit path (`--spec_bench` or
`$SPECJAX_SPEC_BENCH`), which must then exist, or else from `../shared/data/spec_bench/` beside the
clone; only when no path was given and that default file is absent does it fall back to the
always-available suite from PyPI data packages (`specjax.experiment.packaged`). The choice, and why,
is logged as one line before anything runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from specjax.experiment import packaged
from specjax.experiment.settings import ExperimentSettings
from specjax.experiment.tasks import (
  DEFAULT_SOURCE,
  SPEC_BENCH_CATEGORIES,
  SPEC_BENCH_ENV,
  Prompt,
  find_spec_bench,
  load_spec_bench,
  spec_bench_source,
)


def choose_suite(suite: str, spec_bench: str = "") -> tuple[str, str]:
  """("spec_bench" or "packaged", why) for `data.suite` and the `--spec_bench` flag's value.

  Raises:
    FileNotFoundError: for a Spec-Bench path that was given (or suite "spec_bench") but is absent.
    ValueError: for `--spec_bench` together with suite "packaged".
  """
  if suite == "packaged":
    if spec_bench:
      raise ValueError(f"--spec_bench={spec_bench} conflicts with config.data.suite=packaged")
    return "packaged", "config.data.suite=packaged"
  path, how = spec_bench_source(spec_bench)
  if suite == "auto" and how == DEFAULT_SOURCE and not os.path.isfile(path):
    given = f"no Spec-Bench file was given (--spec_bench or ${SPEC_BENCH_ENV})"
    return "packaged", f"{given} and none is at {path}"
  find_spec_bench(spec_bench)  # raises if a given (or required) file is absent
  return "spec_bench", f"from {how}" + (" (config.data.suite=spec_bench)" * (suite == "spec_bench"))


def load_prompts(
  settings: ExperimentSettings, spec_bench: str = "", log: Callable[[str], None] = print
) -> tuple[str, list[Prompt]]:
  """(a description of the source, the prompts) for `settings.data`; logs which suite and why.

  Raises:
    FileNotFoundError: when a Spec-Bench file was asked for (a path, `$SPECJAX_SPEC_BENCH`, or
      suite "spec_bench") and is not there.
    ValueError: for categories the chosen suite does not have.
  """
  suite, why = choose_suite(settings.suite, spec_bench)
  if suite == "spec_bench":
    path = find_spec_bench(spec_bench)
    log(f"prompts: Spec-Bench {path} ({why})")
    cats = settings.categories or SPEC_BENCH_CATEGORIES
    return path, load_spec_bench(path, cats, settings.per_category, settings.turns)
  cats = settings.categories or packaged.DEFAULT_CATEGORIES
  log(f"prompts: the packaged default suite ({', '.join(cats)}) because {why}")
  prompts = packaged.load_default_suite(cats, settings.per_category, settings.turns)
  return "PyPI data packages (" + ", ".join(cats) + ")", prompts
