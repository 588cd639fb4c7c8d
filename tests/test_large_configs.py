"""configs/large: shapes by `jax.eval_shape` (nothing allocated), parameter counts, memory per device."""

from __future__ import annotations

import dataclasses
import math
import pathlib

import jax
import pytest

from specjax import deploy
from specjax.experiment.settings import load_config_file
from specjax.sharding import param_specs

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs" / "large"
GiB = 2**30


def load(name: str):
  return load_config_file(str(CONFIGS / f"{name}.py"))


@pytest.fixture(scope="module")
def deployments():
  names = ("llama31_8b_eagle3", "llama31_70b_smc", "vicuna7b_medusa")
  return {n: deploy.Deployment.from_config(load(n)) for n in names}


def test_every_large_config_is_locked_and_names_no_hub():
  for path in sorted(p for p in CONFIGS.glob("*.py") if p.name != "__init__.py"):
    c = load(path.stem)
    with pytest.raises(AttributeError):
      c.not_a_field = 1
    assert c.target.checkpoint == "" and c.drafter.checkpoint == ""  # local paths, set by the user


def test_parameter_counts(deployments):
  """Published sizes: 8.03B, 70.6B, 1.24B (tied embeddings), 6.74B."""
  counts = {
    name: deploy.count_params(deploy.abstract_target(d.target)) for name, d in deployments.items()
  }
  assert round(counts["llama31_8b_eagle3"] / 1e9, 2) == 8.03
  assert round(counts["llama31_70b_smc"] / 1e9, 1) == 70.6
  assert round(counts["vicuna7b_medusa"] / 1e9, 2) == 6.74
  draft = deploy.abstract_drafter(deployments["llama31_70b_smc"])
  assert round(deploy.count_params(draft) / 1e9, 2) == 1.24
  assert draft.lm_head is None  # tied
  for d in deployments.values():
    assert deploy.count_params(deploy.abstract_target(d.target)) == d.target.num_params()


def test_shapes_are_abstract_and_in_the_deployment_dtype(deployments):
  for d in deployments.values():
    for tree in (deploy.abstract_target(d.target), deploy.abstract_drafter(d)):
      leaves = jax.tree.leaves(tree)
      assert leaves and all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
      floats = {str(x.dtype) for x in leaves if jax.numpy.issubdtype(x.dtype, jax.numpy.floating)}
      assert floats == {d.target.dtype}


def test_published_head_sizes(deployments):
  D, F, Vd, V = 4096, 14336, 32000, 32000
  eagle = deploy.count_params(deploy.abstract_drafter(deployments["llama31_8b_eagle3"]))
  fc, qkvo = D * 3 * D, D * 2 * D + 2 * 1024 * 2 * D + D * D
  assert eagle == fc + qkvo + 3 * D * F + 4 * D + Vd * D  # 424.7M
  medusa = deploy.count_params(deploy.abstract_drafter(deployments["vicuna7b_medusa"]))
  assert medusa == 5 * (D * D + D) + 5 * V * D  # 739.3M


def test_70b_on_tensor_8_memory_per_device(deployments):
  d = deployments["llama31_70b_smc"]
  plan = deploy.memory_plan(d)
  assert plan["devices"] == 8 and plan["mesh"] == {"data": 1, "tensor": 8}
  n = d.target.num_params()
  norms = 80 * 2 * 8192 + 8192  # replicated; every matrix splits 8 ways (64 q heads, 8 KV heads)
  assert plan["target_weights"] == (n - norms) * 2 // 8 + norms * 2
  assert 16.0 * GiB < plan["target_weights"] < 16.5 * GiB
  # 80 layers x 64 rows x 4096 slots x (8 / 8) KV heads x 128 x bf16, keys and values, + lengths.
  assert plan["target_cache"] == 2 * 80 * 64 * 4096 * 1 * 128 * 2 + 64 * 4
  assert plan["per_device"] < 28 * GiB  # fits an 80 GB GPU with room for activations
  specs = param_specs(deploy.abstract_target(d.target), d.mesh.abstract(), d.rules, d.target)
  lp = specs.layers
  assert lp.wq[1] == lp.wk[1] == lp.w_gate[1] == "tensor" and lp.wo[2] == lp.w_down[2] == "tensor"
  assert specs.embed[0] == specs.lm_head[0] == "tensor"


def test_mesh_override_scales_the_plan(deployments):
  d = deployments["llama31_70b_smc"]
  sixteen = deploy.memory_plan(
    dataclasses.replace(d, mesh=deploy.MeshConfig((2, -1))), n_devices=16
  )
  assert sixteen["mesh"] == {"data": 2, "tensor": 8}
  base = deploy.memory_plan(d)
  assert sixteen["target_weights"] == base["target_weights"]  # data parallel: weights replicated
  assert sixteen["target_cache"] * 2 == base["target_cache"]  # rows split over data too
  single = deploy.memory_plan(deployments["vicuna7b_medusa"])
  assert single["target_weights"] == single["target_weights_total"]
  assert math.isclose(single["target_weights"], 6.74e9 * 2, rel_tol=1e-3)
