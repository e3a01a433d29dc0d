// qlora-cpp: `qlora train CONFIG --nproc-per-node N` starts the N local ranks of a data-parallel job
// itself (docs/distributed.md, "Launching"), as torchrun's standalone mode does: each rank is this
// same binary, exec'd with torchrun's environment, and the launcher forwards stop signals, waits,
// and turns the ranks' exit statuses into one.
//
// Reference: torch/distributed/run.py and torch/distributed/elastic/agent/server/local_elastic_agent.py
// (torchrun --standalone: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1,
// a free MASTER_PORT, OMP_NUM_THREADS=1 when unset and nproc > 1).
#pragma once
#include <signal.h>

#include <iterator>
#include <string>
#include <vector>

#include "common/error.h"

namespace qlora {

/// Installs `handler` for every kStopSignals (common/error.h) for its lifetime and restores the
/// previous dispositions after; a SIGHUP that is ignored when it is made (nohup, a detached job)
/// stays ignored. Used by Trainer (setup, then the steps) and by launch_local_ranks (forwarding).
/// Never throws; a sigaction that fails leaves that signal as it was.
class StopSignalHandlers {
 public:
  explicit StopSignalHandlers(void (*handler)(int));
  ~StopSignalHandlers();
  StopSignalHandlers(const StopSignalHandlers&) = delete;
  StopSignalHandlers& operator=(const StopSignalHandlers&) = delete;

 private:
  static constexpr size_t kN = std::size(kStopSignals);
  struct sigaction old_[kN];
  bool set_[kN] = {};
};

/// Seconds the launcher waits, after one rank failed (non-zero status other than 75, or killed by
/// a signal), for the others to exit on their own (they normally fail at their next collective,
/// naming the lost rank); then it sends them SIGTERM, and kLaunchKillSeconds later SIGKILL.
constexpr int kLaunchGraceSeconds = 10;
constexpr int kLaunchKillSeconds = 5;

/// Starts `nproc` ranks of `argv` (argv[0] as the child's argv[0]; the executable is this process's
/// own, /proc/self/exe) with RANK = LOCAL_RANK = 0..nproc-1, WORLD_SIZE = LOCAL_WORLD_SIZE = nproc,
/// MASTER_ADDR = 127.0.0.1, MASTER_PORT = $MASTER_PORT or a free TCP port of 127.0.0.1, and
/// OMP_NUM_THREADS = 1 when unset and nproc > 1, QLORA_LAUNCHED_NPROC = nproc (so a rank's resume
/// hint is the launcher's command). Each rank runs in its own session (setsid, as
/// torchrun's workers), so a terminal's Ctrl-C reaches the launcher only; kStopSignals (common/error.h)
/// received by the launcher are forwarded to every live rank, once per signal received. Waits for all
/// ranks and returns: 0 when all exited 0; the first failure's status (exit code, or 128 + signal
/// for a rank killed by a signal) when any failed; 130 when ranks quit on a second SIGINT (not a
/// failure); else 75 (kExitInterrupted: the job stopped with a checkpoint). After the first failure the rest are
/// stopped as kLaunchGraceSeconds says, so the launcher never hangs on a rank that waits for a dead
/// peer. Throws qlora::Error (nothing started) when nproc is not in 1..1024, RANK or WORLD_SIZE is
/// already set (this process is itself a rank), the resulting environment is invalid
/// (read_dist_env's checks, e.g. MASTER_PORT out of range), or fork fails (the ranks already
/// started are killed first).
int launch_local_ranks(int nproc, const std::vector<std::string>& argv);

/// `argv` without the launcher's own option (`--nproc-per-node N` or `--nproc-per-node=N`): the
/// command line each rank runs.
std::vector<std::string> strip_nproc_option(const std::vector<std::string>& argv);

}  // namespace qlora
