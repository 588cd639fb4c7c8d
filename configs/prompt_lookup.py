"""Prompt lookup decoding (n-gram copying) against the AR baseline on Spec-Bench, greedy, batch 1.

Commands (from the repository root):

  # Small: 2 prompts per category, 64 new tokens (a few minutes on 2 CPU cores).
  python experiments/run.py --config=configs/prompt_lookup.py:small --workdir=/tmp/specjax_pl_small
  # All 480 prompts, 128 new tokens.
  python experiments/run.py --config=configs/prompt_lookup.py --workdir=/tmp/specjax_pl
  # Overrides: a longer draft, other categories, another model.
  python experiments/run.py --config=configs/prompt_lookup.py:small --workdir=/tmp/specjax_pl_k8 \
    --config.drafter.k=8 --config.data.categories=summarization,rag
"""

import ml_collections

from specjax.experiment.settings import apply_variant, base_config


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  config = base_config()
  config.method = "prompt_lookup"
  config.drafter.k = 4
  config.drafter.max_ngram = 3
  config.drafter.min_ngram = 1
  return apply_variant(config, arg)
