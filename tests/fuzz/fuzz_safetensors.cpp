// libFuzzer target: a .safetensors file (8-byte header length, JSON header, data buffer) through
// qlora::st::SafetensorsFile, then every accessor a loader uses. Contract (common/safetensors.h):
// accept, or throw qlora::Error; never crash, read out of bounds, or throw anything else.
#include <cstdint>
#include <cstring>

#include "common/error.h"
#include "common/safetensors.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = qlora::fuzz::scratch_file(data, size, ".safetensors");
  try {
    qlora::st::SafetensorsFile f(path);
    volatile uint64_t sink = 0;
    for (const qlora::st::TensorInfo& t : f.tensors()) {
      const qlora::st::TensorInfo& again = f.info(t.name);
      sink += static_cast<uint64_t>(again.numel()) + t.nbytes();
      // touch the first and last byte of each tensor: must lie inside the mapping
      if (t.nbytes()) sink += f.data(t)[0] + f.data(t)[t.nbytes() - 1];
    }
    for (const auto& [k, v] : f.metadata()) sink += k.size() + v.size();
    (void)sink;
  } catch (const qlora::Error&) {
  }
  return 0;
}
