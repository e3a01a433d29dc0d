// qlora-cpp: measured memory, as users see it: process RSS and its peak (/proc/self/status
// VmRSS, VmHWM) and, on CUDA, the caching allocator's current and peak allocated and reserved bytes
// (they differ: reserved includes cached free blocks; nvidia-smi shows reserved + CUDA context).
#pragma once
#include <torch/torch.h>

#include <nlohmann/json.hpp>

namespace qlora {

/// {"rss_bytes", "peak_rss_bytes"} and, for a CUDA device, {"cuda_allocated_bytes",
/// "cuda_peak_allocated_bytes", "cuda_reserved_bytes", "cuda_peak_reserved_bytes"}. Bytes.
nlohmann::json memory_snapshot(const torch::Device& device);

}  // namespace qlora
