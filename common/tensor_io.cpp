#include "common/tensor_io.h"

#include <cstring>

#include "common/error.h"

namespace qlora {

at::ScalarType to_torch_dtype(st::DType d) {
  switch (d) {
    case st::DType::BOOL: return at::kBool;
    case st::DType::U8: return at::kByte;
    case st::DType::I8: return at::kChar;
    case st::DType::I16: return at::kShort;
    case st::DType::I32: return at::kInt;
    case st::DType::I64: return at::kLong;
    case st::DType::F16: return at::kHalf;
    case st::DType::BF16: return at::kBFloat16;
    case st::DType::F32: return at::kFloat;
    case st::DType::F64: return at::kDouble;
  }
  fail("unknown safetensors dtype");
}

st::DType to_st_dtype(at::ScalarType t) {
  switch (t) {
    case at::kBool: return st::DType::BOOL;
    case at::kByte: return st::DType::U8;
    case at::kChar: return st::DType::I8;
    case at::kShort: return st::DType::I16;
    case at::kInt: return st::DType::I32;
    case at::kLong: return st::DType::I64;
    case at::kHalf: return st::DType::F16;
    case at::kBFloat16: return st::DType::BF16;
    case at::kFloat: return st::DType::F32;
    case at::kDouble: return st::DType::F64;
    default: fail("dtype ", c10::toString(t), " cannot be stored in safetensors");
  }
}

torch::Tensor load_tensor(const st::SafetensorsFile& file, const st::TensorInfo& t) {
  const auto dtype = to_torch_dtype(t.dtype);
  const uint8_t* p = file.data(t);
  auto opts = torch::TensorOptions().dtype(dtype).device(torch::kCPU);
  if (t.numel() == 0) return torch::empty(t.shape, opts);
  if (reinterpret_cast<uintptr_t>(p) % st::dtype_size(t.dtype) == 0) {
    auto keep = file.mapping();
    return torch::from_blob(const_cast<uint8_t*>(p), t.shape, [keep](void*) {}, opts);
  }
  torch::Tensor out = torch::empty(t.shape, opts);
  std::memcpy(out.data_ptr(), p, t.nbytes());
  return out;
}

torch::Tensor load_tensor(const st::SafetensorsCheckpoint& ckpt, const std::string& name) {
  const st::SafetensorsFile& f = ckpt.file_of(name);
  return load_tensor(f, f.info(name));
}

void save_tensors(const std::string& path,
                  const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                  const std::map<std::string, std::string>& metadata) {
  std::vector<torch::Tensor> keep;
  std::vector<st::TensorToWrite> out;
  keep.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    torch::Tensor c = t.detach().to(torch::kCPU).contiguous();
    keep.push_back(c);
    st::TensorToWrite w;
    w.name = name;
    w.dtype = to_st_dtype(c.scalar_type());
    w.shape = c.sizes().vec();
    w.data = c.data_ptr();
    w.nbytes = c.nbytes();
    out.push_back(std::move(w));
  }
  st::write_safetensors(path, out, metadata);
}

}  // namespace qlora
