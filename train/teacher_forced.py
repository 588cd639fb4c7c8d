"""A feature cache made by reading documents through the target once (no decoding).

Decoding a response records features one token per target step; reading a finished document
(prompt + response) is one prefill, tens of times cheaper per position on a CPU. This module builds
a packed cache (`train.features.FeatureStore` layout) from given documents that way, e.g. the
documents of the self-distilled cache, to add the layer outputs an EAGLE-3 head fuses.

The build is resumable and extendable: chunks of documents are written into memory-mapped arrays
(their blocks allocated up front, so a full disk is an error at the start) and `read_lens.npy`,
replaced atomically after each chunk, records how many positions of each document (from its start)
have features; the finished directory records its files' sha256. A cache may hold features of
document prefixes only (the ones a training run reads: features at position t depend on the
positions up to t alone); asking for more reads just those documents, up to where they are needed.
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
  READ_LENS,
  FeatureStore,
  open_memmap_allocated,
  read_lengths,
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
  """(padded width T, document ids) per batch over documents `ids` read `lens` positions each; one
  batch size per T, so one compile per T."""
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

  Every document's tokens are stored; features only of the first `want[d]` positions of each
  document d (default: all of them), so a training run reads only the prefixes its windows use.
  Calling it again on a finished cache with more wanted extends it (a document is read again from
  its start, up to the new length): the cache goes back to `out_dir.part` while it is read, and a
  killed extension resumes like a first build.

  Returns:
    {"documents", "positions" read by this call, "seconds", "positions_per_s",
     "read_documents", "read_positions" (what the cache holds now)}.
  """
  lens = np.asarray([len(d.tokens) for d in documents], np.int64)
  starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
  N, D, n_lay, M = int(lens.sum()), cfg.d_model, len(hidden_layers), len(documents)
  want = lens if want is None else np.minimum(np.asarray(want, np.int64), lens)
  tmp = out_dir + ".part"
  record = _docs_record(documents)
  parent = os.path.dirname(os.path.abspath(out_dir))
  with sole_writer(parent, "a feature cache"):  # the cache's state is read under the lock
    if os.path.exists(out_dir):
      have = read_lengths(out_dir, lens)
      if not (want > have).any():
        return _stats(0, 0, 0.0, have)
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
      np.save(os.path.join(tmp, READ_LENS), np.zeros(M, np.int64))
      write_json_atomic(os.path.join(tmp, "docs.json"), record, indent=None)  # last: marks it
    have = read_lengths(tmp, lens)
    chunks = _chunks(want, np.flatnonzero(want > have), max_batch_tokens, bucket)
    t0, new = time.time(), 0
    for c, (T, ids) in enumerate(chunks):
      batch = np.zeros((max(max_batch_tokens // T, 1), T), np.int32)
      for r, d in enumerate(ids):
        batch[r, : want[d]] = documents[d].tokens[: want[d]]
      hid, lay = read_through(params, jnp.asarray(batch), cfg, tuple(hidden_layers))
      hid = np.asarray(hid, np.float16)
      lay = None if lay is None else np.asarray(lay, np.float16)
      for r, d in enumerate(ids):
        s, n = starts[d], want[d]
        hidden[s : s + n] = hid[r, :n]
        if layers is not None:
          layers[:, s : s + n] = lay[:, r, :n]
      for a in (hidden, layers):
        if a is not None:
          a.flush()
      have[ids] = want[ids]
      write_atomic(os.path.join(tmp, READ_LENS), lambda f: np.save(f, have))
      new += int(want[ids].sum())
      rate = new / (time.time() - t0)
      left = sum(int(want[i].sum()) for _, i in chunks[c + 1 :])
      log(
        f"read-through: chunk {c + 1}/{len(chunks)} ({rate:.0f} positions/s) ETA {left / rate / 60:.1f} min"
      )
    del tokens, hidden, layers
    seal(tmp)
    os.replace(tmp, out_dir)
  seconds = time.time() - t0
  return _stats(sum(len(i) for _, i in chunks), new, seconds, have)


def _stats(n_docs: int, positions: int, seconds: float, have: np.ndarray) -> dict:
  return {
    "documents": n_docs,
    "positions": positions,
    "seconds": seconds,
    "positions_per_s": positions / max(seconds, 1e-9),
    "read_documents": int((have > 0).sum()),
    "read_positions": int(have.sum()),
  }
