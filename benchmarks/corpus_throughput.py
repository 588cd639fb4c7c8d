"""Throughput of the self-distillation data engine (`train.corpus`) against batch size.

For each B the engine answers the corpus recipe's prompts (greedy, responses up to
--max_new_tokens) with continuous batching for --seconds after a warm-up that compiles every
shape; the figure is response tokens generated per second in that window (documents in flight
counted), with the load average at its start and end.

With --features=B it instead compares, in one run, three ways to get the features a drafter
trains on for B prompts and --features_new_tokens response tokens each: decoding without
features (`specjax.generate`), decoding that records the final hidden state and layers 2, 15, 27
at every position (`train.features.generate_with_features`), and reading the finished documents
through the target once (`train.teacher_forced.read_through`, positions/s).

    python benchmarks/corpus_throughput.py --batches=8,32,64,128 --seconds=90
    python benchmarks/corpus_throughput.py --features=64
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from absl import app, flags  # noqa: E402

from specjax.generate import GenerateConfig, generate, pad_prompts  # noqa: E402
from specjax.loading import registry  # noqa: E402
from train import corpus, prompts  # noqa: E402
from train.features import generate_with_features  # noqa: E402
from train.teacher_forced import read_through  # noqa: E402

_BATCHES = flags.DEFINE_list("batches", ["8", "32", "64", "128"], "Decode slots B.")
_SECONDS = flags.DEFINE_float("seconds", 90.0, "Timed window per batch size.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 512, "Response budget per prompt.")
_DTYPE = flags.DEFINE_string("dtype", "float32", "Target dtype.")
_FEATURES = flags.DEFINE_integer("features", 0, "> 0: compare feature recording at this B.")
_FEATURES_NEW = flags.DEFINE_integer("features_new_tokens", 128, "Response tokens per prompt.")
LAYERS = (2, 15, 27)


def timed(fn) -> float:
  """Seconds of fn() after one warm-up call (compilation)."""
  jax.block_until_ready(fn())
  t0 = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - t0


def compare_features(params, cfg, plist, stops, b: int, new: int) -> None:
  P, L = pad_prompts([list(p.tokens) for p in plist[:b]], bucket=64)
  P, L = jnp.asarray(P), jnp.asarray(L)
  gen = GenerateConfig(max_new_tokens=new)  # no stop tokens: every row makes `new` tokens
  plain = timed(lambda: generate(params, cfg, P, L, gen).tokens)
  rec = timed(lambda: generate_with_features(params, P, L, cfg, new, (), LAYERS))
  docs = jnp.zeros((b, P.shape[1] + new), jnp.int32).at[:, : P.shape[1]].set(P)
  read = timed(lambda: read_through(params, docs, cfg, LAYERS)[0])
  la = os.getloadavg()[0]
  print(f"B={b}, {new} response tokens per prompt, prompts padded to {P.shape[1]}, load {la:.2f}")
  print(f"| decode, no features | {b * new / plain:.1f} response tok/s |")
  print(f"| decode recording hidden + layers {LAYERS} | {b * new / rec:.1f} response tok/s |")
  print(f"| read-through of finished documents | {docs.size / read:.1f} positions/s |")


class _WindowOver(Exception):
  pass


def measure(params, cfg, plist, stops, engine, seconds, offset):
  """Response tokens/s over a window that starts once the first refills have compiled."""
  marks = []
  warm = 30.0  # compiles every refill width and the decode chunk

  def progress(tokens, elapsed):
    marks.append((tokens, elapsed))
    if elapsed > warm + seconds:
      raise _WindowOver

  queue = list(range(offset, len(plist)))
  try:
    corpus.generate_documents(
      params, cfg, [p.tokens for p in plist], queue, engine, stops, lambda d: None,
      progress=progress,
    )  # fmt: skip
  except _WindowOver:
    pass
  t0 = next(m for m in marks if m[1] >= warm)
  t1 = marks[-1]
  return (t1[0] - t0[0]) / max(t1[1] - t0[1], 1e-9)


def main(argv):
  del argv
  params, cfg, tok = registry.load_model("smollm2-135m-instruct", dtype=_DTYPE.value)
  recipe = prompts.PromptRecipe(n_heldout=0, **corpus.RECIPE)
  plist = prompts.build_prompts(recipe, tok)
  print(f"{len(plist)} prompts; dtype {_DTYPE.value}; {os.cpu_count()} CPUs")
  if _FEATURES.value:
    compare_features(params, cfg, plist, tok.stop_ids, _FEATURES.value, _FEATURES_NEW.value)
    return
  print("| B | response tok/s | load avg start / end |\n|---:|---:|---|")
  offset = 0
  for b in map(int, _BATCHES.value):
    engine = corpus.EngineSettings(batch=b, refill=max(4, b // 8), max_new_tokens=_MAX_NEW.value)
    la0 = os.getloadavg()[0]
    rate = measure(params, cfg, plist, tok.stop_ids, engine, _SECONDS.value, offset)
    offset += 4 * b  # fresh prompts for each B
    print(f"| {b} | {rate:.1f} | {la0:.1f} / {os.getloadavg()[0]:.1f} |", flush=True)


if __name__ == "__main__":
  app.run(main)
