"""A feature cache made by reading documents through the target once (no decoding).

Decoding a response records features one token per target step; reading a finished document
(prompt + response) is one prefill, tens of times cheaper per position on a CPU. This module builds
a packed cache (`train.features.FeatureStore` layout) from given documents that way, e.g. the
documents of the self-distilled cache, to add the layer outputs an EAGLE-3 head fuses.

The build is resumable: chunks of documents are written in order into memory-mapped arrays (their
blocks allocated up front, so a full disk is an error at the start) and a progress file, replaced
atomically, records how many chunks are done; the finished directory records its files' sha256.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax.config import ModelConfig
from specjax.integrity import sole_writer, write_json_atomic
from specjax.kv_cache import init_cache
from specjax.model import Params, forward
from train.features import FeatureStore, open_memmap_allocated, seal


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


def _chunks(lens: np.ndarray, max_batch_tokens: int, bucket: int) -> list[tuple[int, np.ndarray]]:
  """(padded width T, document ids) per batch; one batch size per T, so one compile per T."""
  width = -(-lens // bucket) * bucket
  out = []
  for T in np.unique(width):
    ids = np.flatnonzero(width == T)
    B = max(max_batch_tokens // int(T), 1)
    out += [(int(T), ids[i : i + B]) for i in range(0, len(ids), B)]
  return out


def build(
  documents: Sequence[Document],
  out_dir: str,
  params: Params,
  cfg: ModelConfig,
  hidden_layers: tuple[int, ...] = (),
  max_batch_tokens: int = 4096,
  bucket: int = 128,
  log: Callable[[str], None] = print,
) -> dict:
  """Reads `documents` through the target into a packed cache at `out_dir` (resumable).

  Returns:
    {"positions", "seconds" (this process), "positions_per_s"}.
  """
  lens = np.asarray([len(d.tokens) for d in documents], np.int64)
  starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
  N, D, n_lay = int(lens.sum()), cfg.d_model, len(hidden_layers)
  tmp = out_dir + ".part"
  progress_path = os.path.join(tmp, "progress.json")
  chunks = _chunks(lens, max_batch_tokens, bucket)
  with sole_writer(tmp, "a feature cache"):  # progress is read under the lock
    done = 0
    if os.path.exists(progress_path):
      with open(progress_path) as f:
        done = json.load(f)["chunks_done"]
    mode = "r+" if done else "w+"
    mm = functools.partial(open_memmap_allocated, mode=mode)
    tokens = mm(os.path.join(tmp, "tokens.npy"), np.int32, (N,))
    hidden = mm(os.path.join(tmp, "hidden.npy"), np.float16, (N, D))
    layers = mm(os.path.join(tmp, "layers.npy"), np.float16, (n_lay, N, D)) if n_lay else None
    t0, new = time.time(), 0
    for c in range(done, len(chunks)):
      T, ids = chunks[c]
      batch = np.zeros((max(max_batch_tokens // T, 1), T), np.int32)
      for r, d in enumerate(ids):
        batch[r, : lens[d]] = documents[d].tokens
      hid, lay = read_through(params, jnp.asarray(batch), cfg, tuple(hidden_layers))
      hid = np.asarray(hid, np.float16)
      lay = None if lay is None else np.asarray(lay, np.float16)
      for r, d in enumerate(ids):
        s, n = starts[d], lens[d]
        tokens[s : s + n] = batch[r, :n]
        hidden[s : s + n] = hid[r, :n]
        if layers is not None:
          layers[:, s : s + n] = lay[:, r, :n]
      for a in (tokens, hidden, layers):
        if a is not None:
          a.flush()
      write_json_atomic(progress_path, {"chunks_done": c + 1})
      new += int(lens[ids].sum())
      rate = new / (time.time() - t0)
      left = (
        int(lens[[d for _, i in chunks[c + 1 :] for d in i]].sum()) if c + 1 < len(chunks) else 0
      )
      log(
        f"read-through: chunk {c + 1}/{len(chunks)} ({rate:.0f} positions/s) ETA {left / rate / 60:.1f} min"
      )
    docs = {
      "doc_lens": lens.tolist(),
      "prompt_lens": [d.prompt_len for d in documents],
      "prompt_index": [d.prompt_index for d in documents],
      "heldout": [d.heldout for d in documents],
    }
    write_json_atomic(os.path.join(tmp, "docs.json"), docs, indent=None)
    os.remove(progress_path)
    del tokens, hidden, layers
    seal(tmp)
    os.replace(tmp, out_dir)
  seconds = time.time() - t0
  return {"positions": N, "seconds": seconds, "positions_per_s": new / max(seconds, 1e-9)}
