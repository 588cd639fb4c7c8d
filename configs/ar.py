"""The AR baseline alone: jitted autoregressive decoding on Spec-Bench, greedy, batch 1.

Commands (from the repository root):

  python experiments/run.py --config=configs/ar.py:small --workdir=/tmp/specjax_ar_small
  python experiments/run.py --config=configs/ar.py --workdir=/tmp/specjax_ar
  # Another target: a Hugging Face directory or a .gguf file.
  python experiments/run.py --config=configs/ar.py:small --workdir=/tmp/specjax_ar_gguf \
    --config.model=/path/to/model.gguf
"""

import ml_collections

from specjax.experiment.settings import apply_variant, base_config


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  config = base_config()
  config.method = "ar"
  return apply_variant(config, arg)
