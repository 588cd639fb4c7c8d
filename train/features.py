"""Self-distilled training data with the target's features, cached on disk.

The frozen target answers each training prompt greedily; while it decodes, the loop records its
final (post-norm) hidden state and the outputs of chosen layers at every position it feeds. One
pass therefore yields both the text (the target's own responses) and every feature a drafter
trains on, so the 30-layer target never runs during drafter training.

Layout: a document is one prompt and its response, tokens x_0..x_{L-1} with features h_0..h_{L-1},
where h_t is the target's state after reading x_0..x_t (so lm_head(h_t) is its distribution for
x_{t+1}). The final generated token is not stored (it was never fed); its identity is
argmax lm_head(h_{L-1}). Shards (one .npz per generated batch, written atomically) make the build
resumable; `pack` concatenates them into flat memory-mapped arrays read by `FeatureStore`, records
every packed file's sha256 (`seal`) and renames the directory into place only when complete.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import json
import os
import shutil
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax.config import ModelConfig
from specjax.generate import init_sequence, is_stop, pad_prompts, prefill
from specjax.integrity import (
  CacheError,
  file_records,
  named_os_error,
  verify_files,
  write_atomic,
  write_json_atomic,
)
from specjax.model import Params, forward
from train.prompts import TrainPrompt


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
  """How the cache is generated.

  Attributes:
    hidden_layers: target layers whose outputs are stored besides the final hidden state.
    max_new_tokens: response budget per prompt.
    batch_size: prompts decoded together.
    max_tokens: stop once this many positions are stored (bounds the cache on disk).
  """

  hidden_layers: tuple[int, ...] = ()
  max_new_tokens: int = 256
  batch_size: int = 24
  max_tokens: int = 400_000


@functools.partial(jax.jit, static_argnames=("cfg", "max_new", "stop_tokens", "hidden_layers"))
def generate_with_features(
  params: Params,
  prompts: jax.Array,
  prompt_lens: jax.Array,
  cfg: ModelConfig,
  max_new: int,
  stop_tokens: tuple[int, ...],
  hidden_layers: tuple[int, ...] = (),
):
  """Greedy decoding that records the target's features at every fed position.

  Returns:
    (seq [B, S], seq_len [B], hidden [B, S, D], layer_hidden [n, B, S, D] or None); the first
    seq_len - 1 positions of each row carry features (the last token was never fed).
  """
  B, Tp = prompts.shape
  S = Tp + max_new
  pre = prefill(params, cfg, prompts, prompt_lens, S, hidden_layers)
  hid = jnp.zeros((B, S, cfg.d_model), jnp.float32).at[:, :Tp].set(pre.hidden)
  lay = None
  if hidden_layers:
    lay = jnp.zeros((len(hidden_layers), B, S, cfg.d_model), jnp.float32)
    lay = lay.at[:, :, :Tp].set(pre.layer_hidden)
  first = jnp.argmax(pre.logits, -1).astype(jnp.int32)
  seq = init_sequence(prompts, prompt_lens, S).at[jnp.arange(B), prompt_lens].set(first)
  done = is_stop(first, stop_tokens) | (max_new <= 1)
  rows = jnp.arange(B)

  def body(s):
    seq, seq_len, cache, hid, lay, done = s
    last = jnp.take_along_axis(seq, (seq_len - 1)[:, None], 1)
    out = forward(params, last, cache, cfg, hidden_layers=hidden_layers)
    hid = hid.at[rows, seq_len - 1].set(out.hidden[:, 0])
    if lay is not None:
      lay = lay.at[:, rows, seq_len - 1].set(out.layer_hidden[:, :, 0])
    nxt = jnp.argmax(out.logits[:, 0], -1).astype(jnp.int32)
    live = ~done
    pos = jnp.minimum(seq_len, S - 1)
    seq = seq.at[rows, pos].set(jnp.where(live, nxt, seq[rows, pos]))
    seq_len = seq_len + live
    done = done | (live & is_stop(nxt, stop_tokens)) | (seq_len - prompt_lens >= max_new)
    return seq, seq_len, out.cache.with_lengths(seq_len - 1), hid, lay, done

  init = (seq, prompt_lens + 1, pre.cache, hid, lay, done)
  seq, seq_len, _, hid, lay, _ = jax.lax.while_loop(lambda s: ~jnp.all(s[-1]), body, init)
  return seq, seq_len, hid, lay


def _batches(prompts: Sequence[TrainPrompt], batch_size: int) -> list[list[int]]:
  """Prompt indices per batch, in prompt order; each run of 4 batches is sorted by length."""
  out = []
  group = 4 * batch_size
  for g in range(0, len(prompts), group):
    idx = sorted(range(g, min(g + group, len(prompts))), key=lambda i: len(prompts[i].tokens))
    out += [idx[i : i + batch_size] for i in range(0, len(idx), batch_size)]
  return out


def _write_npz(path: str, **arrays) -> None:
  """Writes a shard atomically (`specjax.integrity.write_atomic`): a shard that exists is complete."""
  write_atomic(path, lambda f: np.savez(f, **arrays))


CHECKSUMS = "checksums.json"


def seal(directory: str) -> None:
  """Records the size and sha256 of every file of a finished packed cache in `checksums.json`
  (call it before the directory is renamed into place; `verify_sealed` checks it on use)."""
  names = [n for n in os.listdir(directory) if n != CHECKSUMS]
  write_json_atomic(os.path.join(directory, CHECKSUMS), file_records(directory, names))


def verify_sealed(directory: str, fix: str) -> None:
  """Checks a packed cache against its `checksums.json`.

  Raises:
    CacheError: for a missing checksums file (an unfinished or old cache) or a changed file.
  """
  path = os.path.join(directory, CHECKSUMS)
  try:
    with open(path) as f:
      records = json.load(f)
  except (OSError, ValueError) as e:
    raise CacheError(
      f"{path} is missing or unreadable ({e}); the cache is unverifiable; {fix}"
    ) from e
  verify_files(directory, records, fix)


def open_memmap_allocated(path: str, dtype, shape: tuple[int, ...], mode: str = "w+"):
  """`np.lib.format.open_memmap`, with the file's blocks allocated up front when it is created:
  a full disk is then an OSError here, not a SIGBUS on some later write into the mapping."""
  arr = np.lib.format.open_memmap(path, mode=mode, dtype=dtype, shape=shape)
  if mode == "w+":
    fd = os.open(path, os.O_RDWR)
    try:
      os.posix_fallocate(fd, 0, os.path.getsize(path))
    except OSError as e:
      raise named_os_error(e, path) from e
    finally:
      os.close(fd)
  return arr


def build_shards(
  params: Params,
  cfg: ModelConfig,
  prompts: Sequence[TrainPrompt],
  stop_tokens: tuple[int, ...],
  spec: FeatureSpec,
  out_dir: str,
  heldout: int,
  log: Callable[[str], None] = print,
) -> int:
  """Generates shards into `out_dir`, skipping those already there; returns positions stored.

  Batch i holds prompts `_batches(...)[i]`; a document is held out when its prompt index is below
  `heldout` (the prompt list's held-out front).
  """
  os.makedirs(out_dir, exist_ok=True)
  batches = _batches(prompts, spec.batch_size)
  stored, t0, new = 0, time.time(), 0
  for i, idx in enumerate(batches):
    path = os.path.join(out_dir, f"shard_{i:05d}.npz")
    if os.path.exists(path):
      with np.load(path) as z:
        stored += int(z["doc_lens"].sum())
      continue
    if stored >= spec.max_tokens:
      break
    t_batch = time.time()
    P, L = pad_prompts([list(prompts[j].tokens) for j in idx], bucket=32)
    seq, seq_len, hid, lay = generate_with_features(
      params, P, L, cfg, spec.max_new_tokens, stop_tokens, spec.hidden_layers
    )
    seq, lens = np.asarray(seq), np.asarray(seq_len) - 1
    hid = np.asarray(hid, np.float16)
    lay = None if lay is None else np.asarray(lay, np.float16)
    arrays = dict(
      tokens=np.concatenate([seq[b, : lens[b]] for b in range(len(idx))]).astype(np.int32),
      hidden=np.concatenate([hid[b, : lens[b]] for b in range(len(idx))]),
      doc_lens=lens.astype(np.int64),
      prompt_lens=np.asarray(L, np.int64),
      prompt_index=np.asarray(idx, np.int64),
      heldout=np.asarray([j < heldout for j in idx]),
      gen_s=np.asarray(time.time() - t_batch),
    )
    if lay is not None:
      arrays["layers"] = np.concatenate([lay[:, b, : lens[b]] for b in range(len(idx))], 1)
    _write_npz(path, **arrays)
    stored += int(lens.sum())
    new += int(lens.sum())
    rate = new / (time.time() - t0)
    left = min(spec.max_tokens - stored, sum(len(b) for b in batches[i + 1 :]) * 300)
    log(
      f"features: batch {i + 1}/{len(batches)} positions {stored} ({rate:.0f}/s) "
      f"ETA {max(left, 0) / max(rate, 1e-9) / 60:.1f} min"
    )
  return stored


def pack(shard_dir: str, out_dir: str) -> float | None:
  """Concatenates shards into flat arrays: tokens [N], hidden [N, D], layers [n, N, D], docs.json.

  Returns the seconds the shards took to generate (None if a shard did not record it).
  """
  paths = sorted(glob.glob(os.path.join(shard_dir, "shard_*.npz")))
  if not paths:
    raise FileNotFoundError(f"no shards in {shard_dir}")
  metas = []
  for p in paths:
    with np.load(p) as z:
      metas.append({k: z[k] for k in ("doc_lens", "prompt_lens", "prompt_index", "heldout")})
      metas[-1]["D"] = z["hidden"].shape[1]
      metas[-1]["n_layers"] = z["layers"].shape[0] if "layers" in z else 0
      metas[-1]["gen_s"] = float(z["gen_s"]) if "gen_s" in z else None
  N = int(sum(m["doc_lens"].sum() for m in metas))
  D, n_lay = metas[0]["D"], min(m["n_layers"] for m in metas)  # layers only if every shard has them
  tmp = out_dir + ".part"
  shutil.rmtree(tmp, ignore_errors=True)
  os.makedirs(tmp)
  try:
    mm = open_memmap_allocated
    tokens = mm(os.path.join(tmp, "tokens.npy"), np.int32, (N,))
    hidden = mm(os.path.join(tmp, "hidden.npy"), np.float16, (N, D))
    layers = mm(os.path.join(tmp, "layers.npy"), np.float16, (n_lay, N, D)) if n_lay else None
    at = 0
    for p in paths:
      with np.load(p) as z:
        n = z["tokens"].shape[0]
        tokens[at : at + n] = z["tokens"]
        hidden[at : at + n] = z["hidden"]
        if layers is not None:
          layers[:, at : at + n] = z["layers"][:n_lay]
        at += n
    for a in (tokens, hidden, layers):
      if a is not None:
        a.flush()
    docs = {
      k: np.concatenate([m[k] for m in metas]).tolist()
      for k in ("doc_lens", "prompt_lens", "prompt_index", "heldout")
    }
    write_json_atomic(os.path.join(tmp, "docs.json"), docs, indent=None)
    del tokens, hidden, layers
    seal(tmp)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)  # frees the space; the shards are kept
    raise
  os.replace(tmp, out_dir)
  times = [m["gen_s"] for m in metas]
  return None if None in times else float(sum(times))


READ_LENS = "read_lens.npy"


def read_lengths(directory: str, doc_lens: np.ndarray) -> np.ndarray:
  """[M] int64: how many positions of each document, from its start, a packed cache holds
  features of (every position in a cache written without `read_lens.npy`: one built in full)."""
  path = os.path.join(directory, READ_LENS)
  if not os.path.exists(path):
    return np.asarray(doc_lens, np.int64).copy()
  read = np.load(path)
  if read.shape != doc_lens.shape or (read < 0).any() or (read > doc_lens).any():
    raise CacheError(
      f"{path} does not fit the cache's {len(doc_lens)} documents and their lengths; delete "
      f"{directory} to rebuild it"
    )
  return read.astype(np.int64)


@dataclasses.dataclass
class FeatureStore:
  """The packed cache, memory-mapped.

  Attributes:
    tokens: [N] int32 tokens of every document, back to back.
    hidden: [N, D] float16 final hidden states (h_t after reading tokens[..t]).
    layers: [n, N, D] float16 outputs of `hidden_layers`, or None.
    doc_starts: [M] first position of each document.
    doc_lens: [M] positions per document.
    prompt_lens: [M] prompt positions per document (responses start there).
    heldout: [M] bool, documents reserved for evaluation.
    read_lens: [M] positions of each document, from its start, whose features were read
      (`train.teacher_forced` reads only what a run uses; every document's tokens are there).
  """

  tokens: np.ndarray
  hidden: np.ndarray
  layers: np.ndarray | None
  doc_starts: np.ndarray
  doc_lens: np.ndarray
  prompt_lens: np.ndarray
  heldout: np.ndarray
  read_lens: np.ndarray

  @classmethod
  def open(cls, directory: str, n_heldout: int | None = None) -> FeatureStore:
    """Memory-maps a packed cache; documents of the first `n_heldout` prompts are held out
    (default: the split recorded when the shards were generated)."""
    with open(os.path.join(directory, "docs.json")) as f:
      docs = json.load(f)
    heldout = np.asarray(docs["heldout"], bool)
    if n_heldout is not None:
      heldout = np.asarray(docs["prompt_index"]) < n_heldout
    lay_path = os.path.join(directory, "layers.npy")
    lens = np.asarray(docs["doc_lens"], np.int64)
    return cls(
      tokens=np.load(os.path.join(directory, "tokens.npy"), mmap_mode="r"),
      hidden=np.load(os.path.join(directory, "hidden.npy"), mmap_mode="r"),
      layers=np.load(lay_path, mmap_mode="r") if os.path.exists(lay_path) else None,
      doc_starts=np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64),
      doc_lens=lens,
      prompt_lens=np.asarray(docs["prompt_lens"], np.int64),
      heldout=heldout,
      read_lens=read_lengths(directory, lens),
    )

  @property
  def n_positions(self) -> int:
    return int(self.tokens.shape[0])

  def token_counts(self, vocab_size: int, responses_only: bool = False) -> np.ndarray:
    """How often each token id occurs in training (not held-out) documents."""
    counts = np.zeros(vocab_size, np.int64)
    for s, n, p, h in zip(self.doc_starts, self.doc_lens, self.prompt_lens, self.heldout):
      if not h:
        lo = s + (p if responses_only else 0)
        counts += np.bincount(self.tokens[lo : s + n], minlength=vocab_size)
    return counts
