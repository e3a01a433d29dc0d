#include "trainer/schedule.h"

#include <algorithm>
#include <cmath>


namespace qlora {

namespace {
/// The schedule's factor (LambdaLR's lr_lambda); lr_at multiplies it by base_lr.
double factor_at(LrScheduler s, double base_lr, int64_t step, int64_t warmup, int64_t total) {
  if (s == LrScheduler::kConstant) return 1.0;  // get_constant_schedule: no warmup, whatever is set
  if (step < warmup) return static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, warmup));
  const double span = static_cast<double>(std::max<int64_t>(1, total - warmup));
  const double progress = static_cast<double>(step - warmup) / span;
  switch (s) {
    case LrScheduler::kConstant:  // (returned above)
    case LrScheduler::kConstantWithWarmup: return 1.0;
    case LrScheduler::kLinear: return std::max(0.0, static_cast<double>(total - step) / span);
    case LrScheduler::kCosine: return std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * progress)));
    case LrScheduler::kCosineWithRestarts:
      if (progress >= 1.0) return 0.0;
      return std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * std::fmod(progress, 1.0))));
    case LrScheduler::kPolynomial: {
      if (step > total) return kPolynomialLrEnd / base_lr;
      const double range = base_lr - kPolynomialLrEnd;
      const double decay_steps = static_cast<double>(std::max<int64_t>(1, total - warmup));
      const double remaining = 1.0 - static_cast<double>(step - warmup) / decay_steps;
      return (range * std::pow(remaining, kPolynomialPower) + kPolynomialLrEnd) / base_lr;
    }
  }
  return 1.0;
}
}  // namespace

double lr_at(LrScheduler s, double base_lr, int64_t step, int64_t warmup, int64_t total) {
  return base_lr * factor_at(s, base_lr, step, warmup, total);
}

int64_t warmup_steps_for(const TrainingConfig& t, int64_t total_steps) {
  if (t.lr_scheduler == LrScheduler::kConstant) return 0;
  if (t.warmup_ratio > 0) return static_cast<int64_t>(std::ceil(t.warmup_ratio * static_cast<double>(total_steps)));
  return t.warmup_steps;
}

}  // namespace qlora
