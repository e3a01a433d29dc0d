#include "common/format.h"

#include <cmath>
#include <iomanip>
#include <sstream>

namespace qlora {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  const double sign = b < 0 ? -1 : 1;
  b = std::fabs(b);
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  std::ostringstream os;
  os << std::fixed << std::setprecision(u == 0 ? 0 : 2) << sign * b << " " << units[u];
  return os.str();
}

}  // namespace qlora
