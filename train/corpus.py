"""The self-distillation data engine: the frozen target answers training prompts, at scale.

The target decodes greedily with continuous batching: B slots decode in one compiled loop for a
chunk of steps; between chunks the host takes out every finished document and refills free slots,
G at a time, with the next prompts (one prefill over the G prompts, written into their slots). So
no slot idles for long on a short answer while a long one finishes, which a static batch would do.

Only tokens are recorded (what training needs that cannot be recomputed cheaply: one read-through
prefill per document, `train.teacher_forced`, gives any layer's features later). Documents go into
shards written atomically (`shard_*.npz`), each holding finished documents only; a restart skips
every prompt already in a shard and regenerates those that were in flight, so a SIGKILL loses no
finished document and duplicates none. `pack_corpus` turns the shards into one compressed file
(token ids as uint16, prompt sha256s, sources, the recipe and a sha256) small enough to commit.

Command line (resumable; rerun the same command after an interruption):

    python -m train.corpus --out=$SPECJAX_CACHE/corpus/smollm2-sd-v1 --max_tokens=1200000
    python -m train.corpus --out=... --pack=train/corpora/smollm2-sd-v1.npz
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax.config import ModelConfig
from specjax.generate import init_sequence, is_stop, prefill
from specjax.integrity import sole_writer, write_atomic, write_json_atomic
from specjax.kv_cache import KVCache, init_cache
from specjax.model import Params, forward
from train.prompts import TrainPrompt

# The newest committed corpus (`pack_corpus` wrote it); its held-out documents (v1's and 40 of each
# task) were held out from every shipped drafter, whether trained on it or on v1.
SHIPPED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpora", "smollm2-sd-v2.npz")

CORPUS_VERSION = 1

# The prompt recipe (`train.prompts.PromptRecipe` fields): every ShareGPT first turn and GSM8K
# train question that passes the filters, evaluation prompts excluded, shuffled together; the list
# front is answered first, so any prefix of the corpus is a fair sample of the whole.
RECIPE = dict(n_sharegpt=100_000, n_gsm8k=100_000, min_tokens=16, max_tokens=384, seed=1)


@dataclasses.dataclass(frozen=True)
class EngineSettings:
  """How the target decodes (static; recorded in the corpus manifest).

  Attributes:
    batch: B slots decoded together.
    refill: G, slots refilled together (one prefill over G prompts).
    chunk_steps: decode steps between host visits.
    max_new_tokens: response budget per prompt (responses stop earlier at a stop token).
    prompt_bucket: prompt widths are padded to a multiple of this for the refill prefill.
  """

  batch: int = 64
  refill: int = 8
  chunk_steps: int = 32
  max_new_tokens: int = 512
  prompt_bucket: int = 64


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Slots:
  """The decode batch: B slots, each holding one document in progress (or none).

  Attributes:
    seq: [B, S] prompt then response tokens.
    seq_len: [B] valid tokens; the cache holds seq[:, :seq_len - 1].
    prompt_len: [B] prompt tokens.
    cache: the target's per-row cache.
    done: [B] bool, the row's document is finished (or the slot is empty).
  """

  seq: jax.Array
  seq_len: jax.Array
  prompt_len: jax.Array
  cache: KVCache
  done: jax.Array


def empty_slots(cfg: ModelConfig, batch: int, capacity: int) -> Slots:
  """B empty slots of `capacity` tokens each (every slot done)."""
  z = jnp.zeros((batch,), jnp.int32)
  seq = jnp.zeros((batch, capacity), jnp.int32)
  return Slots(seq, z + 1, z, init_cache(cfg, batch, capacity), jnp.ones((batch,), bool))


@functools.partial(
  jax.jit, static_argnames=("cfg", "max_new", "stop_tokens"), donate_argnames=("slots",)
)
def refill(params, slots: Slots, rows, prompts, prompt_lens, cfg, max_new, stop_tokens) -> Slots:
  """Starts G new documents in slots `rows` [G] (row index B = no prompt: dropped).

  Args:
    params: target weights.
    slots: the batch.
    rows: [G] int32 slot indices; entries equal to B are ignored.
    prompts: [G, W] right-padded prompts; prompt_lens [G].
    cfg: target config; max_new: response budget; stop_tokens: ids that end a response.
  """
  W = prompts.shape[1]
  pre = prefill(params, cfg, prompts, prompt_lens, W)
  first = jnp.argmax(pre.logits, -1).astype(jnp.int32)
  seq = init_sequence(prompts, prompt_lens, slots.seq.shape[1])
  seq = seq.at[jnp.arange(rows.shape[0]), prompt_lens].set(first)
  put = lambda buf, new: buf.at[rows].set(new, mode="drop")
  put_kv = lambda buf, new: buf.at[:, rows, :W].set(new.astype(buf.dtype), mode="drop")
  cache = KVCache(
    put_kv(slots.cache.k, pre.cache.k),
    put_kv(slots.cache.v, pre.cache.v),
    put(slots.cache.lengths, prompt_lens),
  )
  done = is_stop(first, stop_tokens) | (max_new <= 1)
  return Slots(
    put(slots.seq, seq), put(slots.seq_len, prompt_lens + 1), put(slots.prompt_len, prompt_lens),
    cache, put(slots.done, done),
  )  # fmt: skip


@functools.partial(
  jax.jit, static_argnames=("cfg", "steps", "max_new", "stop_tokens"), donate_argnames=("slots",)
)
def decode(params, slots: Slots, cfg, steps, max_new, stop_tokens) -> Slots:
  """Up to `steps` greedy AR steps of every live slot (stops early when all are done)."""
  B, S = slots.seq.shape
  rows = jnp.arange(B)

  def body(carry):
    s, i = carry
    last = jnp.take_along_axis(s.seq, (s.seq_len - 1)[:, None], 1)
    out = forward(params, last, s.cache, cfg)
    nxt = jnp.argmax(out.logits[:, 0], -1).astype(jnp.int32)
    live = ~s.done
    pos = jnp.minimum(s.seq_len, S - 1)
    seq = s.seq.at[rows, pos].set(jnp.where(live, nxt, s.seq[rows, pos]))
    seq_len = s.seq_len + live
    done = s.done | (live & is_stop(nxt, stop_tokens)) | (seq_len - s.prompt_len >= max_new)
    cache = out.cache.with_lengths(seq_len - 1)
    return Slots(seq, seq_len, s.prompt_len, cache, done), i + 1

  def cond(carry):
    s, i = carry
    return (i < steps) & ~jnp.all(s.done)

  return jax.lax.while_loop(cond, body, (slots, jnp.int32(0)))[0]


@dataclasses.dataclass
class Document:
  """One finished answer: `tokens` = prompt then response; the first `prompt_len` are the prompt."""

  prompt_index: int
  tokens: np.ndarray
  prompt_len: int
  stopped: bool  # ended at a stop token (False: cut at the budget)


def _order_for_refill(queue: list[int], lengths: Sequence[int], g: int) -> list[int]:
  """Sorts each window of 4G queued prompts by length, so a refill group pads little."""
  out = []
  for w in range(0, len(queue), 4 * g):
    out += sorted(queue[w : w + 4 * g], key=lambda i: lengths[i])
  return out


def generate_documents(
  params: Params,
  cfg: ModelConfig,
  prompts: Sequence[Sequence[int]],
  queue: Sequence[int],
  engine: EngineSettings,
  stop_tokens: tuple[int, ...],
  on_document: Callable[[Document], None],
  should_stop: Callable[[], bool] = lambda: False,
  progress: Callable[[int, float], None] = lambda tokens, seconds: None,
) -> dict:
  """Answers prompts[i] for i in `queue` with continuous batching; calls `on_document` per answer.

  `should_stop()` is asked before each refill (True: finish the documents in flight, start no
  more); `progress(tokens, seconds)` gets the response tokens generated so far, in-flight ones
  included, at every host visit.

  Returns counters: documents, generated tokens, prompt tokens, seconds, decode steps.
  """
  B, G = engine.batch, min(engine.refill, engine.batch)
  lengths = [len(p) for p in prompts]
  width = -(-max(lengths[i] for i in queue) // engine.prompt_bucket) * engine.prompt_bucket
  slots = empty_slots(cfg, B, width + engine.max_new_tokens + 1)
  pending = _order_for_refill(list(queue), lengths, G)
  owner = [-1] * B  # prompt index per slot
  stats = dict(documents=0, generated=0, prompt_tokens=0, steps=0)
  t0 = time.time()
  while True:
    done, seq_len, plen = jax.device_get((slots.done, slots.seq_len, slots.prompt_len))
    in_flight = sum(int(seq_len[b] - plen[b]) for b in range(B) if owner[b] >= 0)
    progress(stats["generated"] + in_flight, time.time() - t0)
    finished = [b for b in range(B) if done[b] and owner[b] >= 0]
    if finished:
      seq = np.asarray(jax.device_get(slots.seq))
      for b in finished:
        toks = seq[b, : seq_len[b]].copy()
        stopped = bool(np.isin(toks[-1], stop_tokens)) if stop_tokens else False
        on_document(Document(owner[b], toks, int(plen[b]), stopped))
        stats["documents"] += 1
        stats["generated"] += int(seq_len[b] - plen[b])
        owner[b] = -1
    free = [b for b in range(B) if owner[b] < 0]
    stop = should_stop()
    while pending and not stop and len(free) >= min(G, len(pending)):
      group, pending = pending[:G], pending[G:]
      rows, free = free[: len(group)], free[len(group) :]
      w = -(-max(lengths[i] for i in group) // engine.prompt_bucket) * engine.prompt_bucket
      P = np.zeros((G, w), np.int32)
      L = np.ones((G,), np.int32)
      R = np.full((G,), B, np.int32)
      for j, (i, b) in enumerate(zip(group, rows)):
        P[j, : lengths[i]], L[j], R[j] = prompts[i], lengths[i], b
        owner[b] = i
        stats["prompt_tokens"] += lengths[i]
      slots = refill(params, slots, R, P, L, cfg, engine.max_new_tokens, stop_tokens)
    if all(o < 0 for o in owner):
      break
    slots = decode(params, slots, cfg, engine.chunk_steps, engine.max_new_tokens, stop_tokens)
    stats["steps"] += engine.chunk_steps
  stats["seconds"] = time.time() - t0
  return stats


def prompt_sha256(text: str) -> str:
  return hashlib.sha256(text.encode()).hexdigest()


def done_prompts(out_dir: str) -> set[int]:
  """Prompt indices of every document already in a shard."""
  out: set[int] = set()
  for path in sorted(glob.glob(os.path.join(out_dir, "shard_*.npz"))):
    with np.load(path) as z:
      out.update(int(i) for i in z["prompt_index"])
  return out


def _write_shard(out_dir: str, docs: list[Document]) -> str:
  n = len(glob.glob(os.path.join(out_dir, "shard_*.npz")))
  path = os.path.join(out_dir, f"shard_{n:05d}.npz")
  arrays = dict(
    tokens=np.concatenate([d.tokens for d in docs]).astype(np.uint16),
    doc_lens=np.asarray([len(d.tokens) for d in docs], np.int32),
    prompt_lens=np.asarray([d.prompt_len for d in docs], np.int32),
    prompt_index=np.asarray([d.prompt_index for d in docs], np.int32),
    stopped=np.asarray([d.stopped for d in docs], bool),
  )
  write_atomic(path, lambda f: np.savez(f, **arrays))  # its temporary name matches no shard glob
  return path


def check_manifest(out_dir: str, manifest: dict) -> None:
  """Writes the manifest into a new corpus directory, or checks that it equals the one there.

  Raises:
    ValueError: the directory holds documents built by another target, recipe or engine.
  """
  path = os.path.join(out_dir, "manifest.json")
  if os.path.exists(path):
    with open(path) as f:
      have = json.load(f)
    diff = sorted(k for k in set(have) | set(manifest) if have.get(k) != manifest.get(k))
    if diff:
      detail = "; ".join(f"{k}: {have.get(k)!r} there, {manifest.get(k)!r} now" for k in diff)
      raise ValueError(
        f"{out_dir} holds a corpus built differently ({detail}); use another --out or delete it"
      )
    return
  os.makedirs(out_dir, exist_ok=True)
  write_json_atomic(path, dict(sorted(manifest.items())))


def build_corpus(
  params: Params,
  cfg: ModelConfig,
  prompts: Sequence[TrainPrompt],
  stop_tokens: tuple[int, ...],
  engine: EngineSettings,
  out_dir: str,
  manifest: dict,
  max_tokens: int,
  shard_docs: int = 64,
  log: Callable[[str], None] = print,
) -> dict:
  """Generates documents into `out_dir` until `max_tokens` response tokens exist (resumable).

  Prompts are answered in list order (the held-out front first), skipping those already stored.
  """
  with sole_writer(out_dir, "a corpus"):
    check_manifest(out_dir, manifest)
    have = done_prompts(out_dir)
    stored = sum(_shard_generated(p) for p in glob.glob(os.path.join(out_dir, "shard_*.npz")))
    queue = [i for i in range(len(prompts)) if i not in have]
    log(
      f"corpus: {len(have)} documents, {stored} response tokens stored; {len(queue)} prompts left"
    )
    buf: list[Document] = []
    counts = dict(docs=0, tokens=0, last_log=0.0)

    def on_document(d: Document):
      buf.append(d)
      counts["docs"] += 1
      counts["tokens"] += len(d.tokens) - d.prompt_len
      if len(buf) >= shard_docs:
        _write_shard(out_dir, buf)
        buf.clear()

    def progress(tokens: int, seconds: float):  # tokens: this run's, in-flight documents included
      if seconds - counts["last_log"] < 30:
        return
      counts["last_log"] = seconds
      rate = tokens / max(seconds, 1e-9)
      eta = max(max_tokens - stored - tokens, 0) / max(rate, 1e-9) / 60
      log(
        f"corpus: {len(have) + counts['docs']} documents stored, {stored + tokens} response tokens "
        f"({rate:.0f} tok/s, load {os.getloadavg()[0]:.1f}), ETA {eta:.0f} min"
      )

    stats = generate_documents(
      params, cfg, [p.tokens for p in prompts], queue, engine, stop_tokens, on_document,
      should_stop=lambda: stored + counts["tokens"] >= max_tokens, progress=progress,
    )  # fmt: skip
    if buf:
      _write_shard(out_dir, buf)
    return stats


def _shard_generated(path: str) -> int:
  with np.load(path) as z:
    return int(z["doc_lens"].sum() - z["prompt_lens"].sum())


def pack_corpus(out_dir: str, path: str, prompts: Sequence[TrainPrompt], n_heldout: int) -> dict:
  """One compressed file of every stored document, sorted by prompt index, plus its metadata.

  Writes `path` (npz: tokens uint16, doc_lens, prompt_lens, prompt_index, stopped, heldout) and
  `path` with `.json` (manifest, counts, per-document source, source index and prompt sha256,
  and the npz's sha256).
  """
  with open(os.path.join(out_dir, "manifest.json")) as f:
    manifest = json.load(f)
  docs: list[tuple[int, np.ndarray, int, bool]] = []
  for shard in sorted(glob.glob(os.path.join(out_dir, "shard_*.npz"))):
    with np.load(shard) as z:
      starts = np.concatenate([[0], np.cumsum(z["doc_lens"])[:-1]])
      for s, n, p, i, st in zip(
        starts, z["doc_lens"], z["prompt_lens"], z["prompt_index"], z["stopped"]
      ):
        docs.append((int(i), z["tokens"][s : s + n], int(p), bool(st)))
  docs.sort(key=lambda d: d[0])
  idx = [d[0] for d in docs]
  if len(set(idx)) != len(idx):
    raise ValueError(f"{out_dir}: a prompt appears in two shards")
  for i, toks, p, _ in docs:
    if tuple(int(t) for t in toks[:p]) != tuple(prompts[i].tokens):
      raise ValueError(f"{out_dir}: document of prompt {i} does not start with that prompt")
  arrays = dict(
    tokens=np.concatenate([d[1] for d in docs]).astype(np.uint16),
    doc_lens=np.asarray([len(d[1]) for d in docs], np.int32),
    prompt_lens=np.asarray([d[2] for d in docs], np.int32),
    prompt_index=np.asarray(idx, np.int32),
    stopped=np.asarray([d[3] for d in docs], bool),
    heldout=np.asarray([i < n_heldout for i in idx], bool),
  )
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  write_atomic(path, lambda f: np.savez_compressed(f, **arrays))
  with open(path, "rb") as f:
    digest = hashlib.sha256(f.read()).hexdigest()
  meta = dict(
    manifest=manifest,
    documents=len(docs),
    response_tokens=int(arrays["doc_lens"].sum() - arrays["prompt_lens"].sum()),
    prompt_tokens=int(arrays["prompt_lens"].sum()),
    heldout_documents=int(arrays["heldout"].sum()),
    stopped_documents=int(arrays["stopped"].sum()),
    sources=[prompts[i].source for i in idx],
    source_index=[prompts[i].index for i in idx],
    prompt_sha256=[prompt_sha256(prompts[i].text) for i in idx],
    # The whole prompt list in order (answered or not), so that generation can continue from this
    # file on another machine without rebuilding the list through the filters.
    prompt_order=[[p.source, p.index] for p in prompts],
    n_heldout=n_heldout,
    sha256=digest,
  )
  with open(path[: -len(".npz")] + ".json" if path.endswith(".npz") else path + ".json", "w") as f:
    json.dump(meta, f, indent=0)
  return meta


def meta_path_of(path: str) -> str:
  """The `.json` beside a packed corpus file (its recipe, prompt hashes and sha256)."""
  return path[: -len(".npz")] + ".json" if path.endswith(".npz") else path + ".json"


def read_meta(path: str) -> dict:
  """The metadata of the packed corpus at `path` (raises FileNotFoundError naming the file)."""
  meta_path = meta_path_of(path)
  if not os.path.exists(meta_path):
    raise FileNotFoundError(
      f"{meta_path} not found: a packed corpus is a .npz with its .json beside it "
      "(train/make_corpus.py --pack writes both)"
    )
  with open(meta_path) as f:
    return json.load(f)


def load_documents(path: str) -> list:
  """The documents of a packed corpus file, checked against the sha256 in its `.json`.

  Returns `train.teacher_forced.Document`s in prompt order (read them through the target once,
  `train.teacher_forced.build`, to get any layer's features).

  Raises:
    ValueError: the file does not match its recorded sha256 (corrupt or replaced).
  """
  from train.teacher_forced import Document

  meta_path = meta_path_of(path)
  meta = read_meta(path)
  with open(path, "rb") as f:
    digest = hashlib.sha256(f.read()).hexdigest()
  if digest != meta["sha256"]:
    raise ValueError(
      f"{path}: sha256 {digest} differs from {meta['sha256']} recorded in {meta_path}; the file "
      "is corrupt or was replaced: restore it (git checkout) or pack the corpus again"
    )
  with np.load(path) as z:
    starts = np.concatenate([[0], np.cumsum(z["doc_lens"])[:-1]])
    tokens = z["tokens"].astype(np.int32)
    return [
      Document(tuple(int(t) for t in tokens[s : s + n]), int(p), int(i), bool(h))
      for s, n, p, i, h in zip(
        starts, z["doc_lens"], z["prompt_lens"], z["prompt_index"], z["heldout"]
      )
    ]


def seed_from_packed(out_dir: str, path: str, manifest: dict) -> int:
  """Starts an empty corpus directory from a packed corpus file, so generation continues after it.

  Returns the documents imported (0 when `out_dir` already has shards: nothing is changed).

  Raises:
    ValueError: the packed corpus was built with another manifest, or fails its sha256.
  """
  if glob.glob(os.path.join(out_dir, "shard_*.npz")):
    return 0
  packed = read_meta(path)["manifest"]
  diff = sorted(k for k in set(packed) | set(manifest) if packed.get(k) != manifest.get(k))
  if diff:
    raise ValueError(
      f"{path} was built differently ({', '.join(diff)} differ from this run's); start a new "
      "corpus without --resume_from, or use the recipe and target it records"
    )
  check_manifest(out_dir, manifest)
  docs = load_documents(path)
  with np.load(path) as z:
    stopped = z["stopped"]
  _write_shard(
    out_dir,
    [
      Document(d.prompt_index, np.asarray(d.tokens, np.int32), d.prompt_len, bool(st))
      for d, st in zip(docs, stopped)
    ],
  )
  return len(docs)


# Manifest fields that say how a document was generated (not which prompts were asked): a corpus
# may take another's documents only if these agree.
GENERATION_FIELDS = (
  "target",
  "target_source_sha256",
  "target_weights",
  "dtype",
  "decoding",
  "max_new_tokens",
)


def seed_from_base(
  out_dir: str, base_path: str, plist: Sequence[TrainPrompt], manifest: dict
) -> int:
  """Starts an empty corpus directory with the documents of a packed base corpus whose prompts
  are in `plist` (by source and index, with equal chat tokens), so an extended corpus does not
  answer them again.

  Returns the documents taken (0 when `out_dir` already has shards: nothing is changed).

  Raises:
    ValueError: the base was generated differently (target, dtype, decoding or budget), or
      fails its sha256.
  """
  if glob.glob(os.path.join(out_dir, "shard_*.npz")):
    return 0
  meta = read_meta(base_path)
  have = meta["manifest"]
  diff = [k for k in GENERATION_FIELDS if have.get(k) != manifest.get(k)]
  if diff:
    detail = "; ".join(f"{k}: {have.get(k)!r} there, {manifest.get(k)!r} now" for k in diff)
    raise ValueError(
      f"{base_path} was generated differently ({detail}); its documents are not this run's"
    )
  check_manifest(out_dir, manifest)
  where = {(p.source, p.index): i for i, p in enumerate(plist)}
  base_order = meta["prompt_order"]
  with np.load(base_path) as z:
    stopped = z["stopped"]
  taken = []
  for d, st in zip(load_documents(base_path), stopped):
    source, index = base_order[d.prompt_index]
    i = where.get((source, int(index)))
    if i is not None and tuple(d.tokens[: d.prompt_len]) == plist[i].tokens:
      taken.append(Document(i, np.asarray(d.tokens, np.int32), d.prompt_len, bool(st)))
  if taken:
    _write_shard(out_dir, taken)
  return len(taken)


def prompts_from_order(order: Sequence[Sequence], tokenizer, min_ascii: float) -> list[TrainPrompt]:
  """Rebuilds a prompt list from its (source, index) pairs (`pack_corpus`'s `prompt_order`).

  ShareGPT indices are conversation indices (the first human turn is the prompt), GSM8K train
  indices are question indices, task prompts (`train.task_prompts.TASKS`) are rebuilt by
  `task_prompts.text_of`; texts come from the pinned sources and are encoded with the target's
  chat template as when the list was built; `min_ascii` is the recipe's (ShareGPT turns are
  deduplicated among those that pass it).
  """
  from train import prompts as prompt_recipe
  from train import sources, task_prompts

  texts = {"sharegpt": {}, "gsm8k_train": {}}
  wanted = {(s, int(i)) for s, i in order}
  if any(s == "sharegpt" for s, _ in wanted):
    data = sources.read_bytes(sources.SHAREGPT)
    for i, text in prompt_recipe.sharegpt_first_turns(data, min_ascii):
      if ("sharegpt", i) in wanted:
        texts["sharegpt"][i] = text
  if any(s == "gsm8k_train" for s, _ in wanted):
    questions = sources.gsm8k_questions(sources.read_bytes(sources.GSM8K_TRAIN))
    texts["gsm8k_train"] = dict(enumerate(questions))
  out = []
  for source, i in order:
    text = texts[source][int(i)] if source in texts else task_prompts.text_of(source, int(i))
    tokens = tokenizer.encode_chat([{"role": "user", "content": text}])
    out.append(TrainPrompt(source, int(i), text, tuple(tokens)))
  return out


def heldout_prompts(path: str, tokenizer, per_source: int) -> list:
  """The first `per_source` held-out documents of each source (ShareGPT, GSM8K train) of a packed
  corpus as one-turn `specjax.experiment.tasks.Prompt`s (category "heldout_<source>"). Their texts
  are rebuilt from the corpus's own prompt order, and each one's chat encoding is checked against
  the prompt tokens the corpus stores.

  Raises:
    ValueError: a rebuilt prompt does not encode to the corpus's tokens (other source data).
  """
  from specjax.experiment.tasks import Prompt

  meta = read_meta(path)
  plist = prompts_from_order(
    meta["prompt_order"], tokenizer, meta["manifest"]["recipe"]["min_ascii"]
  )
  out, taken = [], {}
  for doc, d in enumerate(load_documents(path)):
    p = plist[d.prompt_index]
    if not d.heldout or taken.get(p.source, 0) >= per_source:
      continue
    if tuple(d.tokens[: d.prompt_len]) != tuple(p.tokens):
      raise ValueError(f"{path}: document {doc}'s prompt is not {p.source} #{p.index} as rebuilt")
    taken[p.source] = taken.get(p.source, 0) + 1
    out.append(Prompt(f"heldout_{p.source}", f"heldout-{doc}", (p.text,)))
  return out
