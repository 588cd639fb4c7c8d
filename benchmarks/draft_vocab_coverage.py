"""How much of the target's output can a drafter's draft vocabulary propose, per Spec-Bench task?

An EAGLE-3 head scores Vd of the target's V tokens (`specjax.drafters.draft_vocab`); a token
outside them is never drafted, so its share of the target's output bounds the head's acceptance
from above. This script reads the AR answers of a Spec-Bench run (`records.jsonl` of
`experiments/paper_tables.py`, re-encoded with the target's tokenizer) and prints, per task, the
share of answer tokens outside each named drafter's vocabulary, and outside that vocabulary grown
to each `--grow` size by the committed corpus's most frequent tokens (what
`objective.grow_vocab` trains, `train.pipeline.grown_vocabulary`).

  python benchmarks/draft_vocab_coverage.py --records=/tmp/specjax_spec_bench/records.jsonl \
      --drafters=eagle3-smollm2-135m --grow=12288,16384,24576
"""

from __future__ import annotations

import collections
import json

import numpy as np
from absl import app, flags

from specjax.drafters.shipped import own_tensors
from specjax.loading.registry import load_model
from train.pipeline import grown_vocabulary
from train.settings import SMOLLM2, SMOLLM2_CORPUS

_RECORDS = flags.DEFINE_string("records", None, "records.jsonl of a Spec-Bench paper table run")
_DRAFTERS = flags.DEFINE_list("drafters", ["eagle3-smollm2-135m"], "shipped drafters")
_GROW = flags.DEFINE_list("grow", ["16384"], "grown vocabulary sizes to score too")
_CORPUS = flags.DEFINE_string("corpus", SMOLLM2_CORPUS, "corpus whose token counts grow them")


def answers_by_task(path: str, tok) -> dict[str, np.ndarray]:
  by = collections.defaultdict(list)
  with open(path) as f:
    for line in f:
      r = json.loads(line)
      by[r["category"]] += tok.encode(r["answer"], add_special_tokens=False)
  if not by:
    raise ValueError(f"{path} holds no records")
  return {task: np.asarray(ids) for task, ids in by.items()}


def outside_share(ids: np.ndarray, d2t: np.ndarray, vocab_size: int) -> float:
  inside = np.zeros(vocab_size, bool)
  inside[d2t] = True
  return float(1.0 - inside[ids].mean())


def main(_):
  if not _RECORDS.value:
    raise app.UsageError("--records: a records.jsonl written by experiments/paper_tables.py")
  _, cfg, tok = load_model(SMOLLM2)
  answers = answers_by_task(_RECORDS.value, tok)
  counts = np.bincount(np.load(_CORPUS.value)["tokens"].astype(np.int64), minlength=cfg.vocab_size)
  tasks = sorted(answers)
  every = np.concatenate([answers[t] for t in tasks])
  print(f"answer tokens outside the draft vocabulary ({len(every)} tokens, {_RECORDS.value})\n")
  print("| drafter | Vd | " + " | ".join(tasks) + " | all |")
  print("|---|---:|" + "---:|" * (len(tasks) + 1))
  for name in _DRAFTERS.value:
    d2t = own_tensors(name, cfg)[1]["d2t"].astype(np.int64)
    rows = [(name, d2t)]
    grow = [int(n) for n in _GROW.value if int(n) > len(d2t)]  # sizes it can grow to
    rows += [(f"{name}, grown", grown_vocabulary(d2t, counts, n)) for n in grow]
    for label, v in rows:
      shares = [outside_share(answers[t], v, cfg.vocab_size) for t in tasks]
      shares.append(outside_share(every, v, cfg.vocab_size))
      print(f"| {label} | {len(v)} | " + " | ".join(f"{s:.3f}" for s in shares) + " |")


if __name__ == "__main__":
  app.run(main)
