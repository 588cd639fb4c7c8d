"""Sharding: rules as data, and the decode loops on a (data 2, tensor 4) mesh of 8 fake CPU devices.

The mesh tests need 8 devices, and JAX fixes the CPU device count when it initialises, so
`test_mesh_suite_on_fake_devices` reruns this file's `on_mesh` tests in a child pytest process with
SPECJAX_FAKE_DEVICES=8 (this module then sets `jax_num_cpu_devices` before JAX starts). The child
also turns off the CPU FFI kernels (their custom calls are not partitionable and would gather every
weight) and lowers XLA's backend optimisation level to cut compile time; partitioning, and so the
collectives checked here, happen before the backend.

The tiny models' dimensions (D 48, H*Dh 64, Hkv*Dh 32, F 160, V 384) are chosen so that no activation
or cache shape contains a weight matrix's pair of dimensions, which is what `weight_gathers` looks for.
"""

from __future__ import annotations

import dataclasses
import json
import os
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
  env = dict(os.environ, SPECJAX_FAKE_DEVICES="8", SPECJAX_CPU_KERNELS="0")
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


def _lm_loss(params, tokens):
  cache = init_cache(DRAFT_CFG, tokens.shape[0], tokens.shape[1])
  logits = forward(params, tokens, cache, DRAFT_CFG).logits[:, :-1]
  logp = jax.nn.log_softmax(logits, -1)
  return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], -1))


def _train(params, batches, opt):
  @jax.jit
  def step(params, state, tokens):
    loss, grads = jax.value_and_grad(_lm_loss)(params, tokens)
    updates, state = opt.update(grads, state, params)
    return optax.apply_updates(params, updates), state, loss

  state = opt.init(params)
  losses = []
  for tokens in batches:
    params, state, loss = step(params, state, tokens)
    losses.append(float(loss))
  return params, losses


def test_on_mesh_training_a_small_model_sharded_gives_the_same_loss_curve(setup):
  """A plain optax step (next-token loss of the 1-layer draft model), sharded vs unsharded."""
  opt = optax.adam(3e-3)
  keys = jax.random.split(jax.random.PRNGKey(7), 6)
  batches = [jax.random.randint(k, (8, 12), 0, DRAFT_CFG.vocab_size) for k in keys]
  _, ref = _train(setup.draft_params, batches, opt)
  sharded_batches = [sh.shard_batch(setup.mesh, sh.DEFAULT_RULES, b)[0] for b in batches]
  params, got = _train(setup.sharded_draft, sharded_batches, opt)
  assert ref[-1] < ref[0] - 0.05  # it learns
  np.testing.assert_allclose(got, ref, rtol=2e-5)
  assert params.layers.w_gate.addressable_shards[0].data.shape == (1, 40, 48)  # still split
