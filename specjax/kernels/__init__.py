"""Optional compiled CPU kernels, called through `jax.ffi` (plain JAX elsewhere and as fallback)."""

from specjax.kernels.build import unavailable_reason
from specjax.kernels.cache_attention import attention
from specjax.kernels.cache_write import write_layer
from specjax.kernels.projection import MAX_KERNEL_ROWS, kernel_enabled, linear, linear_multi, swiglu

__all__ = [
  "MAX_KERNEL_ROWS",
  "attention",
  "kernel_enabled",
  "linear",
  "linear_multi",
  "swiglu",
  "unavailable_reason",
  "write_layer",
]
