"""Lookup first, a shipped drafter otherwise, against AR on Spec-Bench, greedy, batch 1.

Each step, per row, prompt lookup's continuation where the row's last 2-3 tokens occurred before
in its prompt or output, the shipped drafter's chain elsewhere (`specjax.drafters.lookup_first`).
`eagle3` (default) uses the shipped `eagle3-smollm2-135m` head, `medusa4` the Medusa heads,
`draft_lm2` the 2-layer draft LM. K = 3: with EAGLE-3 behind it, 1.30x AR on Spec-Bench against
1.26x at K = 2 in the same run (eleventh session, benchmarks/RESULTS.md; within this host's noise).
`--config.drafter.copier=suffix` copies with suffix decoding's chain instead of prompt lookup
(config.suffix's matching, min_ngram its shortest match), which also drafts from a global cache of
the AR outputs of the prompts run before in the same run.

Commands (from the repository root):

  python experiments/run.py --config=configs/lookup_first.py:small --workdir=/tmp/specjax_lf_small
  python experiments/run.py --config=configs/lookup_first.py --workdir=/tmp/specjax_lookup_first
  # Overrides: copy after any repeated token; in-loop adaptive K.
  python experiments/run.py --config=configs/lookup_first.py:small --workdir=/tmp/specjax_lf1 \\
    --config.drafter.min_ngram=1
  python experiments/run.py --config=configs/lookup_first.py:small --workdir=/tmp/specjax_lf_ad \\
    --config.adaptive=True --config.adaptive_ks=0,2,3
"""

import ml_collections

from specjax.experiment import registry
from specjax.experiment.settings import apply_variant, base_config, split_arg

SHIPPED = {
  "eagle3": "eagle3-smollm2-135m",
  "medusa4": "medusa4-smollm2-135m",
  "draft_lm2": "draft-lm2-smollm2-135m",
}


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  model, variant = split_arg(arg, tuple(SHIPPED))
  config = base_config()
  registry.get("lookup_first").by_name(config, False)  # K = 3, 2-3-token matches, EAGLE-3
  config.drafter.shipped = SHIPPED[model]
  return apply_variant(config, variant)
