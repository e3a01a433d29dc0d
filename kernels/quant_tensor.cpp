// kernels/quant_tensor.cpp — tensors <-> the raw-pointer kernels of quant4.h / quant4.cuh.
#include "kernels/quant_tensor.h"

#include "common/error.h"
#include "kernels/quant4.h"

#if QLORA_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/quant4.cuh"
#endif

namespace qlora {
namespace {

namespace k = qlora::kernels;

void check_float_dtype(at::ScalarType t, const char* what) {
  QLORA_CHECK(t == at::kFloat || t == at::kBFloat16 || t == at::kHalf, what,
              ": expected dtype float32, bfloat16 or float16, got ", t);
}

void check_device(const torch::Device& d, const char* what) {
  QLORA_CHECK(d.is_cpu() || d.is_cuda(), what, ": expected a CPU or CUDA tensor, got device ", d);
#if !QLORA_WITH_CUDA
  QLORA_CHECK(!d.is_cuda(), what, ": expected a CPU tensor, got ", d,
              " (qlora-cpp was built without CUDA kernels)");
#endif
}

// Calls f(ptr) with the data pointer reinterpreted as the torch-free element type.
template <typename F>
void dispatch_float(const torch::Tensor& t, F&& f) {
  switch (t.scalar_type()) {
    case at::kFloat: f(t.data_ptr<float>()); break;
    case at::kBFloat16: f(reinterpret_cast<k::BF16Bits*>(t.data_ptr<at::BFloat16>())); break;
    case at::kHalf: f(reinterpret_cast<k::FP16Bits*>(t.data_ptr<at::Half>())); break;
    default: fail("quant4: unsupported dtype ", t.scalar_type());
  }
}

k::Quant4Scales scales_of(const QuantizedWeight& q) {
  k::Quant4Scales s;
  if (q.double_quant) {
    s.absmax_q = q.absmax_q.data_ptr<uint8_t>();
    s.nested_absmax = q.nested_absmax.data_ptr<float>();
    s.nested_code = q.nested_code.data_ptr<float>();
    s.offset = q.offset;
  } else {
    s.absmax = q.absmax.data_ptr<float>();
  }
  return s;
}

}  // namespace

QuantizedWeight quantize(const torch::Tensor& w_in, k::Quant4Type type, int64_t blocksize,
                         bool double_quant) {
  QLORA_CHECK(w_in.defined(), "quantize: expected a defined tensor, got an undefined one");
  check_float_dtype(w_in.scalar_type(), "quantize");
  check_device(w_in.device(), "quantize");
  QLORA_CHECK(k::quant4_valid_blocksize(blocksize),
              "quantize: blocksize must be a power of two in 32..4096 (bitsandbytes), got ",
              blocksize);
  QLORA_CHECK(w_in.numel() > 0, "quantize: expected a non-empty tensor, got shape ",
              w_in.sizes());
  const torch::Tensor w = w_in.contiguous();
  const int64_t n = w.numel(), nblocks = k::quant4_num_blocks(n, blocksize);
  const auto u8 = torch::TensorOptions().dtype(torch::kUInt8).device(w.device());
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat).device(w.device());

  QuantizedWeight q;
  q.shape = w.sizes().vec();
  q.dtype = w.scalar_type();
  q.blocksize = blocksize;
  q.type = type;
  q.double_quant = double_quant;
  q.packed = torch::empty({k::quant4_packed_bytes(n)}, u8);
  torch::Tensor absmax = torch::empty({nblocks}, f32);

  if (w.is_cuda()) {
#if QLORA_WITH_CUDA
    const c10::cuda::CUDAGuard guard(w.device());
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream(w.device().index()).stream();
    dispatch_float(w, [&](auto* x) {
      k::quantize_4bit_cuda(x, n, blocksize, type, q.packed.data_ptr<uint8_t>(),
                            absmax.data_ptr<float>(), stream);
    });
    if (double_quant) {
      torch::Tensor offset = torch::empty({1}, f32);
      q.nested_code = torch::from_blob(const_cast<float*>(k::dynamic_map_signed()), {256},
                                       torch::kFloat).to(w.device());
      q.absmax_q = torch::empty({nblocks}, u8);
      q.nested_absmax = torch::empty({k::quant4_num_blocks(nblocks, k::kNestedBlocksize)}, f32);
      k::absmax_mean_cuda(absmax.data_ptr<float>(), nblocks, offset.data_ptr<float>(), stream);
      k::quantize_absmax_cuda(absmax.data_ptr<float>(), nblocks, offset.data_ptr<float>(),
                              q.nested_code.data_ptr<float>(),
                              q.absmax_q.data_ptr<uint8_t>(),
                              q.nested_absmax.data_ptr<float>(), stream);
      q.offset = offset.item<float>();  // synchronises the stream
    } else {
      q.absmax = absmax;
    }
#endif
    return q;
  }

  dispatch_float(w, [&](const auto* x) {
    k::quantize_4bit_cpu(x, n, blocksize, type, q.packed.data_ptr<uint8_t>(), absmax.data_ptr<float>());
  });
  if (double_quant) {
    q.offset = k::absmax_mean_ref(absmax.data_ptr<float>(), nblocks);
    q.nested_code = torch::from_blob(const_cast<float*>(k::dynamic_map_signed()), {256},
                                     torch::kFloat).clone();
    q.absmax_q = torch::empty({nblocks}, u8);
    q.nested_absmax = torch::empty({k::quant4_num_blocks(nblocks, k::kNestedBlocksize)}, f32);
    k::quantize_absmax_cpu(absmax.data_ptr<float>(), nblocks, q.offset,
                           q.nested_code.data_ptr<float>(), q.absmax_q.data_ptr<uint8_t>(),
                           q.nested_absmax.data_ptr<float>());
  } else {
    q.absmax = absmax;
  }
  return q;
}

torch::Tensor QuantizedWeight::dequantize(at::ScalarType out_dtype) const {
  QLORA_CHECK(packed.defined(), "dequantize: expected a quantized weight, got an empty one");
  check_float_dtype(out_dtype, "dequantize");
  check_device(packed.device(), "dequantize");
  const int64_t n = numel();
  QLORA_CHECK(packed.scalar_type() == torch::kUInt8 && packed.is_contiguous() &&
                  packed.numel() == kernels::quant4_packed_bytes(n),
              "dequantize: expected packed uint8 contiguous [", kernels::quant4_packed_bytes(n),
              "], got ", packed.scalar_type(), " ", packed.sizes());
  const int64_t nblocks = kernels::quant4_num_blocks(n, blocksize);
  // Every scale tensor must live where packed lives: the kernel reads all of them through raw
  // pointers, and a host pointer reaching a CUDA kernel is a sticky illegal-address fault that
  // poisons the whole CUDA context (issue 15). Checked before any launch, with the tensor named.
  auto check_scale = [&](const torch::Tensor& t, const char* name, at::ScalarType dt, int64_t want) {
    QLORA_CHECK(t.defined(), "dequantize: ", name, " is missing (expected ", dt, " [", want, "])");
    QLORA_CHECK(t.device() == packed.device(), "dequantize: ", name, " is on ", t.device(),
                " but packed is on ", packed.device(), " (move the whole QuantizedWeight with .to(device))");
    QLORA_CHECK(t.scalar_type() == dt && t.numel() == want && t.is_contiguous(), "dequantize: expected ", name,
                " ", dt, " contiguous [", want, "], got ", t.scalar_type(), " ", t.sizes(),
                t.is_contiguous() ? "" : " (not contiguous)");
  };
  if (double_quant) {
    check_scale(absmax_q, "absmax_q", torch::kUInt8, nblocks);
    check_scale(nested_absmax, "nested_absmax", torch::kFloat,
                kernels::quant4_num_blocks(nblocks, kernels::kNestedBlocksize));
    check_scale(nested_code, "nested_code", torch::kFloat, 256);
  } else {
    check_scale(absmax, "absmax", torch::kFloat, nblocks);
  }
  torch::Tensor out = torch::empty(shape, torch::TensorOptions().dtype(out_dtype).device(packed.device()));
  const kernels::Quant4Scales sc = scales_of(*this);
  if (packed.is_cuda()) {
#if QLORA_WITH_CUDA
    const c10::cuda::CUDAGuard guard(packed.device());
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream(packed.device().index()).stream();
    dispatch_float(out, [&](auto* o) {
      kernels::dequantize_4bit_cuda(packed.data_ptr<uint8_t>(), sc, n, blocksize, type, o, stream);
    });
#endif
    return out;
  }
  dispatch_float(out, [&](auto* o) {
    kernels::dequantize_4bit_cpu(packed.data_ptr<uint8_t>(), sc, n, blocksize, type, o);
  });
  return out;
}

int64_t QuantizedWeight::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t QuantizedWeight::bytes() const {
  auto nb = [](const torch::Tensor& t) { return t.defined() ? t.numel() * t.element_size() : 0; };
  int64_t total = nb(packed);
  if (double_quant) total += nb(absmax_q) + nb(nested_absmax) + nb(nested_code) + sizeof(float);
  else total += nb(absmax);
  return total;
}

QuantizedWeight QuantizedWeight::to(const torch::Device& device) const {
  QuantizedWeight q = *this;
  auto mv = [&](torch::Tensor& t) { if (t.defined()) t = t.to(device); };
  mv(q.packed); mv(q.absmax); mv(q.absmax_q); mv(q.nested_absmax); mv(q.nested_code);
  return q;
}

}  // namespace qlora
