"""Large-model deployments as data: target + drafter + mesh, their shapes and per-device memory.

A deployment config (`configs/large/*.py`) names a target and a drafter by their Hugging Face
`config.json` fields and local checkpoint directories (nothing is fetched from a hub), a mesh and the
sharding rules. `Deployment.from_config` turns it into typed objects; `abstract_target` /
`abstract_drafter` build the weight trees with `jax.eval_shape` (no allocation), and `memory_plan`
reports what every device holds under the mesh:

  python -m specjax.deploy --config=configs/large/llama31_70b_smc.py
  python -m specjax.deploy --config=configs/large/llama31_70b_smc.py --config.mesh.shape=2,4

Drafter kinds are looked up in a small registry of weight layouts (`DrafterLayout`,
`register_layout`); the ones registered here:
  draft_model  a separate Llama-family LM (`specjax.model.Params`), e.g. Llama-3.2-1B for a 70B.
  eagle3       the published EAGLE-3 head (one decoder layer whose attention reads [embedding;
               feature] of width 2D, a fusion fc of three target layers, its own norm and a
               draft-vocabulary head with a d2t map).
  medusa       published Medusa-1 heads (K heads x R residual blocks, one LM head per head).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from specjax.config import ModelConfig
from specjax.kv_cache import KVCache
from specjax.loading.heads import Eagle3HeadParams, Eagle3LayerParams, MedusaHeadParams
from specjax.model import init_params
from specjax.registry import Registry
from specjax.sharding import (
  DEFAULT_RULES,
  MeshConfig,
  Rules,
  cache_specs,
  param_specs,
  per_device_bytes,
  rules_from_config,
)


def base_deployment_config():
  """Fields every `configs/large` file fills in (an ml_collections ConfigDict)."""
  import ml_collections

  c = ml_collections.ConfigDict()
  c.name = ""
  c.dtype = "bfloat16"
  c.target = ml_collections.ConfigDict()
  c.target.checkpoint = ""  # local Hugging Face directory (config.json + *.safetensors)
  c.target.hf_config = ml_collections.ConfigDict()  # its config.json fields
  c.drafter = ml_collections.ConfigDict()
  c.drafter.kind = "draft_model"  # one of drafter_kinds()
  c.drafter.checkpoint = ""  # local directory of the drafter's weights
  c.drafter.hf_config = ml_collections.ConfigDict()  # draft model / EAGLE-3 head config.json
  c.drafter.k = 4
  c.drafter.hidden_layers = ()
  c.drafter.draft_vocab = 0
  c.drafter.n_heads = 0
  c.drafter.n_blocks = 1
  c.mesh = ml_collections.ConfigDict()
  c.mesh.shape = (1, -1)
  c.mesh.axes = ("data", "tensor")
  c.rules = [list(r) for r in DEFAULT_RULES]  # (logical axis, mesh axis or None)
  c.decode = ml_collections.ConfigDict()
  c.decode.batch = 1
  c.decode.n_particles = 1
  c.decode.capacity = 4096
  c.decode.max_new_tokens = 512
  c.decode.temperature = 0.0
  return c


def _plain(x: Any) -> Any:
  """ConfigDict / FrozenConfigDict / tuple trees -> plain dicts and lists."""
  if hasattr(x, "to_dict"):
    x = x.to_dict()
  if isinstance(x, dict):
    return {k: _plain(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_plain(v) for v in x]
  return x


@dataclasses.dataclass(frozen=True)
class DrafterSpec:
  """A drafter of a deployment.

  Attributes:
    kind: a registered layout (`drafter_kinds()`).
    cfg: the draft model's config, or the EAGLE-3 head layer's (n_layers = 1).
    checkpoint: local directory of its weights ("" when not downloaded).
    k: draft length K (gamma for SMC-SD).
    hidden_layers: target layers an EAGLE-3 head fuses.
    draft_vocab: EAGLE-3 draft vocabulary size Vd.
    n_heads: Medusa heads K.
    n_blocks: residual blocks per Medusa head.
  """

  kind: str
  cfg: ModelConfig | None = None
  checkpoint: str = ""
  k: int = 4
  hidden_layers: tuple[int, ...] = ()
  draft_vocab: int = 0
  n_heads: int = 0
  n_blocks: int = 1

  def __post_init__(self):
    _LAYOUTS.get(self.kind)  # an unknown kind is a ValueError listing the registered ones


@dataclasses.dataclass(frozen=True)
class Deployment:
  """A target, its drafter, the mesh and the decode shape a deployment is planned for.

  Attributes:
    name: label.
    target: the target's config.
    target_checkpoint: local Hugging Face directory ("" when not downloaded).
    drafter: the drafter.
    mesh: device mesh.
    rules: logical-axis sharding rules.
    batch: request rows decoded together.
    n_particles: SMC-SD particles per request (1 for chain speculation).
    capacity: cache slots per row (prompt + new tokens + draft room).
  """

  name: str
  target: ModelConfig
  target_checkpoint: str
  drafter: DrafterSpec
  mesh: MeshConfig
  rules: Rules
  batch: int
  n_particles: int
  capacity: int

  @property
  def rows(self) -> int:
    return self.batch * self.n_particles

  @classmethod
  def from_config(cls, c: Any) -> "Deployment":
    """From a `configs/large` ConfigDict (see those files for the fields)."""
    dtype = c.dtype
    target = ModelConfig.from_hf_dict(_plain(c.target.hf_config), dtype=dtype)
    d = c.drafter
    dcfg, layout = None, _LAYOUTS.get(d.kind)  # ValueError for an unknown kind
    if layout.decoder_config:
      dcfg = ModelConfig.from_hf_dict(_plain(d.hf_config), dtype=dtype)
      if dcfg.vocab_size != target.vocab_size:
        raise ValueError(f"{d.kind} vocabulary {dcfg.vocab_size} != target's {target.vocab_size}")
    drafter = DrafterSpec(
      kind=d.kind,
      cfg=dcfg,
      checkpoint=d.checkpoint,
      k=int(d.k),
      hidden_layers=tuple(int(i) for i in d.get("hidden_layers", ())),
      draft_vocab=int(d.get("draft_vocab", 0)),
      n_heads=int(d.get("n_heads", 0)),
      n_blocks=int(d.get("n_blocks", 1)),
    )
    return cls(
      name=c.name,
      target=target,
      target_checkpoint=c.target.checkpoint,
      drafter=drafter,
      mesh=MeshConfig.from_config(c.mesh),
      rules=rules_from_config(_plain(c.rules)),
      batch=int(c.decode.batch),
      n_particles=int(c.decode.get("n_particles", 1)),
      capacity=int(c.decode.capacity),
    )


def abstract_target(cfg: ModelConfig) -> Any:
  """The target's `Params` as ShapeDtypeStructs (`jax.eval_shape`: nothing is allocated)."""
  return jax.eval_shape(lambda: init_params(jax.random.PRNGKey(0), cfg))


def _sds(shape, dtype) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(tuple(shape), dtype)


def eagle3_head_shapes(head: ModelConfig, draft_vocab: int, n_fused: int) -> Eagle3HeadParams:
  """The published EAGLE-3 head (`specjax.loading.heads.Eagle3HeadParams`) as ShapeDtypeStructs.

  fc [D, n*D] fuses the target layers; the layer's q/k/v read [norm(embed); norm(feature)] (2D);
  its MLP, a norm before the head and the head [Vd, D]; d2t maps draft ids to target ids (the
  target's embedding is shared, not stored).
  """
  D, F, dt = head.d_model, head.ffn_dim, head.jnp_dtype
  q, kv = head.n_heads * head.head_dim, head.n_kv_heads * head.head_dim
  layer = Eagle3LayerParams(
    attn_norm=_sds((D,), dt),
    hidden_norm=_sds((D,), dt),
    wq=_sds((q, 2 * D), dt),
    wk=_sds((kv, 2 * D), dt),
    wv=_sds((kv, 2 * D), dt),
    wo=_sds((D, q), dt),
    mlp_norm=_sds((D,), dt),
    w_gate=_sds((F, D), dt),
    w_up=_sds((F, D), dt),
    w_down=_sds((D, F), dt),
  )
  return Eagle3HeadParams(
    fuse=_sds((D, n_fused * D), dt),
    layer=layer,
    norm=_sds((D,), dt),
    head=_sds((draft_vocab, D), dt),
    d2t=_sds((draft_vocab,), jnp.int32),
  )


def medusa_head_shapes(target: ModelConfig, n_heads: int, n_blocks: int) -> MedusaHeadParams:
  """Published Medusa-1 heads (`MedusaHeadParams`): w [K, R, D, D], b [K, R, D], lm_head [K, V, D]."""
  D, V, dt = target.d_model, target.vocab_size, target.jnp_dtype
  return MedusaHeadParams(
    w=_sds((n_heads, n_blocks, D, D), dt),
    b=_sds((n_heads, n_blocks, D), dt),
    lm_head=_sds((n_heads, V, D), dt),
  )


@dataclasses.dataclass(frozen=True)
class DrafterLayout:
  """How one kind of deployed drafter lays out its weights and its KV cache.

  A registry of its own rather than `specjax.drafters.registry.DrafterKind`: a kind there is a
  drafter specjax trains and ships (its tensors become the parameters of a drafter the loops
  run), while a layout here is the shape of a published checkpoint (`specjax.loading.heads`) or a
  separate LM, planned with `jax.eval_shape` and never decoded with. The names and weights differ
  ("medusa" there has no per-head LM head; "draft_model" is no trained kind), and a deployment
  needs only the shapes and the cache, which no `DrafterKind` knows.

  Attributes:
    name: the `drafter.kind` of a `configs/large` file.
    decoder_config: whether `drafter.hf_config` is a decoder's config.json (a `ModelConfig`:
      the draft LM, or the EAGLE-3 head's one layer), checked against the target's vocabulary.
    weights: (deployment) -> the drafter's weights as ShapeDtypeStructs.
    cache_layers: (drafter spec) -> decoder layers in its KV cache, or None for no cache.
  """

  name: str
  decoder_config: bool
  weights: Callable[[Deployment], Any]
  cache_layers: Callable[[DrafterSpec], int] | None = None


_LAYOUTS: Registry[DrafterLayout] = Registry(
  "drafter layout",
  unknown=lambda name, known: f"drafter kind must be one of {known}, got {name!r}",
)


def register_layout(layout: DrafterLayout) -> DrafterLayout:
  """Adds `layout` (a second one of the same name is an error)."""
  return _LAYOUTS.register(layout)


def drafter_kinds() -> tuple[str, ...]:
  """The registered drafter kinds, in registration order."""
  return _LAYOUTS.names()


register_layout(
  DrafterLayout(
    "draft_model",
    decoder_config=True,
    weights=lambda dep: abstract_target(dep.drafter.cfg),
    cache_layers=lambda d: d.cfg.n_layers,
  )
)
register_layout(
  DrafterLayout(
    "eagle3",
    decoder_config=True,
    weights=lambda dep: eagle3_head_shapes(
      dep.drafter.cfg, dep.drafter.draft_vocab, len(dep.drafter.hidden_layers)
    ),
    cache_layers=lambda d: 1,  # the head's one layer
  )
)
register_layout(
  DrafterLayout(
    "medusa",
    decoder_config=False,
    weights=lambda dep: medusa_head_shapes(dep.target, dep.drafter.n_heads, dep.drafter.n_blocks),
  )
)


def abstract_drafter(dep: Deployment) -> Any:
  """The drafter's weights as ShapeDtypeStructs."""
  return _LAYOUTS.get(dep.drafter.kind).weights(dep)


def count_params(tree: Any) -> int:
  """Floating-point parameters in a tree (integer index tables are not counted)."""
  return sum(
    math.prod(x.shape) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)
  )


def _bytes(tree: Any) -> int:
  return sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def abstract_cache(cfg: ModelConfig, rows: int, capacity: int, n_layers: int | None = None):
  L = cfg.n_layers if n_layers is None else n_layers
  shape = (L, rows, capacity, cfg.n_kv_heads, cfg.head_dim)
  kv = _sds(shape, cfg.jnp_dtype)
  return KVCache(kv, kv, _sds((rows,), jnp.int32))


def memory_plan(dep: Deployment, n_devices: int | None = None) -> dict:
  """Bytes per device under the deployment's mesh (even shards), for weights and caches.

  Args:
    dep: the deployment.
    n_devices: devices to resolve a -1 mesh axis (default: the mesh's own size).

  Returns:
    A dict of byte counts ("*_total" over all devices, others per device) and parameter counts.
  """
  mesh = dep.mesh.abstract(n_devices)
  target, drafter = abstract_target(dep.target), abstract_drafter(dep)
  t_specs = param_specs(target, mesh, dep.rules, dep.target)
  d_specs = param_specs(drafter, mesh, dep.rules, dep.drafter.cfg)
  cache = abstract_cache(dep.target, dep.rows, dep.capacity)
  d, d_cache = dep.drafter, None
  cache_layers = _LAYOUTS.get(d.kind).cache_layers
  if cache_layers is not None:
    d_cache = abstract_cache(d.cfg, dep.rows, dep.capacity, n_layers=cache_layers(d))
  plan = {
    "devices": math.prod(dict(mesh.shape).values()),
    "mesh": dict(mesh.shape),
    "target_params": count_params(target),
    "drafter_params": count_params(drafter),
    "target_weights_total": _bytes(target),
    "target_weights": per_device_bytes(target, t_specs, mesh),
    "drafter_weights_total": _bytes(drafter),
    "drafter_weights": per_device_bytes(drafter, d_specs, mesh),
    "target_cache_total": _bytes(cache),
    "target_cache": per_device_bytes(cache, cache_specs(cache, mesh, dep.rules), mesh),
    "drafter_cache": 0,
  }
  if d_cache is not None:
    plan["drafter_cache"] = per_device_bytes(d_cache, cache_specs(d_cache, mesh, dep.rules), mesh)
  plan["per_device"] = sum(
    plan[k] for k in ("target_weights", "drafter_weights", "target_cache", "drafter_cache")
  )
  return plan


def format_plan(dep: Deployment, plan: dict) -> str:
  gib = lambda b: f"{b / 2**30:.2f} GiB"  # noqa: E731
  lines = [
    f"{dep.name}: target {plan['target_params'] / 1e9:.2f}B params, drafter "
    f"{dep.drafter.kind} {plan['drafter_params'] / 1e9:.3f}B, mesh {plan['mesh']}, "
    f"{dep.rows} rows x {dep.capacity} slots, {dep.target.dtype}",
  ]
  for k in ("target_weights", "drafter_weights", "target_cache", "drafter_cache", "per_device"):
    lines.append(f"  {k:16s} {gib(plan[k]):>12s} per device")
  return "\n".join(lines)


def main(argv):
  del argv
  from absl import flags

  dep = Deployment.from_config(flags.FLAGS.config)
  plan = memory_plan(dep)
  print(format_plan(dep, plan))
  print(json.dumps(plan))


if __name__ == "__main__":
  from absl import app
  from ml_collections import config_flags

  config_flags.DEFINE_config_file("config", None, "A configs/large deployment config.")
  app.run(main)
