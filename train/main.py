"""Trains a drafter for a frozen target and optionally ships it.

  python train/main.py --config=configs/train_medusa.py --workdir=/tmp/specjax_train_medusa

The first run on a data recipe builds the self-distilled feature cache (the target answers the
training prompts greedily; resumable, shared by every drafter kind); training then reads only the
cache. Rerunning the same command after a crash or kill resumes from the last checkpoint with the
same data order. `--features_only` stops after the cache is built; `--stop_after=N` after N steps.
Override any field with --config.FIELD=VALUE (e.g. --config.train.steps=200). The logic lives in
`train.pipeline` (the feature cache in `train.feature_cache`); this file only wires flags to it.
"""

import errno
import os
import sys
import time

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "Training config file, e.g. configs/train_medusa.py:tiny.", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Checkpoints, metrics.jsonl and the vocabulary.")
_FEATURES_ONLY = flags.DEFINE_bool("features_only", False, "Only build the feature cache.")
_STOP_AFTER = flags.DEFINE_integer("stop_after", None, "Stop after this many steps (resumable).")
flags.mark_flags_as_required(["config", "workdir"])


def log(line: str) -> None:
  print(f"{time.strftime('%H:%M:%S')} {line}", flush=True)


_STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM)


def _storage_error(e: BaseException) -> bool:
  """A write that failed for lack of space or permission (orbax reports ENOSPC as ValueError)."""
  if isinstance(e, OSError):
    return e.errno in _STORAGE_ERRNOS
  return isinstance(e, ValueError) and "RESOURCE_EXHAUSTED" in str(e)


def main(argv):
  from specjax.integrity import CacheError
  from specjax.loading.keymap import CheckpointError

  try:
    _main(argv)
  except (CacheError, CheckpointError) as e:
    sys.exit(f"FATAL: {e}")
  except (OSError, ValueError) as e:
    if not _storage_error(e):
      raise
    full = getattr(e, "errno", None) in _STORAGE_ERRNOS[:3] or "RESOURCE_EXHAUSTED" in str(e)
    fix = "free space" if full else "make it writable"
    sys.exit(
      f"FATAL: {type(e).__name__}: {e}\nNothing finished is lost (shards, packed caches and "
      "checkpoints are written under temporary names and renamed when complete): "
      f"{fix} or use another --workdir / data.cache_dir, then rerun the same command to resume."
    )


def _main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
  from specjax.loading.registry import load_model
  from train import feature_cache, pipeline

  config = _CONFIG.value
  if not config.target:
    sys.exit("FATAL: set --config.target (a registry name or a Hugging Face directory)")
  if _FEATURES_ONLY.value:
    s = pipeline.settings_from_config(config)
    params, cfg, tok = load_model(s.target)
    store, _ = feature_cache.ensure_features(s, params, cfg, tok, log)
    log(f"feature cache ready: {store.n_positions} positions in {len(store.doc_lens)} documents")
    return
  os.makedirs(_WORKDIR.value, exist_ok=True)
  _, _, _, heldout, meta = pipeline.run(config, _WORKDIR.value, log, _STOP_AFTER.value)
  if meta is not None:
    log(f"metadata: {os.path.join(config.ship.dir, config.ship.name + '.json')}")


if __name__ == "__main__":
  app.run(main)
