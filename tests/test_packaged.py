"""Packaged data (fetch + verify) and answer checking (the code sandbox: tests/test_sandbox.py)."""

from __future__ import annotations

import hashlib
import os
import zipfile

import pytest

from specjax import packages
from specjax.experiment import packaged


def _fake_wheel(cache, member, payload):
  os.makedirs(os.path.join(cache, "packages"))
  path = os.path.join(cache, "packages", "fake_pkg-1.0-py3-none-any.whl")
  with zipfile.ZipFile(path, "w") as z:
    z.writestr(member, payload)
  return hashlib.sha256(payload).hexdigest()


def test_fetch_member_verifies_sha256(tmp_path, monkeypatch):
  monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path))
  sha = _fake_wheel(str(tmp_path), "fake_pkg/data.txt", b"hello")
  path = packages.fetch_member("fake-pkg==1.0", "fake_pkg/data.txt", sha)
  assert open(path, "rb").read() == b"hello"
  assert packages.fetch_member("fake-pkg==1.0", "fake_pkg/data.txt", sha) == path  # cached
  with pytest.raises(packages.PackageDataError, match="sha256"):
    packages.fetch_member("fake-pkg==1.0", "fake_pkg/data.txt", "0" * 64)


def test_gsm8k_answer_check():
  p = packaged.Problem("gsm8k", "0", "q", "1234")
  assert packaged.gsm8k_correct(p, "so the total is 1,234.")
  assert packaged.gsm8k_correct(p, "#### 1234")
  assert not packaged.gsm8k_correct(p, "it is 1233")
  assert not packaged.gsm8k_correct(p, "no idea")


def test_extract_code_prefers_fenced_block():
  p = packaged.Problem("humaneval", "x", "q", "", "f", "def f(x):\n")
  assert packaged.extract_code(p, "Sure:\n```python\ndef f(x):\n  return x\n```") == (
    "def f(x):\n  return x\n"
  )
  assert packaged.extract_code(p, "  return x\n").startswith("def f(x):\n")


def _problems():
  return [
    packaged.Problem("humaneval", f"HumanEval/{i}", "", "", f"f{i}", f"def f{i}(x):\n  '''{i}'''\n")
    for i in range(3)
  ]


def test_humaneval_paraphrases_are_adjacent_deterministic_rewordings():
  problems = _problems()
  prompts = packaged.humaneval_paraphrases(problems, per_task=4)
  assert prompts == packaged.humaneval_paraphrases(problems, per_task=4)  # deterministic
  assert len(prompts) == 12
  ids = [p.prompt_id for p in prompts]
  assert all(isinstance(i, str) for i in ids) and len(set(ids)) == len(ids)
  for t, problem in enumerate(problems):
    group = prompts[4 * t : 4 * t + 4]  # one task's paraphrases, one after the other
    assert all(p.prompt_id.startswith(f"{problem.problem_id}#") for p in group)
    assert all(len(p.turns) == 1 and problem.code_prefix in p.turns[0] for p in group)
    wordings = {p.turns[0].replace(problem.code_prefix, "") for p in group}
    assert len(wordings) == 4  # only the instruction around the code differs, and it does
    assert [p.category for p in group] == [packaged.PARAPHRASE_FIRST] + 3 * [
      packaged.PARAPHRASE_REPEAT
    ]
  assert prompts[0].turns[0] == packaged.HUMANEVAL_ASK + problems[0].code_prefix  # humaneval's


def test_humaneval_paraphrases_rejects_too_many():
  n = len(packaged.PARAPHRASE_TEMPLATES)
  assert len(packaged.humaneval_paraphrases(_problems()[:1], per_task=n)) == n
  with pytest.raises(ValueError, match="per_task"):
    packaged.humaneval_paraphrases(_problems(), per_task=n + 1)
  with pytest.raises(ValueError, match="per_task"):
    packaged.humaneval_paraphrases(_problems(), per_task=0)
