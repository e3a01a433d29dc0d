// Bad-input corpus for the data readers (tests/badinput/data/*): every file fails with
// `file:line: problem`, or with skip_invalid is skipped and counted. Torch-free; also run
// under ASan+UBSan by scripts/test.sh.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "common/error.h"
#include "data/reader.h"
#include "tests/test_util.h"

using namespace qlora::data;
namespace fs = std::filesystem;

namespace {
fs::path corpus(const std::string& name) { return qlora::test::source_dir() / "tests/badinput/data" / name; }

std::string error_of(const fs::path& p, DataOptions o = {}) {
  ReadStats st;
  try {
    read_records(p.string(), o, &st);
  } catch (const qlora::Error& e) {
    return e.what();
  }
  return "";
}

void expect_error(const std::string& name, const std::string& line_and_problem) {
  const fs::path p = corpus(name);
  const std::string msg = error_of(p);
  EXPECT_EQ(msg.rfind(p.string() + ":" + line_and_problem, 0), 0u) << name << " -> " << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
}

int64_t skipped(const std::string& name, const std::string& reason, size_t* kept) {
  DataOptions o;
  o.skip_invalid = true;
  ReadStats st;
  *kept = read_records(corpus(name).string(), o, &st).size();
  EXPECT_EQ(st.skip_reasons[reason], st.skipped_invalid) << name;
  return st.skipped_invalid;
}
}  // namespace

TEST(BadInputData, EachFileNamesFileLineAndProblem) {
  expect_error("malformed_line.jsonl", "2: invalid JSON");
  expect_error("wrong_type.json", "3: field 'instruction' must be a string, got number");
  expect_error("missing_field.jsonl", "2: missing field 'output'");
  expect_error("empty_string.jsonl", "1: conversations[1].value is an empty string");
  expect_error("non_utf8.jsonl", "2: invalid JSON");
  expect_error("non_utf8.txt", "3: invalid UTF-8 bytes in text");
  expect_error("empty.json", "1: empty file (no records)");
  expect_error("unterminated.json", "3: unterminated string");
  expect_error("number_overflow.jsonl", "2: invalid JSON: number overflow");  // found by fuzz_dataset
  EXPECT_NE(error_of("/nonexistent/x.json").find("/nonexistent/x.json: dataset file not found"), std::string::npos);
}

TEST(BadInputData, SkipInvalidCounts) {
  size_t kept = 0;
  EXPECT_EQ(skipped("malformed_line.jsonl", "invalid JSON", &kept), 1);
  EXPECT_EQ(kept, 1u);
  EXPECT_EQ(skipped("wrong_type.json", "wrong type", &kept), 1);
  EXPECT_EQ(skipped("missing_field.jsonl", "missing field", &kept), 1);
  EXPECT_EQ(skipped("non_utf8.jsonl", "invalid UTF-8", &kept), 1);
  EXPECT_EQ(skipped("non_utf8.txt", "invalid UTF-8", &kept), 1);
  EXPECT_EQ(kept, 1u);
  DataOptions o;
  o.skip_invalid = true;
  ReadStats st;  // every record invalid: still an error
  EXPECT_THROW(read_records(corpus("empty_string.jsonl").string(), o, &st), qlora::Error);
}

TEST(BadInputData, TenMegabyteLine) {
  const fs::path dir = fs::temp_directory_path() / ("qlora_bad_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string big(10 << 20, 'x');
  {
    std::ofstream(dir / "big_ok.jsonl") << R"({"text": ")" << big << "\"}\n";
    std::ofstream(dir / "big_bad.jsonl") << "{\"text\": \"ok\"}\n{\"text\": \"" << big << "\n";
  }
  ReadStats st;
  const auto recs = read_records((dir / "big_ok.jsonl").string(), DataOptions{}, &st);
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs[0].text.size(), big.size());
  const std::string msg = error_of(dir / "big_bad.jsonl");
  EXPECT_EQ(msg.rfind((dir / "big_bad.jsonl").string() + ":2: invalid JSON", 0), 0u) << msg.substr(0, 300);
  EXPECT_LT(msg.size(), 1000u) << "the message must not echo the 10 MB line";
  fs::remove_all(dir);
}
