"""SMC speculative decoding (SMC-SD, arXiv 2604.15672): importance-weighted particles, no rejection.

Each request is prefilled once and forked into N particles (its rows repeated). Every cycle each
particle drafts gamma tokens from the draft model at the draft temperature (keeping log q), the target
scores them in one pass, and a bonus token is drawn from the target's normalised power conditional
p_T^alpha / Z. Every token is kept. The particle's log-weight grows by

    sum_k (alpha * log p_T(x_k | x_<k) - log q(x_k | x_<k))  +  log Z(bonus context),

over the tokens it actually committed (positions after a stop token are masked). This is sequential
importance sampling for the sequence distribution pi(x) proportional to prod_t p_T(x_t | x_<t)^alpha
(alpha = 1: the target itself). When a request's effective sample size 1 / sum(w_norm^2) drops below
threshold * N, its particles are resampled (systematic by default, or multinomial): particles, caches
and drafter state are gathered by ancestor index within the request's own rows, weights reset, and
the log normaliser estimate log Z accumulates log(mean w). At the end one particle per request is drawn from the normalised weights.

Unlike the speculative-sampling loop, SMC-SD is not exact for finite N: it is consistent (the output
distribution approaches pi as N grows). Draft length here is `drafter.k` (= gamma); the draft model's
two-token catch-up window means gamma draft forwards per cycle (no discarded overdraft step).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from specjax.config import ModelConfig
from specjax.drafters.base import StepResult
from specjax.generate import check_capacity, extract_new_tokens, init_sequence, is_stop, prefill
from specjax.kv_cache import KVCache, write_rows
from specjax.model import Params, forward
from specjax.sampling import SamplingConfig
from specjax.speculative import commit_count


@dataclasses.dataclass(frozen=True)
class SMCConfig:
  """Static settings of SMC-SD (defaults follow the reference implementation).

  Attributes:
    n_particles: N particles per request.
    draft_temperature: temperature of the draft proposals q.
    target_temperature: temperature T of the target p_T.
    alpha: power of the target (1.0 samples p_T itself).
    ess_threshold: resample a request when ESS < threshold * N (0 never, 1 always).
    resampling: "systematic" or "multinomial".
    max_new_tokens: output budget per request.
    stop_tokens: tokens that end a particle.
    capacity: cache slots per row (0: derived).
  """

  n_particles: int = 4
  draft_temperature: float = 0.7
  target_temperature: float = 1.0
  alpha: float = 1.0
  ess_threshold: float = 0.5
  resampling: str = "systematic"
  max_new_tokens: int = 128
  stop_tokens: tuple[int, ...] = ()
  capacity: int = 0

  def __post_init__(self):
    if self.n_particles < 1:
      raise ValueError("n_particles must be >= 1")
    if self.draft_temperature <= 0 or self.target_temperature <= 0:
      raise ValueError("SMC-SD needs draft_temperature > 0 and target_temperature > 0")
    if self.resampling not in ("systematic", "multinomial"):
      raise ValueError(f"resampling must be systematic or multinomial, got {self.resampling!r}")
    if not 0.0 <= self.ess_threshold <= 1.0:
      raise ValueError("ess_threshold must be in [0, 1]")


def effective_sample_size(logw: jax.Array) -> jax.Array:
  """ESS = 1 / sum(w_norm^2) over the last axis of log-weights."""
  w = jax.nn.softmax(logw, -1)
  return 1.0 / jnp.sum(w * w, -1)


def systematic_resample(key: jax.Array, logw: jax.Array) -> jax.Array:
  """Ancestor indices [N] by systematic resampling: one uniform, N evenly spaced points on the CDF."""
  n = logw.shape[-1]
  cdf = jnp.cumsum(jax.nn.softmax(logw, -1))
  points = (jax.random.uniform(key) + jnp.arange(n)) / n
  return jnp.minimum(jnp.searchsorted(cdf, points, side="right"), n - 1).astype(jnp.int32)


def multinomial_resample(key: jax.Array, logw: jax.Array) -> jax.Array:
  """Ancestor indices [N] drawn i.i.d. from the normalised weights."""
  n = logw.shape[-1]
  return jax.random.categorical(key, logw, shape=(n,)).astype(jnp.int32)


RESAMPLERS = {"systematic": systematic_resample, "multinomial": multinomial_resample}


def incremental_log_weight(logp_draft, logq_draft, log_z_bonus, n_committed, alpha):
  """The log-weight gained in one cycle by one particle.

  Args:
    logp_draft: [K] log p_T of each drafted token under the target at temperature T.
    logq_draft: [K] log q of each drafted token under the draft.
    log_z_bonus: scalar log sum_x p_T(x)^alpha at the bonus position.
    n_committed: tokens committed this cycle (drafted tokens first, then the bonus at index K).
    alpha: target power.

  Returns:
    sum over committed drafted tokens of alpha * log p - log q, plus log Z if the bonus was committed.
  """
  K = logp_draft.shape[0]
  mask = jnp.arange(K) < n_committed
  inc = jnp.sum(jnp.where(mask, alpha * logp_draft - logq_draft, 0.0))
  return inc + jnp.where(n_committed > K, log_z_bonus, 0.0)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SMCOutput:
  """Result of `smc_generate`.

  Attributes:
    tokens: [R, max_new_tokens] the chosen particle's tokens per request.
    lengths: [R] its length.
    log_z: [R] estimate of log of the normaliser of pi over continuations (0 for alpha = 1 up to
      noise; a diagnostic of weight quality).
    ess: [R, C] effective sample size after each cycle (before any resampling); -1 past the end.
    resamples: [R] how many times each request was resampled.
    target_passes: [R] verify passes (cycles) each request ran.
    particle_tokens: [R, N, max_new_tokens] every particle's tokens; particle_lengths [R, N].
    log_weights: [R, N] final log-weights.
  """

  tokens: jax.Array
  lengths: jax.Array
  log_z: jax.Array
  ess: jax.Array
  resamples: jax.Array
  target_passes: jax.Array
  particle_tokens: jax.Array
  particle_lengths: jax.Array
  log_weights: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _SMCState:
  seq: jax.Array  # [R*N, S]
  seq_len: jax.Array  # [R*N]
  cache: KVCache
  draft_state: Any
  done: jax.Array  # [R*N]
  logw: jax.Array  # [R, N]
  log_z: jax.Array  # [R]
  ess: jax.Array  # [R, C]
  resamples: jax.Array  # [R]
  passes: jax.Array  # [R]
  cycle: jax.Array  # scalar
  key: jax.Array


def batch_axes(make_state) -> Any:
  """Which axis of each leaf of a state indexes batch rows (None: a leaf shared by all rows).

  Args:
    make_state: batch size -> a state pytree (traced abstractly at batch sizes 2 and 3, never run).

  Returns:
    A pytree of the state's structure with an int or None at each leaf.
  """
  two, three = jax.eval_shape(lambda: make_state(2)), jax.eval_shape(lambda: make_state(3))

  def axis(a, b):
    diff = [i for i, (m, n) in enumerate(zip(a.shape, b.shape)) if m != n]
    if len(diff) > 1 or len(a.shape) != len(b.shape):
      raise ValueError(f"a state leaf changes shape {a.shape} -> {b.shape} in more than one axis")
    return diff[0] if diff else None

  return jax.tree.map(axis, two, three)


def _map_rows(fn, tree, axes):
  """Applies fn(leaf, axis) to every leaf that has a batch axis."""
  return jax.tree.map(
    lambda ax, x: x if ax is None else fn(x, ax), axes, tree, is_leaf=lambda a: a is None
  )


def fork_rows(tree, axes, n: int):
  """Repeats each row n times along its batch axis: row r * n + j of the result is row r."""
  return _map_rows(lambda x, ax: jnp.repeat(x, n, axis=ax), tree, axes)


def take_within_groups(tree, axes, ancestors: jax.Array):
  """Resamples rows inside each request's group of N particle rows.

  Rows are laid out request-major (row r * N + j is particle j of request r). Row r * N + j of the
  result is row r * N + ancestors[r, j]. The gather is batched over requests (vmap over R), so
  under a mesh that splits rows over a data axis XLA keeps it on each shard instead of
  all-gathering the caches, as a flat gather by global row index would.

  Args:
    tree: state pytree with R * N rows on each leaf's batch axis.
    axes: `batch_axes` of the tree.
    ancestors: [R, N] int32 indices in [0, N).
  """
  R, N = ancestors.shape

  def take(x, ax):
    g = jnp.moveaxis(x, ax, 0)
    g = g.reshape((R, N) + g.shape[1:])
    g = jax.vmap(lambda rows, idx: rows[idx])(g, ancestors)
    return jnp.moveaxis(g.reshape((R * N,) + g.shape[2:]), 0, ax)

  return _map_rows(take, tree, axes)


def _rows(s: _SMCState):
  return (s.seq, s.seq_len, s.done, s.cache, s.draft_state)


def _row_axes(draft_axes):
  return (0, 0, 0, KVCache(1, 1, 0), draft_axes)


def _cycle(
  s: _SMCState, *, params, draft_params, cfg, drafter, smc: SMCConfig, prompt_lens, draft_axes
):
  R, N = s.logw.shape
  K = drafter.k
  key, k_draft, k_bonus, k_res = jax.random.split(s.key, 4)
  draft_sampling = SamplingConfig(temperature=smc.draft_temperature)
  prop = drafter.propose(draft_params, s.draft_state, s.seq, s.seq_len, k_draft, draft_sampling)
  if prop.logq is None:
    raise TypeError(f"SMC-SD needs draft distributions q; {type(drafter).__name__} yields none")
  last = jnp.take_along_axis(s.seq, (s.seq_len - 1)[:, None], 1)
  out = forward(params, jnp.concatenate([last, prop.tokens], 1), s.cache, cfg)
  logp = jax.nn.log_softmax(out.logits / smc.target_temperature, -1)  # [R*N, K + 1, V]
  take = lambda lp: jnp.take_along_axis(lp, prop.tokens[..., None], -1)[..., 0]
  logp_draft, logq_draft = take(logp[:, :K]), take(prop.logq)
  power = smc.alpha * logp[:, K]
  log_z_bonus = jax.nn.logsumexp(power, -1)
  bonus = jax.random.categorical(k_bonus, power, -1).astype(jnp.int32)
  cand = jnp.concatenate([prop.tokens, bonus[:, None]], 1)  # [R*N, K + 1]

  live = ~s.done
  budgets = jnp.full_like(prompt_lens, smc.max_new_tokens)
  n_acc = jnp.full_like(prompt_lens, K)
  m = jnp.where(
    live, commit_count(cand, n_acc, s.seq_len - prompt_lens, budgets, smc.stop_tokens), 0
  )
  inc = jax.vmap(incremental_log_weight, in_axes=(0, 0, 0, 0, None))(
    logp_draft, logq_draft, log_z_bonus, m, smc.alpha
  )
  seq = write_rows(s.seq, cand, s.seq_len)
  seq_len = s.seq_len + m
  committed = jnp.arange(K + 1)[None, :] < m[:, None]
  hit_stop = jnp.any(is_stop(cand, smc.stop_tokens) & committed, 1)
  done = s.done | hit_stop | (seq_len - prompt_lens >= smc.max_new_tokens)
  draft_state = drafter.commit(
    draft_params, prop.state, seq, seq_len, StepResult(s.seq_len, n_acc, m, out.hidden)
  )
  logw = s.logw + inc.reshape(R, N)
  group_live = jnp.any(live.reshape(R, N), 1)
  ess = effective_sample_size(logw)
  s = _SMCState(
    seq=seq,
    seq_len=seq_len,
    cache=out.cache.with_lengths(seq_len - 1),
    draft_state=draft_state,
    done=done,
    logw=logw,
    log_z=s.log_z,
    ess=s.ess.at[:, s.cycle].set(jnp.where(group_live, ess, -1.0)),
    resamples=s.resamples,
    passes=s.passes + group_live,
    cycle=s.cycle + 1,
    key=key,
  )

  need = group_live & (ess < smc.ess_threshold * N)
  if smc.ess_threshold >= 1.0:
    need = group_live  # "always" also covers an ESS of exactly N

  def resample(s: _SMCState) -> _SMCState:
    keys = jax.random.split(k_res, R)
    ancestors = jax.vmap(RESAMPLERS[smc.resampling])(keys, s.logw)  # [R, N]
    ancestors = jnp.where(need[:, None], ancestors, jnp.arange(N)[None, :])
    seq, seq_len, done, cache, draft_state = take_within_groups(
      _rows(s), _row_axes(draft_axes), ancestors
    )
    s = dataclasses.replace(
      s, seq=seq, seq_len=seq_len, done=done, cache=cache, draft_state=draft_state
    )
    log_mean_w = jax.nn.logsumexp(s.logw, -1) - math.log(N)
    return dataclasses.replace(
      s,
      logw=jnp.where(need[:, None], 0.0, s.logw),
      log_z=s.log_z + jnp.where(need, log_mean_w, 0.0),
      resamples=s.resamples + need,
    )

  return jax.lax.cond(jnp.any(need), resample, lambda s: s, s)


@functools.partial(jax.jit, static_argnames=("cfg", "drafter", "smc"))
def _smc(params, draft_params, prompts, prompt_lens, key, cfg, drafter, smc: SMCConfig):
  R, Tp = prompts.shape
  N, K = smc.n_particles, drafter.k
  capacity = smc.capacity or Tp + smc.max_new_tokens + K + 1 + drafter.capacity_slack()
  pre = prefill(params, cfg, prompts, prompt_lens, capacity)
  draft_state = drafter.init(draft_params, pre, prompts, prompt_lens, capacity)

  def draft_state_of(b):
    P, L = jnp.zeros((b, Tp), jnp.int32), jnp.ones((b,), jnp.int32)
    return drafter.init(draft_params, prefill(params, cfg, P, L, capacity), P, L, capacity)

  draft_axes = batch_axes(draft_state_of)
  # Fork: particle rows r * N + j share request r's prefill (a repeat, local to each data shard).
  seq, lens, cache, draft_state = fork_rows(
    (init_sequence(prompts, prompt_lens, capacity), prompt_lens, pre.cache, draft_state),
    (0, 0, KVCache(1, 1, 0), draft_axes),
    N,
  )
  key, k_first, k_loop = jax.random.split(key, 3)
  power = smc.alpha * jax.nn.log_softmax(pre.logits / smc.target_temperature, -1)  # [R, V]
  first = jax.random.categorical(k_first, jnp.repeat(power, N, 0), -1).astype(jnp.int32)  # [R*N]
  seq = write_rows(seq, first[:, None], lens)
  n_cycles = -(-(smc.max_new_tokens - 1) // (K + 1)) + 1
  state = _SMCState(
    seq=seq,
    seq_len=lens + 1,
    cache=cache,
    draft_state=draft_state,
    done=is_stop(first, smc.stop_tokens) | (smc.max_new_tokens <= 1),
    logw=jnp.zeros((R, N)),
    log_z=jax.nn.logsumexp(power, -1),
    ess=jnp.full((R, n_cycles), -1.0),
    resamples=jnp.zeros((R,), jnp.int32),
    passes=jnp.zeros((R,), jnp.int32),
    cycle=jnp.int32(0),
    key=k_loop,
  )
  body = functools.partial(
    _cycle,
    params=params,
    draft_params=draft_params,
    cfg=cfg,
    drafter=drafter,
    smc=smc,
    prompt_lens=lens,
    draft_axes=draft_axes,
  )
  state = jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, state)
  n_new = state.seq_len - lens
  toks = extract_new_tokens(state.seq, lens, n_new, smc.max_new_tokens).reshape(R, N, -1)
  n_new = n_new.reshape(R, N)
  pick = jax.random.categorical(key, state.logw, -1)  # [R]
  chosen = jax.vmap(lambda rows, i: rows[i])
  log_z = state.log_z + jax.nn.logsumexp(state.logw, -1) - math.log(N)
  return SMCOutput(
    tokens=chosen(toks, pick),
    lengths=chosen(n_new, pick),
    log_z=log_z,
    ess=state.ess,
    resamples=state.resamples,
    target_passes=state.passes,
    particle_tokens=toks,
    particle_lengths=n_new,
    log_weights=state.logw,
  )


def smc_generate(
  params: Params,
  cfg: ModelConfig,
  drafter,
  draft_params,
  prompts: jax.Array,
  prompt_lens: jax.Array,
  smc: SMCConfig,
  key: jax.Array,
) -> SMCOutput:
  """SMC speculative decoding of R requests with N particles each, in one compiled loop.

  Args:
    params: target weights.
    cfg: target config (static).
    drafter: a drafter that yields q (e.g. `DraftModelDrafter`); its `k` is gamma.
    draft_params: the drafter's parameters.
    prompts: [R, Tp] right-padded prompts.
    prompt_lens: [R] prompt lengths.
    smc: static SMC settings.
    key: PRNG key.

  Returns:
    An `SMCOutput`.
  """
  slack = drafter.k + 1 + drafter.capacity_slack()
  check_capacity(prompts.shape[1], smc.max_new_tokens, slack, smc.capacity)
  prompt_lens = jnp.asarray(prompt_lens, jnp.int32)
  return _smc(params, draft_params, prompts, prompt_lens, key, cfg, drafter, smc)
