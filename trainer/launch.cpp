#include "trainer/launch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>

#include "common/error.h"
#include "common/log.h"
#include "trainer/distributed.h"

namespace qlora {

namespace {

volatile sig_atomic_t g_forward_signal = 0;
extern "C" void on_launcher_signal(int sig) { g_forward_signal = sig; }

/// A TCP port of 127.0.0.1 that was free a moment ago (bound to port 0, then closed), as
/// torchrun --standalone picks one. Throws qlora::Error when no socket can be bound.
int free_local_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  QLORA_CHECK(s >= 0, "--nproc-per-node: cannot open a socket to find a free MASTER_PORT: ", std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  const bool ok = ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  const int err = errno;
  ::close(s);
  QLORA_CHECK(ok, "--nproc-per-node: cannot bind 127.0.0.1 to find a free MASTER_PORT: ", std::strerror(err),
              " (set MASTER_PORT)");
  return ntohs(a.sin_port);
}

/// The shell's view of a wait status: the exit code, or 128 + the signal.
int status_code(int st) { return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st); }

std::string describe(int st) {
  if (WIFEXITED(st)) return "exited with status " + std::to_string(WEXITSTATUS(st));
  return std::string("was killed by signal ") + std::to_string(WTERMSIG(st)) + " (" + strsignal(WTERMSIG(st)) + ")";
}

}  // namespace

std::vector<std::string> strip_nproc_option(const std::vector<std::string>& argv) {
  std::vector<std::string> out;
  for (size_t i = 0; i < argv.size(); ++i) {
    if (argv[i] == "--nproc-per-node") {
      ++i;  // and its value
      continue;
    }
    if (argv[i].rfind("--nproc-per-node=", 0) == 0) continue;
    out.push_back(argv[i]);
  }
  return out;
}

StopSignalHandlers::StopSignalHandlers(void (*handler)(int)) {
  struct sigaction sa {};
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  for (size_t i = 0; i < kN; ++i) {
    struct sigaction now {};
    sigaction(kStopSignals[i], nullptr, &now);
    if (kStopSignals[i] == SIGHUP && now.sa_handler == SIG_IGN) continue;
    set_[i] = sigaction(kStopSignals[i], &sa, &old_[i]) == 0;
  }
}

StopSignalHandlers::~StopSignalHandlers() {
  for (size_t i = 0; i < kN; ++i)
    if (set_[i]) sigaction(kStopSignals[i], &old_[i], nullptr);
}

int launch_local_ranks(int nproc, const std::vector<std::string>& argv) {
  QLORA_CHECK(nproc >= 1 && nproc <= 1024, "--nproc-per-node: must be in 1..1024, got ", nproc);
  QLORA_CHECK(!argv.empty(), "--nproc-per-node: no command to run");
  const char* rank = std::getenv("RANK");
  const char* world = std::getenv("WORLD_SIZE");
  QLORA_CHECK(!rank && !world, "--nproc-per-node ", nproc, ": ", rank ? "RANK=" + std::string(rank) : "",
              rank && world ? " and " : "", world ? "WORLD_SIZE=" + std::string(world) : "",
              (rank && world) ? " are" : " is", " already set: this process is already one rank of a launched job "
              "(torchrun, srun); use either that launcher or --nproc-per-node, not both");
  std::map<std::string, std::string> env;
  env["WORLD_SIZE"] = env["LOCAL_WORLD_SIZE"] = std::to_string(nproc);
  env["MASTER_ADDR"] = "127.0.0.1";
  env["QLORA_LAUNCHED_NPROC"] = std::to_string(nproc);  // a rank's resume hint names --nproc-per-node N
  const char* port = std::getenv("MASTER_PORT");
  env["MASTER_PORT"] = port ? std::string(port) : std::to_string(free_local_port());
  const char* omp = std::getenv("OMP_NUM_THREADS");
  if (!omp && nproc > 1) env["OMP_NUM_THREADS"] = "1";  // torchrun's default, so N ranks do not oversubscribe
  // The ranks' environment checked here once (one line, nothing started) rather than N times.
  for (int r = 0; r < nproc; ++r) {
    env["RANK"] = env["LOCAL_RANK"] = std::to_string(r);
    read_dist_env([&](const char* name) -> const char* {
      auto it = env.find(name);
      return it != env.end() ? it->second.c_str() : std::getenv(name);
    });
  }
  log::info("launch: starting ", nproc, " local rank", nproc == 1 ? "" : "s", " (WORLD_SIZE=", nproc,
            " MASTER_ADDR=127.0.0.1 MASTER_PORT=", env["MASTER_PORT"], " OMP_NUM_THREADS=",
            omp ? std::string(omp) : env.count("OMP_NUM_THREADS") ? env["OMP_NUM_THREADS"] : std::string("(unset)"), ")");

  // Signals to forward: caught from before the first fork, so none is lost in between.
  // kStopSignals; a SIGHUP ignored at start (nohup) stays ignored, here and so in the ranks, which
  // inherit the disposition.
  g_forward_signal = 0;
  const StopSignalHandlers forward(on_launcher_signal);

  std::vector<char*> cargv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  const pid_t launcher = ::getpid();
  std::map<pid_t, int> live;  // pid -> rank
  for (int r = 0; r < nproc; ++r) {
    env["RANK"] = env["LOCAL_RANK"] = std::to_string(r);
    // The rank's whole environment, built before fork: the child only calls async-signal-safe
    // functions (this process may have threads).
    std::vector<std::string> entries;
    for (char** e = environ; *e; ++e) {
      const std::string kv(*e);
      if (!env.count(kv.substr(0, kv.find('=')))) entries.push_back(kv);
    }
    for (const auto& [k, v] : env) entries.push_back(k + "=" + v);
    std::vector<char*> cenv;
    for (const std::string& kv : entries) cenv.push_back(const_cast<char*>(kv.c_str()));
    cenv.push_back(nullptr);
    static const char kExecFailed[] = "error: --nproc-per-node: cannot exec /proc/self/exe for a rank\n";
    const pid_t pid = ::fork();
    if (pid == 0) {
      // The child: default signal dispositions (exec resets caught ones), SIGTERM when the
      // launcher dies (a rank then checkpoints and exits 75), then this binary.
      // Its own session (as torchrun's start_new_session): a terminal's Ctrl-C reaches the
      // launcher alone, which forwards it once, so a rank counts one interrupt per Ctrl-C.
      ::setsid();
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != launcher) ::_exit(128 + SIGTERM);  // the launcher died before prctl
      ::execve("/proc/self/exe", cargv.data(), cenv.data());
      (void)!::write(2, kExecFailed, sizeof kExecFailed - 1);
      ::_exit(127);
    }
    if (pid < 0) {
      const int err = errno;
      for (const auto& [p, k] : live) ::kill(p, SIGKILL);
      for (const auto& [p, k] : live) ::waitpid(p, nullptr, 0);
      fail("--nproc-per-node: cannot start rank ", r, ": fork: ", std::strerror(err));
    }
    live[pid] = r;
    log::info("launch: started rank ", r, " (pid ", pid, ")");
  }

  using clock = std::chrono::steady_clock;
  int first_failure = -1, interrupted = 0, sigints = 0, quit = 0;
  clock::time_point failed_at{}, termed_at{};
  bool termed = false, killed = false;
  while (!live.empty()) {
    int st = 0;
    pid_t p;
    while ((p = ::waitpid(-1, &st, WNOHANG)) > 0) {
      auto it = live.find(p);
      if (it == live.end()) continue;
      const int code = status_code(st);
      if (code == 0 || code == 75 || (code == 128 + SIGINT && sigints >= 2)) {
        log::info("launch: rank ", it->second, " ", describe(st));
        interrupted += code == 75;
        quit += code == 128 + SIGINT;  // a second Ctrl-C: quit without a checkpoint
      } else {
        log::warn("launch: rank ", it->second, " ", describe(st));
        if (first_failure < 0) {
          first_failure = code;
          failed_at = clock::now();
          if (live.size() > 1)
            log::warn("launch: rank ", it->second, " failed; the other ranks get ", kLaunchGraceSeconds,
                      " s to exit on their own, then SIGTERM, then SIGKILL");
        }
      }
      live.erase(it);
    }
    if (live.empty()) break;
    if (const int sig = g_forward_signal) {
      g_forward_signal = 0;
      sigints += sig == SIGINT;
      log::info("launch: forwarding signal ", sig, " (", strsignal(sig), ") to ", live.size(), " rank(s)");
      for (const auto& [pid, r] : live) ::kill(pid, sig);
    }
    const auto now = clock::now();
    if (first_failure >= 0 && !termed && now - failed_at >= std::chrono::seconds(kLaunchGraceSeconds)) {
      log::warn("launch: ", live.size(), " rank(s) still running ", kLaunchGraceSeconds,
                " s after a failure: sending SIGTERM");
      for (const auto& [pid, r] : live) ::kill(pid, SIGTERM);
      termed = true;
      termed_at = now;
    }
    if (termed && !killed && now - termed_at >= std::chrono::seconds(kLaunchKillSeconds)) {
      log::warn("launch: sending SIGKILL to ", live.size(), " rank(s)");
      for (const auto& [pid, r] : live) ::kill(pid, SIGKILL);
      killed = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // A rank killed by a signal (SIGKILL from outside, the OOM killer) is the one failure that no
  // rank's own log explains or follows with a resume line: the launcher says it.
  if (first_failure > 128 && first_failure != 128 + SIGINT)
    log::warn("launch: a rank was killed by signal ", first_failure - 128, "; the checkpoints already written are "
              "kept: run the same command again to resume from the newest complete one");
  if (first_failure >= 0) return first_failure;
  if (quit > 0) return 128 + SIGINT;
  return interrupted > 0 ? kExitInterrupted : 0;
}

}  // namespace qlora
