"""Autoregressive tokens/s: specjax's jitted generate vs `transformers.generate`, same weights.

SmolLM2-135M-Instruct (Q4_1, dequantized to float32): specjax loads it through the registry,
transformers from the same GGUF file (`from_pretrained(dir, gguf_file=name)`). Greedy, exactly
`max_new_tokens` new tokens per row (no stop tokens in specjax; `min_new_tokens` in transformers),
batch sizes 1 and 8 of chat prompts fed as the same token ids to both. Both are warmed up (jit
compile / first call) before timing; timed runs alternate between the two in one process and the
medians are compared. transformers is timed at each of `--torch_threads` (on a CPU shared with
other jobs, torch's OpenMP threads can spin far more than they compute; XLA's thread pool is left
at its default). Also prints, per row, how many greedy tokens the two agree on before the first
stop token.

  python benchmarks/ar_vs_transformers.py --reps=3 --torch_threads=1,2
"""

import os
import statistics
import time

import jax
import numpy as np
from absl import app, flags

from specjax.generate import GenerateConfig, generate, pad_prompts
from specjax.loading import registry

_MODEL = flags.DEFINE_string("model", "smollm2-135m-instruct", "Registry name.")
_BATCHES = flags.DEFINE_list("batch_sizes", ["1", "8"], "Batch sizes.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 128, "New tokens per row.")
_REPS = flags.DEFINE_integer("reps", 3, "Timed runs of each implementation per batch size.")
_TORCH_THREADS = flags.DEFINE_list(
  "torch_threads", ["1", "2"], "torch intra-op thread counts to time (empty: torch's default)."
)

QUESTIONS = [
  "What is the capital of France?",
  "Explain photosynthesis in simple terms.",
  "Write a short poem about the sea.",
  "How do I sort a list in Python?",
  "What causes the seasons on Earth?",
  "Give me three tips for a job interview.",
  "Why is the sky blue?",
  "Summarize the plot of Romeo and Juliet.",
]


def load_transformers(gguf_path: str):
  import torch
  from transformers import AutoModelForCausalLM

  model = AutoModelForCausalLM.from_pretrained(
    os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path), dtype=torch.float32
  )
  return model.eval()


def hf_generate(
  model, rows: list[list[int]], max_new: int, pad_id: int
) -> tuple[np.ndarray, float]:
  """Left-padded greedy generation; returns (new tokens [B, max_new], seconds)."""
  import torch

  width = max(len(r) for r in rows)
  ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
  mask = torch.zeros((len(rows), width), dtype=torch.long)
  for i, r in enumerate(rows):
    ids[i, width - len(r) :] = torch.tensor(r)
    mask[i, width - len(r) :] = 1
  t0 = time.perf_counter()
  with torch.inference_mode():
    out = model.generate(
      input_ids=ids,
      attention_mask=mask,
      do_sample=False,
      max_new_tokens=max_new,
      min_new_tokens=max_new,
      pad_token_id=pad_id,
    )
  return out[:, width:].numpy(), time.perf_counter() - t0


def jax_generate(
  params, cfg, rows: list[list[int]], gen: GenerateConfig
) -> tuple[np.ndarray, float]:
  prompts, lens = pad_prompts(rows)
  t0 = time.perf_counter()
  out = jax.block_until_ready(generate(params, cfg, prompts, lens, gen))
  return np.asarray(out.tokens), time.perf_counter() - t0


def agreement(jax_tokens: np.ndarray, hf_tokens: np.ndarray, tok) -> str:
  """How many leading greedy tokens agree per row, up to the row's first stop token.

  Past a stop token the two differ by design: specjax keeps decoding, transformers' min_new_tokens
  forbids EOS.
  """
  parts = []
  for a, b in zip(jax_tokens, hf_tokens):
    stops = np.flatnonzero(np.isin(a, tok.stop_ids))
    n = int(stops[0]) if stops.size else len(a)
    same = int(np.argmin(np.append(a[:n] == b[:n], False)))
    parts.append(f"{same}/{n}")
  return "leading tokens equal to transformers' before the first stop (per row): " + " ".join(parts)


def main(argv):
  del argv
  import torch
  import transformers

  params, cfg, tok = registry.load_named(_MODEL.value)
  hf = load_transformers(registry.gguf_path(_MODEL.value))
  chats = [tok.encode_chat([{"role": "user", "content": q}]) for q in QUESTIONS]
  gen = GenerateConfig(_MAX_NEW.value)  # no stop tokens: every row generates max_new_tokens
  pad = tok.eos_id or 0
  threads = [int(t) for t in _TORCH_THREADS.value] or [torch.get_num_threads()]
  print(
    f"{_MODEL.value}, greedy, {_MAX_NEW.value} new tokens per row, median of {_REPS.value} "
    f"alternating runs; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start; "
    f"jax {jax.__version__} ({jax.devices()[0].platform}), torch {torch.__version__}, "
    f"transformers {transformers.__version__}\n"
  )
  lines = ["| batch | implementation | tok/s | specjax / this |", "|---:|---|---:|---:|"]
  for b in map(int, _BATCHES.value):
    rows = [chats[i % len(chats)] for i in range(b)]
    jax_tokens, t_compile = jax_generate(params, cfg, rows, gen)  # compile
    for t in threads:  # warm up
      torch.set_num_threads(t)
      hf_tokens, _ = hf_generate(hf, rows, _MAX_NEW.value, pad)
    print(
      f"batch {b}: first call (compile) {t_compile:.1f} s; {agreement(jax_tokens, hf_tokens, tok)}"
    )
    times: dict[str, list[float]] = {"specjax": []}
    times.update({f"transformers, {t} torch threads": [] for t in threads})
    for _ in range(_REPS.value):
      times["specjax"].append(jax_generate(params, cfg, rows, gen)[1])
      for t in threads:
        torch.set_num_threads(t)
        times[f"transformers, {t} torch threads"].append(
          hf_generate(hf, rows, _MAX_NEW.value, pad)[1]
        )
    tps = {k: b * _MAX_NEW.value / statistics.median(v) for k, v in times.items()}
    for name, ts in times.items():
      print(f"  {name}: {[round(x, 2) for x in ts]} s")
      lines.append(f"| {b} | {name} | {tps[name]:.1f} | {tps['specjax'] / tps[name]:.2f}x |")
  print(f"\nload average at the end {os.getloadavg()[0]:.1f}\n")
  print("\n".join(lines))


if __name__ == "__main__":
  app.run(main)
