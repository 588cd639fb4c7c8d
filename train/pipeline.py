"""From a config to a trained, shipped drafter: target, feature cache, vocabulary, training, export.

Library code takes typed objects; `settings_from_config` is the one place that reads the
ml_collections config (see `configs/train_*.py` for the fields).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import time
from collections.abc import Callable

import jax
import numpy as np

from specjax.config import ModelConfig
from specjax.drafters.draft_vocab import top_tokens
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


def _manifest(s: RunSettings, fingerprint: str, n_prompts: int) -> dict:
  spec = dataclasses.asdict(s.data.features)
  del spec["max_tokens"]  # only bounds the cache; growing it resumes the same shards
  recipe = dataclasses.asdict(s.data.recipe)
  del recipe["n_heldout"]  # the split is applied when the cache is opened
  return {
    "target": s.target,
    "recipe": recipe,
    "synthetic_prompts": s.data.synthetic_prompts,
    "spec": {k: list(v) if isinstance(v, tuple) else v for k, v in spec.items()},
    "prompts_sha256": fingerprint,
    "n_prompts": n_prompts,
  }


def ensure_features(
  s: RunSettings, params, tcfg, tokenizer, log
) -> tuple[features.FeatureStore, dict]:
  """Opens the packed feature cache, building (or finishing) it first if needed."""
  packed = os.path.join(s.data.cache_dir, "packed")
  manifest_path = os.path.join(s.data.cache_dir, "manifest.json")
  n_heldout = min(s.data.recipe.n_heldout, len_prompts_hint(s))
  if os.path.exists(os.path.join(packed, "docs.json")):
    with open(manifest_path) as f:
      return features.FeatureStore.open(packed, n_heldout), json.load(f)
  if s.data.read_through_from:
    return _read_through_cache(s, params, tcfg, n_heldout, log)
  if s.data.synthetic_prompts:
    plist = _synthetic_prompts(s.data.synthetic_prompts, tcfg.vocab_size, s.data.recipe.seed)
  else:
    plist = prompts.build_prompts(s.data.recipe, tokenizer)
  manifest = _manifest(s, prompts.fingerprint(plist), len(plist))
  os.makedirs(s.data.cache_dir, exist_ok=True)
  if os.path.exists(manifest_path):
    with open(manifest_path) as f:
      old = json.load(f)
    old.pop("packed_positions", None)
    old.pop("generation_s", None)
    old.pop("generation_note", None)
    if old != manifest:
      raise ValueError(
        f"{s.data.cache_dir} holds features of another recipe; use a new data.cache_dir\n"
        f"cached: {old}\nwanted: {manifest}"
      )
  with open(manifest_path, "w") as f:
    json.dump(manifest, f, indent=1)
  stops = tokenizer.stop_ids if tokenizer is not None else ()
  shards = os.path.join(s.data.cache_dir, "shards")
  n = features.build_shards(params, tcfg, plist, stops, s.data.features, shards, n_heldout, log)
  manifest["generation_s"] = features.pack(shards, packed)
  manifest["packed_positions"] = n
  with open(manifest_path, "w") as f:
    json.dump(manifest, f, indent=1)
  return features.FeatureStore.open(packed, n_heldout), manifest


def _read_through_cache(s: RunSettings, params, tcfg, n_heldout: int, log):
  """Builds s.data.cache_dir from the documents of s.data.read_through_from, with the layers."""
  src = s.data.read_through_from
  if not os.path.exists(os.path.join(src, "packed", "docs.json")):
    raise FileNotFoundError(f"data.read_through_from={src} has no packed feature cache")
  with open(os.path.join(src, "manifest.json")) as f:
    manifest = json.load(f)
  if manifest["target"] != s.target:
    raise ValueError(f"{src} holds features of {manifest['target']}, not of {s.target}")
  docs = teacher_forced.cache_documents(os.path.join(src, "packed"))
  layers = tuple(s.data.features.hidden_layers)
  manifest["spec"]["hidden_layers"] = list(layers)
  manifest["read_through_from"] = src
  os.makedirs(s.data.cache_dir, exist_ok=True)
  packed = os.path.join(s.data.cache_dir, "packed")
  manifest["read_through"] = teacher_forced.build(docs, packed, params, tcfg, layers, log=log)
  with open(os.path.join(s.data.cache_dir, "manifest.json"), "w") as f:
    json.dump(manifest, f, indent=1)
  return features.FeatureStore.open(packed, n_heldout), manifest


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
  vocab_path = os.path.join(workdir, "d2t.npy")
  if not os.path.exists(vocab_path):
    stops = tok.stop_ids if tok is not None else ()
    extra = None
    if s.data.vocab_sharegpt_chars and tok is not None:
      extra = sharegpt_response_counts(tok, s.data.vocab_sharegpt_chars, tcfg.vocab_size)
    d2t = draft_vocabulary(store, s.data.draft_vocab, tcfg.vocab_size, stops, extra)
    np.save(vocab_path, d2t)
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
