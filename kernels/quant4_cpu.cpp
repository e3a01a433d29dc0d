// kernels/quant4_cpu.cpp — CPU production path for the 4-bit format: OpenMP over blocks, inner
// loops written so the compiler vectorises them. Bit-identical to quant4_ref.cpp (same float32
// operations in the same order per element); tests/kernels/test_quant4.cpp checks it.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/quant4.h"
#include "kernels/quant4_internal.h"

namespace qlora::kernels {
namespace {
using detail::block_scale;
using detail::check_quant4_args;
using detail::nan_max;

// Branch-free bucketize: #(bounds < s) — the same count as the reference's linear scan.
inline int bucket(float s, const float* bnd) {
  int i = 0;
  for (int k = 0; k < 15; ++k) i += bnd[k] < s;
  return i;
}

// One block: absmax then codes into packed[begin/2 ..]; begin is even (blocksize >= 32).
template <typename T>
void quantize_block(const T* x, int64_t begin, int64_t end, int64_t blocksize, const float* bnd,
                    const uint8_t* order, uint8_t* packed, float* absmax_out) {
  const int64_t len = end - begin;
  float am = 0.f;
  for (int64_t i = begin; i < end; ++i) am = nan_max(am, std::fabs(to_float(x[i])));
  const bool full = len == blocksize;
  const float clamped = nan_max(am, 1e-38f);
  *absmax_out = full ? am : clamped;
  const float recip = 1.0f / clamped;
  uint8_t q[4096];
  for (int64_t i = 0; i < len; ++i) {
    const float v = to_float(x[begin + i]);
    float s = full ? v * recip : v / clamped;
    s = s < -1.f ? -1.f : (s > 1.f ? 1.f : s);
    q[i] = order[bucket(s, bnd)];
  }
  const int64_t pairs = len / 2;
  uint8_t* dst = packed + begin / 2;
  for (int64_t j = 0; j < pairs; ++j) dst[j] = static_cast<uint8_t>((q[2 * j] << 4) | q[2 * j + 1]);
  if (len % 2) dst[pairs] = static_cast<uint8_t>((q[len - 1] << 4) | order[7]);  // pad: code of 0.0
}

}  // namespace

template <typename T>
void quantize_4bit_cpu(const T* x, int64_t n, int64_t blocksize, Quant4Type type, uint8_t* packed,
                       float* absmax) {
  check_quant4_args(n, blocksize, x, packed, absmax);
  const float* bnd = quant4_bounds(type);
  const uint8_t* order = quant4_order(type);
  const int64_t nblocks = quant4_num_blocks(n, blocksize);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t begin = b * blocksize;
    quantize_block(x, begin, std::min(n, begin + blocksize), blocksize, bnd, order, packed,
                   absmax + b);
  }
}

template <typename T>
void dequantize_4bit_cpu(const uint8_t* packed, const Quant4Scales& scales, int64_t n,
                         int64_t blocksize, Quant4Type type, T* out) {
  detail::check_dequantize_args(packed, scales, n, blocksize, out);
  const float* code = quant4_code(type);
  const int64_t nblocks = quant4_num_blocks(n, blocksize);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < nblocks; ++b) {
    // Per block, the 16 possible outputs: code[q] * scale rounded once to T, as the reference.
    const float scale = block_scale(scales, b);
    T lut[16];
    for (int k = 0; k < 16; ++k) lut[k] = from_float<T>(code[k] * scale);
    const int64_t begin = b * blocksize, len = std::min(blocksize, n - begin);
    const uint8_t* src = packed + begin / 2;
    T* dst = out + begin;
    const int64_t pairs = len / 2;
    for (int64_t j = 0; j < pairs; ++j) {
      const uint8_t byte = src[j];
      dst[2 * j] = lut[byte >> 4];
      dst[2 * j + 1] = lut[byte & 0xf];
    }
    if (len % 2) dst[len - 1] = lut[src[pairs] >> 4];
  }
}

void quantize_absmax_cpu(const float* absmax, int64_t nblocks, float offset, const float* code,
                         uint8_t* absmax_q, float* nested_absmax) {
  detail::check_quantize_absmax_args(absmax, nblocks, code, absmax_q, nested_absmax);
  const int64_t nnested = quant4_num_blocks(nblocks, kNestedBlocksize);
  float mid[255];  // float32 midpoints of the (ascending) code, as bnb's build_quantize_lut
  if (nblocks > 0)
    for (int j = 0; j < 255; ++j) mid[j] = (code[j] + code[j + 1]) * 0.5f;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < nnested; ++b) {
    const int64_t begin = b * kNestedBlocksize,
                  end = std::min(nblocks, begin + kNestedBlocksize);
    float am = 0.f;
    for (int64_t i = begin; i < end; ++i) am = std::fmax(am, std::fabs(absmax[i] - offset));
    nested_absmax[b] = am;
    // bnb 0.50.2 native CPU quantize_blockwise: 65536-bin LUT over [-1, 1] (see quant4_ref.cpp);
    // the code of grid point p is #(mid[j] < p), found here by a lower_bound over the midpoints.
    const float inv = 1.0f / am;
    for (int64_t i = begin; i < end; ++i) {
      int idx = 0;
      float val;
      if (am != 0.f && detail::absmax_lut_point(absmax[i] - offset, inv, &val)) {  // else code 0
        int lo = 0, hi = 255;  // lower_bound: first j with mid[j] >= val
        while (lo < hi) {
          const int m = (lo + hi) >> 1;
          if (mid[m] < val) lo = m + 1; else hi = m;
        }
        idx = lo;
      }
      absmax_q[i] = static_cast<uint8_t>(idx);
    }
  }
}

#define QLORA_QUANT4_CPU(T)                                                                   \
  template void quantize_4bit_cpu<T>(const T*, int64_t, int64_t, Quant4Type, uint8_t*, float*); \
  template void dequantize_4bit_cpu<T>(const uint8_t*, const Quant4Scales&, int64_t, int64_t,  \
                                       Quant4Type, T*);
QLORA_QUANT4_CPU(float)
QLORA_QUANT4_CPU(BF16Bits)
QLORA_QUANT4_CPU(FP16Bits)
#undef QLORA_QUANT4_CPU

}  // namespace qlora::kernels
