"""Runs untrusted generated code only in a separate, isolated Python process with a timeout."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

_LIMITS = """
import resource
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
resource.setrlimit(resource.RLIMIT_CPU, (10, 10))
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
resource.setrlimit(resource.RLIMIT_NPROC, (64, 64))
"""


def run_python(code: str, timeout: float = 10.0) -> bool:
  """True if `code` exits with status 0 within `timeout` seconds.

  The code runs in `python -I` (isolated: no user site, no env-var hooks) in an empty temporary
  directory, with memory, CPU, file-size and process limits, no stdin, and a minimal environment.
  """
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "program.py")
    with open(path, "w") as f:
      f.write(_LIMITS + "\n" + code)
    try:
      proc = subprocess.run(
        [sys.executable, "-I", path],
        cwd=tmp,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=timeout,
        env={"PATH": "/usr/bin:/bin", "HOME": tmp},
      )
    except subprocess.TimeoutExpired:
      return False
    return proc.returncode == 0


def humaneval_passes(code: str, test: str, entry_point: str, timeout: float = 10.0) -> bool:
  """HumanEval's check: the completion, its test code, then `check(entry_point)`."""
  return run_python(f"{code}\n\n{test}\n\ncheck({entry_point})\n", timeout)
