"""Rescores a shipped drafter on its training config's held-out windows with today's evaluation.

  python train/rescore.py --config=configs/train_medusa.py

The drafter is the config's `ship.name`, loaded as its objective's warm start (`init_from`), so
nothing trains. The held-out windows are the ones its training scored (`train.eval_windows`,
`train.eval_first`). Metrics the shipped metadata already records must come out the same (the
shipped weights are float16, so to within 0.01); the new ones (for example the chained agreement
`prefix_step{j}`, and the `simulated_tau` it gives) are written into the metadata's `heldout`,
with `heldout_rescored` saying when and how. The weights and their sha256 do not change.

A drafter that extends another (P-EAGLE over EAGLE-3) pins its base's sha256, so continuing the
base makes it unloadable until it is retrained. `--rebase` is the cheaper path when the
extension still does what it did: it is scored over the base shipped now, and if every recorded
rate reproduces (within the same tolerance) the metadata pins that base, its `heldout` becomes the
new scores and `rebased` keeps the old base's sha256 and scores.

  python train/rescore.py --config=configs/train_peagle.py --rebase
"""

from __future__ import annotations

import datetime
import os
import sys
import time

from absl import app, flags, logging
from ml_collections import config_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

TOLERANCE = 0.01  # float16 shipped weights against the float32 state that was scored


def log(line: str) -> None:
  print(f"{time.strftime('%H:%M:%S')} {line}", flush=True)


def changed_metrics(old: dict, new: dict, tolerance: float = TOLERANCE) -> list[str]:
  """The rate metrics (values in [0, 1]) both record that differ by more than `tolerance`."""
  return [
    f"{k}: shipped {old[k]:.4f}, now {new[k]:.4f}"
    for k in sorted(set(old) & set(new))
    if ("top1" in k or "prefix" in k) and abs(old[k] - new[k]) > tolerance
  ]


def rebased(meta: dict, new: dict, base_sha256: str, stamp: str) -> dict:
  """`meta` of a drafter that extends another, pinned to the base with `base_sha256` and scored
  `new` over it; the old pin and scores go under `rebased`."""
  if "base" not in meta:
    raise ValueError(f"{meta['name']} extends no other drafter: there is no base to pin")
  old = {"base_sha256": meta["base"]["sha256"], "heldout": meta.get("heldout")}
  return {
    **meta,
    "base": {**meta["base"], "sha256": base_sha256},
    "heldout": {**new, "step": (meta.get("heldout") or {}).get("step")},
    "rebased": {"date": stamp, "by": "train/rescore.py --rebase", "from": old},
  }


def heldout_setup(config):
  """The shipped drafter of a training config, loaded as its objective's warm start, with the
  held-out windows its training scored: (settings, its metadata, objective, trainable, frozen,
  held-out windows)."""
  import jax

  from specjax.drafters.shipped import read_metadata
  from train import feature_cache, pipeline

  name = config.ship.name
  config.objective.init_from = name
  config.train.steps = 0  # only the held-out windows' features are needed
  s = pipeline.settings_from_config(config)
  meta = read_metadata(name, s.ship_dir)
  params, tcfg, tok = pipeline.load_model(s.target)
  objective = pipeline.make_objective(s.objective, tcfg)
  if getattr(objective, "init_from", None) != name:
    raise ValueError(
      f"objective kind {s.objective['kind']!r} cannot start from a shipped drafter "
      f"(init_from), so {name!r} cannot be loaded for scoring; rescoring supports the kinds that "
      "continue one (eagle, medusa, peagle)"
    )
  store, manifest = feature_cache.ensure_features(s, params, tcfg, tok, log)
  if manifest.get("corpus") != meta["data"].get("corpus"):
    raise ValueError(
      f"{name} was trained on corpus {meta['data'].get('corpus')}, the config reads "
      f"{manifest.get('corpus')}: its held-out windows would not be the ones it was scored on"
    )
  fused = bool(getattr(objective, "fuse_layers", ()))
  _, _, _, eval_w = feature_cache.windows_read(s, store, manifest, fused, tcfg, params, log)
  source = s.objective.get("base") or name  # a drafter that extends another keeps its vocabulary
  d2t = pipeline.shipped_vocabulary(source, params, tcfg, s.ship_dir)
  key = jax.random.PRNGKey(s.train.seed)  # unused by a warm start; init takes one
  trainable, frozen = objective.init(key, params, tcfg, d2t, shipped_dir=s.ship_dir)
  return s, meta, objective, trainable, frozen, eval_w


def rescore(config) -> tuple[str, dict, dict]:
  """(the shipped drafter's metadata path, its metadata, its held-out metrics as
  `train.loop.evaluate` computes them now)."""
  from train.loop import evaluate

  s, meta, objective, trainable, frozen, eval_w = heldout_setup(config)
  name = config.ship.name
  log(f"{name}: scoring {s.train.eval_windows} held-out windows")
  t = s.train
  new = evaluate(objective, trainable, frozen, eval_w, t.eval_windows, t.batch_size, t.eval_first)
  return os.path.join(s.ship_dir, f"{name}.json"), meta, new


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  from specjax.integrity import write_json_atomic

  name = _CONFIG.value.ship.name
  path, meta, new = rescore(_CONFIG.value)
  old = meta.get("heldout") or {}
  bad = changed_metrics(old, new)
  if bad:
    sys.exit(f"FATAL: {name}'s recorded held-out metrics do not reproduce: {'; '.join(bad)}")
  added = sorted(set(new) - set(old))
  log(f"{name}: reproduced {len(set(old) & set(new))} recorded metrics; new: {added}")
  log(f"simulated tau: recorded {old.get('simulated_tau')}, now {new['simulated_tau']:.4f}")
  if not _WRITE.value:
    return
  stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
  if _REBASE.value:
    from specjax.drafters.shipped import read_metadata

    base = read_metadata(meta["base"]["name"], os.path.dirname(path))
    write_json_atomic(path, rebased(meta, new, base["sha256"], stamp))
    log(f"wrote {path}: pinned {base['name']} {base['sha256'][:12]}")
    return
  heldout = {**old, **new, "step": old.get("step")}
  rescored = {"date": stamp, "by": "train/rescore.py", "added": added}
  write_json_atomic(path, {**meta, "heldout": heldout, "heldout_rescored": rescored})
  log(f"wrote {path}")


if __name__ == "__main__":  # flags only when run as a script: tests import the functions
  _CONFIG = config_flags.DEFINE_config_file(
    "config", None, "The drafter's training config (configs/train_*.py).", lock_config=False
  )
  _WRITE = flags.DEFINE_bool("write", True, "Write the new metrics into the shipped metadata.")
  _REBASE = flags.DEFINE_bool(
    "rebase", False, "Pin the base drafter shipped now (a drafter that extends one; see above)."
  )
  flags.mark_flags_as_required(["config"])
  app.run(main)
