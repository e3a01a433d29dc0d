// GGUF reader: metadata of every value type and tensor infos as gguf-py's GGUFWriter wrote them
// (fixture gguf/dequant.gguf, alignment 64), and the SmolLM2 file's header as gguf-py reads it.
#include <gtest/gtest.h>

#include <cstdlib>

#include "common/error.h"
#include "common/gguf.h"
#include "test_util.h"

namespace {
using namespace qlora::gguf;

TEST(GgufReader, ReadsEveryValueTypeWrittenByGgufPy) {
  QLORA_REQUIRE_FIXTURE(file, "gguf/dequant.gguf");
  GgufFile f(file.string());
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset() % 64, 0u);
  EXPECT_EQ(f.get_string("general.architecture"), "test");
  EXPECT_EQ(f.get_uint("test.u8"), 200u);
  EXPECT_EQ(f.find("test.i8")->i, -100);
  EXPECT_EQ(f.get_uint("test.u16"), 60000u);
  EXPECT_EQ(f.find("test.i16")->i, -30000);
  EXPECT_EQ(f.get_uint("test.u32"), 4000000000u);
  EXPECT_EQ(f.find("test.i32")->i, -2000000000);
  EXPECT_EQ(f.get_float("test.f32"), static_cast<double>(0.1f));
  EXPECT_EQ(f.get_uint("test.u64"), uint64_t{1} << 40);
  EXPECT_EQ(f.find("test.i64")->i, -(int64_t{1} << 40));
  EXPECT_EQ(f.get_float("test.f64"), 0.1);
  EXPECT_TRUE(f.get_bool("test.bool"));
  EXPECT_EQ(f.get_string("test.str"), "h\xc3\xa9llo");
  EXPECT_EQ(f.get_int_array("test.arr_i32"), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(f.get_string_array("test.arr_str"), (std::vector<std::string>{"a", "", "\xc3\xbc"}));
  EXPECT_EQ(f.find("test.arr_f32")->floats, (std::vector<double>{0.5, -1.25}));
  EXPECT_THROW(f.get_uint("test.i8"), qlora::Error);  // negative
  try {
    f.get_string("test.u8");
    ADD_FAILURE();
  } catch (const qlora::Error& e) {
    EXPECT_EQ(std::string(e.what()), file.string() + ": metadata key 'test.u8': expected STRING, got UINT8");
  }
  try {
    f.get_uint("no.such.key");
    ADD_FAILURE();
  } catch (const qlora::Error& e) {
    EXPECT_EQ(std::string(e.what()), file.string() + ": metadata key 'no.such.key': missing");
  }
  const TensorInfo* t = f.find_tensor("r.Q4_K");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->type, GgmlType::Q4_K);
  EXPECT_EQ(t->shape(), (std::vector<int64_t>{3, 512}));
  EXPECT_EQ(t->nbytes, 3u * 2 * 144);
  EXPECT_EQ(t->offset % 64, 0u);
}

TEST(GgufReader, SmolLM2Header) {
  const char* env = std::getenv("QLORA_SMOLLM2_GGUF");
  const std::string path = env ? env : std::string(std::getenv("HOME")) + "/.cache/qlora-cpp/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path)) FAIL() << path << ": missing (run scripts/setup.sh)";
  GgufFile f(path);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.tensors().size(), 272u);
  EXPECT_EQ(f.metadata().size(), 33u);  // gguf-py lists 36 fields: these and 3 header pseudo-fields
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_uint("llama.block_count"), 30u);
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.tokens").size(), 49152u);
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.merges").size(), 48900u);
  const TensorInfo* e = f.find_tensor("token_embd.weight");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->type, GgmlType::Q8_0);
  EXPECT_EQ(e->shape(), (std::vector<int64_t>{49152, 576}));
  EXPECT_EQ(f.data_offset() + e->offset, 1785664u);  // gguf-py ReaderTensor.data_offset
}

}  // namespace
