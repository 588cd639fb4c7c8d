"""Optional compiled CPU kernels, called through `jax.ffi` (plain JAX elsewhere and as fallback).

bfloat16 weights with bfloat16 activations use AVX512-BF16 `vdpbf16ps` (float32 accumulation) where
the CPU has it. There is no AMX tile path: no machine with AMX has been reachable to build and test
one (the development machine is an AMD Zen 5: AVX512-BF16, no AMX). `amx_available()` reports
whether this process could use AMX tiles and requests the Linux tile permission where it could.
"""

from specjax.kernels.amx import amx_available
from specjax.kernels.build import unavailable_reason
from specjax.kernels.cache_attention import attention
from specjax.kernels.cache_write import write_layer
from specjax.kernels.projection import MAX_KERNEL_ROWS, kernel_enabled, linear, linear_multi, swiglu

__all__ = [
  "MAX_KERNEL_ROWS",
  "amx_available",
  "attention",
  "kernel_enabled",
  "linear",
  "linear_multi",
  "swiglu",
  "unavailable_reason",
  "write_layer",
]
