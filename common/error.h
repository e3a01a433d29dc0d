// qlora-cpp: the error type every user-caused failure is thrown as.
//
// Below main nothing calls exit(): code throws qlora::Error with a one-line message that names the
// file (and line, tensor or config key) and the problem; main prints it and returns non-zero.
#pragma once
#include <csignal>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace qlora {

/// A user-facing error: one line, naming what (file:line, tensor, config key) and the problem.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

/// Several user-facing errors found in one pass over one input (a config with many wrong keys):
/// what() is their one-line messages joined by "\n", in the order given (config/: file order).
/// `qlora` prints each line as an error of its own.
class ErrorList : public Error {
 public:
  explicit ErrorList(const std::vector<std::string>& lines) : Error(join(lines)), lines_(lines) {}
  /// The one-line messages.
  const std::vector<std::string>& lines() const { return lines_; }

 private:
  static std::string join(const std::vector<std::string>& lines) {
    std::string out;
    for (size_t i = 0; i < lines.size(); ++i) out += (i ? "\n" : "") + lines[i];
    return out;
  }
  std::vector<std::string> lines_;
};

/// A run stopped cleanly (signal or time budget) after saving its state; not a failure of the
/// input. `qlora` exits with kExitInterrupted.
class Interrupted : public Error {
 public:
  using Error::Error;
};
/// A refusal that the same command may not meet later: another live process holds the run's
/// output_dir (its run.lock), as when a supervisor restarts a job whose old process is still in
/// its SIGTERM grace period. `qlora` prints it as an error and exits kExitInterrupted (75,
/// EX_TEMPFAIL: retry), not 1 (the input is wrong: retrying cannot help).
class TryLater : public Error {
 public:
  using Error::Error;
};
/// An error this process only relays: another process has already printed it (a data-parallel
/// rank's copy of rank 0's error, trainer/distributed.h from_main). Under `--nproc-per-node` (one
/// terminal for every rank) `qlora` exits 1 without printing it again; otherwise it prints it.
class RelayedError : public Error {
 public:
  using Error::Error;
};
/// Exit code after Interrupted or TryLater (EX_TEMPFAIL from sysexits.h: run the same command
/// again to resume).
constexpr int kExitInterrupted = 75;
/// The signals that stop `qlora train` cleanly (the step finishes, a checkpoint, exit
/// kExitInterrupted): SIGTERM (Kubernetes, scancel, spot reclaim notices), SIGINT (Ctrl-C),
/// SIGUSR1 / SIGUSR2 (Slurm's --signal, LSF's and submitit's warnings), SIGHUP (the terminal or
/// ssh session went away; left ignored when the run starts with it ignored, as under nohup).
/// `--nproc-per-node`'s launcher forwards the same ones to its ranks.
inline constexpr int kStopSignals[] = {SIGTERM, SIGINT, SIGUSR1, SIGUSR2, SIGHUP};
/// Exit code of a command-line usage error (unknown option, missing or malformed argument), as
/// getopt-style tools and Python's argparse use; bad input files and values exit 1.
constexpr int kExitUsage = 2;

namespace detail {
inline void cat(std::ostringstream&) {}
template <typename T, typename... Rest>
void cat(std::ostringstream& os, const T& v, const Rest&... rest) {
  os << v;
  cat(os, rest...);
}
}  // namespace detail

/// Concatenates the arguments with operator<< into a qlora::Error and throws it.
template <typename... Args>
[[noreturn]] void fail(const Args&... args) {
  std::ostringstream os;
  detail::cat(os, args...);
  throw Error(os.str());
}

}  // namespace qlora

/// Throws qlora::Error(message...) when `cond` is false. For user-caused conditions only;
/// internal invariants use assert / TORCH_INTERNAL_ASSERT.
#define QLORA_CHECK(cond, ...)                 \
  do {                                         \
    if (!(cond)) ::qlora::fail(__VA_ARGS__);   \
  } while (0)
