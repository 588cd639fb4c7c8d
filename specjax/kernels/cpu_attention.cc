// Attention of new tokens (a decode step, a verify pass, a prefill) over one layer of the stacked
// KV cache, for XLA:CPU via the FFI.
//
//   out[b, t, h, :] = sum_s p[b, t, h, s] v[layer, b, s, h / G, :],
//   p[b, t, h, :] = softmax_s(scale * q[b, t, h, :] . k[layer, b, s, h / G, :], allowed by mask)
//
// q is float32 [B, T, H, Dh]; k and v are the whole cache [L, B, S, Hkv, Dh] (float32 or bfloat16,
// read in place: XLA would copy and transpose the layer's cache before its batched dots); layer is
// an int32 scalar; mask is bool [B, T, S]; out is float32 [B, T, H, Dh]; G = H / Hkv. Slots after
// the last allowed one of a block of queries are skipped. A query that may see no slot gets zeros.
// Scores and probabilities stay in float32. Every query's result is bitwise the same whatever the
// number of queries in the call (tests/test_cpu_kernels.py checks T = 1..64), so a verify pass
// over k tokens gives each token exactly what a decode step would.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu_common.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using namespace specjax_cpu;  // NOLINT: the kernels' own small vocabulary

constexpr int kRows = 4;  // queries per block (they share one pass over the keys and values)
// Slots per score tile and value vectors per mix tile: 4 x 4 accumulators fit AVX-512's 32
// registers; AVX2's 16 hold 4 x 2 beside the operands.
constexpr int kCols = SPECJAX_LANES == 16 ? 4 : 2;

struct Shape {
  int64_t B, T, H, Hkv, G, Dh, S;
};

// scores[i * S + s0 + j] = scale * q_i . k_{s0 + j} for an MB x NB block of queries and slots.
template <typename C, int MB, int NB>
inline void ScoreTile(const float* const* q, const C* k, int64_t k_stride, int64_t Dh, int64_t s0,
                      float scale, float* scores, int64_t S) {
  const int64_t dv = Dh - Dh % kLanes;
  vf acc[MB][NB];
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j) acc[i][j] = vf{};
  for (int64_t d = 0; d < dv; d += kLanes) {
    vf kv[NB];
    for (int j = 0; j < NB; ++j) kv[j] = LoadW(k + (s0 + j) * k_stride + d);
    for (int i = 0; i < MB; ++i) {
      const vf qv = LoadF32(q[i] + d);
      for (int j = 0; j < NB; ++j) acc[i][j] = Fma(qv, kv[j], acc[i][j]);
    }
  }
#if SPECJAX_LANES == 16
  if constexpr (NB == kCols) {  // Dh % kLanes == 0 here (AttentionImpl checks), so no tail
    vf all[16] = {};
    for (int i = 0; i < MB; ++i)
      for (int j = 0; j < NB; ++j) all[i * NB + j] = acc[i][j];
    const vf sums = HSum16(all) * scale;
    for (int i = 0; i < MB; ++i)
      for (int j = 0; j < NB; ++j) scores[i * S + s0 + j] = sums[i * NB + j];
    return;
  }
#endif
  for (int i = 0; i < MB; ++i) {
    for (int j = 0; j < NB; ++j) {
      float sum = HSum(acc[i][j]);
      for (int64_t d = dv; d < Dh; ++d) sum = Fma(q[i][d], ToF32(k[(s0 + j) * k_stride + d]), sum);
      scores[i * S + s0 + j] = sum * scale;
    }
  }
}

template <typename C, int MB>
void Scores(const float* const* q, const C* k, int64_t k_stride, int64_t Dh, int64_t n_slots,
            float scale, float* scores, int64_t S) {
  int64_t s0 = 0;
  for (; s0 + kCols <= n_slots; s0 += kCols)
    ScoreTile<C, MB, kCols>(q, k, k_stride, Dh, s0, scale, scores, S);
  for (; s0 < n_slots; ++s0) ScoreTile<C, MB, 1>(q, k, k_stride, Dh, s0, scale, scores, S);
}

// In place: masked softmax of each score row over [0, n_slots). Returns false for a row with no
// allowed slot (its probabilities are left all zero).
//
// A slot's probability depends only on the sequence of allowed scores, not on where the allowed
// slots sit: every slot goes through the same vector exp (the tail in a padded vector), and the
// normaliser sums the allowed slots' exponentials packed in slot order. So a tree node, whose
// visible slots are the context plus its ancestors scattered through the block, gets the bits the
// AR step gets when the same keys are contiguous (a lane sum over the unpacked row would group
// them differently; in bfloat16 that difference could change a greedy token).
bool Softmax(float* row, const bool* allowed, int64_t n_slots) {
#if SPECJAX_LANES == 16 && defined(__AVX512BW__) && defined(__AVX512VL__)
  // The same arithmetic as below, 16 slots per step: masked loads of the bool row, a masked max,
  // and a compress-store packing the allowed exponentials in slot order.
  auto in_row = [n_slots](int64_t s) -> __mmask16 {  // lanes s .. s + 15 that are in the row
    return s + kLanes <= n_slots ? 0xffff : static_cast<__mmask16>((1u << (n_slots - s)) - 1);
  };
  auto visible = [allowed](int64_t s, __mmask16 in) -> __mmask16 {
    return _mm_mask_test_epi8_mask(in, _mm_maskz_loadu_epi8(in, allowed + s), _mm_set1_epi8(1));
  };
  __m512 vmax = _mm512_set1_ps(-INFINITY);
  for (int64_t s = 0; s < n_slots; s += kLanes) {
    const __mmask16 in = in_row(s), ok = visible(s, in);
    vmax = _mm512_mask_max_ps(vmax, ok, vmax, _mm512_maskz_loadu_ps(in, row + s));
  }
  const float mx = _mm512_reduce_max_ps(vmax);
  if (mx == -INFINITY) {
    std::fill(row, row + n_slots, 0.f);
    return false;
  }
  thread_local std::vector<float> packed;
  packed.resize(n_slots + kLanes);
  int64_t n = 0;
  const __m512 vmx = _mm512_set1_ps(mx), neg_inf = _mm512_set1_ps(-INFINITY);
  for (int64_t s = 0; s < n_slots; s += kLanes) {
    const __mmask16 in = in_row(s), ok = visible(s, in);
    const __m512 x = _mm512_mask_sub_ps(neg_inf, ok, _mm512_maskz_loadu_ps(in, row + s), vmx);
    const __m512 e = (__m512)Exp((vf)x);
    _mm512_mask_storeu_ps(row + s, in, e);
    _mm512_mask_compressstoreu_ps(packed.data() + n, ok, e);
    n += __builtin_popcount(ok);
  }
#else
  float mx = -INFINITY;
  for (int64_t s = 0; s < n_slots; ++s) {
    if (allowed[s]) mx = std::max(mx, row[s]);
  }
  if (mx == -INFINITY) {
    std::fill(row, row + n_slots, 0.f);
    return false;
  }
  for (int64_t s = 0; s < n_slots; ++s) row[s] = allowed[s] ? row[s] - mx : -INFINITY;
  int64_t s = 0;
  for (; s + kLanes <= n_slots; s += kLanes) StoreF32(row + s, Exp(LoadF32(row + s)));
  if (s < n_slots) {
    float tail[kLanes];
    for (int j = 0; j < kLanes; ++j) tail[j] = s + j < n_slots ? row[s + j] : -INFINITY;
    StoreF32(tail, Exp(LoadF32(tail)));
    for (int j = 0; s + j < n_slots; ++j) row[s + j] = tail[j];
  }
  thread_local std::vector<float> packed;
  packed.resize(n_slots);
  int64_t n = 0;
  for (int64_t j = 0; j < n_slots; ++j) {
    packed[n] = row[j];
    n += allowed[j];
  }
#endif
  vf total = vf{};
  int64_t k = 0;
  for (; k + kLanes <= n; k += kLanes) total += LoadF32(packed.data() + k);
  float sum = HSum(total);
  for (; k < n; ++k) sum += packed[k];
  const float inv = 1.f / sum;
  for (int64_t j = 0; j < n_slots; ++j) row[j] *= inv;
  return true;
}

// out_i[d0 : d0 + kLanes NV] = sum_s p[i, s] v_s[d0 : d0 + kLanes NV] for the block's queries.
template <typename C, int MB, int NV>
inline void MixTile(const float* p, int64_t S, const C* v, int64_t v_stride, int64_t d0,
                    int64_t n_slots, float* const* out) {
  vf acc[MB][NV];
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NV; ++j) acc[i][j] = vf{};
  for (int64_t s = 0; s < n_slots; ++s) {
    vf vv[NV];
    for (int j = 0; j < NV; ++j) vv[j] = LoadW(v + s * v_stride + d0 + j * kLanes);
    for (int i = 0; i < MB; ++i) {
      const vf pi = Splat(p[i * S + s]);
      for (int j = 0; j < NV; ++j) acc[i][j] = Fma(pi, vv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NV; ++j) StoreF32(out[i] + d0 + j * kLanes, acc[i][j]);
}

template <typename C, int MB>
void Mix(const float* p, int64_t S, const C* v, int64_t v_stride, int64_t Dh, int64_t n_slots,
         float* const* out) {  // Dh is a multiple of kLanes
  int64_t d0 = 0;
  for (; d0 + kCols * kLanes <= Dh; d0 += kCols * kLanes)
    MixTile<C, MB, kCols>(p, S, v, v_stride, d0, n_slots, out);
  for (; d0 < Dh; d0 += kLanes) MixTile<C, MB, 1>(p, S, v, v_stride, d0, n_slots, out);
}

template <typename C>
void Block(const Shape& sh, const float* q, const C* k, const C* v, const bool* mask, float scale,
           float* out, int64_t b, int64_t kv, int64_t m0, std::vector<float>& scores) {
  const int64_t M = sh.T * sh.G;  // queries of this (row, kv head): m = t * G + g
  const int mb = static_cast<int>(std::min<int64_t>(kRows, M - m0));
  const float* qp[kRows];
  float* op[kRows];
  const bool* allowed[kRows];
  int64_t last[kRows];
  int64_t n_slots = 0;
  for (int i = 0; i < mb; ++i) {
    const int64_t t = (m0 + i) / sh.G, h = kv * sh.G + (m0 + i) % sh.G;
    qp[i] = q + ((b * sh.T + t) * sh.H + h) * sh.Dh;
    op[i] = out + ((b * sh.T + t) * sh.H + h) * sh.Dh;
    allowed[i] = mask + (b * sh.T + t) * sh.S;
    last[i] = sh.S;
    while (last[i] > 0 && !allowed[i][last[i] - 1]) --last[i];
    n_slots = std::max(n_slots, last[i]);
  }
  const int64_t stride = sh.Hkv * sh.Dh;
  const C* kb = k + (b * sh.S * sh.Hkv + kv) * sh.Dh;
  const C* vb = v + (b * sh.S * sh.Hkv + kv) * sh.Dh;
  scores.resize(kRows * sh.S);
  float* sc = scores.data();
  switch (mb) {
    case 4: Scores<C, 4>(qp, kb, stride, sh.Dh, n_slots, scale, sc, sh.S); break;
    case 3: Scores<C, 3>(qp, kb, stride, sh.Dh, n_slots, scale, sc, sh.S); break;
    case 2: Scores<C, 2>(qp, kb, stride, sh.Dh, n_slots, scale, sc, sh.S); break;
    default: Scores<C, 1>(qp, kb, stride, sh.Dh, n_slots, scale, sc, sh.S); break;
  }
  // Each query's softmax runs over its own visible prefix, never the block's: its sums then take
  // the same order whichever queries share its block, so a query's output does not depend on how
  // many tokens the call holds. The block's later slots get probability 0 (exact zeros in Mix).
  for (int i = 0; i < mb; ++i) {
    Softmax(sc + i * sh.S, allowed[i], last[i]);
    std::fill(sc + i * sh.S + last[i], sc + i * sh.S + n_slots, 0.f);
  }
  switch (mb) {
    case 4: Mix<C, 4>(sc, sh.S, vb, stride, sh.Dh, n_slots, op); break;
    case 3: Mix<C, 3>(sc, sh.S, vb, stride, sh.Dh, n_slots, op); break;
    case 2: Mix<C, 2>(sc, sh.S, vb, stride, sh.Dh, n_slots, op); break;
    default: Mix<C, 1>(sc, sh.S, vb, stride, sh.Dh, n_slots, op); break;
  }
}

template <typename C>
void Run(ffi::ThreadPool& pool, int64_t max_threads, const Shape& sh, const float* q, const C* k,
         const C* v, const bool* mask, float scale, float* out) {
  const int64_t blocks = (sh.T * sh.G + kRows - 1) / kRows;
  const int64_t tasks = sh.B * sh.Hkv * blocks;
  ParallelFor(pool, max_threads, tasks, [&, blocks](int64_t task) {
    thread_local std::vector<float> scores;
    const int64_t blk = task % blocks, kv = (task / blocks) % sh.Hkv, b = task / blocks / sh.Hkv;
    Block(sh, q, k, v, mask, scale, out, b, kv, blk * kRows, scores);
  });
}

ffi::Error AttentionImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::AnyBuffer k,
                         ffi::AnyBuffer v, ffi::Buffer<ffi::S32> layer,
                         ffi::Buffer<ffi::PRED> mask, ffi::ResultBuffer<ffi::F32> out,
                         float scale, int64_t max_threads) {
  auto qd = q.dimensions();
  auto kd = k.dimensions();
  if (qd.size() != 4 || kd.size() != 5 || k.element_type() != v.element_type() ||
      k.element_count() != v.element_count()) {
    return ffi::Error::InvalidArgument("cpu_attention: expected q [B,T,H,Dh], k/v [L,B,S,Hkv,Dh]");
  }
  Shape sh{qd[0], qd[1], qd[2], kd[3], 0, qd[3], kd[2]};
  if (kd[1] != sh.B || kd[4] != sh.Dh || sh.H % sh.Hkv != 0 || sh.Dh % kLanes != 0 ||
      static_cast<int64_t>(mask.element_count()) != sh.B * sh.T * sh.S) {
    return ffi::Error::InvalidArgument("cpu_attention: shapes do not match");
  }
  sh.G = sh.H / sh.Hkv;
  const int64_t l = std::clamp<int64_t>(layer.typed_data()[0], 0, kd[0] - 1);
  const int64_t offset = l * sh.B * sh.S * sh.Hkv * sh.Dh;
  const bool* m = reinterpret_cast<const bool*>(mask.untyped_data());
  if (k.element_type() == ffi::F32) {
    Run(pool, max_threads, sh, q.typed_data(), static_cast<const float*>(k.untyped_data()) + offset,
        static_cast<const float*>(v.untyped_data()) + offset, m, scale, out->typed_data());
  } else if (k.element_type() == ffi::BF16) {
    Run(pool, max_threads, sh, q.typed_data(),
        static_cast<const uint16_t*>(k.untyped_data()) + offset,
        static_cast<const uint16_t*>(v.untyped_data()) + offset, m, scale, out->typed_data());
  } else {
    return ffi::Error::InvalidArgument("cpu_attention: cache must be float32 or bfloat16");
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecjaxCpuAttention, AttentionImpl,
                              ffi::Ffi::Bind()
                                .Ctx<ffi::ThreadPool>()
                                .Arg<ffi::Buffer<ffi::F32>>()
                                .Arg<ffi::AnyBuffer>()
                                .Arg<ffi::AnyBuffer>()
                                .Arg<ffi::Buffer<ffi::S32>>()
                                .Arg<ffi::Buffer<ffi::PRED>>()
                                .Ret<ffi::Buffer<ffi::F32>>()
                                .Attr<float>("scale")
                                .Attr<int64_t>("max_threads"));
