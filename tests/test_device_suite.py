"""benchmarks/device/gpu_suite.py in its --tiny mode on CPU: it runs without ml_collections or gguf
(the GPU machine has neither) and writes a complete JSON and Markdown report."""

import json
import math
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
SUITE = ROOT / "benchmarks" / "device" / "gpu_suite.py"

# Runs the suite with the packages the GPU machine lacks made unimportable.
_RUNNER = """
import importlib.abc, runpy, sys
class _Absent(importlib.abc.MetaPathFinder):
  def find_spec(self, name, path=None, target=None):
    if name.split(".")[0] in ("ml_collections", "gguf"):
      raise ImportError(f"{name} is not installed on the device machine")
sys.meta_path.insert(0, _Absent())
sys.argv = [sys.argv[1]] + sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _finite(x) -> bool:
  return isinstance(x, (int, float)) and math.isfinite(x)


def test_tiny_suite_writes_report(tmp_path):
  out = tmp_path / "suite"
  # One of the two tiny shapes keeps the test short; both take the same code path (the tied
  # embedding, SmolLM2's, is the case where the head's bytes come from the embedding).
  args = ["--tiny", "--models", "tiny-smollm2", "--out", str(out)]
  cmd = [sys.executable, "-c", _RUNNER, str(SUITE), *args]
  res = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)
  assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
  assert "bandwidth:" in res.stdout and "verify b2" in res.stdout  # progress is printed

  report = json.loads((out / "report.json").read_text())
  meta, bw = report["meta"], report["bandwidth"]
  assert meta["tiny"] and meta["backend"] == "cpu" and meta["skipped"] == []
  assert bw["copy"] > 0 and bw["read"] > 0 and bw["bound"] == max(bw["copy"], bw["read"])
  assert bw["stated_peak"] is None  # no stated peak for a CPU
  assert list(report["models"]) == ["tiny-smollm2"]
  assert report["models"]["tiny-smollm2"]["config"]["tie_embeddings"]
  ks, batches = meta["settings"]["ks"], meta["settings"]["batches"]
  for name, m in report["models"].items():
    cfg = m["config"]
    assert cfg["dtype"] == "bfloat16"
    d, f, v = cfg["d_model"], cfg["ffn_dim"], cfg["vocab_size"]
    layer = 2 * d * d + 2 * d * cfg["n_kv_heads"] * cfg["head_dim"] + 3 * d * f + 2 * d
    # bf16 bytes read per step: layers, final norm, and the head (the tied embedding, or lm_head).
    assert m["weight_bytes_per_step"] == 2 * (cfg["n_layers"] * layer + d + v * d), name

    ar = m["ar"]
    for field in ("forward_s", "call_s", "step_s", "bound_s", "total_s", "prefill_s"):
      assert _finite(ar[field]) and ar[field] >= 0, (name, field)
    assert ar["passes"] == meta["settings"]["ar_tokens"] - 1
    assert math.isclose(ar["loop_of_bound"], ar["bound_s"] / max(ar["step_s"], 1e-12))

    loop = m["loop"]
    assert loop["k"] == meta["settings"]["loop_k"] and loop["bare_forward_s"] >= 0
    assert set(loop["drafters"]) == {"constant", "prompt_lookup"}
    for dr in loop["drafters"].values():
      assert 1 <= dr["passes"] <= meta["settings"]["loop_tokens"] - 1
      assert math.isclose(dr["overhead_s"], dr["step_s"] - loop["bare_forward_s"], abs_tol=1e-12)

    assert list(m["verify"]) == [f"b{b}" for b in batches]
    for b, curve in zip(batches, m["verify"].values()):
      assert curve["k"] == ks
      assert all(_finite(x) and x >= 0 for x in curve["ms"] + curve["ratio"])
      assert curve["ratio"][0] == 1.0 or curve["ms"][0] == 0
      for k, ms, tps in zip(ks, curve["ms"], curve["tokens_per_s"]):
        assert ms == 0 or math.isclose(tps, b * k / (ms / 1e3), rel_tol=1e-9)

  md = (out / "report.md").read_text()
  assert md.startswith("# Device suite: cpu")
  for name in report["models"]:
    assert f"## {name}:" in md
  assert "| `generate` loop step |" in md and "| constant |" in md and "| prompt_lookup |" in md
  assert "| k | b1 ms | b1 cost/cost(1) | b2 ms | b2 cost/cost(1) |" in md
