// qlora-cpp: safetensors entries as torch tensors, and torch tensors written as safetensors.
#pragma once
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "common/safetensors.h"

namespace qlora {

/// torch dtype of a safetensors dtype (BOOL→kBool, U8→kByte, ..., BF16→kBFloat16).
at::ScalarType to_torch_dtype(st::DType d);
/// safetensors dtype of a torch dtype. Throws qlora::Error for a dtype the format lacks.
st::DType to_st_dtype(at::ScalarType t);

/// The tensor `t` of `file` as a CPU tensor of its stored dtype and shape. Zero-copy (a view of
/// the private mapping, which it keeps alive) when the data is aligned to the element size;
/// otherwise a copy. Writing into a view never changes the file.
torch::Tensor load_tensor(const st::SafetensorsFile& file, const st::TensorInfo& t);

/// load_tensor by name from a (possibly sharded) checkpoint. Throws qlora::Error when absent.
torch::Tensor load_tensor(const st::SafetensorsCheckpoint& ckpt, const std::string& name);

/// Writes named tensors (any device, any layout: copied to contiguous CPU first) atomically as
/// one .safetensors file, in the order given. Throws qlora::Error (see st::write_safetensors).
void save_tensors(const std::string& path,
                  const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                  const std::map<std::string, std::string>& metadata = {});

}  // namespace qlora
