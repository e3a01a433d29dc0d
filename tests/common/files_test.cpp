// common/files.h: sampled_file_digest, the cheap file identity a resume compares a moved model by.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>
#include <unistd.h>

#include "common/error.h"
#include "common/files.h"
#include "tests/test_util.h"

namespace qlora {
namespace {

namespace fs = std::filesystem;

// remove_tree: what std::filesystem::remove_all does (which no program here may call: torch
// 2.11.0+cu130 exports a copy of it that segfaults, docs/gpu.md), checked against the file system.
TEST(RemoveTree, RemovesATreeWithoutFollowingLinksAndCountsWhatItRemoved) {
  const fs::path root = fs::temp_directory_path() / ("qlora_remove_tree_" + std::to_string(::getpid()));
  const fs::path keep = root.string() + "_outside";
  qlora::remove_tree(root);
  qlora::remove_tree(keep);
  fs::create_directories(root / "a" / "b");
  fs::create_directories(keep);
  std::ofstream(root / "a" / "b" / "f") << "x";
  std::ofstream(root / "g") << "y";
  std::ofstream(keep / "precious") << "z";
  fs::create_directory_symlink(keep, root / "a" / "link_to_dir");
  fs::create_symlink(keep / "precious", root / "link_to_file");
  // root, a, b, f, g, two links: 7 entries; the links' targets stay
  EXPECT_EQ(qlora::remove_tree(root), 7u);
  EXPECT_FALSE(fs::exists(fs::symlink_status(root)));
  EXPECT_TRUE(fs::exists(keep / "precious"));
  EXPECT_EQ(qlora::remove_tree(root), 0u);  // missing: nothing to do
  std::error_code ec;
  EXPECT_EQ(qlora::remove_tree(root, ec), 0u);
  EXPECT_FALSE(ec);
  // a link given as the path: the link goes, its target stays
  fs::create_directory_symlink(keep, root);
  EXPECT_EQ(qlora::remove_tree(root), 1u);
  EXPECT_TRUE(fs::exists(keep / "precious"));
  // a plain file
  EXPECT_EQ(qlora::remove_tree(keep / "precious"), 1u);
  if (::geteuid() != 0) {  // root removes from a read-only directory anyway
    fs::create_directories(keep / "ro" / "d");
    fs::permissions(keep / "ro", fs::perms::owner_read | fs::perms::owner_exec);
    try {
      qlora::remove_tree(keep / "ro");
      ADD_FAILURE() << "removed from a read-only directory";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cannot remove " + (keep / "ro" / "d").string() + ": Permission denied"),
                std::string::npos) << e.what();
    }
    EXPECT_EQ(qlora::remove_tree(keep / "ro", ec), static_cast<std::uintmax_t>(-1));
    EXPECT_EQ(ec, std::errc::permission_denied);
    fs::permissions(keep / "ro", fs::perms::owner_all);
  }
  // an entry that cannot be stat'ed: a path through a file
  try {
    std::ofstream(keep / "file") << "q";
    qlora::remove_tree(keep / "file" / "below");
    SUCCEED();  // ENOTDIR on stat: reported, or 0 on a system that says ENOENT
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot remove " + (keep / "file" / "below").string()), std::string::npos);
  }
  EXPECT_GE(qlora::remove_tree(keep), 1u);
  EXPECT_FALSE(fs::exists(keep));
}

// No source calls std::filesystem::remove_all: a program linked with torch would bind it to the
// wheel's copy (the H200 segfault). Each file's text is searched for the call.
TEST(RemoveTree, NoSourceCallsStdRemoveAll) {
  const std::string call = std::string("remove_all") + "(";
  int scanned = 0;
  for (const char* dir : {"adapters", "cli", "common", "config", "data", "kernels", "model", "trainer", "tests", "bench"}) {
    for (const auto& e : fs::recursive_directory_iterator(qlora::test::source_dir() / dir)) {
      const std::string ext = e.path().extension().string();
      if (!e.is_regular_file() || (ext != ".cpp" && ext != ".h" && ext != ".cu" && ext != ".cuh")) continue;
      std::ifstream in(e.path());
      const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      EXPECT_EQ(text.find(call), std::string::npos) << e.path() << " calls std::filesystem::remove_all: use qlora::remove_tree";
      ++scanned;
    }
  }
  EXPECT_GT(scanned, 100);
}

class SampledDigest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fs::temp_directory_path() / ("qlora_files_test_" + std::to_string(::getpid()));
    qlora::remove_tree(dir);
    fs::create_directories(dir);
  }
  void TearDown() override { qlora::remove_tree(dir); }
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
