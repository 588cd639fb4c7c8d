"""Adaptive speculation: the estimator and decision on hand-computed numbers, the cost-table cache,
and the adaptive chain and tree loops (greedy identical to AR whatever K they pick, forced off is
AR, sampling stays lossless with a negative control)."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats
from test_acceptance import ResampleFromPRule
from test_drafters_heads import make_drafter
from toy_models import exact_continuation_probs, tiny_model

from specjax import adaptive as adp
from specjax.acceptance import SpeculativeSamplingRule
from specjax.drafters import DraftModelDrafter, PromptLookupDrafter, eagle
from specjax.drafters.base import Prefill, StepResult
from specjax.drafters.tree_draft_model import StaticTreeDrafter
from specjax.drafters.tree_eagle import EagleTreeDrafter
from specjax.generate import GenerateConfig, generate, pad_prompts
from specjax.kv_cache import init_cache, read_rows
from specjax.metrics import summarize
from specjax.model import forward
from specjax.sampling import SamplingConfig
from specjax.speculative import _speculative, speculative_generate
from specjax.tree_speculative import tree_speculative_generate
from specjax.trees import StaticTree

# ---------------------------------------------------------------- estimator and decision


def test_expected_tokens_per_choice():
  iid = jnp.array([0.5, 0.8, 0.0, 1.0])[:, None] * jnp.ones((1, 3))
  got = adp.expected_tokens(iid, (0, 1, 3))
  want = [[1, 1.5, 1.875], [1, 1.8, 2.952], [1, 1, 1], [1, 2, 4]]
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
  # Per depth: 1, 1 + 0.5, 1 + 0.5 + 0.5 * 0.2 + 0.5 * 0.2 * 1.0.
  got = adp.expected_tokens(jnp.array([[0.5, 0.2, 1.0]]), (0, 1, 3))
  np.testing.assert_allclose(np.asarray(got), [[1, 1.5, 1.7]], rtol=1e-6)


def test_update_estimate_counts_accepts_failures_and_not_cut_steps():
  est = adp.Estimate(
    jnp.array([[2.0, 1.0], [0.0, 0.0], [1.0, 0.0], [4.0, 2.0]]),
    jnp.array([[1.0, 0.0], [1.0, 0.0], [0.0, 0.0], [2.0, 1.0]]),
  )
  # K = 2; row 0 accepted both (bonus token), row 1 rejected the first draft, row 2 is done,
  # row 3 accepted one draft and a stop token cut the step there (no correction token: censored).
  new = adp.update_estimate(
    est,
    jnp.int32(2),
    kept=jnp.array([2, 0, 1, 1]),
    emitted=jnp.array([3, 1, 1, 1]),
    live=jnp.array([True, True, False, True]),
    decay=0.5,
  )
  # Successes at depths 1..kept, a failure at depth kept + 1 (row 1: depth 1; row 3: none).
  np.testing.assert_allclose(np.asarray(new.successes), [[2, 1.5], [0, 0], [1, 0], [3, 1]])
  np.testing.assert_allclose(np.asarray(new.failures), [[0.5, 0], [1.5, 0], [0, 0], [1, 0.5]])
  # (a0 + s) / (a0 + b0 + s + f) with a Beta(1, 1) prior, per depth.
  alpha = adp.alpha_estimate(new, 1.0, 1.0)
  want = [[3 / 4.5, 2.5 / 3.5], [1 / 3.5, 1 / 2], [2 / 3, 1 / 2], [4 / 6, 2 / 3.5]]
  np.testing.assert_allclose(np.asarray(alpha), want, rtol=1e-6)
  # A K = 0 step gives no evidence; evidence only decays back towards the prior.
  off = adp.update_estimate(new, jnp.int32(0), jnp.zeros(4, int), jnp.ones(4, int),
                            jnp.ones(4, bool), 0.5)  # fmt: skip
  np.testing.assert_allclose(np.asarray(off.successes), 0.5 * np.asarray(new.successes))
  np.testing.assert_allclose(np.asarray(off.failures), 0.5 * np.asarray(new.failures))


def test_choose_on_hand_computed_numbers():
  ks, costs = (0, 1, 3), jnp.array([1.0, 1.2, 1.6])
  alpha = jnp.array([[0.5] * 3, [0.8] * 3])
  # Both live: sums of E are 2, 3.3, 4.827; over the costs 2.0, 2.75, 3.0169 -> K = 3.
  assert int(adp.choose(alpha, jnp.array([True, True]), ks, costs)) == 2
  # Row 1 done: 1, 1.5, 1.875 over the costs 1.0, 1.25, 1.1719 -> K = 1.
  assert int(adp.choose(alpha, jnp.array([True, False]), ks, costs)) == 1
  # A tie (1.5 / 1.5 = 1 = AR) goes to the smaller K.
  one = jnp.array([[0.5]])
  assert int(adp.choose(one, jnp.array([True]), (0, 1), jnp.array([1, 1.5]))) == 0
  # Nothing accepted: AR, as long as every speculative step costs more than an AR step.
  assert int(adp.choose(jnp.zeros((3, 3)), jnp.ones(3, bool), ks, costs)) == 0
  # Acceptance that falls with depth (a parallel drafter): E = 1, 1.6, 1.666 over the costs
  # 1, 1.333, 1.041 -> K = 1, where one alpha of 0.6 at every depth would draft 3 (2.176 / 1.6).
  live = jnp.array([True])
  assert int(adp.choose(jnp.array([[0.6, 0.1, 0.1]]), live, ks, costs)) == 1
  assert int(adp.choose(jnp.array([[0.6] * 3]), live, ks, costs)) == 2


def test_cost_tables_from_rates_and_files(tmp_path):
  t = adp.cost_table_from_rates((0, 2, 4), {0: 1.0, 2: 1.2, 4: 1.5}, 0.1, 0.05, observe=0.02)
  assert t.draft == pytest.approx((0.02, 0.25, 0.45))
  assert t.step_costs == pytest.approx((1.02, 1.45, 1.95))
  path = tmp_path / "c.json"
  path.write_text(json.dumps({"verify": {"0": 1, "2": 1.2, "4": 1.5}, "draft_per_token": 0.1}))
  assert adp.load_costs(str(path), (0, 2, 4)).step_costs == pytest.approx((1.0, 1.4, 1.9))
  path.write_text(json.dumps(t.to_json()))
  assert adp.load_costs(str(path), (0, 2, 4)) == t
  with pytest.raises(ValueError, match="not"):
    adp.load_costs(str(path), (0, 1))
  with pytest.raises(ValueError, match="start at 0"):
    adp.CostTable((1, 2), (1.0, 1.0), (0.0, 0.0))
  with pytest.raises(ValueError, match="chooses among"):
    adp.check_costs(adp.AdaptiveConfig((0, 2)), t)


def test_cost_cache_key_and_reuse(tmp_path):
  key = adp.cost_key("m", "float32", 1, "prompt_lookup_k4", (0, 2, 4), width=64)
  assert {"model", "dtype", "batch", "drafter", "ks", "cpu", "device"} <= set(key)
  calls = []

  def measure():
    calls.append(1)
    return adp.CostTable((0, 2, 4), (1.0, 1.3, 1.6), (0.0, 0.1, 0.2))

  a = adp.cached_costs(key, measure, root=str(tmp_path), log=lambda s: None)
  b = adp.cached_costs(key, measure, root=str(tmp_path), log=lambda s: None)
  assert a == b and len(calls) == 1  # measured once, then read back
  path = adp.cost_path(key, str(tmp_path))
  assert path.startswith(str(tmp_path / "adaptive_costs")) and json.load(open(path))["key"] == key
  other = {**key, "batch": 8}
  assert adp.cost_path(other, str(tmp_path)) != path
  adp.cached_costs(other, measure, root=str(tmp_path), log=lambda s: None)
  assert len(calls) == 2  # another batch size is another table
  data = json.load(open(path))
  data["key"]["model"] = "edited"
  json.dump(data, open(path, "w"))
  adp.cached_costs(key, measure, root=str(tmp_path), log=lambda s: None)
  assert len(calls) == 3  # a stored key that does not match is remeasured


def test_never_drafts_on_hand_computed_numbers():
  # Prior mean 0.5: E(2) = 1.75, E(3) = 1.875, E(4) = 1.9375 expected tokens per step.
  config = adp.AdaptiveConfig((0, 2, 3, 4))

  def table(*costs):
    return adp.CostTable((0, 2, 3, 4), (1.0, *costs), (0.0,) * 4)

  # Batch 8 on the 2-core CPU: 1.75 / 2.1, 1.875 / 2.5 and 1.9375 / 3.3 are all under 1.
  assert adp.never_drafts(config, table(2.1, 2.5, 3.3))
  assert adp.never_drafts(config, table(1.75, 1.875, 1.9375))  # ties go to K = 0
  assert not adp.never_drafts(config, table(1.74, 2.5, 3.3))  # 1.75 / 1.74 > 1
  assert not adp.never_drafts(config, table(2.1, 2.5, 1.9))  # K = 4 pays: 1.9375 / 1.9
  # A prior of 2/3: E(2) = 1 + 2/3 + 4/9 = 2.11 > 2.1.
  assert not adp.never_drafts(dataclasses.replace(config, prior_a=2.0), table(2.1, 2.5, 3.3))
  # A Python bool also under a jit (the entry points may be traced inside one).
  assert int(jax.jit(lambda x: x * adp.never_drafts(config, table(2.1, 2.5, 3.3)))(1)) == 1


# ---------------------------------------------------------------- the chain loop

KS = (0, 2, 4)
FORCE_OFF = adp.CostTable(KS, (1.0, 100.0, 100.0), (0.0, 0.0, 0.0))
FORCE_MAX = adp.CostTable(KS, (100.0, 100.0, 1.0), (0.0, 0.0, 0.0))
MIXED = adp.CostTable(KS, (1.0, 1.3, 1.5), (0.0, 0.1, 0.1))
CONFIG = adp.AdaptiveConfig(KS, decay=0.9)


@pytest.fixture(scope="module")
def models():
  target, cfg = tiny_model(0, vocab=64)
  draft, dcfg = tiny_model(1, vocab=64, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1)
  return target, cfg, draft, dcfg


def _prompts():
  rng = np.random.RandomState(0)
  base = [list(rng.randint(8, 20, n)) for n in (5, 11, 3)]
  return [b + b[:4] for b in base]  # repeated n-grams for prompt lookup


@pytest.mark.parametrize("batch", [1, 3])
def test_adaptive_chain_greedy_identical_to_ar(models, batch):
  target, cfg, draft, dcfg = models
  P, L = pad_prompts(_prompts()[:batch], bucket=8)
  gen = GenerateConfig(max_new_tokens=20)
  budgets = jnp.array([20, 13, 20][:batch])
  ar = generate(target, cfg, P, L, gen, max_new_per_row=budgets)
  ar_tokens, ar_lens = np.asarray(ar.tokens), np.asarray(ar.lengths)
  mixed_choices = {}
  for name, drafter, dparams in [
    ("lookup", PromptLookupDrafter(k=3), ()),
    ("draft", DraftModelDrafter(dcfg, k=3), draft),
  ]:
    for table in (FORCE_OFF, FORCE_MAX, MIXED):
      out = speculative_generate(target, cfg, drafter, dparams, P, L, gen,
                                 max_new_per_row=budgets, adaptive=CONFIG, costs=table)  # fmt: skip
      np.testing.assert_array_equal(np.asarray(out.lengths), ar_lens, err_msg=name)
      np.testing.assert_array_equal(np.asarray(out.tokens), ar_tokens, err_msg=name)
      s, tr = summarize(out.metrics), jax.tree.map(np.asarray, out.adaptive)
      assert s["emitted"] == int(ar_lens.sum()) - batch
      np.testing.assert_array_equal(tr.counts.sum(1), np.asarray(out.metrics.target_passes))
      steps = tr.choices[: int(tr.n_steps)]
      assert (tr.choices[int(tr.n_steps) :] == -1).all() and (steps >= 0).all()
      assert int(tr.n_steps) == int(np.asarray(out.metrics.target_passes).max())
      if table is FORCE_OFF:
        assert s["drafted"] == 0 and s["target_passes"] == s["emitted"] and (steps == 0).all()
      if table is FORCE_MAX:
        assert (steps == 2).all() and s["drafted"] > 0
      if table is MIXED:
        mixed_choices[name] = set(steps.tolist())
  # The draft model rarely agrees with the target: the mixed table turns speculation on and off.
  assert len(mixed_choices["draft"]) >= 2, mixed_choices


def test_never_drafting_runs_the_ar_loop_with_the_loops_counters(models, monkeypatch):
  """Under a table whose prior chooses K = 0 the entry points run the plain AR loop: the same
  tokens, counters and trace as the adaptive loop itself (`ar_fallback=False`), which never
  drafts either; the adaptive loop is not run."""
  from specjax import speculative, tree_speculative

  target, cfg, draft, dcfg = models
  P, L = pad_prompts(_prompts(), bucket=8)
  gen = GenerateConfig(max_new_tokens=12)
  budgets = jnp.array([12, 5, 12])
  tree = StaticTreeDrafter(cfg, StaticTree.from_paths([(0,), (1,), (0, 0)]))
  tree_config = adp.AdaptiveConfig((0, tree.max_depth))
  cases = [
    (speculative_generate, DraftModelDrafter(dcfg, k=4), draft, CONFIG, FORCE_OFF),
    (speculative_generate, PromptLookupDrafter(k=4), (), CONFIG, FORCE_OFF),
    (tree_speculative_generate, tree, _noisy(target), tree_config,
     adp.CostTable(tree_config.ks, (1.0, 100.0), (0.0, 0.0))),
  ]  # fmt: skip
  for fn, drafter, dparams, config, table in cases:
    assert adp.never_drafts(config, table)
    loop = fn(target, cfg, drafter, dparams, P, L, gen, max_new_per_row=budgets,
              adaptive=dataclasses.replace(config, ar_fallback=False), costs=table)  # fmt: skip
    with monkeypatch.context() as m:
      for module, name in [(speculative, "_speculative"), (tree_speculative, "_tree_speculative")]:
        m.setattr(module, name, lambda *a, **k: pytest.fail("the adaptive loop ran"))
      fallback = fn(target, cfg, drafter, dparams, P, L, gen, max_new_per_row=budgets,
                    adaptive=config, costs=table)  # fmt: skip
    want, got = jax.tree.map(np.asarray, loop), jax.tree.map(np.asarray, fallback)
    assert jax.tree.structure(want) == jax.tree.structure(got)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
      np.testing.assert_array_equal(a, b, err_msg=type(drafter).__name__)
    assert int(np.asarray(fallback.metrics.drafted).sum()) == 0


def test_adaptive_chain_eagle_greedy_identical_to_ar(models):
  """EAGLE keeps the target's features of the last step: the state must be K_max wide."""
  target, cfg, _, _ = models
  P, L = pad_prompts(_prompts(), bucket=8)
  gen = GenerateConfig(max_new_tokens=16)
  ar = generate(target, cfg, P, L, gen)
  drafter, params = make_drafter("eagle1", target, cfg, 3, np.arange(cfg.vocab_size))
  table = adp.CostTable(KS, (1.0, 1.05, 1.1), (0.0, 0.0, 0.0))
  out = speculative_generate(target, cfg, drafter, params, P, L, gen, adaptive=CONFIG, costs=table)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ar.tokens))
  tr = jax.tree.map(np.asarray, out.adaptive)
  assert len(set(tr.choices[: int(tr.n_steps)].tolist())) >= 2, tr.choices


def _eager_eagle_observe(drafter, params, state, seq, new_seq, new_seq_len, step):
  """The reference: the head fed after every AR step (its window, then the step committed)."""
  width = state.pending.shape[1]
  x = eagle.layer_inputs(params, read_rows(seq, state.cache.lengths + 1, width), state.pending)
  _, cache = eagle.cached_layer(params, x, state.cache, drafter.cfg)
  return drafter.commit(params, eagle.EagleState(cache, state.pending, state.n_pending),
                        new_seq, new_seq_len, step)  # fmt: skip


@pytest.mark.parametrize("kind", ["eagle1", "eagle3"])
def test_eagle_defers_its_head_pass_over_ar_steps(models, kind):
  """AR steps append their features to EAGLE's pending window; the head layer runs (for the whole
  batch) only when a row's window is full. The next proposal is the one a head fed after every
  step makes. Negative control: the same window with one feature wrong proposes differently."""
  target, cfg, _, _ = models
  K, B = 3, 2  # windows of K + 1 = 4
  drafter, params = make_drafter(kind, target, cfg, K, np.arange(cfg.vocab_size))
  n_layers = len(drafter.hidden_layers)
  rng = np.random.RandomState(3)
  normal = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)  # noqa: E731
  prompts = jnp.asarray(rng.randint(0, 64, (B, 12)), jnp.int32)
  seq = jnp.concatenate([prompts, jnp.asarray(rng.randint(0, 64, (B, 20)), jnp.int32)], 1)
  lens = jnp.array([12, 9])
  prefill = Prefill(None, normal(B, 12, cfg.d_model),
                    normal(n_layers, B, 12, cfg.d_model) if n_layers else None, None)  # fmt: skip
  state = drafter.init(params, prefill, prompts, lens, 48)
  # Row 1 as after a step that committed 3 tokens: 3 features pending (c + n = seq_len - 1).
  n0 = jnp.array([1, 3])
  pending = state.pending.at[1, 1:3].set(normal(2, cfg.d_model))
  deferred = eager = eagle.EagleState(state.cache.with_lengths(lens - n0), pending, n0)
  seq_len, fed = lens + 1, []
  m = jnp.ones((B,), jnp.int32)
  observe = jax.jit(lambda s, n, st: drafter.observe(params, s, seq, n, seq, n + 1, st, None, None))
  reference = jax.jit(
    lambda s, n, st: _eager_eagle_observe(drafter, params, s, seq, seq, n + 1, st)
  )
  for _ in range(5):
    hidden = normal(B, 1, cfg.d_model)
    layers = normal(n_layers, B, 1, cfg.d_model) if n_layers else None
    step = adp.pad_step(StepResult(seq_len, jnp.zeros_like(m), m, hidden, layers), K + 1)
    before = deferred.cache.lengths
    deferred = observe(deferred, seq_len, step)
    fed.append(bool((deferred.cache.lengths != before).any()))
    eager = reference(eager, seq_len, step)
    seq_len = seq_len + m
  assert fed == [False, True, False, False, False], fed  # row 1 fills at step 2: both rows fed
  np.testing.assert_array_equal(np.asarray(deferred.n_pending), [4, 4])
  sampling, key = SamplingConfig(temperature=1.0), jax.random.PRNGKey(0)
  propose = lambda s: drafter.propose(params, s, seq, seq_len, key, sampling)  # noqa: E731
  a, b = propose(deferred), propose(eager)
  np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
  np.testing.assert_allclose(np.asarray(a.logq), np.asarray(b.logq), atol=1e-4)
  wrong = dataclasses.replace(deferred, pending=deferred.pending.at[0, 2].add(1.0))
  assert np.abs(np.asarray(propose(wrong).logq) - np.asarray(b.logq)).max() > 1e-2


@pytest.mark.parametrize("kind", ["eagle3", "draft_model"])
def test_calibration_times_a_stateful_drafter(models, kind):
  """`measure_costs` runs the method's own adaptive loop forced to each choice: every cost finite
  and positive, the AR step the unit. A draft model's state shares buffers with the prefill cache,
  which the loop donates."""
  from specjax.experiment.calibrate import measure_costs
  from specjax.experiment.methods import Method, Target

  target, cfg, draft, dcfg = models
  if kind == "eagle3":
    drafter, params = make_drafter("eagle3", target, cfg, 3, np.arange(cfg.vocab_size))
  else:
    drafter, params = DraftModelDrafter(dcfg, k=3), draft
  method = Method(kind, drafter, params, adaptive=adp.AdaptiveConfig((0, 1, 3)))
  table = measure_costs(Target(target, cfg, None, "tiny"), method, width=16, max_new_tokens=12,
                        tokens=8, rounds=2)  # fmt: skip
  assert table.ks == (0, 1, 3) and table.verify[0] == 1.0 and table.draft == (0.0, 0.0, 0.0)
  assert all(np.isfinite(table.step_costs)) and list(table.verify) == sorted(table.verify)


@pytest.mark.parametrize("loop", ["chain", "tree"])
def test_calibration_arithmetic_on_known_step_times(models, monkeypatch, loop):
  """With the clock replaced by one where a call of the forced loop takes 0.3 s (its start) plus
  c_K per loop step, the table is c_K / c_0 exactly: the start (prefill, drafter set-up) cancels
  and the step counts are the loop's own (they differ between choices)."""
  from specjax.experiment import calibrate
  from specjax.experiment.methods import Method, Target

  target, cfg, _, _ = models
  seconds = {0: 0.02, 1: 0.025, 3: 0.031}
  if loop == "tree":
    tree = StaticTree.from_paths([(0,), (1,), (0, 0), (0, 0, 0)])
    method = Method("tree", StaticTreeDrafter(cfg, tree), _noisy(target), loop="tree",
                    adaptive=adp.AdaptiveConfig((0, 3)))  # fmt: skip
    seconds = {0: 0.02, 3: 0.05}
  else:
    method = Method("pl", PromptLookupDrafter(k=3), (), adaptive=adp.AdaptiveConfig((0, 1, 3)))
  counts = {}

  def clock(fns, rounds):  # one real call each (the loop's own step counts), fake seconds
    counts.update({name: int(fn().adaptive.n_steps) for name, fn in fns.items()})
    k_of = lambda name: 0 if name == "start" else int(name[1:])  # noqa: E731
    return {name: np.full(rounds, 0.3 + n * seconds[k_of(name)]) for name, n in counts.items()}

  monkeypatch.setattr(calibrate, "round_robin_times", clock)
  table = calibrate.measure_costs(Target(target, cfg, None, "t"), method, width=16,
                                  max_new_tokens=12, tokens=8, rounds=3)  # fmt: skip
  assert table.verify == pytest.approx([seconds[k] / seconds[0] for k in method.adaptive.ks])
  assert counts["start"] < counts["k0"], counts
  if loop == "tree":  # the noisy target's trees are mostly accepted: fewer, dearer steps
    assert counts["k3"] < counts["k0"], counts


def test_noisy_costs_are_made_non_decreasing():
  """A calibration that timed verify(3) under verify(2) (seen on the real model at width 64)."""
  from specjax.experiment.calibrate import non_decreasing

  assert non_decreasing([1.0, 1.115, 1.057, 1.127]) == (1.0, 1.115, 1.115, 1.127)
  assert non_decreasing([1.0, 0.98]) == (1.0, 1.0)  # never cheaper than an AR step


def test_adaptive_loop_has_no_host_callbacks_and_no_cache_copies(models):
  """One XLA computation with no callbacks, whose caches (target and draft) are updated in place:
  no more cache-sized copies than the fixed-K loop (a `lax.switch` over the steps had 4 a step)."""
  target, cfg, draft, dcfg = models
  P, L = pad_prompts(_prompts(), bucket=8)
  gen = GenerateConfig(max_new_tokens=8)
  args = (target, draft, P, L, jnp.full((3,), 8, jnp.int32), jax.random.PRNGKey(0))
  drafter, rule = DraftModelDrafter(dcfg, k=4), SpeculativeSamplingRule()
  fn = lambda *a: _speculative(*a, cfg, drafter, rule, gen, CONFIG, jnp.asarray(MIXED.step_costs))  # noqa: E731
  text = str(jax.make_jaxpr(fn)(*args))
  assert "while" in text and "callback" not in text
  capacity = P.shape[1] + 8 + 4 + 1 + 1  # prompt + budget + K_max + 1 + the draft's slack

  shapes = [f"f32[{c.n_layers},3,{capacity},{c.n_kv_heads},{c.head_dim}]" for c in (cfg, dcfg)]

  def cache_copies(*static):
    hlo = _speculative.lower(*args, cfg, drafter, rule, gen, *static).compile().as_text()
    for sh in shapes:  # the pattern finds the caches, so that 0 copies means none
      assert sh in hlo, f"no {sh} buffer in the compiled loop: update the cache shapes above"
    return sum(" copy(" in ln and any(sh in ln for sh in shapes) for ln in hlo.splitlines())

  assert cache_copies(CONFIG, jnp.asarray(MIXED.step_costs)) <= cache_copies()


def test_draft_model_catch_up_matches_a_fresh_prefill(models):
  """AR steps do not feed a draft model; its next proposal first feeds what it missed."""
  _, _, draft, dcfg = models
  seq = jnp.asarray(np.random.RandomState(1).randint(0, 64, (2, 40)), jnp.int32)
  seq_len = jnp.array([30, 23])
  cache = forward(draft, seq[:, :20], init_cache(dcfg, 2, 40), dcfg).cache
  cache = cache.with_lengths(jnp.array([5, 20]))  # 25 and 3 tokens behind
  caught = DraftModelDrafter(dcfg, k=3).catch_up(draft, cache, seq, seq_len, width=4)
  n = np.asarray(caught.lengths)
  np.testing.assert_array_equal(n, [29, 22])  # back in {seq_len - 2, seq_len - 1}
  fresh = forward(draft, seq[:, :30], init_cache(dcfg, 2, 40), dcfg).cache
  for b in range(2):
    np.testing.assert_allclose(caught.k[:, b, : n[b]], fresh.k[:, b, : n[b]], atol=1e-5)
    np.testing.assert_allclose(caught.v[:, b, : n[b]], fresh.v[:, b, : n[b]], atol=1e-5)


# ---------------------------------------------------------------- sampling stays lossless

N_SAMPLES = 60_000
SAMPLING = SamplingConfig(temperature=1.0)


@pytest.fixture(scope="module")
def small_vocab():
  kw = dict(vocab=6, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1)
  target, cfg = tiny_model(10, scale=0.2, **kw)
  draft, dcfg = tiny_model(11, scale=0.2, **kw)
  prompt = [1, 2, 4, 1, 2]
  probs = exact_continuation_probs(target, cfg, prompt, 4, SAMPLING)
  return target, cfg, draft, dcfg, prompt, probs


def _adaptive_samples(small_vocab, rule):
  target, cfg, draft, dcfg, prompt, _ = small_vocab
  P, L = pad_prompts([prompt] * N_SAMPLES, bucket=len(prompt))
  gen = GenerateConfig(max_new_tokens=4, sampling=SAMPLING)
  # K = 1 at the prior mean 0.4 (1.4 / 1.3 = 1.077 beats 1.56 / 1.46 = 1.068 and 1), then K = 2
  # once the rows that accepted a draft have alpha_1 = 0.7, and K = 0 as the rows' estimates
  # spread: every branch runs (asserted below).
  table = adp.CostTable((0, 1, 2), (1.0, 1.3, 1.46), (0.0, 0.0, 0.0))
  config = adp.AdaptiveConfig((0, 1, 2), prior_a=0.4, prior_b=0.6)
  out = speculative_generate(target, cfg, DraftModelDrafter(dcfg, k=2), draft, P, L, gen,
                             rule=rule, key=jax.random.PRNGKey(3), adaptive=config, costs=table)  # fmt: skip
  assert (np.asarray(out.lengths) == 4).all()
  tr = jax.tree.map(np.asarray, out.adaptive)
  return np.asarray(out.tokens)[:, :4], summarize(out.metrics), tr.choices[: int(tr.n_steps)]


def _pvalue_4(tokens, probs) -> float:
  """Chi-square of 4-token sequences over a 6-token vocabulary against the exact probabilities
  (cells with small expectations pooled, as in test_speculative)."""
  codes = tokens @ np.array([216, 36, 6, 1])
  counts = np.bincount(codes, minlength=6**4).astype(np.float64)
  expected = np.zeros(6**4)
  for seq, pr in probs.items():
    expected[np.dot(seq, [216, 36, 6, 1])] = pr * len(tokens)
  assert counts[expected == 0].sum() == 0, "a sequence outside the target's support"
  small = expected < 5
  obs = np.append(counts[~small], counts[small].sum())
  exp = np.append(expected[~small], expected[small].sum())
  keep = exp > 0
  return stats.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue


def test_adaptive_sampling_is_lossless_and_negative_control_fails(small_vocab):
  probs = small_vocab[-1]
  tokens, s, choices = _adaptive_samples(small_vocab, SpeculativeSamplingRule())
  assert set(choices.tolist()) == {0, 1, 2}, choices  # the loop really switched K
  assert s["accepted"] > 1000 and s["acceptance_rate"] < 0.98
  assert _pvalue_4(tokens, probs) > 1e-4
  bad, _, _ = _adaptive_samples(small_vocab, ResampleFromPRule())
  assert _pvalue_4(bad, probs) < 1e-8


# ---------------------------------------------------------------- the tree loop


def _noisy(target):
  leaves, treedef = jax.tree.flatten(target)
  keys = jax.random.split(jax.random.PRNGKey(3), len(leaves))
  return jax.tree.unflatten(
    treedef, [a + 0.1 * jnp.std(a) * jax.random.normal(k, a.shape) for a, k in zip(leaves, keys)]
  )


def test_adaptive_tree_greedy_identical_to_ar(models):
  target, cfg, _, _ = models
  P, L = pad_prompts(_prompts(), bucket=8)
  gen = GenerateConfig(max_new_tokens=20)
  budgets = jnp.array([20, 9, 20])
  ar = generate(target, cfg, P, L, gen, max_new_per_row=budgets)
  ar_tokens = np.asarray(ar.tokens)
  tree = StaticTree.from_paths([(0,), (1,), (0, 0), (0, 1), (0, 0, 0)])
  drafter = StaticTreeDrafter(cfg, tree)
  config = adp.AdaptiveConfig((0, tree.max_depth), decay=0.8)
  tables = {
    "off": adp.CostTable(config.ks, (1.0, 100.0), (0.0, 0.0)),
    "on": adp.CostTable(config.ks, (100.0, 1.0), (0.0, 0.0)),
    "mixed": adp.CostTable(config.ks, (1.0, 1.6), (0.0, 0.0)),
  }
  noisy, small = _noisy(target), tiny_model(1, vocab=64)[0]  # often / seldom agreeing drafts
  for name, table in tables.items():
    dparams = small if name == "mixed" else noisy
    out = tree_speculative_generate(target, cfg, drafter, dparams, P, L, gen,
                                    max_new_per_row=budgets, adaptive=config, costs=table)  # fmt: skip
    np.testing.assert_array_equal(np.asarray(out.tokens), ar_tokens, err_msg=name)
    np.testing.assert_array_equal(np.asarray(out.lengths), np.asarray(ar.lengths), err_msg=name)
    s, tr = summarize(out.metrics), jax.tree.map(np.asarray, out.adaptive)
    steps = set(tr.choices[: int(tr.n_steps)].tolist())
    if name == "off":
      assert s["drafted"] == 0 and s["target_passes"] == s["emitted"] and steps == {0}
    if name == "on":
      assert steps == {1} and s["tau"] > 1.3
    if name == "mixed":
      assert steps == {0, 1}, tr.choices
  # An EAGLE-2 tree: its head's state takes the AR steps through `observe`.
  chain_head, head = make_drafter("eagle1", target, cfg, 3, np.arange(cfg.vocab_size))
  eagle = EagleTreeDrafter(chain_head.cfg, top_k=2, depth=3, n_nodes=6)
  config3 = adp.AdaptiveConfig((0, 3), decay=0.8)
  out = tree_speculative_generate(target, cfg, eagle, head, P, L, gen, max_new_per_row=budgets,
                                  adaptive=config3, costs=tables["mixed"])  # fmt: skip
  np.testing.assert_array_equal(np.asarray(out.tokens), ar_tokens, err_msg="eagle tree")
  tr = jax.tree.map(np.asarray, out.adaptive)
  assert set(tr.choices[: int(tr.n_steps)].tolist()) == {0, 1}, tr.choices
  with pytest.raises(ValueError, match="max_depth"):
    tree_speculative_generate(target, cfg, drafter, target, P, L, gen,
                              adaptive=adp.AdaptiveConfig((0, 2)), costs=tables["off"])  # fmt: skip


# ---------------------------------------------------------------- the harness


def test_adaptive_settings_are_checked(tmp_path):
  from test_experiments import small_settings

  s = small_settings(adaptive=True, adaptive_ks="0,1,3", adaptive_prior="2,3")
  assert (s.adaptive.ks, s.adaptive.prior_a, s.adaptive.prior_b) == ((0, 1, 3), 2.0, 3.0)
  assert "adaptive" in s.as_dict() and "adaptive" not in small_settings().as_dict()
  for overrides, match in [
    ({"adaptive_ks": "2,4"}, "starting at 0"),
    ({"adaptive_ks": "0,a"}, "integers"),
    ({"adaptive_prior": "1"}, "two numbers"),
    ({"adaptive_decay": 0.0}, "adaptive_decay"),
    ({"adaptive": True, "adaptive_costs": str(tmp_path / "none.json")}, "existing JSON"),
    ({"adaptive": True, "method": "smc", "sampling.temperature": 1.0}, "no draft length"),
  ]:
    with pytest.raises(ValueError, match=match):
      small_settings(**overrides)


def test_harness_records_the_chosen_ks(tmp_path, monkeypatch):
  from test_experiments import QUESTIONS, byte_tokenizer, make_runner, small_settings
  from toy_models import tiny_config

  from specjax.experiment import calibrate, runner, tables, tasks
  from specjax.experiment.methods import Target, build_method
  from specjax.model import init_params

  tok = byte_tokenizer()
  cfg = tiny_config(vocab=tok.vocab_size, d_model=32, n_layers=2, max_position=512)
  target = Target(init_params(jax.random.PRNGKey(0), cfg, scale=0.5), cfg, tok, "tiny")
  bench = tmp_path / "question.jsonl"
  bench.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
  prompts = tasks.load_spec_bench(str(bench), ("qa",), 1)
  monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path / "cache"))
  s = small_settings(adaptive=True, adaptive_ks="0,1,3")
  method = build_method(s, target)
  assert method.name == "prompt_lookup_k3_adaptive_0-1-3" and method.drafter.k == 3
  method = calibrate.with_costs(s, target, method, log=lambda m: None)
  table = method.costs(64)  # measured for 64-token prompts and cached
  assert table.ks == (0, 1, 3) and table.verify[0] == 1.0 and min(table.verify[1:]) > 0
  assert table.draft[0] == 0.0  # prompt lookup is stateless: an AR step costs it nothing
  assert method.costs(64) is table
  monkeypatch.setattr(calibrate, "measure_costs", lambda *a, **k: pytest.fail("not cached"))
  assert calibrate.with_costs(s, target, build_method(s, target)).costs(64) == table
  with pytest.raises(pytest.fail.Exception, match="not cached"):  # another width: another table
    calibrate.with_costs(s, target, build_method(s, target)).costs(128)
  # Forced off through a JSON table: the record shows every step at K = 0 and the same output.
  path = tmp_path / "off.json"
  path.write_text(json.dumps({"verify": {"0": 1.0, "1": 50.0, "3": 50.0}}))
  off = small_settings(adaptive=True, adaptive_ks="0,1,3", adaptive_costs=str(path))
  r = make_runner(target, off)
  r.methods = [calibrate.with_costs(off, target, r.methods[0])]
  rec = runner.run_suite(r, prompts, str(tmp_path / "run"), off.as_dict())[0]
  m = rec["methods"]["prompt_lookup_k3_adaptive_0-1-3"]
  assert m["same_as_ar"] and m["drafted"] == 0
  assert (
    m["k_steps"] == {"0": m["target_passes"]} and sum(map(len, m["k_trace"])) == m["target_passes"]
  )
  rows = tables.summary_rows([rec])
  assert rows[-1]["k_share"] == {"0": 1.0}
  assert "K chosen" in tables.markdown(rows) and "0:100%" in tables.markdown(rows)
  # Tree methods choose an AR step or the tree.
  t = small_settings(method="tree", adaptive=True, **{"drafter.n_layers": 1, "tree.n_nodes": 6,
                                                       "tree.depth": 3})  # fmt: skip
  assert build_method(t, target).adaptive.ks == (0, 3)
