"""From a config to a trained, shipped drafter: target, feature cache, vocabulary, training, export.

Library code takes typed objects; `settings_from_config` is the one place that reads the
ml_collections config (see `configs/train_*.py` for the fields).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import time
from collections.abc import Callable

import jax
import numpy as np

from specjax.config import ModelConfig
from specjax.drafters.draft_vocab import top_tokens
from specjax.integrity import CacheError, differences, weights_fingerprint, write_json_atomic
from specjax.loading.registry import load_model
from train import features, objectives, prompts, sources, teacher_forced
from train.data import Windows
from train.loop import TrainSettings, read_metrics, train


@dataclasses.dataclass(frozen=True)
class DataSettings:
  """Where the training data comes from.

  Attributes:
    cache_dir: feature cache directory (shared by every drafter trained on the same recipe).
    recipe: the prompt recipe (ignored when synthetic_prompts > 0).
    features: how the target's responses and features are generated.
    synthetic_prompts: > 0 replaces the recipe by that many random-token prompts (tests, smoke).
    draft_vocab: Vd, the draft vocabulary size (capped at the target's V).
    vocab_sharegpt_chars: after the tokens of the training documents, rank the rest of the draft
      vocabulary by their frequency in this many characters of ShareGPT assistant turns.
    read_through_from: a packed-cache directory; when set, this cache holds its documents (and
      held-out split) read through the target once each (`train.teacher_forced`) to record
      `features.hidden_layers`, instead of decoding the recipe's prompts again.
  """

  cache_dir: str
  recipe: prompts.PromptRecipe
  features: features.FeatureSpec
  synthetic_prompts: int = 0
  draft_vocab: int = 8192
  vocab_sharegpt_chars: int = 0
  read_through_from: str = ""


@dataclasses.dataclass(frozen=True)
class RunSettings:
  target: str
  data: DataSettings
  objective: dict
  train: TrainSettings
  ship_name: str
  ship_dir: str


def _fields(cls, d) -> dict:
  names = {f.name for f in dataclasses.fields(cls)}
  return {k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in names}


def settings_from_config(config) -> RunSettings:
  c = config.to_dict() if hasattr(config, "to_dict") else config
  d = c["data"]
  data = DataSettings(
    cache_dir=os.path.expanduser(d["cache_dir"]),
    recipe=prompts.PromptRecipe(**_fields(prompts.PromptRecipe, d["recipe"])),
    features=features.FeatureSpec(**_fields(features.FeatureSpec, d["features"])),
    synthetic_prompts=d.get("synthetic_prompts", 0),
    draft_vocab=d["draft_vocab"],
    vocab_sharegpt_chars=d.get("vocab_sharegpt_chars", 0),
    read_through_from=os.path.expanduser(d.get("read_through_from", "")),
  )
  return RunSettings(
    target=c["target"],
    data=data,
    objective=dict(c["objective"]),
    train=TrainSettings(**_fields(TrainSettings, c["train"])),
    ship_name=c["ship"]["name"],
    ship_dir=c["ship"]["dir"],
  )


def make_objective(o: dict, tcfg: ModelConfig):
  """The objective named by o["kind"] ("draft_lm", "medusa", "eagle") for target config tcfg."""
  kind = o["kind"]
  if kind == "draft_lm":
    cfg = tcfg.replace(n_layers=o["n_layers"])
    return objectives.DraftLMObjective(cfg, tuple(o["init_layers"]), o.get("train_head", False))
  if kind == "medusa":
    return objectives.MedusaObjective(o["n_heads"], tcfg.vocab_size, o.get("decay", 0.8))
  if kind == "eagle":
    return objectives.EagleObjective(
      tcfg.replace(n_layers=1),
      steps=o["steps"],
      fuse_layers=tuple(o.get("fuse_layers", ())),
      w_reg=o.get("w_reg", 1.0),
      w_cls=o.get("w_cls", 0.1),
      decay=o.get("decay", 0.8),
      init_layer=o.get("init_layer", -1),
    )
  raise ValueError(f"unknown drafter kind {kind!r}; expected draft_lm, medusa or eagle")


def _synthetic_prompts(n: int, vocab: int, seed: int) -> list[prompts.TrainPrompt]:
  rng = random.Random(seed)
  out = []
  for i in range(n):
    toks = tuple(rng.randrange(1, vocab) for _ in range(rng.randint(3, 12)))
    out.append(prompts.TrainPrompt("synthetic", i, " ".join(map(str, toks)), toks))
  return out


def len_prompts_hint(s: RunSettings) -> int:
  """Prompts in the recipe (held-out prompts are at most a quarter of them)."""
  n = s.data.synthetic_prompts or (s.data.recipe.n_sharegpt + s.data.recipe.n_gsm8k)
  return n // 4


# Bump when what a feature cache holds, or how it is built, changes: a cache of another version is
# refused with the fix, never reused.
FEATURE_CACHE_VERSION = 2


def tokenizer_fingerprint(tokenizer) -> str | None:
  """sha256 of what tokenization depends on: vocabulary, chat template, BOS/EOS and stop ids."""
  if tokenizer is None:
    return None
  vocab = sorted(tokenizer.backend.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
  ids = [tokenizer.add_bos, tokenizer.bos_id, tokenizer.eos_id, list(tokenizer.stop_ids)]
  blob = json.dumps([vocab, tokenizer.chat_template, ids])
  return hashlib.sha256(blob.encode()).hexdigest()


def cache_identity(s: RunSettings, params, tcfg: ModelConfig, tokenizer) -> dict:
  """What a feature cache must have been built from to serve run `s`: the code version, the target
  (a fingerprint of its weights, its shapes, its tokenizer), the prompt recipe and the feature spec.
  Checked every time a cache is opened (`check_identity`)."""
  spec = dataclasses.asdict(s.data.features)
  del spec["max_tokens"]  # only bounds the cache; growing it resumes the same shards
  recipe = dataclasses.asdict(s.data.recipe)
  del recipe["n_heldout"]  # the split is applied when the cache is opened
  return {
    "format": FEATURE_CACHE_VERSION,
    "target_weights": weights_fingerprint(params),
    "target_config": {k: getattr(tcfg, k) for k in ("vocab_size", "d_model", "n_layers", "dtype")},
    "tokenizer": tokenizer_fingerprint(tokenizer),
    "recipe": recipe,
    "synthetic_prompts": s.data.synthetic_prompts,
    "spec": {k: list(v) if isinstance(v, tuple) else v for k, v in spec.items()},
  }


def rebuild_hint(cache_dir: str) -> str:
  return (
    f"delete {cache_dir} (rm -r) to rebuild it from this target, or set data.cache_dir to "
    "another directory"
  )


def check_identity(cache_dir: str, manifest: dict | None, wanted: dict) -> None:
  """Raises CacheError, listing every field that differs, unless `manifest` records `wanted`."""
  hint = rebuild_hint(cache_dir)
  if not manifest or "format" not in manifest:
    raise CacheError(
      f"{cache_dir} has no manifest recording which target weights, recipe and feature spec "
      f"built it (written by an older specjax, or incomplete), so it cannot be verified; {hint}"
    )
  diff = differences({k: manifest.get(k, "<absent>") for k in wanted}, wanted)
  if diff:
    raise CacheError(
      f"{cache_dir} holds features of something else than this run asks for (built for target "
      f"{manifest.get('target')!r}):\n  " + "\n  ".join(diff) + f"\n{hint}"
    )


def _read_manifest(cache_dir: str) -> dict | None:
  path = os.path.join(cache_dir, "manifest.json")
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      return json.load(f)
  except ValueError as e:
    raise CacheError(f"{path} is not valid JSON ({e}); {rebuild_hint(cache_dir)}") from e


def _open_verified(cache_dir: str, tcfg: ModelConfig, n_heldout: int) -> features.FeatureStore:
  """The packed cache of `cache_dir`, after checking its files' checksums and shapes."""
  packed = os.path.join(cache_dir, "packed")
  hint = rebuild_hint(cache_dir)
  features.verify_sealed(packed, hint)
  store = features.FeatureStore.open(packed, n_heldout)
  top = int(store.tokens.max()) if store.n_positions else 0
  if store.hidden.shape[1] != tcfg.d_model or top >= tcfg.vocab_size:
    raise CacheError(
      f"{packed} holds features of width {store.hidden.shape[1]} and token ids up to {top}; the "
      f"target has d_model {tcfg.d_model} and {tcfg.vocab_size} tokens; {hint}"
    )
  return store


def ensure_features(
  s: RunSettings, params, tcfg, tokenizer, log
) -> tuple[features.FeatureStore, dict]:
  """Opens the packed feature cache, building (or finishing) it first if needed.

  The cache's manifest must record this target's weights fingerprint, tokenizer, recipe and feature
  spec, and its files their checksums; otherwise `CacheError` says what differs and how to rebuild.
  """
  cache_dir = s.data.cache_dir
  packed = os.path.join(cache_dir, "packed")
  manifest_path = os.path.join(cache_dir, "manifest.json")
  n_heldout = min(s.data.recipe.n_heldout, len_prompts_hint(s))
  wanted = cache_identity(s, params, tcfg, tokenizer)
  old = _read_manifest(cache_dir)
  if os.path.exists(packed):
    check_identity(cache_dir, old, wanted)
    return _open_verified(cache_dir, tcfg, n_heldout), old
  if s.data.read_through_from:
    return _read_through_cache(s, wanted, tcfg, params, n_heldout, log)
  if s.data.synthetic_prompts:
    plist = _synthetic_prompts(s.data.synthetic_prompts, tcfg.vocab_size, s.data.recipe.seed)
  else:
    plist = prompts.build_prompts(s.data.recipe, tokenizer)
  manifest = {
    "target": s.target,
    **wanted,
    "prompts_sha256": prompts.fingerprint(plist),
    "n_prompts": len(plist),
  }
  shards = os.path.join(cache_dir, "shards")
  if os.path.isdir(shards) and os.listdir(shards):  # resuming a build: it must be the same one
    check_identity(cache_dir, old, {k: v for k, v in manifest.items() if k != "target"})
  os.makedirs(cache_dir, exist_ok=True)
  write_json_atomic(manifest_path, manifest)
  stops = tokenizer.stop_ids if tokenizer is not None else ()
  n = features.build_shards(params, tcfg, plist, stops, s.data.features, shards, n_heldout, log)
  manifest["generation_s"] = features.pack(shards, packed)
  manifest["packed_positions"] = n
  write_json_atomic(manifest_path, manifest)
  return _open_verified(cache_dir, tcfg, n_heldout), manifest


def _read_through_cache(s: RunSettings, wanted: dict, tcfg, params, n_heldout: int, log):
  """Builds s.data.cache_dir from the documents of s.data.read_through_from, with the layers.

  The source cache must have been built from the same target, recipe and spec (any layers)."""
  src = s.data.read_through_from
  if not os.path.exists(os.path.join(src, "packed")):
    raise FileNotFoundError(f"data.read_through_from={src} has no packed feature cache")
  source = _read_manifest(src)
  src_spec = dict((source or {}).get("spec", {}))
  src_wanted = {
    **wanted,
    "spec": {**wanted["spec"], "hidden_layers": src_spec.get("hidden_layers")},
  }
  check_identity(src, source, src_wanted)
  _open_verified(src, tcfg, None)
  docs = teacher_forced.cache_documents(os.path.join(src, "packed"))
  layers = tuple(s.data.features.hidden_layers)
  manifest = {**source, **wanted, "read_through_from": src}
  manifest.pop("read_through", None)
  os.makedirs(s.data.cache_dir, exist_ok=True)
  packed = os.path.join(s.data.cache_dir, "packed")
  manifest["read_through"] = teacher_forced.build(docs, packed, params, tcfg, layers, log=log)
  write_json_atomic(os.path.join(s.data.cache_dir, "manifest.json"), manifest)
  return _open_verified(s.data.cache_dir, tcfg, n_heldout), manifest


RUN_FILE = "run.json"


def check_workdir(workdir: str, s: RunSettings, manifest: dict) -> None:
  """Records in `workdir/run.json` what a run trains on (target weights, data, objective, draft
  vocabulary, seed), or checks that a resumed run is the same one: its checkpoints and vocabulary
  are never reused for another target, data set or drafter. (train.steps and the optimisation
  settings may change between resumes.)"""
  wanted = {
    "target_weights": manifest.get("target_weights"),
    "data": {
      k: manifest.get(k)
      for k in ("format", "target_config", "recipe", "synthetic_prompts", "spec", "prompts_sha256")
    },
    "objective": s.objective,
    "draft_vocab": s.data.draft_vocab,
    "vocab_sharegpt_chars": s.data.vocab_sharegpt_chars,
    "seed": s.train.seed,
  }
  path = os.path.join(workdir, RUN_FILE)
  hint = f"use another --workdir, or delete {workdir} to start this run afresh"
  if os.path.exists(path):
    with open(path) as f:
      have = json.load(f)
    diff = differences({k: have.get(k, "<absent>") for k in wanted}, wanted)
    if diff:
      raise CacheError(
        f"{workdir} holds a run of something else than this one (its checkpoints and draft "
        "vocabulary would be reused):\n  " + "\n  ".join(diff) + f"\n{hint}"
      )
    return
  started = [n for n in ("checkpoints", "d2t.npy") if os.path.exists(os.path.join(workdir, n))]
  if started:
    raise CacheError(
      f"{workdir} holds {' and '.join(started)} but no {RUN_FILE} recording which target, data "
      f"and drafter they belong to (an older specjax), so they cannot be verified; {hint}"
    )
  write_json_atomic(path, wanted)


def sharegpt_response_counts(tokenizer, n_chars: int, vocab_size: int) -> np.ndarray:
  """Token counts of the first n_chars of ShareGPT assistant turns (cheap: tokenizing only)."""
  counts, seen = np.zeros(vocab_size, np.int64), 0
  for turns in sources.sharegpt_conversations(sources.read_bytes(sources.SHAREGPT)):
    texts = [
      t["value"] for t in turns if t.get("from") == "gpt" and isinstance(t.get("value"), str)
    ]
    for ids in tokenizer.encode_batch(texts, add_special_tokens=False):
      counts += np.bincount(np.asarray(ids, np.int64), minlength=vocab_size)[:vocab_size]
    seen += sum(map(len, texts))
    if seen >= n_chars:
      break
  return counts


def draft_vocabulary(
  store, size: int, vocab_size: int, always=(), extra_counts: np.ndarray | None = None
) -> np.ndarray:
  """The Vd most frequent tokens: the target's own training documents first (any token they
  contain outranks tokens seen only in `extra_counts`), then by `extra_counts`, then by id."""
  counts = store.token_counts(vocab_size).astype(np.float64)
  if extra_counts is not None:
    counts = np.where(counts > 0, counts + 1e9, 0.0) + extra_counts
  return top_tokens(counts, min(size, vocab_size), tuple(always))


def train_seconds(metrics_path: str) -> float:
  """Seconds spent in optimizer steps (last record of each step; compile time included once)."""
  per_step = {r["step"]: r["step_s"] for r in read_metrics(metrics_path) if "step_s" in r}
  return float(sum(per_step.values()))


def run(config, workdir: str, log: Callable[[str], None] = print, stop_after: int | None = None):
  """Trains the configured drafter in `workdir` (resuming if possible) and ships it if asked.

  Returns:
    (objective, trainable, frozen, held-out metrics, metadata written or None).
  """
  s = settings_from_config(config)
  params, tcfg, tok = load_model(s.target)
  store, manifest = ensure_features(s, params, tcfg, tok, log)
  objective = make_objective(s.objective, tcfg)
  os.makedirs(workdir, exist_ok=True)
  check_workdir(workdir, s, manifest)
  vocab_path = os.path.join(workdir, "d2t.npy")
  if not os.path.exists(vocab_path):
    stops = tok.stop_ids if tok is not None else ()
    extra = None
    if s.data.vocab_sharegpt_chars and tok is not None:
      extra = sharegpt_response_counts(tok, s.data.vocab_sharegpt_chars, tcfg.vocab_size)
    d2t = draft_vocabulary(store, s.data.draft_vocab, tcfg.vocab_size, stops, extra)
    tmp = vocab_path + ".tmp.npy"
    np.save(tmp, d2t)
    os.replace(tmp, vocab_path)
  d2t = np.load(vocab_path)
  trainable, frozen = objective.init(jax.random.PRNGKey(s.train.seed), params, tcfg, d2t)
  fused = tuple(getattr(objective, "fuse_layers", ()))
  if fused and fused != tuple(s.data.features.hidden_layers):
    raise ValueError(
      f"the head fuses target layers {fused} but the feature cache stores "
      f"{tuple(s.data.features.hidden_layers)}; set data.features.hidden_layers to match"
    )
  with_layers = bool(fused)
  train_w = Windows(store, s.train.seq_len, heldout=False, with_layers=with_layers)
  eval_w = Windows(store, s.train.seq_len, heldout=True, with_layers=with_layers)
  log(
    f"{objective.name}: {train_w.n_positions} training positions ({train_w.n_windows} windows), "
    f"{eval_w.n_positions} held-out; draft vocabulary {len(d2t)}"
  )
  t0 = time.time()
  trainable, heldout = train(
    objective, trainable, frozen, train_w, eval_w, s.train, workdir, log, stop_after
  )
  meta = None
  if s.ship_name and (stop_after is None or stop_after >= s.train.steps):
    from train.export import export_drafter

    resp = np.asarray(train_w.resp).mean()
    extra = {
      "data": {
        **manifest,
        "documents": int(len(store.doc_lens)),
        "heldout_documents": int(store.heldout.sum()),
        "training_positions": train_w.n_positions,
        "response_fraction": float(resp),
        "heldout_positions": eval_w.n_positions,
        "draft_vocab": len(d2t),
      },
      "training": {
        **dataclasses.asdict(s.train),
        "train_s": train_seconds(os.path.join(workdir, "metrics.jsonl")),
        "wall_s_last_process": time.time() - t0,
      },
      "heldout": heldout,
    }
    meta = export_drafter(
      s.ship_dir, s.ship_name, objective, trainable, frozen, s.target, tcfg, extra
    )
    log(f"shipped {s.ship_name} ({meta['size_bytes'] / 1e6:.1f} MB) to {s.ship_dir}")
  return objective, trainable, frozen, heldout, meta
