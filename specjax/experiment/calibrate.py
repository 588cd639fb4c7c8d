"""The adaptive loop's cost table for one method on this machine: timed once, cached as JSON.

`measure_costs` runs the method's own compiled adaptive loop on a batch of random prompts, forced
to one choice per call, and times whole loop steps: the target pass over K + 1 tokens (over the
drafter's tree for the tree loop), the drafting, the acceptance rule, the commits and the loop's
bookkeeping, and for K = 0 the AR step with whatever it spends keeping the drafter current (EAGLE's
window of deferred head passes, amortised over the run). Each cost is a step's time over the AR
step's, the median over round-robin rounds, made non-decreasing in K. (Timing the target passes
and proposals alone, as this module did before, put a K = 2 prompt-lookup step anywhere from 1.01
to 1.24 AR steps on the same machine, 9% under to 18% over the loop's own step.)
`with_costs` gives a method a JSON file's table, or `CalibratedCosts`: for each padded prompt
width the runner meets, the table cached under the specjax cache root, keyed by model, dtype,
batch, drafter, choices, prompt width, token budget and machine (`specjax.adaptive.cost_key`),
measured the first time.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from specjax import adaptive as adp
from specjax.experiment.methods import Method, Target
from specjax.experiment.runner import run_method
from specjax.experiment.settings import ExperimentSettings
from specjax.generate import GenerateConfig

# How `measure_costs` times (in every cache key: tables timed another way are measured again).
# 2: round-robin rounds, per-round ratios, the cache donated and threaded.
# 3: the AR steps' drafter cost timed over a run of K_max + 1 AR steps (EAGLE defers its head pass).
# 4: verify and draft costs made non-decreasing in K (`non_decreasing`).
# 5: whole steps of the method's own adaptive loop, forced to each choice (isolated target passes
#    and proposals had timed a K = 2 prompt-lookup step at 1.01 to 1.24 AR steps on the same
#    machine, and missed what a loop step does besides them).
TIMING_VERSION = 5
# A cost that no choice is ever worth: the table that forces the loop to one choice.
_NEVER = 1e6


def forced(ks, i: int) -> adp.CostTable:
  """A cost table under which the adaptive loop takes choice ks[i] at every step."""
  return adp.CostTable(
    ks, tuple(1.0 if j == i else _NEVER for j in range(len(ks))), (0.0,) * len(ks)
  )


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
  target: Target,
  method: Method,
  batch: int = 1,
  width: int = 64,
  max_new_tokens: int = 64,
  tokens: int = 32,
  rounds: int = 5,
) -> adp.CostTable:
  """Times whole steps of `method`'s adaptive loop on this machine (see the module docstring).

  The loop runs on `batch` random prompts of `width` tokens, compiled for `max_new_tokens` (so
  its cache has the run's capacity), with no stop tokens, forced to one choice per call
  (`forced`): each choice with a budget of `tokens` tokens per row, and once a round the AR
  choice with a budget of one token (the prefill and the drafter's set-up, which the other calls
  share). A choice's step time is (its call - that call) / (its steps - that call's steps); its
  cost is the median over `rounds` round-robin rounds of that over the same round's AR step time.

  Returns:
    The table with each whole step in `verify` (so verify[0] = 1: the loop's own AR step, with
    the drafter kept current, is the unit) and `draft` all 0, made non-decreasing in K.
  """
  ks, cfg = method.adaptive.ks, target.cfg
  gen = GenerateConfig(max_new_tokens)
  rng = np.random.RandomState(0)
  prompts = jnp.asarray(rng.randint(0, cfg.vocab_size, (batch, width)), jnp.int32)
  lens = jnp.full((batch,), width, jnp.int32)
  key, tokens = jax.random.PRNGKey(0), min(tokens, max_new_tokens)
  steps: dict[str, int] = {}

  # The loop itself, forced: K = 0 at every step would otherwise run the plain AR loop instead.
  adaptive = dataclasses.replace(method.adaptive, ar_fallback=False)

  def call(name: str, i: int, budget: int):
    m = dataclasses.replace(method, adaptive=adaptive, costs=forced(ks, i))
    budgets = jnp.full((batch,), budget, jnp.int32)

    def run():
      out = run_method(target, m, gen, prompts, lens, key, budgets)
      steps[name] = out.adaptive.n_steps  # read after the timing (block_until_ready)
      return out

    return run

  fns = {"start": call("start", 0, 1)}
  fns.update({f"k{k}": call(f"k{k}", i, tokens) for i, k in enumerate(ks)})
  times = round_robin_times(fns, rounds)
  n = {name: int(v) for name, v in steps.items()}
  step = {k: (times[f"k{k}"] - times["start"]) / max(n[f"k{k}"] - n["start"], 1) for k in ks}
  costs = [1.0] + [float(np.median(step[k] / step[0])) for k in ks[1:]]
  return adp.CostTable(ks, non_decreasing(costs), (0.0,) * len(ks))


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
      s.model, s.dtype, 1, drafter, m.adaptive.ks, width=int(width),
      max_new_tokens=s.max_new_tokens, timing=TIMING_VERSION,
    )  # fmt: skip

  def __call__(self, width: int) -> adp.CostTable:
    if width not in self.tables:

      def measure():
        self.log(f"  calibrating {self.method.name} for prompt width {width} (cached after)")
        return measure_costs(self.target, self.method, 1, int(width), self.settings.max_new_tokens)

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
