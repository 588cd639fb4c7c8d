"""Throughput of the self-distillation data engine (`train.corpus`) against batch size.

For each B the engine answers the corpus recipe's prompts (greedy, responses up to
--max_new_tokens) with continuous batching for --seconds after a warm-up that compiles every
shape; the figure is response tokens generated per second in that window (documents in flight
counted), with the load average at its start and end. Also, with --features, the same at one B
while recording the final hidden state and three layers per position (what decoding with
features costs) next to reading finished documents through the target once (`train.teacher_forced`).

    python benchmarks/corpus_throughput.py --batches=8,32,64,128 --seconds=90
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from specjax.loading import registry  # noqa: E402
from train import corpus, prompts  # noqa: E402

_BATCHES = flags.DEFINE_list("batches", ["8", "32", "64", "128"], "Decode slots B.")
_SECONDS = flags.DEFINE_float("seconds", 90.0, "Timed window per batch size.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 512, "Response budget per prompt.")
_DTYPE = flags.DEFINE_string("dtype", "float32", "Target dtype.")


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
