// kernels/quant4.cu — CUDA kernels for the 4-bit NF4/FP4 format (see quant4.cuh / quant4.h).
// Naming: device functions d_*, kernels k_*, launchers *_cuda (named as quant4.h's *_ref / *_cpu).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/error.h"
#include "kernels/quant4.cuh"

namespace qlora::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kElemsPerThread = 32;  // dequantize: 4 passes of 8 elements (4 packed bytes) per thread

void check_launch(const char* kernel) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    fail("quant4: CUDA kernel ", kernel, " failed: ", cudaGetErrorString(e));
}

void check_blocksize(int64_t blocksize) {
  if (!quant4_valid_blocksize(blocksize))
    fail("quant4: expected blocksize a power of two in 32..4096, got ", blocksize);
}

struct Code4 {
  float code[16];
  float bounds[15];
  uint8_t order[16];
};
Code4 make_code4(Quant4Type t) {
  Code4 c;
  for (int i = 0; i < 16; ++i) c.code[i] = quant4_code(t)[i], c.order[i] = quant4_order(t)[i];
  for (int i = 0; i < 15; ++i) c.bounds[i] = quant4_bounds(t)[i];
  return c;
}

// ---- conversions, bit-identical to quant4.h's from_float<T> ----
template <typename T> struct DevType;
template <> struct DevType<float> {
  __device__ static float load(const float* p) { return *p; }
  __device__ static float from(float v) { return v; }
};
template <> struct DevType<BF16Bits> {
  __device__ static float load(const BF16Bits* p) {
    return __uint_as_float(static_cast<uint32_t>(p->bits) << 16);
  }
  __device__ static BF16Bits from(float v) {
    uint32_t u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) return BF16Bits{0x7fc0};
    u += 0x7fffu + ((u >> 16) & 1u);
    return BF16Bits{static_cast<uint16_t>(u >> 16)};
  }
};
template <> struct DevType<FP16Bits> {
  __device__ static float load(const FP16Bits* p) {
    return __half2float(__ushort_as_half(p->bits));
  }
  __device__ static FP16Bits from(float v) {
    if (isnan(v)) return FP16Bits{static_cast<uint16_t>((__float_as_uint(v) >> 16 & 0x8000u) | 0x7e00u)};
    return FP16Bits{__half_as_ushort(__float2half_rn(v))};
  }
};

__device__ __forceinline__ float d_nan_max(float a, float b) { return (isnan(a) || a > b) ? a : b; }

__device__ __forceinline__ float d_block_scale(const Quant4Scales& sc, int64_t b) {
  if (sc.absmax != nullptr) return __ldg(sc.absmax + b);
  const float c = __ldg(sc.nested_code + __ldg(sc.absmax_q + b));
  return __fadd_rn(__fmul_rn(c, __ldg(sc.nested_absmax + b / kNestedBlocksize)), sc.offset);
}

// Stores 8 consecutive outputs (one 16-byte store for 16-bit types, two for float).
template <typename T>
__device__ __forceinline__ void d_store8(T* dst, const T (&v)[8]) {
  if constexpr (sizeof(T) == 2) {
    uint4 w;
    uint16_t tmp[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) tmp[k] = reinterpret_cast<const uint16_t&>(v[k]);
    w.x = tmp[0] | (uint32_t(tmp[1]) << 16);
    w.y = tmp[2] | (uint32_t(tmp[3]) << 16);
    w.z = tmp[4] | (uint32_t(tmp[5]) << 16);
    w.w = tmp[6] | (uint32_t(tmp[7]) << 16);
    *reinterpret_cast<uint4*>(dst) = w;
  } else {
    const float* f = reinterpret_cast<const float*>(v);
    reinterpret_cast<float4*>(dst)[0] = make_float4(f[0], f[1], f[2], f[3]);
    reinterpret_cast<float4*>(dst)[1] = make_float4(f[4], f[5], f[6], f[7]);
  }
}

// ---- dequantize: one warp per 1024 elements (512 packed bytes), 32 per thread ----
// Lane l of warp w handles, in pass p = 0..3, the 8 elements w*1024 + p*256 + l*8 .. +7 (4 packed
// bytes): each pass is one 128-byte coalesced load and one 512-byte contiguous store per warp (16
// bytes per lane). The first H200 run (2026-12-04) measured the former layout, one thread per 32
// consecutive elements (16-byte stores at a 64-byte stride: every 32-byte sector half-written per
// instruction), at 0.45 of a D2D memcpy's bandwidth (docs/performance.md).
constexpr int kPasses = kElemsPerThread / 8;          // 4
constexpr int kWarpElems = 32 * kElemsPerThread;      // 1024
template <typename T>
__global__ void k_dequantize_4bit(const uint8_t* __restrict__ packed,  // (ceil(n/2),)
                                  Quant4Scales scales,                   // per-block scales
                                  Code4 c4, int64_t n, int log2_blocksize, bool aligned,
                                  T* __restrict__ out) {                 // (n,)
  __shared__ float code[16];
  if (threadIdx.x < 16) code[threadIdx.x] = c4.code[threadIdx.x];
  __syncthreads();
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t wb = (thread / 32) * kWarpElems;  // the warp's first element
  const int lane = static_cast<int>(thread % 32);
  if (wb >= n) return;
  if (aligned && wb + kWarpElems <= n) {
    uint32_t words[kPasses];
#pragma unroll
    for (int p = 0; p < kPasses; ++p)
      words[p] = __ldg(reinterpret_cast<const uint32_t*>(packed + (wb + p * 256 + lane * 8) / 2));
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const int64_t e = wb + p * 256 + lane * 8;
      const float scale = d_block_scale(scales, e >> log2_blocksize);  // 8 | 32 | blocksize
      T v[8];
#pragma unroll
      for (int byte = 0; byte < 4; ++byte) {
        const uint32_t b = (words[p] >> (8 * byte)) & 0xffu;
        v[2 * byte] = DevType<T>::from(__fmul_rn(code[b >> 4], scale));
        v[2 * byte + 1] = DevType<T>::from(__fmul_rn(code[b & 0xfu], scale));
      }
      d_store8(out + e, v);
    }
  } else {
    for (int p = 0; p < kPasses; ++p) {
      const int64_t e0 = wb + p * 256 + lane * 8;
      const int64_t end = min(n, e0 + 8);
      for (int64_t i = e0; i < end; ++i) {
        const uint8_t b = packed[i / 2];
        const uint8_t q = (i % 2 == 0) ? (b >> 4) : (b & 0xf);
        out[i] = DevType<T>::from(__fmul_rn(code[q], d_block_scale(scales, i >> log2_blocksize)));
      }
    }
  }
}

// ---- quantize: one warp per block ----
template <typename T>
__global__ void k_quantize_4bit(const T* __restrict__ x,        // (n,)
                                int64_t n, int64_t blocksize, Code4 c4,
                                uint8_t* __restrict__ packed,   // (ceil(n/2),)
                                float* __restrict__ absmax) {   // (nblocks,)
  const int lane = threadIdx.x & 31;
  const int64_t b = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t nblocks = (n + blocksize - 1) / blocksize;
  if (b >= nblocks) return;  // whole warp leaves together
  const int64_t begin = b * blocksize;
  const int64_t len = min(blocksize, n - begin);
  float am = 0.f;
  for (int64_t i = lane; i < len; i += 32) am = d_nan_max(am, fabsf(DevType<T>::load(x + begin + i)));
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) am = d_nan_max(am, __shfl_xor_sync(0xffffffffu, am, off));
  const bool full = len == blocksize;
  const float clamped = d_nan_max(am, 1e-38f);
  if (lane == 0) absmax[b] = full ? am : clamped;
  const float recip = __fdiv_rn(1.0f, clamped);
  const int64_t pairs = (len + 1) / 2;
  for (int64_t j = lane; j < pairs; j += 32) {
    uint8_t q[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int64_t i = 2 * j + k;
      if (i >= len) { q[k] = c4.order[7]; break; }
      const float v = DevType<T>::load(x + begin + i);
      float s = full ? __fmul_rn(v, recip) : __fdiv_rn(v, clamped);
      s = s < -1.f ? -1.f : (s > 1.f ? 1.f : s);
      int idx = 0;
#pragma unroll
      for (int t = 0; t < 15; ++t) idx += c4.bounds[t] < s;
      q[k] = c4.order[idx];
    }
    packed[begin / 2 + j] = static_cast<uint8_t>((q[0] << 4) | q[1]);
  }
}

// ---- mean(absmax): 1024 strided double sums, then thread 0 sums them in order ----
__global__ void k_absmax_mean(const float* __restrict__ absmax,  // (nblocks,)
                              int64_t nblocks, float* __restrict__ offset_out) {  // (1,)
  __shared__ double lane_sum[kMeanLanes];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < nblocks; i += kMeanLanes) s = __dadd_rn(s, (double)absmax[i]);
  lane_sum[threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int t = 0; t < kMeanLanes; ++t) total = __dadd_rn(total, lane_sum[t]);
    *offset_out = __double2float_rn(__ddiv_rn(total, (double)nblocks));
  }
}

// ---- double quant of absmax: one warp per 256 values ----
__global__ void k_quantize_absmax(const float* __restrict__ absmax,  // (nblocks,)
                                  int64_t nblocks, const float* __restrict__ offset_ptr,  // (1,)
                                  const float* __restrict__ code_in,  // (256,)
                                  uint8_t* __restrict__ absmax_q,     // (nblocks,)
                                  float* __restrict__ nested_absmax) {  // (ceil(nblocks/256),)
  __shared__ float mid[255];  // float32 midpoints of the ascending code (bnb build_quantize_lut)
  for (int i = threadIdx.x; i < 255; i += blockDim.x)
    mid[i] = __fmul_rn(__fadd_rn(code_in[i], code_in[i + 1]), 0.5f);
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const int64_t b = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (b * kNestedBlocksize >= nblocks) return;
  const float offset = *offset_ptr;
  const int64_t begin = b * kNestedBlocksize;
  const int64_t len = min(kNestedBlocksize, nblocks - begin);
  float am = 0.f;
  for (int64_t i = lane; i < len; i += 32) am = fmaxf(am, fabsf(__fsub_rn(absmax[begin + i], offset)));
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, off));
  if (lane == 0) nested_absmax[b] = am;
  const float inv = __fdiv_rn(1.0f, am);
  for (int64_t i = lane; i < len; i += 32) {
    // bnb 0.50.2 native CPU quantize_blockwise (65536-bin LUT), as quantize_absmax_ref.
    int lo = 0;
    if (am != 0.f) {
      float sv = __fmul_rn(__fsub_rn(absmax[begin + i], offset), inv);
      if (sv < -1.f) sv = -1.f;
      else if (sv > 1.f) sv = 1.f;
      const float r = __fmaf_rn(__fmul_rn(__fadd_rn(sv, 1.0f), 0.5f), 65535.0f, 0.5f);
      if (r >= 0.f) {  // false for NaN -> code 0
        const int k = static_cast<int>(r) & 0xffff;
        const float val = __fsub_rn(__fdiv_rn(__fmul_rn(2.0f, static_cast<float>(k)), 65535.0f), 1.0f);
        int hi = 255;  // lower_bound: first j with mid[j] >= val
        while (lo < hi) {
          const int m = (lo + hi) >> 1;
          if (mid[m] < val) lo = m + 1; else hi = m;
        }
      }
    }
    absmax_q[begin + i] = static_cast<uint8_t>(lo);
  }
}

int log2_exact(int64_t v) {
  int l = 0;
  while ((int64_t{1} << l) < v) ++l;
  return l;
}

}  // namespace

template <typename T>
void dequantize_4bit_cuda(const uint8_t* packed, const Quant4Scales& scales, int64_t n,
                          int64_t blocksize, Quant4Type type, T* out, cudaStream_t stream) {
  check_blocksize(blocksize);
  if (n == 0) return;
  const bool aligned = reinterpret_cast<uintptr_t>(packed) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(out) % 16 == 0;
  const int64_t chunks = (n + kElemsPerThread - 1) / kElemsPerThread;
  const int64_t grid = (chunks + kThreads - 1) / kThreads;
  k_dequantize_4bit<T><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(
      packed, scales, make_code4(type), n, log2_exact(blocksize), aligned, out);
  check_launch("k_dequantize_4bit");
}

template <typename T>
void quantize_4bit_cuda(const T* x, int64_t n, int64_t blocksize, Quant4Type type,
                        uint8_t* packed, float* absmax, cudaStream_t stream) {
  check_blocksize(blocksize);
  if (n == 0) return;
  const int64_t warps = quant4_num_blocks(n, blocksize);
  const int64_t grid = (warps * 32 + kThreads - 1) / kThreads;
  k_quantize_4bit<T><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(
      x, n, blocksize, make_code4(type), packed, absmax);
  check_launch("k_quantize_4bit");
}

void absmax_mean_cuda(const float* absmax, int64_t nblocks, float* offset_out,
                      cudaStream_t stream) {
  QLORA_CHECK(nblocks > 0, "quant4: absmax mean of an empty absmax");
  k_absmax_mean<<<1, kMeanLanes, 0, stream>>>(absmax, nblocks, offset_out);
  check_launch("k_absmax_mean");
}

void quantize_absmax_cuda(const float* absmax, int64_t nblocks, const float* offset,
                          const float* code, uint8_t* absmax_q, float* nested_absmax,
                          cudaStream_t stream) {
  if (nblocks == 0) return;
  const int64_t warps = quant4_num_blocks(nblocks, kNestedBlocksize);
  const int64_t grid = (warps * 32 + kThreads - 1) / kThreads;
  k_quantize_absmax<<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(
      absmax, nblocks, offset, code, absmax_q, nested_absmax);
  check_launch("k_quantize_absmax");
}

#define QLORA_QUANT4_CUDA(T)                                                                     \
  template void dequantize_4bit_cuda<T>(const uint8_t*, const Quant4Scales&, int64_t, int64_t, \
                                        Quant4Type, T*, cudaStream_t);                           \
  template void quantize_4bit_cuda<T>(const T*, int64_t, int64_t, Quant4Type, uint8_t*, float*, \
                                      cudaStream_t);
QLORA_QUANT4_CUDA(float)
QLORA_QUANT4_CUDA(BF16Bits)
QLORA_QUANT4_CUDA(FP16Bits)
#undef QLORA_QUANT4_CUDA

}  // namespace qlora::kernels
