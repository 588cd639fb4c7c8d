"""Adaptive speculation inside the compiled loop: each step picks K (0 = a plain AR step) on device.

Estimator (per row and drafted depth). Each drafted depth d of row b is accepted, given that depth
d - 1 was, with probability alpha_{b,d} (parallel drafters such as P-EAGLE fall off steeply with
depth: one alpha for every depth, as `specjax.k_policy` assumes, overrates their long drafts). Each
(b, d) keeps a Beta(a0, b0) prior and decayed counts of the evidence the row's steps gave: a step
with K > 0 drafts that committed n drafts shows successes at depths 1..n, plus one failure at
depth n + 1 when n < K and the step also committed a correction token (a rejected draft, or a
position the drafter had no proposal for: prompt-lookup misses count, as in
`k_policy.alpha_from_tokens_per_step`). A last step cut by a stop token or the budget shows no
failure (the row is done anyway). K = 0 steps show nothing. Every step of a live row first
multiplies its counts by `decay` (1.0: the plain Beta posterior), so old evidence fades back to the
prior, which makes a row that stopped speculating try again once the prior alone would pay:

    s_bd <- decay * s_bd + [d <= n_b],   f_bd <- decay * f_bd + [d = n_b + 1, failed_b],
    alpha_bd = (a0 + s_bd) / (a0 + b0 + s_bd + f_bd).

Decision (per batch). Among static choices K in {0, K_1, .., K_max}, with cost(K) = the measured
time of a step with K drafts in units of one AR step (verify(K) + drafting; `CostTable`), pick

    argmax_K  sum over live rows b of E_b(K) / cost(K),
    E_b(K) = 1 + alpha_b1 + alpha_b1 alpha_b2 + .. + alpha_b1 .. alpha_bK,

i.e. the most expected committed tokens per unit time; ties go to the smaller K. Every row then
runs that step (one compiled step variant per K, picked on device by `run_one_of`), so per step the
acceptance rule is exactly the fixed-K loop's and the output distribution is unchanged.

The loop keeps the K chosen at each step (`AdaptiveTrace`). Decisions, estimates and traces are
jnp arrays inside the `lax.while_loop`: nothing syncs with the host.

When the loop would never draft (`never_drafts`: K = 0 steps give no evidence, so every estimate
stays at the prior, and the prior's choice is K = 0), the chain and tree entry points run the plain
AR loop instead (`AdaptiveConfig.ar_fallback`): the same tokens with no drafter set-up and no
per-step bookkeeping. This is how the loop turns speculation off where verification is
compute-bound (batch 8 on a 2-core CPU prices a 3-token pass at 2.1-2.6 AR steps), like vLLM's
`speculative_disable_by_batch_size`, but decided from the cost table.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from specjax.branching import run_one_of
from specjax.decode import DecodeState, target_step
from specjax.drafters.base import StepResult
from specjax.kernels import build as kernels_build
from specjax.kernels import projection


@dataclasses.dataclass(frozen=True)
class CostTable:
  """Measured cost of one decode step per choice of K, in units of one AR step.

  Attributes:
    ks: the choices, ascending, starting with 0 (an AR step).
    verify: verify[i] = a target pass over ks[i] + 1 tokens per row (over the drafter's tree for
      the tree loop) relative to an AR step (so normally verify[0] = 1).
    draft: draft[i] = drafting time of a step with ks[i] drafts; draft[0] is what an AR step spends
      keeping the drafter's state current (0 for stateless and lazily caught-up drafters, see
      `observer`).

  Only `step_costs` (verify + draft) enters the decision. A table measured by
  `specjax.experiment.calibrate` times whole steps of the loop: each is in `verify` (the loop's
  own AR step is the unit) and `draft` is all 0.
  """

  ks: tuple[int, ...]
  verify: tuple[float, ...]
  draft: tuple[float, ...]

  def __post_init__(self):
    if not self.ks or self.ks[0] != 0 or list(self.ks) != sorted(set(self.ks)):
      raise ValueError(f"choices must be distinct, ascending and start at 0, got {self.ks}")
    if not len(self.verify) == len(self.draft) == len(self.ks):
      raise ValueError("one verify and one draft cost per choice")
    if min(self.verify) <= 0 or min(self.draft) < 0:
      raise ValueError("verify costs must be > 0 and draft costs >= 0")

  @property
  def step_costs(self) -> tuple[float, ...]:
    return tuple(v + d for v, d in zip(self.verify, self.draft))

  def to_json(self) -> dict:
    return {"ks": list(self.ks), "verify": list(self.verify), "draft": list(self.draft)}

  @classmethod
  def from_json(cls, d: Mapping) -> CostTable:
    return cls(tuple(int(k) for k in d["ks"]), tuple(map(float, d["verify"])),
               tuple(map(float, d["draft"])))  # fmt: skip


def cost_table_from_rates(
  ks: Sequence[int],
  verify: Mapping[int, float],
  draft_per_token: float = 0.0,
  draft_fixed: float = 0.0,
  observe: float = 0.0,
) -> CostTable:
  """A `CostTable` from verify(K) per K and the k_policy draft model: fixed + K * per_token.

  Args:
    ks: the choices (0 first).
    verify: K -> verify cost relative to an AR step, for every K in ks.
    draft_per_token: draft cost per drafted token (c), relative to an AR step.
    draft_fixed: draft cost per speculative step independent of K.
    observe: what an AR step of the adaptive loop spends on the drafter (draft[0]).
  """
  ks = tuple(int(k) for k in ks)
  draft = tuple(observe if k == 0 else draft_fixed + k * draft_per_token for k in ks)
  return CostTable(ks, tuple(float(verify[k]) for k in ks), draft)


@dataclasses.dataclass(frozen=True)
class AdaptiveConfig:
  """Static settings of adaptive speculation (hashable: a static argument of the jitted loops).

  The cost table is not part of it: it enters the compiled loop as an array, so a new table
  does not recompile.

  Attributes:
    ks: the choices, ascending, starting with 0 (for the tree loop (0, max_depth)).
    prior_a, prior_b: the Beta prior of each row's alpha.
    decay: evidence kept per step (1.0: never forget).
    ar_fallback: run the plain AR loop when the cost table makes the loop take K = 0 at every
      step (`never_drafts`); False runs the adaptive loop anyway (the calibration times it).
  """

  ks: tuple[int, ...] = (0, 2, 4)
  prior_a: float = 1.0
  prior_b: float = 1.0
  decay: float = 0.99
  ar_fallback: bool = True

  def __post_init__(self):
    if not self.ks or self.ks[0] != 0 or list(self.ks) != sorted(set(self.ks)):
      raise ValueError(f"choices must be distinct, ascending and start at 0, got {self.ks}")
    if self.prior_a <= 0 or self.prior_b <= 0 or not 0 < self.decay <= 1:
      raise ValueError("need prior_a, prior_b > 0 and 0 < decay <= 1")


# ---------------------------------------------------------------- estimator and decision (pure)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Estimate:
  """Decayed evidence per row and drafted depth: successes and failures, [B, D] float32 each
  (D = K_max; depth d is column d - 1)."""

  successes: jax.Array
  failures: jax.Array

  @classmethod
  def zeros(cls, batch: int, depth: int) -> Estimate:
    z = jnp.zeros((batch, depth), jnp.float32)
    return cls(z, z)


def alpha_estimate(est: Estimate, prior_a: float, prior_b: float) -> jax.Array:
  """[B, D] posterior mean of alpha_d: (a0 + s_d) / (a0 + b0 + s_d + f_d)."""
  return (prior_a + est.successes) / (prior_a + prior_b + est.successes + est.failures)


def update_estimate(
  est: Estimate, k: jax.Array, kept: jax.Array, emitted: jax.Array, live: jax.Array, decay: float
) -> Estimate:
  """The estimate after one step with K = k drafts (see the module docstring).

  Args:
    est: the estimate before the step.
    k: scalar K of the step (0: no evidence, only decay).
    kept: [B] drafts the step committed: a success at depths 1..kept.
    emitted: [B] tokens the step committed (a failure at depth kept + 1 when kept < k and the step
      committed a correction token).
    live: [B] rows that ran the step (others are left as they are).
    decay: evidence kept per step.
  """
  depth = jnp.arange(1, est.successes.shape[1] + 1)[None, :]
  failed = ((kept < k) & (emitted > kept))[:, None] & (depth == kept[:, None] + 1)
  s = decay * est.successes + (depth <= kept[:, None]).astype(jnp.float32)
  f = decay * est.failures + failed.astype(jnp.float32)
  keep = live[:, None]
  return Estimate(jnp.where(keep, s, est.successes), jnp.where(keep, f, est.failures))


def expected_tokens(alpha: jax.Array, ks: Sequence[int]) -> jax.Array:
  """E(alpha_b, K) = 1 + alpha_1 + alpha_1 alpha_2 + .. + alpha_1 .. alpha_K for each choice:
  [B, len(ks)] from per-depth alpha [B, D >= max(ks)]."""
  reach = jnp.cumprod(alpha[:, : max(max(ks), 1)], axis=1)
  ones = jnp.ones_like(alpha[:, :1])
  return jnp.cumsum(jnp.concatenate([ones, reach], 1), 1)[:, jnp.asarray(ks)]


def choose(
  alpha: jax.Array, live: jax.Array, ks: Sequence[int], step_costs: jax.Array
) -> jax.Array:
  """Index into `ks` maximising sum_b live_b E_b(K) / cost(K) (`expected_tokens`); first on ties.

  Args:
    alpha: [B, D] acceptance estimates per drafted depth (D >= max(ks)).
    live: [B] rows still decoding.
    ks: the static choices.
    step_costs: [len(ks)] cost of a step with each choice (`CostTable.step_costs`).
  """
  tokens = jnp.sum(jnp.where(live[:, None], expected_tokens(alpha, ks), 0.0), 0)
  return jnp.argmax(tokens / jnp.asarray(step_costs, jnp.float32)).astype(jnp.int32)


def never_drafts(config: AdaptiveConfig, costs: CostTable) -> bool:
  """Whether the adaptive loop under `costs` takes K = 0 at every step, for any batch.

  A K = 0 step adds no evidence, so from the start every row's estimate is the prior mean
  a0 / (a0 + b0) at every depth (decay leaves zero evidence at zero), and the choice (`choose`)
  at equal estimates does not depend on which rows are live. If that choice is K = 0, no step
  ever drafts.
  """
  depth = max(max(config.ks), 1)
  with jax.ensure_compile_time_eval():  # a Python bool, also when called under a jit
    alpha = jnp.full((1, depth), config.prior_a / (config.prior_a + config.prior_b), jnp.float32)
    step_costs = jnp.asarray(costs.step_costs, jnp.float32)
    return int(choose(alpha, jnp.ones((1,), bool), config.ks, step_costs)) == 0


# ---------------------------------------------------------------- the loop


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AdaptiveTrace:
  """What the adaptive loop chose.

  Attributes:
    counts: [B, len(ks)] steps each row ran (while live) with each choice.
    choices: [T] index into ks of the choice at each step (-1 past `n_steps`); T = max_new_tokens,
      which bounds the steps (every step commits a token to every live row).
    n_steps: scalar, loop iterations.
    ks: [len(ks)] the choices.
  """

  counts: jax.Array
  choices: jax.Array
  n_steps: jax.Array
  ks: jax.Array


def ar_trace(target_passes: jax.Array, ks: Sequence[int], max_steps: int) -> AdaptiveTrace:
  """The trace of an adaptive run that took K = 0 at every step (`never_drafts`), from the AR
  loop's per-row target passes."""
  B, n_choices = target_passes.shape[0], len(ks)
  counts = jnp.zeros((B, n_choices), jnp.int32).at[:, 0].set(target_passes)
  n_steps = jnp.max(target_passes).astype(jnp.int32)
  choices = jnp.where(jnp.arange(max_steps) < n_steps, 0, -1).astype(jnp.int32)
  return AdaptiveTrace(counts, choices, n_steps, jnp.asarray(ks, jnp.int32))


def run_adaptive(
  state: Any,
  steps: Sequence[Callable[[Any], Any]],
  config: AdaptiveConfig,
  step_costs: jax.Array,
  max_steps: int,
) -> tuple[Any, AdaptiveTrace]:
  """The decode loop with a per-step choice among `steps` (one per `config.ks`).

  Args:
    state: the loop's `specjax.decode.DecodeState` (its metrics a `SpecMetrics`).
    steps: steps[i](state) -> state, one decode step with config.ks[i] drafts; every step returns
      the same shapes and updates `state.metrics` (committed drafts in `accepted`).
    config: the choices and the estimator.
    step_costs: [len(config.ks)] the cost table (`CostTable.step_costs`).
    max_steps: length of the per-step trace (the loop's step bound).

  Returns:
    The final state and the trace.
  """
  B, n = state.done.shape[0], len(config.ks)
  ks = jnp.asarray(config.ks, jnp.int32)
  trace = AdaptiveTrace(
    jnp.zeros((B, n), jnp.int32), jnp.full((max_steps,), -1, jnp.int32), jnp.int32(0), ks
  )

  def body(carry):
    s, est, tr = carry
    live = ~s.done
    alpha = alpha_estimate(est, config.prior_a, config.prior_b)
    i = choose(alpha, live, config.ks, step_costs)
    new = run_one_of(i, steps, s)
    kept = new.metrics.accepted - s.metrics.accepted
    emitted = new.metrics.emitted - s.metrics.emitted
    est = update_estimate(est, ks[i], kept, emitted, live, config.decay)
    counts = tr.counts + (live[:, None] & (jnp.arange(n)[None, :] == i))
    choices = tr.choices.at[jnp.minimum(tr.n_steps, max_steps - 1)].set(i)
    return new, est, AdaptiveTrace(counts, choices, tr.n_steps + 1, ks)

  carry = (state, Estimate.zeros(B, max(max(config.ks), 1)), trace)
  state, _, trace = jax.lax.while_loop(lambda c: ~jnp.all(c[0].done), body, carry)
  return state, trace


def ar_step(s, *, params, cfg, gen, prompt_lens, budgets, observe, hidden_layers=()):
  """One AR step in the speculative loops' state: every live row commits one target token.

  Args:
    s: the chain or tree loop's `DecodeState`; the cache holds seq[:, :seq_len - 1].
    params, cfg, gen, prompt_lens, budgets: as in the decode loops.
    observe: observe(draft_state, seq, seq_len, new_seq, new_seq_len, n_committed, out, key) ->
      the drafter's state after the step (`observer`).
    hidden_layers: target layers the drafter consumes.
  """
  key, k_obs, k_tok = jax.random.split(s.key, 3)
  seq, seq_len, done, m, out = target_step(
    s, k_tok, params=params, cfg=cfg, sampling=gen.sampling, stop_tokens=gen.stop_tokens,
    prompt_lens=prompt_lens, budgets=budgets, hidden_layers=hidden_layers,
  )  # fmt: skip
  draft_state = observe(s.draft_state, s.seq, s.seq_len, seq, seq_len, m, out, k_obs)
  zeros = jnp.zeros_like(m)
  metrics = s.metrics.update(~s.done, zeros, zeros, m)
  cache = out.cache.with_lengths(seq_len - 1)
  return DecodeState(seq, seq_len, cache, draft_state, done, metrics, key)


def pad_positions(x: jax.Array | None, width: int, axis: int) -> jax.Array | None:
  """Zero-pads `x` along `axis` to `width` entries (None stays None)."""
  if x is None or x.shape[axis] == width:
    return x
  pad = [(0, 0)] * x.ndim
  pad[axis] = (0, width - x.shape[axis])
  return jnp.pad(x, pad)


def pad_step(step, width: int):
  """A step result whose hidden states cover `width` positions (so drafter states built from them
  have one shape for every K)."""
  return dataclasses.replace(
    step,
    hidden=pad_positions(step.hidden, width, 1),
    layer_hidden=pad_positions(step.layer_hidden, width, 2),
  )


@dataclasses.dataclass(frozen=True)
class Adapted:
  """A drafter as the adaptive loop's speculative steps run it.

  `propose` first catches the drafter's state up with the tokens the AR steps committed
  (`catch_up`: draft models feed their caches lazily, so AR steps cost them nothing); `commit` sees
  hidden states padded to `width` positions whatever K the step ran (EAGLE keeps them as the next
  step's input, so its state has one shape). Every other attribute is the drafter's.
  """

  inner: Any
  width: int

  def __getattr__(self, name):
    if name == "inner":  # not yet set (copy, unpickling)
      raise AttributeError(name)
    return getattr(self.inner, name)

  def propose(self, params, state, seq, seq_len, key, sampling):
    state = self.inner.catch_up(params, state, seq, seq_len, self.width)
    return self.inner.propose(params, state, seq, seq_len, key, sampling)

  def commit(self, params, state, seq, seq_len, step):
    return self.inner.commit(params, state, seq, seq_len, pad_step(step, self.width))


def observer(drafter, params, width: int, stateless: bool, sampling, tree: bool = False):
  """How an AR step of the adaptive loop keeps the drafter's state current (`ar_step`'s observe).

  Stateless drafters (prompt lookup, suffix): nothing. Others: their `observe`
  (`specjax.drafters.base`: draft models do nothing there and catch up lazily; EAGLE appends the
  new feature to its pending window and runs its head layer only when a window is full; Medusa
  takes the new hidden state; other chain drafters make a discarded k = 1 proposal, then commit),
  given the AR step as a step whose draft was rejected. The cost is `CostTable.draft[0]` (a
  measured table has it in its unit, the loop's AR step).
  """

  def observe(state, seq, seq_len, new_seq, new_seq_len, m, out, key):
    if stateless:
      return state
    path = jnp.zeros((m.shape[0], width), jnp.int32) if tree else None
    zeros = jnp.zeros_like(m)
    step = pad_step(StepResult(seq_len, zeros, m, out.hidden, out.layer_hidden, path), width)
    return drafter.observe(params, state, seq, seq_len, new_seq, new_seq_len, step, key, sampling)

  return observe


# ---------------------------------------------------------------- cost tables: key and cache


def machine_id() -> dict:
  """What a measured cost table depends on besides the model: CPU model, accelerator kind, and on
  CPU which kernel code runs (a changed kernel invalidates the tables timed with the old one)."""
  cpu = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          cpu = line.split(":", 1)[1].strip()
          break
  except OSError:
    pass
  dev = jax.devices()[0]
  return {
    "cpu": cpu,
    "device": f"{dev.platform} {dev.device_kind}",
    "n_devices": jax.device_count(),
    **({"cpu_kernels": kernels_build.version()} if dev.platform == "cpu" else {}),
    **({"cpu_amx": True} if dev.platform == "cpu" and projection.amx_enabled() else {}),
  }


def cost_key(model: str, dtype: str, batch: int, drafter: str, ks: Sequence[int], **extra) -> dict:
  """The cache key of a calibrated cost table (`extra`: e.g. the prompt width it was timed at)."""
  return {"model": model, "dtype": dtype, "batch": int(batch), "drafter": drafter,
          "ks": [int(k) for k in ks], **extra, **machine_id()}  # fmt: skip


def cost_path(key: Mapping, root: str | None = None) -> str:
  """Where the table of `key` is cached: <cache root>/adaptive_costs/<sha256 of the key>.json."""
  if root is None:
    from specjax.loading.registry import cache_root

    root = cache_root()
  digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
  return os.path.join(root, "adaptive_costs", f"{digest}.json")


def cached_costs(
  key: Mapping, measure: Callable[[], CostTable], root: str | None = None, log=print
) -> CostTable:
  """The cost table cached under `key`, measuring (and caching) it first if absent.

  A file whose stored key differs from `key` (a hash collision, a hand edit) is remeasured.
  """
  path = cost_path(key, root)
  if os.path.exists(path):
    with open(path) as f:
      data = json.load(f)
    if data.get("key") == json.loads(json.dumps(key)):
      return CostTable.from_json(data["costs"])
  table = measure()
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump({"key": key, "costs": table.to_json()}, f, indent=2, sort_keys=True)
  os.replace(tmp, path)
  log(f"adaptive: measured costs {table.to_json()} -> {path}")
  return table


def load_costs(path: str, ks: Sequence[int]) -> CostTable:
  """A cost table from a JSON file: {"ks", "verify", "draft"} (a `CostTable`) or the k_policy form
  {"verify": {K: cost}, "draft_per_token": c, "draft_fixed": f, "observe": o}, both relative to an
  AR step."""
  with open(path) as f:
    d = json.load(f)
  d = d.get("costs", d)
  if "ks" in d:
    table = CostTable.from_json(d)
    if list(table.ks) != [int(k) for k in ks]:
      raise ValueError(f"{path} has costs for K in {list(table.ks)}, not {list(ks)}")
    return table
  verify = {int(k): float(v) for k, v in d["verify"].items()}
  missing = sorted(set(int(k) for k in ks) - set(verify))
  if missing:
    raise ValueError(f"{path} has no verify cost for K = {missing}")
  return cost_table_from_rates(
    ks, verify, d.get("draft_per_token", 0.0), d.get("draft_fixed", 0.0), d.get("observe", 0.0)
  )


def branches(make_step: Callable[[int], Callable], ar: Callable, ks: Sequence[int]):
  """The `steps` of `run_adaptive`: `ar` for K = 0, make_step(K) for the others."""
  return tuple(ar if k == 0 else make_step(k) for k in ks)


def check_costs(config: AdaptiveConfig, costs: CostTable | None) -> jax.Array:
  """The [len(ks)] step-cost array of `costs` for the loop.

  Raises:
    ValueError: if `costs` is missing or is for other choices.
  """
  if costs is None:
    raise ValueError("adaptive speculation needs a cost table (costs=CostTable(...))")
  if costs.ks != config.ks:
    raise ValueError(f"the cost table is for K in {costs.ks}, the loop chooses among {config.ks}")
  return jnp.asarray(costs.step_costs, jnp.float32)
