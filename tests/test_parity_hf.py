"""Numerical parity with transformers on tiny random Llama / Qwen2 checkpoints saved to disk.

Each model is built with transformers, saved with `save_pretrained` (safetensors) and loaded back
with `load_hf`. Tolerance: float32 logits within 1e-4 absolute of transformers (logits here are
O(1); the observed gap is ~1e-6). Greedy continuations must be token-identical.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.generate import GenerateConfig, generate, pad_prompts
from specjax.kv_cache import init_cache
from specjax.loading import load_hf
from specjax.model import forward

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.reference

LOGIT_ATOL = 1e-4
fwd = jax.jit(forward, static_argnames=("cfg",))
VOCAB = 96
PROMPTS = [[5, 17, 3, 88, 41, 9, 60], [12, 7], [33, 2, 71, 71, 15, 4, 90, 58, 23, 6, 11, 47, 80]]
NEW_TOKENS = 12

LLAMA3_ROPE = {
  "rope_type": "llama3",
  "factor": 8.0,
  "low_freq_factor": 1.0,
  "high_freq_factor": 4.0,
  "original_max_position_embeddings": 16,
}

COMMON = dict(
  vocab_size=VOCAB,
  hidden_size=32,
  intermediate_size=48,
  num_hidden_layers=2,
  max_position_embeddings=256,
  initializer_range=0.15,  # decisive logits, so greedy argmax has no near-ties
)

CASES = {
  "llama-gqa-untied": ("LlamaForCausalLM", dict(num_attention_heads=4, num_key_value_heads=2)),
  "llama-tied-llama3-rope": (
    "LlamaForCausalLM",
    dict(
      num_attention_heads=4,
      num_key_value_heads=4,
      tie_word_embeddings=True,
      rope_scaling=LLAMA3_ROPE,
    ),
  ),
  "qwen2-gqa": (
    "Qwen2ForCausalLM",
    dict(num_attention_heads=4, num_key_value_heads=1, rope_theta=1e6),
  ),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request, tmp_path_factory):
  """(hf_model, params, cfg) for one tiny random checkpoint."""
  arch, kw = CASES[request.param]
  torch.set_num_threads(1)  # tiny models: threads only add overhead (and stall on shared cores)
  config_cls = {"LlamaForCausalLM": "LlamaConfig", "Qwen2ForCausalLM": "Qwen2Config"}[arch]
  hf_cfg = getattr(transformers, config_cls)(**COMMON, **kw)
  torch.manual_seed(len(request.param))
  model = getattr(transformers, arch)(hf_cfg).eval()
  # Random RMSNorm scales too (they start at one), so a dropped norm cannot go unnoticed.
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        p.uniform_(0.5, 1.5)
  directory = tmp_path_factory.mktemp(request.param)
  model.save_pretrained(directory)
  params, cfg = load_hf(str(directory))
  model.generation_config.eos_token_id = None
  model.generation_config.pad_token_id = 0
  return model, params, cfg


def test_config_read_back(pair):
  model, _, cfg = pair
  c = model.config
  assert (cfg.n_heads, cfg.n_kv_heads, cfg.tie_embeddings) == (
    c.num_attention_heads,
    c.num_key_value_heads,
    c.tie_word_embeddings,
  )
  assert cfg.qkv_bias == (c.model_type == "qwen2")
  want_scaling = (getattr(c, "rope_parameters", None) or {}).get("rope_type", "default")
  got_scaling = dict(cfg.rope_scaling or {}).get("rope_type", "default")
  assert got_scaling == want_scaling


def test_logits_match(pair):
  model, params, cfg = pair
  tokens, lens = pad_prompts(PROMPTS, bucket=16)  # right padding: valid positions are unaffected
  got = np.asarray(fwd(params, tokens, init_cache(cfg, len(PROMPTS), 16), cfg).logits)
  for row, prompt in enumerate(PROMPTS):
    with torch.no_grad():
      ref = model(torch.tensor([prompt])).logits[0].numpy()
    assert np.abs(ref).max() > 0.5  # logits are O(1), so the tolerance is meaningful
    np.testing.assert_allclose(got[row, : len(prompt)], ref, atol=LOGIT_ATOL, rtol=0)


def test_cached_decode_matches_full_pass(pair):
  """Logits from prefill + one-token steps on the cache equal one pass over the whole sequence."""
  _, params, cfg = pair
  seq = jnp.asarray([PROMPTS[2]], jnp.int32)
  full = fwd(params, seq, init_cache(cfg, 1, 32), cfg).logits[0]
  out = fwd(params, seq[:, :5], init_cache(cfg, 1, 32), cfg)
  steps, cache = [out.logits[0]], out.cache
  for t in range(5, seq.shape[1]):
    out = fwd(params, seq[:, t : t + 1], cache, cfg)
    steps.append(out.logits[0])
    cache = out.cache
  np.testing.assert_allclose(np.concatenate(steps), np.asarray(full), atol=1e-5, rtol=0)


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
  with torch.no_grad():
    out = model.generate(
      torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False
    )
  return out[0, len(prompt) :].tolist()


def test_greedy_generation_matches_hf_and_batching(pair):
  model, params, cfg = pair
  gen = GenerateConfig(max_new_tokens=NEW_TOKENS)
  tokens, lens = pad_prompts(PROMPTS, bucket=16)
  batched = generate(params, cfg, tokens, lens, gen)
  assert np.asarray(batched.lengths).tolist() == [NEW_TOKENS] * len(PROMPTS)
  for row, prompt in enumerate(PROMPTS):
    ours = np.asarray(batched.tokens[row]).tolist()
    assert ours == hf_greedy(model, prompt, NEW_TOKENS), f"row {row}"
    alone_tokens, alone_lens = pad_prompts([prompt], bucket=16)
    alone = generate(params, cfg, alone_tokens, alone_lens, gen)
    assert np.asarray(alone.tokens[0]).tolist() == ours, f"row {row} alone"
