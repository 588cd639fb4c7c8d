"""The adaptive loop's cost table for one method on this machine: timed once, cached as JSON.

`measure_costs` prefills a batch of random prompts, then times on that cache (jitted, warmed up,
in round-robin rounds; each cost is the median of its per-round ratio to the AR step): the target
pass over K + 1 tokens for each choice K (over the drafter's tree for the tree loop), the
drafter's `propose` at each K > 0 (the tree's), and what an AR step of the adaptive loop spends
keeping the drafter current (`specjax.adaptive.observer`: nothing for stateless drafters and for
draft models, which catch up lazily; timed over a run of K_max + 1 AR steps against the same steps
without it, since EAGLE feeds its head once per full window). Every cost is divided by the
one-token pass (an AR step), and the verify and draft costs are made non-decreasing in K.
`with_costs` gives a method a JSON file's table, or `CalibratedCosts`: for each padded prompt
width the runner meets, the table cached under the specjax cache root, keyed by model, dtype,
batch, drafter, choices, prompt width and machine (`specjax.adaptive.cost_key`), measured the
first time.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from specjax import adaptive as adp
from specjax.experiment.methods import Method, Target
from specjax.experiment.settings import ExperimentSettings
from specjax.generate import init_sequence, prefill
from specjax.model import forward
from specjax.sampling import SamplingConfig
from specjax.speculative import hidden_layers_of

GREEDY = SamplingConfig()
# How `measure_costs` times (in every cache key: tables timed another way are measured again).
# 2: round-robin rounds, per-round ratios, the cache donated and threaded.
# 3: the AR steps' drafter cost timed over a run of K_max + 1 AR steps (EAGLE defers its head pass).
# 4: verify and draft costs made non-decreasing in K (`non_decreasing`).
TIMING_VERSION = 4


def round_robin_times(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, np.ndarray]:
  """Seconds of each call of each jitted `fn`: every fn is called once to compile, then `rounds`
  rounds call each once, alternating direction, so drift on a shared machine hits all alike."""
  for fn in fns.values():
    jax.block_until_ready(fn())
  names, times = list(fns), {name: [] for name in fns}
  for r in range(rounds):
    for name in names if r % 2 == 0 else names[::-1]:
      t0 = time.perf_counter()
      jax.block_until_ready(fns[name]())
      times[name].append(time.perf_counter() - t0)
  return {name: np.asarray(t) for name, t in times.items()}


def measure_costs(
  target: Target, method: Method, batch: int = 1, width: int = 64, reps: int = 9
) -> adp.CostTable:
  """Times `method`'s step variants on this machine (see the module docstring).

  Every cost is the median over rounds of its time over the same round's AR step (calls timed
  round-robin). Target passes update the cache in place as in the decode loop (it is donated and
  threaded from call to call, its lengths reset), so no call pays for a copy of the cache.

  Args:
    target: the target model.
    method: an adaptive method (`method.adaptive` set).
    batch: rows per call.
    width: prompt tokens per row.
    reps: timed rounds (after one warm-up call of each measurement).
  """
  params, cfg, drafter, dp = target.params, target.cfg, method.drafter, method.draft_params
  ks, tree = method.adaptive.ks, method.loop == "tree"
  layers = hidden_layers_of(drafter)
  block = drafter.n_nodes if tree else drafter.k + 1
  capacity = width + 2 * block + 8 + drafter.capacity_slack()
  rng = np.random.RandomState(0)
  prompts = jnp.asarray(rng.randint(0, cfg.vocab_size, (batch, width)), jnp.int32)
  lens = jnp.full((batch,), width, jnp.int32)
  pre = prefill(params, cfg, prompts, lens, capacity, layers)
  first = jnp.argmax(pre.logits, -1).astype(jnp.int32)
  seq = init_sequence(prompts, lens, capacity).at[jnp.arange(batch), lens].set(first)
  seq_len, key = lens + 1, jax.random.PRNGKey(0)
  state = drafter.init(dp, pre, prompts, lens, capacity)
  stateless = not jax.tree.leaves(state)
  obs_width = drafter.max_depth + 1 if tree else drafter.k + 1

  def target_pass(p, c, tokens, positions, mask):
    out = forward(p, tokens, c, cfg, positions=positions, new_mask=mask, hidden_layers=layers)
    return out, out.cache.with_lengths(c.lengths)

  @functools.partial(jax.jit, donate_argnums=1)
  def verify(p, c, tokens, positions=None, mask=None):
    out, c = target_pass(p, c, tokens, positions, mask)
    return out.logits, c

  @functools.partial(jax.jit, donate_argnums=1, static_argnums=7)
  def ar_steps(p, c, tokens, dp, st, s, n, observed):
    """obs_width AR steps of the adaptive loop, from a state just after a speculative step: with
    the drafter kept current (`observed`) or not (drafters may defer work to every n-th step)."""
    observe, logits = adp.observer(drafter, dp, obs_width, stateless, GREEDY, tree), []
    for _ in range(obs_width):
      out, c = target_pass(p, c, tokens, None, None)
      if observed:
        m = jnp.ones_like(n)
        st, n = observe(st, s, n, s, n + m, m, out, key), n + m
      logits.append(out.logits)
    return (st if observed else None, logits), c

  # Threaded through the donating calls: a copy, since the drafter's state may share the prefill
  # cache's buffers (a draft model's lengths), which donation would delete.
  cache = [jax.tree.map(jnp.copy, pre.cache)]

  def threaded(fn, *args):
    def call():
      out, cache[0] = fn(params, cache[0], *args)
      return out

    return call

  fns = {"ar": threaded(verify, first[:, None])}
  if not stateless:
    for name, observed in (("ar_steps", False), ("observe", True)):
      fns[name] = threaded(ar_steps, first[:, None], dp, state, seq, seq_len, observed)
  if tree:
    propose = jax.jit(lambda dp, st, s, n: drafter.propose(dp, st, s, n, key, GREEDY).tree)
    t = propose(dp, state, seq, seq_len)
    fns["verify"] = threaded(verify, t.tokens, (seq_len - 1)[:, None] + t.depth, t.mask)
    fns["draft"] = lambda: propose(dp, state, seq, seq_len).tokens
  else:
    for k in ks[1:] if ks[0] == 0 else ks:
      fns[f"verify{k}"] = threaded(verify, jnp.concatenate([first[:, None]] * (k + 1), 1))
      dk = dataclasses.replace(drafter, k=k)
      propose = jax.jit(lambda dp, st, s, n, dk=dk: dk.propose(dp, st, s, n, key, GREEDY).tokens)
      fns[f"draft{k}"] = lambda f=propose: f(dp, state, seq, seq_len)
  times = round_robin_times(fns, reps)
  ratio = lambda name: float(np.median(times[name] / times["ar"]))  # noqa: E731
  skip = (
    0.0 if stateless else max(float(np.median(times["observe"] / times["ar_steps"])) - 1.0, 0.0)
  )
  if tree:
    return adp.CostTable(ks, non_decreasing((1.0, ratio("verify"))), (skip, ratio("draft")))
  verify_costs = non_decreasing([1.0 if k == 0 else ratio(f"verify{k}") for k in ks])
  draft_costs = (skip, *non_decreasing([ratio(f"draft{k}") for k in ks[1:]]))
  return adp.CostTable(ks, verify_costs, draft_costs)


def non_decreasing(costs) -> tuple[float, ...]:
  """The running maximum of per-K costs: timing noise can make a longer pass (or draft) look
  cheaper than a shorter one, which would steer the choice to it; it never is."""
  return tuple(float(c) for c in np.maximum.accumulate(np.asarray(costs, np.float64)))


@dataclasses.dataclass(frozen=True)
class CalibratedCosts:
  """Cost tables of one method measured per padded prompt width, on first use (then cached on
  disk): verify costs grow with the context, so long prompts get their own table. The runner calls
  it with each prompt's padded width (`Method.costs`)."""

  settings: ExperimentSettings
  target: Target = dataclasses.field(compare=False, repr=False)
  method: Method = dataclasses.field(compare=False, repr=False)
  log: Callable[[str], None] = dataclasses.field(default=print, compare=False, repr=False)
  tables: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

  def key(self, width: int) -> dict:
    s, d, m = self.settings, self.settings.drafter, self.method
    drafter = f"{m.name}|{m.loop}|{d.model}|{d.shipped}|{d.weights_dtype}"
    return adp.cost_key(
      s.model, s.dtype, 1, drafter, m.adaptive.ks, width=int(width), timing=TIMING_VERSION
    )

  def __call__(self, width: int) -> adp.CostTable:
    if width not in self.tables:
      measure = lambda: measure_costs(self.target, self.method, 1, int(width))  # noqa: E731
      self.tables[width] = adp.cached_costs(self.key(width), measure, log=self.log)
    return self.tables[width]


def with_costs(settings: ExperimentSettings, target: Target, method: Method, log=print) -> Method:
  """`method` with its costs: the table of `settings.adaptive.costs` (a JSON file), or
  `CalibratedCosts` (measured per prompt width on first use, cached per machine, model, dtype,
  batch 1, drafter and choices)."""
  if method is None or method.adaptive is None:
    return method
  a, ks = settings.adaptive, method.adaptive.ks
  if a.costs != "calibrate":
    return dataclasses.replace(method, costs=adp.load_costs(a.costs, ks))
  return dataclasses.replace(method, costs=CalibratedCosts(settings, target, method, log))
