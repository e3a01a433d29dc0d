// Shared helpers for the GoogleTest suites: where fixtures and ../shared live. A missing fixture,
// ../shared file or Python interpreter FAILS the test (never a skip: scripts/test.sh fails on any
// skip outside tests/skip_allowlist.txt). Suite-level setup reports through SuiteSetup, so a failed
// SetUpTestSuite fails every test of the suite instead of GoogleTest's silent skip.
#pragma once
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "common/files.h"
#include "common/error.h"

namespace qlora::test {

// Where things are (tests/test_paths.cpp). The build-time paths are compiled into that one file
// only: a -D define with an absolute path on every test file made each compile differ between two
// clones in other folders, and ccache (CCACHE_BASEDIR rewrites paths in arguments, not in macro
// values) missed every test file of a fresh clone (docs/setup.md, "Compiler cache").

/// Directory of generated fixtures (env QLORA_FIXTURES overrides the build-time default).
std::filesystem::path fixtures_dir();
/// ../shared (env QLORA_SHARED overrides).
std::filesystem::path shared_dir();
/// The project's source root (CMAKE_SOURCE_DIR).
std::filesystem::path source_dir();
/// The build's `qlora` executable ($<TARGET_FILE:qlora>).
const std::string& qlora_bin();
/// The Python interpreter of the test venv (configured as ::qlora::test::python_exe(); scripts/build.sh sets it);
/// "" when the build was configured without one.
const std::string& python_exe();

/// Exit status and combined stdout + stderr of a shell command.
struct CommandResult {
  int status;       ///< exit code, or -1 when killed by a signal
  std::string out;  ///< stdout and stderr interleaved
};

/// Runs `cmd` through /bin/sh with stderr folded into stdout.
inline CommandResult run_command(const std::string& cmd) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return {-1, "popen failed: " + cmd};
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int st = ::pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

/// Whether a TCP listener can bind 127.0.0.1:`port` now (bound, then closed at once).
inline bool tcp_port_bindable(int port) {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  if (s < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(s);
  return ok;
}

/// A TCP port on 127.0.0.1 that was free a moment ago, for MASTER_PORT in the data-parallel tests;
/// -1 on error. Drawn at random below the kernel's ephemeral range (ip_local_port_range, 32768 by
/// default): a port bound to 0 and closed comes from that range, from which every outgoing
/// connection of a test running beside it (ctest -j2: the other ranks' TCPStore clients) also takes
/// its local port, and one did take it before rank 0 listened (EADDRINUSE in a fresh-clone run of
/// the test command, 2026-12-04). Below the range only another listener can collide, and each is drawn at random.
inline int free_tcp_port() {
  int low = 32768;
  if (std::FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d", &low) != 1) low = 32768;
    std::fclose(f);
  }
  if (low > 11000) {
    std::random_device rd;
    std::uniform_int_distribution<int> pick(10000, low - 1);
    for (int attempt = 0; attempt < 200; ++attempt) {
      const int port = pick(rd);
      if (tcp_port_bindable(port)) return port;
    }
  }
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);  // fallback: a port the kernel picks
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (s < 0 || ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (s >= 0) ::close(s);
    return -1;
  }
  ::close(s);
  return ntohs(a.sin_port);
}

/// An empty directory under the system temp dir, unique to this process and `name`.
inline std::filesystem::path fresh_temp_dir(const std::string& name) {
  const std::filesystem::path d =
      std::filesystem::temp_directory_path() / ("qlora_test_" + name + "_" + std::to_string(::getpid()));
  qlora::remove_tree(d);
  std::filesystem::create_directories(d);
  return d;
}

/// fresh_temp_dir that removes itself (and what is in it) when it goes out of scope.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& name) : path(fresh_temp_dir(name)) {}
  ~TempDir() {
    std::error_code ec;
    qlora::remove_tree(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

/// Message of the qlora::Error that `f()` throws ("" when it throws none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const ::qlora::Error& e) {
    return e.what();
  }
  return "";
}

/// True when `s` contains `what`.
/// The JSON document in file `p` (a test's result files: summary.json, eval.json, ...); throws
/// nlohmann::json::parse_error when it is not JSON (a missing file reads as empty: a parse error).
inline nlohmann::json read_json(const std::filesystem::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

inline bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

/// The first line of `text` that contains `what`, or "".
inline std::string line_with(const std::string& text, const std::string& what) {
  std::size_t begin = 0;
  while (begin <= text.size()) {
    std::size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(begin, end - begin);
    if (contains(line, what)) return line;
    begin = end + 1;
  }
  return "";
}

/// Runs `f()`, which must throw qlora::Error for the bad file `file`: the message starts with
/// "<file>: ", contains `expect` and is one line. `label` names the case in failure messages.
template <typename F>
void expect_file_error(const std::string& file, const std::string& expect, const std::string& label, F&& f) {
  try {
    f();
    ADD_FAILURE() << label << ": accepted";
  } catch (const ::qlora::Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(file + ": ", 0), 0u) << label << ": does not name the file first: " << msg;
    EXPECT_NE(msg.find(expect), std::string::npos) << label << ": " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << label << ": not one line: " << msg;
  }
}

/// The outcome of a suite's SetUpTestSuite. GoogleTest marks every test SKIPPED when an ASSERT
/// fails in SetUpTestSuite (and ctest's skip pattern then reports success), so suites record the
/// error here instead and call check() from SetUp(), which FAILs each test with the message.
struct SuiteSetup {
  std::string error;  ///< empty = setup succeeded
  /// Records `what` + `detail` as the error when `ok` is false; returns ok.
  bool expect(bool ok, const std::string& what, const std::string& detail = "") {
    if (!ok && error.empty()) error = what + (detail.empty() ? "" : ":\n" + detail);
    return ok;
  }
};

}  // namespace qlora::test

/// In a fixture's SetUp(): fails the test when the suite's SetUpTestSuite recorded an error.
#define QLORA_CHECK_SUITE_SETUP(suite_setup) \
  if (!(suite_setup).error.empty()) FAIL() << "suite setup failed: " << (suite_setup).error

/// The Python interpreter of the test venv (configured as ::qlora::test::python_exe()); empty fails the test.
#define QLORA_REQUIRE_PYTHON_EXE(var)                                                      \
  const std::string var = ::qlora::test::python_exe();                                     \
  if (var.empty()) FAIL() << "QLORA_PYTHON is empty: configure with -DQLORA_PYTHON=<venv python> (scripts/build.sh does)"

/// Resolves `rel` under the fixtures dir into `var`; a missing fixture fails the test
/// (fixtures are made by scripts/test.sh before ctest).
#define QLORA_REQUIRE_FIXTURE(var, rel)                                                     \
  const std::filesystem::path var = ::qlora::test::fixtures_dir() / (rel);                 \
  if (!std::filesystem::exists(var))                                                       \
  FAIL() << "missing fixture " << var << " (made by tests/fixtures/make_*.py; run scripts/test.sh)"

/// Resolves `rel` under ../shared (env QLORA_SHARED overrides) into `var`; missing fails the test.
#define QLORA_REQUIRE_SHARED(var, rel)                                                      \
  const std::filesystem::path var = ::qlora::test::shared_dir() / (rel);                   \
  if (!std::filesystem::exists(var))                                                       \
  FAIL() << "missing " << var << " (../shared: the repo's demo data and tokenizers; set QLORA_SHARED)"
