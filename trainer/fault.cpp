#include "trainer/fault.h"

#include <string>

#include "common/error.h"

namespace qlora {
namespace {
/// `s` as a non-negative decimal integer that fits int64_t, or -1.
int64_t non_negative(const std::string& s) {
  if (s.empty() || s.size() > 18 || s.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(s);
}
}  // namespace

FaultHooks FaultHooks::from_env(const std::function<const char*(const char*)>& getenv) {
  FaultHooks f;
  auto number = [&](const char* name, int64_t* out) {
    const char* v = getenv(name);
    if (!v) return;
    *out = non_negative(v);
    QLORA_CHECK(*out >= 0, name, ": expected a non-negative integer, got '", v, "'");
  };
  if (const char* v = getenv("QLORA_FAULT_SIGTERM_AT")) {
    const std::string s = v;
    const size_t colon = s.find(':');
    if (colon != std::string::npos) {
      f.sigterm_step = non_negative(s.substr(0, colon));
      f.sigterm_micro = non_negative(s.substr(colon + 1));
    }
    QLORA_CHECK(f.sigterm_step >= 0 && f.sigterm_micro >= 0, "QLORA_FAULT_SIGTERM_AT: expected STEP:MICRO ",
                "(non-negative integers), got '", s, "'");
  }
  number("QLORA_FAULT_PERTURB_AT", &f.perturb_step);
  number("QLORA_FAULT_STEP_DELAY_MS", &f.step_delay_ms);
  number("QLORA_FAULT_SLOW_CHECKPOINT_MS", &f.slow_checkpoint_ms);
  number("QLORA_FAULT_LOAD_DELAY_MS", &f.load_delay_ms);
  number("QLORA_FAULT_CHECKPOINT_ENOSPC_AT", &f.checkpoint_enospc_step);
  return f;
}

}  // namespace qlora
