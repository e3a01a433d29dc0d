// Shared helpers for the GoogleTest suites: where fixtures and ../shared live, and how a missing
// one is treated (a failure under CI, a skip with a clear message elsewhere).
#pragma once
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace qlora::test {

inline bool in_ci() { return std::getenv("CI") != nullptr; }

/// Directory of generated fixtures (env QLORA_FIXTURES overrides the build-time default).
inline std::filesystem::path fixtures_dir() {
  if (const char* e = std::getenv("QLORA_FIXTURES")) return e;
  return QLORA_FIXTURES_DIR;
}

/// ../shared (env QLORA_SHARED overrides).
inline std::filesystem::path shared_dir() {
  if (const char* e = std::getenv("QLORA_SHARED")) return e;
  return QLORA_SHARED_DIR;
}

inline std::filesystem::path source_dir() { return QLORA_SOURCE_DIR; }

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

/// An empty directory under the system temp dir, unique to this process and `name`.
inline std::filesystem::path fresh_temp_dir(const std::string& name) {
  const std::filesystem::path d =
      std::filesystem::temp_directory_path() / ("qlora_test_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

}  // namespace qlora::test

/// Resolves `rel` under the fixtures dir into `var`; a missing fixture fails the test
/// (fixtures are made by scripts/test.sh before ctest).
#define QLORA_REQUIRE_FIXTURE(var, rel)                                                     \
  const std::filesystem::path var = ::qlora::test::fixtures_dir() / (rel);                 \
  if (!std::filesystem::exists(var))                                                       \
  FAIL() << "missing fixture " << var << " (made by tests/fixtures/make_*.py; run scripts/test.sh)"

/// Resolves `rel` under ../shared into `var`; missing: fail under CI, skip elsewhere.
#define QLORA_REQUIRE_SHARED(var, rel)                                                      \
  const std::filesystem::path var = ::qlora::test::shared_dir() / (rel);                   \
  if (!std::filesystem::exists(var)) {                                                     \
    if (::qlora::test::in_ci()) FAIL() << "missing " << var << " (../shared must exist in CI)"; \
    GTEST_SKIP() << "skipped: " << var << " not found (../shared is only present in the repo's CI)"; \
  }
