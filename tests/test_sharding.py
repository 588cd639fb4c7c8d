"""Sharding: rules as data, and the decode loops on a (data 2, tensor 4) mesh of 8 fake CPU devices.

The mesh tests need 8 devices, and JAX fixes the CPU device count when it initialises, so
`test_mesh_suite_on_fake_devices` reruns this file's `on_mesh` tests in a child pytest process with
SPECJAX_FAKE_DEVICES=8 (this module then sets `jax_num_cpu_devices` before JAX starts). The child
keeps the CPU FFI kernels on: the unsharded references use them (one device), the partitioned runs
must fall back to plain JAX (`specjax.kernels.dispatch`) instead of gathering every weight for the
kernels' custom calls. It lowers XLA's backend optimisation level to cut compile time;
partitioning, and so the collectives checked here, happen before the backend.

The tiny models' dimensions (D 48, H*Dh 64, Hkv*Dh 32, F 160, V 384) are chosen so that no activation
or cache shape contains a weight matrix's pair of dimensions, which is what `weight_gathers` looks for.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from specjax import sharding as sh
from specjax.config import ModelConfig
from specjax.drafters import DraftModelDrafter
from specjax.generate import GenerateConfig, generate
from specjax.kv_cache import init_cache
from specjax.model import LOGICAL_AXES, forward, init_params, param_shapes
from specjax.smc import SMCConfig, smc_generate
from specjax.speculative import speculative_generate
from train.data import Batch
from train.loop import TrainState, make_train_step
from train.objectives.medusa import MedusaObjective

MESH = sh.MeshConfig((2, 4), ("data", "tensor"))
CFG = ModelConfig(
  vocab_size=384, d_model=48, n_layers=2, n_heads=8, n_kv_heads=4, head_dim=8, ffn_dim=160
)
DRAFT_CFG = CFG.replace(n_layers=1)

_FAKE = int(os.environ.get("SPECJAX_FAKE_DEVICES", "0"))
if _FAKE:  # before anything initialises a backend
  jax.config.update("jax_num_cpu_devices", _FAKE)


# ---------------------------------------------------------------- rules (any number of devices)


def test_logical_to_spec_follows_rules_divisibility_and_axis_reuse():
  mesh = MESH.abstract()
  rules = sh.DEFAULT_RULES
  assert sh.logical_to_spec(("layers", "q_heads", "embed"), (2, 64, 48), mesh, rules) == P(
    None, "tensor", None
  )
  # 3 KV heads of 64 rows cannot be split 4 ways on whole heads: replicated.
  units = {"kv_heads": 3}
  assert sh.logical_to_spec(("kv_heads", "embed"), (192, 48), mesh, rules, units) == P(None, None)
  assert sh.logical_to_spec(("kv_heads", "embed"), (192, 48), mesh, rules) == P("tensor", None)
  # A mesh axis is used once; the first dimension claiming it wins.
  assert sh.logical_to_spec(("vocab", "mlp"), (384, 160), mesh, rules) == P("tensor", None)
  # Rules may name axes the mesh lacks, and several axes for one dimension.
  wide = (("batch", ("data", "tensor")), ("vocab", "stage"))
  assert sh.logical_to_spec(("batch", "vocab"), (8, 384), mesh, wide) == P(("data", "tensor"), None)
  assert sh.logical_to_spec(("batch", None), (6, 3), mesh, wide) == P(None, None)
  with pytest.raises(ValueError, match="do not match"):
    sh.logical_to_spec(("batch",), (8, 3), mesh, rules)


def test_field_axes_reproduce_the_model_logical_axes():
  """Drafter weights are named by field; on a target the names must agree with LOGICAL_AXES."""
  cfg = CFG.replace(qkv_bias=True)
  shapes = jax.tree.map(
    lambda s: np.zeros(s, np.int8), param_shapes(cfg), is_leaf=lambda x: isinstance(x, tuple)
  )
  by_field = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0]:
    name = path[-1].name
    axes = sh.FIELD_AXES[name]
    by_field[tuple(p.name for p in path)] = ("layers",) * (leaf.ndim - len(axes)) + axes
  declared = {
    tuple(p.name for p in path): axes
    for path, axes in jax.tree_util.tree_flatten_with_path(
      LOGICAL_AXES, is_leaf=lambda x: isinstance(x, tuple)
    )[0]
  }
  assert by_field == {k: v for k, v in declared.items() if k in by_field}
  assert jax.tree.leaves(sh.logical_axes(shapes), is_leaf=lambda x: isinstance(x, tuple)) == [
    declared[k] for k in by_field
  ]


def test_every_drafter_weight_tree_gets_specs():
  """Drafter and published-head param classes are sharded by field name, with no extra code."""
  from specjax.drafters.draft_lm import DraftLMParams
  from specjax.drafters.eagle import EagleParams
  from specjax.drafters.medusa import MedusaParams
  from specjax.drafters.tree_heads import MedusaHeadParams
  from specjax.loading.heads import Eagle3HeadParams, Eagle3LayerParams, EagleHeadParams

  z = lambda *s: np.zeros(s, np.float32)  # noqa: E731
  D, V, Vd, F, q, kv = 48, 384, 192, 160, 64, 32
  one = jax.tree.map(lambda a: a[0], init_params(jax.random.PRNGKey(0), DRAFT_CFG, 0.1).layers)
  stacked = init_params(jax.random.PRNGKey(0), DRAFT_CFG, 0.1).layers
  e3_layer = Eagle3LayerParams(
    z(D), z(D), z(q, 2 * D), z(kv, 2 * D), z(kv, 2 * D), z(D, q), z(D), z(F, D), z(F, D), z(D, F)
  )
  trees = {
    "eagle": EagleParams(z(D, 2 * D), one, z(Vd, D), z(Vd), z(V, D), z(D, 3 * D), z(D)),
    "medusa": MedusaParams(z(3, D, D), z(3, D), z(Vd, D), z(Vd)),
    "draft_lm": DraftLMParams(z(V, D), stacked, z(D), z(Vd, D), z(Vd)),
    "eagle_published": EagleHeadParams(z(D, 2 * D), z(D), stacked, None),
    "eagle3_published": Eagle3HeadParams(z(D, 3 * D), e3_layer, z(D), z(Vd, D), z(Vd)),
    "medusa_published": MedusaHeadParams(z(3, 1, D, D), z(3, 1, D), z(3, V, D)),
  }
  mesh = MESH.abstract()
  specs = {k: sh.param_specs(t, mesh, sh.DEFAULT_RULES, DRAFT_CFG) for k, t in trees.items()}
  assert specs["eagle"].w_in == P(None, "tensor") and specs["eagle"].head == P("tensor", None)
  assert specs["eagle"].layer.wq == P("tensor", None) and specs["eagle"].d2t == P(None)
  assert specs["medusa"].w == P(None, "tensor", None)
  assert specs["draft_lm"].layers.w_down == P(None, None, "tensor")
  assert specs["eagle_published"].b_in == P(None)
  assert specs["eagle3_published"].layer.wk == P("tensor", None)
  assert specs["eagle3_published"].fuse == P(None, "tensor")
  assert specs["medusa_published"].lm_head == P(None, "tensor", None)
  assert specs["medusa_published"].w == P(None, None, "tensor", None)


def test_unknown_weight_name_is_an_error():
  with pytest.raises(KeyError, match="FIELD_AXES"):
    sh.logical_axes({"mystery": np.zeros((4, 4))})


def test_mesh_config_and_rules_from_config_data():
  assert sh.MeshConfig((1, -1)).resolve(8) == (1, 8)
  assert sh.MeshConfig((2, -1, 1), ("data", "tensor", "stage")).resolve(8) == (2, 4, 1)
  with pytest.raises(ValueError, match="needs 8 devices"):
    sh.MeshConfig((2, 4)).resolve(4)
  with pytest.raises(ValueError, match="do not fill"):
    sh.MeshConfig((3, -1)).resolve(8)
  with pytest.raises(ValueError, match="differ in length"):
    sh.MeshConfig((2, 4), ("data",))
  assert sh.MeshConfig.from_config({"shape": [2, 4], "axes": ["data", "tensor"]}) == MESH
  rules = sh.rules_from_config([["batch", "data"], ["vocab", ""], ["mlp", ["tensor", "stage"]]])
  assert rules == (("batch", "data"), ("vocab", None), ("mlp", ("tensor", "stage")))


def test_per_device_bytes_on_an_abstract_mesh():
  mesh = MESH.abstract()
  tree = {"w": jax.ShapeDtypeStruct((64, 48), jnp.bfloat16), "n": jax.ShapeDtypeStruct((48,), "f4")}
  specs = {"w": P("tensor", None), "n": P()}
  assert sh.per_device_bytes(tree, specs, mesh) == 16 * 48 * 2 + 48 * 4


def test_collective_parser_reads_result_shapes():
  text = "\n".join(
    [
      "  %all-gather.3 = f32[2,64,48]{2,1,0} all-gather(%p), channel_id=1, dimensions={1}",
      "  %ar = (f32[4,8]{1,0}, s32[2]{0}) all-reduce(%a, %b), channel_id=2",
      "  %ag-start = bf16[384,48]{1,0} all-gather-start(%q), channel_id=3",
      "  %x = f32[2,48]{1,0} add(%all-gather.3, %y)",
    ]
  )
  got = sh.collectives(text)
  assert [(c.kind, c.shape) for c in got] == [
    ("all-gather", (2, 64, 48)),
    ("all-gather", (384, 48)),
  ]
  w = {"a": np.zeros((2, 64, 48)), "b": np.zeros((16, 8))}
  assert sh.weight_gathers(text, w) == [got[0]]


# ---------------------------------------------------------------- on the (2, 4) mesh


@pytest.mark.skipif(bool(_FAKE), reason="this is the parent of the fake-device run")
def test_mesh_suite_on_fake_devices():
  env = dict(os.environ, SPECJAX_FAKE_DEVICES="8")
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()
  cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", __file__, "-k"]
  res = subprocess.run(cmd + ["on_mesh"], env=env, capture_output=True, text=True, timeout=900)
  tail = (res.stdout + res.stderr)[-6000:]
  assert res.returncode == 0, tail
  assert " passed" in res.stdout and " skipped" not in res.stdout, tail


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


@pytest.mark.skipif(bool(_FAKE), reason="runs from the parent process")
def test_two_processes_decode_like_one():
  """`specjax.distributed` on 2 processes x 4 CPU devices (gloo collectives), mesh (2, 4)."""
  from specjax.distributed import smoke_decode

  env = dict(os.environ, JAX_NUM_CPU_DEVICES="4", JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo")
  env.update(SPECJAX_CPU_KERNELS="0")
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()
  port = _free_port()
  cmd = [sys.executable, "-m", "specjax.distributed", f"--coordinator_address=localhost:{port}"]
  cmd += ["--num_processes=2", "--mesh=2,4", "--smoke_decode"]
  procs = [
    subprocess.Popen(cmd + [f"--process_id={i}"], env=env, stdout=subprocess.PIPE, text=True)
    for i in range(2)
  ]
  reports = []
  for p in procs:
    out, _ = p.communicate(timeout=600)
    assert p.returncode == 0, out[-3000:]
    reports.append(json.loads(out.strip().splitlines()[-1]))
  one = jax.sharding.Mesh(np.asarray(jax.devices()[:1]).reshape(1, 1), ("data", "tensor"))
  want = smoke_decode(one)
  for i, r in enumerate(reports):
    assert (r["process"], r["processes"], r["devices"], r["local_devices"]) == (i, 2, 8, 4)
    assert r["sum_over_devices"] == 8.0
    assert r["tokens"] == want


@dataclasses.dataclass(frozen=True)
class MeshSetup:
  mesh: jax.sharding.Mesh
  params: object
  draft_params: object
  sharded: object
  sharded_draft: object
  prompts: jax.Array
  lens: jax.Array


def _target_with_weak_last_layer():
  params = init_params(jax.random.PRNGKey(0), CFG, scale=0.5)
  lp = params.layers
  damp = lambda w: w.at[1].multiply(0.2)  # noqa: E731
  layers = dataclasses.replace(lp, wo=damp(lp.wo), w_down=damp(lp.w_down))
  return dataclasses.replace(params, layers=layers)


@pytest.fixture(scope="module")
def setup():
  if jax.device_count() < 8:
    pytest.skip("needs 8 devices (test_mesh_suite_on_fake_devices runs this with 8 fake ones)")
  mesh = MESH.build(jax.devices()[:8])
  params = _target_with_weak_last_layer()
  # The draft is the target's first layer (+ its norm and head): it agrees with the target often,
  # but not always, so comparisons cover accepted and rejected drafts.
  draft = dataclasses.replace(params, layers=jax.tree.map(lambda w: w[:1], params.layers))
  # Repetitive prompts so that greedy drafts get accepted, of different lengths per row.
  base = np.asarray(jax.random.randint(jax.random.PRNGKey(2), (4, 4), 0, CFG.vocab_size))
  prompts = jnp.asarray(np.tile(base, (1, 2)), jnp.int32)
  lens = jnp.asarray([8, 6, 7, 5], jnp.int32)
  return MeshSetup(
    mesh,
    params,
    draft,
    sh.shard_params(params, mesh, sh.DEFAULT_RULES, CFG),
    sh.shard_params(draft, mesh, sh.DEFAULT_RULES, DRAFT_CFG),
    prompts,
    lens,
  )


def _assert_no_weight_gathers(compiled, *trees):
  hits = sh.weight_gathers(compiled.as_text(), *trees)
  assert not hits, f"weights gathered: {hits}"


def test_on_mesh_params_are_split_by_heads_mlp_and_vocab(setup):
  lp = setup.sharded.layers
  assert lp.wq.sharding.spec == P(None, "tensor", None)
  assert lp.w_down.sharding.spec == P(None, None, "tensor")
  assert setup.sharded.embed.sharding.spec == P("tensor", None)
  shard = lambda a: a.addressable_shards[0].data.shape  # noqa: E731
  assert shard(lp.wq) == (2, 16, 48) and shard(lp.wk) == (2, 8, 48)
  assert shard(lp.w_gate) == (2, 40, 48) and shard(setup.sharded.embed) == (96, 48)
  assert shard(lp.attn_norm) == (2, 48)  # norms are replicated
  cache = init_cache(CFG, 4, 16)
  assert sh.cache_specs(cache, setup.mesh) == type(cache)(
    P(None, "data", None, "tensor", None), P(None, "data", None, "tensor", None), P("data")
  )


def test_on_mesh_weight_gather_check_catches_a_gather(setup):
  """Control: a computation that replicates a split weight must be reported."""
  rep = NamedSharding(setup.mesh, P())
  compiled = jax.jit(lambda w: w * 2, out_shardings=rep).lower(setup.sharded.layers.wq).compile()
  assert sh.weight_gathers(compiled.as_text(), setup.params)


def _kernel_calls(hlo_text: str) -> set[str]:
  return set(re.findall(r'custom_call_target="(specjax_cpu_\w+)"', hlo_text))


def test_on_mesh_cpu_kernels_give_way_to_plain_jax_when_partitioned(setup):
  """One device: the FFI kernels. Partitioned over 8: plain JAX, no weight gathered, same logits.

  Controls: the raw kernel call on split weights gathers them (what the dispatch avoids), and a
  `shard_map` body whose mesh axes are all manual (local shards) keeps the kernels.
  """
  kernels = pytest.importorskip("specjax.kernels")
  if not kernels.kernel_enabled(1):
    pytest.skip(f"CPU kernels unavailable: {kernels.unavailable_reason()}")
  from specjax.kernels import projection

  tokens = setup.prompts[:, :3]
  cache = init_cache(CFG, 4, 16)
  cache = type(cache)(cache.k, cache.v, setup.lens)

  def step(p, t, c):
    return forward(p, t, c, CFG).logits

  one = jax.jit(step).lower(setup.params, tokens, cache).compile()
  # (head_dim 8 is below the attention kernel's 16, so attention is plain JAX here)
  assert _kernel_calls(one.as_text()) == {"specjax_cpu_linear", "specjax_cpu_cache_write"}
  c_specs = sh.cache_specs(cache, setup.mesh)
  s_cache = jax.device_put(cache, jax.tree.map(lambda s: NamedSharding(setup.mesh, s), c_specs))
  (s_tokens,) = sh.shard_batch(setup.mesh, sh.DEFAULT_RULES, tokens)
  split = sh.compile_on_mesh(step, setup.sharded, s_tokens, s_cache)
  assert not _kernel_calls(split.as_text())
  _assert_no_weight_gathers(split, setup.params)
  want = one(setup.params, tokens, cache)
  np.testing.assert_allclose(split(setup.sharded, s_tokens, s_cache), want, rtol=1e-4, atol=1e-4)

  w = setup.sharded.layers.w_gate
  raw = jax.jit(lambda x, w: projection._call(x, (w,), jnp.int32(0), projection._NONE))
  x = jnp.ones((2, CFG.d_model))
  assert sh.weight_gathers(raw.lower(x, w).compile().as_text(), setup.params)

  specs = (P(), P("data"), type(cache)(P(None, "data"), P(None, "data"), P("data")))
  local = jax.shard_map(step, mesh=setup.mesh, in_specs=specs, out_specs=P("data"))
  args = [
    jax.device_put(a, jax.tree.map(lambda s: NamedSharding(setup.mesh, s), sp))
    for a, sp in zip((setup.params, tokens, cache), specs)
  ]
  manual = jax.jit(local).lower(*args).compile()
  assert "specjax_cpu_linear" in _kernel_calls(manual.as_text())
  np.testing.assert_allclose(manual(*args), want, rtol=1e-4, atol=1e-4)


def test_on_mesh_ar_greedy_matches_unsharded(setup):
  gen = GenerateConfig(max_new_tokens=8)
  ref = generate(setup.params, CFG, setup.prompts, setup.lens, gen)
  args = (setup.sharded, *sh.shard_batch(setup.mesh, sh.DEFAULT_RULES, setup.prompts, setup.lens))
  compiled = sh.compile_on_mesh(lambda p, x, n: generate(p, CFG, x, n, gen), *args)
  out = compiled(*args)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.lengths, ref.lengths)
  assert out.tokens.sharding.spec[0] == "data"
  _assert_no_weight_gathers(compiled, setup.params)
  # The cache the loop allocates is split over rows and heads: no full-cache collectives either.
  cache_dims = {(2, 2, 16, 1, 8)}  # [L, B/2, S, Hkv/4, Dh] per device
  assert any(f"f32[{','.join(map(str, d))}]" in compiled.as_text() for d in cache_dims)


def test_on_mesh_chain_sd_with_draft_model_matches_unsharded(setup):
  gen = GenerateConfig(max_new_tokens=8)
  drafter = DraftModelDrafter(DRAFT_CFG, k=3)
  ref = speculative_generate(
    setup.params, CFG, drafter, setup.draft_params, setup.prompts, setup.lens, gen
  )
  args = (
    setup.sharded,
    setup.sharded_draft,
    *sh.shard_batch(setup.mesh, sh.DEFAULT_RULES, setup.prompts, setup.lens),
  )

  def run(p, dp, x, n):
    return speculative_generate(p, CFG, drafter, dp, x, n, gen)

  compiled = sh.compile_on_mesh(run, *args)
  out = compiled(*args)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.metrics.accepted, ref.metrics.accepted)
  assert int(ref.metrics.accepted.sum()) > 0  # the comparison covers accepted drafts
  _assert_no_weight_gathers(compiled, setup.params, setup.draft_params)


def test_on_mesh_smc_sd_matches_unsharded(setup):
  """R = 2 requests x N = 4 particles: 8 rows split over data; fixed key, same particles."""
  smc = SMCConfig(n_particles=4, max_new_tokens=8, ess_threshold=0.9)
  drafter = DraftModelDrafter(DRAFT_CFG, k=3)
  key = jax.random.PRNGKey(5)
  prompts, lens = setup.prompts[:2], setup.lens[:2]
  ref = smc_generate(setup.params, CFG, drafter, setup.draft_params, prompts, lens, smc, key)
  args = (
    setup.sharded,
    setup.sharded_draft,
    *sh.shard_batch(setup.mesh, sh.DEFAULT_RULES, prompts, lens),
  )

  def run(p, dp, x, n):
    return smc_generate(p, CFG, drafter, dp, x, n, smc, key)

  compiled = sh.compile_on_mesh(run, *args)
  out = compiled(*args)
  np.testing.assert_array_equal(out.particle_tokens, ref.particle_tokens)
  np.testing.assert_array_equal(out.resamples, ref.resamples)
  assert int(ref.resamples.sum()) > 0  # resampling (a row gather) was exercised
  np.testing.assert_allclose(out.log_weights, ref.log_weights, rtol=1e-4, atol=1e-4)
  _assert_no_weight_gathers(compiled, setup.params, setup.draft_params)


def test_on_mesh_tree_sd_matches_unsharded(setup):
  tree_sd = pytest.importorskip("specjax.tree_speculative")
  tree_dm = pytest.importorskip("specjax.drafters.tree_draft_model")
  trees = pytest.importorskip("specjax.trees")
  gen = GenerateConfig(max_new_tokens=8)
  drafter = tree_dm.StaticTreeDrafter(DRAFT_CFG, trees.StaticTree.full((2, 2)))
  ref = tree_sd.tree_speculative_generate(
    setup.params, CFG, drafter, setup.draft_params, setup.prompts, setup.lens, gen
  )
  args = (
    setup.sharded,
    setup.sharded_draft,
    *sh.shard_batch(setup.mesh, sh.DEFAULT_RULES, setup.prompts, setup.lens),
  )

  def run(p, dp, x, n):
    return tree_sd.tree_speculative_generate(p, CFG, drafter, dp, x, n, gen)

  compiled = sh.compile_on_mesh(run, *args)
  out = compiled(*args)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.metrics.accepted, ref.metrics.accepted)
  _assert_no_weight_gathers(compiled, setup.params, setup.draft_params)


def _train(objective, trainable, frozen, batches, opt):
  step = make_train_step(objective, opt)
  state = TrainState(jnp.int32(0), trainable, opt.init(trainable))
  losses = []
  for batch in batches:
    state, metrics = step(state, frozen, batch)
    losses.append(float(metrics["loss"]))
  return state.params, losses


def test_on_mesh_training_medusa_heads_sharded_gives_the_same_loss_curve(setup):
  """`train.loop.make_train_step` on Medusa heads over the tiny target's features, both ways."""
  objective = MedusaObjective(n_heads=2, vocab_size=CFG.vocab_size)
  d2t = jnp.arange(0, CFG.vocab_size, 2, dtype=jnp.int32)  # a 192-token draft vocabulary
  trainable, frozen = objective.init(None, setup.params, CFG, d2t)
  batches = []
  for key in jax.random.split(jax.random.PRNGKey(7), 5):
    tokens = jax.random.randint(key, (8, 12), 0, CFG.vocab_size)
    hidden = forward(setup.params, tokens, init_cache(CFG, 8, 12), CFG).hidden
    pos = jnp.broadcast_to(jnp.arange(12, dtype=jnp.int32), (8, 12))
    doc = jnp.zeros((8, 12), jnp.int32)
    batches.append(Batch(tokens, hidden, None, doc, pos, jnp.ones((8, 12), bool)))
  rules = sh.DEFAULT_RULES
  s_trainable = sh.shard_params(trainable, setup.mesh, rules)  # before the step donates them
  s_frozen = sh.shard_params(frozen, setup.mesh, rules)
  s_batches = [jax.tree.map(lambda a: sh.shard_batch(setup.mesh, rules, a)[0], b) for b in batches]
  opt = optax.adam(3e-2)
  _, ref = _train(objective, trainable, frozen, batches, opt)
  params, got = _train(objective, s_trainable, s_frozen, s_batches, opt)
  assert ref[-1] < ref[0] - 0.05  # it learns
  np.testing.assert_allclose(got, ref, rtol=1e-4)
  assert s_frozen["head"].addressable_shards[0].data.shape == (48, 48)  # vocabulary split 4 ways
  assert params["w"].addressable_shards[0].data.shape == (2, 12, 48)  # still split after updates
