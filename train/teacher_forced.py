"""A feature cache made by reading documents through the target once (no decoding).

Decoding a response records features one token per target step; reading a finished document
(prompt + response) is one prefill, tens of times cheaper per position on a CPU. This module builds
a packed cache (`train.features.FeatureStore` layout) from given documents that way, e.g. the
documents of the self-distilled cache, to add the layer outputs an EAGLE-3 head fuses.

The build is resumable and extendable: chunks of documents are written into memory-mapped arrays
(their blocks allocated up front, so a full disk is an error at the start) and `present.npy`,
replaced atomically after each chunk, records which documents have features; the finished
directory records its files' sha256. A cache may hold features of some documents only (the ones a
training run reads); asking for more reads just those.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax.config import ModelConfig
from specjax.integrity import CacheError, sole_writer, write_atomic, write_json_atomic
from specjax.kv_cache import init_cache
from specjax.model import Params, forward
from train.features import (
  CHECKSUMS,
  PRESENT,
  FeatureStore,
  open_memmap_allocated,
  present_documents,
  seal,
)


@dataclasses.dataclass(frozen=True)
class Document:
  """tokens x_0..x_{L-1}; the response starts at prompt_len; prompt_index decides held-out."""

  tokens: tuple[int, ...]
  prompt_len: int
  prompt_index: int
  heldout: bool


def cache_documents(directory: str) -> list[Document]:
  """The documents of a packed cache, in its order."""
  store = FeatureStore.open(directory)
  with open(os.path.join(directory, "docs.json")) as f:
    index = json.load(f)["prompt_index"]
  return [
    Document(tuple(int(t) for t in store.tokens[s : s + n]), int(p), int(i), bool(h))
    for s, n, p, i, h in zip(
      store.doc_starts, store.doc_lens, store.prompt_lens, index, store.heldout
    )
  ]


@functools.partial(jax.jit, static_argnames=("cfg", "hidden_layers"))
def read_through(params: Params, tokens: jax.Array, cfg: ModelConfig, hidden_layers):
  """One target pass over whole documents [B, T]: (hidden [B, T, D], layers [n, B, T, D] | None).

  Position t depends on tokens[..t] only (causal attention), so right padding changes nothing and
  these equal the features recorded while decoding, up to float rounding.
  """
  B, T = tokens.shape
  cache = init_cache(cfg, B, T)
  logit_at = jnp.zeros((B, 1), jnp.int32)  # logits are not needed; compute one column
  out = forward(params, tokens, cache, cfg, hidden_layers=hidden_layers, logit_positions=logit_at)
  return out.hidden, out.layer_hidden


def _chunks(
  lens: np.ndarray, ids: np.ndarray, max_batch_tokens: int, bucket: int
) -> list[tuple[int, np.ndarray]]:
  """(padded width T, document ids) per batch over documents `ids`; one batch size per T, so one
  compile per T."""
  width = -(-lens[ids] // bucket) * bucket
  out = []
  for T in np.unique(width):
    sel = ids[width == T]
    B = max(max_batch_tokens // int(T), 1)
    out += [(int(T), sel[i : i + B]) for i in range(0, len(sel), B)]
  return out


def _docs_record(documents: Sequence[Document]) -> dict:
  return {
    "doc_lens": [len(d.tokens) for d in documents],
    "prompt_lens": [d.prompt_len for d in documents],
    "prompt_index": [d.prompt_index for d in documents],
    "heldout": [d.heldout for d in documents],
  }


def _unseal(out_dir: str, tmp: str, record: dict) -> None:
  """Moves a finished cache back to `tmp` to extend it, after checking it holds these documents."""
  with open(os.path.join(out_dir, "docs.json")) as f:
    if json.load(f) != record:
      raise CacheError(
        f"{out_dir} holds other documents than the ones asked for; delete it to rebuild it"
      )
  shutil.rmtree(tmp, ignore_errors=True)  # an earlier extension's leftovers, if any
  os.replace(out_dir, tmp)
  os.remove(os.path.join(tmp, CHECKSUMS))


def build(
  documents: Sequence[Document],
  out_dir: str,
  params: Params,
  cfg: ModelConfig,
  hidden_layers: tuple[int, ...] = (),
  max_batch_tokens: int = 4096,
  bucket: int = 128,
  log: Callable[[str], None] = print,
  want: np.ndarray | None = None,
) -> dict:
  """Reads `documents` through the target into a packed cache at `out_dir` (resumable).

  Every document's tokens are stored; features only for the documents `want` selects (default:
  all), so a training run reads through only the documents its steps and its evaluation use.
  Calling it again on a finished cache with more documents wanted extends it: the cache goes
  back to `out_dir.part` while it is read, and a killed extension resumes like a first build.

  Returns:
    {"documents", "positions" read by this call, "seconds", "positions_per_s",
     "present_documents", "present_positions" (what the cache holds now)}.
  """
  lens = np.asarray([len(d.tokens) for d in documents], np.int64)
  starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
  N, D, n_lay, M = int(lens.sum()), cfg.d_model, len(hidden_layers), len(documents)
  want = np.ones(M, bool) if want is None else np.asarray(want, bool)
  tmp = out_dir + ".part"
  record = _docs_record(documents)
  parent = os.path.dirname(os.path.abspath(out_dir))
  with sole_writer(parent, "a feature cache"):  # the cache's state is read under the lock
    if os.path.exists(out_dir):
      present = present_documents(out_dir, M)
      if not (want & ~present).any():
        return _stats(0, 0, 0.0, present, lens)
      _unseal(out_dir, tmp, record)
    fresh = not os.path.exists(os.path.join(tmp, "docs.json"))
    if fresh:
      shutil.rmtree(tmp, ignore_errors=True)
      os.makedirs(tmp)
    mm = functools.partial(open_memmap_allocated, mode="w+" if fresh else "r+")
    tokens = mm(os.path.join(tmp, "tokens.npy"), np.int32, (N,))
    hidden = mm(os.path.join(tmp, "hidden.npy"), np.float16, (N, D))
    layers = mm(os.path.join(tmp, "layers.npy"), np.float16, (n_lay, N, D)) if n_lay else None
    if fresh:
      for d, doc in enumerate(documents):
        tokens[starts[d] : starts[d] + lens[d]] = doc.tokens
      tokens.flush()
      np.save(os.path.join(tmp, PRESENT), np.zeros(M, bool))
      write_json_atomic(os.path.join(tmp, "docs.json"), record, indent=None)  # last: marks it
    present = present_documents(tmp, M)
    chunks = _chunks(lens, np.flatnonzero(want & ~present), max_batch_tokens, bucket)
    t0, new = time.time(), 0
    for c, (T, ids) in enumerate(chunks):
      batch = np.zeros((max(max_batch_tokens // T, 1), T), np.int32)
      for r, d in enumerate(ids):
        batch[r, : lens[d]] = documents[d].tokens
      hid, lay = read_through(params, jnp.asarray(batch), cfg, tuple(hidden_layers))
      hid = np.asarray(hid, np.float16)
      lay = None if lay is None else np.asarray(lay, np.float16)
      for r, d in enumerate(ids):
        s, n = starts[d], lens[d]
        hidden[s : s + n] = hid[r, :n]
        if layers is not None:
          layers[:, s : s + n] = lay[:, r, :n]
      for a in (hidden, layers):
        if a is not None:
          a.flush()
      present[ids] = True
      write_atomic(os.path.join(tmp, PRESENT), lambda f: np.save(f, present))
      new += int(lens[ids].sum())
      rate = new / (time.time() - t0)
      left = sum(int(lens[i].sum()) for _, i in chunks[c + 1 :])
      log(
        f"read-through: chunk {c + 1}/{len(chunks)} ({rate:.0f} positions/s) ETA {left / rate / 60:.1f} min"
      )
    del tokens, hidden, layers
    seal(tmp)
    os.replace(tmp, out_dir)
  seconds = time.time() - t0
  return _stats(sum(len(i) for _, i in chunks), new, seconds, present, lens)


def _stats(n_docs: int, positions: int, seconds: float, present: np.ndarray, lens: np.ndarray):
  return {
    "documents": n_docs,
    "positions": positions,
    "seconds": seconds,
    "positions_per_s": positions / max(seconds, 1e-9),
    "present_documents": int(present.sum()),
    "present_positions": int(lens[present].sum()),
  }
