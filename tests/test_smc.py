"""SMC speculative decoding: the pieces against hand-computed values, and consistency on toy models.

`test_mesh_checks_on_fake_devices` reruns this file's `on_mesh` tests in a child process with 8 fake
CPU devices (JAX fixes the device count when it initialises), as tests/test_sharding.py does.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from toy_models import exact_continuation_probs, tiny_model

from specjax import sharding as sh
from specjax import smc as smc_lib
from specjax.drafters import DraftModelDrafter, EagleDrafter, EagleParams, PromptLookupDrafter
from specjax.generate import pad_prompts, prefill
from specjax.kv_cache import KVCache
from specjax.metrics import SpecMetrics
from specjax.model import init_params
from specjax.sampling import SamplingConfig
from specjax.smc import (
  SMCConfig,
  batch_axes,
  effective_sample_size,
  fork_rows,
  incremental_log_weight,
  multinomial_resample,
  smc_generate,
  systematic_resample,
  take_within_groups,
)

_FAKE = int(os.environ.get("SPECJAX_FAKE_DEVICES", "0"))
if _FAKE:  # before anything initialises a backend
  jax.config.update("jax_num_cpu_devices", _FAKE)


def test_effective_sample_size():
  assert float(effective_sample_size(jnp.zeros(8))) == pytest.approx(8.0)
  assert float(effective_sample_size(jnp.array([0.0, -jnp.inf, -jnp.inf]))) == pytest.approx(1.0)
  w = np.array([0.5, 0.25, 0.25])
  assert float(effective_sample_size(jnp.log(w))) == pytest.approx(1 / np.sum(w**2), rel=1e-6)


def test_systematic_resampling_counts_are_floor_or_ceil():
  w = np.array([0.05, 0.4, 0.3, 0.15, 0.1])
  n = len(w)
  for seed in range(200):
    idx = np.asarray(systematic_resample(jax.random.PRNGKey(seed), jnp.log(w)))
    counts = np.bincount(idx, minlength=n)
    assert counts.sum() == n
    assert ((counts == np.floor(n * w)) | (counts == np.ceil(n * w))).all(), counts


@pytest.mark.parametrize("resampler", [systematic_resample, multinomial_resample])
def test_resampling_is_unbiased(resampler):
  """E[copies of particle i] = N * w_i."""
  w = np.array([0.05, 0.4, 0.3, 0.15, 0.1, 0.0, 0.0, 0.0])
  n, reps = len(w), 20_000
  keys = jax.random.split(jax.random.PRNGKey(0), reps)
  idx = np.asarray(jax.vmap(resampler, in_axes=(0, None))(keys, jnp.log(w)))
  counts = np.stack([np.bincount(r, minlength=n) for r in idx])
  mean = counts.mean(0)
  se = counts.std(0) / np.sqrt(reps) + 1e-9
  assert (np.abs(mean - n * w) < 5 * se + 1e-6).all(), (mean, n * w)
  assert counts[:, w == 0].sum() == 0


def test_incremental_log_weight_by_hand():
  lp = jnp.log(jnp.array([0.5, 0.2, 0.1]))
  lq = jnp.log(jnp.array([0.25, 0.4, 0.1]))
  log_z = jnp.float32(0.3)
  # All three drafts and the bonus committed: sum(log p - log q) + log Z.
  full = np.log(0.5 / 0.25) + np.log(0.2 / 0.4) + np.log(0.1 / 0.1) + 0.3
  assert float(incremental_log_weight(lp, lq, log_z, 4, 1.0)) == pytest.approx(full, abs=1e-5)
  # A stop token at the second draft: only the first two tokens count (here they cancel), no bonus.
  part = np.log(0.5 / 0.25) + np.log(0.2 / 0.4)
  assert float(incremental_log_weight(lp, lq, log_z, 2, 1.0)) == pytest.approx(part, abs=1e-5)
  # Power alpha = 2 scales log p only.
  pow2 = 2 * np.log(0.5) - np.log(0.25)
  got = float(incremental_log_weight(lp, lq, log_z, 1, 2.0))
  assert got == pytest.approx(pow2, abs=1e-6)
  assert float(incremental_log_weight(lp, lq, log_z, 1, 1.0)) == pytest.approx(
    np.log(2.0), abs=1e-5
  )
  assert float(incremental_log_weight(lp, lq, log_z, 0, 1.0)) == 0.0


# ---- consistency on an enumerable toy: 4-token vocabulary ----

V = 4
R = 20_000
PROMPT = [1, 2, 3, 1]


@pytest.fixture(scope="module")
def toy():
  kw = dict(vocab=V, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1)
  target, cfg = tiny_model(20, scale=0.3, **kw)
  draft, dcfg = tiny_model(21, scale=0.15, **kw)
  return target, cfg, draft, dcfg


def _power_target(target, cfg, n, alpha):
  probs = exact_continuation_probs(target, cfg, PROMPT, n, SamplingConfig(temperature=1.0))
  pi = np.array([probs[s] for s in itertools.product(range(V), repeat=n)]) ** alpha
  return (pi / pi.sum()).reshape((V,) * n)


def _derived_metrics(passes, lengths, k: int) -> dict:
  """The counters the experiment runner used to derive after the loop (before #12), kept here as
  an independent check of the loop's: each cycle of the chosen particle commits k drafts and a
  bonus token except a last cycle cut by a stop token or the budget (its first r <= k drafts), so
  of E emitted tokens f = E // (k + 1) cycles were whole, E - f drafts were accepted, and position
  i was reached and accepted in the f whole cycles and in the cut one if i < r = E - f (k + 1)."""
  passes = np.asarray(passes)
  emitted = np.asarray(lengths) - 1
  whole = emitted // (k + 1)
  rest = emitted - whole * (k + 1)
  per_pos = whole[:, None] + (np.arange(k)[None, :] < rest[:, None])
  return {
    "target_passes": passes,
    "drafted": passes * k,
    "accepted": emitted - whole,
    "emitted": emitted,
    "accepted_at": per_pos,
    "reached_at": per_pos,
  }


def _check_counted_metrics(out, k: int) -> int:
  """The chosen particles' counted `SpecMetrics` against `_derived_metrics`, exactly. The
  derivation took the request's passes, which are the particle's own only if it ran to its
  request's last cycle; a particle that stopped earlier ran ceil(E / (k + 1)) cycles (each but a
  cut last one commits k + 1 tokens). Returns how many chosen particles stopped early."""
  fields = [f.name for f in dataclasses.fields(SpecMetrics)]
  counted = {name: np.asarray(getattr(out.metrics, name)) for name in fields}
  request = np.asarray(out.target_passes)
  own = -(-(np.asarray(out.lengths) - 1) // (k + 1))
  for name, want in _derived_metrics(own, out.lengths, k).items():
    np.testing.assert_array_equal(counted[name], want, err_msg=name)
  assert (own <= request).all()
  full = own == request  # there the derivation from the request's passes holds in every field
  for name, want in _derived_metrics(request, out.lengths, k).items():
    np.testing.assert_array_equal(counted[name][full], want[full], err_msg=name)
  return int((~full).sum())


def _run(toy, n_particles, max_new, seed, **kw):
  target, cfg, draft, dcfg = toy
  P, L = pad_prompts([PROMPT] * R, bucket=len(PROMPT))
  smc = SMCConfig(n_particles=n_particles, max_new_tokens=max_new, draft_temperature=1.0, **kw)
  out = smc_generate(
    target, cfg, DraftModelDrafter(dcfg, k=1), draft, P, L, smc, jax.random.PRNGKey(seed)
  )
  assert (np.asarray(out.lengths) == max_new).all()
  assert _check_counted_metrics(out, 1) == 0  # no stop tokens: every particle runs every cycle
  return np.asarray(out.tokens)[:, :max_new], out


def _tv(tokens, pi):
  codes = np.ravel_multi_index(tokens.T, pi.shape)
  emp = np.bincount(codes, minlength=pi.size) / len(tokens)
  return 0.5 * np.abs(emp - pi.ravel()).sum()


def test_consistency_tv_shrinks_with_particles(toy):
  """One cycle (first token, one draft, a bonus): TV to p falls as N grows, below 0.05 at N = 32.

  With R = 20,000 samples over 64 sequences the TV of exact samples is about 0.02 (sampling noise).
  """
  pi = _power_target(toy[0], toy[1], 3, 1.0)
  tv = {n: _tv(_run(toy, n, 3, seed=n)[0], pi) for n in (1, 4, 32)}
  assert tv[1] > tv[4] > tv[32], tv
  assert tv[1] > 0.15, tv  # the draft alone is far from the target: the test has something to fix
  assert tv[32] < 0.05, tv


def test_power_alpha_targets_the_power_distribution(toy):
  """With alpha = 2 the output approaches prod p^2 (normalised), and not p itself."""
  tokens = _run(toy, 32, 3, seed=5, alpha=2.0)[0]
  assert _tv(tokens, _power_target(toy[0], toy[1], 3, 2.0)) < 0.05
  assert _tv(tokens, _power_target(toy[0], toy[1], 3, 1.0)) > 0.1


def test_consistency_over_cycles_with_resampling(toy):
  """Two cycles with resampling after each (threshold 1): the drafted tokens' joint law is pi's."""
  pi = _power_target(toy[0], toy[1], 5, 1.0)
  tokens, out = _run(toy, 32, 5, seed=3, ess_threshold=1.0)
  assert (np.asarray(out.resamples) == 2).all()
  assert (np.asarray(out.target_passes) == 2).all()
  marg = pi.sum(axis=(0, 2, 4))  # (t2, t4): the two drafted positions
  assert _tv(tokens[:, [1, 3]], marg) < 0.03
  one = _run(toy, 1, 5, seed=3, ess_threshold=1.0)[0]  # the draft alone: what there is to fix
  assert _tv(one[:, [1, 3]], marg) > 0.1
  ess = np.asarray(out.ess)
  assert ((ess[:, :2] >= 1) & (ess[:, :2] <= 32)).all()


def test_broken_weight_is_caught(toy, monkeypatch):
  """Dropping log q from the weight must fail the same consistency check (power of the test)."""
  pi = _power_target(toy[0], toy[1], 3, 1.0)

  def no_q(logp, logq, log_z, n, alpha):
    return incremental_log_weight(logp, jnp.zeros_like(logq), log_z, n, alpha)

  jax.clear_caches()
  monkeypatch.setattr(smc_lib, "incremental_log_weight", no_q)
  try:
    tv = _tv(_run(toy, 32, 3, seed=32)[0], pi)
  finally:
    jax.clear_caches()
  assert tv > 0.1, tv


@pytest.mark.parametrize("ess_threshold", [0.5, 1.0])
def test_stops_mask_weights_and_end_particles(toy, ess_threshold):
  target, cfg, draft, dcfg = toy
  P, L = pad_prompts([PROMPT] * 64, bucket=len(PROMPT))
  smc = SMCConfig(
    n_particles=4, max_new_tokens=12, stop_tokens=(0,), draft_temperature=1.0,
    ess_threshold=ess_threshold,
  )  # fmt: skip
  out = smc_generate(
    target, cfg, DraftModelDrafter(dcfg, k=2), draft, P, L, smc, jax.random.PRNGKey(0)
  )
  toks, lens = np.asarray(out.particle_tokens), np.asarray(out.particle_lengths)
  for r in range(toks.shape[0]):
    for n in range(toks.shape[1]):
      row = toks[r, n, : lens[r, n]]
      stops = np.flatnonzero(row == 0)
      assert len(stops) == 0 or stops[0] == len(row) - 1  # nothing after a stop token
      assert lens[r, n] == 12 or row[-1] == 0
  assert np.isfinite(np.asarray(out.log_z)).all()
  # The counters follow each particle's lineage through resampling (at 1.0, every cycle), and some
  # chosen particles stopped before their request's last cycle: there the old derivation, which
  # took the request's passes, overcounted the particle's passes and drafts.
  assert int(np.asarray(out.resamples).sum()) > 0
  assert _check_counted_metrics(out, 2) > 0


def test_cycles_copy_no_cache_unless_they_resample():
  """The compiled loop updates its caches in place: the only cache-sized copies outside the
  set-up are the resampling branch's own gathers, one per cache array (target K, V, draft K, V).
  The resampling conditional used to copy all four caches to a batch-major layout and back around
  every cycle, resampled or not (12 copies here; 8 for SmolLM2, benchmarks/cache_donation.py).
  The models have 2 layers and 2 KV heads: with size-1 axes XLA picks other layouts."""
  kw = dict(vocab=V, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2)
  (target, cfg), (draft, dcfg) = tiny_model(20, scale=0.3, **kw), tiny_model(21, **kw)
  P, L = pad_prompts([PROMPT] * 2, bucket=len(PROMPT))
  smc = SMCConfig(n_particles=4, max_new_tokens=8, draft_temperature=1.0)
  drafter = DraftModelDrafter(dcfg, k=2)
  args = (target, draft, P, L, jnp.full((2,), 8, jnp.int32), jax.random.PRNGKey(0))
  hlo = smc_lib._smc.lower(*args, cfg, drafter, smc).compile().as_text()
  caches = [f"f32[{c.n_layers},8," for c in (cfg, dcfg)]  # [L, R * N rows, S, Hkv, Dh]
  for c in caches:  # the pattern finds the caches, so that no copies means none
    assert f"= {c}" in hlo, f"no {c}...] buffer in the compiled loop: update the cache shapes"
  where, comp = [], None
  for line in hlo.splitlines():
    if line and not line.startswith(" ") and line.rstrip().endswith("{"):
      comp = line.split(" ")[0]
    result = line.split("=", 1)[1].lstrip() if "=" in line else ""
    if " copy(" in line and any(result.startswith(c) for c in caches):
      where.append(comp)
  inside = [c for c in where if c != "ENTRY"]
  assert 1 <= len(inside) <= 4 and len(set(inside)) == 1, where  # the resampling gathers only


def test_per_row_budgets_end_each_request(toy):
  target, cfg, draft, dcfg = toy
  P, L = pad_prompts([PROMPT] * 3, bucket=len(PROMPT))
  smc = SMCConfig(n_particles=4, max_new_tokens=9, draft_temperature=1.0)
  out = smc_generate(
    target, cfg, DraftModelDrafter(dcfg, k=2), draft, P, L, smc, jax.random.PRNGKey(0),
    max_new_per_row=jnp.asarray([2, 9, 5]),
  )  # fmt: skip
  np.testing.assert_array_equal(np.asarray(out.lengths), [2, 9, 5])
  np.testing.assert_array_equal(np.asarray(out.particle_lengths), np.repeat([[2], [9], [5]], 4, 1))
  # a request's passes end with its budget: one cycle commits up to k + 1 = 3 tokens
  passes = np.asarray(out.target_passes)
  assert passes[0] < passes[2] < passes[1], passes
  assert _check_counted_metrics(out, 2) == 0


def test_drafter_without_q_is_an_error(toy):
  target, cfg, _, _ = toy
  P, L = pad_prompts([PROMPT], bucket=4)
  with pytest.raises(TypeError, match="draft distributions"):
    smc_generate(
      target,
      cfg,
      PromptLookupDrafter(k=2),
      (),
      P,
      L,
      SMCConfig(max_new_tokens=4),
      jax.random.PRNGKey(0),
    )


# ---- EAGLE-3 under SMC-SD: the target's layer outputs reach the head in prefill and every cycle ----

LAYERS = (0, 1)


@pytest.fixture(scope="module")
def eagle3_toy():
  """A 2-layer V = 4 target and an EAGLE-3 head (random weights) fusing both of its layers."""
  kw = dict(vocab=V, d_model=16, n_heads=2, n_kv_heads=1)
  target, cfg = tiny_model(22, scale=0.3, n_layers=2, **kw)
  hcfg = cfg.replace(n_layers=1)
  D = cfg.d_model
  keys = jax.random.split(jax.random.PRNGKey(23), 5)
  layer = jax.tree.map(lambda a: a[0], init_params(keys[0], hcfg, scale=0.15).layers)
  head = EagleParams(
    w_in=0.15 * jax.random.normal(keys[1], (D, 2 * D)),
    layer=layer,
    head=0.15 * jax.random.normal(keys[2], (V, D)),
    d2t=jnp.arange(V, dtype=jnp.int32),
    embed=target.embed,
    fuse=0.15 * jax.random.normal(keys[3], (D, len(LAYERS) * D)),
    norm=jnp.ones(D),
  )
  return target, cfg, hcfg, head


def test_eagle3_smc_is_consistent(eagle3_toy):
  """SMC-SD with an EAGLE-3 drafter approaches the target's law as N grows (as the draft-model
  consistency test above)."""
  target, cfg, hcfg, head = eagle3_toy
  P, L = pad_prompts([PROMPT] * R, bucket=len(PROMPT))
  pi = _power_target(target, cfg, 3, 1.0)
  drafter = EagleDrafter(hcfg, k=1, hidden_layers=LAYERS)
  tv = {}
  for n in (1, 32):
    smc = SMCConfig(n_particles=n, max_new_tokens=3, draft_temperature=1.0)
    out = smc_generate(target, cfg, drafter, head, P, L, smc, jax.random.PRNGKey(40 + n))
    assert (np.asarray(out.lengths) == 3).all()
    tv[n] = _tv(np.asarray(out.tokens)[:, :3], pi)
  assert tv[1] > 0.1, tv  # the head alone is far from the target: the test has something to fix
  assert tv[32] < 0.05, tv


def test_eagle3_smc_drafts_from_the_target_layers(eagle3_toy):
  """With one particle and a near-zero draft temperature the drafts of each cycle are the head's
  greedy proposals from a fresh start on the sequence so far, which fuse the target's layers 0 and
  1 (with those features zeroed the proposals differ: the check can fail)."""
  target, cfg, hcfg, head = eagle3_toy
  K, cycles = 2, 2
  prompts = [
    PROMPT,
    PROMPT[:2],
    PROMPT[::-1],
    [3, 3, 0, 2, 1, 1],
    [2],
    [0, 1, 2],
    [1, 3],
    [2, 2, 0],
  ]
  P, L = pad_prompts(prompts, bucket=6)
  drafter = EagleDrafter(hcfg, k=K, hidden_layers=LAYERS)
  smc = SMCConfig(
    n_particles=1, max_new_tokens=1 + cycles * (K + 1), draft_temperature=1e-4, ess_threshold=0.0
  )
  out = np.asarray(
    smc_generate(target, cfg, drafter, head, P, L, smc, jax.random.PRNGKey(0)).tokens
  )
  greedy = SamplingConfig(temperature=0.0)

  @jax.jit  # one compile for every context (same shapes), with and without the features
  def drafts_of(x, n, seq, zero_layers):
    pre = prefill(target, cfg, x, n, 40, LAYERS)
    pre = dataclasses.replace(pre, layer_hidden=jnp.where(zero_layers, 0.0, pre.layer_hidden))
    state = drafter.init(head, pre, x, n, 40)
    return drafter.propose(head, state, seq, n + 1, jax.random.PRNGKey(1), greedy).tokens[0]

  def fresh_drafts(ctx, first, zero_layers=False):
    x, n = pad_prompts([ctx], bucket=16)
    seq = np.zeros((1, 40), np.int32)
    seq[0, : len(ctx)], seq[0, len(ctx)] = ctx, first
    return np.asarray(drafts_of(x, n, seq, zero_layers)).tolist()

  differs = False
  for prompt, row in zip(prompts, out):
    for c in range(cycles):
      ctx, first = list(prompt) + row[: c * (K + 1)].tolist(), int(row[c * (K + 1)])
      drafts = row[c * (K + 1) + 1 : c * (K + 1) + 1 + K].tolist()
      assert drafts == fresh_drafts(ctx, first), (prompt, c)
      differs |= drafts != fresh_drafts(ctx, first, zero_layers=True)
  assert differs


# ---- particle rows: fork and resample within each request's group ----

GROUPS, PARTICLES, SLOTS = 4, 2, 13  # R requests x N particles; cache slots (a size no other has)


def _rows_state(seed=0):
  """A (seq, cache, shared) state: rows on axis 0, axis 1 of the cache's K/V, and none."""
  k1, k2, k3 = jax.random.split(jax.random.PRNGKey(seed), 3)
  rows = GROUPS * PARTICLES
  cache = KVCache(
    jax.random.normal(k1, (2, rows, SLOTS, 4, 8)),
    jax.random.normal(k2, (2, rows, SLOTS, 4, 8)),
    jnp.arange(rows, dtype=jnp.int32),
  )
  seq = jax.random.randint(k3, (rows, SLOTS), 0, 100)
  return seq, cache, jnp.arange(5.0)


def _flat_take(state, rows):
  seq, cache, shared = state
  return seq[rows], cache.take_rows(rows), shared


def test_batch_axes_fork_and_group_take_match_flat_gathers():
  def make(b):
    return jnp.zeros((b, SLOTS)), KVCache(*[jnp.zeros((2, b, SLOTS, 4, 8))] * 2, jnp.zeros(b)), 0.0

  axes = batch_axes(make)
  assert jax.tree.leaves(axes) == [0, 1, 1, 0]  # the shared scalar has no batch axis
  state = _rows_state()
  ancestors = jnp.array([[1, 1], [0, 1], [1, 0], [0, 0]], jnp.int32)
  flat = (jnp.arange(GROUPS)[:, None] * PARTICLES + ancestors).reshape(-1)
  got = take_within_groups(state, (0, KVCache(1, 1, 0), None), ancestors)
  jax.tree.map(np.testing.assert_array_equal, got, _flat_take(state, flat))
  seq, cache, shared = state
  got = fork_rows((seq[:GROUPS], cache.take_rows(jnp.arange(GROUPS))), (0, KVCache(1, 1, 0)), 3)
  want = (
    seq[jnp.repeat(jnp.arange(GROUPS), 3)],
    cache.take_rows(jnp.repeat(jnp.arange(GROUPS), 3)),
  )
  jax.tree.map(np.testing.assert_array_equal, got, want)
  with pytest.raises(ValueError, match="more than one axis"):
    batch_axes(lambda b: jnp.zeros((b, b)))


@pytest.mark.skipif(bool(_FAKE), reason="this is the parent of the fake-device run")
def test_mesh_checks_on_fake_devices():
  env = dict(os.environ, SPECJAX_FAKE_DEVICES="8", SPECJAX_CPU_KERNELS="0")
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()
  cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", __file__, "-k"]
  res = subprocess.run(cmd + ["on_mesh"], env=env, capture_output=True, text=True, timeout=600)
  tail = (res.stdout + res.stderr)[-6000:]
  assert res.returncode == 0, tail
  assert " passed" in res.stdout and " skipped" not in res.stdout, tail


_COLLECTIVE = re.compile(
  r"=\s*(.*?)\b(all-gather|all-reduce|all-to-all|collective-permute)(-start)?\("
)


def _moves(compiled, size: int) -> list[str]:
  """Collectives in the compiled HLO with an operand/result dimension of `size` (tuples included)."""
  hits = []
  for line in compiled.as_text().splitlines():
    m = _COLLECTIVE.search(line)
    if m and any(size in map(int, filter(None, d.split(","))) for d in _DIMS.findall(m.group(1))):
      hits.append(line.strip()[:160])
  return hits


_DIMS = re.compile(r"\w+\[([\d,]*)\]")


def _mesh():
  if jax.device_count() < 8:
    pytest.skip("needs 8 devices (test_mesh_checks_on_fake_devices runs this with 8 fake ones)")
  return sh.MeshConfig((4, 2), ("data", "tensor")).build(jax.devices()[:8])


def test_on_mesh_resampling_gathers_within_data_shards():
  """Rows over data 4 (one request per shard), KV heads over tensor 2: the grouped gather moves no
  cache between devices and equals the unsharded flat gather; the flat gather by global row index
  (the control) moves the cache."""
  mesh = _mesh()
  state = _rows_state(1)
  seq, cache, shared = state
  put = lambda x, spec: jax.device_put(x, jax.sharding.NamedSharding(mesh, spec))  # noqa: E731
  is_spec = lambda x: isinstance(x, jax.sharding.PartitionSpec)  # noqa: E731
  placed_cache = jax.tree.map(
    lambda p, x: put(x, p), sh.cache_specs(cache, mesh), cache, is_leaf=is_spec
  )
  placed = (put(seq, sh.batch_spec(seq.shape, mesh)), placed_cache, shared)
  ancestors = jnp.array([[1, 1], [0, 1], [1, 0], [0, 0]], jnp.int32)
  flat = (jnp.arange(GROUPS)[:, None] * PARTICLES + ancestors).reshape(-1)
  axes = (0, KVCache(1, 1, 0), None)

  grouped = jax.jit(lambda s, a: take_within_groups(s, axes, a)).lower(placed, ancestors).compile()
  jax.tree.map(np.testing.assert_array_equal, grouped(placed, ancestors), _flat_take(state, flat))
  assert not _moves(grouped, SLOTS), _moves(grouped, SLOTS)
  assert grouped.output_shardings[1].k.is_equivalent_to(placed_cache.k.sharding, 5)  # still split
  control = jax.jit(_flat_take).lower(placed, flat).compile()
  assert _moves(control, SLOTS)


def test_on_mesh_smc_loop_moves_no_cache_and_matches_unsharded(toy):
  """The whole SMC-SD loop on R = 4 requests x N = 2 particles, rows over data 4, resampling every
  cycle: no collective carries a cache-capacity-sized array, and particles equal the unsharded run."""
  mesh = _mesh()
  target, cfg, draft, dcfg = toy
  P, L = pad_prompts([PROMPT, PROMPT[:3], PROMPT[1:], PROMPT[::-1]], bucket=len(PROMPT))
  smc = SMCConfig(n_particles=2, max_new_tokens=9, ess_threshold=1.0, draft_temperature=1.0)
  drafter, key = DraftModelDrafter(dcfg, k=2), jax.random.PRNGKey(7)
  capacity = P.shape[1] + smc.max_new_tokens + drafter.k + 1 + drafter.capacity_slack()
  assert capacity == 17  # a size no weight or activation of the toy has

  def run(p, dp, x, n):
    return smc_generate(p, cfg, drafter, dp, x, n, smc, key)

  ref = run(target, draft, P, L)
  args = (
    sh.shard_params(target, mesh, sh.DEFAULT_RULES, cfg),
    sh.shard_params(draft, mesh, sh.DEFAULT_RULES, dcfg),
    *sh.shard_batch(mesh, sh.DEFAULT_RULES, P, L),
  )
  compiled = sh.compile_on_mesh(run, *args)
  out = compiled(*args)
  np.testing.assert_array_equal(out.particle_tokens, ref.particle_tokens)
  np.testing.assert_array_equal(out.resamples, ref.resamples)
  assert int(ref.resamples.min()) > 0
  assert not _moves(compiled, capacity), _moves(compiled, capacity)
