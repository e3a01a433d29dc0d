// Malformed safetensors corpus: each hand-made file is rejected with its own one-line message
// naming the file (and the tensor where there is one). Torch-free; also runs under ASan+UBSan.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "common/safetensors.h"
#include "test_util.h"

namespace {
namespace fs = std::filesystem;

std::string with_len(const std::string& header, uint64_t len, const std::string& data = "") {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((len >> (8 * i)) & 0xff);
  return s + header + data;
}
std::string file_of(const std::string& header, const std::string& data = "") {
  return with_len(header, header.size(), data);
}

struct Case {
  const char* name;
  std::string bytes;
  const char* expect;  // fragment of the message
};

class MalformedSafetensors : public ::testing::TestWithParam<Case> {};

TEST_P(MalformedSafetensors, RejectedWithClearMessage) {
  const Case& c = GetParam();
  const qlora::test::TempDir dir("bad_st");
  const fs::path p = dir.path / (std::string(c.name) + ".safetensors");
  std::ofstream(p, std::ios::binary) << c.bytes;
  qlora::test::expect_file_error(p.string(), c.expect, c.name, [&] { qlora::st::SafetensorsFile f(p.string()); });
}

const std::string k8(8, 'x');  // 8 data bytes

INSTANTIATE_TEST_SUITE_P(
    Corpus, MalformedSafetensors,
    ::testing::Values(
        Case{"empty", "", "shorter than the 8-byte header length"},
        Case{"short", "abcde", "shorter than the 8-byte header length"},
        Case{"header_past_eof", with_len("{}", 4096), "runs past the end of the file"},
        Case{"header_too_big", with_len("{}", 200ull * 1000 * 1000), "exceeds the 100000000-byte limit"},
        Case{"not_json", file_of("{\"a\": [1, 2"), "header is not valid JSON"},
        Case{"not_object", file_of("[1, 2, 3]"), "header is not a JSON object"},
        Case{"unknown_dtype", file_of(R"({"w":{"dtype":"F8","shape":[2],"data_offsets":[0,2]}})", "xx"),
             "tensor 'w': unknown dtype 'F8'"},
        Case{"offset_past_buffer", file_of(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", k8),
             "tensor 'w': data_offsets end 16 is past the data buffer"},
        Case{"begin_after_end", file_of(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[4,2]}})", k8),
             "tensor 'w': data_offsets begin 4 > end 2"},
        Case{"size_mismatch", file_of(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,8]}})", k8),
             "tensor 'w': byte size 8 != numel 4 x 4 bytes"},
        Case{"overlap",
             file_of(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})", k8),
             "tensor 'b': data overlaps tensor 'a'"},
        Case{"duplicate",
             file_of(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})", k8),
             "tensor 'a': duplicate name"},
        Case{"negative_dim", file_of(R"({"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", k8),
             "tensor 'w': shape has a non-integer or negative dimension"},
        Case{"missing_offsets", file_of(R"({"w":{"dtype":"U8","shape":[1]}})", k8),
             "tensor 'w': 'data_offsets' is not [begin, end]"},
        Case{"float_offsets", file_of(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0.5,1]}})", k8),
             "tensor 'w': 'data_offsets' has a non-integer"},
        Case{"shape_overflow",
             file_of(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}})", k8),
             "tensor 'w': shape overflows"},
        Case{"bad_metadata", file_of(R"({"__metadata__":{"format":1}})"), "__metadata__ 'format': value is not a string"},
        Case{"entry_not_object", file_of(R"({"w":[1,2]})"), "tensor 'w': entry is not an object"},
        Case{"dtype_not_string", file_of(R"({"w":{"dtype":7,"shape":[1],"data_offsets":[0,1]}})", k8),
             "tensor 'w': missing or non-string 'dtype'"}),
    [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

TEST(MalformedSafetensorsDir, MissingDirectoryAndFile) {
  EXPECT_THROW(qlora::st::SafetensorsCheckpoint("/nonexistent/dir"), qlora::Error);
  const qlora::test::TempDir tmp("bad_st_dir");
  const fs::path& dir = tmp.path;
  try {
    qlora::st::SafetensorsCheckpoint c(dir.string());
    ADD_FAILURE();
  } catch (const qlora::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no model.safetensors"), std::string::npos) << e.what();
  }
  std::ofstream(dir / "model.safetensors.index.json") << R"({"weight_map": {"w": "../../etc/passwd"}})";
  try {
    qlora::st::SafetensorsCheckpoint c(dir.string());
    ADD_FAILURE();
  } catch (const qlora::Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a file in this directory"), std::string::npos) << e.what();
  }
}

}  // namespace
