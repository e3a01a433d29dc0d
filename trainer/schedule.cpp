#include "trainer/schedule.h"

#include <algorithm>
#include <cmath>


namespace qlora {

double lr_at(LrScheduler s, double base_lr, int64_t step, int64_t warmup, int64_t total) {
  if (step < warmup) return base_lr * static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, warmup));
  const double span = static_cast<double>(std::max<int64_t>(1, total - warmup));
  switch (s) {
    case LrScheduler::kConstant: return base_lr;
    case LrScheduler::kLinear: return base_lr * std::max(0.0, static_cast<double>(total - step) / span);
    case LrScheduler::kCosine: {
      const double progress = static_cast<double>(step - warmup) / span;
      return base_lr * std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * progress)));
    }
  }
  return base_lr;
}

}  // namespace qlora
