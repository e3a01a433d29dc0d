// Bad-input corpus for HF tokenizer.json (tests/badinput/tokenizers/*.json): every malformed
// file is refused with one line `<file>: <JSON path>: <problem>`; truncations and byte flips of a
// valid file never crash (only qlora::Error may escape). Torch-free; also run under ASan+UBSan by
// scripts/test.sh.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>

#include "common/files.h"
#include "common/error.h"
#include "data/tokenizer.h"
#include "tests/test_util.h"

using qlora::data::Tokenizer;
namespace fs = std::filesystem;

namespace {
fs::path corpus(const std::string& name) { return qlora::test::source_dir() / "tests/badinput/tokenizers" / name; }

std::string error_of(const fs::path& p) {
  try {
    Tokenizer t(p.string());
  } catch (const qlora::Error& e) {
    return e.what();
  }
  return "";
}

void expect_error(const std::string& name, const std::string& path_and_problem) {
  const fs::path p = corpus(name);
  const std::string msg = error_of(p);
  EXPECT_EQ(msg.rfind(p.string() + ": " + path_and_problem, 0), 0u) << name << " -> " << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
}

std::string read(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
}  // namespace

TEST(BadInputTokenizer, EachFileNamesFileJsonPathAndProblem) {
  // where the text stops, line:column (common/json_file.h)
  EXPECT_EQ(error_of(corpus("truncated.json")),
            corpus("truncated.json").string() + ":85:6: invalid JSON: syntax error while parsing value - unexpected end of "
                                                "input; expected '[', '{', or a literal; the file ends there (cut short?)");
  expect_error("empty.json", "empty file, not JSON");
  EXPECT_EQ(error_of(corpus("top_level_array.json")),
            corpus("top_level_array.json").string() + ":1: expected a JSON object at top level, got array");
  expect_error("model_missing.json", "model: missing");
  expect_error("vocab_wrong_type.json", "model.vocab: expected an object, got array");
  expect_error("vocab_id_string.json", "model.vocab.a: expected an integer, got string");
  expect_error("unknown_model.json", "model.type: unsupported 'WordPiece' (supported: BPE)");
  expect_error("unknown_pretokenizer.json", "pre_tokenizer.pretokenizers[1].type: unsupported 'Whitespace'");
  expect_error("unknown_normalizer.json", "normalizer.type: unsupported 'Lowercase'");
  expect_error("unknown_decoder.json", "decoder.decoders[2].type: unsupported 'WordPiece'");
  expect_error("unknown_post_processor.json", "post_processor.type: unsupported 'RobertaProcessing'");
  expect_error("merge_unknown_token.json", "model.merges[0]: merge names unknown token 'z'");
  expect_error("merge_bad_format.json", "model.merges[0]: expected \"left right\" (one space), got 'a b c'");
  expect_error("merge_wrong_type.json", "model.merges[1]: expected \"left right\" or [\"left\", \"right\"], got 42");
  expect_error("merged_not_in_vocab.json", "model.merges[2]: merged token 'ba' is not in the vocab");
  expect_error("duplicate_vocab_id.json", "model.vocab.c: duplicate id 1 (also 'a')");
  expect_error("duplicate_added_id.json", "added_tokens[2].id: duplicate id 7");
  expect_error("added_id_conflicts_vocab.json", "added_tokens[1].id: id 1 but the model vocab has '<x>' = 7");
  expect_error("added_token_not_object.json", "added_tokens[0]: expected an object, got string");
  expect_error("added_token_empty.json", "added_tokens[1].content: empty");
  expect_error("bad_regex.json", "pre_tokenizer.pretokenizers[0].pattern.Regex: regex rejected by PCRE2 at offset");
  expect_error("huge_id.json", "model.vocab.a: value 99999999999 out of range");
  expect_error("negative_id.json", "model.vocab.b: value -3 out of range");
  expect_error("float_id.json", "added_tokens[0].id: expected an integer, got number");
  expect_error("dropout.json", "model.dropout: unsupported BPE dropout 0.1 (must be null)");
  expect_error("template_unknown_special.json",
               "post_processor.processors[1].single[0].SpecialToken.id: '<q>' not in post_processor.processors[1].special_tokens");
  expect_error("template_huge_id.json", "post_processor.processors[1].special_tokens.<s>.ids[0]: value 1099511627776 out of range");
  expect_error("split_bad_behavior.json", "pre_tokenizer.pretokenizers[0].behavior: unsupported 'Sideways'");
  expect_error("metaspace_bad_scheme.json", "pre_tokenizer.pretokenizers[2].prepend_scheme: unsupported 'sometimes'");
  expect_error("metaspace_two_chars.json", "pre_tokenizer.pretokenizers[2].replacement: expected one character, got 'ab'");
  expect_error("bool_as_string.json", "model.byte_fallback: expected true/false, got string");
  expect_error("strip_negative.json", "decoder.decoders[4].start: value -1 out of range");
  EXPECT_NE(error_of("/nonexistent/tokenizer.json").find("/nonexistent/tokenizer.json: tokenizer.json not found"),
            std::string::npos);
}

// The valid base file loads and runs every component it names.
TEST(BadInputTokenizer, ValidRichFileWorks) {
  const Tokenizer t(corpus("valid_rich.json").string());
  EXPECT_EQ(t.vocab_size(), 10);
  const auto ids = t.encode_with_special_tokens("abc ab<x> 12\tA\xff");
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], 0);
  (void)t.decode(ids, false);
  (void)t.decode(ids, true);
}

// Truncations and byte flips of a valid file: loading either works or throws qlora::Error (any
// other exception or a crash fails); what loads must encode and decode without crashing.
TEST(BadInputTokenizer, TruncationsAndByteFlipsNeverCrash) {
  const std::string good = read(corpus("valid_rich.json"));
  ASSERT_GT(good.size(), 1000u);
  const fs::path dir = qlora::test::fresh_temp_dir("tok_fuzz");
  const fs::path p = dir / "tokenizer.json";
  int loaded = 0, refused = 0;
  auto attempt = [&](const std::string& bytes) {
    std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
    try {
      const Tokenizer t(p.string());
      ++loaded;
      for (const char* s : {"", "abc", " a b c ", "\xe4\xbd\xa0 12345 <x><s>", "\xf0\x9f\xa4", "\t\t  \n"}) {
        const auto ids = t.encode_with_special_tokens(s);
        std::vector<int64_t> offs;
        t.encode_with_offsets(s, &offs, false);
        (void)t.decode(ids, false);
        (void)t.decode({-1, 0, 1, 2, 3, 1 << 30}, true);
      }
    } catch (const qlora::Error& e) {
      ++refused;
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
  };
  for (size_t n = 0; n < good.size(); n += 5) attempt(good.substr(0, n));
  std::mt19937 rng(1234);
  const char flips[] = {'\0', '"', '{', '}', '[', ']', ',', ':', '-', '9', 'x', '\\', '\xff', '\x80', ' '};
  for (int k = 0; k < 1500; ++k) {
    std::string b = good;
    const int changes = 1 + static_cast<int>(rng() % 3);
    for (int c = 0; c < changes; ++c) b[rng() % b.size()] = flips[rng() % sizeof(flips)];
    attempt(b);
  }
  EXPECT_GT(refused, 0);
  EXPECT_GT(loaded, 0);
  qlora::remove_tree(dir);
}

// The JSON files beside tokenizer.json: wrong id types name the file and key.
TEST(BadInputTokenizer, GenerationAndTokenizerConfigErrors) {
  const fs::path dir = qlora::test::fresh_temp_dir("tok_cfg");
  fs::copy_file(corpus("valid_rich.json"), dir / "tokenizer.json");
  auto err = [&]() -> std::string {
    try {
      Tokenizer::from_pretrained(dir.string());
    } catch (const qlora::Error& e) {
      return e.what();
    }
    return "";
  };
  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": [2, "x"]})";
  EXPECT_EQ(err(), (dir / "generation_config.json").string() + ": eos_token_id[1]: expected an integer token id, got string");
  std::ofstream(dir / "generation_config.json", std::ios::trunc) << R"({"eos_token_id": -4})";
  EXPECT_EQ(err(), (dir / "generation_config.json").string() + ": eos_token_id: token id -4 out of range");
  std::ofstream(dir / "generation_config.json", std::ios::trunc) << R"({"eos_token_id": [3, 2]})";
  EXPECT_EQ(err(), "");
  EXPECT_EQ(Tokenizer::from_pretrained(dir.string()).eos_ids(), (std::vector<int32_t>{3, 2}));
  std::ofstream(dir / "tokenizer_config.json") << R"({"eos_token": "<nope>"})";
  EXPECT_EQ(err(), (dir / "tokenizer_config.json").string() +
                       ":1: special token '<nope>' is neither in tokenizer.json nor in added_tokens_decoder");
  std::ofstream(dir / "tokenizer_config.json", std::ios::trunc) << "{not json";
  EXPECT_EQ(err().rfind((dir / "tokenizer_config.json").string() + ":1:3: invalid JSON: syntax error while parsing object key", 0), 0u)
      << err();
  // the keys that choose transformers' LlamaTokenizer pipeline (data/tokenizer.h)
  std::ofstream(dir / "tokenizer_config.json", std::ios::trunc) << R"({"tokenizer_class": 7})";
  EXPECT_EQ(err(), (dir / "tokenizer_config.json").string() + ": tokenizer_class: expected a string, got number");
  std::ofstream(dir / "tokenizer_config.json", std::ios::trunc) << R"({"tokenizer_class": "LlamaTokenizer", "legacy": "no"})";
  EXPECT_EQ(err(), (dir / "tokenizer_config.json").string() + ": legacy: expected true/false, got string");
  std::ofstream(dir / "tokenizer_config.json", std::ios::trunc)
      << R"({"tokenizer_class": "LlamaTokenizerFast", "add_prefix_space": 1})";
  EXPECT_EQ(err(), (dir / "tokenizer_config.json").string() + ": add_prefix_space: expected true/false, got number");
  std::ofstream(dir / "tokenizer_config.json", std::ios::trunc) << R"({"tokenizer_class": "LlamaTokenizer", "legacy": null})";
  EXPECT_EQ(err(), "");
  // ... and config.json's, which transformers reads too (class fallback, model_type)
  std::ofstream(dir / "config.json") << R"({"model_type": ["mistral"]})";
  EXPECT_EQ(err(), (dir / "config.json").string() + ": model_type: expected a string, got array");
  std::ofstream(dir / "tokenizer_config.json", std::ios::trunc) << "{}";
  std::ofstream(dir / "config.json", std::ios::trunc) << R"({"tokenizer_class": false})";
  EXPECT_EQ(err(), (dir / "config.json").string() + ": tokenizer_class: expected a string, got boolean");
  std::ofstream(dir / "config.json", std::ios::trunc) << "[1]";
  EXPECT_EQ(err(), (dir / "config.json").string() + ":1: expected a JSON object at top level, got array");
  std::ofstream(dir / "config.json", std::ios::trunc) << R"({"model_type": "mistral", "tokenizer_class": "LlamaTokenizer"})";
  EXPECT_EQ(err(), "");
  qlora::remove_tree(dir);
}
