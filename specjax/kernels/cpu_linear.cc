// Small-M linear layers for XLA:CPU, called through the XLA FFI.
//
//   y[m, :] = concat_i(x[m, :] @ w_i[layer].T)            (epilogue 0: one or more weights)
//   y[m, :] = silu(x[m, :] @ w_0[layer].T) * (x[m, :] @ w_1[layer].T)   (epilogue 1: SwiGLU)
//
// x is float32 [..., K], or bfloat16 when every w_i is (products then use AMX tiles when the
// caller asks for them (attribute `amx`, set only where `amx.py` found the CPU, the OS and the
// process permission ready), else the CPU's bf16 dot instruction `vdpbf16ps` (AVX512-BF16), both
// accumulating in float32); each w_i is float32 or bfloat16,
// [N_i, K] or stacked [L, N_i, K] with `layer` picking one (read in place: no slice is
// materialised); y is float32 [..., N]. Each
// weight row is read from memory once per call and multiplied against every row of x while it
// sits in L1, so for the few rows of a decode or verify step the cost stays that of streaming the
// weights; the weight rows a tile will need next are prefetched while it computes, so streaming
// and arithmetic overlap. Output rows are split into chunks run on XLA's intra-op thread pool;
// the calling thread takes chunks too, so the call never depends on a pool thread being free.
//
// Every row of y is the same bits whatever M is: a row's dot products accumulate lane by lane over
// k in one fixed order, with the same explicit fused multiply-adds, then take the same horizontal
// sum and tail, in the 1- to 4-row tiles alike (AVX2 uses tiles of at most 2 rows), and chunks
// split output columns, never rows (tests/test_cpu_kernels.py checks M = 1..64). A verify pass
// over k tokens thus gives each token what a decode step would.
//
// The AMX path keeps that property: a tile product computes every output element on its own, over
// k in one fixed order, whatever the tile's other rows and columns hold, and which path an output
// column takes (tiles for whole blocks of 16 columns, `vdpbf16ps` for the last N % 16) depends on
// N and K only, never on M or on how columns are split between threads. Its bits differ from the
// `vdpbf16ps` path's, so a process uses one or the other for every call (the attribute is fixed
// when the computation is lowered, from `SPECJAX_AMX` and the CPU).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

#include "cpu_common.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using namespace specjax_cpu;  // NOLINT: the kernels' own small vocabulary

constexpr int kMaxWeights = 4;

// Rows of x per tile. A 4 x 4 tile holds 16 accumulators, 4 weight vectors and one x vector: 21 of
// AVX-512's 32 registers, but more than AVX2's 16, where 2 x 4 (13) is the largest that fits.
#if SPECJAX_LANES == 16
constexpr int kRowTile = 4;
#else
constexpr int kRowTile = 2;
#endif

// out[i * 4 + j] = x[m0 + i, :] . w[n0 + j, :] for an MB x NB tile.
template <int MB, int NB, typename W>
inline void Tile(const float* x, const W* w, int64_t K, int64_t m0, int64_t n0, float* out,
                 const W* pf) {
  vf acc[MB][NB];
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j) acc[i][j] = vf{};
  const int64_t kv = K - K % kLanes;
  constexpr int64_t line = 64 / sizeof(W);  // elements per cache line: one prefetch each
  for (int64_t k = 0; k < kv; k += kLanes) {
    if (pf != nullptr && k % line == 0)
      for (int j = 0; j < NB; ++j) __builtin_prefetch(pf + j * K + k, 0, 3);
    vf wv[NB];
    for (int j = 0; j < NB; ++j) wv[j] = LoadW(w + (n0 + j) * K + k);
    for (int i = 0; i < MB; ++i) {
      vf xv = LoadF32(x + (m0 + i) * K + k);
      for (int j = 0; j < NB; ++j) acc[i][j] = Fma(xv, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MB; ++i) {
    for (int j = 0; j < NB; ++j) {
      float s = HSum(acc[i][j]);
      for (int64_t k = kv; k < K; ++k) s = Fma(x[(m0 + i) * K + k], ToF32(w[(n0 + j) * K + k]), s);
      out[i * 4 + j] = s;
    }
  }
}

template <int NB, typename W>
inline void TileM(const float* x, const W* w, int64_t K, int64_t m0, int mb, int64_t n0,
                  float* out, const W* pf) {
  switch (mb) {
    case 4: Tile<4, NB>(x, w, K, m0, n0, out, pf); break;
    case 3: Tile<3, NB>(x, w, K, m0, n0, out, pf); break;
    case 2: Tile<2, NB>(x, w, K, m0, n0, out, pf); break;
    default: Tile<1, NB>(x, w, K, m0, n0, out, pf); break;
  }
}

#if defined(__AVX512BF16__)
// Tile for bfloat16 x and w: each instruction multiplies 32 pairs and accumulates in float32.
template <int MB, int NB>
inline void TileBf16(const uint16_t* x, const uint16_t* w, int64_t K, int64_t m0, int64_t n0,
                     float* out, const uint16_t* pf) {
  __m512 acc[MB][NB];
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_ps();
  const int64_t kv = K - K % 32;
  for (int64_t k = 0; k < kv; k += 32) {
    if (pf != nullptr)
      for (int j = 0; j < NB; ++j) __builtin_prefetch(pf + j * K + k, 0, 3);
    __m512bh wv[NB];
    for (int j = 0; j < NB; ++j) wv[j] = (__m512bh)_mm512_loadu_si512(w + (n0 + j) * K + k);
    for (int i = 0; i < MB; ++i) {
      __m512bh xv = (__m512bh)_mm512_loadu_si512(x + (m0 + i) * K + k);
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv, wv[j]);
    }
  }
  for (int i = 0; i < MB; ++i) {
    for (int j = 0; j < NB; ++j) {
      float s = _mm512_reduce_add_ps(acc[i][j]);
      for (int64_t k = kv; k < K; ++k)
        s = Fma(ToF32(x[(m0 + i) * K + k]), ToF32(w[(n0 + j) * K + k]), s);
      out[i * 4 + j] = s;
    }
  }
}

template <int NB>
inline void TileMBf16(const uint16_t* x, const uint16_t* w, int64_t K, int64_t m0, int mb,
                      int64_t n0, float* out, const uint16_t* pf) {
  switch (mb) {
    case 4: TileBf16<4, NB>(x, w, K, m0, n0, out, pf); break;
    case 3: TileBf16<3, NB>(x, w, K, m0, n0, out, pf); break;
    case 2: TileBf16<2, NB>(x, w, K, m0, n0, out, pf); break;
    default: TileBf16<1, NB>(x, w, K, m0, n0, out, pf); break;
  }
}
#endif


#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#define SPECJAX_AMX 1
// AMX: y^T = w x^T, one tile of 16 weight rows against a block of up to 16 rows of x at a time.
// Tile registers: 0 the accumulator C (weight rows x rows of x, float32), 1 the packed x operand
// B, 2 the weights A (16 weight rows x 32 k, loaded in place from the [N, K] weights). One tile at
// a time streamed best at one row of x (a decode step) of the layouts measured on an Emerald
// Rapids (RESULTS.md): more weight tiles per step mean more strided rows in flight.
constexpr int kAmxK = 32;     // k per tile product (16 bf16 pairs)
constexpr int kAmxRows = 16;  // weight rows per tile; rows of x per block at most

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Loads this thread's tile configuration for blocks of `width` rows of x (1..16).
inline void ConfigureTiles(int width) {
  TileConfig cfg;
  cfg.rows[0] = kAmxRows, cfg.colsb[0] = 4 * width;   // C
  cfg.rows[1] = kAmxK / 2, cfg.colsb[1] = 4 * width;  // B
  cfg.rows[2] = kAmxRows, cfg.colsb[2] = 2 * kAmxK;   // A
  _tile_loadconfig(&cfg);
}

// x in blocks of `width` rows in the tiles' pair-interleaved layout:
// packed[b][kb][p][j][t] = x[b * width + j][kb * 32 + 2p + t], zero past row M.
std::vector<uint16_t> PackX(const uint16_t* x, int64_t M, int64_t K, int width) {
  const int64_t blocks = (M + width - 1) / width, kbs = K / kAmxK;
  std::vector<uint16_t> packed(blocks * K * width, 0);
  for (int64_t b = 0; b < blocks; ++b) {
    for (int j = 0; j < width && b * width + j < M; ++j) {
      const uint16_t* row = x + (b * width + j) * K;
      uint16_t* out = packed.data() + b * K * width + 2 * j;
      for (int64_t kb = 0; kb < kbs; ++kb)
        for (int p = 0; p < kAmxK / 2; ++p)
          for (int t = 0; t < 2; ++t)
            out[(kb * (kAmxK / 2) + p) * 2 * width + t] = row[kb * kAmxK + 2 * p + t];
    }
  }
  return packed;
}

// c[i][j] = w[i, :] . x[block row j] for the 16 weight rows at w; c is 16 rows of `width` floats.
// The 16 rows at `pf` (the next tile's, contiguous with these) are prefetched into L2 meanwhile,
// in address order.
inline void AmxTile(const uint16_t* xb, const uint16_t* w, int64_t K, int width, float* c,
                    const uint16_t* pf) {
  const int64_t kbs = K / kAmxK;
  const int64_t lines = pf != nullptr ? kAmxRows * K * 2 / 64 : 0;
  int64_t next_line = 0;
  _tile_zero(0);
  for (int64_t kb = 0; kb < kbs; ++kb) {
    for (int64_t stop = lines * (kb + 1) / kbs; next_line < stop; ++next_line)
      __builtin_prefetch(reinterpret_cast<const char*>(pf) + next_line * 64, 0, 2);
    _tile_loadd(1, xb + kb * kAmxK * width, 4 * width);
    _tile_loadd(2, w + kb * kAmxK, 2 * K);
    _tile_dpbf16ps(0, 2, 1);
  }
  _tile_stored(0, c, 4 * width);
}
#endif

struct Weight {
  const void* data;  // this layer's [N, K]
  bool bf16;
  int64_t n;
  int64_t col;  // first output column (epilogue 0)
};

template <typename W>
inline void AnyTile(const float* x, const W* w, int64_t K, int64_t m0, int mb, int64_t n0, int nb,
                    float* out, const W* pf) {
  if (nb == 4) {
    TileM<4>(x, w, K, m0, mb, n0, out, pf);
  } else {
    const W* none = nullptr;  // column tails do not prefetch
    for (int j = 0; j < nb; ++j) TileM<1>(x, w, K, m0, mb, n0 + j, out + j, none);
  }
}

struct Input {
  const float* f32;  // x as float32 (always set unless the bf16 product path is used)
  const uint16_t* bf16;  // x as bfloat16 when the bf16 product path is used, else null
};

// While the first block of rows of x runs over a tile of weight rows, the rows this far ahead
// are prefetched, so the weight stream overlaps the multiply-adds instead of alternating with
// them (bfloat16 one tile ahead, float32 two; measured best on a 2-core Zen 5, RESULTS.md).
// Prefetching never changes a result.
inline int64_t PrefetchRows(bool bf16) { return bf16 ? 4 : 8; }

inline void WeightTile(const Input& x, const Weight& wt, int64_t K, int64_t m0, int mb,
                       int64_t n0, int nb, float* out, bool prefetch) {
  const int64_t ahead_rows = PrefetchRows(wt.bf16);
  const bool pf = prefetch && n0 + ahead_rows < wt.n;
#if defined(__AVX512BF16__)
  if (x.bf16 != nullptr) {
    const uint16_t* w = static_cast<const uint16_t*>(wt.data);
    const uint16_t* ahead = pf ? w + (n0 + ahead_rows) * K : nullptr;
    if (nb == 4) {
      TileMBf16<4>(x.bf16, w, K, m0, mb, n0, out, ahead);
    } else {
      for (int j = 0; j < nb; ++j) TileMBf16<1>(x.bf16, w, K, m0, mb, n0 + j, out + j, nullptr);
    }
    return;
  }
#endif
  if (wt.bf16) {
    const uint16_t* w = static_cast<const uint16_t*>(wt.data);
    AnyTile(x.f32, w, K, m0, mb, n0, nb, out, pf ? w + (n0 + ahead_rows) * K : nullptr);
  } else {
    const float* w = static_cast<const float*>(wt.data);
    AnyTile(x.f32, w, K, m0, mb, n0, nb, out, pf ? w + (n0 + ahead_rows) * K : nullptr);
  }
}

struct Problem {
  Input x;
  float* y;
  int64_t M, K, ldy;
  int epilogue;
  Weight w[kMaxWeights];
  int n_weights;
  const uint16_t* x_tiles = nullptr;  // x packed for AMX (PackX), or null: no tile path
  int tile_width = 0;                 // rows of x per packed block
};

struct Chunk {
  int weight;  // epilogue 0: which weight; epilogue 1: unused
  int64_t begin, end;
};

// Output rows [c.begin, c.end) of one weight (or of the SwiGLU pair) for every row of x.
void RunChunk(const Problem& p, const Chunk& c) {
  float a[16], b[16];
  for (int64_t n = c.begin; n < c.end; n += 4) {
    const int nb = static_cast<int>(std::min<int64_t>(4, c.end - n));
    for (int64_t m = 0; m < p.M; m += kRowTile) {
      const int mb = static_cast<int>(std::min<int64_t>(kRowTile, p.M - m));
      if (p.epilogue == 1) {
        WeightTile(p.x, p.w[0], p.K, m, mb, n, nb, a, m == 0);
        WeightTile(p.x, p.w[1], p.K, m, mb, n, nb, b, m == 0);
        for (int i = 0; i < mb; ++i)
          for (int j = 0; j < nb; ++j) {
            const float g = a[i * 4 + j];
            p.y[(m + i) * p.ldy + n + j] = g / (1.f + std::exp(-g)) * b[i * 4 + j];
          }
      } else {
        const Weight& wt = p.w[c.weight];
        WeightTile(p.x, wt, p.K, m, mb, n, nb, a, m == 0);
        for (int i = 0; i < mb; ++i)
          for (int j = 0; j < nb; ++j) p.y[(m + i) * p.ldy + wt.col + n + j] = a[i * 4 + j];
      }
    }
  }
}

#if defined(SPECJAX_AMX)
// RunChunk through AMX tiles: whole tiles of 16 output columns; the last c.end % 16 columns (only
// the weight's last chunk has them) through `RunChunk`.
void RunChunkAmx(const Problem& p, const Chunk& c) {
  const int width = p.tile_width;
  float a[kAmxRows * kAmxRows], b[kAmxRows * kAmxRows];
  ConfigureTiles(width);
  int64_t n = c.begin;
  for (; n + kAmxRows <= c.end; n += kAmxRows) {
    for (int64_t m = 0; m < p.M; m += width) {
      const int mb = static_cast<int>(std::min<int64_t>(width, p.M - m));
      const uint16_t* xb = p.x_tiles + (m / width) * p.K * width;
      auto product = [&](const Weight& wt, float* out) {
        const uint16_t* w = static_cast<const uint16_t*>(wt.data) + n * p.K;
        const bool ahead = m == 0 && n + 2 * kAmxRows <= wt.n;
        AmxTile(xb, w, p.K, width, out, ahead ? w + kAmxRows * p.K : nullptr);
      };
      if (p.epilogue == 1) {
        product(p.w[0], a);
        product(p.w[1], b);
        for (int j = 0; j < mb; ++j)
          for (int i = 0; i < kAmxRows; ++i) {
            const float g = a[i * width + j];
            p.y[(m + j) * p.ldy + n + i] = g / (1.f + std::exp(-g)) * b[i * width + j];
          }
      } else {
        const Weight& wt = p.w[c.weight];
        product(wt, a);
        for (int j = 0; j < mb; ++j)
          for (int i = 0; i < kAmxRows; ++i)
            p.y[(m + j) * p.ldy + wt.col + n + i] = a[i * width + j];
      }
    }
  }
  _tile_release();
  if (n < c.end) RunChunk(p, {c.weight, n, c.end});
}
#endif

void Run(ffi::ThreadPool& pool, int64_t max_threads, const Problem& problem) {
  int64_t threads = std::max<int64_t>(1, pool.num_threads());
  if (max_threads > 0) threads = std::min(threads, max_threads);
  const int segments = problem.epilogue == 1 ? 1 : problem.n_weights;
  int64_t rows_total = 0;
  for (int s = 0; s < segments; ++s) rows_total += problem.w[s].n;
  // Chunks of a multiple of 4 rows (16 for tiles), about four per thread for balance, none tiny.
  const int64_t align = problem.x_tiles != nullptr ? 16 : 4;
  int64_t rows = (rows_total + threads * 4 - 1) / (threads * 4);
  rows = std::max<int64_t>(threads > 1 ? 32 : rows_total, (rows + align - 1) / align * align);
  std::vector<Chunk> chunks;
  for (int s = 0; s < segments; ++s) {
    for (int64_t b = 0; b < problem.w[s].n; b += rows) {
      chunks.push_back({s, b, std::min(problem.w[s].n, b + rows)});
    }
  }
  const Chunk* c = chunks.data();
#if defined(SPECJAX_AMX)
  if (problem.x_tiles != nullptr) {
    ParallelFor(pool, threads, static_cast<int64_t>(chunks.size()),
                [&problem, c](int64_t i) { RunChunkAmx(problem, c[i]); });
    return;
  }
#endif
  ParallelFor(pool, threads, static_cast<int64_t>(chunks.size()),
              [&problem, c](int64_t i) { RunChunk(problem, c[i]); });
}

ffi::Error LinearImpl(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::Buffer<ffi::S32> layer,
                      ffi::RemainingArgs weights, ffi::ResultBuffer<ffi::F32> y,
                      int64_t max_threads, int64_t epilogue, int64_t amx) {
  auto xd = x.dimensions();
  if (xd.size() == 0) return ffi::Error::InvalidArgument("cpu_linear: x must be [..., K]");
  Problem p;
  std::vector<float> x_f32;  // bf16 x on a CPU without the bf16 dot instruction
  if (x.element_type() == ffi::F32) {
    p.x = {static_cast<const float*>(x.untyped_data()), nullptr};
  } else if (x.element_type() == ffi::BF16) {
    const uint16_t* xb = static_cast<const uint16_t*>(x.untyped_data());
#if defined(__AVX512BF16__)
    p.x = {nullptr, xb};
#else
    x_f32.resize(x.element_count());
    for (size_t i = 0; i < x_f32.size(); ++i) x_f32[i] = ToF32(xb[i]);
    p.x = {x_f32.data(), nullptr};
#endif
  } else {
    return ffi::Error::InvalidArgument("cpu_linear: x must be float32 or bfloat16");
  }
  p.y = y->typed_data();
  p.K = xd.back();
  p.M = p.K ? x.element_count() / p.K : 0;
  p.epilogue = static_cast<int>(epilogue);
  p.n_weights = static_cast<int>(weights.size());
  if (p.n_weights < 1 || p.n_weights > kMaxWeights || (epilogue == 1 && p.n_weights != 2)) {
    return ffi::Error::InvalidArgument("cpu_linear: bad number of weights for the epilogue");
  }
  int64_t col = 0;
  for (int i = 0; i < p.n_weights; ++i) {
    auto w = weights.get<ffi::AnyBuffer>(i);
    if (!w.has_value()) return ffi::Error::InvalidArgument("cpu_linear: weight is not a buffer");
    auto wd = w->dimensions();
    if ((wd.size() != 2 && wd.size() != 3) || wd.back() != p.K) {
      return ffi::Error::InvalidArgument("cpu_linear: weights must be [N, K] or [L, N, K]");
    }
    const bool bf16 = w->element_type() == ffi::BF16;
    if (!bf16 && w->element_type() != ffi::F32) {
      return ffi::Error::InvalidArgument("cpu_linear: weights must be float32 or bfloat16");
    }
    if (x.element_type() == ffi::BF16 && !bf16) {
      return ffi::Error::InvalidArgument("cpu_linear: bfloat16 x needs bfloat16 weights");
    }
    const int64_t n = wd[wd.size() - 2];
    const int64_t l = wd.size() == 3 ? std::clamp<int64_t>(layer.typed_data()[0], 0, wd[0] - 1) : 0;
    const char* base = static_cast<const char*>(w->untyped_data());
    p.w[i] = {base + l * n * p.K * (bf16 ? 2 : 4), bf16, n, col};
    col += n;
  }
  p.ldy = epilogue == 1 ? p.w[0].n : col;
  if (epilogue == 1 && p.w[1].n != p.w[0].n) {
    return ffi::Error::InvalidArgument("cpu_linear: SwiGLU weights differ in shape");
  }
  if (static_cast<int64_t>(y->element_count()) != p.M * p.ldy) {
    return ffi::Error::InvalidArgument("cpu_linear: output has the wrong size");
  }
  std::vector<uint16_t> x_tiles;
  if (amx != 0) {
#if defined(SPECJAX_AMX)
    // Only the bf16 product path, and only where K is whole tile steps (else the caller's choice
    // falls back to vdpbf16ps for this weight shape, whatever M is).
    if (p.x.bf16 != nullptr && p.K % kAmxK == 0 && p.M > 0) {
      p.tile_width = static_cast<int>(std::min<int64_t>(kAmxRows, p.M));
      x_tiles = PackX(p.x.bf16, p.M, p.K, p.tile_width);
      p.x_tiles = x_tiles.data();
    }
#else
    return ffi::Error::InvalidArgument("cpu_linear: built without AMX (amx=1 asked)");
#endif
  }
  if (p.M > 0) Run(pool, max_threads, p);
  return ffi::Error::Success();
}

}  // namespace

// 1 if this build has the AMX tile path (the compiler targeted AMX-TILE and AMX-BF16), else 0.
extern "C" int SpecjaxLinearHasAmx() {
#if defined(SPECJAX_AMX)
  return 1;
#else
  return 0;
#endif
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecjaxCpuLinear, LinearImpl,
                              ffi::Ffi::Bind()
                                .Ctx<ffi::ThreadPool>()
                                .Arg<ffi::AnyBuffer>()
                                .Arg<ffi::Buffer<ffi::S32>>()
                                .RemainingArgs()
                                .Ret<ffi::Buffer<ffi::F32>>()
                                .Attr<int64_t>("max_threads")
                                .Attr<int64_t>("epilogue")
                                .Attr<int64_t>("amx"));
