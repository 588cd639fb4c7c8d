"""specjax: speculative decoding for large language models in JAX.

Axis letters used in shape comments and einsums throughout the package:

  B  batch rows (requests, or requests x particles)
  T  new tokens in one forward call (time)
  S  KV-cache slots (preallocated maximum sequence length)
  K  draft length (tokens proposed per step)
  N  tree nodes
  L  decoder layers
  D  model width (d_model)
  H  query heads; G query heads per KV head; Hkv KV heads; Dh head width
  F  feed-forward width
  V  vocabulary
"""

from specjax.config import ModelConfig
from specjax.kv_cache import KVCache
from specjax.model import Output, Params, forward, init_params
from specjax.sampling import SamplingConfig

__all__ = ["ModelConfig", "KVCache", "Output", "Params", "forward", "init_params", "SamplingConfig"]
