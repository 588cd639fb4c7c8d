"""Autoregressive tokens/s: specjax's jitted generate vs `transformers.generate`, same weights.

SmolLM2-135M-Instruct (Q4_1, dequantized to float32): specjax loads it through the registry,
transformers from the same GGUF file (`from_pretrained(dir, gguf_file=name)`). Greedy, exactly
`max_new_tokens` new tokens per row (no stop tokens in specjax; `min_new_tokens` in transformers),
batch sizes 1 and 8 of chat prompts fed as the same token ids to both. Both are warmed up (jit
compile / first call) before timing; timed runs alternate between the two in one process and the
medians are compared. Also prints how many leading greedy tokens the two agree on (row 0).

  python benchmarks/ar_vs_transformers.py --reps=3
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


def main(argv):
  del argv
  import torch
  import transformers

  params, cfg, tok = registry.load_named(_MODEL.value)
  hf = load_transformers(registry.gguf_path(_MODEL.value))
  chats = [tok.encode_chat([{"role": "user", "content": q}]) for q in QUESTIONS]
  gen = GenerateConfig(_MAX_NEW.value)  # no stop tokens: every row generates max_new_tokens
  pad = tok.eos_id or 0
  print(
    f"{_MODEL.value}, greedy, {_MAX_NEW.value} new tokens per row, median of {_REPS.value} "
    f"alternating runs; {os.cpu_count()} CPUs; jax {jax.__version__} ({jax.devices()[0].platform}),"
    f" torch {torch.__version__} ({torch.get_num_threads()} threads), transformers "
    f"{transformers.__version__}\n"
  )
  lines = ["| batch | specjax tok/s | transformers tok/s | specjax / transformers |"]
  lines.append("|---:|---:|---:|---:|")
  for b in map(int, _BATCHES.value):
    rows = [chats[i % len(chats)] for i in range(b)]
    jax_tokens, t_compile = jax_generate(params, cfg, rows, gen)  # compile
    hf_tokens, _ = hf_generate(hf, rows, _MAX_NEW.value, pad)  # warm up
    same = int(np.argmin(np.append(jax_tokens[0] == hf_tokens[0], False)))
    print(f"batch {b}: first call (compile) {t_compile:.1f} s; row 0 agrees on {same} tokens")
    t_jax, t_hf = [], []
    for _ in range(_REPS.value):
      t_jax.append(jax_generate(params, cfg, rows, gen)[1])
      t_hf.append(hf_generate(hf, rows, _MAX_NEW.value, pad)[1])
    n = b * _MAX_NEW.value
    jax_tps, hf_tps = n / statistics.median(t_jax), n / statistics.median(t_hf)
    print(
      f"  specjax {[round(t, 2) for t in t_jax]} s, transformers {[round(t, 2) for t in t_hf]} s"
    )
    lines.append(f"| {b} | {jax_tps:.1f} | {hf_tps:.1f} | {jax_tps / hf_tps:.2f}x |")
  print("\n" + "\n".join(lines))


if __name__ == "__main__":
  app.run(main)
