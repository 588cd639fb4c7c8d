"""Medusa-1 heads for SmolLM2-135M-Instruct, distilled on the target's own responses.

The shipped heads were trained in three stages: 450 steps from zero weights on the first corpus
(v1, ShareGPT and GSM8K answers), then this config twice, continuing them (`objective.init_from`,
keeping their draft vocabulary) at lr 1e-3 on the committed corpus v2
(`train/corpora/smollm2-sd-v2.npz`): 450 steps on steps 0-449 of the data order, then 600 on
steps 1200-1799 (windows the shared feature cache held; held-out simulated tau 1.379 -> 1.394,
head-0 top-1 0.320 -> 0.329: the heads gain little from more data). Steps 450-1199 are still
unread by them; the default reads on from step 1800. `:scratch` trains heads from zero weights
on v2 with the first stage's settings (lr 2e-3). `:fused` continues them with target layers 2, 15
and 27 fused into their input, shipped as `medusa4f-smollm2-135m` (held-out chain tau 1.441 ->
1.482 at step 350, against 1.459 for the plain heads on the same steps; benchmarks/RESULTS.md,
thirty-fifth session), then continued 750 steps on steps 450-1199 (flat: 1.46-1.50 at every
evaluation, 1.497 kept; thirty-seventh session) by

  python train/main.py --config=configs/train_medusa.py:fused --workdir=/tmp/medusa_f2 \
    --config.objective.init_from=medusa4f-smollm2-135m --config.train.data_start=450 \
    --config.train.steps=750 --config.train.lr=3e-4 --config.train.score_start=True

Commands (from the repository root):

  python train/main.py --config=configs/train_medusa.py --workdir=/tmp/specjax_train_medusa
  python train/main.py --config=configs/train_medusa.py:fused --workdir=/tmp/specjax_medusa_fused
  python train/main.py --config=configs/train_medusa.py:tiny --workdir=/tmp/medusa_tiny \
    --config.target=/path/to/tiny_hf_dir

Killing the run at any moment and rerunning the same command resumes from the last checkpoint.
"""

import ml_collections

from train.settings import SMOLLM2_CORPUS_LAYERS, apply_variant, base_config, use_corpus


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  if arg == "fused":
    return fused(get_config())
  config = use_corpus(base_config())
  config.objective.kind = "medusa"
  config.objective.n_heads = 4
  config.train.steps = 450  # ~0.2 epoch of corpus v2; 1.6-2.3 s/step on 2 cores
  config.train.lr = 2e-3
  config.train.batch_size = 4
  config.train.warmup = 20
  config.train.save_every = 50
  config.train.eval_every = 50
  config.train.eval_windows = 32
  config.ship.name = "medusa4-smollm2-135m"
  if arg == "scratch":
    return config
  if arg != "tiny":
    config.objective.init_from = "medusa4-smollm2-135m"
    config.train.lr = 1e-3
    config.train.data_start = 1800  # the shipped heads read steps 0-449 and 1200-1799 of v2's order
    config.train.score_start = True  # a run whose steps never beat the shipped heads ships nothing
  return apply_variant(config, arg)


def fused(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`:fused`: the shipped heads continued with EAGLE-3's fused target layers added to their input
  (`objective.fuse_layers`; the fusion starts at zero, so step 0 is the shipped heads), shipped as
  `medusa4f-smollm2-135m`. It reads steps 2180-2579 of the data order, windows the shipped heads
  have not read and the EAGLE-3 runs' feature cache holds."""
  config.objective.fuse_layers = SMOLLM2_CORPUS_LAYERS
  config.train.data_start = 2180
  config.train.steps = 400
  config.ship.name = "medusa4f-smollm2-135m"
  return config
