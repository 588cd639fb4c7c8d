"""Every module of the package (and of train/ and configs/) imports on its own, first (an import
cycle shows up only that way)."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import configs
import specjax
import train

_SCRIPT = """
import importlib, sys
failed = []
for name in sys.argv[1:]:
  for loaded in [m for m in sys.modules if m.split(".")[0] in ("specjax", "train", "configs")]:
    del sys.modules[loaded]
  try:
    importlib.import_module(name)
  except Exception as e:  # noqa: BLE001 - reported below with the module's name
    failed.append(f"{name}: {type(e).__name__}: {e}")
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""


def _modules() -> list[str]:
  names = []
  for pkg in (specjax, train, configs):
    names.append(pkg.__name__)
    for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
      names.append(info.name)
  return names


def test_every_module_imports_first_in_a_fresh_package():
  names = _modules()
  assert "specjax.speculative" in names and "specjax.drafters.tree_draft_model" in names
  assert "configs.parallel" in names and "configs.large.vicuna7b_medusa" in names
  out = subprocess.run(
    [sys.executable, "-c", _SCRIPT, *names], capture_output=True, text=True, timeout=600
  )
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
