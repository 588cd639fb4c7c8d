"""SMC speculative decoding (SMC-SD, arXiv 2604.15672): importance-weighted particles, no rejection.

Each request is prefilled once and forked into N particles (its rows repeated). Every cycle each
particle drafts gamma tokens from the draft model at the draft temperature (keeping log q), the target
scores them in one pass, and a bonus token is drawn from the target's normalised power conditional
p_T^alpha / Z. Every token is kept. The particle's log-weight grows by

    sum_k (alpha * log p_T(x_k | x_<k) - log q(x_k | x_<k))  +  log Z(bonus context),

over the tokens it actually committed (positions after a stop token are masked). This is sequential
importance sampling for the sequence distribution pi(x) proportional to prod_t p_T(x_t | x_<t)^alpha
(alpha = 1: the target itself). When a request's effective sample size 1 / sum(w_norm^2) drops below
threshold * N, its particles are resampled (systematic by default, or multinomial): particles,
caches, drafter state and counters are gathered by ancestor index within the request's own rows,
weights reset, and the log normaliser estimate log Z accumulates log(mean w). At the end one particle
per request is drawn from the normalised weights; its counters (`SpecMetrics`, kept per particle row
in the loop) are the request's metrics.

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
from specjax.decode import (
  DecodeState,
  Verified,
  begin,
  check_capacity,
  finish,
  last_tokens,
  prefill,
  row_budgets,
  run,
  spec_step,
)
from specjax.kv_cache import KVCache
from specjax.metrics import SpecMetrics
from specjax.model import Params
from specjax.sampling import SamplingConfig
from specjax.target import TargetModel, as_target


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
    metrics: the chosen particle's counters per request (`SpecMetrics`, R rows), counted in the
      loop for its lineage: its target passes are the cycles in which it (or, before a resampling,
      its ancestor) was live, at most `target_passes` (fewer when it stopped before the request's
      other particles).
    particle_tokens: [R, N, max_new_tokens] every particle's tokens; particle_lengths [R, N].
    log_weights: [R, N] final log-weights.
  """

  tokens: jax.Array
  lengths: jax.Array
  log_z: jax.Array
  ess: jax.Array
  resamples: jax.Array
  target_passes: jax.Array
  metrics: SpecMetrics
  particle_tokens: jax.Array
  particle_lengths: jax.Array
  log_weights: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SMCStats:
  """SMC-SD's counters (the `metrics` of its `DecodeState`, whose rows are R * N particles).

  Attributes:
    logw: [R, N] particle log-weights since the last resampling.
    log_z: [R] accumulated log normaliser estimate.
    ess: [R, C] effective sample size after each cycle (-1 past the end).
    resamples: [R] resamplings so far.
    passes: [R] verify passes (cycles) each request ran.
    cycle: scalar cycle counter.
    counters: each particle row's `SpecMetrics` (R * N rows), gathered with the row's other state
      when its request resamples, so that they count the row's own lineage.
  """

  logw: jax.Array
  log_z: jax.Array
  ess: jax.Array
  resamples: jax.Array
  passes: jax.Array
  cycle: jax.Array
  counters: SpecMetrics


@dataclasses.dataclass(frozen=True)
class SMCVerifier:
  """SMC-SD's verify plug-in: every drafted token is kept, a bonus token is drawn from the
  target's power conditional p_T^alpha / Z, and `account` adds each particle's importance
  weight for what it committed (`incremental_log_weight`) and counts the cycle in the particle's
  `SpecMetrics`: all K drafts proposed and accepted by the rule, of which those committed (all, or
  the first m <= K when a stop token or the budget cut the cycle) count as accepted and reached."""

  smc: SMCConfig
  k: int
  drafter_name: str = "the drafter"

  def verify(self, key, s: DecodeState, prop, *, params, cfg, hidden_layers) -> Verified:
    smc, K = self.smc, self.k
    if prop.logq is None:
      raise TypeError(f"SMC-SD needs draft distributions q; {self.drafter_name} yields none")
    tokens = jnp.concatenate([last_tokens(s), prop.tokens], 1)
    out = as_target(cfg).forward(params, tokens, s.cache, hidden_layers=hidden_layers)
    logp = jax.nn.log_softmax(out.logits / smc.target_temperature, -1)  # [R*N, K + 1, V]
    take = lambda lp: jnp.take_along_axis(lp, prop.tokens[..., None], -1)[..., 0]  # noqa: E731
    power = smc.alpha * logp[:, K]
    bonus = jax.random.categorical(key, power, -1).astype(jnp.int32)
    cand = jnp.concatenate([prop.tokens, bonus[:, None]], 1)  # [R*N, K + 1]
    n_acc = jnp.full(s.seq_len.shape, K, jnp.int32)
    aux = (take(logp[:, :K]), take(prop.logq), jax.nn.logsumexp(power, -1))
    return Verified(cand, n_acc, n_acc, out.cache, out.hidden, out.layer_hidden, aux=aux)

  def account(self, st: SMCStats, live, v: Verified, m) -> SMCStats:
    R, N = st.logw.shape
    logp_draft, logq_draft, log_z_bonus = v.aux
    inc = jax.vmap(incremental_log_weight, in_axes=(0, 0, 0, 0, None))(
      logp_draft, logq_draft, log_z_bonus, m, self.smc.alpha
    )
    logw = st.logw + inc.reshape(R, N)
    group_live = jnp.any(live.reshape(R, N), 1)
    ess = st.ess.at[:, st.cycle].set(jnp.where(group_live, effective_sample_size(logw), -1.0))
    counters = st.counters.update(live, v.n_drafted, v.n_accepted, m)
    return SMCStats(
      logw, st.log_z, ess, st.resamples, st.passes + group_live, st.cycle + 1, counters
    )


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

  def take(x, ax):  # batched over requests in place (no moveaxis: XLA copied whole caches to
    # a batch-major layout and back around every cycle)
    g = x.reshape(x.shape[:ax] + (R, N) + x.shape[ax + 1 :])
    pick = lambda rows, idx: jnp.take(rows, idx, axis=ax)  # noqa: E731
    return jax.vmap(pick, in_axes=(ax, 0), out_axes=ax)(g, ancestors).reshape(x.shape)

  return _map_rows(take, tree, axes)


def _rows(s: DecodeState):
  return (s.seq, s.seq_len, s.done, s.cache, s.draft_state, s.metrics.counters)


def _row_axes(draft_axes):
  return (0, 0, 0, KVCache(1, 1, 0), draft_axes, SpecMetrics(0, 0, 0, 0, 0, 0))


def resample(s: DecodeState, key, need, smc: SMCConfig, draft_axes) -> DecodeState:
  """Resamples the particles of the requests that `need` [R] it, within each request's rows."""
  st = s.metrics
  R, N = st.logw.shape
  ancestors = jax.vmap(RESAMPLERS[smc.resampling])(jax.random.split(key, R), st.logw)  # [R, N]
  ancestors = jnp.where(need[:, None], ancestors, jnp.arange(N)[None, :])
  seq, seq_len, done, cache, draft_state, counters = take_within_groups(
    _rows(s), _row_axes(draft_axes), ancestors
  )
  log_mean_w = jax.nn.logsumexp(st.logw, -1) - math.log(N)
  st = dataclasses.replace(
    st,
    logw=jnp.where(need[:, None], 0.0, st.logw),
    log_z=st.log_z + jnp.where(need, log_mean_w, 0.0),
    resamples=st.resamples + need,
    counters=counters,
  )
  return DecodeState(seq, seq_len, cache, draft_state, done, st, s.key)


def _cycle(s: DecodeState, *, smc: SMCConfig, draft_axes, drafter, **kw) -> DecodeState:
  """One SMC-SD cycle: `decode.spec_step` with the SMC verifier, then resampling where needed."""
  key, k_draft, k_bonus, k_res = jax.random.split(s.key, 4)
  R, N = s.metrics.logw.shape
  group_live = jnp.any(~s.done.reshape(R, N), 1)  # the requests that run this cycle
  s = spec_step(
    s, drafter=drafter, verifier=SMCVerifier(smc, drafter.k, type(drafter).__name__), keys=(key, k_draft, k_bonus),
    draft_sampling=SamplingConfig(temperature=smc.draft_temperature),
    stop_tokens=smc.stop_tokens, **kw,
  )  # fmt: skip
  need = group_live & (effective_sample_size(s.metrics.logw) < smc.ess_threshold * N)
  if smc.ess_threshold >= 1.0:
    need = group_live  # "always" also covers an ESS of exactly N
  return jax.lax.cond(
    jnp.any(need), lambda s: resample(s, k_res, need, smc, draft_axes), lambda s: s, s
  )


@functools.partial(jax.jit, static_argnames=("cfg", "drafter", "smc"))
def _smc(params, draft_params, prompts, prompt_lens, budgets, key, cfg, drafter, smc: SMCConfig):
  R, Tp = prompts.shape
  N, K = smc.n_particles, drafter.k
  capacity = smc.capacity or Tp + smc.max_new_tokens + K + 1 + drafter.capacity_slack()
  pre = prefill(params, cfg, prompts, prompt_lens, capacity, drafter.hidden_layers)
  draft_state = drafter.init(draft_params, pre, prompts, prompt_lens, capacity)

  def draft_state_of(b):
    P, L = jnp.zeros((b, Tp), jnp.int32), jnp.ones((b,), jnp.int32)
    pre = prefill(params, cfg, P, L, capacity, drafter.hidden_layers)
    return drafter.init(draft_params, pre, P, L, capacity)

  draft_axes = batch_axes(draft_state_of)
  # Fork: particle rows r * N + j share request r's prefill (a repeat, local to each data shard).
  prompts, lens, budgets, cache, draft_state = fork_rows(
    (prompts, prompt_lens, budgets, pre.cache, draft_state),
    (0, 0, 0, KVCache(1, 1, 0), draft_axes),
    N,
  )
  key, k_first, k_loop = jax.random.split(key, 3)
  power = smc.alpha * jax.nn.log_softmax(pre.logits / smc.target_temperature, -1)  # [R, V]
  first = jax.random.categorical(k_first, jnp.repeat(power, N, 0), -1).astype(jnp.int32)  # [R*N]
  n_cycles = -(-(smc.max_new_tokens - 1) // (K + 1)) + 1
  stats = SMCStats(
    logw=jnp.zeros((R, N)),
    log_z=jax.nn.logsumexp(power, -1),
    ess=jnp.full((R, n_cycles), -1.0),
    resamples=jnp.zeros((R,), jnp.int32),
    passes=jnp.zeros((R,), jnp.int32),
    cycle=jnp.int32(0),
    counters=SpecMetrics.zeros(R * N, K),
  )
  state = begin(
    prompts, lens, first, budgets, smc.stop_tokens, width=capacity, cache=cache,
    draft_state=draft_state, metrics=stats, key=k_loop,
  )  # fmt: skip
  body = functools.partial(
    _cycle, params=params, draft_params=draft_params, cfg=cfg, drafter=drafter, smc=smc,
    prompt_lens=lens, budgets=budgets, draft_axes=draft_axes,
  )  # fmt: skip
  state = run(state, body)
  toks, n_new = finish(state, lens, smc.max_new_tokens)
  toks, n_new = toks.reshape(R, N, -1), n_new.reshape(R, N)
  logw = state.metrics.logw
  pick = jax.random.categorical(key, logw, -1)  # [R]
  chosen = jax.vmap(lambda rows, i: rows[i])
  counters = jax.tree.map(
    lambda x: chosen(x.reshape((R, N) + x.shape[1:]), pick), state.metrics.counters
  )
  log_z = state.metrics.log_z + jax.nn.logsumexp(logw, -1) - math.log(N)
  return SMCOutput(
    tokens=chosen(toks, pick),
    lengths=chosen(n_new, pick),
    log_z=log_z,
    ess=state.metrics.ess,
    resamples=state.metrics.resamples,
    target_passes=state.metrics.passes,
    metrics=counters,
    particle_tokens=toks,
    particle_lengths=n_new,
    log_weights=logw,
  )


def smc_generate(
  params: Params,
  cfg: ModelConfig | TargetModel,
  drafter,
  draft_params,
  prompts: jax.Array,
  prompt_lens: jax.Array,
  smc: SMCConfig,
  key: jax.Array,
  max_new_per_row: jax.Array | None = None,
) -> SMCOutput:
  """SMC speculative decoding of R requests with N particles each, in one compiled loop.

  Args:
    params: target weights.
    cfg: the target model (static): a ModelConfig for specjax's Llama forward, or any
      `specjax.target.TargetModel` (e.g. `specjax.nnx_target.NNXTarget`).
    drafter: a drafter that yields q (e.g. `DraftModelDrafter`); its `k` is gamma.
    draft_params: the drafter's parameters.
    prompts: [R, Tp] right-padded prompts.
    prompt_lens: [R] prompt lengths.
    smc: static SMC settings.
    key: PRNG key.
    max_new_per_row: optional [R] token budgets per request (at most smc.max_new_tokens; traced,
      so other budgets reuse the compiled loop).

  Returns:
    An `SMCOutput`.
  """
  slack = drafter.k + 1 + drafter.capacity_slack()
  check_capacity(prompts.shape[1], smc.max_new_tokens, slack, smc.capacity)
  prompt_lens = jnp.asarray(prompt_lens, jnp.int32)
  budgets = row_budgets(prompts.shape[0], smc.max_new_tokens, max_new_per_row)
  return _smc(params, draft_params, prompts, prompt_lens, budgets, key, cfg, drafter, smc)
