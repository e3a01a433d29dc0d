// common/files.h: sampled_file_digest, the cheap file identity a resume compares a moved model by.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

#include "common/error.h"
#include "common/files.h"

namespace qlora {
namespace {

namespace fs = std::filesystem;

class SampledDigest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fs::temp_directory_path() / ("qlora_files_test_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  void TearDown() override { fs::remove_all(dir); }
  std::string write(const std::string& name, const std::string& bytes) {
    const std::string p = (dir / name).string();
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  fs::path dir;
};

// A file of at most 2 MiB is hashed whole: FIPS 180-2's "abc" vector.
TEST_F(SampledDigest, SmallFileIsItsWholeSha256) {
  EXPECT_EQ(sampled_file_digest(write("abc", "abc")),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const std::string two(2u << 20, 'x');
  EXPECT_EQ(sampled_file_digest(write("two", two)), "sha256:" + sha256_hex(two));
  EXPECT_THROW(sampled_file_digest((dir / "absent").string()), Error);
}

// A larger file: SHA-256 over its size (8 bytes LE), its first MiB and 16 chunks of 64 KiB at
// offsets (size - 64 KiB) * i / 15 (the last one ends at the end). Other bytes in a sample change
// it; a byte outside every sample does not (the documented limit).
TEST_F(SampledDigest, LargeFileHashesSizeHeadAndSixteenChunks) {
  const uint64_t size = (5u << 20) + 12345, chunk = 64u << 10;
  std::string bytes(size, '\0');
  for (uint64_t i = 0; i < size; ++i) bytes[i] = static_cast<char>((i * 2654435761u) >> 13);
  std::string expect;
  for (int i = 0; i < 8; ++i) expect += static_cast<char>(size >> (8 * i));
  expect += bytes.substr(0, 1u << 20);
  for (uint64_t i = 0; i < 16; ++i) expect += bytes.substr((size - chunk) * i / 15, chunk);
  const std::string d = sampled_file_digest(write("big", bytes));
  EXPECT_EQ(d, "sampled-sha256:" + sha256_hex(expect));

  std::string tail = bytes;
  tail[size - 1] ^= 1;  // in the last chunk
  EXPECT_NE(sampled_file_digest(write("tail", tail)), d);
  std::string head = bytes;
  head[100] ^= 1;
  EXPECT_NE(sampled_file_digest(write("head", head)), d);
  std::string longer = bytes + "x";
  EXPECT_NE(sampled_file_digest(write("longer", longer)), d);
  // A byte halfway between chunks 4 and 5 (past the first MiB) is in no sample.
  const uint64_t gap = ((size - chunk) * 4 / 15 + chunk + (size - chunk) * 5 / 15) / 2;
  ASSERT_GT(gap, (size - chunk) * 4 / 15 + chunk);
  ASSERT_LT(gap, (size - chunk) * 5 / 15);
  std::string unseen = bytes;
  unseen[gap] ^= 1;
  EXPECT_EQ(sampled_file_digest(write("unseen", unseen)), d);
}

}  // namespace
}  // namespace qlora
