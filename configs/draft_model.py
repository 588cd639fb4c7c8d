"""A separate draft model against the AR baseline on Spec-Bench, greedy, batch 1.

No smaller model with SmolLM2's vocabulary can be downloaded here, so by default the draft is the
target's own first 8 of 30 layers followed by its final norm and LM head, untrained (an early-exit
draft that shares the vocabulary by construction). It exercises the machinery but is a poor
draft: on two Spec-Bench prompts it accepted 0% and 3% of its drafts (tau 1.00 and 1.12), which
made decoding ~2.7x slower than AR on CPU. Point `drafter.model` at any Llama-family
checkpoint with the target's tokenizer (registry name, Hugging Face directory or .gguf) and set
`drafter.n_layers=0` to use a real draft model.

`draft_lm2`: the shipped 2-layer draft LM (`draft-lm2-smollm2-135m`, initialised from the target's
first layers and trained on self-distilled data; it scores a reduced 8,192-token draft vocabulary
mapped to target ids).

Commands (from the repository root):

  python experiments/run.py --config=configs/draft_model.py:draft_lm2,small --workdir=/tmp/dlm2
  python experiments/run.py --config=configs/draft_model.py:small --workdir=/tmp/specjax_dm_small
  python experiments/run.py --config=configs/draft_model.py --workdir=/tmp/specjax_dm
  python experiments/run.py --config=configs/draft_model.py:small --workdir=/tmp/specjax_dm_own \
    --config.drafter.model=/path/to/draft_dir --config.drafter.n_layers=0
"""

import ml_collections

from specjax.experiment.settings import apply_variant, base_config, split_arg


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  draft, arg = split_arg(arg, ("truncated", "draft_lm2"))
  config = base_config()
  if draft == "draft_lm2":
    config.method = "shipped"
    config.drafter.shipped = "draft-lm2-smollm2-135m"
    config.drafter.k = 4
    return apply_variant(config, arg)
  config.method = "draft_model"
  config.drafter.k = 4
  config.drafter.model = ""  # "" = the target's checkpoint
  config.drafter.n_layers = 8
  return apply_variant(config, arg)
