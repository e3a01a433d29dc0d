// qlora-cpp: checkpoint.sync_command, the off-machine copy of each checkpoint (docs/checkpoints.md,
// "Off-machine copies"). Each command runs as `/bin/sh -c CMD` started with posix_spawn (not
// std::system, which ignores SIGINT and SIGQUIT in the whole calling process while the command
// runs), in its own process group (a terminal Ctrl-C does not kill the upload of the checkpoint
// the Ctrl-C asked for), with an empty signal mask, SIGINT / SIGTERM / SIGQUIT / SIGPIPE at their
// defaults (so it can be stopped with kill) and stdin from /dev/null (a background process group
// that reads the terminal would be stopped by SIGTTIN). stdout and stderr are the trainer's.
#pragma once
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace qlora {

/// `command` with every `{dir}` replaced by `dir` and every `{name}` by its last path component
/// (e.g. "checkpoint-40"), both shell-quoted (shell_quote: single quotes, ' written as '\'', a path
/// of plain characters left as is), so a path with spaces or quotes stays one word.
std::string expand_sync_command(const std::string& command, const std::string& dir);

/// What became of one started command (summary.json's `checkpoint_sync`).
struct SyncOutcome {
  std::string dir;     ///< the checkpoint directory it was started for
  std::string state;   ///< "ok", "failed", or "running" (not ended yet, or left running by wait())
  std::string error;   ///< for "failed": "exit code N", "killed by signal N (NAME)", "cannot start /bin/sh: ..."
  double seconds = 0;  ///< seconds from its start to its end; 0 while running
};

/// The sync commands started by one run. Each started command is watched by a thread that waits
/// for it and logs one line when it ends: "checkpoint.sync_command for DIR: ok (S s)" or
/// "...: failed (exit code N, S s): CMD" / "...: failed (killed by signal N, S s): CMD". Not
/// thread-safe itself: one caller (the trainer's main thread).
class CheckpointSync {
 public:
  /// `command`: checkpoint.sync_command as configured (with its placeholders).
  explicit CheckpointSync(std::string command);
  /// Commands still running are left running (their watchers detached); nothing is killed.
  ~CheckpointSync();
  CheckpointSync(const CheckpointSync&) = delete;
  CheckpointSync& operator=(const CheckpointSync&) = delete;

  /// Starts the command for the complete checkpoint `dir`. A command that cannot be started
  /// (posix_spawn fails) is logged as failed; never throws.
  void start(const std::string& dir);
  /// The checkpoint directories whose command still runs.
  std::set<std::string> running() const;
  /// Every started command's outcome so far, in start order.
  std::vector<SyncOutcome> outcomes() const;
  /// True when some command ended since the last call (the caller prunes what it held back).
  bool ended_since_last_call();
  /// Waits until every started command has ended or `timeout_s` seconds (>= 0) have passed; logs
  /// "checkpoint.sync_command for DIR: timed out after T s (checkpoint.sync_timeout_seconds); left
  /// running as process group P: CMD" for each one still running then. Returns true when all ended.
  bool wait(double timeout_s);

 private:
  struct Job;
  std::string command_;
  std::vector<std::shared_ptr<Job>> jobs_;
  size_t ended_seen_ = 0;  ///< ended jobs counted at the last ended_since_last_call()
};

}  // namespace qlora
