// qlora-cpp: measured memory, as users see it: process RSS and its peak (/proc/self/status
// VmRSS, VmHWM) and, on CUDA, the caching allocator's current and peak allocated and reserved bytes
// (they differ: reserved includes cached free blocks; nvidia-smi shows reserved + CUDA context).
#pragma once
#include <torch/torch.h>

#include <nlohmann/json.hpp>
#include <string>

namespace qlora {

/// {"rss_bytes", "peak_rss_bytes"} and, for a CUDA device, {"cuda_allocated_bytes",
/// "cuda_peak_allocated_bytes", "cuda_reserved_bytes", "cuda_peak_reserved_bytes"}. Bytes.
nlohmann::json memory_snapshot(const torch::Device& device);

/// Resets the peaks memory_snapshot reports: CUDA's caching-allocator peak stats (after emptying
/// its cache, so reserved starts from what is allocated) and, on Linux, VmHWM (write "5" to
/// /proc/self/clear_refs). Best effort: a failed CPU reset leaves VmHWM as it was.
void reset_peak_memory(const torch::Device& device);

/// Total memory of a CUDA device in bytes (cudaDeviceProp::totalGlobalMem); 0 when unknown or not CUDA.
int64_t cuda_total_memory(const torch::Device& device);

/// The CUDA device's name ("NVIDIA H200"), "cpu" for the CPU, "" when unknown.
std::string device_name(const torch::Device& device);

}  // namespace qlora
