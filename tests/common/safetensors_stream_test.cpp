// Streaming safetensors writer: tensors requested one at a time in order, the file equal to what
// write_safetensors writes for the same tensors, and a throwing producer leaves nothing behind.
#include <gtest/gtest.h>

#include <filesystem>

#include "common/error.h"
#include "common/files.h"
#include "common/safetensors_stream.h"
#include "test_util.h"

namespace {
namespace fs = std::filesystem;
using namespace qlora::st;

TEST(SafetensorsStream, OneTensorAtATimeSameBytesAsWriteSafetensors) {
  const fs::path dir = qlora::test::fresh_temp_dir("st_stream");
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  std::vector<uint16_t> b = {7, 8};
  std::vector<TensorToWrite> ts = {{"a", DType::F32, {2, 3}, a.data(), 24}, {"b", DType::BF16, {2}, b.data(), 4}};
  write_safetensors((dir / "whole.safetensors").string(), ts, {{"format", "pt"}});
  std::vector<size_t> asked;
  std::vector<float> scratch;
  write_safetensors_streaming(
      (dir / "stream.safetensors").string(), ts,
      [&](size_t i) -> const void* {
        asked.push_back(i);
        if (i == 0) {
          scratch = a;  // produced on demand
          return scratch.data();
        }
        return b.data();
      },
      {{"format", "pt"}});
  EXPECT_EQ(asked, (std::vector<size_t>{0, 1}));
  EXPECT_EQ(qlora::read_file((dir / "stream.safetensors").string()), qlora::read_file((dir / "whole.safetensors").string()));
  SafetensorsFile f((dir / "stream.safetensors").string());
  EXPECT_EQ(f.info("a").shape, (std::vector<int64_t>{2, 3}));
  qlora::remove_tree(dir);
}

TEST(SafetensorsStream, ProducerErrorLeavesNoFile) {
  const fs::path dir = qlora::test::fresh_temp_dir("st_stream_err");
  std::vector<float> a(4, 1.f);
  std::vector<TensorToWrite> ts = {{"a", DType::F32, {4}, nullptr, 16}, {"b", DType::F32, {4}, nullptr, 16}};
  EXPECT_THROW(write_safetensors_streaming((dir / "x.safetensors").string(), ts,
                                           [&](size_t i) -> const void* {
                                             if (i == 1) qlora::fail("tensor 'b': cannot produce");
                                             return a.data();
                                           }),
               qlora::Error);
  EXPECT_TRUE(fs::is_empty(dir));
  qlora::remove_tree(dir);
}

}  // namespace
