"""EAGLE heads for SmolLM2-135M-Instruct vs AR on Spec-Bench, greedy: chains (K=4) or EAGLE-2 trees.

`eagle1` (default): the shipped `eagle1-smollm2-135m` head (one decoder layer over the target's last
hidden state and the next token's embedding, reduced-vocabulary head). `eagle3`: the shipped
`eagle3-smollm2-135m` head (fuses several target layers); if that file is not in
`specjax/drafters/shipped/` the run stops with an error naming what is there. `eagle2`: EAGLE-2's
dynamic draft tree (top-4 children of the 4 best frontier nodes per level, depth 4, the 16 best
nodes kept) drafted by the shipped EAGLE-1 head (`specjax.drafters.tree_eagle`) and verified in one
pass; `eagle3_tree` the same over the EAGLE-3 head (as EAGLE-3 itself decodes). On a 2-core CPU a
16-node tree pass costs ~2.6 AR steps; the 6-node tree (top-2, depth 3: `--config.tree.top_k=2
--config.tree.depth=3 --config.tree.n_nodes=6`) was the fastest shape measured there
(`benchmarks/RESULTS.md`, twenty-seventh session); the 16 nodes allowed depth 6
(`--config.tree.depth=6`) accept the most per pass over the EAGLE-3 head (tau 2.85 against
depth 4's 2.77 at 256 tokens, thirty-third session) but run slower (0.93x AR against 0.98x).

Commands (from the repository root):

  python experiments/run.py --config=configs/eagle.py:small --workdir=/tmp/specjax_eagle1_small
  python experiments/run.py --config=configs/eagle.py:eagle3,small --workdir=/tmp/specjax_eagle3
  python experiments/run.py --config=configs/eagle.py:eagle2,small --workdir=/tmp/specjax_eagle2
  python experiments/run.py --config=configs/eagle.py:eagle1 --workdir=/tmp/specjax_eagle1
  python experiments/run.py --config=configs/eagle.py:eagle3_tree,small --workdir=/tmp/specjax_t6 \
    --config.tree.top_k=2 --config.tree.depth=3 --config.tree.n_nodes=6
"""

import ml_collections

from specjax.experiment.settings import apply_variant, base_config, split_arg

SHIPPED = {"eagle1": "eagle1-smollm2-135m", "eagle3": "eagle3-smollm2-135m"}


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  head, variant = split_arg(arg, ("eagle1", "eagle2", "eagle3", "eagle3_tree"))
  config = base_config()
  config.drafter.k = 4
  if head in ("eagle1", "eagle3"):
    config.method = "shipped"
    config.drafter.shipped = SHIPPED[head]
  else:
    config.method = "tree"
    config.drafter.shipped = SHIPPED["eagle1" if head == "eagle2" else "eagle3"]
    config.tree.kind = "eagle"
    config.tree.n_nodes = 16
    config.tree.depth = 4
    config.tree.top_k = 4
  return apply_variant(config, variant)
