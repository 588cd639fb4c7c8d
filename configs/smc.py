"""SMC speculative decoding (SMC-SD) against AR sampling on Spec-Bench, temperature 1, batch 1.

Each request runs 4 particles; every cycle each drafts gamma = K = 4 tokens from the draft model at
temperature 0.7, the target scores them in one pass and adds a bonus token, nothing is rejected,
and particles are resampled when the effective sample size falls below half
(`specjax.smc`). The AR baseline samples the target at the same temperature. SMC-SD keeps every
draft, so its tau is about K + 1 and "acceptance" is 1 by construction (less only where a stop token
or the budget cut a last cycle); the counters are those of the particle returned, counted per
particle row in the loop. Its cost is N particle rows per request, and its output is a consistent
(not exact) sample, so "same as AR" is not expected.
The draft is the target's first 4 layers (untrained early exit) unless `drafter.model` is set.

Commands (from the repository root):

  python experiments/run.py --config=configs/smc.py:small --workdir=/tmp/specjax_smc_small
  python experiments/run.py --config=configs/smc.py --workdir=/tmp/specjax_smc \
    --config.smc.n_particles=8 --config.drafter.k=2
"""

import ml_collections

from specjax.experiment.settings import apply_variant, base_config


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  config = base_config()
  config.method = "smc"
  config.sampling.temperature = 1.0
  config.drafter.k = 4
  config.drafter.n_layers = 4
  config.smc.n_particles = 4
  config.smc.draft_temperature = 0.7
  config.smc.ess_threshold = 0.5
  return apply_variant(config, arg)
