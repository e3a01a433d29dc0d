#include "common/proc_status.h"

#include <fstream>

namespace qlora {

int64_t proc_status_bytes(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1)) * 1024;
  return 0;
}

}  // namespace qlora
