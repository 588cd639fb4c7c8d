"""Optional compiled CPU kernels, called through `jax.ffi` (plain JAX elsewhere and as fallback).

bfloat16 weights with bfloat16 activations use AMX tiles where the CPU, the OS and the Linux tile
permission allow (`amx_available()`; `SPECJAX_AMX=0` turns them off), else AVX512-BF16 `vdpbf16ps`
where the CPU has it; float32 accumulation either way.
"""

from specjax.kernels.amx import amx_available
from specjax.kernels.build import unavailable_reason
from specjax.kernels.cache_attention import attention
from specjax.kernels.cache_write import write_layer
from specjax.kernels.projection import MAX_KERNEL_ROWS, kernel_enabled, linear, linear_multi, swiglu
from specjax.kernels.take_rows import take_rows

__all__ = [
  "MAX_KERNEL_ROWS",
  "amx_available",
  "attention",
  "kernel_enabled",
  "linear",
  "linear_multi",
  "swiglu",
  "take_rows",
  "unavailable_reason",
  "write_layer",
]
