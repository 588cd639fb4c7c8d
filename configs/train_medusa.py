"""Medusa-1 heads for SmolLM2-135M-Instruct, distilled on the target's own responses.

Commands (from the repository root):

  python train/main.py --config=configs/train_medusa.py --workdir=/tmp/specjax_train_medusa
  python train/main.py --config=configs/train_medusa.py:tiny --workdir=/tmp/medusa_tiny \
    --config.target=/path/to/tiny_hf_dir

Killing the run at any moment and rerunning the same command resumes from the last checkpoint.
"""

import ml_collections

from train.settings import apply_variant, base_config, use_corpus


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  config = use_corpus(base_config())
  config.objective.kind = "medusa"
  config.objective.n_heads = 4
  config.train.steps = 450  # ~0.8 epoch of the corpus; 1.6 s/step on 2 cores
  config.train.lr = 2e-3
  config.train.batch_size = 4
  config.train.warmup = 20
  config.train.save_every = 50
  config.train.eval_every = 50
  config.train.eval_windows = 32
  config.ship.name = "medusa4-smollm2-135m"
  return apply_variant(config, arg)
