"""What every on-disk cache relies on: file checksums, weight fingerprints, manifests, atomic writes.

A cache (converted model, training feature cache, packaged data) records what built it in a
manifest and the sha256 of the files it wrote; on use the manifest is compared with what the caller
wants and the files with their checksums, and any difference is a `CacheError` that names what
differs and how to rebuild. Nothing here trusts a file because it exists.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from typing import IO, Any

import jax
import numpy as np


class CacheError(ValueError):
  """A cache on disk is corrupt, incomplete, or was built from something else than asked for."""


def sha256_of(path: str) -> str:
  """Hex sha256 of a file, read in 1 MiB blocks."""
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


def file_records(directory: str, names: Iterable[str]) -> dict[str, dict]:
  """{name: {"size", "sha256"}} of files in `directory` (computed once, when the cache is built)."""
  out = {}
  for name in sorted(names):
    path = os.path.join(directory, name)
    out[name] = {"size": os.path.getsize(path), "sha256": sha256_of(path)}
  return out


def verify_files(directory: str, records: Mapping[str, Mapping], fix: str) -> None:
  """Checks each recorded file's size and sha256.

  Raises:
    CacheError: naming the first missing, resized or changed file, followed by `fix`.
  """
  for name, rec in records.items():
    path = os.path.join(directory, name)
    if not os.path.isfile(path):
      raise CacheError(f"{path} is missing from the cache; {fix}")
    size = os.path.getsize(path)
    if size != rec["size"]:
      raise CacheError(
        f"{path} has {size} bytes, {rec['size']} when the cache was written "
        f"(truncated or overwritten); {fix}"
      )
    got = sha256_of(path)
    if got != rec["sha256"]:
      raise CacheError(
        f"{path} is corrupt: sha256 {got}, {rec['sha256']} when the cache was written; {fix}"
      )


def weights_fingerprint(params: Any, samples: int = 4096) -> str:
  """A cheap identity of a weight pytree: sha256 over every leaf's path, shape and dtype and the
  bytes of `samples` evenly strided elements of it (plus its last element).

  Different checkpoints (another seed, a fine-tune, another size) differ in the sample; the same
  weights loaded twice agree on every backend (only raw bytes are hashed, no float arithmetic).
  """
  h = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    if leaf is None:
      continue
    shape, dtype = tuple(int(d) for d in np.shape(leaf)), str(leaf.dtype)
    h.update(json.dumps([jax.tree_util.keystr(path), shape, dtype]).encode())
    size = int(np.prod(shape, dtype=np.int64))
    if size:
      flat = leaf.reshape(-1)
      step = max(size // samples, 1)
      sample = np.concatenate([np.asarray(flat[::step]), np.asarray(flat[-1:])])
      h.update(np.ascontiguousarray(sample).tobytes())
  return h.hexdigest()


def differences(cached: Mapping, wanted: Mapping, prefix: str = "") -> list[str]:
  """'key: cached X, wanted Y' for every (nested) key whose values differ or exist on one side."""
  out = []
  for key in sorted(set(cached) | set(wanted), key=str):
    name = f"{prefix}{key}"
    a, b = cached.get(key, "<absent>"), wanted.get(key, "<absent>")
    if isinstance(a, Mapping) and isinstance(b, Mapping):
      out += differences(a, b, name + ".")
    elif _plain(a) != _plain(b):
      out.append(f"{name}: cached {_plain(a)!r}, wanted {_plain(b)!r}")
  return out


def _plain(v: Any) -> Any:
  """JSON's view of a value (tuples are lists), so a manifest read back compares equal."""
  return json.loads(json.dumps(v)) if isinstance(v, (tuple, list)) else v


def named_os_error(e: BaseException, path: str) -> BaseException:
  """`e` with `path` as its filename when it is an OSError that names none (a failed write())."""
  if isinstance(e, OSError) and e.filename is None and e.errno is not None:
    return OSError(e.errno, e.strerror, path)
  return e


@contextlib.contextmanager
def sole_writer(directory: str, what: str):
  """Creates `directory` if needed and holds an exclusive kernel lock (flock) on it while the
  block runs, so two processes never extend the same resumable output (a feature cache, a corpus,
  a training run) at once. The lock goes with its process: a killed run leaves nothing to clean up.

  Raises:
    CacheError: another process holds the lock; names the directory and what to do.
  """
  os.makedirs(directory, exist_ok=True)
  fd = os.open(directory, os.O_RDONLY)
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      raise CacheError(
        f"another process is writing {what} in {directory}; let it finish or stop it, then rerun "
        "this command (it resumes where that process stopped)"
      ) from None
    yield
  finally:
    os.close(fd)


def write_atomic(path: str, write: Callable[[IO[bytes]], None]) -> None:
  """Calls `write(f)` on a hidden temporary file beside `path`, fsyncs it and renames it over
  `path`: a reader sees the old file or the complete new one, never a torn one. On any failure (a
  full disk, say) the temporary file is removed and the error names it. The temporary name
  (`.NAME.XXXX.tmp`) matches no `NAME*` pattern, so a glob over finished files never sees it."""
  directory = os.path.dirname(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(
    dir=directory, prefix="." + os.path.basename(path) + ".", suffix=".tmp"
  )
  try:
    with os.fdopen(fd, "wb") as f:
      write(f)
      f.flush()
      os.fsync(f.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
  except BaseException as e:
    if os.path.exists(tmp):
      os.remove(tmp)
    err = named_os_error(e, tmp)
    if err is e:
      raise
    raise err from e


def write_json_atomic(path: str, obj: Any, indent: int | None = 1) -> None:
  """Writes JSON atomically (`write_atomic`)."""
  write_atomic(path, lambda f: f.write(json.dumps(obj, indent=indent).encode()))
