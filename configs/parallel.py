"""Parallel (block) drafters for SmolLM2-135M-Instruct vs AR on Spec-Bench, greedy: one drafter
pass proposes a block of K = 8 tokens (`specjax.drafters.parallel`).

`peagle` (default): the shipped `peagle-smollm2-135m`, a P-EAGLE-style parallel EAGLE-3 head, as a
chain of 8. `pard`: the shipped `pard-smollm2-135m`, a PARD-style parallel 2-layer draft LM, as a
chain of 8. `peagle_tree` / `pard_tree`: the same block as a static Medusa-style tree (16 nodes,
depth <= 4, each depth's top-ranked tokens, fitted to the drafter's held-out top-1 accuracy per
depth: `tree_heads.fitted_tree`), verified in one pass by `specjax.tree_speculative`. On a
2-core CPU a 4-node tree is faster (`tree.n_nodes=4`, `tree.depth=2`: top-2 at depth 1, top-1
after the first; benchmarks/RESULTS.md, twenty-eighth session); with 5 nodes (a second depth-2
token) its tau reaches the EAGLE-3 K = 4 chain's at 64 tokens and it stays faster than that chain
(forty-fourth session).

Commands (from the repository root):

  python experiments/run.py --config=configs/parallel.py:small --workdir=/tmp/specjax_peagle_small
  python experiments/run.py --config=configs/parallel.py:pard,small --workdir=/tmp/specjax_pard
  python experiments/run.py --config=configs/parallel.py:peagle_tree,small \
    --workdir=/tmp/specjax_peagle_tree
"""

import ml_collections

from specjax.experiment.settings import apply_variant, base_config, split_arg

SHIPPED = {"peagle": "peagle-smollm2-135m", "pard": "pard-smollm2-135m"}


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  mode, variant = split_arg(arg, ("peagle", "pard", "peagle_tree", "pard_tree"))
  config = base_config()
  config.drafter.shipped = SHIPPED[mode.removesuffix("_tree")]
  config.drafter.k = 8
  if mode.endswith("_tree"):
    config.method = "tree"
    config.tree.kind = "heads"
    config.tree.n_nodes = 16
    config.tree.depth = 4
  else:
    config.method = "shipped"
  return apply_variant(config, variant)
