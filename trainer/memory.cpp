#include "trainer/memory.h"

#include <fstream>
#include <string>

#include "common/error.h"
#include "common/proc_status.h"

#if __has_include(<c10/cuda/CUDACachingAllocator.h>)
#include <ATen/Context.h>
#include <c10/cuda/CUDACachingAllocator.h>
#define QLORA_HAVE_C10_CUDA 1
#endif
#if __has_include(<ATen/cuda/CUDAContext.h>) && __has_include(<cuda_runtime_api.h>)
#include <ATen/cuda/CUDAContext.h>
#define QLORA_HAVE_ATEN_CUDA 1
#endif

namespace qlora {
namespace {
int cuda_index(const torch::Device& d) { return d.has_index() ? d.index() : 0; }

// Initialise CUDA for the device, then insist that the caching allocator is ready (issue 15: the
// allocator throws "did you call init?" when stats are read before anything initialised CUDA).
void ensure_cuda_ready(const torch::Device& d, const CudaAllocatorOps& ops) {
  ops.init_device(cuda_index(d));
  QLORA_CHECK(ops.initialized(), "memory: the CUDA caching allocator is not initialised for ", d.str(),
              " even after initialising CUDA (is a GPU visible? CUDA_VISIBLE_DEVICES)");
}
}  // namespace

const CudaAllocatorOps& torch_cuda_allocator_ops() {
  static const CudaAllocatorOps ops = [] {
    CudaAllocatorOps o;
#ifdef QLORA_HAVE_C10_CUDA
    namespace ca = c10::cuda::CUDACachingAllocator;
    o.init_device = [](int) { at::globalContext().lazyInitDevice(c10::DeviceType::CUDA); };
    o.initialized = [] { return ca::get() != nullptr && ca::get()->initialized(); };
    o.stats = [](int i) {
      using c10::CachingAllocator::StatType;
      const auto st = ca::getDeviceStats(static_cast<c10::DeviceIndex>(i));
      const auto agg = static_cast<size_t>(StatType::AGGREGATE);
      return CudaAllocatorStats{st.allocated_bytes[agg].current, st.allocated_bytes[agg].peak,
                                st.reserved_bytes[agg].current, st.reserved_bytes[agg].peak};
    };
    o.reset_peak = [](int i) { ca::resetPeakStats(static_cast<c10::DeviceIndex>(i)); };
    o.empty_cache = [] { ca::emptyCache(); };
#else
    auto none = [] { fail("memory: this build has no CUDA allocator headers (c10/cuda)"); };
    o.init_device = [none](int) { none(); };
    o.initialized = [] { return false; };
    o.stats = [none](int) -> CudaAllocatorStats { none(); return {}; };
    o.reset_peak = [none](int) { none(); };
    o.empty_cache = none;
#endif
    return o;
  }();
  return ops;
}

nlohmann::json memory_snapshot(const torch::Device& device) {
  return memory_snapshot(device, torch_cuda_allocator_ops());
}

nlohmann::json memory_snapshot(const torch::Device& device, const CudaAllocatorOps& ops) {
  nlohmann::json j = {{"rss_bytes", rss_bytes()}, {"peak_rss_bytes", peak_rss_bytes()}};
  if (device.is_cuda()) {
    ensure_cuda_ready(device, ops);
    const CudaAllocatorStats s = ops.stats(cuda_index(device));
    j["cuda_allocated_bytes"] = s.allocated;
    j["cuda_peak_allocated_bytes"] = s.peak_allocated;
    j["cuda_reserved_bytes"] = s.reserved;
    j["cuda_peak_reserved_bytes"] = s.peak_reserved;
  }
  return j;
}

void reset_peak_memory(const torch::Device& device) { reset_peak_memory(device, torch_cuda_allocator_ops()); }

void reset_peak_memory(const torch::Device& device, const CudaAllocatorOps& ops) {
  if (device.is_cuda()) {
    ensure_cuda_ready(device, ops);
    ops.empty_cache();
    ops.reset_peak(cuda_index(device));
  }
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
