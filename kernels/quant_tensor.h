// kernels/quant_tensor.h — ATen glue for the 4-bit NF4/FP4 kernels: the quantized-weight type and
// quantize(). The format is bitsandbytes' (quant4.h, docs/quantization.md); tensors in, tensors out,
// on CPU (OpenMP path, kernels/quant4_cpu.cpp) or CUDA (kernels/quant4.cu). Like every kernel in
// kernels/, everything here that validates its input throws qlora::Error (common/error.h).
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/quant4.h"

namespace qlora {

/// A weight quantized blockwise to 4 bits, byte-compatible with bnb's quantize_4bit
/// (packed = bnb's uint8 output flattened; absmax / absmax_q, nested_absmax, nested_code, offset =
/// QuantState.absmax, state2.absmax, state2.code, offset).
struct QuantizedWeight {
  torch::Tensor packed;         // uint8 [ceil(numel/2)]; element 2k in the high nibble
  torch::Tensor absmax;         // float32 [nblocks] (undefined when double_quant)
  torch::Tensor absmax_q;       // uint8 [nblocks] (double quant)
  torch::Tensor nested_absmax;  // float32 [ceil(nblocks/256)] (double quant)
  torch::Tensor nested_code;    // float32 [256] signed dynamic map (double quant)
  float offset = 0.f;           // mean(absmax) (double quant)
  std::vector<int64_t> shape;   // original shape
  at::ScalarType dtype = at::kFloat;  // original dtype
  int64_t blocksize = 64;
  kernels::Quant4Type type = kernels::Quant4Type::NF4;
  bool double_quant = false;

  /// Dequantizes to a new tensor of `shape` and dtype `out` (float32, bfloat16 or float16) on
  /// packed's device: out = out_dtype(code[q] * absmax[block]) computed in float32. Throws
  /// qlora::Error for another dtype, for packed or a scale tensor of the wrong dtype, size,
  /// contiguity or device (named), or when a CUDA tensor is given and CUDA was not built.
  torch::Tensor dequantize(at::ScalarType out) const;
  /// All stored bytes: packed + absmax (or absmax_q + nested_absmax + nested_code + 4 for offset).
  int64_t bytes() const;
  /// Number of elements of the original tensor.
  int64_t numel() const;
  /// Copy with every tensor moved to `device`.
  QuantizedWeight to(const torch::Device& device) const;
};

/// Quantizes `w` (float32/bfloat16/float16, any shape and strides, CPU or CUDA; a non-contiguous
/// input is read through a contiguous copy) blockwise over its row-major flattening.
/// blocksize: power of two in 32..4096 (bnb's set). double_quant: bnb's compress_statistics.
/// Throws qlora::Error for a bad blocksize, an empty or undefined tensor, or an unsupported dtype
/// or device ("expected ..., got ...").
QuantizedWeight quantize(const torch::Tensor& w, kernels::Quant4Type type, int64_t blocksize = 64,
                         bool double_quant = true);

}  // namespace qlora
