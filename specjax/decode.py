"""The decode state and the steps every loop shares: AR, chain, tree and SMC-SD decoding.

Every loop runs the same programme inside one jitted `lax.while_loop`:

    pre = prefill(...)                      the target reads the padded prompts once
    state = begin(...)                      first token, sequence buffer, drafter state
    state = while_loop(not all done, step)  one step = propose -> verify -> commit
    tokens, lengths = finish(state, ...)    each row's new tokens, zero past its length

The loops differ only in how a step verifies: a `Verifier` (chain rule `ChainVerifier` in
`specjax.speculative`, tree rule `TreeVerifier` in `specjax.tree_speculative`, SMC weighting
`SMCVerifier` in `specjax.smc`) turns a proposal into candidate tokens, an accepted count and the
target's cache, and accounts the step in the loop's metrics. `spec_step` is the shared step;
`target_step` the plain AR one (the AR baseline and the adaptive loops' K = 0 steps).

State invariant (`DecodeState`): `seq` [B, S] holds each row's prompt and generated tokens,
`seq_len` [B] how many are valid, and the target cache holds K/V for seq[:, :seq_len - 1]: the
last token is fed at the next step. Rows are ragged: each commits its own count per step.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import jax
import jax.numpy as jnp

from specjax.drafters.base import Prefill, StepResult
from specjax.kv_cache import KVCache, write_rows
from specjax.target import as_target


def prefill(params, cfg, prompts, prompt_lens, capacity, hidden_layers=()) -> Prefill:
  """Runs the padded prompts through the target and returns logits at each row's last token.

  The returned cache holds every prompt token (lengths = prompt_lens); padding slots are stale.
  """
  target = as_target(cfg)
  cache = target.init_cache(prompts.shape[0], capacity)
  out = target.forward(
    params, prompts, cache, hidden_layers=hidden_layers, logit_positions=(prompt_lens - 1)[:, None]
  )
  return Prefill(
    out.logits[:, 0], out.hidden, out.layer_hidden, out.cache.with_lengths(prompt_lens)
  )


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


def row_budgets(batch: int, max_new: int, max_new_per_row=None) -> jax.Array:
  """[B] int32 per-row token budgets: `max_new`, or less where `max_new_per_row` says so."""
  budgets = jnp.full((batch,), max_new, jnp.int32)
  if max_new_per_row is not None:
    budgets = jnp.minimum(budgets, jnp.asarray(max_new_per_row, jnp.int32))
  return budgets


def init_sequence(prompts: jax.Array, prompt_lens: jax.Array, capacity: int) -> jax.Array:
  """The [B, capacity] token buffer holding each prompt at its start."""
  seq = jnp.zeros((prompts.shape[0], capacity), jnp.int32)
  return jax.lax.dynamic_update_slice(seq, prompts.astype(jnp.int32), (0, 0))


def is_stop(tokens: jax.Array, stop_tokens: tuple[int, ...]) -> jax.Array:
  """[...] bool: which tokens end a row."""
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
class DecodeState:
  """The carry of every decode loop.

  Attributes:
    seq: [B, S] int32 prompt + generated tokens per row.
    seq_len: [B] int32 valid entries of `seq`.
    cache: the target cache; holds K/V of seq[:, :seq_len - 1].
    draft_state: the drafter's state pytree (() for AR).
    done: [B] bool rows that stopped (stop token or budget).
    metrics: the loop's counters: `SpecMetrics` (chain, tree), [B] target passes (AR), `SMCStats`
      (SMC-SD: weights, and a `SpecMetrics` per particle row).
    key: PRNG key of the next step.
  """

  seq: jax.Array
  seq_len: jax.Array
  cache: KVCache
  draft_state: Any
  done: jax.Array
  metrics: Any
  key: jax.Array


def begin(
  prompts, prompt_lens, first, budgets, stop_tokens, *, width, cache, draft_state, metrics, key
) -> DecodeState:
  """The state after prefill: each row's prompt then its first token in a [B, width] buffer."""
  seq = write_rows(init_sequence(prompts, prompt_lens, width), first[:, None], prompt_lens)
  done = is_stop(first, stop_tokens) | (budgets <= 1)
  return DecodeState(seq, prompt_lens + 1, cache, draft_state, done, metrics, key)


def start(
  params, cfg, prompts, prompt_lens, budgets, key, *, capacity, sampling, stop_tokens, metrics,
  drafter=None, draft_params=(), width=None,
) -> DecodeState:  # fmt: skip
  """Prefill, the first token sampled from the target, and the drafter's initial state.

  Args:
    params, cfg: the target.
    prompts: [B, Tp] right-padded prompts; prompt_lens [B] their lengths; budgets [B].
    key: PRNG key; one split draws the first token, the rest seeds the loop.
    capacity: target cache slots per row.
    sampling: how the target's logits become the first token.
    stop_tokens: tokens that end a row.
    metrics: the loop's initial counters.
    drafter, draft_params: the drafter (None for AR: no draft state, no layer outputs).
    width: the sequence buffer's width (default `capacity`).
  """
  layers = () if drafter is None else drafter.hidden_layers
  pre = prefill(params, cfg, prompts, prompt_lens, capacity, layers)
  key, sub = jax.random.split(key)
  first = sampling.sample(sub, pre.logits)
  draft_state = ()
  if drafter is not None:
    draft_state = drafter.init(draft_params, pre, prompts, prompt_lens, capacity)
  return begin(
    prompts, prompt_lens, first, budgets, stop_tokens, width=width or capacity, cache=pre.cache,
    draft_state=draft_state, metrics=metrics, key=key,
  )  # fmt: skip


def run(state: DecodeState, step) -> DecodeState:
  """Steps until every row is done, in one `lax.while_loop`."""
  return jax.lax.while_loop(lambda s: ~jnp.all(s.done), step, state)


def finish(state: DecodeState, prompt_lens, max_new: int) -> tuple[jax.Array, jax.Array]:
  """(tokens [B, max_new] zero past each row's length, lengths [B]) of the final state."""
  n_new = state.seq_len - prompt_lens
  return extract_new_tokens(state.seq, prompt_lens, n_new, max_new), n_new


def last_tokens(s: DecodeState) -> jax.Array:
  """[B, 1] each row's last committed token (not yet in the target cache)."""
  return jnp.take_along_axis(s.seq, (s.seq_len - 1)[:, None], 1)


def commit_count(candidates, n_accepted, n_new, budgets, stop_tokens):
  """Tokens each row appends: n_accepted + 1, cut after the first stop token and at the budget."""
  k1 = candidates.shape[1]
  pos = jnp.arange(k1)[None, :]
  stops = is_stop(candidates, stop_tokens) & (pos <= n_accepted[:, None])
  first_stop = jnp.where(jnp.any(stops, 1), jnp.argmax(stops, 1), k1)
  return jnp.minimum(jnp.minimum(n_accepted + 1, first_stop + 1), budgets - n_new)


def commit_tokens(s: DecodeState, cand, n_accepted, prompt_lens, budgets, stop_tokens):
  """Appends each live row's n_accepted + 1 candidates (cut at a stop token and the budget).

  Args:
    s: the state before the step.
    cand: [B, W] candidates: accepted drafts, then the rule's token at index n_accepted (entries
      past it are junk and land past the new length, where they stay stale).
    n_accepted: [B] drafts the rule accepted.
    prompt_lens, budgets: [B] per-row prompt lengths and token budgets.
    stop_tokens: tokens that end a row.

  Returns:
    (seq, seq_len, done, m): the new buffer, lengths and done flags, and [B] tokens appended
    (0 for rows that were already done).
  """
  live = ~s.done
  m = jnp.where(live, commit_count(cand, n_accepted, s.seq_len - prompt_lens, budgets,
                                   stop_tokens), 0)  # fmt: skip
  seq = write_rows(s.seq, cand, s.seq_len)
  seq_len = s.seq_len + m
  committed = jnp.arange(cand.shape[1])[None, :] < m[:, None]
  hit_stop = jnp.any(is_stop(cand, stop_tokens) & committed, 1)
  done = s.done | hit_stop | (seq_len - prompt_lens >= budgets)
  return seq, seq_len, done, m


def target_step(
  s: DecodeState, key, *, params, cfg, sampling, stop_tokens, prompt_lens, budgets,
  hidden_layers=(),
):  # fmt: skip
  """One AR step: the target reads each row's last token and every live row commits one token.

  Returns:
    (seq, seq_len, done, m, out): as `commit_tokens`, and the target's forward output (whose cache
    has not yet had its lengths advanced).
  """
  out = as_target(cfg).forward(params, last_tokens(s), s.cache, hidden_layers=hidden_layers)
  nxt = sampling.sample(key, out.logits[:, 0])  # [B]
  zeros = jnp.zeros_like(s.seq_len)
  seq, seq_len, done, m = commit_tokens(s, nxt[:, None], zeros, prompt_lens, budgets, stop_tokens)
  return seq, seq_len, done, m, out


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Verified:
  """What a verifier makes of one proposal.

  Attributes:
    cand: [B, W] candidates to commit (see `commit_tokens`).
    n_accepted: [B] drafts the rule accepted.
    n_drafted: [B] drafts proposed (for the metrics).
    cache: the target cache after the pass, accepted entries contiguous from seq_len - 1.
    hidden: [B, W, D] target hidden states at the accepted positions (index 0: the last token).
    layer_hidden: [n, B, W, D] the drafter's requested layer outputs there, or None.
    path: [B, W] accepted node ids (tree loops), or None.
    aux: whatever else the verifier's `account` needs (SMC: the weight terms), or None.
  """

  cand: jax.Array
  n_accepted: jax.Array
  n_drafted: jax.Array
  cache: KVCache
  hidden: jax.Array
  layer_hidden: jax.Array | None
  path: jax.Array | None = None
  aux: Any = None


class Verifier(Protocol):
  """How a loop verifies a proposal and keeps its counters (a static, hashable object)."""

  def verify(self, key, s: DecodeState, prop, *, params, cfg, hidden_layers) -> Verified:
    """Scores `prop` with the target in one forward pass and picks what each row keeps."""
    ...

  def account(self, metrics, live, v: Verified, m) -> Any:
    """The loop's counters after a step that appended m [B] tokens to the live rows."""
    ...


def spec_step(
  s: DecodeState, *, params, draft_params, cfg, drafter, verifier, draft_sampling, stop_tokens,
  prompt_lens, budgets, keys=None,
) -> DecodeState:  # fmt: skip
  """One speculative step: the drafter proposes, the verifier scores, every row commits its own.

  Args:
    s: the state.
    params, cfg: the target; draft_params, drafter: the drafter.
    verifier: a `Verifier`.
    draft_sampling: the `SamplingConfig` the drafter proposes with.
    stop_tokens: tokens that end a row; prompt_lens, budgets: [B].
    keys: (next key, drafting key, verifying key); default a three-way split of `s.key`.
  """
  key, k_draft, k_verify = jax.random.split(s.key, 3) if keys is None else keys
  prop = drafter.propose(draft_params, s.draft_state, s.seq, s.seq_len, k_draft, draft_sampling)
  v = verifier.verify(
    k_verify, s, prop, params=params, cfg=cfg, hidden_layers=drafter.hidden_layers
  )
  seq, seq_len, done, m = commit_tokens(s, v.cand, v.n_accepted, prompt_lens, budgets,
                                        stop_tokens)  # fmt: skip
  step = StepResult(s.seq_len, v.n_accepted, m, v.hidden, v.layer_hidden, v.path)
  draft_state = drafter.commit(draft_params, prop.state, seq, seq_len, step)
  metrics = verifier.account(s.metrics, ~s.done, v, m)
  cache = v.cache.with_lengths(seq_len - 1)
  return DecodeState(seq, seq_len, cache, draft_state, done, metrics, key)
