"""A Flax NNX causal LM as the target of every decode loop (`specjax.target.TargetModel`).

The module's `__call__(tokens, cache, *, positions=None, new_mask=None, hidden_layers=(),
logit_positions=None)` must follow `specjax.model.forward`'s contract and return a
`specjax.model.Output`; it stores its keys and values in specjax's `KVCache` layout
([L, B, S, Hkv, Dh] plus per-row lengths; `specjax.model.attention_mask` gives the slots each new
token may see). `NNXTarget.split(module)` returns the static target and its parameter state:

    target, state = NNXTarget.split(module, n_layers=2, n_kv_heads=4, head_dim=16)
    out = generate(state, target, prompts, prompt_lens, gen)
    out = speculative_generate(state, target, drafter, draft_params, prompts, prompt_lens, gen)

Inside the compiled loop the module is rebuilt from (graph definition, state) at every call
(`nnx.merge`), so the loop carries only arrays.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
from flax import nnx

from specjax.kv_cache import KVCache
from specjax.model import Output


@dataclasses.dataclass(frozen=True)
class NNXTarget:
  """A Flax NNX module's graph definition and its cache geometry (static, hashable).

  Attributes:
    graphdef: `nnx.split(module)[0]`.
    n_layers: cached layers L.
    n_kv_heads: key/value heads Hkv per layer.
    head_dim: Dh.
    dtype: the cache's dtype.
  """

  graphdef: Any
  n_layers: int
  n_kv_heads: int
  head_dim: int
  dtype: str = "float32"

  @classmethod
  def split(cls, module: nnx.Module, **geometry) -> tuple[NNXTarget, nnx.State]:
    """(target, params) for `module`; geometry: n_layers, n_kv_heads, head_dim (and dtype)."""
    graphdef, state = nnx.split(module)
    return cls(graphdef, **geometry), state

  def forward(self, params, tokens, cache: KVCache, **kwargs) -> Output:
    out = nnx.merge(self.graphdef, params)(tokens, cache, **kwargs)
    if not isinstance(out, Output):
      raise TypeError(f"the NNX target returned {type(out).__name__}; it must return model.Output")
    return out

  def init_cache(self, batch: int, capacity: int) -> KVCache:
    shape = (self.n_layers, batch, capacity, self.n_kv_heads, self.head_dim)
    zeros = jnp.zeros(shape, self.dtype)
    return KVCache(zeros, zeros, jnp.zeros((batch,), jnp.int32))
