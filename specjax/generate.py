"""Autoregressive generation in one jitted `lax.while_loop`: the baseline every method is timed against.

Sequence state shared with the speculative loop: `seq` [B, S] holds each row's prompt followed by
its generated tokens, `seq_len` [B] how many are valid. Invariant: the target cache holds K/V for
seq[:, :seq_len - 1]; the last token is fed at the next step.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from specjax.config import ModelConfig
from specjax.kv_cache import KVCache, init_cache
from specjax.model import Params, forward
from specjax.sampling import SamplingConfig


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


def check_capacity(prompt_width: int, max_new: int, extra: int, capacity: int) -> int:
  """Resolves the cache capacity and raises a clear error if the request cannot fit."""
  need = prompt_width + max_new + extra
  if capacity == 0:
    return need
  if need > capacity:
    raise ValueError(
      f"prompt (padded to {prompt_width} tokens) + max_new_tokens {max_new} + {extra} draft slots "
      f"= {need} exceeds the cache capacity of {capacity} slots; shorten the prompt or raise capacity"
    )
  return capacity


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Prefill:
  """The target's pass over the prompts.

  Attributes:
    logits: [B, V] at each row's last prompt token.
    hidden: [B, Tp, D] final hidden states over the padded prompt.
    layer_hidden: [n, B, Tp, D] requested layer outputs, or None.
    cache: holds every prompt token; lengths = prompt_lens (padding slots are stale).
  """

  logits: jax.Array
  hidden: jax.Array
  layer_hidden: jax.Array | None
  cache: KVCache


def prefill(params, cfg, prompts, prompt_lens, capacity, hidden_layers=()) -> Prefill:
  """Runs the padded prompts through the target and returns logits at each row's last token.

  The returned cache holds every prompt token (lengths = prompt_lens); padding slots are stale.
  """
  cache = init_cache(cfg, prompts.shape[0], capacity)
  out = forward(
    params,
    prompts,
    cache,
    cfg,
    hidden_layers=hidden_layers,
    logit_positions=(prompt_lens - 1)[:, None],
  )
  return Prefill(
    out.logits[:, 0], out.hidden, out.layer_hidden, out.cache.with_lengths(prompt_lens)
  )


def init_sequence(prompts: jax.Array, prompt_lens: jax.Array, capacity: int) -> jax.Array:
  """The [B, capacity] token buffer holding each prompt at its start."""
  seq = jnp.zeros((prompts.shape[0], capacity), jnp.int32)
  return jax.lax.dynamic_update_slice(seq, prompts.astype(jnp.int32), (0, 0))


def is_stop(tokens: jax.Array, stop_tokens: tuple[int, ...]) -> jax.Array:
  if not stop_tokens:
    return jnp.zeros(tokens.shape, bool)
  return jnp.isin(tokens, jnp.asarray(stop_tokens, jnp.int32))


def extract_new_tokens(seq, prompt_lens, n_new, max_new) -> jax.Array:
  """Gathers each row's generated tokens into [B, max_new], zero past n_new."""
  idx = prompt_lens[:, None] + jnp.arange(max_new)[None, :]
  idx = jnp.minimum(idx, seq.shape[1] - 1)
  toks = jnp.take_along_axis(seq, idx, 1)
  return jnp.where(jnp.arange(max_new)[None, :] < n_new[:, None], toks, 0)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _ARState:
  seq: jax.Array  # [B, S] prompt + generated tokens
  seq_len: jax.Array  # [B]
  cache: KVCache  # holds seq[:, :seq_len - 1]
  done: jax.Array  # [B] bool
  passes: jax.Array  # [B] target passes after prefill
  key: jax.Array


@functools.partial(jax.jit, static_argnames=("cfg", "gen"))
def _generate(params, prompts, prompt_lens, budgets, key, cfg: ModelConfig, gen: GenerateConfig):
  B, Tp = prompts.shape
  capacity = gen.capacity or Tp + gen.max_new_tokens
  pre = prefill(params, cfg, prompts, prompt_lens, capacity)
  key, sub = jax.random.split(key)
  first = gen.sampling.sample(sub, pre.logits)
  seq = init_sequence(prompts, prompt_lens, capacity)
  seq = seq.at[jnp.arange(B), prompt_lens].set(first)
  done = is_stop(first, gen.stop_tokens) | (budgets <= 1)
  state = _ARState(seq, prompt_lens + 1, pre.cache, done, jnp.zeros((B,), jnp.int32), key)

  def cond(s: _ARState):
    return ~jnp.all(s.done)

  def body(s: _ARState):
    last = jnp.take_along_axis(s.seq, (s.seq_len - 1)[:, None], 1)  # [B, 1]
    out = forward(params, last, s.cache, cfg)
    key, sub = jax.random.split(s.key)
    nxt = gen.sampling.sample(sub, out.logits[:, 0])
    live = ~s.done
    pos = jnp.where(live, s.seq_len, capacity - 1)  # done rows write nowhere that matters
    seq = s.seq.at[jnp.arange(B), pos].set(jnp.where(live, nxt, s.seq[jnp.arange(B), pos]))
    seq_len = s.seq_len + live
    n_new = seq_len - prompt_lens
    done = s.done | (live & is_stop(nxt, gen.stop_tokens)) | (n_new >= budgets)
    cache = out.cache.with_lengths(seq_len - 1)
    return _ARState(seq, seq_len, cache, done, s.passes + live, key)

  state = jax.lax.while_loop(cond, body, state)
  n_new = state.seq_len - prompt_lens
  tokens = extract_new_tokens(state.seq, prompt_lens, n_new, gen.max_new_tokens)
  return GenerateOutput(tokens, n_new, state.passes)


def generate(
  params: Params,
  cfg: ModelConfig,
  prompts: jax.Array,
  prompt_lens: jax.Array,
  gen: GenerateConfig,
  key: jax.Array | None = None,
  max_new_per_row: jax.Array | None = None,
) -> GenerateOutput:
  """Generates up to `gen.max_new_tokens` tokens per row, the whole loop compiled.

  Args:
    params: target weights.
    cfg: target config.
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
  budgets = jnp.full((B,), gen.max_new_tokens, jnp.int32)
  if max_new_per_row is not None:
    budgets = jnp.minimum(budgets, jnp.asarray(max_new_per_row, jnp.int32))
  key = jax.random.PRNGKey(0) if key is None else key
  return _generate(params, prompts, jnp.asarray(prompt_lens, jnp.int32), budgets, key, cfg, gen)
