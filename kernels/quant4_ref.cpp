// kernels/quant4_ref.cpp — scalar ground truth for the 4-bit NF4/FP4 format (see quant4.h).
// Written for clarity, one element at a time; every other path is tested against it.
#include "kernels/quant4.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "kernels/quant4_internal.h"

namespace qlora::kernels {
namespace {
using detail::block_scale;
using detail::check_quant4_args;
using detail::nan_max;

// bnb functional.get_4bit_type("nf4"): create_normal_map(offset=0.9677083) quantiles, float32.
constexpr float kNF4[16] = {
    -0x1.0p+0f,        -0x1.6473620p-1f, -0x1.0cd6600p-1f, -0x1.9465400p-2f,
    -0x1.23449a0p-2f,  -0x1.7a6a7e0p-3f, -0x1.74f0e20p-4f, 0x0.0p+0f,
    0x1.45f5fe0p-4f,   0x1.4995c60p-3f,  0x1.f809ba0p-3f,  0x1.5a06740p-2f,
    0x1.c349700p-2f,   0x1.200f560p-1f,  0x1.7227660p-1f,  0x1.0p+0f};
// bnb functional.get_4bit_type("fp4"): [0, 0.0625, 8, 12, 4, 6, 2, 3, -0, ...] / 12, float32.
// Code 8 is -0.0 as bnb's native CPU and CUDA decoders return it (dDequantizeFP4: sign bit set);
// the Python table holds +0.0 (the int literal -0), which only bnb's pure-torch fallback uses.
constexpr float kFP4[16] = {
    0.0f,  0x1.5555560p-8f,  0x1.5555560p-1f,  1.0f,  0x1.5555560p-2f,  0.5f,  0x1.5555560p-3f,  0.25f,
   -0.0f, -0x1.5555560p-8f, -0x1.5555560p-1f, -1.0f, -0x1.5555560p-2f, -0.5f, -0x1.5555560p-3f, -0.25f};
// torch.argsort of the code (bnb _get_4bit_quantize_bounds); the two FP4 zeros keep index order.
constexpr uint8_t kNF4Order[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
constexpr uint8_t kFP4Order[16] = {11, 10, 13, 12, 15, 14, 9, 0, 8, 1, 6, 7, 4, 5, 2, 3};

// bnb functional.create_dynamic_map(signed=True), float32, ascending.
constexpr float kDynamicSigned[256] = {
    -0x1.fc66660000000p-1f, -0x1.f533340000000p-1f, -0x1.ee00000000000p-1f, -0x1.e6cccc0000000p-1f,
    -0x1.df999a0000000p-1f, -0x1.d866660000000p-1f, -0x1.d133340000000p-1f, -0x1.ca00000000000p-1f,
    -0x1.c2cccc0000000p-1f, -0x1.bb999a0000000p-1f, -0x1.b466660000000p-1f, -0x1.ad33340000000p-1f,
    -0x1.a600000000000p-1f, -0x1.9ecccc0000000p-1f, -0x1.97999a0000000p-1f, -0x1.9066660000000p-1f,
    -0x1.8933340000000p-1f, -0x1.8200000000000p-1f, -0x1.7acccc0000000p-1f, -0x1.73999a0000000p-1f,
    -0x1.6c66680000000p-1f, -0x1.6533340000000p-1f, -0x1.5e00000000000p-1f, -0x1.56cccc0000000p-1f,
    -0x1.4f999a0000000p-1f, -0x1.4866680000000p-1f, -0x1.4133340000000p-1f, -0x1.3a00000000000p-1f,
    -0x1.32cccc0000000p-1f, -0x1.2b999a0000000p-1f, -0x1.2466680000000p-1f, -0x1.1d33340000000p-1f,
    -0x1.1600000000000p-1f, -0x1.0ecccc0000000p-1f, -0x1.0799980000000p-1f, -0x1.0066660000000p-1f,
    -0x1.f266640000000p-2f, -0x1.e400000000000p-2f, -0x1.d599980000000p-2f, -0x1.c733340000000p-2f,
    -0x1.b8cccc0000000p-2f, -0x1.aa66660000000p-2f, -0x1.9c00000000000p-2f, -0x1.8d99980000000p-2f,
    -0x1.7f33340000000p-2f, -0x1.70cccc0000000p-2f, -0x1.6266660000000p-2f, -0x1.5400000000000p-2f,
    -0x1.4599980000000p-2f, -0x1.3733340000000p-2f, -0x1.28cccc0000000p-2f, -0x1.1a66680000000p-2f,
    -0x1.0c00000000000p-2f, -0x1.fb33320000000p-3f, -0x1.de66660000000p-3f, -0x1.c1999a0000000p-3f,
    -0x1.a4cccc0000000p-3f, -0x1.8800000000000p-3f, -0x1.6b33340000000p-3f, -0x1.4e66660000000p-3f,
    -0x1.31999a0000000p-3f, -0x1.14cccc0000000p-3f, -0x1.f000000000000p-4f, -0x1.b666680000000p-4f,
    -0x1.93d70a0000000p-4f, -0x1.8851ee0000000p-4f, -0x1.7cccce0000000p-4f, -0x1.7147ae0000000p-4f,
    -0x1.65c2900000000p-4f, -0x1.5a3d700000000p-4f, -0x1.4eb8540000000p-4f, -0x1.4333340000000p-4f,
    -0x1.37ae140000000p-4f, -0x1.2c28f60000000p-4f, -0x1.20a3d60000000p-4f, -0x1.151eba0000000p-4f,
    -0x1.09999a0000000p-4f, -0x1.fc28f60000000p-5f, -0x1.e51eba0000000p-5f, -0x1.ce147a0000000p-5f,
    -0x1.b70a3e0000000p-5f, -0x1.a000000000000p-5f, -0x1.88f5c20000000p-5f, -0x1.71eb860000000p-5f,
    -0x1.5ae1460000000p-5f, -0x1.43d70a0000000p-5f, -0x1.2cccce0000000p-5f, -0x1.15c2900000000p-5f,
    -0x1.fd70a40000000p-6f, -0x1.cf5c2a0000000p-6f, -0x1.a147ae0000000p-6f, -0x1.7333340000000p-6f,
    -0x1.451eba0000000p-6f, -0x1.170a3e0000000p-6f, -0x1.d1eb860000000p-7f, -0x1.75c2900000000p-7f,
    -0x1.3e76c80000000p-7f, -0x1.2c08300000000p-7f, -0x1.19999a0000000p-7f, -0x1.072b020000000p-7f,
    -0x1.e978d40000000p-8f, -0x1.c49ba60000000p-8f, -0x1.9fbe760000000p-8f, -0x1.7ae1480000000p-8f,
    -0x1.56041a0000000p-8f, -0x1.3126e80000000p-8f, -0x1.0c49ba0000000p-8f, -0x1.ced9140000000p-9f,
    -0x1.851eb80000000p-9f, -0x1.3b645a0000000p-9f, -0x1.e353f80000000p-10f, -0x1.4fdf3a0000000p-10f,
    -0x1.eecbfe0000000p-11f, -0x1.b3d07c0000000p-11f, -0x1.78d5000000000p-11f, -0x1.3dd9820000000p-11f,
    -0x1.02de020000000p-11f, -0x1.8fc5060000000p-12f, -0x1.19ce0a0000000p-12f, -0x1.47ae160000000p-13f,
    -0x1.743e960000000p-14f, -0x1.15df660000000p-14f, -0x1.6f00680000000p-15f, -0x1.64840c0000000p-16f,
    -0x1.040bfe0000000p-17f, -0x1.b435280000000p-19f, -0x1.27476e0000000p-21f, 0x0.0p+0f,
    0x1.27476e0000000p-21f, 0x1.b435280000000p-19f, 0x1.040bfe0000000p-17f, 0x1.64840c0000000p-16f,
    0x1.6f00680000000p-15f, 0x1.15df660000000p-14f, 0x1.743e960000000p-14f, 0x1.47ae160000000p-13f,
    0x1.19ce0a0000000p-12f, 0x1.8fc5060000000p-12f, 0x1.02de020000000p-11f, 0x1.3dd9820000000p-11f,
    0x1.78d5000000000p-11f, 0x1.b3d07c0000000p-11f, 0x1.eecbfe0000000p-11f, 0x1.4fdf3a0000000p-10f,
    0x1.e353f80000000p-10f, 0x1.3b645a0000000p-9f, 0x1.851eb80000000p-9f, 0x1.ced9140000000p-9f,
    0x1.0c49ba0000000p-8f, 0x1.3126e80000000p-8f, 0x1.56041a0000000p-8f, 0x1.7ae1480000000p-8f,
    0x1.9fbe760000000p-8f, 0x1.c49ba60000000p-8f, 0x1.e978d40000000p-8f, 0x1.072b020000000p-7f,
    0x1.19999a0000000p-7f, 0x1.2c08300000000p-7f, 0x1.3e76c80000000p-7f, 0x1.75c2900000000p-7f,
    0x1.d1eb860000000p-7f, 0x1.170a3e0000000p-6f, 0x1.451eba0000000p-6f, 0x1.7333340000000p-6f,
    0x1.a147ae0000000p-6f, 0x1.cf5c2a0000000p-6f, 0x1.fd70a40000000p-6f, 0x1.15c2900000000p-5f,
    0x1.2cccce0000000p-5f, 0x1.43d70a0000000p-5f, 0x1.5ae1460000000p-5f, 0x1.71eb860000000p-5f,
    0x1.88f5c20000000p-5f, 0x1.a000000000000p-5f, 0x1.b70a3e0000000p-5f, 0x1.ce147a0000000p-5f,
    0x1.e51eba0000000p-5f, 0x1.fc28f60000000p-5f, 0x1.09999a0000000p-4f, 0x1.151eba0000000p-4f,
    0x1.20a3d60000000p-4f, 0x1.2c28f60000000p-4f, 0x1.37ae140000000p-4f, 0x1.4333340000000p-4f,
    0x1.4eb8540000000p-4f, 0x1.5a3d700000000p-4f, 0x1.65c2900000000p-4f, 0x1.7147ae0000000p-4f,
    0x1.7cccce0000000p-4f, 0x1.8851ee0000000p-4f, 0x1.93d70a0000000p-4f, 0x1.b666680000000p-4f,
    0x1.f000000000000p-4f, 0x1.14cccc0000000p-3f, 0x1.31999a0000000p-3f, 0x1.4e66660000000p-3f,
    0x1.6b33340000000p-3f, 0x1.8800000000000p-3f, 0x1.a4cccc0000000p-3f, 0x1.c1999a0000000p-3f,
    0x1.de66660000000p-3f, 0x1.fb33320000000p-3f, 0x1.0c00000000000p-2f, 0x1.1a66680000000p-2f,
    0x1.28cccc0000000p-2f, 0x1.3733340000000p-2f, 0x1.4599980000000p-2f, 0x1.5400000000000p-2f,
    0x1.6266660000000p-2f, 0x1.70cccc0000000p-2f, 0x1.7f33340000000p-2f, 0x1.8d99980000000p-2f,
    0x1.9c00000000000p-2f, 0x1.aa66660000000p-2f, 0x1.b8cccc0000000p-2f, 0x1.c733340000000p-2f,
    0x1.d599980000000p-2f, 0x1.e400000000000p-2f, 0x1.f266640000000p-2f, 0x1.0066660000000p-1f,
    0x1.0799980000000p-1f, 0x1.0ecccc0000000p-1f, 0x1.1600000000000p-1f, 0x1.1d33340000000p-1f,
    0x1.2466680000000p-1f, 0x1.2b999a0000000p-1f, 0x1.32cccc0000000p-1f, 0x1.3a00000000000p-1f,
    0x1.4133340000000p-1f, 0x1.4866680000000p-1f, 0x1.4f999a0000000p-1f, 0x1.56cccc0000000p-1f,
    0x1.5e00000000000p-1f, 0x1.6533340000000p-1f, 0x1.6c66680000000p-1f, 0x1.73999a0000000p-1f,
    0x1.7acccc0000000p-1f, 0x1.8200000000000p-1f, 0x1.8933340000000p-1f, 0x1.9066660000000p-1f,
    0x1.97999a0000000p-1f, 0x1.9ecccc0000000p-1f, 0x1.a600000000000p-1f, 0x1.ad33340000000p-1f,
    0x1.b466660000000p-1f, 0x1.bb999a0000000p-1f, 0x1.c2cccc0000000p-1f, 0x1.ca00000000000p-1f,
    0x1.d133340000000p-1f, 0x1.d866660000000p-1f, 0x1.df999a0000000p-1f, 0x1.e6cccc0000000p-1f,
    0x1.ee00000000000p-1f, 0x1.f533340000000p-1f, 0x1.fc66660000000p-1f, 0x1.0000000000000p+0f
};

struct Bounds {
  float nf4[15], fp4[15];
  Bounds() {
    for (int i = 0; i < 15; ++i) {
      nf4[i] = (kNF4[kNF4Order[i]] + kNF4[kNF4Order[i + 1]]) / 2;
      fp4[i] = (kFP4[kFP4Order[i]] + kFP4[kFP4Order[i + 1]]) / 2;
    }
  }
};
const Bounds& bounds() {
  static const Bounds b;
  return b;
}

// torch.bucketize(s, bounds, right=False): number of bounds strictly below s.
inline int bucket_ref(float s, const float* bnd) {
  int i = 0;
  while (i < 15 && bnd[i] < s) ++i;
  return i;
}

}  // namespace

const float* quant4_code(Quant4Type t) { return t == Quant4Type::NF4 ? kNF4 : kFP4; }
const float* quant4_bounds(Quant4Type t) {
  return t == Quant4Type::NF4 ? bounds().nf4 : bounds().fp4;
}
const uint8_t* quant4_order(Quant4Type t) { return t == Quant4Type::NF4 ? kNF4Order : kFP4Order; }
uint8_t quant4_zero_code(Quant4Type t) { return quant4_order(t)[7]; }
const float* dynamic_map_signed() { return kDynamicSigned; }

float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return f32_from_bits(sign | 0x7f800000u | (man << 13));  // inf / NaN
  if (exp != 0) return f32_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
  if (man == 0) return f32_from_bits(sign);
  int e = 113;  // subnormal: normalise the mantissa
  while ((man & 0x400u) == 0) { man <<= 1; --e; }
  return f32_from_bits(sign | (static_cast<uint32_t>(e) << 23) | ((man & 0x3ffu) << 13));
}

uint16_t float_to_fp16(float f) {
  const uint32_t u = bits_from_f32(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;  // NaN (as c10::Half)
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 (or inf) -> inf
  if (a >= 0x38800000u) {                        // normal half
    return sign | static_cast<uint16_t>((a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13);
  }
  if (a < 0x33000000u) return sign;  // below half of the smallest subnormal (ties -> even 0)
  const uint32_t exp = a >> 23, man = (a & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - exp;  // 14..24
  uint32_t r = man >> shift;
  const uint32_t rem = man & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (r & 1u))) ++r;
  return sign | static_cast<uint16_t>(r);
}

template <typename T>
void quantize_4bit_ref(const T* x, int64_t n, int64_t blocksize, Quant4Type type, uint8_t* packed,
                       float* absmax) {
  check_quant4_args(n, blocksize, x, packed, absmax);
  const float* bnd = quant4_bounds(type);
  const uint8_t* order = quant4_order(type);
  const int64_t nblocks = quant4_num_blocks(n, blocksize);
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t begin = b * blocksize, end = std::min(n, begin + blocksize);
    float am = 0.f;
    for (int64_t i = begin; i < end; ++i) am = nan_max(am, std::fabs(to_float(x[i])));
    const bool full = end - begin == blocksize;
    const float clamped = nan_max(am, 1e-38f);  // torch.clamp(min=1e-38); NaN stays NaN
    absmax[b] = full ? am : clamped;
    const float recip = 1.0f / clamped;
    for (int64_t i = begin; i < end; ++i) {
      float s = full ? to_float(x[i]) * recip : to_float(x[i]) / clamped;
      s = s < -1.f ? -1.f : (s > 1.f ? 1.f : s);
      const uint8_t q = order[bucket_ref(s, bnd)];
      if (i % 2 == 0) packed[i / 2] = static_cast<uint8_t>(q << 4);
      else packed[i / 2] = static_cast<uint8_t>(packed[i / 2] | q);
    }
  }
  if (n % 2) packed[n / 2] = static_cast<uint8_t>(packed[n / 2] | quant4_zero_code(type));
}

template <typename T>
void dequantize_4bit_ref(const uint8_t* packed, const Quant4Scales& scales, int64_t n,
                         int64_t blocksize, Quant4Type type, T* out) {
  detail::check_dequantize_args(packed, scales, n, blocksize, out);
  const float* code = quant4_code(type);
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t byte = packed[i / 2];
    const uint8_t q = (i % 2 == 0) ? (byte >> 4) : (byte & 0xf);
    out[i] = from_float<T>(code[q] * block_scale(scales, i / blocksize));
  }
}

float absmax_mean_ref(const float* absmax, int64_t nblocks) {
  QLORA_CHECK(nblocks > 0 && absmax, "quant4: absmax mean of an empty absmax");
  double lane[kMeanLanes] = {};
  for (int64_t i = 0; i < nblocks; ++i) lane[i % kMeanLanes] += static_cast<double>(absmax[i]);
  double total = 0.0;
  for (int64_t t = 0; t < kMeanLanes; ++t) total += lane[t];
  return static_cast<float>(total / static_cast<double>(nblocks));
}

void quantize_absmax_ref(const float* absmax, int64_t nblocks, float offset, const float* code,
                         uint8_t* absmax_q, float* nested_absmax) {
  detail::check_quantize_absmax_args(absmax, nblocks, code, absmax_q, nested_absmax);
  const int64_t nnested = quant4_num_blocks(nblocks, kNestedBlocksize);
  for (int64_t b = 0; b < nnested; ++b) {
    const int64_t begin = b * kNestedBlocksize, end = std::min(nblocks, begin + kNestedBlocksize);
    float am = 0.f;  // fmax: NaN ignored, as bnb's quantize_block
    for (int64_t i = begin; i < end; ++i) am = std::fmax(am, std::fabs(absmax[i] - offset));
    nested_absmax[b] = am;
    // bnb 0.50.2 libbitsandbytes_cpu quantize_cpu (cpu_ops.cpp quantize_cpu_impl +
    // build_quantize_lut): v = absmax - offset snapped to its LUT grid point (absmax_lut_point),
    // code = #(midpoints (c[j] + c[j+1]) * 0.5 < point), counted one by one. am == 0 or NaN v: 0.
    const float inv = 1.0f / am;
    for (int64_t i = begin; i < end; ++i) {
      int idx = 0;
      float val;
      if (am != 0.f && detail::absmax_lut_point(absmax[i] - offset, inv, &val))
        for (int j = 0; j < 255; ++j) idx += ((code[j] + code[j + 1]) * 0.5f < val) ? 1 : 0;
      absmax_q[i] = static_cast<uint8_t>(idx);
    }
  }
}

void dequantize_absmax_ref(const Quant4Scales& scales, int64_t nblocks, float* absmax) {
  for (int64_t b = 0; b < nblocks; ++b) absmax[b] = block_scale(scales, b);
}

#define QLORA_QUANT4_REF(T)                                                                   \
  template void quantize_4bit_ref<T>(const T*, int64_t, int64_t, Quant4Type, uint8_t*, float*); \
  template void dequantize_4bit_ref<T>(const uint8_t*, const Quant4Scales&, int64_t, int64_t,  \
                                       Quant4Type, T*);
QLORA_QUANT4_REF(float)
QLORA_QUANT4_REF(BF16Bits)
QLORA_QUANT4_REF(FP16Bits)
#undef QLORA_QUANT4_REF

}  // namespace qlora::kernels
