"""Whether AMX tile kernels could run in this process: CPU, OS and Linux tile permission.

AMX needs three things: the CPU's tile units (CPUID leaf 7 EDX: AMX-BF16 bit 22, AMX-TILE bit 24,
AMX-INT8 bit 25), an OS that saves the tile state (XCR0 bits 17 XTILECFG and 18 XTILEDATA), and,
on Linux, the process's permission for the tile data, requested with
`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)` before any thread executes a tile
instruction (without it TILELOADD raises SIGILL, which is how llama.cpp's AMX path fails on a
machine where standalone AMX programs run). `amx_available` checks all three in that order and
requests the permission once per process.

The bfloat16 projections (`cpu_linear.cc`) use AMX tiles where `amx_available()` says so and
`SPECJAX_AMX` is not "0" (`projection.amx_enabled`), else AVX512-BF16 `vdpbf16ps`; both accumulate
in float32 but in different orders, so one process uses one of them for every call.
"""

from __future__ import annotations

import ctypes
import functools
import os

from specjax.kernels import build

AMX_BF16_BIT, AMX_TILE_BIT, AMX_INT8_BIT = 22, 24, 25  # CPUID.(EAX=7, ECX=0):EDX
XTILECFG_BIT, XTILEDATA_BIT = 17, 18  # XCR0


def decide(edx: int | None, xcr0: int | None, request_permission) -> tuple[bool, str]:
  """The AMX verdict from the raw CPU and OS state (pure but for the permission request).

  Args:
    edx: EDX of CPUID leaf 7 subleaf 0, or None when the CPU has no leaf 7.
    xcr0: XCR0, or None when the OS has not enabled XSAVE.
    request_permission: called only when CPU and OS support AMX; returns 0 once the process holds
      the tile-data permission, else an errno (-1: the platform has no such request).

  Returns:
    (available, reason): reason says which requirement failed, or what is available.
  """
  if edx is None or not (edx >> AMX_TILE_BIT) & 1:
    return False, "CPU has no AMX (no amx_tile in cpuid leaf 7)"
  if not (edx >> AMX_BF16_BIT) & 1:
    return False, "CPU has AMX tiles but no AMX-BF16 (no amx_bf16 in cpuid leaf 7)"
  tile_state = (1 << XTILECFG_BIT) | (1 << XTILEDATA_BIT)
  if xcr0 is None or (xcr0 & tile_state) != tile_state:
    return False, "OS has not enabled the AMX tile state (XCR0 bits 17/18 clear)"
  err = request_permission()
  if err:
    why = "not Linux on x86-64" if err < 0 else os.strerror(err)
    return False, f"arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) failed: {why}"
  int8 = " and AMX-INT8" if (edx >> AMX_INT8_BIT) & 1 else ""
  return True, f"AMX-BF16{int8} available; this process holds the tile-data permission"


def cpuid7(lib: ctypes.CDLL) -> tuple[int, int, int, int] | None:
  """(EAX, EBX, ECX, EDX) of CPUID leaf 7 subleaf 0, or None without leaf 7."""
  regs = (ctypes.c_uint32 * 4)()
  return tuple(regs) if lib.SpecjaxCpuid7(regs) else None


def xcr0(lib: ctypes.CDLL) -> int | None:
  """XCR0, or None when the OS has not enabled XSAVE."""
  value = ctypes.c_uint64()
  return value.value if lib.SpecjaxXcr0(ctypes.byref(value)) else None


@functools.cache
def amx_available() -> tuple[bool, str]:
  """Whether AMX-BF16 tiles may be used in this process, and why (or why not).

  Checks CPUID, XCR0 and, where both allow AMX, requests the Linux tile-data permission (once per
  process: the result is cached). Uses the kernels' own compiled library.

  Returns:
    (available, reason), e.g. (False, "CPU has no AMX (no amx_tile in cpuid leaf 7)").
  """
  lib = build.library()
  if lib is None:
    return False, f"CPU kernels unavailable: {build.unavailable_reason()}"
  lib.SpecjaxRequestTileData.restype = ctypes.c_long
  regs = cpuid7(lib)
  return decide(None if regs is None else regs[3], xcr0(lib), lib.SpecjaxRequestTileData)
