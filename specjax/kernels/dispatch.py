"""`kernel_or_fallback`: a CPU kernel where it is correct and cheap, plain JAX everywhere else.

The C++ kernels are custom calls that XLA's SPMD partitioner cannot split: in a computation
partitioned over several devices it would all-gather every operand (every weight and the whole
cache) to call them. So the choice between kernel and plain JAX is made when the jitted function
is lowered, where both the platform and the partitioning are known:

  * CPU, lowered for one device (or inside a `shard_map` whose every mesh axis is manual, where the
    body sees local shards): the kernel;
  * CPU lowered for an SPMD computation over more than one device, any other platform, or an
    unknown context: the plain-JAX fallback, which XLA partitions like the rest of the model.

The choice is one primitive whose lowering rule lowers either function (`mlir.lower_fun`). Its
derivative is the fallback's (the forward value still comes from the kernel), and `vmap` maps
both functions.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

_choice_p = Primitive("specjax_cpu_kernel_or_fallback")
_choice_p.multiple_results = True


def partitioned(axis_context) -> bool:
  """Whether a lowering context means SPMD partitioning over more than one device.

  Args:
    axis_context: `ctx.module_context.axis_context` of a lowering rule.

  Returns:
    False for one device, for a `shard_map` body whose non-manual mesh axes all have size 1, and
    for pmap replicas (each runs on its own device); True otherwise, including unknown contexts.
  """
  kind = type(axis_context).__name__
  if kind == "ShardingContext":
    return axis_context.num_devices > 1
  if kind == "SPMDAxisContext":
    sizes = dict(axis_context.mesh.shape)
    auto = [n for n in sizes if n not in axis_context.manual_axes]
    return math.prod(sizes[n] for n in auto) > 1
  if kind == "ReplicaAxisContext":
    return False
  return True


def _abstract_eval(*args, kernel, fallback, out_avals):
  """The fallback's result types; inside `shard_map` they vary over the inputs' manual axes."""
  del kernel, fallback
  typed = [a for a in args if getattr(a, "manual_axis_type", None) is not None]
  varying = frozenset().union(*(a.manual_axis_type.varying for a in typed))
  if not varying:
    return list(out_avals)
  mat = type(typed[0].manual_axis_type)(varying=varying)
  sharding = jax.sharding.NamedSharding(typed[0].sharding.mesh, jax.sharding.PartitionSpec())
  return [a.update(sharding=sharding, manual_axis_type=mat) for a in out_avals]


def _lower_cpu(ctx, *args, kernel, fallback, out_avals):
  del out_avals
  f = fallback if partitioned(ctx.module_context.axis_context) else kernel
  return mlir.lower_fun(f, multiple_results=True)(ctx, *args)


def _lower_default(ctx, *args, kernel, fallback, out_avals):
  del kernel, out_avals
  return mlir.lower_fun(fallback, multiple_results=True)(ctx, *args)


def _jvp(primals, tangents, *, kernel, fallback, out_avals):
  tangents = [ad.instantiate_zeros(t) for t in tangents]
  _, out_tangents = jax.jvp(fallback, tuple(primals), tuple(tangents))
  outs = _choice_p.bind(*primals, kernel=kernel, fallback=fallback, out_avals=out_avals)
  return outs, list(out_tangents)


def _batch(args, dims, *, kernel, fallback, out_avals):
  del out_avals
  in_axes = tuple(dims)  # None: not mapped
  outs = _bind(jax.vmap(kernel, in_axes), jax.vmap(fallback, in_axes), args)
  return outs, [0] * len(outs)


_choice_p.def_impl(lambda *args, **params: _jit_impl(*args, **params))
_choice_p.def_abstract_eval(_abstract_eval)
mlir.register_lowering(_choice_p, _lower_cpu, platform="cpu")
mlir.register_lowering(_choice_p, _lower_default)
ad.primitive_jvps[_choice_p] = _jvp
batching.primitive_batchers[_choice_p] = _batch


@functools.partial(jax.jit, static_argnames=("kernel", "fallback", "out_avals"))
def _jit_impl(*args, kernel, fallback, out_avals):
  return _choice_p.bind(*args, kernel=kernel, fallback=fallback, out_avals=out_avals)


def _bind(kernel, fallback, args):
  """Binds the primitive for flat array functions (both return a list of arrays)."""
  shapes = jax.eval_shape(fallback, *args)
  out_avals = tuple(jax.core.ShapedArray(s.shape, s.dtype) for s in shapes)
  return _choice_p.bind(*args, kernel=kernel, fallback=fallback, out_avals=out_avals)


def kernel_or_fallback(kernel: Callable, fallback: Callable, *args: jax.Array) -> jax.Array:
  """`kernel(*args)` where lowered for CPU on one device, `fallback(*args)` elsewhere.

  Args:
    kernel: the CPU implementation (may call `jax.ffi`); never differentiated.
    fallback: the plain-JAX implementation with the same result; used for derivatives and vmap
      too. Both take the arrays `args` and return one array of the same shape and dtype.
    *args: arrays.

  Returns:
    The result of whichever function was lowered.
  """
  (out,) = _bind(_single(kernel), _single(fallback), args)
  return out


class _single:
  """Wraps a one-result function as a list-returning one; hashable by the wrapped function."""

  def __init__(self, f: Callable):
    self.f = f

  def __call__(self, *args):
    return [self.f(*args)]

  def __hash__(self):
    return hash(self.f)

  def __eq__(self, other):
    return isinstance(other, _single) and other.f == self.f
