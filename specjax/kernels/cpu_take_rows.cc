// Row gather for XLA:CPU, called through the XLA FFI.
//
//   out[n, ...] = table[ids[n], ...]      for every n (ids flattened; negative ids count from the
//                                          end, then every id is clamped into [0, V))
//
// table is [V, ...] of any dtype, ids int32, out [N, ...] of table's dtype. XLA:CPU computes 16-bit
// float ops in float32, so a bfloat16 gather reads a float32 copy of the whole table; inside a
// loop XLA hoists that copy out and writes it on every call (113 MB for SmolLM2's embedding).
// Moving the rows' bytes avoids it.

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

ffi::Error TakeRowsImpl(ffi::AnyBuffer table, ffi::Buffer<ffi::S32> ids,
                        ffi::Result<ffi::AnyBuffer> out) {
  auto td = table.dimensions();
  const int64_t n = static_cast<int64_t>(ids.element_count());
  if (td.size() < 1 || td[0] < 1 || out->element_type() != table.element_type()) {
    return ffi::Error::InvalidArgument("take_rows: expected table [V, ...], out of its dtype");
  }
  const int64_t V = td[0];
  const size_t row_bytes = table.size_bytes() / static_cast<size_t>(V);
  if (out->size_bytes() != row_bytes * static_cast<size_t>(n)) {
    return ffi::Error::InvalidArgument("take_rows: out must hold one table row per id");
  }
  const char* src = static_cast<const char*>(table.untyped_data());
  char* dst = static_cast<char*>(out->untyped_data());
  for (int64_t i = 0; i < n; ++i) {
    int64_t id = ids.typed_data()[i];
    if (id < 0) id += V;
    id = std::clamp<int64_t>(id, 0, V - 1);
    std::memcpy(dst + static_cast<size_t>(i) * row_bytes, src + static_cast<size_t>(id) * row_bytes,
                row_bytes);
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecjaxCpuTakeRows, TakeRowsImpl,
                              ffi::Ffi::Bind()
                                .Arg<ffi::AnyBuffer>()
                                .Arg<ffi::Buffer<ffi::S32>>()
                                .Ret<ffi::AnyBuffer>());
