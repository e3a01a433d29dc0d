// common/format.h and common/proc_status.h: human_bytes at every unit boundary, and this process's
// memory from /proc/self/status.
#include <gtest/gtest.h>

#include <vector>

#include "common/format.h"
#include "common/proc_status.h"

namespace qlora {
namespace {

TEST(HumanBytes, UnitsAndRounding) {
  EXPECT_EQ(human_bytes(0), "0 B");
  EXPECT_EQ(human_bytes(1023), "1023 B");
  EXPECT_EQ(human_bytes(1024), "1.00 KiB");
  EXPECT_EQ(human_bytes(1536), "1.50 KiB");
  EXPECT_EQ(human_bytes(1024.0 * 1024 - 1), "1024.00 KiB");  // 1023.999 KiB rounds up, unit stays
  EXPECT_EQ(human_bytes(3.5 * 1024 * 1024), "3.50 MiB");
  EXPECT_EQ(human_bytes(1.25 * 1024 * 1024 * 1024), "1.25 GiB");
  EXPECT_EQ(human_bytes(2.0 * 1024 * 1024 * 1024 * 1024), "2.00 TiB");
  EXPECT_EQ(human_bytes(5.0 * 1024 * 1024 * 1024 * 1024 * 1024), "5120.00 TiB");  // TiB at most
  EXPECT_EQ(human_bytes(-2048), "-2.00 KiB");  // a negative difference keeps its sign
  EXPECT_EQ(human_bytes(-5), "-5 B");
}

TEST(UtcTime, FormatsTheGivenInstantInUtc) {
  // 1764775200 s after the epoch is 2025-12-03 15:20:00 UTC (date -u -d @1764775200).
  EXPECT_EQ(utc_time("%Y-%m-%dT%H:%M:%SZ", 1764775200), "2025-12-03T15:20:00Z");
  EXPECT_EQ(utc_time("%Y%m%dT%H%M%SZ", 1764775200), "20251203T152000Z");
  EXPECT_EQ(utc_time("%Y", 0), "1970");
  EXPECT_EQ(utc_time("%Y").size(), 4u);  // now
}

TEST(ProcStatus, RssAndPeakOfThisProcess) {
  const int64_t rss = rss_bytes();
  ASSERT_GT(rss, 0) << "no VmRSS in /proc/self/status";
  EXPECT_EQ(rss % 1024, 0) << "reported in kB";
  std::vector<char> touch(64 << 20, 1);  // 64 MiB resident
  EXPECT_GE(peak_rss_bytes(), rss + (48 << 20)) << "VmHWM did not see 64 MiB touched";
  EXPECT_GE(peak_rss_bytes(), rss_bytes());
  EXPECT_EQ(touch[12345], 1);
  EXPECT_EQ(proc_status_bytes("NoSuchKey"), 0);
}

}  // namespace
}  // namespace qlora
