"""An EAGLE-1 head for SmolLM2-135M-Instruct: feature regression + distillation through the
target's LM head (restricted to the draft vocabulary), on the target's own responses.

Commands (from the repository root):

  python train/main.py --config=configs/train_eagle.py --workdir=/tmp/specjax_train_eagle
  python train/main.py --config=configs/train_eagle.py:tiny --workdir=/tmp/eagle_tiny \
    --config.target=/path/to/tiny_hf_dir
"""

import ml_collections

from train.settings import apply_variant, base_config


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  config = base_config()
  config.objective.kind = "eagle"
  config.objective.steps = 1
  config.objective.w_reg = 1.0
  config.objective.w_cls = 0.1
  config.objective.init_layer = -1
  config.train.steps = 150  # ~20 min on a shared 2-core CPU
  config.train.lr = 1e-3
  config.train.batch_size = 4
  config.train.warmup = 10
  config.train.save_every = 10
  config.ship.name = "eagle1-smollm2-135m"
  return apply_variant(config, arg)
