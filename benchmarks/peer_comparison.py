"""specjax vs Hugging Face transformers, same weights and prompts: AR, prompt lookup, a draft model.

Target: SmolLM2-135M-Instruct (Q4_1, dequantized to float32); specjax loads it through the
registry, transformers from the same GGUF file (loaded as in `ar_vs_transformers.py`).
Methods, greedy, batch 1 (transformers' assisted generation takes one row):

  ar             specjax `generate`            | transformers `generate`
  prompt_lookup  specjax PromptLookupDrafter(K, n-grams 2..1)
                                               | `prompt_lookup_num_tokens=K`,
                                                 `max_matching_ngram_size=2`
  draft_model    specjax DraftModelDrafter(K)  | `assistant_model=` the same draft exported to an
                                                 HF Llama directory, K tokens per round
                                                 (constant schedule, no confidence cut-off)

The draft model is the shipped `draft-lm2-smollm2-135m` (2 trained layers on the target's
embedding). As shipped it scores only a reduced 8,192-token draft vocabulary mapped to target ids
through `d2t`; an HF assistant must emit logits over the target's full vocabulary, and a Llama LM
head (a bias-free linear layer) cannot mask the other 40,960 tokens. Its head is the target's own
tied embedding restricted to the draft vocabulary, so the honest common ground is the full-vocab
variant: the same 2 layers and final norm with the target's full tied embedding as LM head. Both
libraries run exactly that model (specjax as a plain `DraftModelDrafter`); its proposals can differ
from the shipped reduced-vocab drafter's when the argmax falls outside the draft vocabulary.

Every row generates exactly `max_new_tokens` (no stop tokens in specjax, `min_new_tokens` in
transformers). Each (library, method) is warmed up once per prompt, then timed runs alternate
between all of them in one process; medians over reps per prompt, tok/s summed over prompts.
Prints tok/s, each library's speedup over its own AR, specjax / transformers ratios, and how many
leading tokens each method's output shares with its library's AR output.

  python benchmarks/peer_comparison.py --reps=2 --max_new_tokens=48 --k=4
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

import jax
import numpy as np
from absl import app, flags

from specjax.drafters import DraftModelDrafter, PromptLookupDrafter
from specjax.drafters.shipped import load_shipped
from specjax.generate import GenerateConfig, generate, pad_prompts
from specjax.loading import registry
from specjax.loading.hf import save_hf
from specjax.model import Params
from specjax.speculative import speculative_generate

_MODEL = flags.DEFINE_string("model", "smollm2-135m-instruct", "Registry name.")
_DRAFT = flags.DEFINE_string("draft", "draft-lm2-smollm2-135m", "Shipped draft LM.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 48, "New tokens per prompt.")
_REPS = flags.DEFINE_integer("reps", 2, "Timed runs of every (library, method) per prompt.")
_K = flags.DEFINE_integer("k", 4, "Draft length.")
_TORCH_THREADS = flags.DEFINE_integer("torch_threads", 1, "torch intra-op threads.")

PROMPTS = [
  "Repeat this sentence exactly, then explain it: 'The quick brown fox jumps over the lazy dog.'",
  "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
  "What causes the seasons on Earth?",
]
METHODS = ("ar", "prompt_lookup", "draft_model")


def full_vocab_draft(target: Params, shipped) -> tuple[Params, object]:
  """The shipped draft LM's layers and norm with the target's full tied embedding as LM head."""
  p = shipped.params
  return Params(target.embed, p.layers, p.final_norm, None), shipped.head_cfg.replace(
    tie_embeddings=True
  )


def specjax_runner(params, cfg, draft, draft_cfg, k: int, gen: GenerateConfig):
  """method -> callable(ids) returning (new tokens, seconds); compiled on first use."""
  drafters = {
    "prompt_lookup": (PromptLookupDrafter(k, max_ngram=2, min_ngram=1), ()),
    "draft_model": (DraftModelDrafter(draft_cfg, k), draft),
  }

  def run(method: str, ids: list[int]):
    prompts, lens = pad_prompts([ids], bucket=64)
    t0 = time.perf_counter()
    if method == "ar":
      out = jax.block_until_ready(generate(params, cfg, prompts, lens, gen))
    else:
      d, dp = drafters[method]
      out = jax.block_until_ready(speculative_generate(params, cfg, d, dp, prompts, lens, gen))
    return np.asarray(out.tokens[0]).tolist(), time.perf_counter() - t0

  return run


def hf_runner(model, assistant, k: int, max_new: int, pad_id: int):
  import torch

  def run(method: str, ids: list[int]):
    kwargs = {}
    if method == "prompt_lookup":
      kwargs = {"prompt_lookup_num_tokens": k, "max_matching_ngram_size": 2}
    elif method == "draft_model":
      kwargs = {"assistant_model": assistant}
    x = torch.tensor([ids])
    t0 = time.perf_counter()
    with torch.inference_mode():
      out = model.generate(
        input_ids=x,
        attention_mask=torch.ones_like(x),
        do_sample=False,
        max_new_tokens=max_new,
        min_new_tokens=max_new,
        pad_token_id=pad_id,
        **kwargs,
      )
    return out[0, len(ids) :].tolist(), time.perf_counter() - t0

  return run


def load_transformers(gguf_path: str):
  """The target in transformers from the same GGUF (as in `benchmarks/ar_vs_transformers.py`)."""
  import torch
  from transformers import AutoModelForCausalLM

  model = AutoModelForCausalLM.from_pretrained(
    os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path), dtype=torch.float32
  )
  return model.eval()


def load_assistant(directory: str):
  import torch
  from transformers import AutoModelForCausalLM

  a = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
  a.generation_config.num_assistant_tokens = _K.value
  a.generation_config.num_assistant_tokens_schedule = "constant"
  a.generation_config.assistant_confidence_threshold = 0.0
  return a


def leading_same(a: list[int], b: list[int]) -> int:
  n = min(len(a), len(b))
  return next((i for i in range(n) if a[i] != b[i]), n)


def main(argv):
  del argv
  import torch
  import transformers

  torch.set_num_threads(_TORCH_THREADS.value)
  params, cfg, tok = registry.load_named(_MODEL.value)
  shipped = load_shipped(_DRAFT.value, params, cfg)
  draft, draft_cfg = full_vocab_draft(params, shipped)
  hf = load_transformers(registry.gguf_path(_MODEL.value))
  with tempfile.TemporaryDirectory() as d:
    save_hf(d, draft, draft_cfg)
    assistant = load_assistant(d)
  gen = GenerateConfig(_MAX_NEW.value)  # no stop tokens: exactly max_new_tokens
  runners = {
    "specjax": specjax_runner(params, cfg, draft, draft_cfg, _K.value, gen),
    "transformers": hf_runner(hf, assistant, _K.value, _MAX_NEW.value, tok.eos_id or 0),
  }
  print(
    f"{_MODEL.value}, draft {_DRAFT.value} (full-vocab variant, {draft_cfg.n_layers} layers), "
    f"greedy, batch 1, K={_K.value}, {_MAX_NEW.value} new tokens, {len(PROMPTS)} prompts, median "
    f"of {_REPS.value} alternating runs; {os.cpu_count()} CPUs, load average "
    f"{os.getloadavg()[0]:.1f} at start; jax {jax.__version__}, torch {torch.__version__} "
    f"({_TORCH_THREADS.value} thread), transformers {transformers.__version__}",
    flush=True,
  )
  secs = {(lib, m): 0.0 for lib in runners for m in METHODS}
  agree = {(lib, m): [] for lib in runners for m in METHODS}
  for i, q in enumerate(PROMPTS):
    ids = tok.encode_chat([{"role": "user", "content": q}])
    outs = {}
    for lib, run in runners.items():  # warm-up (jit compile, first call)
      for m in METHODS:
        outs[(lib, m)] = run(m, ids)[0]
    times = {key: [] for key in secs}
    for _ in range(_REPS.value):
      for lib, run in runners.items():
        for m in METHODS:
          times[(lib, m)].append(run(m, ids)[1])
    for key in secs:
      secs[key] += statistics.median(times[key])
      agree[key].append(leading_same(outs[key], outs[(key[0], "ar")]))
    print(f"  prompt {i + 1}: " + ", ".join(
      f"{lib} {m} {statistics.median(times[(lib, m)]):.2f} s" for lib, m in secs
    ), flush=True)  # fmt: skip
  n_tok = _MAX_NEW.value * len(PROMPTS)
  print("\n| method | specjax tok/s | transformers tok/s | specjax / transformers "
        "| specjax speedup | transformers speedup | leading tokens = own AR (sj / hf) |")  # fmt: skip
  print("|---|---:|---:|---:|---:|---:|---|")
  for m in METHODS:
    sj, hf_ = n_tok / secs[("specjax", m)], n_tok / secs[("transformers", m)]
    sj_ar, hf_ar = n_tok / secs[("specjax", "ar")], n_tok / secs[("transformers", "ar")]
    same = f"{agree[('specjax', m)]} / {agree[('transformers', m)]}"
    print(f"| {m} | {sj:.2f} | {hf_:.2f} | {sj / hf_:.2f}x | {sj / sj_ar:.2f}x "
          f"| {hf_ / hf_ar:.2f}x | {same} |")  # fmt: skip


if __name__ == "__main__":
  app.run(main)
