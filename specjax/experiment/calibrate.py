"""The adaptive loop's cost table for one method on this machine: timed once, cached as JSON.

`measure_costs` prefills a batch of random prompts, then times (jitted, warmed up, median of a few
calls) on that cache: the target pass over K + 1 tokens for each choice K (over the drafter's
tree for the tree loop), the drafter's `propose` at each K > 0 (the tree's), and what an AR step of
the adaptive loop spends keeping the drafter current (`specjax.adaptive.observer`: nothing for
stateless drafters and for draft models, which catch up lazily). Every cost is divided by the one-token pass (an
AR step). `with_costs` gives a method a JSON file's table, or `CalibratedCosts`: for each padded
prompt width the runner meets, the table cached under the specjax cache root, keyed by model,
dtype, batch, drafter, choices, prompt width and machine (`specjax.adaptive.cost_key`), measured
the first time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from specjax import adaptive as adp
from specjax.experiment.costs import median_time
from specjax.experiment.methods import Method, Target
from specjax.experiment.settings import ExperimentSettings
from specjax.generate import init_sequence, prefill
from specjax.model import forward
from specjax.sampling import SamplingConfig
from specjax.speculative import hidden_layers_of

GREEDY = SamplingConfig()


def measure_costs(
  target: Target, method: Method, batch: int = 1, width: int = 64, reps: int = 5
) -> adp.CostTable:
  """Times `method`'s step variants on this machine (see the module docstring).

  Args:
    target: the target model.
    method: an adaptive method (`method.adaptive` set).
    batch: rows per call.
    width: prompt tokens per row.
    reps: timed calls per measurement (after one warm-up call).
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
  seq_len, cache, key = lens + 1, pre.cache, jax.random.PRNGKey(0)
  state = drafter.init(dp, pre, prompts, lens, capacity)
  stateless = not jax.tree.leaves(state)

  @jax.jit
  def verify(p, c, tokens, positions=None, mask=None):
    return forward(p, tokens, c, cfg, positions=positions, new_mask=mask, hidden_layers=layers)

  ar = median_time(lambda: verify(params, cache, first[:, None]).logits, reps)

  @jax.jit
  def observe(p, dp, st, c, s, n):
    out = verify(p, c, first[:, None])
    m = jnp.ones_like(n)
    width = drafter.max_depth + 1 if tree else drafter.k + 1
    fn = adp.observer(drafter, dp, width, stateless, GREEDY, tree)
    return fn(st, s, n, s, n + m, m, out, key)

  skip = 0.0 if stateless else median_time(lambda: observe(params, dp, state, cache, seq, seq_len),
                                            reps) / ar - 1.0  # fmt: skip
  if tree:
    propose = jax.jit(lambda dp, st, s, n: drafter.propose(dp, st, s, n, key, GREEDY).tree)
    t = propose(dp, state, seq, seq_len)
    pos = (seq_len - 1)[:, None] + t.depth
    v = median_time(lambda: verify(params, cache, t.tokens, pos, t.mask).logits, reps)
    d = median_time(lambda: propose(dp, state, seq, seq_len).tokens, reps)
    return adp.CostTable(ks, (1.0, v / ar), (max(skip, 0.0), d / ar))
  verify_costs, draft_costs = [], []
  for k in ks:
    if k == 0:  # the AR step itself
      verify_costs.append(1.0)
      draft_costs.append(max(skip, 0.0))
      continue
    tokens = jnp.concatenate([first[:, None]] * (k + 1), 1)
    t_verify = median_time(lambda t=tokens: verify(params, cache, t).logits, reps)
    verify_costs.append(t_verify / ar)
    dk = dataclasses.replace(drafter, k=k)
    propose = jax.jit(lambda dp, st, s, n, dk=dk: dk.propose(dp, st, s, n, key, GREEDY).tokens)
    t_draft = median_time(lambda f=propose: f(dp, state, seq, seq_len), reps)
    draft_costs.append(t_draft / ar)
  return adp.CostTable(ks, tuple(verify_costs), tuple(draft_costs))


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
    drafter = f"{m.name}|{m.loop}|{d.model}|{d.shipped}"
    return adp.cost_key(s.model, s.dtype, 1, drafter, m.adaptive.ks, width=int(width))

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
