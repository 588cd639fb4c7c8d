// Shared pieces of the CPU kernels: 16-lane float vectors (GCC vector extensions, so the compiler
// picks AVX-512, AVX2 or SSE for the machine it builds on), bfloat16 loads, a vector exp, and a
// parallel-for over XLA's intra-op thread pool.

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

namespace specjax_cpu {

namespace ffi = xla::ffi;

constexpr int kLanes = 16;
typedef float v16f __attribute__((vector_size(64), aligned(4)));
typedef float v8f __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32), aligned(2)));
typedef uint32_t v16u __attribute__((vector_size(64)));

inline v16f LoadF32(const float* p) {
  v16f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void StoreF32(float* p, v16f v) { std::memcpy(p, &v, sizeof(v)); }

inline v16f LoadW(const float* p) { return LoadF32(p); }

inline v16f LoadW(const uint16_t* p) {  // bfloat16 -> float32 is a 16-bit shift
  v16h h;
  std::memcpy(&h, p, sizeof(h));
  v16u u = __builtin_convertvector(h, v16u) << 16;
  v16f f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline float ToF32(float v) { return v; }
inline float ToF32(uint16_t v) {
  uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Pairwise horizontal sum; a serial loop over the lanes would cost more than the dot products.
inline float HSum(v16f v) {
  v8f a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
          __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  v4f b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}

inline v16f Splat(float x) { return v16f{} + x; }

// exp(x) for 16 lanes: 2^n * p(r) with x = n ln2 + r, |r| <= ln2 / 2, p a degree-6 Taylor
// polynomial (relative error ~2e-7, about 2 ulp). Inputs below -87.3 give 0, as the masked
// scores of a softmax need.
inline v16f Exp(v16f x) {
  const v16f lo = Splat(-87.3f), hi = Splat(88.3f);
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  const v16f magic = Splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  v16f n = (x * 1.44269504088896341f + magic) - magic;
  v16f r = x - n * 0.693359375f;  // ln2 split in a short high part and a low part
  r = r - n * -2.12194440e-4f;
  v16f p = Splat(1.f / 720);
  p = p * r + 1.f / 120;
  p = p * r + 1.f / 24;
  p = p * r + 1.f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  v16i e = (__builtin_convertvector(n, v16i) + 127) << 23;
  v16f scale;
  std::memcpy(&scale, &e, sizeof(scale));
  v16f y = p * scale;
  return x <= lo ? v16f{} : y;
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
