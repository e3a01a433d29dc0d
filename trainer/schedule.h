// qlora-cpp: learning-rate schedules with linear warmup, as transformers' optimization.py defines
// them (the lr_lambda of get_constant_schedule_with_warmup, get_linear_schedule_with_warmup,
// get_cosine_schedule_with_warmup with num_cycles = 0.5, get_polynomial_decay_schedule_with_warmup
// with lr_end 1e-7 and power 1, get_cosine_with_hard_restarts_schedule_with_warmup with
// num_cycles = 1), so runs compare step for step.
#pragma once
#include <cstdint>

#include "config/config.h"  // LrScheduler: the config's `training.lr_scheduler`

namespace qlora {

/// Learning rate for the update that follows `step` completed optimizer steps (0-based, as
/// LambdaLR's counter): base_lr × factor, computed in transformers' order (the factor first, then
/// the product, as LambdaLR). During warmup (step < warmup) factor = step / max(1, warmup);
/// after it, with span = max(1, total − warmup) and progress = (step − warmup) / span:
///   constant, constant_with_warmup: 1 (both are transformers' constant_with_warmup; its
///     `constant` ignores the warmup, which equals ours only with warmup 0);
///   linear: max(0, (total − step) / span);
///   cosine: max(0, ½(1 + cos(π·progress)));
///   cosine_with_restarts (1 cycle): 0 once progress ≥ 1, else max(0, ½(1 + cos(π·(progress mod 1))));
///   polynomial: ((base_lr − lr_end)·(1 − progress)^power + lr_end) / base_lr for step ≤ total
///     (decay span total − warmup, 1 when that is 0), lr_end / base_lr after, with
///     kPolynomialLrEnd / kPolynomialPower (config.h).
double lr_at(LrScheduler s, double base_lr, int64_t step, int64_t warmup_steps, int64_t total_steps);

/// Warmup steps (optimizer steps, >= 0) of a run of `total_steps` optimizer steps, as transformers'
/// TrainingArguments.get_warmup_steps: ceil(warmup_ratio × total_steps) when a ratio is set, else
/// training.warmup_steps; 0 for `constant`, whose get_constant_schedule takes no warmup
/// (config_warnings says so where one is set). Throws nothing.
int64_t warmup_steps_for(const TrainingConfig& t, int64_t total_steps);

}  // namespace qlora
