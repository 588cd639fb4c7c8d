// What the CPU and the OS allow of AMX (Advanced Matrix Extensions), and the Linux request for the
// tile-data permission. `specjax/kernels/amx.py` calls these through ctypes and decides; the tile
// code is in cpu_linear.cc, run only after that decision (a tile instruction without the
// permission raises SIGILL).
//
//   SpecjaxCpuid7(out)      CPUID leaf 7 subleaf 0: out = {EAX, EBX, ECX, EDX}; returns 0 when the
//                           CPU has no leaf 7 (or is not x86), 1 otherwise.
//   SpecjaxXcr0(out)        XCR0 via XGETBV when the OS has enabled XSAVE (CPUID.1:ECX.OSXSAVE);
//                           returns 0 (out untouched) when it has not, 1 otherwise.
//   SpecjaxRequestTileData  arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), then
//                           ARCH_GET_XCOMP_PERM: returns 0 when the process holds the permission,
//                           errno of the failing call otherwise (-1: not Linux on x86-64). The
//                           permission is per process; it must be held before any thread executes
//                           a tile instruction (without it, TILELOADD raises SIGILL).

#include <cerrno>
#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace {

constexpr long kArchGetXcompPerm = 0x1022;
constexpr long kArchReqXcompPerm = 0x1023;
constexpr long kXfeatureXtiledata = 18;

}  // namespace

extern "C" {

int SpecjaxCpuid7(uint32_t* out) {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a, b, c, d;
  if (__get_cpuid_max(0, nullptr) < 7) return 0;
  __cpuid_count(7, 0, a, b, c, d);
  out[0] = a;
  out[1] = b;
  out[2] = c;
  out[3] = d;
  return 1;
#else
  (void)out;
  return 0;
#endif
}

int SpecjaxXcr0(uint64_t* out) {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return 0;  // OSXSAVE
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  *out = (static_cast<uint64_t>(hi) << 32) | lo;
  return 1;
#else
  (void)out;
  return 0;
#endif
}

long SpecjaxRequestTileData() {
#if defined(__linux__) && defined(__x86_64__)
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return errno;
  uint64_t granted = 0;
  if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &granted) != 0) return errno;
  return (granted >> kXfeatureXtiledata) & 1 ? 0 : EPERM;
#else
  return -1;
#endif
}

}  // extern "C"
