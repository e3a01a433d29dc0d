// qlora-cpp: learning-rate schedules with linear warmup, as transformers' optimization.py defines
// them (get_constant_schedule_with_warmup, get_linear_schedule_with_warmup,
// get_cosine_schedule_with_warmup with num_cycles = 0.5), so runs compare step for step.
#pragma once
#include <cstdint>

#include "config/config.h"  // LrScheduler: the config's `training.lr_scheduler`

namespace qlora {

/// Learning rate for the update that follows `step` completed optimizer steps (0-based, as
/// LambdaLR's counter): base_lr × factor, factor = step / warmup during warmup, then 1 (constant),
/// (total − step) / (total − warmup) (linear, floored at 0), or ½(1 + cos(π·progress)) (cosine).
double lr_at(LrScheduler s, double base_lr, int64_t step, int64_t warmup_steps, int64_t total_steps);

}  // namespace qlora
