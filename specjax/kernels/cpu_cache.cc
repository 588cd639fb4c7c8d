// In-place per-row KV-cache write for XLA:CPU, called through the XLA FFI.
//
//   buf[layer, b, starts[b] : starts[b] + T, ...] = new[b]      for every row b
//
// buf is [L, B, S, ...] (any dtype), new is [B, T, ...] of the same dtype, layer is an int32
// scalar and starts int32 [B]; the result aliases buf. Indices are clamped like
// dynamic_update_slice. XLA:CPU computes 16-bit float ops in float32, so a bfloat16
// dynamic_update_slice into the stacked cache converts the whole cache; moving bytes avoids that.

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

ffi::Error CacheWriteImpl(ffi::AnyBuffer buf, ffi::AnyBuffer update, ffi::Buffer<ffi::S32> layer,
                          ffi::Buffer<ffi::S32> starts, ffi::Result<ffi::AnyBuffer> out) {
  auto bd = buf.dimensions();
  auto ud = update.dimensions();
  if (bd.size() < 3 || ud.size() != bd.size() - 1 || ud[0] != bd[1] ||
      buf.element_type() != update.element_type() ||
      static_cast<int64_t>(starts.element_count()) != bd[1]) {
    return ffi::Error::InvalidArgument("cache_write: expected buf [L, B, S, ...], new [B, T, ...]");
  }
  int64_t row = 1;  // elements per slot
  for (size_t d = 3; d < bd.size(); ++d) {
    if (ud[d - 1] != bd[d]) return ffi::Error::InvalidArgument("cache_write: slot shape mismatch");
    row *= bd[d];
  }
  const int64_t L = bd[0], B = bd[1], S = bd[2], T = ud[1];
  if (T > S) return ffi::Error::InvalidArgument("cache_write: more new slots than capacity");
  const size_t esize = buf.size_bytes() / std::max<size_t>(buf.element_count(), 1);
  char* dst = static_cast<char*>(out->untyped_data());
  if (dst != buf.untyped_data()) std::memcpy(dst, buf.untyped_data(), buf.size_bytes());
  const char* src = static_cast<const char*>(update.untyped_data());
  const int64_t l = std::clamp<int64_t>(layer.typed_data()[0], 0, L - 1);
  const size_t bytes = static_cast<size_t>(T * row) * esize;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t s = std::clamp<int64_t>(starts.typed_data()[b], 0, S - T);
    std::memcpy(dst + static_cast<size_t>(((l * B + b) * S + s) * row) * esize,
                src + static_cast<size_t>(b) * bytes, bytes);
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecjaxCpuCacheWrite, CacheWriteImpl,
                              ffi::Ffi::Bind()
                                .Arg<ffi::AnyBuffer>()
                                .Arg<ffi::AnyBuffer>()
                                .Arg<ffi::Buffer<ffi::S32>>()
                                .Arg<ffi::Buffer<ffi::S32>>()
                                .Ret<ffi::AnyBuffer>());
