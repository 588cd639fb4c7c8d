"""An EAGLE-3 style head for SmolLM2-135M-Instruct: fuses target layers 2, 15 and 27, scores its
own reduced-vocabulary head, and trains with a 2-step training-time test (unrolled on its own
outputs). It needs a feature cache that stores those layers (a separate, larger cache).

Commands (from the repository root):

  python train/main.py --config=configs/train_eagle3.py --workdir=/tmp/specjax_train_eagle3
  python train/main.py --config=configs/train_eagle3.py:tiny --workdir=/tmp/eagle3_tiny \
    --config.target=/path/to/tiny_hf_dir
"""

import ml_collections

from train.settings import SMOLLM2_FEATURES, apply_variant, base_config, feature_cache


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  config = base_config()
  config.data.cache_dir = feature_cache(SMOLLM2_FEATURES + "-layers")
  config.data.features.hidden_layers = (2, 15, 27)
  # The self-distilled documents of the other drafters' cache (same held-out split), read through
  # the target once each to record the fused layers (no decoding).
  config.data.read_through_from = feature_cache(SMOLLM2_FEATURES)
  config.objective.kind = "eagle"
  config.objective.steps = 2  # 2 on this CPU budget (each unrolled step costs a full pass)
  config.objective.fuse_layers = (2, 15, 27)
  config.objective.w_reg = 0.0
  config.objective.w_cls = 1.0
  config.train.steps = 150  # ~35 min on a 2-core CPU shared at load ~15
  config.train.lr = 2e-3
  config.train.batch_size = 4
  config.train.warmup = 10
  config.train.save_every = 10
  config.train.eval_every = 50
  config.ship.name = "eagle3-smollm2-135m"
  config = apply_variant(config, arg)
  if arg == "tiny":
    config.data.read_through_from = ""
    config.objective.fuse_layers = (0, 1)
  return config
