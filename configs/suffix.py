"""Suffix decoding (SuffixDecoding, NeurIPS 2025) against AR on Spec-Bench, greedy, batch 1.

Model-free: each step matches the longest suffix (up to 16 tokens) of the context in the prompt and
generated tokens and in a global cache of the AR outputs of the prompts run before it in the same
run (8192 tokens), and drafts the continuations of its occurrences, scored by frequency (nodes seen
in at least 10% of them), at most 1 drafted token per matched token (`specjax.drafters.suffix`).

`tree` (default): a tree of up to 16 nodes (depth 6), verified in one pass (tree loop). `chain`:
the single most frequent path of up to 4 tokens (chain loop, as prompt lookup).

Commands (from the repository root):

  python experiments/run.py --config=configs/suffix.py:small --workdir=/tmp/specjax_suffix_small
  python experiments/run.py --config=configs/suffix.py:chain,small --workdir=/tmp/specjax_sfx_chain
  python experiments/run.py --config=configs/suffix.py --workdir=/tmp/specjax_suffix
  # Overrides: a bigger, bolder tree; the row alone (no global cache).
  python experiments/run.py --config=configs/suffix.py:small --workdir=/tmp/specjax_suffix_big \
    --config.tree.n_nodes=24 --config.suffix.spec_factor=2 --config.suffix.global_size=0
"""

import ml_collections

from specjax.experiment.settings import apply_variant, base_config, split_arg


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  form, variant = split_arg(arg, ("tree", "chain"))
  config = base_config()
  config.method = "suffix"
  config.suffix.form = form
  config.suffix.max_match = 16
  config.suffix.spec_factor = 1.0
  config.suffix.min_prob = 0.1
  config.suffix.max_occurrences = 16
  config.suffix.global_size = 8192
  config.drafter.k = 4  # chain
  config.tree.n_nodes = 16  # tree
  config.tree.depth = 6
  return apply_variant(config, variant)
