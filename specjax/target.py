"""The target as an explicit interface: what the decode loops need of the model they accelerate.

Every loop (`generate`, `speculative_generate`, `tree_speculative_generate`, `smc_generate`) takes
its target as (params, model): params is any pytree of arrays, model a static, hashable object
with the two methods of `TargetModel`. A `ModelConfig` stands for specjax's own Llama forward
(`LlamaTarget`); `specjax.nnx_target` adapts a Flax NNX module. The cache is specjax's per-row
`KVCache` ([L, B, S, Hkv, Dh] keys and values plus per-row lengths): the tree loop moves entries
along the accepted path, so a target must store its keys and values in that layout.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import jax

from specjax.config import ModelConfig
from specjax.kv_cache import KVCache, init_cache
from specjax.model import Output, forward


@runtime_checkable
class TargetModel(Protocol):
  """A causal LM the decode loops can drive.

  `forward` runs T new tokens per row on top of the cache and must follow `specjax.model.forward`'s
  contract: row b's tokens go to slots cache.lengths[b] + [0, T) at RoPE/absolute positions
  `positions` (default the slots), attending to every slot before cache.lengths[b] and, among
  the new ones, to those `new_mask` allows (default causal); it returns an `Output` (logits at
  `logit_positions` or at every new token, the final hidden states, the outputs of
  `hidden_layers`, and the cache with lengths advanced by T).
  """

  def forward(
    self,
    params: Any,
    tokens: jax.Array,
    cache: KVCache,
    *,
    positions: jax.Array | None = None,
    new_mask: jax.Array | None = None,
    hidden_layers: Sequence[int] = (),
    logit_positions: jax.Array | None = None,
  ) -> Output: ...

  def init_cache(self, batch: int, capacity: int) -> KVCache:
    """An empty cache of `capacity` slots for `batch` rows."""
    ...


@dataclasses.dataclass(frozen=True)
class LlamaTarget:
  """specjax's Llama-family forward (`specjax.model.forward`) for config `cfg`."""

  cfg: ModelConfig

  def forward(self, params, tokens, cache, **kwargs) -> Output:
    return forward(params, tokens, cache, self.cfg, **kwargs)

  def init_cache(self, batch: int, capacity: int) -> KVCache:
    return init_cache(self.cfg, batch, capacity)


def as_target(model: ModelConfig | TargetModel) -> TargetModel:
  """The `TargetModel` a loop's `cfg` argument stands for.

  Raises:
    TypeError: for an object that is neither a ModelConfig nor a TargetModel.
  """
  if isinstance(model, ModelConfig):
    return LlamaTarget(model)
  if isinstance(model, TargetModel):
    return model
  raise TypeError(
    f"the target must be a ModelConfig (specjax's Llama) or implement specjax.target.TargetModel "
    f"(forward and init_cache); got {type(model).__name__}"
  )
