#include "adapters/merge.h"

#include "common/error.h"

namespace qlora {

torch::Tensor merge_lora_weight(const torch::Tensor& w, const torch::Tensor& a, const torch::Tensor& b, double s,
                                torch::Dtype out, const std::string& module) {
  QLORA_CHECK(w.dim() == 2 && a.dim() == 2 && b.dim() == 2 && a.size(1) == w.size(1) && b.size(0) == w.size(0) &&
                  b.size(1) == a.size(0),
              "merge: module '", module, "': weight ", w.sizes(), " does not fit lora_A ", a.sizes(), " / lora_B ",
              b.sizes());
  const torch::Tensor a32 = a.to(w.device(), torch::kFloat32), b32 = b.to(w.device(), torch::kFloat32);
  return torch::addmm(w.to(torch::kFloat32), b32, a32, /*beta=*/1.0, /*alpha=*/s).to(out);
}

std::vector<std::pair<size_t, size_t>> plan_shards(const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                                                   int64_t max_shard_bytes) {
  QLORA_CHECK(max_shard_bytes > 0, "merge: --max-shard-bytes must be > 0, got ", max_shard_bytes);
  std::vector<std::pair<size_t, size_t>> shards;
  size_t begin = 0;
  int64_t bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int64_t n = tensors[i].second.nbytes();
    if (i > begin && bytes + n > max_shard_bytes) {
      shards.push_back({begin, i});
      begin = i;
      bytes = 0;
    }
    bytes += n;
  }
  if (begin < tensors.size()) shards.push_back({begin, tensors.size()});
  return shards;
}

}  // namespace qlora
