"""A P-EAGLE-style parallel EAGLE head for SmolLM2-135M-Instruct: the shipped EAGLE-3 head
(`eagle3-smollm2-135m`, fused target layers 2, 15 and 27, frozen) that drafts depth 2 by its own
sequential step 2 (`head_depth2`) and depths 3..8 in the same pass through a mask layer, from
per-depth mask pairs that also read the head's depth-1 draft (`first_token`) and its depth-1
output (`head_state`; `specjax.drafters.peagle`), on the
committed self-distilled corpus (`train/corpora/smollm2-sd-v2.npz`, shared feature cache).
P-EAGLE pins its base's sha256, so it is retrained whenever the EAGLE-3 head changes; the
retraining starts from the shipped P-EAGLE's mask path (`objective.init_from`), and
`--config.objective.init_from=` starts it from the base's layer instead.

Commands (from the repository root):

  python train/main.py --config=configs/train_peagle.py --workdir=/tmp/specjax_train_peagle
  python train/main.py --config=configs/train_peagle.py:tiny --workdir=/tmp/peagle_tiny \
    --config.target=/path/to/tiny_hf_dir
"""

import ml_collections

from train.settings import apply_variant, base_config, use_corpus


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  config = use_corpus(base_config())
  config.objective.kind = "peagle"
  config.objective.k = 8
  config.objective.fuse_layers = config.data.features.hidden_layers
  config.objective.base = "eagle3-smollm2-135m"  # frozen; only the mask path trains
  # Start from the shipped P-EAGLE's mask path (trained over the base's earlier version) rather
  # than the base's layer: a retraining after the base was continued starts close to done.
  config.objective.init_from = "peagle-smollm2-135m"
  # The masks read the depth-1 token too (x_{t+2} in training, the head's greedy draft when
  # drafting): depths past 1 only count once depth 1 was accepted, so they may assume it.
  config.objective.first_token = True
  # The masks also read the head's depth-1 output through a projection (`objective.head_state`),
  # what EAGLE's sequential step 2 reads as its feature; from a drafter without it, the projection
  # starts at zero.
  config.objective.head_state = True
  # Depth 2 is the head's own sequential step 2 in the masks' pass (`objective.head_depth2`), so
  # it is exactly EAGLE-3's; the mask layer trains depths 3..8, which attend to that step's key.
  config.objective.head_depth2 = True
  config.train.steps = 250  # ~8.6 s/step on 2 cores once the feature cache holds the windows
  config.train.lr = 1e-3
  config.train.batch_size = 4
  config.train.warmup = 20
  config.train.save_every = 25
  config.train.eval_every = 50
  config.train.eval_windows = 32
  config.ship.name = "peagle-smollm2-135m"
  # The shipped mask path read steps 0-419 of seed 0's data order (120 steps from the base's
  # layer, 60 warm-started, 60 more over the base continued again, 120 more over the same base,
  # 60 over the base continued once more: held-out simulated tau 1.788 -> 1.853; 60 over the
  # base's H200-trained seventh stage: 1.886), steps 1800-1859 over the eighth (1.906) and steps
  # 2120-2179 over the ninth (1.943): the windows each base stage had just read through, so the
  # cache held them. The first-token mask path (twenty-ninth session) kept that mask layer, started
  # its embeddings at zero and read steps 2180-2529 (a 400-step schedule stopped at 350; 1.943 ->
  # 2.151, depth 2 0.289 -> 0.481). The thirtieth session read steps 2530-2779 from there (step 200
  # of 250 kept; chained simulated tau, `prefix_step{j}`, 2.359 -> 2.416). The thirty-first added
  # `head_state` over the tenth EAGLE-3 stage and re-read steps 2180-2329 (the windows the cache
  # held): 2.416 over the new base (2.4155 at the start), dipping to 2.363 at step 50, 2.450 at
  # step 150 (kept), still rising. The thirty-second continued it from the shipped masks over
  # steps 2780-2869 at lr 5e-4: flat, then falling (2.450 -> 2.436 at step 75); the shipped masks
  # stayed. The thirty-third added `head_depth2` to those masks: 2.527 before any step (depth 2
  # 0.460 -> 0.518, the sequential head's), then 150 steps re-reading 2180-2329 at lr 5e-4 with a
  # 10-step warm-up. A retraining over a new base reads on from 2780.
  config.train.data_start = 2780
  config = apply_variant(config, arg)
  if arg == "tiny":
    config.objective.k = 3
    config.objective.fuse_layers = (0, 1)
    config.objective.base = "tiny-eagle3"  # tests ship it first
    config.objective.init_from = ""
    config.train.data_start = 0
  return config
