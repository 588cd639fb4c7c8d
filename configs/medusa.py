"""Medusa-1 heads (the shipped `medusa4-smollm2-135m`, 4 heads) against AR on Spec-Bench, greedy.

`chain` (default): the heads' top-1 tokens as a chain of K = 4 drafts, verified by
`specjax.speculative`. `tree`: Medusa's own decoding, a static sparse tree of 16 nodes (depth
<= 4) built from the heads' top-ranked tokens and fitted, as Medusa does, to how often each
head's rank-r token was the target's on held-out text (their .json; `tree_heads.fitted_tree`),
verified in one pass by `specjax.tree_speculative`. `drafter.shipped=medusa4f-smollm2-135m`
selects the heads that also read a fusion of target layers 2, 15 and 27
(`configs/train_medusa.py:fused`). The heads were trained for SmolLM2-135M-Instruct. On a 2-core CPU
a 6-node tree (`tree.n_nodes=6`, `tree.depth=3`) costs less than the 16-node one and is faster,
though still below AR (benchmarks/RESULTS.md, twenty-eighth session).

Commands (from the repository root):

  python experiments/run.py --config=configs/medusa.py:small --workdir=/tmp/specjax_medusa_small
  python experiments/run.py --config=configs/medusa.py:tree,small --workdir=/tmp/specjax_medusa_tree
  python experiments/run.py --config=configs/medusa.py --workdir=/tmp/specjax_medusa
"""

import ml_collections

from specjax.experiment.settings import apply_variant, base_config, split_arg


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  mode, variant = split_arg(arg, ("chain", "tree"))
  config = base_config()
  config.drafter.shipped = "medusa4-smollm2-135m"
  config.drafter.k = 4
  if mode == "chain":
    config.method = "shipped"
  else:
    config.method = "tree"
    config.tree.kind = "heads"
    config.tree.n_nodes = 16
    config.tree.depth = 4
  return apply_variant(config, variant)
