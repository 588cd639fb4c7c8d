"""Training caches are verified on use: a feature cache or work directory built from another target,
recipe or spec is refused with what differs and how to rebuild; corrupt files are named; default
cache paths follow $SPECJAX_CACHE; a full disk leaves nothing that looks complete and loses nothing.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from toy_models import tiny_model

from specjax.experiment.settings import load_config_file
from specjax.integrity import (
  CacheError,
  differences,
  sole_writer,
  weights_fingerprint,
  write_json_atomic,
)
from specjax.loading.hf import save_hf
from train import feature_cache, features, pipeline

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_config(name: str, arg: str = "tiny"):
  return load_config_file(os.path.join(REPO, "configs", f"{name}.py"), arg)


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
  """Three tiny targets saved as Hugging Face directories: two of vocabulary 64, one of 32."""
  root = tmp_path_factory.mktemp("targets")
  out = {}
  for name, seed, vocab in (("a", 0, 64), ("b", 1, 64), ("small_vocab", 3, 32)):
    params, cfg = tiny_model(seed, vocab=vocab)
    save_hf(str(root / name), params, cfg)
    out[name] = (str(root / name), params, cfg)
  return out


def small_config(target: str, cache_dir, **features_spec):
  config = load_config("train_medusa")
  config.target = target
  config.data.cache_dir = str(cache_dir)
  config.data.synthetic_prompts = 16
  config.data.draft_vocab = 24
  config.data.recipe.n_heldout = 4
  config.data.features.update({"max_new_tokens": 8, "batch_size": 8, **features_spec})
  config.train.update(dict(steps=2, save_every=2, log_every=100, eval_windows=2))
  return config


def build(config, params, cfg):
  s = pipeline.settings_from_config(config)
  return feature_cache.ensure_features(s, params, cfg, None, lambda _: None)


def test_a_cache_of_another_target_is_refused(targets, tmp_path):
  cache = tmp_path / "features"
  a, b, small = targets["a"], targets["b"], targets["small_vocab"]
  pipeline.run(small_config(a[0], cache), str(tmp_path / "work_a"), lambda _: None)
  # Before: target b trained on a's features without a word; a 32-token vocabulary crashed with
  # "operands could not be broadcast together with shapes (32,) (64,)".
  with pytest.raises(CacheError) as err:
    pipeline.run(small_config(b[0], cache), str(tmp_path / "work_b"), lambda _: None)
  msg = str(err.value)
  assert f"{cache} holds features of something else" in msg and f"'{a[0]}'" in msg
  assert "target_weights: cached" in msg and "target_config" not in msg
  assert f"delete {cache} (rm -r) to rebuild it" in msg and "data.cache_dir" in msg
  with pytest.raises(CacheError, match=r"target_config\.vocab_size: cached 64, wanted 32"):
    pipeline.run(small_config(small[0], cache), str(tmp_path / "work_s"), lambda _: None)
  # The command line says so in a FATAL message, without a traceback.
  cmd = [
    sys.executable,
    os.path.join(REPO, "train", "main.py"),
    "--config=" + os.path.join(REPO, "configs", "train_medusa.py") + ":tiny",
    f"--workdir={tmp_path / 'work_cli'}",
    f"--config.target={b[0]}",
    f"--config.data.cache_dir={cache}",
  ]
  proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
  assert f"FATAL: {cache} holds features of something else" in proc.stderr

  # The same target again (reloaded from its directory) reuses the cache without rebuilding it.
  def no_build(*args, **kwargs):
    raise AssertionError("the cache was rebuilt")

  mp = pytest.MonkeyPatch()
  mp.setattr(features, "build_shards", no_build)
  try:
    pipeline.run(small_config(a[0], cache), str(tmp_path / "work_a2"), lambda _: None)
  finally:
    mp.undo()


def test_another_spec_or_recipe_is_refused(targets, tmp_path):
  _, params, cfg = targets["a"]
  cache = tmp_path / "features"
  build(small_config("a", cache), params, cfg)
  with pytest.raises(CacheError, match=r"spec\.hidden_layers: cached \[0, 1\], wanted \[1\]"):
    build(small_config("a", cache, hidden_layers=(1,)), params, cfg)
  with pytest.raises(CacheError, match=r"spec\.max_new_tokens: cached 8, wanted 9"):
    build(small_config("a", cache, max_new_tokens=9), params, cfg)
  other_seed = small_config("a", cache)
  other_seed.data.recipe.seed = 5
  with pytest.raises(CacheError, match=r"recipe\.seed: cached 0, wanted 5"):
    build(other_seed, params, cfg)
  # Neither the held-out split nor the size bound is part of what the cache holds.
  same = small_config("a", cache, max_tokens=123_456)
  same.data.recipe.n_heldout = 2
  store, _ = build(same, params, cfg)
  assert store.heldout.sum() == 2


def test_an_unfinished_build_of_another_target_is_refused(targets, tmp_path):
  """Shards left by an interrupted build are resumed only by the build that wrote them."""
  (_, pa, ca), (_, pb, cb) = targets["a"], targets["b"]
  cache = tmp_path / "features"
  build(small_config("a", cache), pa, ca)
  os.rename(cache / "packed", tmp_path / "packed_a")  # as if killed before packing
  with pytest.raises(CacheError, match="target_weights: cached"):
    build(small_config("b", cache), pb, cb)
  (cache / "manifest.json").unlink()  # shards whose origin is unknown are not resumed either
  with pytest.raises(CacheError, match="no manifest recording which target weights"):
    build(small_config("a", cache), pa, ca)


def test_old_or_corrupt_caches_are_refused_with_the_fix(targets, tmp_path):
  _, params, cfg = targets["a"]
  cache = tmp_path / "features"
  config = small_config("a", cache)
  build(config, params, cfg)
  manifest = json.loads((cache / "manifest.json").read_text())
  # A cache written before manifests recorded the target is not trusted.
  old = {k: v for k, v in manifest.items() if k not in ("format", "target_weights", "tokenizer")}
  write_json_atomic(str(cache / "manifest.json"), old)
  with pytest.raises(CacheError, match=rf"{cache} has no manifest .* cannot be verified; delete"):
    build(config, params, cfg)
  write_json_atomic(str(cache / "manifest.json"), manifest)
  build(config, params, cfg)
  hidden = cache / "packed" / "hidden.npy"
  blob = hidden.read_bytes()
  hidden.write_bytes(blob[:-4096] + bytes(b ^ 0xFF for b in blob[-4096:]))
  with pytest.raises(CacheError, match=rf"{hidden} is corrupt: sha256 .*; delete {cache}"):
    build(config, params, cfg)
  hidden.write_bytes(blob[:100])
  with pytest.raises(CacheError, match=rf"{hidden} has 100 bytes, {len(blob)} when the cache"):
    build(config, params, cfg)
  hidden.write_bytes(blob)
  (cache / "packed" / "checksums.json").unlink()
  with pytest.raises(CacheError, match="checksums.json is missing"):
    build(config, params, cfg)


def test_read_through_source_must_be_the_same_target(targets, tmp_path):
  (_, pa, ca), (_, pb, cb) = targets["a"], targets["b"]
  src = tmp_path / "decoded"
  build(small_config("a", src, hidden_layers=()), pa, ca)
  config = small_config("b", tmp_path / "layers", hidden_layers=(1,))
  config.data.read_through_from = str(src)
  with pytest.raises(CacheError, match=rf"{src} holds features .*\n  target_weights: cached"):
    build(config, pb, cb)
  config.data.cache_dir = str(tmp_path / "layers_a")
  store, manifest = build(config, pa, ca)
  assert store.layers.shape[0] == 1 and manifest["read_through_from"] == str(src)
  assert manifest["spec"]["hidden_layers"] == [1]
  build(config, pa, ca)  # and the finished read-through cache verifies on use


def test_a_workdir_is_not_resumed_by_another_run(targets, tmp_path):
  a, b = targets["a"][0], targets["b"][0]
  work = str(tmp_path / "work")
  pipeline.run(small_config(a, tmp_path / "fa"), work, lambda _: None)
  with pytest.raises(CacheError, match=rf"{work} holds a run of something else .*\n  target_w"):
    pipeline.run(small_config(b, tmp_path / "fb"), work, lambda _: None)
  other = small_config(a, tmp_path / "fa")
  other.objective.n_heads = 2
  with pytest.raises(CacheError, match=r"objective\.n_heads: cached 4, wanted 2"):
    pipeline.run(other, work, lambda _: None)
  longer = small_config(a, tmp_path / "fa")
  longer.train.steps = 4  # training longer (or with other optimiser settings) is a resume
  lines = []
  pipeline.run(longer, work, lines.append)
  assert "resumed from step 2" in lines
  shifted = small_config(a, tmp_path / "fa")
  shifted.train.data_start = 5  # another place in the data order is another run
  with pytest.raises(CacheError, match=r"data_start: cached 0, wanted 5"):
    pipeline.run(shifted, work, lambda _: None)
  # A work directory recorded before train.data_start existed read the order from step 0.
  with open(os.path.join(work, "run.json")) as f:
    record = json.load(f)
  del record["data_start"]
  with open(os.path.join(work, "run.json"), "w") as f:
    json.dump(record, f)
  pipeline.run(longer, work, lambda _: None)
  with pytest.raises(CacheError, match=r"data_start: cached 0, wanted 5"):
    pipeline.run(shifted, work, lambda _: None)
  os.remove(os.path.join(work, "run.json"))
  with pytest.raises(CacheError, match="holds checkpoints and d2t.npy but no run.json"):
    pipeline.run(longer, work, lambda _: None)


def test_default_cache_paths_follow_specjax_cache(tmp_path, monkeypatch):
  monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path))
  feats = str(tmp_path / "features")
  for name in ("train_medusa", "train_eagle", "train_draft_lm", "train_eagle3"):
    for arg in ("", "tiny"):
      c = load_config(name, arg)
      assert c.data.cache_dir.startswith(feats + os.sep), (name, arg, c.data.cache_dir)
  shared = "smollm2-sd-v2-l2-15-27"  # every corpus-trained kind shares one cache
  for name in ("train_medusa", "train_eagle", "train_draft_lm", "train_eagle3"):
    full = load_config(name, "")
    assert full.data.cache_dir == os.path.join(feats, shared), name
    assert os.path.exists(full.data.corpus), name  # the committed corpus, not a cache
  monkeypatch.delenv("SPECJAX_CACHE")
  home = os.path.join(os.path.expanduser("~"), ".cache", "specjax", "features", shared)
  assert load_config("train_medusa", "").data.cache_dir == home


def test_weights_fingerprint():
  params, cfg = tiny_model(0, vocab=64)
  fp = weights_fingerprint(params)
  host = {"embed": np.asarray(params.embed)}
  assert weights_fingerprint(host) == weights_fingerprint({"embed": params.embed})
  assert weights_fingerprint(tiny_model(0, vocab=64)[0]) == fp  # the same weights again
  assert weights_fingerprint(tiny_model(1, vocab=64)[0]) != fp
  bumped = dataclasses.replace(params, embed=params.embed.at[0, 0].add(1e-3))  # always sampled
  assert weights_fingerprint(bumped) != fp
  half = dataclasses.replace(params, embed=params.embed.astype(jnp.bfloat16))
  assert weights_fingerprint(half) != fp
  assert differences({"a": {"b": (1, 2)}, "c": 1}, {"a": {"b": [1, 2]}, "c": 2}) == [
    "c: cached 1, wanted 2"
  ]


def _disk_full(*args, **kwargs):
  raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_leaves_nothing_that_looks_complete(targets, tmp_path, monkeypatch):
  """ENOSPC while writing a shard or packing: the error names the file, no partial shard or
  packed directory is left, finished shards are kept, and the rerun builds the same cache."""
  _, params, cfg = targets["a"]
  ref, _ = build(small_config("a", tmp_path / "ref"), params, cfg)
  cache = tmp_path / "features"
  config = small_config("a", cache)
  calls = []
  real_savez = np.savez

  def savez_then_full(f, **arrays):
    calls.append(1)
    if len(calls) == 2:  # the second shard: half written, then the disk is full
      f.write(b"\0" * 100)
      raise OSError(errno.ENOSPC, "No space left on device")
    real_savez(f, **arrays)

  monkeypatch.setattr(features.np, "savez", savez_then_full)
  with pytest.raises(OSError, match=r"No space left on device: '.*/\.shard_00001\.npz\.\w+\.tmp'"):
    build(config, params, cfg)
  assert sorted(os.listdir(cache / "shards")) == ["shard_00000.npz"]
  monkeypatch.setattr(features.np, "savez", real_savez)
  monkeypatch.setattr(features.os, "posix_fallocate", _disk_full)
  with pytest.raises(OSError, match=r"No space left on device: '.*packed\.part/tokens\.npy'"):
    build(config, params, cfg)
  assert sorted(os.listdir(cache)) == ["manifest.json", "shards"]  # no packed(.part) left
  monkeypatch.undo()
  store, _ = build(config, params, cfg)
  np.testing.assert_array_equal(store.tokens, ref.tokens)
  np.testing.assert_array_equal(store.hidden, ref.hidden)
  # A manifest update that fails leaves the previous manifest whole.
  before = (cache / "manifest.json").read_text()
  monkeypatch.setattr("specjax.integrity.os.fsync", _disk_full)
  with pytest.raises(OSError, match="No space left"):
    write_json_atomic(str(cache / "manifest.json"), {"x": 1})
  assert (cache / "manifest.json").read_text() == before
  assert sorted(os.listdir(cache)) == ["manifest.json", "packed", "shards"]


def test_sole_writer_refuses_a_second_writer_until_the_first_is_gone(tmp_path):
  d = str(tmp_path / "run")
  with sole_writer(d, "a training run"):
    with pytest.raises(CacheError, match=r"another process is writing a training run in .*run"):
      with sole_writer(d, "a training run"):
        pass
  with sole_writer(d, "a training run"):  # released on exit
    pass
  # A process killed while it holds the lock leaves nothing behind (the kernel drops it).
  holder = subprocess.Popen(
    [
      sys.executable,
      "-c",
      "import fcntl, os, sys, time\n"
      f"fd = os.open({d!r}, os.O_RDONLY); fcntl.flock(fd, fcntl.LOCK_EX)\n"
      "print('held', flush=True); time.sleep(60)",
    ],
    stdout=subprocess.PIPE,
    text=True,
  )
  try:
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(CacheError, match="let it finish or stop it"):
      with sole_writer(d, "a training run"):
        pass
  finally:
    holder.kill()
    holder.wait()
  with sole_writer(d, "a training run"):
    pass


def test_a_second_process_cannot_extend_the_same_feature_cache(tmp_path):
  """The read-through holds the cache's parent directory (its place, which a finished cache leaves
  while it is extended); a second one fails at once with a message naming it (two read-throughs
  of one cache once ran side by side)."""
  from train import teacher_forced

  params, cfg = tiny_model(0, vocab=64)
  docs = [teacher_forced.Document(tuple(range(4, 20)), 6, 0, False)]
  out = str(tmp_path / "packed")
  with sole_writer(str(tmp_path), "a feature cache"):
    with pytest.raises(CacheError, match="writing a feature cache"):
      teacher_forced.build(docs, out, params, cfg, log=lambda _: None)
  teacher_forced.build(docs, out, params, cfg, log=lambda _: None)  # alone, it builds
  assert features.FeatureStore.open(out).doc_lens.tolist() == [16]
