"""Drafter training: self-distilled features, data order, resumable training, every drafter kind
trained, shipped, reloaded and exact in the speculative loop, and evaluation prompts kept out of
the training data. Everything runs on a tiny random Llama target except the data-recipe check.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from toy_models import tiny_model

from specjax.drafters.eagle import head_logits
from specjax.drafters.medusa import medusa_logits
from specjax.drafters.peagle import first_tokens
from specjax.drafters.shipped import ShippedDrafterError, load_shipped
from specjax.experiment.settings import load_config_file
from specjax.generate import GenerateConfig, generate, pad_prompts, prefill
from specjax.integrity import CacheError, sole_writer, weights_fingerprint
from specjax.kv_cache import init_cache
from specjax.loading.hf import save_hf
from specjax.metrics import summarize
from specjax.model import forward, lm_head
from specjax.sampling import SamplingConfig
from specjax.speculative import speculative_generate
from train import (
  corpus,
  decontam,
  export,
  feature_cache,
  features,
  loop,
  pipeline,
  prompts,
  rescore,
  sources,
  teacher_forced,
)
from train.data import Batch, Windows, step_windows
from train.export import export_drafter
from train.features import FeatureStore
from train.loop import evaluate, make_optimizer, positions_read, read_metrics, simulated_tau
from train.losses import depth_agreement, rank_agreement
from train.objectives.eagle import EagleObjective

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_config(name: str, arg: str = "tiny"):
  return load_config_file(os.path.join(REPO, "configs", f"{name}.py"), arg)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  """A tiny random target saved as a Hugging Face directory, and its feature cache."""
  root = tmp_path_factory.mktemp("train")
  params, cfg = tiny_model(0, vocab=64)
  save_hf(str(root / "target"), params, cfg)
  config = tiny_config("train_medusa", root)
  s = pipeline.settings_from_config(config)
  store, manifest = feature_cache.ensure_features(s, params, cfg, None, lambda _: None)
  return root, params, cfg, store, manifest


def tiny_config(name: str, root, **objective):
  config = load_config(name)
  config.target = str(root / "target")
  config.data.cache_dir = str(root / "features")
  config.ship.dir = str(root / "shipped")
  config.objective.update(objective)
  return config


def test_features_are_the_targets_greedy_responses(tiny):
  _, params, cfg, store, manifest = tiny
  assert manifest["n_prompts"] == 64 and len(store.doc_lens) == 64
  assert store.heldout.sum() == 12
  for d in (0, 7, 19):
    s, n, p = store.doc_starts[d], store.doc_lens[d], store.prompt_lens[d]
    toks = jnp.asarray(store.tokens[s : s + n])[None]
    out = forward(params, toks, init_cache(cfg, 1, n), cfg, hidden_layers=(0, 1))
    np.testing.assert_allclose(store.hidden[s : s + n], out.hidden[0], atol=2e-2, rtol=1e-2)
    np.testing.assert_allclose(
      store.layers[:, s : s + n], out.layer_hidden[:, 0], atol=2e-2, rtol=1e-2
    )
    greedy = np.asarray(jnp.argmax(lm_head(params, out.hidden[0]), -1))
    np.testing.assert_array_equal(greedy[p - 1 : n - 1], store.tokens[s + p : s + n])
    ar = generate(params, cfg, toks[:, :p], jnp.asarray([p]), GenerateConfig(max_new_tokens=8))
    np.testing.assert_array_equal(
      np.asarray(ar.tokens[0, : min(8, n - p)]), store.tokens[s + p : s + min(n, p + 8)]
    )


def _killed_after(n: int):
  """A log sink that raises at its n-th line (a process killed mid-build)."""
  lines = []

  def log(line: str) -> None:
    lines.append(line)
    if len(lines) == n:
      raise KeyboardInterrupt

  return log


def test_read_through_cache_matches_the_decoded_one_and_resumes(tiny, tmp_path):
  root, params, cfg, store = tiny[:4]
  docs = teacher_forced.cache_documents(str(root / "features" / "packed"))
  out = str(tmp_path / "packed")
  args = (docs, out, params, cfg, (1,), 256, 16)
  with pytest.raises(KeyboardInterrupt):
    teacher_forced.build(*args, log=_killed_after(2))
  before = FeatureStore.open(out + ".part").read_lens  # the two chunks written before the kill
  lines = []
  stats = teacher_forced.build(*args, log=lines.append)
  assert lines[0].startswith(f"read-through: chunk 1/{len(lines)}")
  assert 0 < before.sum() < store.n_positions
  assert stats["positions"] == store.n_positions - before.sum()
  assert stats["read_positions"] == store.n_positions
  got = FeatureStore.open(out)
  np.testing.assert_array_equal(got.tokens, store.tokens)
  np.testing.assert_array_equal(got.heldout, store.heldout)
  np.testing.assert_array_equal(got.prompt_lens, store.prompt_lens)
  # Every position equals what decoding recorded, up to float16 rounding.
  np.testing.assert_allclose(got.hidden, store.hidden, atol=2e-2, rtol=1e-2)
  np.testing.assert_allclose(got.layers[0], store.layers[1], atol=2e-2, rtol=1e-2)


def test_read_through_reads_only_the_wanted_prefixes_and_extends_later(tiny, tmp_path):
  root, params, cfg, store = tiny[:4]
  docs = teacher_forced.cache_documents(str(root / "features" / "packed"))
  out = str(tmp_path / "packed")
  lens = store.doc_lens
  want = np.where(np.arange(len(docs)) % 3 == 0, lens, lens // 2)  # whole, or the first half
  want[1] = 0
  args = (docs, out, params, cfg, (1,), 256, 16)
  stats = teacher_forced.build(*args, log=lambda _: None, want=want)
  part = FeatureStore.open(out)
  assert part.read_lens.tolist() == want.tolist() and stats["documents"] == (want > 0).sum()
  np.testing.assert_array_equal(part.tokens, store.tokens)  # every document's tokens are there
  w = Windows(part, 8, heldout=False)
  has = [(w.positions_needed([i]) <= part.read_lens).all() for i in range(w.n_windows)]
  assert any(has) and not all(has)
  w.window(has.index(True))
  with pytest.raises(ValueError, match="not read through the target"):
    w.window(has.index(False))
  # A prefix's features are the whole document's: position t depends on positions up to t only.
  s2, n2 = store.doc_starts[2], want[2]
  np.testing.assert_allclose(part.hidden[s2 : s2 + n2], store.hidden[s2 : s2 + n2], atol=2e-2)
  kept = np.asarray(part.hidden[: lens[0]])
  # Extending it: a kill leaves it unfinished (not in place); the rerun resumes and seals it.
  with pytest.raises(KeyboardInterrupt):
    teacher_forced.build(*args, log=_killed_after(1))
  assert not os.path.exists(out) and os.path.exists(out + ".part")
  stats = teacher_forced.build(*args, log=lambda _: None)
  assert 0 < stats["documents"] < (want < lens).sum() and stats["read_positions"] == lens.sum()
  features.verify_sealed(out, "rebuild")
  full = FeatureStore.open(out)
  assert (full.read_lens == lens).all()
  np.testing.assert_array_equal(full.hidden[: lens[0]], kept)  # read once, kept
  np.testing.assert_allclose(full.hidden, store.hidden, atol=2e-2, rtol=1e-2)
  np.testing.assert_allclose(full.layers[0], store.layers[1], atol=2e-2, rtol=1e-2)
  assert teacher_forced.build(*args, log=lambda _: None)["positions"] == 0  # nothing left to read


def test_data_order_is_a_pure_function_of_the_step(tiny):
  store = tiny[3]
  w = Windows(store, 32, heldout=False)
  n, B = w.n_windows, 4
  first = [step_windows(n, B, 0, s) for s in range(n // B)]
  assert all((a == step_windows(n, B, 0, s)).all() for s, a in enumerate(first))
  assert len(np.unique(np.concatenate(first))) == (n // B) * B  # no repeats inside an epoch
  assert not (step_windows(n, B, 1, 0) == first[0]).all()  # the seed matters
  with pytest.raises(ValueError, match="data_start"):
    pipeline.TrainSettings(data_start=-1)
  b = w.batch(first[0])
  assert isinstance(b, Batch) and b.tokens.shape == (B, 32) and b.hidden.shape == (B, 32, 32)
  # Positions restart at every document boundary and count up inside a document.
  doc, pos = np.asarray(b.doc), np.asarray(b.pos)
  same = doc[:, 1:] == doc[:, :-1]
  assert (pos[:, 1:][same] == pos[:, :-1][same] + 1).all()
  assert (pos[:, 1:][~same & (doc[:, 1:] >= 0)] == 0).all()


@pytest.mark.parametrize("name", ["train_draft_lm", "train_medusa", "train_eagle"])
def test_optimizer_state_holds_no_target_arrays(tiny, name):
  root, params, cfg = tiny[:3]
  s = pipeline.settings_from_config(tiny_config(name, root))
  objective = pipeline.make_objective(s.objective, cfg)
  trainable, frozen = objective.init(jax.random.PRNGKey(0), params, cfg, np.arange(48))
  size = lambda t: sum(x.size for x in jax.tree.leaves(t))  # noqa: E731
  opt_state = make_optimizer(s.train).init(trainable)
  assert size(opt_state) <= 2 * size(trainable) + 8  # Adam moments of the trainable tree only
  assert size(frozen) > 0 and "embed" not in trainable and "head" not in trainable


def _losses(path: str) -> dict[int, list[float]]:
  out: dict[int, list[float]] = {}
  for r in read_metrics(path):
    if "loss" in r:
      out.setdefault(r["step"], []).append(r["loss"])
  return out


# Runs train/main.py in a child that SIGKILLs itself right after it logs step 130's loss: a kill
# at a fixed step mid-interval (checkpoints every 40), whatever the machine's speed.
_DIE_AT_STEP = """
import os, runpy, signal, sys
import train.loop as loop
write = loop.MetricsLog.write
def write_then_die(self, record):
  write(self, record)
  if record.get("step") == int(os.environ["DIE_AT_STEP"]) and "loss" in record:
    os.kill(os.getpid(), signal.SIGKILL)
loop.MetricsLog.write = write_then_die
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_sigkill_and_resume_reproduces_the_loss_curve(tiny, tmp_path):
  root = tiny[0]
  overrides = {"steps": 240, "save_every": 40, "log_every": 1000, "eval_windows": 0}
  config = tiny_config("train_medusa", root)
  config.train.update(overrides)
  killed = tmp_path / "killed"
  cmd = [
    sys.executable,
    "-c",
    _DIE_AT_STEP,
    os.path.join(REPO, "train", "main.py"),
    "--config",
    os.path.join(REPO, "configs", "train_medusa.py") + ":tiny",
    f"--workdir={killed}",
    f"--config.target={config.target}",
    f"--config.data.cache_dir={config.data.cache_dir}",
  ] + [f"--config.train.{k}={v}" for k, v in overrides.items()]
  env = {**os.environ, "DIE_AT_STEP": "130", "PYTHONPATH": REPO}
  proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  try:
    straight = tmp_path / "straight"
    pipeline.run(config, str(straight), lambda _: None)
    _, err = proc.communicate(timeout=600)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
  assert max(_losses(str(killed / "metrics.jsonl"))) == 130
  lines = []
  pipeline.run(config, str(killed), lines.append)
  resumed_from = [int(x.split()[-1]) for x in lines if x.startswith("resumed from step")]
  assert resumed_from and 40 <= resumed_from[0] < 130
  ref, got = _losses(str(straight / "metrics.jsonl")), _losses(str(killed / "metrics.jsonl"))
  assert sorted(got) == sorted(ref) == list(range(1, 241))
  # The steps redone after the kill replaced their first records: one record per step.
  assert {len(v) for v in got.values()} == {1}
  for step, values in got.items():
    np.testing.assert_allclose(values, ref[step], rtol=1e-6, err_msg=f"step {step}")


def test_stop_and_resume_eagle_in_process(tiny, tmp_path):
  root = tiny[0]
  config = tiny_config("train_eagle", root, steps=2)
  config.train.update({"steps": 10, "save_every": 3, "eval_windows": 4, "log_every": 1})
  pipeline.run(config, str(tmp_path / "a"), lambda _: None)
  b = str(tmp_path / "b")
  pipeline.run(config, b, lambda _: None, stop_after=5)  # checkpoint at 5
  # Killed once step 8 is logged (lines: positions, resumed, the stopped run's final evaluation
  # dropped, steps 6-8); the last checkpoint is step 6's.
  with pytest.raises(KeyboardInterrupt):
    pipeline.run(config, b, _killed_after(6))
  assert max(_losses(os.path.join(b, "metrics.jsonl"))) == 8
  lines = []
  pipeline.run(config, b, lines.append)
  assert "resumed from step 6" in lines and "metrics.jsonl: dropped 2 record(s) past step 6" in str(
    lines
  )
  pipeline.run(config, b, lambda _: None)  # already done: the final evaluation is not repeated
  a, got = _losses(str(tmp_path / "a/metrics.jsonl")), _losses(os.path.join(b, "metrics.jsonl"))
  assert {len(v) for v in got.values()} == {1} and sorted(got) == list(range(1, 11))
  assert {k: v[0] for k, v in a.items()} == pytest.approx({k: v[0] for k, v in got.items()})
  finals = [r for r in read_metrics(os.path.join(b, "metrics.jsonl")) if r.get("final")]
  assert len(finals) == 1 and finals[0]["step"] == 10


KINDS = {
  "draft_lm": ("train_draft_lm", {}),
  "medusa": ("train_medusa", {}),
  "eagle1": ("train_eagle", {}),
  "eagle3": ("train_eagle3", {"steps": 2}),
  "pard": ("train_pard", {}),
  "peagle": ("train_peagle", {}),
}
BASES = {"pard": "draft_lm", "peagle": "eagle3"}  # the parallel kinds extend a shipped drafter


@pytest.fixture(scope="module")
def ship(tiny):
  """ship(kind) trains tiny-<kind> for 40 steps and ships it, once per module and worker (a
  parallel kind ships the drafter it extends first); returns (config, workdir, heldout, meta). The
  tests that need a shipped drafter call it, so none depends on which tests ran before it."""
  root, done = tiny[0], {}

  def run(kind: str):
    if kind not in done:
      base = BASES.get(kind)
      if base:
        run(base)
      name, objective = KINDS[kind]
      config = tiny_config(name, root, **objective)
      # the parallel drafters train only their mask path over a frozen drafter: a higher rate
      config.train.update({"steps": 40, "lr": 1e-2 if base else 2e-3, "save_every": 1000})
      config.ship.name = f"tiny-{kind}"
      workdir = str(root / f"work_{kind}")
      _, _, _, heldout, meta = pipeline.run(config, workdir, lambda _: None)
      done[kind] = (config, workdir, heldout, meta)
    return done[kind]

  return run


@pytest.fixture(scope="module")
def heldout_ar(tiny):
  """Held-out prompts of the tiny cache and the target's AR greedy continuation of them."""
  _, params, cfg, store = tiny[:4]
  docs = np.flatnonzero(store.heldout)
  starts, lens = store.doc_starts[docs], store.prompt_lens[docs]
  P, L = pad_prompts([list(store.tokens[s : s + n]) for s, n in zip(starts, lens)], bucket=16)
  gen = GenerateConfig(max_new_tokens=24)
  return P, L, gen, generate(params, cfg, P, L, gen)


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_kind_learns_ships_and_decodes_exactly(tiny, heldout_ar, ship, kind):
  _, params, cfg = tiny[:3]
  config, workdir, heldout, meta = ship(kind)
  kl = {}  # the KL part of the loss (the loss itself includes the target's entropy)
  for r in read_metrics(os.path.join(workdir, "metrics.jsonl")):
    if "loss" in r:
      kl[r["step"]] = sum(v for k, v in r.items() if k.startswith("kl"))
  assert np.mean([kl[s] for s in range(31, 41)]) < 0.9 * np.mean([kl[s] for s in range(1, 6)])
  assert meta["heldout"] == heldout and meta["sha256"] and meta["data"]["prompts_sha256"]
  rates = {k: v for k, v in heldout.items() if k.startswith(("top1", "prefix"))}
  assert rates and all(0 <= v <= 1 for v in rates.values()) and heldout["eval_positions"] > 0
  assert heldout["simulated_tau"] == pytest.approx(simulated_tau(rates))
  if "prefix_step2" in rates:  # every multi-depth kind: depths 1-2 together never beat depth 2
    assert rates["prefix_step2"] <= rates.get("top1_step2", rates.get("top1_head1")) + 1e-9
  shipped = load_shipped(f"tiny-{kind}", params, cfg, config.ship.dir)
  # Greedy speculative decoding with the shipped drafter on held-out prompts equals AR greedy.
  P, L, gen, ar = heldout_ar
  out = speculative_generate(params, cfg, shipped.drafter(3), shipped.params, P, L, gen)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ar.tokens))
  assert summarize(out.metrics)["drafted"] > 0


def test_an_eagle_head_continues_from_a_shipped_one(tiny, ship, tmp_path):
  """objective.init_from starts from a shipped head's weights and keeps its draft vocabulary."""
  root, params, cfg = tiny[:3]
  ship("eagle3")
  shipped = load_shipped("tiny-eagle3", params, cfg, str(root / "shipped"))
  config = tiny_config("train_eagle3", root, steps=2, init_from="tiny-eagle3")
  config.data.draft_vocab = 40  # the data would choose another vocabulary; the head's wins
  objective = pipeline.make_objective(dict(config.objective), cfg)
  d2t = np.asarray(shipped.params.d2t)
  trainable, frozen = objective.init(jax.random.PRNGKey(1), params, cfg, d2t, str(root / "shipped"))
  start = objective.draft_params(trainable, frozen)
  for field in ("w_in", "fuse", "fuse_norm", "norm", "head"):
    np.testing.assert_array_equal(getattr(start, field), getattr(shipped.params, field))
  config.train.update({"steps": 2, "save_every": 1000})
  config.ship.update({"name": "tiny-eagle3-continued", "dir": str(tmp_path / "shipped")})
  shutil.copytree(root / "shipped", tmp_path / "shipped")
  logs = []
  meta = pipeline.run(config, str(tmp_path / "w"), logs.append)[4]
  np.testing.assert_array_equal(np.load(tmp_path / "w" / "d2t.npy"), d2t)
  start = meta["continued_from"]  # what it started from is recorded with the drafter
  assert (start["name"], start["sha256"]) == ("tiny-eagle3", shipped.metadata["sha256"])
  assert start["training"]["steps"] == 40 and start["heldout"]["simulated_tau"] > 1
  assert [(r["name"], r["sha256"]) for r in meta["stages"]] == [(start["name"], start["sha256"])]
  # It re-read the windows of the head's 40 steps (data_start 0): the run says so, and how to not.
  assert any("steps 0-39 of this data" in m and "data_start=40" in m for m in logs), logs
  s = pipeline.settings_from_config(config).train
  manifest = shipped.metadata["data"]
  assert pipeline.reread_note(shipped.metadata, manifest, s) is not None
  assert (
    pipeline.reread_note(shipped.metadata, manifest, dataclasses.replace(s, data_start=40)) is None
  )
  other_order = dataclasses.replace(s, seed=1)  # another data order: no claim about overlap
  assert pipeline.reread_note(shipped.metadata, manifest, other_order) is None
  # A head continued from one that read steps 0-39 and read 40-59 itself: both ranges count.
  read_40_59 = {"data_start": 40, "steps": 20, "steps_done": 20}
  twice = {**meta, "training": {**meta["training"], **read_40_59}}
  twice["continued_from"] = shipped.metadata
  note = pipeline.reread_note(twice, manifest, dataclasses.replace(s, data_start=50, steps=5))
  assert note is not None and "0-39, 40-59" in note and "data_start=60" in note
  assert pipeline.reread_note(twice, manifest, dataclasses.replace(s, data_start=60)) is None
  # A third stage (steps 60-69) still knows the first one's steps, though `continued_from` keeps
  # only the second: `stages` carries the whole lineage, oldest first.
  third = {
    **twice,
    "training": {**twice["training"], "data_start": 60, "steps": 10, "steps_done": 10},
    "continued_from": twice,
    "stages": export.lineage(twice),
  }
  assert [r["training"]["data_start"] for r in export.lineage(third)] == [0, 40, 60]
  note = pipeline.reread_note(third, manifest, dataclasses.replace(s, data_start=5, steps=5))
  assert note is not None and "0-39, 40-59, 60-69" in note and "data_start=70" in note
  # Metadata written before `stages` existed gives the stage it continued and itself.
  legacy = {k: v for k, v in twice.items() if k != "stages"}
  old_stages = [shipped.metadata["sha256"], meta["sha256"]]
  assert [r["sha256"] for r in export.lineage(legacy)] == old_stages
  # A time-boxed run that planned 20 steps but stopped after 5 read only steps 40-44.
  boxed = {**twice, "training": {**twice["training"], "steps_done": 5}}
  assert "40-44" in pipeline.reread_note(boxed, manifest, dataclasses.replace(s, data_start=42))
  assert pipeline.reread_note(boxed, manifest, dataclasses.replace(s, data_start=45)) is None
  # At twice the batch size, step s reads the windows of steps 2s and 2s + 1 (windows 160-179 of
  # steps 40-44 at batch 4 are steps 20-22 at batch 8).
  double = dataclasses.replace(s, batch_size=2 * s.batch_size, steps=2)
  note = pipeline.reread_note(boxed, manifest, dataclasses.replace(double, data_start=21))
  assert note is not None and "0-19, 20-22" in note and "data_start=23" in note
  assert pipeline.reread_note(boxed, manifest, dataclasses.replace(double, data_start=23)) is None
  with pytest.raises(ValueError, match="fuses differently"):
    pipeline.make_objective({**dict(config.objective), "fuse_norm": False}, cfg).init(
      jax.random.PRNGKey(1), params, cfg, d2t, str(root / "shipped")
    )


@pytest.mark.parametrize("name", ["train_eagle", "train_eagle3", "train_medusa", "train_peagle"])
def test_continuing_configs_read_past_their_shipped_heads(name):
  """Each config that continues a shipped drafter starts at a step of the data order that
  neither that drafter nor any stage it descends from trained on (its `data_start` moves on
  whenever a new stage ships)."""
  from specjax.drafters.shipped import read_metadata

  s = pipeline.settings_from_config(load_config(name, ""))
  old = read_metadata(s.objective["init_from"])
  assert os.path.basename(s.data.corpus) == old["data"]["corpus"]["name"]
  assert pipeline.reread_note(old, old["data"], s.train) is None
  # The check has teeth: one step earlier than where the last stage stopped repeats it.
  last = old["training"]
  stop = last["data_start"] + last.get("steps_done", last["steps"])
  back = dataclasses.replace(
    s.train, data_start=stop * last["batch_size"] // s.train.batch_size - 1
  )
  assert pipeline.reread_note(old, old["data"], back) is not None


def test_an_eagle_head_grows_its_draft_vocabulary_with_the_targets_rows(
  tiny, ship, heldout_ar, tmp_path
):
  """objective.grow_vocab appends the corpus's most frequent tokens outside the head's vocabulary;
  their rows are the target's (frozen, not shipped), the head's own rows train, and the grown head
  decodes exactly."""
  root, params, cfg, store = tiny[:4]
  ship("eagle3")
  shutil.copytree(root / "shipped", tmp_path / "shipped")
  old = load_shipped("tiny-eagle3", params, cfg, str(tmp_path / "shipped"))
  n = len(old.params.d2t)
  config = tiny_config("train_eagle3", root, steps=2, init_from="tiny-eagle3", grow_vocab=n + 8)
  config.train.update({"steps": 3, "save_every": 1000})
  config.ship.update({"name": "tiny-eagle3-grown", "dir": str(tmp_path / "shipped")})
  meta = pipeline.run(config, str(tmp_path / "w"), lambda _: None)[4]
  d2t = np.load(tmp_path / "w" / "d2t.npy")
  np.testing.assert_array_equal(d2t[:n], old.params.d2t)
  counts = store.token_counts(cfg.vocab_size)
  added = d2t[n:]
  assert len(added) == 8 and not np.isin(added, old.params.d2t).any()
  outside = np.setdiff1d(np.arange(cfg.vocab_size), old.params.d2t)
  assert counts[added].min() >= np.sort(counts[outside])[-8]  # the most frequent ones outside
  assert meta["shapes"]["head"][0] == n and meta["shapes"]["d2t"] == [n + 8]
  grown = load_shipped("tiny-eagle3-grown", params, cfg, str(tmp_path / "shipped"))
  assert grown.params.head.shape[0] == n + 8
  np.testing.assert_array_equal(grown.params.head[n:], lm_head_rows(params)[added])
  assert not np.allclose(grown.params.head[:n], old.params.head)  # the head's own rows trained
  P, L, gen, ar = heldout_ar
  out = speculative_generate(params, cfg, grown.drafter(3), grown.params, P, L, gen)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ar.tokens))
  with pytest.raises(ValueError, match="init_from"):
    pipeline.make_objective({**dict(config.objective), "init_from": ""}, cfg)
  with pytest.raises(ValueError, match="larger than the head's"):
    pipeline.grown_vocabulary(d2t, counts, n + 8)
  # A P-EAGLE trained over the head before it grew continues over the grown one.
  ship("peagle")
  shutil.copy(root / "shipped" / "tiny-peagle.json", tmp_path / "shipped")
  shutil.copy(root / "shipped" / "tiny-peagle.safetensors", tmp_path / "shipped")
  o = dict(
    tiny_config("train_peagle", root, base="tiny-eagle3-grown", init_from="tiny-peagle").objective
  )
  trainable, frozen = pipeline.make_objective(o, cfg).init(
    jax.random.PRNGKey(0), params, cfg, d2t, str(tmp_path / "shipped")
  )
  masks = load_shipped("tiny-peagle", params, cfg, str(root / "shipped")).params.mask_embed
  np.testing.assert_array_equal(trainable["mask_embed"], masks)
  np.testing.assert_array_equal(frozen["d2t"], d2t)


def lm_head_rows(params) -> np.ndarray:
  return np.asarray(params.embed if params.lm_head is None else params.lm_head)


def test_medusa_heads_continue_from_shipped_ones(tiny, ship):
  root, params, cfg = tiny[:3]
  ship("medusa")
  shipped = load_shipped("tiny-medusa", params, cfg, str(root / "shipped"))
  config = tiny_config("train_medusa", root, init_from="tiny-medusa")
  objective = pipeline.make_objective(dict(config.objective), cfg)
  d2t = np.asarray(shipped.params.d2t)
  trainable, _ = objective.init(None, params, cfg, d2t, str(root / "shipped"))
  np.testing.assert_array_equal(trainable["w"], np.asarray(shipped.params.w, np.float32))
  np.testing.assert_array_equal(trainable["b"], np.asarray(shipped.params.b, np.float32))
  assert np.abs(trainable["w"]).sum() > 0  # trained heads, not the identity initialisation
  fewer = pipeline.make_objective({**dict(config.objective), "n_heads": 2}, cfg)
  with pytest.raises(ValueError, match="heads"):
    fewer.init(None, params, cfg, d2t, str(root / "shipped"))


def test_medusa_heads_grow_a_fusion_of_target_layers(tiny, ship, heldout_ar, tmp_path):
  """objective.fuse_layers on heads continued from plain ones: the fusion starts at zero (the
  shipped heads' logits), trains, ships, and the loaded heads read those layers in decoding."""
  root, params, cfg = tiny[:3]
  ship("medusa")
  shutil.copytree(root / "shipped", tmp_path / "shipped")
  plain = load_shipped("tiny-medusa", params, cfg, str(tmp_path / "shipped"))
  config = tiny_config("train_medusa", root, init_from="tiny-medusa", fuse_layers=(0, 1))
  config.train.update({"steps": 3, "save_every": 1000})
  config.ship.update({"name": "tiny-medusa-fused", "dir": str(tmp_path / "shipped")})
  objective = pipeline.make_objective(dict(config.objective), cfg)
  d2t = np.asarray(plain.params.d2t)
  trainable, frozen = objective.init(None, params, cfg, d2t, str(tmp_path / "shipped"))
  D = cfg.d_model
  assert not np.asarray(trainable["fuse"]).any() and trainable["fuse"].shape == (D, 2 * D)
  h = jax.random.normal(jax.random.PRNGKey(0), (3, D))
  layers = 100.0 * jax.random.normal(jax.random.PRNGKey(1), (2, 3, D))
  np.testing.assert_allclose(
    np.asarray(medusa_logits(objective.draft_params(trainable, frozen), h, layers)),
    np.asarray(medusa_logits(plain.params, h)),
    rtol=1e-5,
    atol=1e-4,
  )
  meta = pipeline.run(config, str(tmp_path / "w"), lambda _: None)[4]
  assert meta["config"]["fuse_layers"] == [0, 1] and meta["shapes"]["fuse"] == [D, 2 * D]
  fused = load_shipped("tiny-medusa-fused", params, cfg, str(tmp_path / "shipped"))
  assert np.asarray(fused.params.fuse).any()  # the fusion trained
  drafter = fused.drafter(3)
  assert drafter.hidden_layers == (0, 1)
  with pytest.raises(ValueError, match="fuse target layers"):
    medusa_logits(fused.params, h)
  P, L, gen, ar = heldout_ar
  out = speculative_generate(params, cfg, drafter, fused.params, P, L, gen)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ar.tokens))
  assert summarize(out.metrics)["drafted"] > 0
  with pytest.raises(ValueError, match="fuse_layers"):  # fused heads cannot continue as plain ones
    pipeline.make_objective(
      {**dict(config.objective), "init_from": "tiny-medusa-fused", "fuse_layers": ()}, cfg
    ).init(None, params, cfg, d2t, str(tmp_path / "shipped"))


def test_pard_continues_from_a_shipped_mask_path(tiny, ship):
  root, params, cfg = tiny[:3]
  ship("pard")
  shipped = load_shipped("tiny-pard", params, cfg, str(root / "shipped"))
  config = tiny_config("train_pard", root, init_from="tiny-pard")
  objective = pipeline.make_objective(dict(config.objective), cfg)
  d2t = np.asarray(shipped.params.lm.d2t)
  trainable, frozen = objective.init(None, params, cfg, d2t, str(root / "shipped"))
  start = objective.draft_params(trainable, frozen)
  np.testing.assert_array_equal(start.mask_embed, shipped.params.mask_embed)
  for a, b in zip(jax.tree.leaves(start.mask_layers), jax.tree.leaves(shipped.params.mask_layers)):
    np.testing.assert_array_equal(a, b)
  fresh = pipeline.make_objective({**dict(config.objective), "init_from": ""}, cfg)
  fresh_embed = fresh.init(None, params, cfg, d2t, str(root / "shipped"))[0]["mask_embed"]
  assert not np.allclose(fresh_embed, shipped.params.mask_embed)  # trained, not the start
  for wrong, match in (({"k": 2}, "mask shapes"), ({"init_from": "tiny-draft_lm"}, "not pard")):
    with pytest.raises(ValueError, match=match):
      pipeline.make_objective({**dict(config.objective), **wrong}, cfg).init(
        None, params, cfg, d2t, str(root / "shipped")
      )


def test_peagle_warm_starts_from_a_shipped_mask_path_over_a_changed_base(tiny, ship, tmp_path):
  """objective.init_from copies a shipped P-EAGLE's mask layer and embeddings, even when the base
  it was trained over has since changed (its pinned sha256 no longer matches)."""
  root, params, cfg = tiny[:3]
  ship("peagle")
  shipped_dir = tmp_path / "shipped"
  shutil.copytree(root / "shipped", shipped_dir)
  meta = json.loads((shipped_dir / "tiny-peagle.json").read_text())
  old = load_shipped("tiny-peagle", params, cfg, str(shipped_dir))
  meta["base"]["sha256"] = "0" * 64  # as if tiny-eagle3 had been retrained since
  (shipped_dir / "tiny-peagle.json").write_text(json.dumps(meta))
  with pytest.raises(ShippedDrafterError, match="retrain"):
    load_shipped("tiny-peagle", params, cfg, str(shipped_dir))
  config = tiny_config("train_peagle", root, init_from="tiny-peagle")
  objective = pipeline.make_objective(dict(config.objective), cfg)
  d2t = np.asarray(old.params.eagle.d2t)
  trainable, frozen = objective.init(jax.random.PRNGKey(0), params, cfg, d2t, str(shipped_dir))
  start = objective.params(trainable, frozen)
  np.testing.assert_array_equal(start.mask_embed, old.params.mask_embed)
  for a, b in zip(jax.tree.leaves(start.mask_layer), jax.tree.leaves(old.params.mask_layer)):
    np.testing.assert_array_equal(a, b)
  fresh, _ = pipeline.make_objective({**dict(config.objective), "init_from": ""}, cfg).init(
    jax.random.PRNGKey(0), params, cfg, d2t, str(shipped_dir)
  )
  assert not np.array_equal(fresh["mask_embed"], trainable["mask_embed"])  # trained, not initial
  deeper = pipeline.make_objective({**dict(config.objective), "k": 4}, cfg)
  with pytest.raises(ValueError, match="mask shapes"):
    deeper.init(jax.random.PRNGKey(0), params, cfg, d2t, str(shipped_dir))


def longest_document(params, cfg, store) -> Batch:
  """The store's longest document as one packed window, with the target's hidden state and
  layers 0 and 1 (what the tiny parallel objectives fuse)."""
  d = int(np.argmax(store.doc_lens))
  s, n = store.doc_starts[d], store.doc_lens[d]
  toks = jnp.asarray(store.tokens[s : s + n])[None]
  full = forward(params, toks, init_cache(cfg, 1, n), cfg, hidden_layers=(0, 1))
  return Batch(toks, full.hidden, full.layer_hidden, jnp.zeros((1, n), jnp.int32),
               jnp.arange(n)[None], jnp.ones((1, n), bool))  # fmt: skip


def test_peagle_head_state_starts_as_the_mask_path_it_continues(tiny, ship, tmp_path):
  """objective.head_state over a shipped P-EAGLE that did not read the head's state starts with a
  zero projection, so its depths are that drafter's; once shipped, the projection loads with it,
  and continuing it without head_state is refused."""
  root, params, cfg, store = tiny[:4]
  ship("eagle3")
  shipped_dir = tmp_path / "shipped"
  shutil.copytree(root / "shipped", shipped_dir)
  o = {**dict(tiny_config("train_peagle", root).objective), "init_from": ""}
  d2t = np.asarray(load_shipped("tiny-eagle3", params, cfg, str(shipped_dir)).params.d2t)
  make = lambda **kw: pipeline.make_objective({**o, **kw}, cfg)
  init = lambda obj: obj.init(jax.random.PRNGKey(0), params, cfg, d2t, str(shipped_dir))
  tr, fr = init(make(head_state=False))  # a drafter that does not read it, shipped
  export_drafter(str(shipped_dir), "tiny-plain", make(head_state=False), tr, fr, "tiny", cfg, {})
  plain = make(head_state=False, init_from="tiny-plain")
  reads = make(head_state=True, init_from="tiny-plain")
  (tr0, fr0), (tr1, fr1) = init(plain), init(reads)
  assert "mask_state" not in tr0 and not np.any(np.asarray(tr1["mask_state"]))
  batch = longest_document(params, cfg, store)
  np.testing.assert_allclose(
    reads.outputs(reads.params(tr1, fr1), batch),
    plain.outputs(plain.params(tr0, fr0), batch),
    atol=1e-5,
  )
  tr1 = {**tr1, "mask_state": jnp.full_like(tr1["mask_state"], 0.01)}
  export_drafter(str(shipped_dir), "tiny-state", reads, tr1, fr1, "tiny", cfg, {})
  loaded = load_shipped("tiny-state", params, cfg, str(shipped_dir)).params
  np.testing.assert_allclose(loaded.mask_state, 0.01, rtol=1e-3)
  with pytest.raises(ValueError, match="head_state"):
    init(make(head_state=False, init_from="tiny-state"))


def test_peagle_head_depth2_is_eagles_sequential_step_2(tiny, ship, tmp_path):
  """With objective.head_depth2, P-EAGLE's depth 2 is exactly the frozen head's sequential step 2
  (its training-time-test unroll) however the mask path is trained, where a mask's is not; the
  flag travels in the metadata to the drafter."""
  root, params, cfg, store = tiny[:4]
  ship("eagle3")
  shipped_dir = tmp_path / "shipped"
  shutil.copytree(root / "shipped", shipped_dir)
  o = {**dict(tiny_config("train_peagle", root).objective), "init_from": "", "first_token": True}
  d2t = np.asarray(load_shipped("tiny-eagle3", params, cfg, str(shipped_dir)).params.d2t)
  batch = longest_document(params, cfg, store)

  def depth2(obj):
    tr, fr = obj.init(jax.random.PRNGKey(0), params, cfg, d2t, str(shipped_dir))
    tr = jax.tree.map(lambda x: x + 0.3 * jax.random.normal(jax.random.PRNGKey(2), x.shape), tr)
    return obj.outputs(obj.params(tr, fr), batch)[:, 1], (tr, fr)

  obj = pipeline.make_objective({**o, "head_depth2": True}, cfg)
  got, (tr, fr) = depth2(obj)
  seq = EagleObjective(obj.cfg, 2, obj.fuse_layers, w_reg=0.0, w_cls=1.0)
  step2 = seq.unroll(fr["eagle"], fr, batch)[1]  # [B, T, D]
  np.testing.assert_allclose(got, step2, atol=1e-4)
  masked = depth2(pipeline.make_objective({**o, "head_depth2": False}, cfg))[0]
  assert not np.allclose(masked, step2, atol=1e-2)
  export_drafter(str(shipped_dir), "tiny-depth2", obj, tr, fr, "tiny", cfg, {})
  assert load_shipped("tiny-depth2", params, cfg, str(shipped_dir)).drafter(3).head_depth2
  with pytest.raises(ValueError, match="first_token"):
    pipeline.make_objective({**o, "head_depth2": True, "first_token": False}, cfg)


def test_a_parallel_drafter_without_a_base_is_refused_before_training(tiny, tmp_path):
  root = tiny[0]
  config = tiny_config("train_peagle", root, base="")
  config.ship.name = "tiny-peagle-nobase"
  with pytest.raises(ValueError, match="set objective.base"):
    pipeline.run(config, str(tmp_path / "work"), lambda _: None)
  assert not (tmp_path / "work").exists()


def test_a_continuation_whose_start_is_not_in_ship_dir_is_refused_before_reading(tmp_path):
  pipeline.check_sources({"init_from": "eagle3-smollm2-135m"}, "")  # the package's shipped dir
  with pytest.raises(ValueError, match=r"objective.init_from='eagle3-smollm2-135m'.*copy"):
    pipeline.check_sources({"init_from": "eagle3-smollm2-135m"}, str(tmp_path))
  with pytest.raises(ValueError, match=r"objective.base='draft-lm2-smollm2-135m'"):
    pipeline.check_sources({"base": "draft-lm2-smollm2-135m"}, str(tmp_path))


def test_shipped_loader_verifies_checksum_target_and_shapes(tiny, ship):
  root, params, cfg = tiny[:3]
  directory = root / "shipped"
  ship("medusa")
  load_shipped("tiny-medusa", params, cfg, str(directory))
  with pytest.raises(ShippedDrafterError, match="no shipped drafter"):
    load_shipped("nope", params, cfg, str(directory))
  with pytest.raises(ShippedDrafterError, match="target"):
    load_shipped("tiny-medusa", params, cfg.replace(d_model=64), str(directory))
  blob = (directory / "tiny-medusa.safetensors").read_bytes()
  bad = directory / "bad"
  bad.mkdir(exist_ok=True)
  (bad / "tiny-medusa.json").write_text((directory / "tiny-medusa.json").read_text())
  (bad / "tiny-medusa.safetensors").write_bytes(blob[:-1] + bytes([blob[-1] ^ 1]))
  with pytest.raises(ShippedDrafterError, match="sha256"):
    load_shipped("tiny-medusa", params, cfg, str(bad))


def test_training_computation_is_what_the_drafters_run(tiny):
  """Teacher-forced training logits equal the drafters' own logits on the same positions."""
  root, params, cfg, store = tiny[:4]
  d = int(np.argmax(store.doc_lens))
  s, n = store.doc_starts[d], store.doc_lens[d]
  toks = store.tokens[s : s + n]
  batch = Batch(
    jnp.asarray(toks)[None],
    jnp.asarray(store.hidden[s : s + n], jnp.float32)[None],
    None,
    jnp.zeros((1, n), jnp.int32),
    jnp.arange(n)[None],
    jnp.ones((1, n), bool),
  )
  d2t = np.arange(64)
  # Draft LM: training forward == specjax.model.forward of the same weights.
  dlm = pipeline.make_objective(
    dict(kind="draft_lm", n_layers=1, init_layers=(1,), train_head=True), cfg
  )
  tr, fr = dlm.init(jax.random.PRNGKey(0), params, cfg, d2t)
  dp = dlm.draft_params(tr, fr)
  ref = forward(dp.as_model(), batch.tokens, init_cache(dlm.cfg, 1, n), dlm.cfg).logits
  np.testing.assert_allclose(dlm.logits(tr, fr, batch), ref, atol=1e-4, rtol=1e-4)
  # EAGLE with 2 unrolled steps: step j at anchor a == the drafter's j-th proposal distribution.
  eg = pipeline.make_objective(dict(kind="eagle", steps=2), cfg)
  tr, fr = eg.init(jax.random.PRNGKey(1), params, cfg, d2t)
  tr = jax.tree.map(lambda x: x + 0.3 * jax.random.normal(jax.random.PRNGKey(2), x.shape), tr)
  ep = eg.draft_params(tr, fr)
  drafter = eg.drafter(2)
  a = n - 6
  pre = prefill(params, cfg, batch.tokens[:, : a + 1], jnp.asarray([a + 1]), 64)
  state = drafter.init(ep, pre, batch.tokens[:, : a + 1], jnp.asarray([a + 1]), 64)
  seq = jnp.zeros((1, 64), jnp.int32).at[0, :n].set(batch.tokens[0])
  prop = drafter.propose(
    ep, state, seq, jnp.asarray([a + 2]), jax.random.PRNGKey(3), SamplingConfig(1.0)
  )
  # Teacher-force the drafted first token so both computations see the same inputs.
  toks2 = np.array(toks)
  toks2[a + 2] = int(prop.tokens[0, 0])
  out = forward(params, jnp.asarray(toks2)[None], init_cache(cfg, 1, n), cfg)
  b2 = Batch(jnp.asarray(toks2)[None], out.hidden, None, batch.doc, batch.pos, batch.response)
  o1, o2 = eg.unroll(tr, fr, b2)
  for j, o in enumerate((o1, o2)):
    ref = jax.nn.log_softmax(head_logits(ep, o[0, a], cfg.norm_eps))
    np.testing.assert_allclose(prop.logq[0, j], ref, atol=2e-3, rtol=1e-3)


@pytest.mark.parametrize(
  "kind,first,state,depth2",
  [
    ("pard", False, False, False),
    ("peagle", False, False, False),
    ("peagle", True, False, False),
    ("peagle", True, True, False),
    ("peagle", True, True, True),
  ],
)
def test_parallel_training_computation_is_what_the_drafters_run(tiny, kind, first, state, depth2):
  """Every depth of the parallel objectives (`train.streams`) equals the block the drafter reads
  at the same anchor, with weights perturbed away from their initialisation (first: P-EAGLE's
  masks read the head's greedy depth-1 draft, as its evaluation feeds them; state: and the
  head's depth-1 output; depth2: depth 2 is the head's own step, in the masks' pass)."""
  _, params, cfg, store = tiny[:4]
  batch = longest_document(params, cfg, store)
  toks, n = batch.tokens, batch.tokens.shape[1]
  k, a, cap = 3, n - 6, 64
  o = dict(kind=kind, k=k, n_layers=1, init_layers=(1,), fuse_layers=(0, 1), init_layer=1,
           first_token=first, head_state=state, head_depth2=depth2)  # fmt: skip
  obj = pipeline.make_objective(o, cfg)
  tr, fr = obj.init(jax.random.PRNGKey(1), params, cfg, np.arange(64))
  tr = jax.tree.map(lambda x: x + 0.3 * jax.random.normal(jax.random.PRNGKey(2), x.shape), tr)
  dp, drafter = obj.draft_params(tr, fr), obj.drafter(k)
  seq = jnp.zeros((1, cap), jnp.int32).at[0, :n].set(toks[0])
  if kind == "pard":  # the draft has read x_0..x_{a-1}; x_a is the last, unseen token
    want = obj.logits(tr, fr, batch)[0, :, a]
    state = drafter.init(dp, None, toks[:, :a], jnp.asarray([a]), cap)
    got = drafter.block_logits(dp, state, seq, jnp.asarray([a + 1]))[0][0]
  else:  # the head has the target's features up to a; the pair (x_{a+1}, f_a) is pending
    o_all = obj.outputs(dp, batch)
    if first:
      greedy = first_tokens(dp, head_logits(dp.eagle, o_all[0, 0], cfg.norm_eps))
      o_all = obj.outputs(dp, batch, greedy[None])
    want = jnp.stack([head_logits(dp.eagle, o_all[0, j, a], cfg.norm_eps) for j in range(k)])
    pre = prefill(params, cfg, toks[:, : a + 1], jnp.asarray([a + 1]), cap, (0, 1))
    state = drafter.init(dp, pre, toks[:, : a + 1], jnp.asarray([a + 1]), cap)
    got = drafter.block_logits(dp, state, seq, jnp.asarray([a + 2]))[0][0]
  np.testing.assert_allclose(got, want, atol=2e-3, rtol=2e-3)
  assert not np.allclose(want[1], want[2], atol=1e-2)  # the depths really differ


def test_decontaminator_flags_exact_and_near_duplicates():
  evals = {"x": ["Compose an engaging travel blog post about a recent trip to Hawaii.", "Hi"]}
  clean = decontam.Decontaminator(evals)
  assert not clean.is_clean("compose an ENGAGING travel blog post about a recent trip to Hawaii!!")
  assert not clean.is_clean(
    "Please: compose an engaging travel blog post about a recent trip to Hawaii, thanks."
  )
  assert not clean.is_clean("Hi")  # a short evaluation text contained whole
  assert clean.is_clean("Write a poem about the sea and a lighthouse keeper at night.")
  assert clean.is_clean("Compose an engaging poem.")  # a few shared words are not a duplicate
  m = clean.match("x Compose an engaging travel blog post about a recent trip to Hawaii y")
  assert m is not None and m.eval_set == "x" and m.eval_index == 0


def test_decontaminator_flags_a_long_shared_phrase_below_the_ngram_threshold():
  """The first corpus's defect: a long evaluation prompt and a training prompt shared one phrase
  ("could include providing step-by-step instructions for solving") and nothing else, too few
  8-grams for the n-gram rule; the shared-span rule catches it."""
  teacher = (
    "I want you to act as a math teacher. I will provide some mathematical equations or terms, "
    "and it will be your job to explain them in easy-to-understand terms. This could include "
    "providing step-by-step instructions for solving a problem, demonstrating various techniques "
    "with visuals or suggesting online resources for further study."
  )
  train_text = (
    "You will be given a subject that you need to teach me. Your answer could include providing "
    "step-by-step instructions for solving exercises, and a short quiz at the end."
  )
  assert decontam.Decontaminator({"x": [teacher]}, span=10_000).is_clean(train_text)  # n-grams only
  m = decontam.Decontaminator({"x": [teacher]}).match(train_text)
  assert m is not None and (m.eval_set, m.eval_index) == ("x", 0)
  # A shorter common run is not a match.
  assert decontam.Decontaminator({"x": [teacher]}).is_clean("This could include a short quiz.")


def test_training_prompts_exclude_every_evaluation_prompt(smollm2):
  """Every shipped drafter was trained on a committed corpus (sha256 and generating target
  recorded); each such corpus's prompt list is rebuilt from the recorded order and checked by a
  second method, independent of `train.decontam.Decontaminator` (which tests/test_corpus.py
  applies): no normalised evaluation prompt occurs inside a training prompt or contains one, and no
  long word span is shared."""
  corpora = {}
  for name in ("smollm2-sd-v1", "smollm2-sd-v2"):
    path = os.path.join(REPO, "train", "corpora", f"{name}.npz")
    if os.path.exists(path):
      corpora[corpus.read_meta(path)["sha256"]] = (name, corpus.read_meta(path))
  shipped = os.path.join(REPO, "specjax", "drafters", "shipped")
  used, checked = set(), 0
  for meta_file in [f for f in os.listdir(shipped) if f.endswith(".json")]:
    with open(os.path.join(shipped, meta_file)) as f:
      data = json.load(f)["data"]
    assert data["corpus"]["sha256"] in corpora, meta_file  # trained on a committed corpus
    name, meta = corpora[data["corpus"]["sha256"]]
    assert data["target_weights"] == meta["manifest"]["target_weights"], meta_file
    used.add(name)
    checked += 1
  assert checked == len([f for f in os.listdir(shipped) if f.endswith(".safetensors")])
  evals = [t for ts in sources.eval_texts().values() for t in ts]
  norm_eval = [" ".join(decontam.normalize(t)) for t in evals]
  norm_eval = [e for e in norm_eval if len(e) >= 20]
  spans = {e[i : i + 60] for e in norm_eval if len(e) >= 60 for i in range(0, len(e) - 59, 30)}
  for name, meta in corpora.values():
    if name not in used:
      continue
    order = list(zip(meta["sources"], meta["source_index"]))
    plist = corpus.prompts_from_order(
      order, smollm2.tokenizer, meta["manifest"]["recipe"]["min_ascii"]
    )
    norm_train = [" ".join(decontam.normalize(p.text)) for p in plist]
    # Containment by one search per text through the other side joined by "\n" (never in a
    # normalised text, so no match spans two texts). A training prompt inside an evaluation
    # prompt counts from 32 characters: the corpus has generic short questions ("how long will it
    # take?" is part of a GSM8K test problem).
    all_train, all_eval = "\n".join(norm_train), "\n".join(norm_eval)
    assert not any("\n" in t for t in norm_train + norm_eval)
    assert not [e for e in norm_eval if e in all_train]
    assert not [t for t in norm_train if len(t) >= 32 and t in all_eval]
    shared_span = []
    for p, t in zip(plist, norm_train):
      if any(t[i : i + 60] in spans for i in range(0, max(len(t) - 59, 0))):
        shared_span.append(corpus.prompt_sha256(p.text))
    assert shared_span == KNOWN_SHARED_SPAN.get(name, []), (name, shared_span)


# Known defect of smollm2-sd-v1, found by this check after its drafters were trained: one training
# prompt (ShareGPT, "Your instructions are as follows: You will be given a subject that you need to
# teach me...") shares the 60-character span "could include providing step-by-step instructions
# for solving" with Spec-Bench's "act as a math teacher" prompt. The n-gram decontaminator let it
# through; v2 drops it (the decontaminator's shared-span rule). Any other overlap fails here.
KNOWN_SHARED_SPAN = {
  "smollm2-sd-v1": ["b2382244136ea91998b379fc2ab179a5ef0ca9d46fcbe63fe5340a3c344ecf64"]
}


def test_simulated_tau_is_the_expected_chain_length():
  assert simulated_tau({"top1_step1": 0.5, "top1_step2": 0.5}, k=3) == pytest.approx(1.875)
  assert simulated_tau({"top1": 1.0}, k=4) == 5.0  # one rate serves every position
  # Medusa's heads count from 0; unrelated metrics are ignored.
  ev = {"top1_head1": 0.5, "top1_head0": 1.0, "eval_positions": 9}
  assert simulated_tau(ev, k=2) == pytest.approx(2.5)
  with pytest.raises(ValueError, match="per-position"):
    simulated_tau({"loss": 1.0})
  # Chained agreement is the chain's acceptance itself: tau = 1 + sum of prefixes; depths past
  # the measured ones keep the last ratio (0.3 / 0.6 = 0.5), whatever the single-depth rates say.
  ev = {"top1_step1": 0.6, "top1_step2": 0.6, "prefix_step1": 0.6, "prefix_step2": 0.3}
  assert simulated_tau(ev, k=2) == pytest.approx(1.9)
  assert simulated_tau(ev, k=4) == pytest.approx(1.9 + 0.15 + 0.075)


def test_depth_agreement_counts_chains_that_stay_right():
  d2t = jnp.arange(4)
  one_hot = lambda ids: jax.nn.one_hot(jnp.asarray([ids]), 4)  # noqa: E731
  labels = jnp.asarray([[1, 2, 3]])
  mask = jnp.asarray([[True, True, False]])
  depths = [  # depth 1 right at anchors 0 and 2, depth 2 right at anchors 1 and 2
    (one_hot([1, 0, 3]), labels, mask),
    (one_hot([0, 2, 3]), labels, jnp.asarray([[True, True, True]])),
  ]
  out = {k: (float(h), float(c)) for k, (h, c) in depth_agreement(depths, d2t).items()}
  assert out == {
    "top1_step1": (1.0, 2.0),
    "prefix_step1": (1.0, 2.0),
    "top1_step2": (2.0, 3.0),
    "prefix_step2": (1.0, 3.0),  # anchor 1 was wrong at depth 1; anchor 2 right at both
  }
  medusa = depth_agreement(depths, d2t, key="top1_head{}", first=0)
  assert {"top1_head0", "top1_head1", "prefix_step1", "prefix_step2"} == set(medusa)


def test_rank_agreement_counts_where_the_target_token_ranks():
  d2t = jnp.asarray([5, 6, 7, 8])  # draft token i is target token 5 + i
  logits = jnp.asarray([[[4.0, 3.0, 2.0, 1.0], [1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0]]])
  labels = jnp.asarray([[6, 7, 5]])  # ranks 1, 1 and 0
  depths = [(logits, labels, jnp.asarray([[True, True, True]]))] * 2
  depths[1] = (logits, labels, jnp.asarray([[True, False, True]]))
  out = {k: (float(h), float(c)) for k, (h, c) in rank_agreement(depths, d2t, 3).items()}
  assert out == {
    "rank1_head0": (2.0, 3.0),
    "rank2_head0": (0.0, 3.0),
    "rank1_head1": (1.0, 2.0),  # anchor 1 is not scored at depth 2
    "rank2_head1": (0.0, 2.0),
  }
  assert "rank1_head0" not in loop.shown({"top1_head0": 0.3, "rank1_head0": 0.1})
  assert "first_rank1_head0" not in loop.shown({"first_rank1_head0": 0.1})


@pytest.mark.parametrize("kind", ["medusa", "peagle"])  # peagle: the vocabulary is its base's
def test_rescore_scores_the_shipped_drafter_as_its_training_did(ship, kind):
  config, _, heldout, meta = ship(kind)
  path, shipped, new = rescore.rescore(copy.deepcopy(config))
  assert shipped == meta and path.endswith(f"tiny-{kind}.json")
  assert not rescore.changed_metrics(heldout, new, tolerance=0.05)  # float16 against float32
  assert set(new) == set(heldout) - {"step"}  # the same evaluation: nothing added, nothing lost
  assert rescore.changed_metrics({"top1_head0": 0.5}, {"top1_head0": 0.6})  # a real change shows


def test_rebase_pins_the_base_shipped_now(tiny, ship, tmp_path):
  """A P-EAGLE whose base was continued does not load; rescored over the new base, `rebased`
  pins it (the old pin and scores kept) and the drafter loads again."""
  root, params, cfg = tiny[:3]
  config, _, heldout, meta = ship("peagle")
  shipped_dir = tmp_path / "shipped"
  shutil.copytree(root / "shipped", shipped_dir)
  stale = {**meta, "base": {**meta["base"], "sha256": "0" * 64}}  # as if the base was continued
  (shipped_dir / "tiny-peagle.json").write_text(json.dumps(stale))
  with pytest.raises(ShippedDrafterError, match="retrain"):
    load_shipped("tiny-peagle", params, cfg, str(shipped_dir))
  config = copy.deepcopy(config)
  config.ship.dir = str(shipped_dir)
  _, old, new = rescore.rescore(config)
  assert not rescore.changed_metrics(heldout, new, tolerance=0.05)
  out = rescore.rebased(old, new, meta["base"]["sha256"], "2026-12-05")
  assert (
    out["rebased"]["from"]["base_sha256"] == "0" * 64 and out["heldout"]["step"] == heldout["step"]
  )
  (shipped_dir / "tiny-peagle.json").write_text(json.dumps(out))
  load_shipped("tiny-peagle", params, cfg, str(shipped_dir))
  with pytest.raises(ValueError, match="no base"):
    rescore.rebased({"name": "x", "heldout": {}}, new, "0" * 64, "2026-12-05")


def test_training_keeps_the_checkpoint_with_the_best_simulated_tau(tiny, tmp_path):
  root = tiny[0]
  config = tiny_config("train_medusa", root)
  # A learning rate this high wrecks the heads after their first gains.
  config.train.update({"steps": 24, "eval_every": 4, "lr": 0.3, "warmup": 1, "clip": 1e9})
  workdir = tmp_path / "w"
  _, trainable, frozen, heldout, _ = pipeline.run(config, str(workdir), lambda _: None)
  evals = {
    r["step"]: r["eval"] for r in read_metrics(str(workdir / "metrics.jsonl")) if "eval" in r
  }
  best = max(evals, key=lambda s: evals[s]["simulated_tau"])
  assert heldout["step"] == best and heldout["simulated_tau"] == evals[best]["simulated_tau"]
  assert best != 24, "the control: training should have got worse after some evaluation"
  # The params returned are that step's: evaluating them again gives its metrics.
  s = pipeline.settings_from_config(config)
  objective = pipeline.make_objective(s.objective, tiny[2])
  w = Windows(tiny[3], s.train.seq_len, heldout=True)
  again = evaluate(objective, trainable, frozen, w, s.train.eval_windows, 8)
  assert again["top1_head0"] == pytest.approx(evals[best]["top1_head0"])


def test_a_run_that_never_beats_its_start_is_not_shipped(tiny, tmp_path):
  """With train.score_start the starting state is scored first (step 0) and competes with every
  later evaluation; at a zero learning rate no step can beat it, so nothing ships (the other tests
  here ship: the control)."""
  config = tiny_config("train_medusa", tiny[0])
  config.train.update({"steps": 4, "eval_every": 2, "lr": 0.0, "score_start": True})
  config.ship.update({"name": "tiny-medusa-flat", "dir": str(tmp_path / "shipped")})
  lines = []
  _, _, _, heldout, meta = pipeline.run(config, str(tmp_path / "w"), lines.append)
  evals = [r["step"] for r in read_metrics(str(tmp_path / "w" / "metrics.jsonl")) if "eval" in r]
  assert evals[:3] == [0, 2, 4] and heldout["step"] == 0 and meta is None
  assert any("tiny-medusa-flat is not shipped" in line for line in lines), lines
  assert not (tmp_path / "shipped" / "tiny-medusa-flat.json").exists()


def test_a_time_budget_stops_training_early_and_still_ships(tiny, tmp_path):
  root = tiny[0]
  config = tiny_config("train_medusa", root)
  config.train.update({"steps": 24, "eval_every": 4, "time_budget_s": 1e-6})
  config.ship.update({"name": "tiny-medusa-budget", "dir": str(tmp_path / "shipped")})
  workdir = tmp_path / "w"
  lines = []
  _, _, _, heldout, meta = pipeline.run(config, str(workdir), lines.append)
  assert any("time budget" in line and "step 1/24" in line for line in lines), lines
  steps = [r["step"] for r in read_metrics(str(workdir / "metrics.jsonl")) if "step_s" in r]
  assert steps == [1]  # the first step spends the budget; nothing after it runs
  assert meta is not None and meta["training"]["steps_done"] == 1
  assert meta["training"]["device"].startswith(jax.devices()[0].platform)
  assert heldout["step"] in (0, 1)
  # The control: without a budget the same run goes on to its 24 steps.
  config.train.time_budget_s = 0.0
  config.ship.name = ""
  pipeline.run(config, str(tmp_path / "w2"), lambda _: None)
  steps = [r["step"] for r in read_metrics(str(tmp_path / "w2" / "metrics.jsonl")) if "step_s" in r]
  assert steps[-1] == 24


def test_first_response_tokens_scores_only_each_responses_opening(tiny):
  store = tiny[3]
  w = Windows(store, 32, heldout=True)
  for n in (1, 5):
    early = w.first_response_tokens(n)
    # Position t is flagged when x_{t+1} is one of its response's first n tokens.
    index = w.pos + 1 - store.prompt_lens[w.doc]
    np.testing.assert_array_equal(early.resp, w.resp & (index < n))
    per_doc = np.bincount(w.doc[early.resp], minlength=len(store.doc_lens))
    held = np.flatnonzero(store.heldout)
    lens = store.doc_lens[held] - store.prompt_lens[held] + 1
    np.testing.assert_array_equal(per_doc[held], np.minimum(n, lens))
  assert w.resp.sum() > w.first_response_tokens(5).resp.sum()  # responses are longer than 5
  # Evaluating with first = n adds first_* metrics: the same agreement over those positions.
  config = tiny_config("train_medusa", tiny[0])
  s = pipeline.settings_from_config(config)
  objective = pipeline.make_objective(s.objective, tiny[2])
  trainable, frozen = objective.init(jax.random.PRNGKey(0), tiny[1], tiny[2], jnp.arange(48))
  ev = evaluate(objective, trainable, frozen, w, 100, 8, first=5)
  alone = evaluate(objective, trainable, frozen, w.first_response_tokens(5), 100, 8)
  assert {k: ev["first_" + k] for k in alone} == alone
  assert ev["first_eval_positions"] < ev["eval_positions"]


@pytest.mark.parametrize("name", ["train_medusa", "train_eagle3"])
def test_weight_first_leans_the_loss_towards_each_responses_opening(tiny, name):
  """weight_first(n, w): weight w on the positions first_response_tokens(n) scores, 1 elsewhere;
  w = 1 leaves the loss as it was, and a huge w turns it into the loss over the openings alone."""
  store = tiny[3]
  w = Windows(store, 32, heldout=False, with_layers=name == "train_eagle3")
  heavy = w.weight_first(5, 3.0)
  opening = w.first_response_tokens(5).resp
  np.testing.assert_array_equal(heavy.weight, np.where(opening, 3.0, 1.0))
  config = tiny_config(name, tiny[0])
  s = pipeline.settings_from_config(config)
  objective = pipeline.make_objective(s.objective, tiny[2])
  trainable, frozen = objective.init(jax.random.PRNGKey(0), tiny[1], tiny[2], jnp.arange(48))
  ids = np.arange(min(w.n_windows, 6))
  loss = lambda ws: float(objective.loss(trainable, frozen, ws.batch(ids))[0])  # noqa: E731
  plain, alone = loss(w), loss(w.first_response_tokens(5))
  assert loss(w.weight_first(5, 1.0)) == pytest.approx(plain, rel=1e-6)
  assert loss(w.weight_first(5, 1e7)) == pytest.approx(alone, rel=1e-3)
  assert abs(plain - alone) > 1e-3 * abs(alone)  # the openings' loss differs from the rest's
  # Settings that weight the openings must say how long an opening is.
  config.train.first_weight, config.train.eval_first = 2.0, 0
  with pytest.raises(ValueError, match="eval_first"):
    pipeline.settings_from_config(config)


def _tiny_corpus(params, cfg, path: str, fingerprint: str) -> None:
  """A packed corpus of 12 documents the tiny target wrote (2 held out)."""
  rng = np.random.default_rng(5)
  plist = [
    prompts.TrainPrompt("synthetic", i, str(i), tuple(int(t) for t in rng.integers(4, 64, 6)))
    for i in range(12)
  ]
  engine = corpus.EngineSettings(
    batch=4, refill=2, chunk_steps=4, max_new_tokens=20, prompt_bucket=8
  )
  out = path + ".dir"
  manifest = {"target": "tiny", "target_weights": fingerprint}
  corpus.build_corpus(params, cfg, plist, (), engine, out, manifest, 10_000)
  corpus.pack_corpus(out, path, plist, n_heldout=2)


def test_training_on_a_packed_corpus(tiny, tmp_path):
  root, params, cfg = tiny[:3]
  path = str(tmp_path / "tiny-corpus.npz")
  _tiny_corpus(params, cfg, path, weights_fingerprint(params))
  config = tiny_config("train_eagle3", root, steps=2)
  config.data.corpus = path
  config.data.cache_dir = str(tmp_path / "features")
  config.train.update({"steps": 2, "eval_windows": 2, "seq_len": 8, "batch_size": 2})
  _, _, _, heldout, _ = pipeline.run(config, str(tmp_path / "w"), lambda _: None)
  docs = corpus.load_documents(path)
  store = FeatureStore.open(str(tmp_path / "features" / "packed"))
  assert store.tokens.tolist() == [t for d in docs for t in d.tokens]
  assert store.heldout.tolist() == [d.heldout for d in docs] and store.heldout.sum() == 2
  assert store.layers.shape[0] == 2 and heldout["top1_step1"] >= 0
  with open(tmp_path / "features" / "manifest.json") as f:
    recorded = json.load(f)["corpus"]
  assert recorded["sha256"] == corpus.read_meta(path)["sha256"]
  # The run read through exactly the document prefixes its steps and its evaluation use.
  s = pipeline.settings_from_config(config)
  need = positions_read(s.train, *feature_cache._windows(store, s, True))
  assert store.read_lens.tolist() == need.tolist() and need.sum() < store.n_positions
  # A run on later steps reads what it adds, and only that; here one document per read-through
  # batch (data.read_batch_tokens, the tokens a batch holds: 4,096 by default).
  config.train.data_start = 2
  config.data.read_batch_tokens = 1
  lines = []
  pipeline.run(config, str(tmp_path / "w_later"), lines.append)
  more = FeatureStore.open(str(tmp_path / "features" / "packed")).read_lens
  later = positions_read(
    pipeline.settings_from_config(config).train, *feature_cache._windows(store, s, True)
  )
  assert (more == np.maximum(need, later)).all() and more.sum() > need.sum()
  n_more = int((later > need).sum())
  assert any(f"target {n_more} corpus documents" in line for line in lines)
  assert any(line.startswith(f"read-through: chunk {n_more}/{n_more} ") for line in lines)
  assert n_more > 1
  with open(tmp_path / "features" / "manifest.json") as f:
    runs = json.load(f)["read_throughs"]  # the corpus build (tokens only), both runs' reads
  assert [r["read_positions"] for r in runs] == [0, need.sum(), more.sum()]
  # A data-scaling run reads only the first N training positions.
  w = Windows(store, 8, heldout=False, max_positions=40)
  assert w.n_positions == 40 and w.n_windows == 5
  with pytest.raises(ValueError, match="the cache has"):
    Windows(store, 8, heldout=False, max_positions=10**6)
  # A corpus another target wrote is refused, naming both fingerprints.
  other = str(tmp_path / "other.npz")
  _tiny_corpus(params, cfg, other, "0" * 64)
  config.data.corpus = other
  config.data.cache_dir = str(tmp_path / "features2")
  with pytest.raises(CacheError, match="0000000000000000.*not by"):
    pipeline.run(config, str(tmp_path / "w2"), lambda _: None)


def test_curve_tables_read_a_run(tmp_path):
  from train import curve

  w = tmp_path / "run"
  (w / "best").mkdir(parents=True)
  evals = [{"top1_step1": 0.2, "top1_step2": 0.1}, {"top1_step1": 0.3, "top1_step2": 0.2}]
  with open(w / "metrics.jsonl", "w") as f:
    for step, ev in zip((10, 20), evals):
      f.write(json.dumps({"step": step, "loss": 1.0, "tokens_per_s": 1.0}) + "\n")
      f.write(json.dumps({"step": step, "eval": {**ev, "simulated_tau": simulated_tau(ev)}}) + "\n")
  best = {"step": 20, "simulated_tau": simulated_tau(evals[1]), "eval": evals[1]}
  (w / "best" / "best.json").write_text(json.dumps(best))
  (w / "run.json").write_text(json.dumps({"train_positions": 5000}))
  table = curve.curve_table(str(w))
  assert "| 20 (kept) | 0.300 | 0.200 | 1.374 |" in table and "| 10 | 0.200 | 0.100 |" in table
  assert "| run | 5000 | 20 | 0.300 / 0.200 | 1.374 |" in curve.scaling_table([str(w)])


def test_a_second_run_in_the_same_workdir_is_refused(tiny, tmp_path):
  config = tiny_config("train_medusa", tiny[0])
  workdir = str(tmp_path / "w")
  with sole_writer(workdir, "a training run"):  # as another process's run would hold it
    with pytest.raises(CacheError, match="another process is writing a training run"):
      pipeline.run(config, workdir, lambda _: None, stop_after=1)
  assert not os.path.exists(os.path.join(workdir, "checkpoints"))
