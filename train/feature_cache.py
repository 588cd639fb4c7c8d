"""The feature cache a training run reads: its identity, what it holds, reading more into it.

A cache directory holds `packed/` (a `train.features.FeatureStore`) and `manifest.json`, which
records what built it: the target's weights fingerprint and tokenizer, the prompt recipe or corpus
and the feature spec (`cache_identity`). Every open checks the manifest against the run and the
packed files against their checksums and shapes; a mismatch raises `CacheError` saying what differs
and how to rebuild. `ensure_features` builds a missing cache (decoding the recipe's prompts,
`train.features`, or reading another cache's or a corpus's documents through the target,
`train.teacher_forced`); `windows_read` gives a run its training and held-out windows, first
reading through the target the corpus-document prefixes they use that the cache lacks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
from typing import TYPE_CHECKING

import numpy as np

from specjax.config import ModelConfig
from specjax.integrity import CacheError, differences, weights_fingerprint, write_json_atomic
from train import corpus, features, prompts, teacher_forced
from train.data import Windows
from train.loop import positions_read

if TYPE_CHECKING:
  from train.pipeline import RunSettings


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
  if s.data.corpus:  # the corpus, not the recipe, decides the documents and the split
    recipe = None
    spec = {"hidden_layers": list(s.data.features.hidden_layers)}
  return {
    "format": FEATURE_CACHE_VERSION,
    "target_weights": weights_fingerprint(params),
    "target_config": {k: getattr(tcfg, k) for k in ("vocab_size", "d_model", "n_layers", "dtype")},
    "tokenizer": tokenizer_fingerprint(tokenizer),
    "recipe": recipe,
    "synthetic_prompts": s.data.synthetic_prompts,
    "spec": {k: list(v) if isinstance(v, tuple) else v for k, v in spec.items()},
    "corpus": corpus_identity(s.data.corpus) if s.data.corpus else None,
  }


def corpus_identity(path: str) -> dict:
  """What names a packed corpus: its file name, sha256 (from its `.json`) and generating target."""
  meta = corpus.read_meta(path)
  return {
    "name": os.path.basename(path),
    "sha256": meta["sha256"],
    "target_weights": meta["manifest"]["target_weights"],
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


def _open_verified(
  cache_dir: str, tcfg: ModelConfig, n_heldout: int, sealed_now: bool = False
) -> features.FeatureStore:
  """The packed cache of `cache_dir`, after checking its files' checksums and shapes.

  sealed_now: this process has just written the checksums (`features.seal`), so the files are not
  hashed again (v2's cache is 21 GB).
  """
  packed = os.path.join(cache_dir, "packed")
  hint = rebuild_hint(cache_dir)
  if not sealed_now:
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
  if s.data.corpus:
    n_heldout = None  # the corpus records its own split
  if os.path.exists(packed):
    check_identity(cache_dir, old, wanted)
    return _open_verified(cache_dir, tcfg, n_heldout), old
  if s.data.corpus:
    return _corpus_cache(s, wanted, tcfg, params, log)
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
  return _open_verified(cache_dir, tcfg, n_heldout, sealed_now=True), manifest


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
  manifest["read_through"] = teacher_forced.build(
    docs, packed, params, tcfg, layers, s.data.read_batch_tokens, log=log
  )
  write_json_atomic(os.path.join(s.data.cache_dir, "manifest.json"), manifest)
  return _open_verified(s.data.cache_dir, tcfg, n_heldout, sealed_now=True), manifest


def _corpus_cache(s: RunSettings, wanted: dict, tcfg, params, log):
  """Builds s.data.cache_dir from the corpus: every document's tokens, no features yet (a run
  reads through the positions it uses first, `read_documents`)."""
  made_by = wanted["corpus"]["target_weights"]
  if made_by != wanted["target_weights"]:
    raise CacheError(
      f"data.corpus={s.data.corpus} was generated by a target with weights fingerprint "
      f"{made_by}, not by {s.target!r} ({wanted['target_weights']}); its documents are not this "
      "target's outputs. Generate a corpus with this target (train/make_corpus.py) or train "
      "the target that made it"
    )
  cache_dir = s.data.cache_dir
  old = _read_manifest(cache_dir)
  if os.path.exists(os.path.join(cache_dir, "packed.part")):  # resuming: it must be the same build
    check_identity(cache_dir, old, wanted)
  docs = corpus.load_documents(s.data.corpus)
  manifest = {"target": s.target, **wanted}
  os.makedirs(cache_dir, exist_ok=True)
  write_json_atomic(os.path.join(cache_dir, "manifest.json"), manifest)
  packed = os.path.join(cache_dir, "packed")
  layers = tuple(s.data.features.hidden_layers)
  want = np.zeros(len(docs), np.int64)
  manifest["read_through"] = teacher_forced.build(
    docs, packed, params, tcfg, layers, s.data.read_batch_tokens, log=log, want=want
  )
  write_json_atomic(os.path.join(cache_dir, "manifest.json"), manifest)
  return _open_verified(cache_dir, tcfg, None, sealed_now=True), manifest


def read_documents(
  s: RunSettings, manifest: dict, need: np.ndarray, have: np.ndarray, tcfg, params, log
):
  """Reads through the target the first `need[d]` positions of each corpus document d where the
  cache holds fewer (`have`), resumably, and returns the reopened cache and its manifest."""
  if not s.data.corpus:
    raise CacheError(
      f"{s.data.cache_dir} lacks features of positions this run reads and was not built from a "
      f"corpus, so they cannot be read now; {rebuild_hint(s.data.cache_dir)}"
    )
  docs = corpus.load_documents(s.data.corpus)
  layers = tuple(s.data.features.hidden_layers)
  packed = os.path.join(s.data.cache_dir, "packed")
  more = need > have
  log(
    f"reading through the target {int(more.sum())} corpus documents up to the positions this run "
    f"uses ({int(need[more].sum())} positions; the cache holds fewer of them)"
  )
  done = teacher_forced.build(
    docs, packed, params, tcfg, layers, s.data.read_batch_tokens, log=log, want=need
  )
  # The list keeps every read-through, the cache's first build included (`read_through` is the last).
  first = [manifest["read_through"]] if "read_through" in manifest else []
  runs = manifest.get("read_throughs", first) + [done]
  manifest = {**manifest, "read_through": done, "read_throughs": runs}
  write_json_atomic(os.path.join(s.data.cache_dir, "manifest.json"), manifest)
  return _open_verified(s.data.cache_dir, tcfg, None, sealed_now=True), manifest


def _windows(store: features.FeatureStore, s: RunSettings, with_layers: bool):
  """The training and held-out windows of run `s` over `store`."""
  train_w = Windows(
    store, s.train.seq_len, False, with_layers, max_positions=s.data.train_positions or None
  )
  if s.train.first_weight != 1.0:
    train_w = train_w.weight_first(s.train.eval_first, s.train.first_weight)
  return train_w, Windows(store, s.train.seq_len, heldout=True, with_layers=with_layers)


def windows_read(s: RunSettings, store, manifest: dict, with_layers: bool, tcfg, params, log):
  """(store, manifest, training windows, held-out windows) of run `s`, after reading through the
  target the positions they use that the cache lacks (`read_documents`)."""
  train_w, eval_w = _windows(store, s, with_layers)
  need = positions_read(s.train, train_w, eval_w)
  if (need > store.read_lens).any():
    store, manifest = read_documents(s, manifest, need, store.read_lens, tcfg, params, log)
    train_w, eval_w = _windows(store, s, with_layers)
  return store, manifest, train_w, eval_w
