"""An EAGLE-1 head for SmolLM2-135M-Instruct: feature regression + distillation through the
target's LM head (restricted to the draft vocabulary), on the target's own responses.

Commands (from the repository root):

  python train/main.py --config=configs/train_eagle.py --workdir=/tmp/specjax_train_eagle
  python train/main.py --config=configs/train_eagle.py:tiny --workdir=/tmp/eagle_tiny \
    --config.target=/path/to/tiny_hf_dir
"""

import ml_collections

from train.settings import apply_variant, base_config, use_corpus


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  config = use_corpus(base_config())
  config.objective.kind = "eagle"
  config.objective.steps = 1
  config.objective.w_reg = 1.0
  config.objective.w_cls = 1.0  # the paper uses 0.1; token agreement is what drafting needs
  config.objective.init_layer = -1
  config.train.steps = 300  # ~0.14 epoch of corpus v2; 1.0-1.3 s/step on 2 cores
  config.train.lr = 1e-3
  config.train.weight_decay = 0.05
  config.train.batch_size = 4
  config.train.warmup = 20
  config.train.save_every = 50
  config.train.eval_every = 50
  config.train.eval_windows = 32
  config.ship.name = "eagle1-smollm2-135m"
  return apply_variant(config, arg)
