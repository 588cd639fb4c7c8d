"""The training config: every field with its default, and the small variants.

Config files `configs/train_*.py` start from `base_config()`, set the drafter kind and its fields,
and call `apply_variant(config, arg)`; `train.pipeline.settings_from_config` turns the (locked,
possibly overridden) ConfigDict into typed settings.
"""

from __future__ import annotations

import os

import ml_collections

from specjax.loading.registry import cache_root

SMOLLM2 = "smollm2-135m-instruct"
# The self-distilled SmolLM2 cache the first shipped drafters were trained on (outside the repository).
SMOLLM2_FEATURES = "smollm2-v1"
# The committed self-distilled corpus (train/make_corpus.py): v2, 9,383 documents, 3.0M response
# tokens (v1's 3,071 clean documents plus task-shaped prompts; v1 stays committed while drafters
# trained on it ship).
SMOLLM2_CORPUS = os.path.join(
  os.path.dirname(os.path.abspath(__file__)), "corpora", "smollm2-sd-v2.npz"
)
# Its features: the final hidden state and the layers an EAGLE-3 head fuses, one cache for every
# drafter kind (outside the repository, ~21 GB in float16 for 4.6M positions).
SMOLLM2_CORPUS_LAYERS = (2, 15, 27)
SMOLLM2_CORPUS_FEATURES = "smollm2-sd-v2-l2-15-27"


def feature_cache(name: str) -> str:
  """A feature-cache directory under the cache root (`$SPECJAX_CACHE`, else `~/.cache/specjax`)."""
  return os.path.join(cache_root(), "features", name)


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.target = SMOLLM2  # registry name or Hugging Face directory of the frozen target
  c.data = ml_collections.ConfigDict()
  # Its manifest records the target's weights fingerprint, recipe and spec; a cache built from
  # anything else is refused (delete it or point this elsewhere).
  c.data.cache_dir = feature_cache(SMOLLM2_FEATURES)
  c.data.synthetic_prompts = 0  # > 0: random-token prompts instead of the recipe (tests)
  c.data.draft_vocab = 8192  # Vd
  c.data.vocab_sharegpt_chars = 4_000_000  # ranks draft-vocabulary tokens the data lacks
  # A cache whose documents this one re-reads through the target, one pass each (no decoding), to
  # record features.hidden_layers (train.teacher_forced); "" decodes the recipe's prompts.
  c.data.read_through_from = ""
  # A packed self-distilled corpus whose documents are read through the target as far as runs use
  # them (its own held-out split; the recipe is unused); "" uses the recipe or read_through_from.
  c.data.corpus = ""
  c.data.train_positions = 0  # > 0: only the first N training positions (data-scaling runs)
  c.data.read_batch_tokens = 4096  # tokens per read-through batch; an accelerator takes far more
  c.data.recipe = ml_collections.ConfigDict(
    dict(
      n_sharegpt=1200,
      n_gsm8k=200,
      n_heldout=24,
      min_tokens=24,
      max_tokens=320,
      min_ascii=0.97,
      seed=0,
    )
  )
  c.data.features = ml_collections.ConfigDict(
    # max_tokens: the shipped drafters used the 58,412 positions (216 prompts and responses) that
    # a shared 2-core CPU generated in ~90 min; raise it to grow the same cache (it resumes).
    dict(hidden_layers=(), max_new_tokens=256, batch_size=24, max_tokens=58_000)
  )
  c.objective = ml_collections.ConfigDict(
    dict(
      kind="medusa",
      # draft_lm
      n_layers=2,
      init_layers=(0, 1),
      train_head=False,
      # medusa
      n_heads=4,
      decay=0.8,
      # eagle
      steps=1,
      fuse_layers=(),
      w_reg=1.0,
      w_cls=0.1,
      init_layer=-1,
      fuse_norm=True,
      # a shipped drafter of this kind whose weights start the run (EAGLE); its vocabulary is kept
      init_from="",
      # pard and peagle (parallel drafters): depths trained; the shipped sequential drafter
      # they extend (frozen)
      k=8,
      base="",
    )
  )
  c.train = ml_collections.ConfigDict(
    dict(
      steps=1000,
      batch_size=8,
      seq_len=256,
      lr=1e-3,
      warmup=50,
      min_lr_ratio=0.1,
      weight_decay=0.0,
      clip=1.0,
      seed=0,
      data_start=0,  # the data order's step that step 0 reads (continuations: past the old head's)
      log_every=10,
      eval_every=0,
      save_every=50,
      eval_windows=16,
      eval_first=0,  # > 0: also score each response's first N tokens alone (`first_*` metrics)
      first_weight=1.0,  # loss weight of those first eval_first tokens (1.0: all alike)
      time_budget_s=0.0,  # > 0: stop the training loop after this many seconds (best state kept)
      score_start=False,  # also score the starting state; no step beats it: nothing ships
    )
  )
  c.ship = ml_collections.ConfigDict(dict(name="", dir="specjax/drafters/shipped"))
  return c


def use_corpus(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Trains on the committed SmolLM2 corpus through its shared feature cache."""
  config.data.corpus = SMOLLM2_CORPUS
  config.data.cache_dir = feature_cache(SMOLLM2_CORPUS_FEATURES)
  config.data.features.hidden_layers = SMOLLM2_CORPUS_LAYERS
  config.train.seq_len = 512
  # Held-out agreement over each response's first 64 tokens as well: the benchmarks decode 64
  # tokens, and these positions are harder than later ones of the corpus's 512-token responses.
  config.train.eval_first = 64
  return config


def apply_variant(config: ml_collections.ConfigDict, arg: str) -> ml_collections.ConfigDict:
  """ "" is the full run; "tiny" a seconds-long run on a tiny target (set config.target)."""
  if arg == "tiny":
    config.target = ""  # tests point this at a tiny Hugging Face directory
    config.data.corpus = ""
    config.data.cache_dir = feature_cache("tiny-synthetic")
    config.data.synthetic_prompts = 64
    config.data.draft_vocab = 48
    config.data.vocab_sharegpt_chars = 0
    config.data.recipe.n_heldout = 12
    config.data.features.max_new_tokens = 32
    config.data.features.batch_size = 16
    config.data.features.hidden_layers = (0, 1)  # the tiny target's layers, for EAGLE-3 tests
    config.data.features.max_tokens = 10_000
    config.train.update(
      dict(steps=12, batch_size=4, seq_len=32, warmup=2, log_every=4, save_every=4, eval_windows=16)
    )
    config.ship.name = ""
  elif arg:
    raise ValueError(f"unknown config variant {arg!r}; use '' or 'tiny'")
  return config
