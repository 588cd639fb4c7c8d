"""Device meshes and logical-axis sharding rules for targets, drafters, caches and batches.

Every parameter dimension has a logical name (`specjax.model.LOGICAL_AXES` for a target; drafter
weights get theirs from their field names, see `FIELD_AXES`). Rules, plain data, map logical names to
mesh axes; `param_specs` turns both into `PartitionSpec`s and `shard_params` places the weights.
The default rules are Megatron-style tensor parallelism over the "tensor" axis (query and key/value
heads, the MLP width and the vocabulary are split; the model width is not) and data parallelism over
"data" for batch rows, which in SMC-SD are the R x N particle rows:

    mesh = MeshConfig((2, 4)).build()                       # data 2 x tensor 4
    params = shard_params(params, mesh, DEFAULT_RULES, cfg)
    prompts, lens = shard_batch(mesh, DEFAULT_RULES, prompts, lens)
    out = speculative_generate(params, cfg, drafter, draft_params, prompts, lens, gen)

The decode loops need no changes: under `jit`, XLA's sharding propagation starts from the input
shardings (the caches the loops allocate inherit batch and head sharding from the prompts and the
K/V projections), and the only collectives in a step are the row-parallel all-reduces after the
output and down projections, an all-reduce or small all-gather for the vocabulary-split argmax or
softmax, and scalar reductions for the loop condition (`weight_gathers` checks the compiled HLO for
anything that gathers a weight matrix). No `with_sharding_constraint` was needed for that.

Meshes use `AxisType.Auto` (propagation), not JAX's explicit-sharding mode, whose typed shardings
reject the ambiguous gathers (embedding lookup by sharded token ids) the model does.

Dimensions whose size does not divide by their mesh axes are left replicated (SmolLM2's 3 KV heads on
a tensor axis of 4, say), and so are logical names without a rule.

Known costs (read off the compiled HLO of the (2, 4) tests):
  * SMC-SD forks particles with a repeat and resamples with a gather batched over requests
    ([R, N] rows, `specjax.smc.take_within_groups`). With R a multiple of the data size (each
    request's particles on one shard) no collective carries a cache; a flat gather by global row
    index would all-gather them (tests/test_smc.py checks both on a (4, 2) mesh).
  * The CPU FFI kernels (`specjax.kernels`) are custom calls XLA cannot partition, so they are
    chosen only where a computation is lowered for one device (or inside a `shard_map` body whose
    mesh axes are all manual); a computation partitioned over several CPU devices lowers the
    plain-JAX path instead, which partitions like the rest (`specjax.kernels.dispatch`; checked
    on the (2, 4) mesh). GPUs and TPUs always take the plain-JAX path.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AbstractMesh, AxisType, Mesh, NamedSharding, PartitionSpec

from specjax.config import ModelConfig
from specjax.kv_cache import KVCache
from specjax.model import LOGICAL_AXES, Params

# A rule maps one logical axis to a mesh axis, a tuple of mesh axes, or None (replicated).
Rules = tuple[tuple[str, str | tuple[str, ...] | None], ...]

DEFAULT_RULES: Rules = (
  ("batch", "data"),  # request rows; SMC-SD particle rows (R * N)
  ("vocab", "tensor"),  # embedding / LM head rows, logits
  ("q_heads", "tensor"),
  ("kv_heads", "tensor"),  # projections and the K/V cache
  ("mlp", "tensor"),  # SwiGLU width; Medusa residual-block outputs
  ("fused", "tensor"),  # concatenated inputs of EAGLE's input projection and layer fusion
  ("embed", None),  # model width D stays whole on every device
  ("layers", None),
  ("cache_seq", None),
  ("head_dim", None),
  ("draft_heads", None),
  ("ids", None),  # integer index tables (draft-to-target vocabulary maps)
)

# Logical axes of drafter (and target) weights by field name; LayerParams fields get a leading
# "layers" when the array is stacked. Drafter modules need no sharding code of their own.
FIELD_AXES: dict[str, tuple[str | None, ...]] = {
  "embed": ("vocab", "embed"),
  "lm_head": ("vocab", "embed"),
  "head": ("vocab", "embed"),
  "final_norm": ("embed",),
  "norm": ("embed",),
  "hidden_norm": ("embed",),
  "d2t": ("ids",),
  "w_in": ("embed", "fused"),
  "b_in": ("embed",),
  "fuse": ("embed", "fused"),
  "w": ("draft_heads", "mlp", "embed"),  # Medusa residual blocks [K, D_out, D_in]
  "b": ("draft_heads", "mlp"),
  "attn_norm": ("embed",),
  "mlp_norm": ("embed",),
  "wq": ("q_heads", "embed"),
  "wk": ("kv_heads", "embed"),
  "wv": ("kv_heads", "embed"),
  "wo": ("embed", "q_heads"),
  "w_gate": ("mlp", "embed"),
  "w_up": ("mlp", "embed"),
  "w_down": ("embed", "mlp"),
  "bq": ("q_heads",),
  "bk": ("kv_heads",),
  "bv": ("kv_heads",),
}

CACHE_AXES = KVCache(
  k=("layers", "batch", "cache_seq", "kv_heads", "head_dim"),
  v=("layers", "batch", "cache_seq", "kv_heads", "head_dim"),
  lengths=("batch",),
)


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """A device mesh as data: axis sizes and names. One size may be -1 (all remaining devices).

  Attributes:
    shape: devices along each axis, e.g. (2, 4) or (1, -1).
    axes: axis names; add more (e.g. "stage", "expert") and give them rules.
  """

  shape: tuple[int, ...] = (1, -1)
  axes: tuple[str, ...] = ("data", "tensor")

  def __post_init__(self):
    if len(self.shape) != len(self.axes):
      raise ValueError(f"mesh shape {self.shape} and axes {self.axes} differ in length")
    if len(set(self.axes)) != len(self.axes):
      raise ValueError(f"duplicate mesh axis names in {self.axes}")
    if sum(s == -1 for s in self.shape) > 1 or any(s == 0 or s < -1 for s in self.shape):
      raise ValueError(f"mesh shape {self.shape}: sizes must be positive, at most one -1")

  def resolve(self, n_devices: int) -> tuple[int, ...]:
    """The concrete shape for `n_devices` devices."""
    known = math.prod(s for s in self.shape if s != -1)
    if -1 in self.shape:
      if n_devices % known:
        raise ValueError(f"{n_devices} devices do not fill mesh {self.shape}")
      return tuple(n_devices // known if s == -1 else s for s in self.shape)
    if known != n_devices:
      raise ValueError(f"mesh {self.shape} needs {known} devices, have {n_devices}")
    return self.shape

  def build(self, devices: Sequence[Any] | None = None) -> Mesh:
    """A `Mesh` over `devices` (default: all devices of every process)."""
    devices = list(jax.devices() if devices is None else devices)
    shape = self.resolve(len(devices))
    auto = (AxisType.Auto,) * len(shape)
    return jax.make_mesh(shape, self.axes, axis_types=auto, devices=devices)

  def abstract(self, n_devices: int | None = None) -> AbstractMesh:
    """A device-free mesh (for memory estimates); -1 needs `n_devices`."""
    shape = self.resolve(n_devices) if n_devices is not None else self.shape
    if -1 in shape:
      raise ValueError("an abstract mesh with a -1 axis needs n_devices")
    return AbstractMesh(tuple(shape), self.axes, axis_types=(AxisType.Auto,) * len(shape))

  @classmethod
  def from_config(cls, c: Any) -> "MeshConfig":
    """From a config section with `shape` and `axes` fields (ml_collections or dict)."""
    get = c.get if isinstance(c, Mapping) else lambda k: getattr(c, k)
    return cls(tuple(int(s) for s in get("shape")), tuple(str(a) for a in get("axes")))


def rules_from_config(pairs: Any) -> Rules:
  """Rules from config data: (logical, mesh axis | sequence of mesh axes | None or "") pairs."""

  def target(t):
    if t is None or t == "":
      return None
    return str(t) if isinstance(t, str) else tuple(str(a) for a in t)

  return tuple((str(name), target(t)) for name, t in pairs)


def _mesh_sizes(mesh: Mesh | AbstractMesh) -> dict[str, int]:
  return dict(mesh.shape)


def logical_units(cfg: ModelConfig | None) -> dict[str, int]:
  """Indivisible units per logical axis where a dimension packs several (heads of H * Dh rows)."""
  if cfg is None:
    return {}
  return {"q_heads": cfg.n_heads, "kv_heads": cfg.n_kv_heads}


def logical_to_spec(
  axes: Sequence[str | None],
  shape: Sequence[int],
  mesh: Mesh | AbstractMesh,
  rules: Rules = DEFAULT_RULES,
  units: Mapping[str, int] | None = None,
) -> PartitionSpec:
  """The `PartitionSpec` of one array from its logical axes.

  Args:
    axes: logical name per dimension (None: replicated).
    shape: the array's shape (same length as axes).
    mesh: the mesh (concrete or abstract); rule targets missing from it are ignored.
    rules: logical name -> mesh axes.
    units: indivisible units of a logical dimension (e.g. heads); default its size.

  Returns:
    A spec that splits a dimension only if its size and its unit count divide by the product of
    its mesh axes, and uses each mesh axis at most once (first dimension wins).
  """
  if len(axes) != len(shape):
    raise ValueError(f"logical axes {tuple(axes)} do not match shape {tuple(shape)}")
  table = dict(rules)
  sizes = _mesh_sizes(mesh)
  units = units or {}
  used: set[str] = set()
  spec = []
  for name, dim in zip(axes, shape):
    target = table.get(name) if name is not None else None
    targets = (target,) if isinstance(target, str) else tuple(target or ())
    targets = tuple(t for t in targets if t in sizes and t not in used and sizes[t] > 1)
    n = math.prod(sizes[t] for t in targets)
    if not targets or dim % n or units.get(name, dim) % n:
      spec.append(None)
      continue
    used.update(targets)
    spec.append(targets[0] if len(targets) == 1 else targets)
  return PartitionSpec(*spec)


def _names(path) -> tuple[str, ...]:
  out = []
  for p in path:
    for attr in ("name", "key", "idx"):
      if hasattr(p, attr):
        out.append(str(getattr(p, attr)))
        break
  return tuple(out)


def _axes_leaf(x) -> bool:
  return isinstance(x, tuple) and all(isinstance(a, (str, type(None))) for a in x)


def logical_axes(params: Any) -> Any:
  """A tree shaped like `params` holding each array's logical axes.

  Targets (`specjax.model.Params`) use `LOGICAL_AXES`; other weight trees (drafters) are named by
  their field names through `FIELD_AXES`, with a leading "layers" on stacked layer weights.
  """
  declared = {
    _names(p): a for p, a in jax.tree_util.tree_flatten_with_path(LOGICAL_AXES, _axes_leaf)[0]
  }
  is_target = isinstance(params, Params)

  def one(path, leaf):
    names = _names(path)
    if is_target and names in declared:
      axes = declared[names]
    else:
      field = next((n for n in reversed(names) if n in FIELD_AXES), None)
      if field is None:
        raise KeyError(f"no logical axes for parameter {'/'.join(names)}; add it to FIELD_AXES")
      axes = FIELD_AXES[field]
      if np.ndim(leaf) == len(axes) + 1:
        axes = ("layers",) + axes
    if len(axes) != np.ndim(leaf):
      raise ValueError(f"{'/'.join(names)}: axes {axes} do not fit shape {np.shape(leaf)}")
    return axes

  return jax.tree_util.tree_map_with_path(one, params)


def param_specs(
  params: Any,
  mesh: Mesh | AbstractMesh,
  rules: Rules = DEFAULT_RULES,
  cfg: ModelConfig | None = None,
) -> Any:
  """`PartitionSpec` of every weight of a target or drafter (arrays or ShapeDtypeStructs)."""
  axes = logical_axes(params)
  units = logical_units(cfg)
  return jax.tree.map(
    lambda a, x: logical_to_spec(a, np.shape(x), mesh, rules, units),
    axes,
    params,
    is_leaf=_axes_leaf,
  )


def shard_params(
  params: Any, mesh: Mesh, rules: Rules = DEFAULT_RULES, cfg: ModelConfig | None = None
) -> Any:
  """Places a target's or drafter's weights on the mesh by the rules.

  Args:
    params: `Params`, a drafter's params, or () (prompt lookup).
    mesh: the device mesh.
    rules: logical-axis rules.
    cfg: the model config, so head dimensions are only split on whole heads.

  Returns:
    The same tree with every array a global array sharded by its spec.
  """
  specs = param_specs(params, mesh, rules, cfg)
  shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs)
  return jax.device_put(params, shardings)


def shard_host_params(
  params: Any, mesh: Mesh, rules: Rules = DEFAULT_RULES, cfg: ModelConfig | None = None
) -> Any:
  """Like `shard_params` for host arrays (numpy, memory-mapped checkpoint tensors), reading only
  the slices this process's devices hold. Works across processes: every process passes the same
  (lazily readable) tree and builds its part of each global array.
  """
  specs = param_specs(params, mesh, rules, cfg)

  def put(x, spec):
    return jax.make_array_from_callback(
      np.shape(x), NamedSharding(mesh, spec), lambda idx: np.asarray(x[idx])
    )

  return jax.tree.map(put, params, specs)


def cache_specs(cache: KVCache, mesh: Mesh | AbstractMesh, rules: Rules = DEFAULT_RULES) -> KVCache:
  """Specs of a KV cache: rows on the batch axis, K/V heads on the head axis."""
  return jax.tree.map(
    lambda a, x: logical_to_spec(a, np.shape(x), mesh, rules),
    CACHE_AXES,
    cache,
    is_leaf=_axes_leaf,
  )


def batch_spec(shape: Sequence[int], mesh: Mesh | AbstractMesh, rules: Rules = DEFAULT_RULES):
  """Spec of a batch-leading array [B, ...] (prompts, lengths, budgets)."""
  return logical_to_spec(("batch",) + (None,) * (len(shape) - 1), shape, mesh, rules)


def shard_batch(mesh: Mesh, rules: Rules, *arrays: jax.Array) -> tuple[jax.Array, ...]:
  """Places batch-leading arrays with their rows split over the batch mesh axes."""
  return tuple(
    jax.device_put(a, NamedSharding(mesh, batch_spec(np.shape(a), mesh, rules))) for a in arrays
  )


def compile_on_mesh(fn, *args) -> jax.stages.Compiled:
  """Compiles `fn(*args)` for the shardings the (placed) args carry.

  `fn` closes over the static settings and calls a decode loop, e.g.
  `lambda p, x, n: generate(p, cfg, x, n, gen)`; the result runs like `fn` (`compiled(*args)`) and
  its `as_text()` is the partitioned HLO (see `weight_gathers`).
  """
  return jax.jit(fn).lower(*args).compile()


def shard_bytes(shape: Sequence[int], dtype: Any, spec: PartitionSpec, mesh) -> int:
  """Bytes of one device's shard of an array."""
  local = NamedSharding(mesh, spec).shard_shape(tuple(shape))
  return math.prod(local) * np.dtype(dtype).itemsize


def per_device_bytes(tree: Any, specs: Any, mesh: Mesh | AbstractMesh) -> int:
  """Bytes each device holds for a tree of arrays/ShapeDtypeStructs under `specs` (even shards)."""
  leaves = jax.tree.leaves(tree)
  spec_leaves = jax.tree.leaves(specs, is_leaf=lambda s: isinstance(s, PartitionSpec))
  if len(leaves) != len(spec_leaves):
    raise ValueError("tree and specs have different structures")
  return sum(shard_bytes(x.shape, x.dtype, s, mesh) for x, s in zip(leaves, spec_leaves))


Collective = collections.namedtuple("Collective", "kind dtype shape")
_COLLECTIVE = re.compile(
  r"=\s*(\w+)\[([\d,]*)\][^=]*?\b(all-gather|all-to-all|all-reduce|reduce-scatter|"
  r"collective-permute)(?:-start)?\("
)


def collectives(hlo_text: str) -> list[Collective]:
  """Every collective in an HLO module's text: (kind, dtype, per-device result shape)."""
  out = []
  for line in hlo_text.splitlines():
    m = _COLLECTIVE.search(line)
    if m:
      shape = tuple(int(d) for d in m.group(2).split(",") if d)
      out.append(Collective(m.group(3), m.group(1), shape))
  return out


def weight_gathers(hlo_text: str, *param_trees: Any) -> list[Collective]:
  """All-gathers / all-to-alls whose result holds a whole weight matrix of the given trees.

  A weight [.., N, M] (its last two dimensions; a stacked layer axis is ignored) counts as gathered
  when a gather's result shape contains both N and M (as a multiset, ignoring size-1 dimensions).
  Choose test model dimensions that activations and caches do not share (see tests).
  """
  mats = set()
  for tree in param_trees:
    for x in jax.tree.leaves(tree):
      if np.ndim(x) >= 2:
        mats.add(tuple(np.shape(x)[-2:]))
  hits = []
  for c in collectives(hlo_text):
    if c.kind not in ("all-gather", "all-to-all"):
      continue
    dims = collections.Counter(d for d in c.shape if d > 1)
    for n, m in mats:
      need = collections.Counter([n, m])
      if all(dims[d] >= k for d, k in need.items()):
        hits.append(c)
        break
  return hits
