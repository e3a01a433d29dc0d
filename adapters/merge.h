// qlora-cpp: merging a LoRA adapter into its base model (`qlora merge`), as PEFT's
// merge_and_unload: W' = W + s·B·A for every adapted linear, then a plain HF model directory that
// transformers (and LlamaModel::load) reads with no PEFT and no bitsandbytes.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "adapters/peft.h"

namespace qlora {

/// W + s·B·A computed in fp32 and cast to `out`. w [out_f, in_f] any float dtype, any device;
/// a [r, in_f], b [out_f, r] (any float dtype, cast to fp32 on w's device); s = the adapter's
/// scale (alpha/r or alpha/√r). Throws qlora::Error naming `module` on a shape mismatch.
torch::Tensor merge_lora_weight(const torch::Tensor& w, const torch::Tensor& a, const torch::Tensor& b, double s,
                                torch::Dtype out, const std::string& module);

/// Groups named tensors into shards of at most `max_shard_bytes` bytes each (greedy, in order; a
/// tensor bigger than the limit gets a shard of its own, as transformers' shard_checkpoint).
/// Returns the index ranges [begin, end) of each shard. max_shard_bytes > 0.
std::vector<std::pair<size_t, size_t>> plan_shards(const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                                                   int64_t max_shard_bytes);

}  // namespace qlora
