"""Token-tree speculative decoding against AR on Spec-Bench, greedy, one verify pass per tree.

`static` (default): a fixed sparse tree of 16 nodes (depth 4; the best paths under a per-rank
prior) drafted by a draft model. `dynamic`: EAGLE-2's dynamic tree (expand the top-4 children of
the 4 most probable frontier nodes per level, depth 4, keep the 16 best nodes) drafted by the
same draft model. `medusa`: the static tree over the shipped Medusa heads (as configs/medusa.py:tree).
The draft model is, by default, the target's first 4 layers with its final norm and LM head
(untrained early exit; the shipped draft LM has a reduced vocabulary, which the tree drafters do not
take); set `drafter.model` / `drafter.n_layers` for another.

Commands (from the repository root):

  python experiments/run.py --config=configs/trees.py:small --workdir=/tmp/specjax_static_tree
  python experiments/run.py --config=configs/trees.py:dynamic,small --workdir=/tmp/specjax_dyn_tree
  python experiments/run.py --config=configs/trees.py:medusa,small --workdir=/tmp/specjax_med_tree
  python experiments/run.py --config=configs/trees.py:dynamic --workdir=/tmp/specjax_dyn_full \
    --config.tree.n_nodes=24 --config.tree.top_k=6
"""

import ml_collections

from specjax.experiment.settings import apply_variant, base_config, split_arg


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  kind, variant = split_arg(arg, ("static", "dynamic", "medusa"))
  config = base_config()
  config.method = "tree"
  config.tree.n_nodes = 16
  config.tree.depth = 4
  config.tree.top_k = 4
  if kind == "medusa":
    config.tree.kind = "heads"
    config.drafter.shipped = "medusa4-smollm2-135m"
  else:
    config.tree.kind = kind
    config.drafter.n_layers = 4
  return apply_variant(config, variant)
