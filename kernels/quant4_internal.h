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

/// The grid point bnb 0.50.2's native CPU quantize_blockwise looks a value up at (csrc/cpu_ops.cpp
/// quantize_cpu_impl + build_quantize_lut, a 65536-bin LUT over [-1, 1]): s = clamp(v·inv, −1, 1),
/// k = (int)fma((s + 1)·0.5, 65535, 0.5) & 0xffff, point = 2k/65535 − 1, all float32. The code is
/// then #{midpoints (c[j] + c[j+1])·0.5 < point}; each path counts them its own way. Returns false
/// for a NaN v (bnb: cvttss2si gives 0x80000000, whose low 16 bits select code 0). Both callers are
/// tested against bnb's stored absmax_q directly (tests/kernels/test_quant4.cpp), not only against
/// each other.
inline bool absmax_lut_point(float v, float inv, float* point) {
  float s = v * inv;
  if (s < -1.f) s = -1.f;
  else if (s > 1.f) s = 1.f;
  const float r = std::fma((s + 1.0f) * 0.5f, 65535.0f, 0.5f);
  if (!(r >= 0.f)) return false;
  const int k = static_cast<int>(r) & 0xffff;
  *point = (2.0f * static_cast<float>(k)) / 65535.0f - 1.0f;
  return true;
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
