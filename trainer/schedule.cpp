#include "trainer/schedule.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace qlora {

Schedule parse_schedule(const std::string& s) {
  if (s == "constant") return Schedule::constant;
  if (s == "linear") return Schedule::linear;
  if (s == "cosine") return Schedule::cosine;
  fail("lr_scheduler '", s, "' is not one of constant, linear, cosine");
}

double lr_at(Schedule s, double base_lr, int64_t step, int64_t warmup, int64_t total) {
  if (step < warmup) return base_lr * static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, warmup));
  const double span = static_cast<double>(std::max<int64_t>(1, total - warmup));
  switch (s) {
    case Schedule::constant: return base_lr;
    case Schedule::linear: return base_lr * std::max(0.0, static_cast<double>(total - step) / span);
    case Schedule::cosine: {
      const double progress = static_cast<double>(step - warmup) / span;
      return base_lr * std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * progress)));
    }
  }
  return base_lr;
}

}  // namespace qlora
