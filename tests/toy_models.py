"""Tiny random Llama-family models with small vocabularies, for exact and statistical tests."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np

from specjax.config import ModelConfig
from specjax.kv_cache import init_cache
from specjax.model import forward, init_params
from specjax.sampling import SamplingConfig


def tiny_config(vocab: int = 64, d_model: int = 32, n_layers: int = 2, **kw) -> ModelConfig:
  base = dict(n_heads=4, n_kv_heads=2, head_dim=8, ffn_dim=2 * d_model)
  base.update(kw)
  return ModelConfig(vocab_size=vocab, d_model=d_model, n_layers=n_layers, **base)


def tiny_model(seed: int, scale: float = 0.5, **kw):
  cfg = tiny_config(**kw)
  return init_params(jax.random.PRNGKey(seed), cfg, scale=scale), cfg


def exact_continuation_probs(params, cfg, prompt, n_tokens: int, sampling: SamplingConfig):
  """P(x_1..x_n | prompt) for every continuation, under the processed target distribution.

  Returns a dict {tuple(tokens): probability}, enumerating V ** n_tokens sequences.
  """
  V = cfg.vocab_size
  seqs = list(itertools.product(range(V), repeat=n_tokens - 1)) if n_tokens > 1 else [()]
  prefixes = np.array([list(prompt) + list(s) for s in seqs], np.int32)  # [M, P + n - 1]
  cache = init_cache(cfg, prefixes.shape[0], prefixes.shape[1])
  logits = forward(params, jnp.asarray(prefixes), cache, cfg).logits
  P = len(prompt)
  logp = np.asarray(sampling.logprobs(logits[:, P - 1 :]), np.float64)  # [M, n, V]
  probs = {}
  for m, s in enumerate(seqs):
    for last in range(V):
      toks = tuple(s) + (last,)
      lp = sum(logp[m, i, toks[i]] for i in range(n_tokens))
      probs[toks] = float(np.exp(lp))
  return probs
