"""Builds and registers the C++ CPU kernels on first use.

The sources ship inside the package; the first process that needs a kernel compiles it with the
system C++ compiler against the XLA FFI headers that come with jaxlib, for this machine's
instruction set, into a per-user cache, and every later process loads the cached library. A key
over the source, the compiler flags, the jaxlib version and the CPU's feature flags names the
library, so an edit or a different machine gets its own build. Anything that goes wrong leaves the
kernels unavailable (and the model on its plain-JAX path), with the reason in `unavailable_reason`.

Environment:
  SPECJAX_CPU_KERNELS=0  never build or use the kernels.
  SPECJAX_CACHE          cache root (default ~/.cache/specjax), shared with the model registry.
  CXX                    compiler (default c++).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import pathlib
import shutil
import subprocess
import tempfile

import jax
import jaxlib

_SOURCES = ("cpu_linear.cc", "cpu_cache.cc", "cpu_take_rows.cc", "cpu_attention.cc", "cpu_amx.cc")
_HEADERS = ("cpu_common.h",)
# -ffp-contract=off: the sources fuse multiply-adds explicitly (cpu_common.h `Fma`), the same way in
# every tile, so the compiler must not fuse others on its own.
_FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-std=c++17", "-fPIC", "-shared", "-w")
# FFI target name -> exported handler symbol.
TARGETS = {
  "specjax_cpu_linear": "SpecjaxCpuLinear",
  "specjax_cpu_cache_write": "SpecjaxCpuCacheWrite",
  "specjax_cpu_take_rows": "SpecjaxCpuTakeRows",
  "specjax_cpu_attention": "SpecjaxCpuAttention",
}

_reason: list[str] = []
_library: list[ctypes.CDLL] = []


def _cpu_flags() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("flags"):
          return line
  except OSError:
    pass
  return ""


def _library_path() -> pathlib.Path:
  here = pathlib.Path(__file__).parent
  h = hashlib.sha256()
  for name in _SOURCES + _HEADERS:
    h.update((here / name).read_bytes())
  h.update(" ".join(_FLAGS).encode())
  h.update(jaxlib.__version__.encode())
  h.update(_cpu_flags().encode())
  root = pathlib.Path(os.environ.get("SPECJAX_CACHE") or "~/.cache/specjax").expanduser()
  return root / "kernels" / f"specjax_cpu_{h.hexdigest()[:16]}.so"


def _compile(out: pathlib.Path) -> None:
  here = pathlib.Path(__file__).parent
  cxx = os.environ.get("CXX", "c++")
  if shutil.which(cxx) is None:
    raise RuntimeError(f"no C++ compiler ({cxx!r}) on PATH")
  out.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
  os.close(fd)
  cmd = [cxx, *_FLAGS, f"-I{jax.ffi.include_dir()}", *(str(here / s) for s in _SOURCES), "-o", tmp]
  try:
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
      raise RuntimeError(
        f"compiling the CPU kernels failed:\n{' '.join(cmd)}\n{res.stderr[-2000:]}"
      )
    os.replace(tmp, out)  # atomic: concurrent builders never load a half-written library
  finally:
    if os.path.exists(tmp):
      os.unlink(tmp)


@functools.cache
def load() -> bool:
  """Compiles (once per machine) and registers the kernels; True if they are usable."""
  if os.environ.get("SPECJAX_CPU_KERNELS", "1") == "0":
    _reason.append("disabled by SPECJAX_CPU_KERNELS=0")
    return False
  try:
    path = _library_path()
    if not path.exists():
      _compile(path)
    lib = ctypes.cdll.LoadLibrary(str(path))
    for target, symbol in TARGETS.items():
      capsule = jax.ffi.pycapsule(getattr(lib, symbol))
      jax.ffi.register_ffi_target(target, capsule, platform="cpu")
    _library.append(lib)
  except Exception as e:  # noqa: BLE001  (any failure means: use the plain-JAX path)
    _reason.append(f"{type(e).__name__}: {e}")
    return False
  return True


def library() -> ctypes.CDLL | None:
  """The loaded kernel library (for its plain C helpers, e.g. the AMX probe), or None."""
  return _library[0] if load() else None


def version() -> str:
  """Which kernel code runs: the library's name (a hash of its sources, flags, jaxlib and CPU
  flags), or "off" when the plain-JAX path is used. Part of what measured costs depend on."""
  return _library_path().stem if load() else "off"


def unavailable_reason() -> str | None:
  """Why `load()` returned False (None if it has not failed)."""
  return _reason[-1] if _reason else None
