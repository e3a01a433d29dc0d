// The build-time paths of tests/test_util.h, compiled into this one file (library qlora_test_paths):
// every other test file's compile is then the same in two clones in other folders, so ccache hits
// (docs/setup.md, "Compiler cache").
#include <cstdlib>
#include <filesystem>
#include <string>

namespace qlora::test {

std::filesystem::path fixtures_dir() {
  if (const char* e = std::getenv("QLORA_FIXTURES")) return e;
  return QLORA_FIXTURES_DIR;
}

std::filesystem::path shared_dir() {
  if (const char* e = std::getenv("QLORA_SHARED")) return e;
  return QLORA_SHARED_DIR;
}

std::filesystem::path source_dir() { return QLORA_SOURCE_DIR; }

const std::string& qlora_bin() {
  static const std::string bin = QLORA_BIN;
  return bin;
}

const std::string& python_exe() {
  static const std::string python = QLORA_PYTHON;
  return python;
}

}  // namespace qlora::test
