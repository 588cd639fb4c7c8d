"""EAGLE heads for SmolLM2-135M-Instruct against AR on Spec-Bench, greedy, chain drafting (K = 4).

`eagle1` (default): the shipped `eagle1-smollm2-135m` head (one decoder layer over the target's last
hidden state and the next token's embedding, reduced-vocabulary head). `eagle3`: the shipped
`eagle3-smollm2-135m` head (fuses several target layers); if that file is not in
`specjax/drafters/shipped/` the run stops with an error naming what is there. `eagle2`: EAGLE-2's
contribution is the dynamic draft tree; specjax has no tree drafter over an EAGLE head, so this
argument stops with an error that points to `configs/trees.py:dynamic` (EAGLE-2's dynamic tree
algorithm over a draft model).

Commands (from the repository root):

  python experiments/run.py --config=configs/eagle.py:small --workdir=/tmp/specjax_eagle1_small
  python experiments/run.py --config=configs/eagle.py:eagle3,small --workdir=/tmp/specjax_eagle3
  python experiments/run.py --config=configs/eagle.py:eagle1 --workdir=/tmp/specjax_eagle1
"""

import ml_collections

from specjax.experiment.settings import apply_variant, base_config, split_arg

SHIPPED = {"eagle1": "eagle1-smollm2-135m", "eagle3": "eagle3-smollm2-135m"}


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  head, variant = split_arg(arg, ("eagle1", "eagle2", "eagle3"))
  if head == "eagle2":
    raise ValueError(
      "EAGLE-2 drafts dynamic trees; specjax has no tree drafter over an EAGLE head. Run EAGLE-2's "
      "dynamic tree over a draft model with configs/trees.py:dynamic"
    )
  config = base_config()
  config.method = "shipped"
  config.drafter.shipped = SHIPPED[head]
  config.drafter.k = 4
  return apply_variant(config, variant)
