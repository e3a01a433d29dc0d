// Shared helpers for the GoogleTest suites: where fixtures and ../shared live, and how a missing
// one is treated (a failure under CI, a skip with a clear message elsewhere).
#pragma once
#include <gtest/gtest.h>

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
