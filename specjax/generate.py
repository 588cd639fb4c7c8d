"""Autoregressive generation in one jitted `lax.while_loop`: the baseline every method is timed against.

The loop is `specjax.decode`'s (`DecodeState`, `start`, `target_step`, `finish`) with no drafter:
each step the target reads every row's last token and each live row commits one sampled token.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from specjax.config import ModelConfig
from specjax.decode import (  # noqa: F401 - the shared steps, re-exported where callers found them
  DecodeState,
  Prefill,
  check_capacity,
  extract_new_tokens,
  finish,
  init_sequence,
  is_stop,
  prefill,
  row_budgets,
  run,
  start,
  target_step,
)
from specjax.model import Params
from specjax.sampling import SamplingConfig
from specjax.target import TargetModel


@dataclasses.dataclass(frozen=True)
class GenerateConfig:
  """Static settings of a generation call.

  Attributes:
    max_new_tokens: size of the output buffer (per-row budgets may be smaller).
    sampling: how the target's logits become tokens.
    stop_tokens: token ids that end a row (EOS, end-of-turn); the stop token is emitted.
    capacity: cache slots per row; 0 means prompt bucket + max_new_tokens (+ draft room).
  """

  max_new_tokens: int = 128
  sampling: SamplingConfig = SamplingConfig()
  stop_tokens: tuple[int, ...] = ()
  capacity: int = 0


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class GenerateOutput:
  """Result of `generate`.

  Attributes:
    tokens: [B, max_new_tokens] int32 generated tokens; entries at or past `lengths` are padding (0).
    lengths: [B] number of generated tokens per row (including a final stop token).
    target_passes: [B] target forward passes after prefill that produced this row's tokens.
  """

  tokens: jax.Array
  lengths: jax.Array
  target_passes: jax.Array


def pad_prompts(prompts: list[list[int]], bucket: int = 64, pad_id: int = 0):
  """Right-pads token lists to a multiple of `bucket`: (tokens [B, Tp] int32, lengths [B] int32).

  Tp is the longest prompt rounded up to a multiple of `bucket`, so any `bucket` >= the longest
  prompt pads to exactly `bucket`. (The experiment runner picks that width itself: a power of two,
  capped to fit the context, see `specjax.experiment.runner.prompt_width`.)
  """
  if not prompts or any(len(p) == 0 for p in prompts):
    raise ValueError("every prompt needs at least one token")
  longest = max(len(p) for p in prompts)
  width = -(-longest // bucket) * bucket
  out = np.full((len(prompts), width), pad_id, np.int32)
  for i, p in enumerate(prompts):
    out[i, : len(p)] = p
  return jnp.asarray(out), jnp.asarray([len(p) for p in prompts], jnp.int32)


@functools.partial(jax.jit, static_argnames=("cfg", "gen"))
def _generate(params, prompts, prompt_lens, budgets, key, cfg, gen: GenerateConfig):
  B, Tp = prompts.shape
  capacity = gen.capacity or Tp + gen.max_new_tokens
  # One spare sequence slot: a finished row's junk write at seq_len may reach `capacity`.
  state = start(
    params, cfg, prompts, prompt_lens, budgets, key, capacity=capacity, sampling=gen.sampling,
    stop_tokens=gen.stop_tokens, metrics=jnp.zeros((B,), jnp.int32), width=capacity + 1,
  )  # fmt: skip

  def body(s: DecodeState) -> DecodeState:
    key, sub = jax.random.split(s.key)
    seq, seq_len, done, m, out = target_step(
      s, sub, params=params, cfg=cfg, sampling=gen.sampling, stop_tokens=gen.stop_tokens,
      prompt_lens=prompt_lens, budgets=budgets,
    )  # fmt: skip
    passes = s.metrics + m
    return DecodeState(seq, seq_len, out.cache.with_lengths(seq_len - 1), (), done, passes, key)

  state = run(state, body)
  tokens, n_new = finish(state, prompt_lens, gen.max_new_tokens)
  return GenerateOutput(tokens, n_new, state.metrics)


def generate(
  params: Params,
  cfg: ModelConfig | TargetModel,
  prompts: jax.Array,
  prompt_lens: jax.Array,
  gen: GenerateConfig,
  key: jax.Array | None = None,
  max_new_per_row: jax.Array | None = None,
) -> GenerateOutput:
  """Generates up to `gen.max_new_tokens` tokens per row, the whole loop compiled.

  Args:
    params: target weights.
    cfg: the target model (static): a ModelConfig for specjax's Llama forward, or any
      `specjax.target.TargetModel` (e.g. `specjax.nnx_target.NNXTarget`).
    prompts: [B, Tp] right-padded prompt tokens (see `pad_prompts`).
    prompt_lens: [B] true prompt lengths.
    gen: static generation settings.
    key: PRNG key (needed unless greedy).
    max_new_per_row: optional [B] per-row budgets (<= gen.max_new_tokens).

  Returns:
    A `GenerateOutput`.
  """
  B, Tp = prompts.shape
  check_capacity(Tp, gen.max_new_tokens, 0, gen.capacity)
  if gen.max_new_tokens < 1:
    raise ValueError("max_new_tokens must be >= 1")
  budgets = row_budgets(B, gen.max_new_tokens, max_new_per_row)
  key = jax.random.PRNGKey(0) if key is None else key
  return _generate(params, prompts, jnp.asarray(prompt_lens, jnp.int32), budgets, key, cfg, gen)
