// qlora-cpp: the fault-injection test seam. Tests of interruption, resume and the data-parallel
// replica check set these environment variables on the `qlora train` they start; nothing else
// reads them, and unset (as in every real run) they do nothing.
//   QLORA_FAULT_SIGTERM_AT=STEP:MICRO     raise SIGTERM in this process while optimizer step STEP
//                                         (1-based) loads micro-batch MICRO (0-based) of its group
//   QLORA_FAULT_PERTURB_AT=STEP           add 1e-3 to one LoRA parameter of this process after
//                                         step STEP's update (its replica diverges)
//   QLORA_FAULT_STEP_DELAY_MS=N           sleep N ms after every optimizer step
//   QLORA_FAULT_SLOW_CHECKPOINT_MS=N      sleep N ms between writing a checkpoint's files and the
//                                         rename that completes it (a SIGKILL can land mid-write)
//   QLORA_FAULT_LOAD_DELAY_MS=N           sleep N ms between deciding which run owns output_dir
//                                         and loading the model (another process can write there)
//   QLORA_FAULT_CHECKPOINT_ENOSPC_AT=STEP fail writing the checkpoint of step STEP as a full disk
//                                         does (ENOSPC on optimizer.safetensors in its temporary
//                                         directory, which is removed; the previous one stays)
// STEP, MICRO and N are non-negative decimal integers.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <functional>

namespace qlora {

/// The QLORA_FAULT_* hooks of one process, parsed once (FaultHooks::from_env) and passed to what
/// uses them (Trainer, write_checkpoint). Default-constructed: no hook.
struct FaultHooks {
  int64_t sigterm_step = -1;        ///< QLORA_FAULT_SIGTERM_AT's STEP; -1 = off
  int64_t sigterm_micro = -1;       ///< QLORA_FAULT_SIGTERM_AT's MICRO
  int64_t perturb_step = -1;        ///< QLORA_FAULT_PERTURB_AT; -1 = off
  int64_t step_delay_ms = 0;        ///< QLORA_FAULT_STEP_DELAY_MS; 0 = off
  int64_t slow_checkpoint_ms = 0;   ///< QLORA_FAULT_SLOW_CHECKPOINT_MS; 0 = off
  int64_t load_delay_ms = 0;        ///< QLORA_FAULT_LOAD_DELAY_MS; 0 = off
  int64_t checkpoint_enospc_step = -1;  ///< QLORA_FAULT_CHECKPOINT_ENOSPC_AT; -1 = off

  /// Reads the variables through `getenv` (std::getenv except in tests). Throws qlora::Error
  /// "<NAME>: expected <form>, got '<value>'" for a value that is not of the form above.
  static FaultHooks from_env(const std::function<const char*(const char*)>& getenv = [](const char* n) {
    return std::getenv(n);
  });
};

}  // namespace qlora
