"""A 2-layer draft LM for SmolLM2-135M-Instruct on the target's embedding and LM-head rows.

The draft starts as the target's first two layers followed by its final norm and the target's
LM head restricted to an 8,192-token draft vocabulary, and is distilled (KL to the target's
distribution) on the target's own responses.

Commands (from the repository root):

  python train/main.py --config=configs/train_draft_lm.py --workdir=/tmp/specjax_train_draft_lm
  python train/main.py --config=configs/train_draft_lm.py:tiny --workdir=/tmp/dlm_tiny \
    --config.target=/path/to/tiny_hf_dir
"""

import ml_collections

from train.settings import apply_variant, base_config, use_corpus


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  config = use_corpus(base_config())
  config.objective.kind = "draft_lm"
  config.objective.n_layers = 2
  config.objective.init_layers = (0, 1)
  # The shipped draft read the windows of steps 2180-2579 of the second corpus (the ones the
  # feature cache held for the EAGLE-3 stages; 820K positions), 1.7 s/step on 2 cores; its held-out
  # top-1 was still rising at the end (0.178 at step 100, 0.203 at 200, 0.213 at 400).
  config.train.steps = 400
  config.train.data_start = 2180
  config.train.lr = 3e-4
  config.train.batch_size = 4
  config.train.warmup = 10
  config.train.save_every = 50
  config.train.eval_every = 100
  config.train.eval_windows = 32
  config.ship.name = "draft-lm2-smollm2-135m"
  config = apply_variant(config, arg)
  if arg == "tiny":
    config.train.data_start = 0
    config.objective.n_layers = 1
    config.objective.init_layers = (0,)
  return config
