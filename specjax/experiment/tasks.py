"""Task suites: Spec-Bench's prompts, read from a file the user points to, as chat conversations.

Spec-Bench (Xia et al. 2024) has 480 questions, 80 in each of six categories. Its `question.jsonl`
labels the 80 MT-bench questions with MT-bench's own sub-categories (writing, roleplay, ...); they
are grouped here under `mt_bench`. MT-bench questions have two user turns; the second is asked after
the model's own answer to the first (the harness fills that in, see `specjax.experiment.runner`).
The file is never copied into this repository: pass its path, set `$SPECJAX_SPEC_BENCH`, or keep
the shared data directory beside the clone (`../shared/data/spec_bench/question.jsonl`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence

SPEC_BENCH_CATEGORIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
MT_BENCH_SUBCATEGORIES = frozenset(
  {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}
)
SPEC_BENCH_ENV = "SPECJAX_SPEC_BENCH"
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED_SPEC_BENCH = os.path.join(
  os.path.dirname(_REPO_ROOT), "shared", "data", "spec_bench", "question.jsonl"
)


@dataclasses.dataclass(frozen=True)
class Prompt:
  """One benchmark question.

  Attributes:
    category: one of `SPEC_BENCH_CATEGORIES`.
    prompt_id: the file's `question_id` (an integer or a string such as "fq-785e39b4"), unique
      within a suite.
    turns: the user messages, asked one after another.
  """

  category: str
  prompt_id: int | str
  turns: tuple[str, ...]


DEFAULT_SOURCE = "the default location"  # how `spec_bench_source` names its fallback


def spec_bench_source(path: str = "") -> tuple[str, str]:
  """(the Spec-Bench path to read, how it was chosen): `path`, else `$SPECJAX_SPEC_BENCH`, else
  `../shared` beside the repo. Only the last one is a default; the others were given."""
  if path:
    return path, "--spec_bench"
  if os.environ.get(SPEC_BENCH_ENV, ""):
    return os.environ[SPEC_BENCH_ENV], f"${SPEC_BENCH_ENV}"
  return SHARED_SPEC_BENCH, DEFAULT_SOURCE


def find_spec_bench(path: str = "") -> str:
  """The Spec-Bench file: `path`, else `$SPECJAX_SPEC_BENCH`, else `../shared` beside the repo.

  Raises:
    FileNotFoundError: if the chosen file does not exist.
  """
  chosen, how = spec_bench_source(path)
  if os.path.isfile(chosen):
    return chosen
  raise FileNotFoundError(
    f"Spec-Bench question.jsonl not found at {chosen} (from {how}); pass --spec_bench=PATH or set "
    f"${SPEC_BENCH_ENV} (the file is never copied into this repository)"
  )


def spec_bench_category(raw: str) -> str:
  """Maps a `category` field of question.jsonl to one of the six Spec-Bench categories."""
  if raw in MT_BENCH_SUBCATEGORIES:
    return "mt_bench"
  if raw in SPEC_BENCH_CATEGORIES:
    return raw
  raise ValueError(f"unknown Spec-Bench category {raw!r}")


def load_spec_bench(
  path: str,
  categories: Sequence[str] = SPEC_BENCH_CATEGORIES,
  per_category: int | None = None,
  turns: int = 2,
) -> list[Prompt]:
  """Reads Spec-Bench questions, in file order, the first `per_category` of each category.

  Args:
    path: a Spec-Bench `question.jsonl` (fields `question_id`, `category`, `turns`).
    categories: which categories to keep.
    per_category: how many of each (None: all).
    turns: keep at most this many user turns per question.

  Returns:
    The prompts, grouped by category in the order of `categories`.

  Raises:
    ValueError: for a line that is not a question, text that is not UTF-8, or a `question_id`
      that appears twice (the error names every duplicate and its lines).
  """
  by_cat: dict[str, list[Prompt]] = {c: [] for c in categories}
  lines_of: dict[int | str, list[int]] = {}
  for line_no, line in enumerate(_read_lines(path), 1):
    if not line.strip():
      continue
    try:
      rec = json.loads(line)
      cat = spec_bench_category(rec["category"])
      prompt = Prompt(cat, question_id(rec["question_id"]), tuple(rec["turns"][:turns]))
    except (ValueError, KeyError, TypeError) as e:
      raise ValueError(f"{path}:{line_no}: not a Spec-Bench question ({e})") from e
    lines_of.setdefault(prompt.prompt_id, []).append(line_no)
    if cat in by_cat and (per_category is None or len(by_cat[cat]) < per_category):
      by_cat[cat].append(prompt)
  dups = {i: ns for i, ns in lines_of.items() if len(ns) > 1}
  if dups:
    where = "; ".join(f"{i!r} on lines {', '.join(map(str, ns))}" for i, ns in dups.items())
    raise ValueError(f"{path}: duplicate question_id ({where}); every question needs its own id")
  missing = [c for c, ps in by_cat.items() if not ps]
  if missing:
    raise ValueError(f"{path} has no questions in categories {missing}")
  return [p for c in categories for p in by_cat[c]]


def question_id(raw) -> int | str:
  """A `question_id` as given: an integer, or a non-empty string (e.g. "fq-785e39b4")."""
  if isinstance(raw, bool) or not isinstance(raw, int | str) or raw == "":
    raise ValueError(f"question_id must be an integer or a non-empty string, got {raw!r}")
  return raw


def _read_lines(path: str) -> list[str]:
  with open(path, "rb") as f:
    data = f.read()
  try:
    return data.decode("utf-8").split("\n")
  except UnicodeDecodeError as e:
    line = data[: e.start].count(b"\n") + 1
    raise ValueError(
      f"{path}:{line}: not UTF-8 text (byte {data[e.start]:#04x} at offset {e.start}); "
      "re-save the file as UTF-8"
    ) from None


def conversation(turns: Sequence[str], answers: Sequence[str]) -> list[dict[str, str]]:
  """Chat messages for the next turn: user turns interleaved with the model's earlier answers."""
  if len(answers) != len(turns) - 1:
    raise ValueError(f"{len(turns)} user turns need {len(turns) - 1} answers, got {len(answers)}")
  messages = []
  for i, user in enumerate(turns):
    messages.append({"role": "user", "content": user})
    if i < len(answers):
      messages.append({"role": "assistant", "content": answers[i]})
  return messages
