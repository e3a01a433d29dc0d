// kernels/gguf_dequant_internal.h — the argument check shared by gguf_dequant_ref.cpp and
// gguf_dequant_cpu.cpp (not for callers outside kernels/). The dequantization arithmetic of each
// path stays written out on its own, so the reference remains independent of the CPU path.
#pragma once
#include <cstdint>
#include <string>

#include "common/error.h"
#include "common/gguf_types.h"

namespace qlora::kernels::detail {

/// The ggml type table row of `t` for dequantizing `n` elements. Throws qlora::Error for a type
/// dequantize_gguf_* does not accept, n < 0 or n not a multiple of the type's block size.
inline const gguf::GgmlTypeInfo& checked_gguf_type(gguf::GgmlType t, int64_t n) {
  const gguf::GgmlTypeInfo* ti = gguf::ggml_type_info(static_cast<uint32_t>(t));
  QLORA_CHECK(ti && ti->dequantize, "gguf dequantize: type ",
              ti ? ti->name : std::to_string(static_cast<uint32_t>(t)).c_str(), " is not supported");
  QLORA_CHECK(n >= 0 && n % ti->block == 0, "gguf dequantize: ", n,
              " elements is not a multiple of the ", ti->name, " block size ", ti->block);
  return *ti;
}

}  // namespace qlora::kernels::detail
