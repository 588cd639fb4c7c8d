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
