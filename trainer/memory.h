// qlora-cpp: measured memory, as users see it: process RSS and its peak (/proc/self/status
// VmRSS, VmHWM) and, on CUDA, the caching allocator's current and peak allocated and reserved bytes
// (they differ: reserved includes cached free blocks; nvidia-smi shows reserved + CUDA context).
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace qlora {

/// The caching allocator's counters for one CUDA device, bytes.
struct CudaAllocatorStats {
  int64_t allocated = 0, peak_allocated = 0, reserved = 0, peak_reserved = 0;
};

/// The CUDA operations memory_snapshot / reset_peak_memory perform, in the order they must run:
/// `init_device` first (CUDA's lazy initialisation creates the caching allocator's per-device state;
/// before it, getDeviceStats / resetPeakStats throw "Invalid device argument 0: did you call init?"),
/// then `initialized` must hold, then the stats calls. Replaceable so that the order is tested
/// without a GPU (tests/gpu).
struct CudaAllocatorOps {
  std::function<void(int)> init_device;           ///< initialise CUDA for the device index
  std::function<bool()> initialized;              ///< the caching allocator is initialised
  std::function<CudaAllocatorStats(int)> stats;   ///< aggregate counters of the device
  std::function<void(int)> reset_peak;            ///< reset the peak counters of the device
  std::function<void()> empty_cache;              ///< release cached free blocks
};

/// The real operations: at::globalContext().lazyInitDevice(kCUDA) (what torch.cuda's _lazy_init
/// does), CUDACachingAllocator::get()->initialized(), getDeviceStats, resetPeakStats, emptyCache.
/// In a build without the c10 CUDA headers every operation throws qlora::Error.
const CudaAllocatorOps& torch_cuda_allocator_ops();

/// {"rss_bytes", "peak_rss_bytes"} and, for a CUDA device, {"cuda_allocated_bytes",
/// "cuda_peak_allocated_bytes", "cuda_reserved_bytes", "cuda_peak_reserved_bytes"}. Bytes.
/// For a CUDA device it initialises CUDA first (safe to call before any tensor was placed there);
/// throws qlora::Error when the allocator is still not initialised afterwards.
nlohmann::json memory_snapshot(const torch::Device& device);
nlohmann::json memory_snapshot(const torch::Device& device, const CudaAllocatorOps& ops);

/// Resets the peaks memory_snapshot reports: CUDA's caching-allocator peak stats (after emptying
/// its cache, so reserved starts from what is allocated; CUDA is initialised first, as above) and,
/// on Linux, VmHWM (write "5" to /proc/self/clear_refs). Best effort on the CPU side: a failed reset
/// leaves VmHWM as it was. Throws qlora::Error as memory_snapshot.
void reset_peak_memory(const torch::Device& device);
void reset_peak_memory(const torch::Device& device, const CudaAllocatorOps& ops);

/// Total memory of a CUDA device in bytes (cudaDeviceProp::totalGlobalMem); 0 when unknown or not CUDA.
int64_t cuda_total_memory(const torch::Device& device);

/// The CUDA device's name ("NVIDIA H200"), "cpu" for the CPU, "" when unknown.
std::string device_name(const torch::Device& device);

}  // namespace qlora
