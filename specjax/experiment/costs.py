"""Measured cost ratio c of a chain drafter: one drafted token's time over one target AR step.

Leviathan et al. (2023) model a speculative step as K draft steps of cost c (in units of one target
step) plus one target pass, and predict a walltime improvement of
(1 - a^(K+1)) / ((1 - a)(K c + 1)). Here c is measured, not assumed: after a real prefill of a
prompt, the drafter's `propose` (all K tokens, the drafter's own caches and catch-up included) and
one target forward over one token on the same cache are each jitted, warmed up and timed; c is
median(propose) / K / median(target step).
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp

from specjax.experiment.methods import Method, Target
from specjax.generate import init_sequence, pad_prompts, prefill
from specjax.model import forward
from specjax.sampling import SamplingConfig
from specjax.speculative import hidden_layers_of


def median_time(fn, reps: int) -> float:
  """Median seconds of `reps` calls of a jitted `fn` after one warm-up (compiling) call."""
  jax.block_until_ready(fn())  # compile and warm up
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def draft_cost_ratio(target: Target, method: Method, ids: list[int], reps: int = 5) -> dict:
  """Times `method`'s drafter against one target step after prefilling `ids` (batch 1).

  Returns:
    {"draft_s": one propose call, "target_step_s": one target token, "c": the per-token ratio}.

  Raises:
    ValueError: for a method that is not a chain drafter (trees and SMC-SD draft differently).
  """
  if method.loop != "chain":
    raise ValueError(f"{method.name}: c is defined for chain drafters, not the {method.loop} loop")
  drafter, dp = method.drafter, method.draft_params
  prompts, lens = pad_prompts([list(ids)], bucket=max(64, len(ids)))
  capacity = prompts.shape[1] + 2 * drafter.k + 8 + drafter.capacity_slack()
  pre = prefill(target.params, target.cfg, prompts, lens, capacity, hidden_layers_of(drafter))
  first = jnp.argmax(pre.logits, -1).astype(jnp.int32)
  seq = init_sequence(prompts, lens, capacity).at[0, lens[0]].set(first[0])
  seq_len = lens + 1
  state = drafter.init(dp, pre, prompts, lens, capacity)
  key, greedy = jax.random.PRNGKey(0), SamplingConfig()
  propose = jax.jit(lambda s, q, n: drafter.propose(dp, s, q, n, key, greedy).tokens)
  cfg = target.cfg
  step = jax.jit(lambda p, t, c: forward(p, t, c, cfg).logits)
  draft_s = median_time(lambda: propose(state, seq, seq_len), reps)
  target_s = median_time(lambda: step(target.params, first[:, None], pre.cache), reps)
  return {"draft_s": draft_s, "target_step_s": target_s, "c": draft_s / drafter.k / target_s}
