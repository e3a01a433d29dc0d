// kernels/quant4.cuh — CUDA launchers for the 4-bit NF4/FP4 format (torch-free, see quant4.h).
// All pointers are device pointers; every launcher enqueues on `stream`, checks the launch with
// cudaGetLastError and throws qlora::Error naming the kernel on failure (and for a blocksize
// outside bnb's set, or an empty absmax for the mean), like every kernel in kernels/. Results are
// bit-identical to the *_ref functions in quant4.h (explicit __f*_rn intrinsics, no FMA
// contraction, no fast-math).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/quant4.h"

namespace qlora::kernels {

/// packed (ceil(n/2),) + scales -> out (n,). T: float, BF16Bits, FP16Bits. With double quant,
/// each thread decodes the absmax (nested_code[absmax_q[b]] * nested_absmax[b/256] + offset) of
/// each run of 8 elements it writes. One warp per 1024 elements in 4 passes of 8 elements per
/// lane: a coalesced 4-byte load and a 16-byte store per lane and pass when packed and out are
/// 16-byte aligned (a 512-byte contiguous store per warp); else, and for the last partial warp,
/// element by element. Launch geometry: ceil(n/32) threads, 256 per block; no shared memory but
/// the 16-entry code. Output bit-identical to dequantize_4bit_ref (tests/kernels).
template <typename T>
void dequantize_4bit_cuda(const uint8_t* packed, const Quant4Scales& scales, int64_t n,
                          int64_t blocksize, Quant4Type type, T* out, cudaStream_t stream);

/// x (n,) -> packed (ceil(n/2),) uint8 and absmax (ceil(n/bs),) float32, one warp per block.
template <typename T>
void quantize_4bit_cuda(const T* x, int64_t n, int64_t blocksize, Quant4Type type,
                        uint8_t* packed, float* absmax, cudaStream_t stream);

/// offset_out (1,) = absmax_mean_ref(absmax (nblocks,)) — same summation order, one CTA.
void absmax_mean_cuda(const float* absmax, int64_t nblocks, float* offset_out,
                      cudaStream_t stream);

/// Double quant: absmax (nblocks,), offset (1,) on device, code (256,) ->
/// absmax_q (nblocks,) uint8, nested_absmax (ceil(nblocks/256),) float32. One warp per 256.
void quantize_absmax_cuda(const float* absmax, int64_t nblocks, const float* offset,
                          const float* code, uint8_t* absmax_q, float* nested_absmax,
                          cudaStream_t stream);

}  // namespace qlora::kernels
