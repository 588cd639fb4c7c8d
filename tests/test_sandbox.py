"""The sandbox for generated code: explicit pass token, isolation, group kill, and refusal.

Adversarial snippets run with small timeouts (1-3 s). Tests that need bubblewrap skip, saying why,
when it is missing or cannot create namespaces here (`.ci/run` installs it).
"""

from __future__ import annotations

import os
import secrets
import socket
import sys
import time
from pathlib import Path

import pytest

from specjax.experiment import sandbox

_PROBLEM = sandbox.isolation_problem()
needs_bwrap = pytest.mark.skipif(
  _PROBLEM is not None,
  reason=f"sandbox isolation unavailable: {_PROBLEM}; {sandbox.INSTALL_HINT}",
)
_SQ_TEST = "def check(fn):\n  assert fn(2) == 4\n  assert fn(3) == 9\n"
_WRONG = "def sq(x):\n  return x + 2\n"


def _alive_with(token: str) -> list[str]:
  """Command lines of live (non-zombie) host processes whose argv contains `token`."""
  found = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
      state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
      continue
    if token in cmdline and state not in ("Z", "X") and int(pid) != os.getpid():
      found.append(cmdline)
  return found


def _reexec_with(token: str, body: str) -> str:
  """A program that re-executes itself as `python -c body token`, so its processes carry token."""
  return f"import os, sys\nos.execv(sys.executable, [sys.executable, '-c', {body!r}, {token!r}])\n"


@pytest.fixture
def no_bwrap(monkeypatch):
  """A host without bubblewrap."""
  real_which = sandbox.shutil.which
  monkeypatch.setattr(
    sandbox.shutil, "which", lambda name: None if name == "bwrap" else real_which(name)
  )
  monkeypatch.delenv(sandbox.UNSAFE_ENV, raising=False)


@needs_bwrap
def test_correct_solution_passes_and_wrong_fails():
  ok = sandbox.run(sandbox.humaneval_program("def sq(x):\n  return x * x\n", _SQ_TEST, "sq"), 3)
  assert ok.passed and ok.isolated, ok
  assert not sandbox.humaneval_passes(_WRONG, _SQ_TEST, "sq", timeout=3)
  assert sandbox.run_python("print(sum(range(10)))", timeout=3)
  failed = sandbox.run("raise ValueError('boom')", timeout=3)
  assert not failed.passed and "ValueError: boom" in failed.reason
  looping = sandbox.run("while True:\n  pass\n", timeout=1)
  assert not looping.passed and "timed out" in looping.reason


@needs_bwrap
@pytest.mark.parametrize(
  "early_exit",
  [
    "exit()",
    "quit()",
    "import sys\nsys.exit(0)",
    "import os\nos._exit(0)",
    "raise SystemExit(0)",
    "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
  ],
)
def test_wrong_answer_then_early_exit_fails(early_exit):
  outcome = sandbox.run(sandbox.humaneval_program(_WRONG + early_exit + "\n", _SQ_TEST, "sq"), 3)
  assert not outcome.passed, outcome
  # Exiting inside the function that check() calls fails the same way.
  inside = "import os\ndef sq(x):\n  os._exit(0)\n"
  assert not sandbox.humaneval_passes(inside, _SQ_TEST, "sq", timeout=3)


@needs_bwrap
def test_writing_a_fake_result_to_every_fd_fails():
  code = (
    "import os\n"
    "for fd in range(3, 64):\n"
    "  try:\n    os.write(fd, b'0' * 32)\n  except OSError:\n    pass\n"
    "print('PASSED')\nos._exit(0)\n"
  )
  outcome = sandbox.run(code, timeout=3)
  assert not outcome.passed and "PASSED" in outcome.output, outcome


@needs_bwrap
@pytest.mark.parametrize("setsid", [False, True])
def test_grandchild_does_not_outlive_the_run(tmp_path, setsid):
  token = "specjax-grandchild-" + secrets.token_hex(6)
  late = tmp_path / "late_write"
  child = (
    f"import os, time\n{'os.setsid()' if setsid else ''}\n"
    f"time.sleep(2)\nopen({str(late)!r}, 'w').write('x')\n"
  )
  code = (
    "import os, sys, time\n"
    "if os.fork() == 0:\n"
    f"  os.execv(sys.executable, [sys.executable, '-c', {child!r}, {token!r}])\n"
    "time.sleep(30)\n"
  )
  start = time.monotonic()
  outcome = sandbox.run(code, timeout=1)
  assert not outcome.passed and "timed out" in outcome.reason
  assert time.monotonic() - start < 2.5
  assert _alive_with(token) == []
  time.sleep(max(0.0, start + 2.6 - time.monotonic()))
  assert not late.exists()


@needs_bwrap
def test_writes_outside_the_private_tmp_do_not_reach_the_host(tmp_path):
  name = "specjax_sandbox_probe_" + secrets.token_hex(6)
  repo_file = Path(__file__).resolve().parent / name
  for target in (tmp_path / name, repo_file, Path(sys.base_prefix) / name):
    outcome = sandbox.run(f"open({str(target)!r}, 'w').write('x')\n", timeout=3)
    assert not outcome.passed, (target, outcome)
    assert not target.exists()
  # Its own /tmp is writable but private: the file is gone from the host's view.
  assert sandbox.run_python(f"open('/tmp/{name}', 'w').write('x')\n", timeout=3)
  assert not Path("/tmp", name).exists()


@needs_bwrap
def test_host_files_are_not_visible(tmp_path):
  secret = tmp_path / "secret.txt"
  secret.write_text("host secret")
  outcome = sandbox.run("print(open('/etc/passwd').read())\n", timeout=3)
  assert not outcome.passed and "root:" not in outcome.output
  assert not sandbox.run_python(f"open({str(secret)!r}).read()\n", timeout=3)
  listing = sandbox.run("import os\nprint(sorted(os.listdir('/')))\n", timeout=3)
  assert listing.passed
  for host_dir in ("etc", "home", "work", "var"):
    assert f"'{host_dir}'" not in listing.output, listing.output


@needs_bwrap
def test_network_connect_fails_and_reaches_nothing():
  with socket.socket() as server:
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    port = server.getsockname()[1]
    code = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
    outcome = sandbox.run(code + "s.sendall(b'hi')\n", timeout=3)
    assert not outcome.passed, outcome
    with pytest.raises(TimeoutError):
      server.accept()
  assert not sandbox.run_python("import socket\nsocket.create_connection(('1.1.1.1', 53), 1)\n", 3)


@needs_bwrap
def test_process_limit_applies():
  code = (
    "import os, time\nn = 0\n"
    "for _ in range(200):\n"
    "  try:\n    pid = os.fork()\n  except OSError:\n    break\n"
    "  if pid == 0:\n    time.sleep(5)\n    os._exit(0)\n"
    "  n += 1\n"
    "print('forked', n)\n"
  )
  outcome = sandbox.run(code, timeout=3)
  assert outcome.passed, outcome
  forked = int(outcome.output.split("forked")[1].split()[0])
  assert forked < sandbox.Limits().processes


@needs_bwrap
def test_fork_bomb_is_contained():
  token = "specjax-forkbomb-" + secrets.token_hex(6)
  bomb = "import os\nwhile True:\n  try:\n    os.fork()\n  except OSError:\n    pass\n"
  start = time.monotonic()
  outcome = sandbox.run(_reexec_with(token, bomb), timeout=2)
  assert not outcome.passed and "timed out" in outcome.reason
  assert time.monotonic() - start < 3.5
  assert _alive_with(token) == []


@needs_bwrap
@pytest.mark.parametrize(
  "blowup, memory_bytes",
  [
    ("x = bytearray(8 << 30)\n", sandbox.Limits().memory_bytes),  # 8 GB against the default cap
    # Touching memory is slow on a loaded CPU: a 256 MiB cap keeps the gradual case fast.
    ("chunks = []\nwhile True:\n  chunks.append(b'x' * (64 << 20))\n", 256 << 20),
  ],
)
def test_memory_blowup_fails_promptly(blowup, memory_bytes):
  start = time.monotonic()
  outcome = sandbox.run(blowup, timeout=3, limits=sandbox.Limits(memory_bytes=memory_bytes))
  assert not outcome.passed and "MemoryError" in outcome.output, outcome
  assert time.monotonic() - start < 2.5


@needs_bwrap
@pytest.mark.skipif(os.geteuid() != 0, reason="the uid drop applies only when the harness is root")
def test_root_harness_runs_code_as_nobody_without_capabilities():
  code = (
    "import os\nstatus = open('/proc/self/status').read()\n"
    "assert os.getuid() == os.geteuid() == 65534 and os.getgroups() == [], os.getuid()\n"
    "assert 'CapEff:\\t0000000000000000' in status and 'NoNewPrivs:\\t1' in status, status\n"
  )
  outcome = sandbox.run(code, timeout=3)
  assert outcome.passed, outcome


def test_refuses_without_bubblewrap(no_bwrap):
  with pytest.raises(sandbox.SandboxUnavailableError, match="not installed"):
    sandbox.ensure_runnable()
  assert sandbox.ensure_runnable(unsafe=True) is False
  with pytest.raises(sandbox.SandboxUnavailableError, match="apt-get install bubblewrap") as e:
    sandbox.run_python("print(1)", timeout=3)
  assert "SPECJAX_UNSAFE_EXEC=1" in str(e.value)


def test_refuses_when_bubblewrap_cannot_create_namespaces(tmp_path, monkeypatch):
  fake = tmp_path / "bwrap"
  fake.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
  fake.chmod(0o755)
  monkeypatch.setattr(sandbox.shutil, "which", lambda name: str(fake))
  monkeypatch.delenv(sandbox.UNSAFE_ENV, raising=False)
  assert "uid map: Permission denied" in sandbox.isolation_problem()
  with pytest.raises(sandbox.SandboxUnavailableError, match="cannot create the sandbox"):
    sandbox.run_python("print(1)", timeout=3)


def test_bad_opt_in_value_is_an_error(no_bwrap, monkeypatch):
  monkeypatch.setenv(sandbox.UNSAFE_ENV, "yes")
  with pytest.raises(ValueError, match="SPECJAX_UNSAFE_EXEC must be 0 or 1, got 'yes'"):
    sandbox.run_python("print(1)", timeout=3)


def test_bad_arguments_are_errors():
  with pytest.raises(ValueError, match="timeout must be a positive"):
    sandbox.run("print(1)", timeout=0)
  with pytest.raises(ValueError, match="Limits.processes must be a positive int"):
    sandbox.Limits(processes=0)
  with pytest.raises(ValueError, match="entry_point must be a Python identifier"):
    sandbox.humaneval_program("", "", "f); import os; (")


def test_unsafe_opt_in_keeps_the_verdict_and_the_group_kill(no_bwrap, monkeypatch, tmp_path):
  monkeypatch.setenv(sandbox.UNSAFE_ENV, "1")
  with pytest.warns(RuntimeWarning, match="WITHOUT isolation"):
    ok = sandbox.run(sandbox.humaneval_program("def sq(x):\n  return x * x\n", _SQ_TEST, "sq"), 3)
  assert ok.passed and not ok.isolated
  with pytest.warns(RuntimeWarning):
    assert not sandbox.humaneval_passes(_WRONG + "exit()\n", _SQ_TEST, "sq", timeout=3)
  late = tmp_path / "late_write"
  code = (
    "import os, time\n"
    f"if os.fork() == 0:\n  time.sleep(2)\n  open({str(late)!r}, 'w').write('x')\n  os._exit(0)\n"
    "time.sleep(30)\n"
  )
  start = time.monotonic()
  with pytest.warns(RuntimeWarning):
    outcome = sandbox.run(code, timeout=1)
  assert not outcome.passed and "timed out" in outcome.reason
  time.sleep(max(0.0, start + 2.6 - time.monotonic()))
  assert not late.exists()
