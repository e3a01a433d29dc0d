// Shared by the libFuzzer targets: a scratch file per process (the parsers under test read paths).
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace qlora::fuzz {

/// Writes `data` to a per-process scratch file ending in `suffix` (under $TMPDIR or /dev/shm, a
/// tmpfs when present) and returns its path. Aborts on an I/O error (a harness fault, not a finding).
inline std::string scratch_file(const uint8_t* data, size_t size, const std::string& suffix) {
  const char* dir = std::getenv("QLORA_FUZZ_TMP");
  const std::string path = std::string(dir ? dir : "/dev/shm") + "/qlora_fuzz_" + std::to_string(::getpid()) + suffix;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || (size && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) {
    std::perror(path.c_str());
    std::abort();
  }
  return path;
}

}  // namespace qlora::fuzz
