// kernels/quant4_internal.h — helpers shared by quant4_ref.cpp and quant4_cpu.cpp (not installed,
// not for callers outside kernels/). Only argument checks and the two definitions both paths must
// agree on by construction (NaN-propagating max, a block's scale); the arithmetic of each path
// (bucketing, packing, the absmax LUT) stays written out on its own in each file, so the scalar
// reference remains an independent ground truth for the CPU path.
#pragma once
#include <cmath>
#include <cstdint>

#include "common/error.h"
#include "kernels/quant4.h"

namespace qlora::kernels::detail {

/// Throws qlora::Error for n < 0, a blocksize outside bnb's set, or a null pointer when n > 0.
inline void check_quant4_args(int64_t n, int64_t blocksize, const void* a, const void* b,
                              const void* c) {
  QLORA_CHECK(n >= 0, "quant4: expected n >= 0, got ", n);
  QLORA_CHECK(quant4_valid_blocksize(blocksize),
              "quant4: expected blocksize a power of two in 32..4096, got ", blocksize);
  QLORA_CHECK(n == 0 || (a && b && c), "quant4: null pointer for n = ", n);
}

/// check_quant4_args for a dequantize call, plus the nested pointers of double-quantized scales.
inline void check_dequantize_args(const uint8_t* packed, const Quant4Scales& scales, int64_t n,
                                  int64_t blocksize, const void* out) {
  check_quant4_args(n, blocksize, packed, out,
                    scales.nested() ? static_cast<const void*>(scales.absmax_q)
                                    : static_cast<const void*>(scales.absmax));
  QLORA_CHECK(!scales.nested() || n == 0 || (scales.nested_absmax && scales.nested_code),
              "quant4: double-quantized scales need nested_absmax and nested_code");
}

/// Throws qlora::Error unless every pointer of quantize_absmax_* is set (or nblocks == 0).
inline void check_quantize_absmax_args(const float* absmax, int64_t nblocks, const float* code,
                                       const uint8_t* absmax_q, const float* nested_absmax) {
  QLORA_CHECK(nblocks >= 0 && (nblocks == 0 || (absmax && code && absmax_q && nested_absmax)),
              "quant4: null pointer in quantize_absmax");
}

/// torch.max semantics: NaN propagates.
inline float nan_max(float a, float b) { return (std::isnan(a) || a > b) ? a : b; }

/// The float32 scale of block b: absmax[b], or nested_code[absmax_q[b]]·nested_absmax[b/256] +
/// offset (two float32 roundings, bnb functional.dequantize_4bit).
inline float block_scale(const Quant4Scales& sc, int64_t b) {
  if (!sc.nested()) return sc.absmax[b];
  const float v = sc.nested_code[sc.absmax_q[b]] * sc.nested_absmax[b / kNestedBlocksize];
  return v + sc.offset;
}

}  // namespace qlora::kernels::detail
