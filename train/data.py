"""Fixed-length training windows over the feature cache, in a resumable deterministic order.

Documents (prompt + the target's response) are laid back to back and cut into windows of T
positions; a window may span documents, so each position carries its document id (attention and
shifted targets never cross documents) and its position within the document (RoPE). Training and
held-out documents form separate streams. The batch for step s is a pure function of
(seed, s): epoch e = s * B // n_windows uses permutation `rng(seed, e)`, so a resumed run reads the
same batches as an uninterrupted one.
"""

from __future__ import annotations

import copy
import dataclasses
import functools

import jax
import numpy as np

from train.features import FeatureStore


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Batch:
  """B windows of T positions.

  Attributes:
    tokens: [B, T] int32 x_t.
    hidden: [B, T, D] float32 target features h_t.
    layers: [n, B, T, D] float32 target layer outputs, or None.
    doc: [B, T] int32 document id (-1 for padding).
    pos: [B, T] int32 position within the document.
    response: [B, T] bool, x_{t+1} is a response token (the target generated it).
    weight: [B, T] float32 loss weight of the term predicting x_{t+1}, or None (all 1).
  """

  tokens: jax.Array
  hidden: jax.Array
  layers: jax.Array | None
  doc: jax.Array
  pos: jax.Array
  response: jax.Array
  weight: jax.Array | None = None


def _stream(store: FeatureStore, heldout: bool):
  """Flat positions of the chosen documents with their doc ids, in-doc positions, response flags."""
  idx, doc, pos, resp = [], [], [], []
  for d in np.flatnonzero(store.heldout == heldout):
    s, n, p = store.doc_starts[d], store.doc_lens[d], store.prompt_lens[d]
    t = np.arange(n)
    idx.append(s + t)
    doc.append(np.full(n, d))
    pos.append(t)
    resp.append(t >= p - 1)
  if not idx:
    raise ValueError(f"no {'held-out' if heldout else 'training'} documents in the feature cache")
  cat = lambda xs, dt: np.concatenate(xs).astype(dt)  # noqa: E731
  return cat(idx, np.int64), cat(doc, np.int32), cat(pos, np.int32), cat(resp, bool)


class Windows:
  """The windows of one stream (training or held-out).

  Args:
    store: the feature cache.
    seq_len: T.
    heldout: which documents.
    with_layers: also read the stored layer outputs.
    max_positions: keep only the stream's first that many positions (a data-scaling subset).
  """

  def __init__(
    self,
    store: FeatureStore,
    seq_len: int,
    heldout: bool,
    with_layers: bool = False,
    max_positions: int | None = None,
  ):
    self.store, self.T, self.with_layers = store, seq_len, with_layers
    if with_layers and store.layers is None:
      raise ValueError("the feature cache has no layer outputs; rebuild it with hidden_layers")
    stream = _stream(store, heldout)
    if max_positions is not None:
      if max_positions > len(stream[0]):
        raise ValueError(
          f"asked for {max_positions} training positions; the cache has {len(stream[0])}"
        )
      stream = tuple(a[:max_positions] for a in stream)
    self.idx, self.doc, self.pos, self.resp = stream
    self.weight = None  # loss weights (`weight_first`); None: every position alike
    self.n_windows = max(len(self.idx) // seq_len, 1)

  def _opening(self, n: int) -> np.ndarray:
    """Positions whose next token is one of its response's first n tokens."""
    return self.resp & (self.pos + 1 - self.store.prompt_lens[self.doc] < n)

  def first_response_tokens(self, n: int) -> Windows:
    """The same windows with only each response's first n tokens scored: a position's response
    flag stays set when its next token is one of them (decoding a few dozen tokens sees these,
    whose held-out agreement is well below that of later ones)."""
    early = copy.copy(self)
    early.resp = self._opening(n)
    return early

  def weight_first(self, n: int, w: float) -> Windows:
    """The same windows with the loss terms of each response's first n tokens weighted w against
    1 for later ones: training leans towards the openings that short decodes see."""
    weighted = copy.copy(self)
    weighted.weight = np.where(self._opening(n), np.float32(w), np.float32(1.0))
    return weighted

  @property
  def n_positions(self) -> int:
    return len(self.idx)

  def positions_needed(self, windows) -> np.ndarray:
    """[documents] int64: for each document, how many of its positions from its start windows
    `windows` need features of (0: none)."""
    need = np.zeros(len(self.store.doc_lens), np.int64)
    for w in np.asarray(windows, np.int64):
      sl = slice(w * self.T, (w + 1) * self.T)
      np.maximum.at(need, self.doc[sl], self.pos[sl].astype(np.int64) + 1)
    return need

  def window(self, w: int) -> dict[str, np.ndarray]:
    lo, T = w * self.T, self.T
    sl = slice(lo, lo + T)
    n = len(self.idx[sl])
    missing = np.unique(self.doc[sl][self.pos[sl] >= self.store.read_lens[self.doc[sl]]])
    if len(missing):
      raise ValueError(
        f"window {w} reads positions of documents {missing[:4].tolist()} whose features the "
        "feature cache has not read through the target (it holds what earlier runs used); train "
        "through train/main.py, which reads what a run needs first"
      )
    pad = lambda a, v: np.concatenate([a, np.full((T - n,) + a.shape[1:], v, a.dtype)])  # noqa: E731
    out = {
      "tokens": pad(self.store.tokens[self.idx[sl]].astype(np.int32), 0),
      "hidden": pad(self.store.hidden[self.idx[sl]].astype(np.float32), 0.0),
      "doc": pad(self.doc[sl], -1),
      "pos": pad(self.pos[sl], 0),
      "response": pad(self.resp[sl], False),
    }
    if self.weight is not None:
      out["weight"] = pad(self.weight[sl], 0.0)
    if self.with_layers:
      lay = self.store.layers[:, self.idx[sl]].astype(np.float32)
      out["layers"] = np.concatenate([lay, np.zeros((lay.shape[0], T - n, lay.shape[2]))], 1)
    return out

  def batch(self, windows) -> Batch:
    ws = [self.window(int(w)) for w in windows]
    stack = {k: np.stack([w[k] for w in ws]) for k in ws[0]}
    layers = np.moveaxis(stack["layers"], 1, 0).astype(np.float32) if self.with_layers else None
    return Batch(
      stack["tokens"],
      stack["hidden"],
      layers,
      stack["doc"],
      stack["pos"],
      stack["response"],
      stack.get("weight"),
    )


@functools.lru_cache(maxsize=4)
def _permutation(n_windows: int, seed: int, epoch: int) -> np.ndarray:
  return np.random.default_rng([seed, epoch]).permutation(n_windows)


def step_windows(n_windows: int, batch_size: int, seed: int, step: int) -> np.ndarray:
  """Window ids of training step `step`: a fresh permutation per epoch, a pure function of step."""
  ids = [divmod(j, n_windows) for j in range(step * batch_size, (step + 1) * batch_size)]
  return np.asarray([_permutation(n_windows, seed, e)[i] for e, i in ids])
