#include "trainer/memory.h"

#include <fstream>
#include <string>

#if __has_include(<c10/cuda/CUDACachingAllocator.h>)
#include <c10/cuda/CUDACachingAllocator.h>
#define QLORA_HAVE_C10_CUDA 1
#endif
#if __has_include(<ATen/cuda/CUDAContext.h>) && __has_include(<cuda_runtime_api.h>)
#include <ATen/cuda/CUDAContext.h>
#define QLORA_HAVE_ATEN_CUDA 1
#endif

namespace qlora {
namespace {
// A "Key:   1234 kB" line of /proc/self/status, in bytes (0 when absent).
int64_t proc_status_bytes(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1)) * 1024;
  return 0;
}
}  // namespace

nlohmann::json memory_snapshot(const torch::Device& device) {
  nlohmann::json j = {{"rss_bytes", proc_status_bytes("VmRSS")}, {"peak_rss_bytes", proc_status_bytes("VmHWM")}};
#ifdef QLORA_HAVE_C10_CUDA
  if (device.is_cuda()) {
    using c10::CachingAllocator::StatType;
    const auto st = c10::cuda::CUDACachingAllocator::getDeviceStats(device.has_index() ? device.index() : 0);
    const auto agg = static_cast<size_t>(StatType::AGGREGATE);
    j["cuda_allocated_bytes"] = st.allocated_bytes[agg].current;
    j["cuda_peak_allocated_bytes"] = st.allocated_bytes[agg].peak;
    j["cuda_reserved_bytes"] = st.reserved_bytes[agg].current;
    j["cuda_peak_reserved_bytes"] = st.reserved_bytes[agg].peak;
  }
#endif
  return j;
}

void reset_peak_memory(const torch::Device& device) {
#ifdef QLORA_HAVE_C10_CUDA
  if (device.is_cuda()) {
    const c10::DeviceIndex i = device.has_index() ? device.index() : 0;
    c10::cuda::CUDACachingAllocator::emptyCache();
    c10::cuda::CUDACachingAllocator::resetPeakStats(i);
  }
#endif
  std::ofstream("/proc/self/clear_refs") << "5";  // resets VmHWM to the current RSS (Linux >= 4.0)
}

int64_t cuda_total_memory(const torch::Device& device) {
#ifdef QLORA_HAVE_ATEN_CUDA
  if (device.is_cuda() && torch::cuda::is_available())
    return static_cast<int64_t>(at::cuda::getDeviceProperties(device.has_index() ? device.index() : 0)->totalGlobalMem);
#endif
  (void)device;
  return 0;
}

std::string device_name(const torch::Device& device) {
  if (device.is_cpu()) return "cpu";
#ifdef QLORA_HAVE_ATEN_CUDA
  if (device.is_cuda() && torch::cuda::is_available())
    return at::cuda::getDeviceProperties(device.has_index() ? device.index() : 0)->name;
#endif
  return "";
}

}  // namespace qlora
