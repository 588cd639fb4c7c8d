"""Runs untrusted generated code (HumanEval completions) in an isolated, time-limited Python process.

Verdict. A run passes only if a trusted runner, after executing the whole program (for HumanEval:
completion, test code, then `check(entry_point)`) without an exception, writes a random per-run
token to a result pipe and the harness reads back exactly that token. The exit status is never
trusted: `exit()`, `sys.exit(0)`, `raise SystemExit`, `os._exit(0)`, a signal, a crash or the
timeout before the end of the program all leave no token, so they fail. The token reaches the
runner through an inherited pipe that the runner reads and closes before the program starts; it is
never in argv, the environment or a file.

Isolation (bubblewrap, `bwrap`, Debian package `bubblewrap`): fresh mount, pid, network, IPC and UTS
namespaces; only /usr, the /bin-/lib links and the Python installation are visible, read-only and
nosuid (no host /etc, /home, /root or work tree); the program is a read-only file; a private tmpfs
/tmp (64 MiB) is the only writable place; no network interface but a down loopback; a new session
(`--new-session`) and `--die-with-parent`; no-new-privileges. When the harness runs as root, the
namespaces are made without a user namespace and the runner drops to uid/gid 65534 (nobody) with no
capabilities before the program starts, because the kernel does not apply RLIMIT_NPROC to uid 0;
otherwise `--unshare-all` puts it in a user namespace as the calling user. Limits set by the runner
before the program starts (hard limits, so the program cannot raise them): address space, CPU
seconds, file size, processes, no core files. The whole process group is killed on timeout and
after a normal exit; leaving the pid namespace kills every process in it, so no grandchild survives
(even one that called setsid). A host without bwrap, or where bwrap cannot create namespaces, gets
`SandboxUnavailableError` unless the caller opts in to unisolated execution (`unsafe=True` or
`SPECJAX_UNSAFE_EXEC=1`): then the program runs in a plain subprocess in its own session with the
same limits and the same verdict, with a warning; it can read and write whatever the user can, use
the network, and a grandchild that calls setsid escapes the group kill.

Threat model, honestly: isolation protects the host from careless or hostile code (the kernel
enforces it). The verdict protects against code that ends early or prints a fake result, which is
what model-generated code does; it does not stop a program written to fake a pass from inside the
same interpreter (for example one that reads the token from the runner's frame, or installs a trace
function that skips `check`'s assertions). Such a program can only fake its own score. A program
that forks and finishes in both processes writes the token twice and fails. When the harness is
root, the process limit counts every uid-65534 process of the host, so sandboxes run in parallel
share it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings

UNSAFE_ENV = "SPECJAX_UNSAFE_EXEC"
NOBODY = 65534  # uid and gid the runner drops to when the harness is root
INSTALL_HINT = "install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`)"
_SANDBOX_PROGRAM = "/sandbox/program.py"
_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
_TOKEN_BYTES = 16

# The trusted runner (python -I -u -c). argv: nonce fd, result fd, program path, then limits.
_RUNNER = r"""
import os, resource, sys
def _run():
  nonce_fd, result_fd, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
  memory, cpu, fsize, nproc, uid = (int(a) for a in sys.argv[4:9])
  nonce = os.read(nonce_fd, 4096)
  os.close(nonce_fd)
  for kind, value in ((resource.RLIMIT_AS, memory), (resource.RLIMIT_CPU, cpu),
                      (resource.RLIMIT_FSIZE, fsize), (resource.RLIMIT_NPROC, nproc),
                      (resource.RLIMIT_CORE, 0)):
    resource.setrlimit(kind, (value, value))
  if uid >= 0:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:
      raise SystemExit('sandbox runner: could not drop to uid %d' % uid)
  with open(path) as f:
    source = f.read()
  code = compile(source, path, 'exec')
  del source
  exec(code, {'__name__': '__main__', '__file__': path, '__builtins__': __builtins__})
  os.write(result_fd, nonce)
  try:
    sys.stdout.flush()
    sys.stderr.flush()
  finally:
    os._exit(0)
_run()
"""


class SandboxUnavailableError(RuntimeError):
  """No isolation is available on this host and unisolated execution was not opted in to."""


@dataclasses.dataclass(frozen=True)
class Limits:
  """Resource limits for one run (hard rlimits inside the sandbox, plus its tmpfs size).

  rlimits bind each process, so the run's total memory is bounded only by `processes *
  memory_bytes + tmp_bytes` (8.06 GiB with the defaults); no cgroup is used.

  Attributes:
    memory_bytes: address space (RLIMIT_AS) of each process.
    file_bytes: largest file a process may write (RLIMIT_FSIZE), also caps its output.
    processes: processes and threads of the sandbox user (RLIMIT_NPROC).
    tmp_bytes: size of the private writable /tmp (bubblewrap only).
  """

  memory_bytes: int = 512 << 20
  file_bytes: int = 16 << 20
  processes: int = 16
  tmp_bytes: int = 64 << 20

  def __post_init__(self):
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f"sandbox Limits.{field.name} must be a positive int, got {value!r}")


@dataclasses.dataclass(frozen=True)
class Outcome:
  """What one run did.

  Attributes:
    passed: the program ran to its end and the runner's result token came back.
    reason: why it passed or failed, in words.
    seconds: wall time of the run.
    output: the last 4,000 characters of its stdout and stderr.
    isolated: whether it ran inside bubblewrap (False only for opted-in unsafe runs).
  """

  passed: bool
  reason: str
  seconds: float
  output: str
  isolated: bool


def run(
  code: str, timeout: float = 10.0, *, limits: Limits = Limits(), unsafe: bool | None = None
) -> Outcome:
  """Runs the Python program `code` in the sandbox and says whether it ran to its end.

  Args:
    code: the whole program (it runs as `__main__`).
    timeout: wall-clock seconds before the process group is killed; CPU time is limited to
      ceil(timeout) + 1 seconds.
    limits: resource limits.
    unsafe: allow running without isolation when bubblewrap is unavailable; None reads
      `SPECJAX_UNSAFE_EXEC` ("1" allows, "0" or unset refuses).

  Returns:
    The outcome; `passed` only if the program finished without an exception or an early exit.

  Raises:
    SandboxUnavailableError: bubblewrap is missing or cannot create namespaces here, and unsafe
      execution was not allowed.
  """
  if not (isinstance(timeout, int | float) and math.isfinite(timeout) and timeout > 0):
    raise ValueError(f"sandbox timeout must be a positive number of seconds, got {timeout!r}")
  if ensure_runnable(unsafe):
    return _run_isolated(code, timeout, limits)
  warnings.warn(
    f"running generated code WITHOUT isolation ({isolation_problem()}); {UNSAFE_ENV}=1 / "
    "unsafe=True was set. Only the time, memory, CPU, file-size and process limits apply (the "
    "process limit does not bind root).",
    RuntimeWarning,
    stacklevel=2,
  )
  return _run_unsafe(code, timeout, limits)


def run_python(code: str, timeout: float = 10.0, *, unsafe: bool | None = None) -> bool:
  """True if the program `code` runs to its end in the sandbox within `timeout` seconds."""
  return run(code, timeout, unsafe=unsafe).passed


def humaneval_program(code: str, test: str, entry_point: str) -> str:
  """HumanEval's check program: the completion, its test code, then `check(entry_point)`."""
  if not entry_point.isidentifier():
    raise ValueError(f"HumanEval entry_point must be a Python identifier, got {entry_point!r}")
  return f"{code}\n\n{test}\n\ncheck({entry_point})\n"


def humaneval_passes(
  code: str, test: str, entry_point: str, timeout: float = 10.0, *, unsafe: bool | None = None
) -> bool:
  """True if `check(entry_point)` returns normally after the completion and its test code ran."""
  return run(humaneval_program(code, test, entry_point), timeout, unsafe=unsafe).passed


def ensure_runnable(unsafe: bool | None = None) -> bool:
  """Checks that code can be run: True if isolated, False if only because unsafe was opted in to.

  Callers that will run generated code late (after hours of generation) call this first.

  Raises:
    SandboxUnavailableError: no working bubblewrap and no opt-in (`unsafe`, `SPECJAX_UNSAFE_EXEC`).
  """
  problem = isolation_problem()
  if problem is None:
    return True
  if not _unsafe_allowed(unsafe):
    raise SandboxUnavailableError(
      f"refusing to run generated code without isolation: {problem}. Either {INSTALL_HINT}, or "
      f"accept unisolated execution (the code can read and write your files and use the network) "
      f"with {UNSAFE_ENV}=1 or unsafe=True."
    )
  return False


def isolation_problem() -> str | None:
  """Why bubblewrap isolation is unavailable here, or None when it works (probed once)."""
  bwrap = shutil.which("bwrap")
  if bwrap is None:
    return "bubblewrap (`bwrap`) is not installed"
  return _probe(bwrap)


@functools.lru_cache(maxsize=4)
def _probe(bwrap: str) -> str | None:
  argv = bwrap_argv(bwrap, Limits()) + [_interpreter(), "-I", "-c", "pass"]
  try:
    with tempfile.TemporaryFile() as program:
      argv = [a.replace("{program_fd}", str(program.fileno())) for a in argv]
      proc = subprocess.run(
        argv, pass_fds=(program.fileno(),), capture_output=True, timeout=30, env=_ENV
      )
  except (OSError, subprocess.TimeoutExpired) as e:
    return f"bubblewrap ({bwrap}) failed to start: {e}"
  if proc.returncode != 0:
    err = proc.stderr.decode(errors="replace").strip()[-500:]
    return (
      f"bubblewrap ({bwrap}) cannot create the sandbox here (exit {proc.returncode}: {err}); "
      "unprivileged user namespaces may be disabled (sysctl kernel.unprivileged_userns_clone=1, "
      "or the AppArmor/container policy)"
    )
  return None


def _unsafe_allowed(unsafe: bool | None) -> bool:
  if unsafe is not None:
    return bool(unsafe)
  value = os.environ.get(UNSAFE_ENV, "")
  if value not in ("", "0", "1"):
    raise ValueError(f"{UNSAFE_ENV} must be 0 or 1, got {value!r}")
  return value == "1"


def _interpreter() -> str:
  """The base (non-venv) interpreter: it needs only its own installation, bound read-only."""
  version = f"python{sys.version_info.major}.{sys.version_info.minor}"
  for name in (version, "python3"):
    path = os.path.join(os.path.realpath(sys.base_prefix), "bin", name)
    if os.access(path, os.X_OK):
      return os.path.realpath(path)
  return os.path.realpath(sys.executable)


def _system_binds() -> list[str]:
  """bwrap args exposing /usr and the top-level /bin, /lib... as on the host (links or dirs)."""
  args = ["--ro-bind", "/usr", "/usr"]
  for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
    path = "/" + name
    if os.path.islink(path):
      args += ["--symlink", os.readlink(path), path]
    elif os.path.isdir(path):
      args += ["--ro-bind", path, path]
  return args


def _python_binds() -> list[str]:
  """bwrap args binding the Python installation (and interpreter directory) read-only."""
  roots = {os.path.realpath(sys.base_prefix), os.path.dirname(_interpreter())}
  args = []
  for root in sorted(roots):
    if (
      root == "/usr"
      or root.startswith("/usr/")
      or any(root.startswith(r + "/") for r in roots if r != root)
    ):
      continue
    parts = root.strip("/").split("/")
    for i in range(1, len(parts)):  # world-traversable parents (the host's may be 0700, /root)
      args += ["--perms", "0755", "--dir", "/" + "/".join(parts[:i])]
    args += ["--ro-bind", root, root]
  return args


def bwrap_argv(bwrap: str, limits: Limits) -> list[str]:
  """The bubblewrap command line, up to the command; `{program_fd}` is filled in by the caller."""
  if os.geteuid() == 0:  # no user namespace, so the runner can drop to a uid RLIMIT_NPROC binds
    namespaces = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
    namespaces += ["--unshare-cgroup-try", "--cap-drop", "ALL"]
    namespaces += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
  else:
    namespaces = ["--unshare-all"]
  return [
    bwrap,
    *namespaces,
    "--die-with-parent",
    "--new-session",
    "--clearenv",
    *[a for k, v in _ENV.items() for a in ("--setenv", k, v)],
    *_system_binds(),
    *_python_binds(),
    "--proc", "/proc",
    "--dev", "/dev",
    "--perms", "0755", "--dir", "/sandbox",
    "--perms", "0644", "--ro-bind-data", "{program_fd}", _SANDBOX_PROGRAM,
    "--perms", "1777", "--size", str(limits.tmp_bytes), "--tmpfs", "/tmp",
    "--remount-ro", "/",
    "--chdir", "/tmp",
  ]  # fmt: skip


def _runner_args(
  nonce_fd: int, result_fd: int, path: str, timeout: float, limits: Limits, uid: int
) -> list[str]:
  cpu = math.ceil(timeout) + 1
  values = (
    nonce_fd,
    result_fd,
    path,
    limits.memory_bytes,
    cpu,
    limits.file_bytes,
    limits.processes,
    uid,
  )
  return ["-I", "-u", "-c", _RUNNER, *map(str, values)]


def _run_isolated(code: str, timeout: float, limits: Limits) -> Outcome:
  uid = NOBODY if os.geteuid() == 0 else -1
  with tempfile.TemporaryFile() as program:
    program.write(code.encode())
    program.flush()
    program.seek(0)
    prefix = bwrap_argv(shutil.which("bwrap"), limits)
    prefix = [a.replace("{program_fd}", str(program.fileno())) for a in prefix]
    return _execute(
      lambda nonce_fd, result_fd, info_fd: [
        prefix[0], "--info-fd", str(info_fd), *prefix[1:], _interpreter(),
        *_runner_args(nonce_fd, result_fd, _SANDBOX_PROGRAM, timeout, limits, uid),
      ],
      timeout,
      keep_fds=(program.fileno(),),
      cwd=None,
      isolated=True,
    )  # fmt: skip


def _run_unsafe(code: str, timeout: float, limits: Limits) -> Outcome:
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "program.py")
    with open(path, "w") as f:
      f.write(code)
    return _execute(
      lambda nonce_fd, result_fd, info_fd: [
        _interpreter(),
        *_runner_args(nonce_fd, result_fd, path, timeout, limits, -1),
      ],
      timeout,
      keep_fds=(),
      cwd=tmp,
      isolated=False,
    )


def _execute(argv_for, timeout: float, *, keep_fds, cwd, isolated: bool) -> Outcome:
  """Spawns the runner in a new session, waits, kills the group, then reads the token back.

  `argv_for(nonce_fd, result_fd, info_fd)` builds the command; `info_fd` is the write end of a
  pipe for bwrap's `--info-fd` (the sandbox's pid 1), unused when not isolated.
  """
  nonce = secrets.token_hex(_TOKEN_BYTES).encode()
  nonce_r, nonce_w = os.pipe()
  result_r, result_w = os.pipe()
  info_r, info_w = os.pipe()
  os.write(nonce_w, nonce)
  os.close(nonce_w)
  child_ends = [nonce_r, result_w, info_w]
  start = time.monotonic()
  pidfd = None
  try:
    with tempfile.TemporaryFile() as log:
      proc = subprocess.Popen(
        argv_for(nonce_r, result_w, info_w),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        pass_fds=(*child_ends, *keep_fds),
        start_new_session=True,
        cwd=cwd,
        env=_ENV,
      )
      for fd in child_ends:
        os.close(fd)
      child_ends = []
      if isolated:
        pidfd = _open_sandbox_init(info_r, deadline=start + timeout)
      timed_out = _wait_and_kill_group(proc, max(0.0, start + timeout - time.monotonic()))
      if pidfd is not None:  # pid 1 exits only once every process of its namespace is gone
        _wait_readable(pidfd, 5.0)
      seconds = time.monotonic() - start
      token = _read_available(result_r)
      log.seek(0)
      output = log.read().decode(errors="replace")[-4000:]
  finally:
    for fd in (*child_ends, result_r, info_r, *([pidfd] if pidfd is not None else [])):
      os.close(fd)
  passed = token == nonce and not timed_out
  reason = _reason(passed, timed_out, timeout, proc.returncode, token, output)
  return Outcome(passed, reason, seconds, output, isolated)


def _open_sandbox_init(info_r: int, deadline: float) -> int | None:
  """A pidfd on the sandbox's pid 1, from bwrap's `--info-fd` JSON; None if it never started."""
  data = b""
  while time.monotonic() < deadline:
    ready = _wait_readable(info_r, max(0.0, deadline - time.monotonic()))
    chunk = os.read(info_r, 4096) if ready else b""
    if not chunk:
      break
    data += chunk
    if b"}" in data:
      break
  try:
    return os.pidfd_open(int(json.loads(data.decode())["child-pid"]))
  except (ValueError, KeyError, TypeError, OSError, AttributeError):
    return None


def _wait_readable(fd: int, seconds: float) -> bool:
  """poll(2), not select(2): a process with many open files may hand out fds above 1023."""
  poller = select.poll()
  poller.register(fd, select.POLLIN)
  return bool(poller.poll(int(seconds * 1000)))


def _wait_and_kill_group(proc: subprocess.Popen, timeout: float) -> bool:
  """Waits up to `timeout` s, then SIGKILLs the process group either way; True if it timed out."""
  try:
    proc.wait(timeout)
    timed_out = False
  except subprocess.TimeoutExpired:
    timed_out = True
  try:
    os.killpg(proc.pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass
  proc.wait()
  return timed_out


def _read_available(fd: int, limit: int = 1 << 16) -> bytes:
  """What is in the pipe now, without blocking (writers may still hold it open)."""
  os.set_blocking(fd, False)
  chunks = []
  while sum(map(len, chunks)) < limit:
    try:
      chunk = os.read(fd, 4096)
    except BlockingIOError:
      break
    if not chunk:
      break
    chunks.append(chunk)
  return b"".join(chunks)


def _reason(
  passed: bool, timed_out: bool, timeout: float, returncode: int, token: bytes, output: str
) -> str:
  if passed:
    return "ran to the end"
  if timed_out:
    return f"timed out after {timeout:g} s"
  last = output.strip().splitlines()[-1][:200] if output.strip() else ""
  if token:
    return f"wrong result token (the program wrote to the result pipe); exit status {returncode}"
  if returncode == 0:
    return "exited before the end of the program (exit status 0, no result token)"
  if returncode < 0:
    return f"killed by signal {-returncode}"
  if returncode > 128:  # bwrap and shells report a child killed by signal N as 128 + N
    return f"exit status {returncode} (killed by signal {returncode - 128}?)" + (
      f": {last}" if last else ""
    )
  return f"exit status {returncode}" + (f": {last}" if last else "")
