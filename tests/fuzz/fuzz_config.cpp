// libFuzzer target: YAML training configs through qlora::parse_config_string, and for every
// accepted config the to_yaml round trip (config/config.h promises
// parse_config_string(to_yaml(c)) == c). Contract: a Config, or qlora::Error; nothing else escapes.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/error.h"
#include "config/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  qlora::Config c;
  try {
    c = qlora::parse_config_string(text, "fuzz.yaml");
  } catch (const qlora::Error&) {
    return 0;
  }
  const std::string y = qlora::to_yaml(c);
  qlora::Config back;
  try {
    back = qlora::parse_config_string(y, "resolved.yaml");
  } catch (const qlora::Error& e) {
    std::fprintf(stderr, "to_yaml output does not parse: %s\n%s\n", e.what(), y.c_str());
    std::abort();
  }
  if (back != c) {
    std::fprintf(stderr, "to_yaml round trip changed the config:\n%s\n", y.c_str());
    std::abort();
  }
  return 0;
}
