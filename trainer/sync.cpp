#include "trainer/sync.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>

#include "common/log.h"
#include "trainer/train.h"

extern char** environ;

namespace qlora {

std::string expand_sync_command(const std::string& command, const std::string& dir) {
  const std::string name = std::filesystem::path(dir).filename().string();
  std::string out;
  for (size_t i = 0; i < command.size();) {
    if (command.compare(i, 5, "{dir}") == 0) {
      out += shell_quote(dir);
      i += 5;
    } else if (command.compare(i, 6, "{name}") == 0) {
      out += shell_quote(name);
      i += 6;
    } else {
      out += command[i++];
    }
  }
  return out;
}

struct CheckpointSync::Job {
  std::string dir, cmd;
  pid_t pid = -1;
  std::thread watcher;
  std::mutex mu;
  std::condition_variable cv;
  bool ended = false;  // guarded by mu, as the three below
  bool ok = false;
  std::string error;
  double seconds = 0;
};

namespace {
using Clock = std::chrono::steady_clock;

/// Starts `/bin/sh -c cmd` in a new process group (see sync.h); returns its pid, or -errno.
pid_t spawn_shell(const std::string& cmd) {
  posix_spawnattr_t attr;
  posix_spawn_file_actions_t files;
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_init(&files);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  for (int s : {SIGINT, SIGTERM, SIGQUIT, SIGPIPE}) sigaddset(&defaults, s);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  posix_spawnattr_setpgroup(&attr, 0);  // its own process group: pgid = its pid
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawn_file_actions_addopen(&files, 0, "/dev/null", O_RDONLY, 0);
  const char* argv[] = {"sh", "-c", cmd.c_str(), nullptr};
  pid_t pid = -1;
  const int err = posix_spawn(&pid, "/bin/sh", &files, &attr, const_cast<char* const*>(argv), environ);
  posix_spawn_file_actions_destroy(&files);
  posix_spawnattr_destroy(&attr);
  return err == 0 ? pid : -err;
}
}  // namespace

CheckpointSync::CheckpointSync(std::string command) : command_(std::move(command)) {}

CheckpointSync::~CheckpointSync() {
  for (auto& j : jobs_)
    if (j->watcher.joinable()) j->watcher.detach();  // the watcher holds its Job (shared_ptr)
}

void CheckpointSync::start(const std::string& dir) {
  auto job = std::make_shared<Job>();
  job->dir = dir;
  job->cmd = expand_sync_command(command_, dir);
  jobs_.push_back(job);
  const pid_t pid = spawn_shell(job->cmd);
  if (pid < 0) {
    log::warn("checkpoint.sync_command for ", dir, ": failed (cannot start /bin/sh: ", std::strerror(-pid),
              "): ", job->cmd);
    job->error = std::string("cannot start /bin/sh: ") + std::strerror(-pid);
    job->ended = true;
    return;
  }
  job->pid = pid;
  const auto t0 = Clock::now();
  job->watcher = std::thread([job, t0] {
    int st = 0;
    pid_t r;
    do r = ::waitpid(job->pid, &st, 0);
    while (r < 0 && errno == EINTR);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.2f s", s);
    std::string error;
    if (r < 0)
      error = std::string("waitpid: ") + std::strerror(errno);
    else if (WIFEXITED(st) && WEXITSTATUS(st) != 0)
      error = "exit code " + std::to_string(WEXITSTATUS(st));
    else if (!WIFEXITED(st))
      error = "killed by signal " + std::to_string(WTERMSIG(st)) + " (" + strsignal(WTERMSIG(st)) + ")";
    if (error.empty())
      log::info("checkpoint.sync_command for ", job->dir, ": ok (", secs, ")");
    else
      log::warn("checkpoint.sync_command for ", job->dir, ": failed (", error, ", ", secs, "): ", job->cmd);
    std::lock_guard<std::mutex> lock(job->mu);
    job->ok = error.empty();
    job->error = error;
    job->seconds = s;
    job->ended = true;
    job->cv.notify_all();
  });
}

std::set<std::string> CheckpointSync::running() const {
  std::set<std::string> dirs;
  for (const auto& j : jobs_) {
    std::lock_guard<std::mutex> lock(j->mu);
    if (!j->ended) dirs.insert(j->dir);
  }
  return dirs;
}

std::vector<SyncOutcome> CheckpointSync::outcomes() const {
  std::vector<SyncOutcome> out;
  for (const auto& j : jobs_) {
    std::lock_guard<std::mutex> lock(j->mu);
    out.push_back({j->dir, !j->ended ? "running" : j->ok ? "ok" : "failed", j->error, j->seconds});
  }
  return out;
}

bool CheckpointSync::ended_since_last_call() {
  size_t ended = 0;
  for (const auto& j : jobs_) {
    std::lock_guard<std::mutex> lock(j->mu);
    ended += j->ended;
  }
  const bool any = ended > ended_seen_;
  ended_seen_ = ended;
  return any;
}

bool CheckpointSync::wait(double timeout_s) {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  bool all = true;
  for (auto& j : jobs_) {
    std::unique_lock<std::mutex> lock(j->mu);
    if (!j->cv.wait_until(lock, deadline, [&] { return j->ended; })) {
      all = false;
      log::warn("checkpoint.sync_command for ", j->dir, ": timed out after ", timeout_s,
                " s (checkpoint.sync_timeout_seconds); left running as process group ", j->pid, ": ", j->cmd);
    }
  }
  for (auto& j : jobs_) {
    std::lock_guard<std::mutex> lock(j->mu);
    if (j->ended && j->watcher.joinable()) j->watcher.join();  // it only returns from notify_all now
  }
  return all;
}

}  // namespace qlora
