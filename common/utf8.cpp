// qlora-cpp: UTF-8 validation (common/utf8.h).
#include "common/utf8.h"

#include <utf8proc.h>

#include "common/error.h"

namespace qlora {

void require_utf8(const std::string& s, const std::string& what) {
  const size_t bad = first_invalid_utf8(s);
  QLORA_CHECK(bad == std::string::npos, what, ": invalid UTF-8 at byte offset ", bad);
}

size_t first_invalid_utf8(const std::string& s) {
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    if (p[i] < 0x80) {  // ASCII fast path
      ++i;
      continue;
    }
    utf8proc_int32_t cp = 0;
    const utf8proc_ssize_t len = utf8proc_iterate(p + i, static_cast<utf8proc_ssize_t>(n - i), &cp);
    if (len <= 0 || cp < 0) return i;
    i += static_cast<size_t>(len);
  }
  return std::string::npos;
}

}  // namespace qlora
