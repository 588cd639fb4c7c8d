// Shared pieces of the CPU kernels: float vectors of one machine register (GCC vector extensions:
// 16 lanes where the compiler targets AVX-512, 8 on AVX2 or SSE machines, where a 16-lane vector
// would take two registers and the kernels' tiles would spill to the stack), bfloat16 loads, a
// vector exp, and a parallel-for over XLA's intra-op thread pool.

#ifndef SPECJAX_KERNELS_CPU_COMMON_H_
#define SPECJAX_KERNELS_CPU_COMMON_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <utility>

#include "xla/ffi/api/ffi.h"

#if defined(__FMA__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__)
#define SPECJAX_LANES 16
#else
#define SPECJAX_LANES 8
#endif

namespace specjax_cpu {

namespace ffi = xla::ffi;

constexpr int kLanes = SPECJAX_LANES;
typedef float vf __attribute__((vector_size(4 * kLanes)));
typedef float v8f __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));
typedef int32_t vi __attribute__((vector_size(4 * kLanes)));
typedef uint16_t vh __attribute__((vector_size(2 * kLanes)));
typedef uint32_t vu __attribute__((vector_size(4 * kLanes)));
// The same vectors at any address (loads and stores of rows that need not be aligned).
typedef float vf_any __attribute__((vector_size(4 * kLanes), aligned(4), may_alias));
typedef uint16_t vh_any __attribute__((vector_size(2 * kLanes), aligned(2), may_alias));

inline vf LoadF32(const float* p) { return *reinterpret_cast<const vf_any*>(p); }

inline void StoreF32(float* p, vf v) { *reinterpret_cast<vf_any*>(p) = v; }

inline vf LoadW(const float* p) { return LoadF32(p); }

inline vf LoadW(const uint16_t* p) {  // bfloat16 -> float32 is a 16-bit shift
  const vh h = *reinterpret_cast<const vh_any*>(p);
  return reinterpret_cast<vf>(__builtin_convertvector(h, vu) << 16);
}

inline float ToF32(float v) { return v; }
inline float ToF32(uint16_t v) {
  uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Pairwise horizontal sum; a serial loop over the lanes would cost more than the dot products.
inline float HSum(vf v) {
#if SPECJAX_LANES == 16
  v8f a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
          __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
#else
  v8f a = v;
#endif
  v4f b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}

#if SPECJAX_LANES == 16
// The 16 pairwise horizontal sums of v[0..15] in one vector, lane j = HSum(v[j]) bit for bit: each
// level adds the same two operands HSum adds, for two (then four, eight, sixteen) vectors per
// instruction, so a 4 x 4 tile reduces in 45 vector operations instead of 16 scalar reductions.
inline vf HSum16(const vf* v) {
  vf a[8], b[4], c[2];
  for (int p = 0; p < 8; ++p)  // lanes 8h + l: v[2p + h][l] + v[2p + h][l + 8]
    a[p] = __builtin_shufflevector(v[2 * p], v[2 * p + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19,
                                   20, 21, 22, 23) +
           __builtin_shufflevector(v[2 * p], v[2 * p + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25,
                                   26, 27, 28, 29, 30, 31);
  for (int q = 0; q < 4; ++q)  // lanes 4g + l: HSum's b (l < 4) of v[4q + g]
    b[q] = __builtin_shufflevector(a[2 * q], a[2 * q + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19,
                                   24, 25, 26, 27) +
           __builtin_shufflevector(a[2 * q], a[2 * q + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22,
                                   23, 28, 29, 30, 31);
  for (int r = 0; r < 2; ++r)  // lanes 2g, 2g + 1: b0 + b2, b1 + b3 of v[8r + g]
    c[r] = __builtin_shufflevector(b[2 * r], b[2 * r + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21,
                                   24, 25, 28, 29) +
           __builtin_shufflevector(b[2 * r], b[2 * r + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22,
                                   23, 26, 27, 30, 31);
  return __builtin_shufflevector(c[0], c[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26,
                                 28, 30) +
         __builtin_shufflevector(c[0], c[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29,
                                 31);
}
#endif

// c + a * b rounded once where the CPU has FMA, else rounded twice. Written out rather than left
// to the compiler (the kernels build with -ffp-contract=off): GCC fused some products and not
// others depending on how a tile was inlined, so a row could round differently in a 1-row tile
// than in a 2-row one (seen on an AVX2 Zen 3), breaking the M-invariance the linear kernel promises.
inline vf Fma(vf a, vf b, vf c) {
#if SPECJAX_LANES == 16
  return (vf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__FMA__)
  return (vf)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
  return c + a * b;
#endif
}

inline float Fma(float a, float b, float c) {
#if defined(__FMA__) || defined(__AVX512F__)
  return __builtin_fmaf(a, b, c);
#else
  return c + a * b;
#endif
}

inline vf Splat(float x) { return vf{} + x; }

// exp(x) lane by lane: 2^n * p(r) with x = n ln2 + r, |r| <= ln2 / 2, p a degree-6 Taylor
// polynomial (relative error ~2e-7, about 2 ulp). Inputs below -87.3 give 0, as the masked
// scores of a softmax need.
inline vf Exp(vf x) {
  const vf lo = Splat(-87.3f), hi = Splat(88.3f);
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  const vf magic = Splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  vf n = (x * 1.44269504088896341f + magic) - magic;
  vf r = x - n * 0.693359375f;  // ln2 split in a short high part and a low part
  r = r - n * -2.12194440e-4f;
  vf p = Splat(1.f / 720);
  p = p * r + 1.f / 120;
  p = p * r + 1.f / 24;
  p = p * r + 1.f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  vi e = (__builtin_convertvector(n, vi) + 127) << 23;
  vf scale;
  std::memcpy(&scale, &e, sizeof(scale));
  vf y = p * scale;
  return x <= lo ? vf{} : y;
}

// Runs fn(i) for i in [0, n) on up to `max_threads` threads of XLA's pool (0: all of them). The
// calling thread takes tasks too, so the call never waits on a pool thread that is busy elsewhere.
template <typename F>
void ParallelFor(ffi::ThreadPool& pool, int64_t max_threads, int64_t n, F fn) {
  struct State {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
  };
  auto state = std::make_shared<State>();
  auto shared_fn = std::make_shared<F>(std::move(fn));
  auto work = [state, shared_fn, n] {
    for (;;) {
      const int64_t i = state->next.fetch_add(1, std::memory_order_relaxed);
      if (i >= n) return;
      (*shared_fn)(i);
      state->done.fetch_add(1, std::memory_order_acq_rel);
    }
  };
  int64_t threads = std::max<int64_t>(1, pool.num_threads());
  if (max_threads > 0) threads = std::min(threads, max_threads);
  const int64_t helpers = std::min(threads, n) - 1;
  for (int64_t t = 0; t < helpers; ++t) pool.Schedule(decltype(work)(work));
  work();
  while (state->done.load(std::memory_order_acquire) < n) std::this_thread::yield();
}

}  // namespace specjax_cpu

#endif  // SPECJAX_KERNELS_CPU_COMMON_H_
