#include "trainer/memory.h"

#include <fstream>
#include <string>

#if __has_include(<c10/cuda/CUDACachingAllocator.h>)
#include <c10/cuda/CUDACachingAllocator.h>
#define QLORA_HAVE_C10_CUDA 1
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

}  // namespace qlora
