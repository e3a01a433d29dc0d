// Bad-config corpus: every file in tests/badinput/configs/ must fail load_config with one
// qlora::Error line that starts with `<file>[:line]:` and contains the expected fragment (the key
// name and the problem). Torch-free; runs under ASan+UBSan in the sanitizer build.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>
#include <string>

#include "common/error.h"
#include "tests/test_util.h"
#include "trainer/config/config.h"

namespace qlora {
namespace {

struct Expect {
  int line;              ///< 1-based line named in the message; 0 = the message names no line
  const char* fragment;  ///< must appear in the message
};

/// One entry per file in tests/badinput/configs/ (the test fails on a file without an entry).
const std::map<std::string, Expect>& expectations() {
  static const std::map<std::string, Expect> table = {
      {"blocksize_not_power_of_two.yaml", {8, "quantization.blocksize: expected a power of two in [32, 4096], got 100"}},
      {"colon_in_plain_value.yaml", {1, "YAML syntax error"}},
      {"data_train_list.yaml", {5, "data.train: expected a string, got a list"}},
      {"data_train_missing.yaml", {4, "data.train: required key is missing"}},
      {"dropout_one.yaml", {7, "lora.dropout: expected a number in [0, 1), got 1.0"}},
      {"duplicate_key.yaml", {9, "training.learning_rate: duplicate key (first set on line 7)"}},
      {"duplicate_top_level.yaml", {6, "output_dir: duplicate key (first set on line 1)"}},
      {"empty.yaml", {0, "the config is empty"}},
      {"field_map_value_list.yaml", {6, "data.field_map.instruction: expected a name, got a list"}},
      {"integer_overflow.yaml", {6, "data.sequence_len: expected a positive integer"}},
      {"keep_last_zero.yaml", {7, "checkpoint.keep_last: expected an integer >= 1, got 0"}},
      {"lora_alpha_string.yaml", {8, "lora.alpha: expected a positive number, got \"32\" (a quoted string)"}},
      {"lora_r_negative.yaml", {7, "lora.r: expected a positive integer, got -8"}},
      {"malformed_indent.yaml", {5, "YAML syntax error"}},
      {"malformed_unclosed_flow.yaml", {3, "YAML syntax error"}},
      {"micro_batch_size_string.yaml", {7, "training.micro_batch_size: expected a positive integer, got \"four\""}},
      {"micro_batch_size_zero.yaml", {7, "training.micro_batch_size: expected a positive integer, got 0"}},
      {"misspelt_learning_rate.yaml", {8, "training.lerning_rate: unknown key; did you mean \"learning_rate\"?"}},
      {"model_missing.yaml", {0, "model: required section is missing"}},
      {"negative_learning_rate.yaml", {7, "training.learning_rate: expected a positive number, got -2e-4"}},
      {"nothing_to_train.yaml", {8, "nothing to train"}},
      {"only_comment.yaml", {0, "the config is empty"}},
      {"preset_without_random_init.yaml", {3, "model.preset: a preset has no weights; set model.init: random"}},
      {"section_not_a_map.yaml", {6, "lora: expected a map of keys, got a list"}},
      {"sequence_len_zero.yaml", {6, "data.sequence_len: expected a positive integer, got 0"}},
      {"stray_flow_end.yaml", {2, "YAML syntax error"}},
      {"tab_indentation.yaml", {3, "a tab in the indentation"}},
      {"top_level_list.yaml", {1, "expected a map of sections at the top level, got a list"}},
      {"top_level_scalar.yaml", {1, "expected a map of sections at the top level, got \"just a string\""}},
      {"two_documents.yaml", {7, "expected one YAML document, found 2"}},
      {"undefined_alias.yaml", {7, "YAML syntax error"}},
      {"undefined_env_variable.yaml", {5, "data.train: environment variable QLORA_TEST_UNDEFINED_VARIABLE_16 is not defined"}},
      {"unknown_quant_method.yaml", {7, "quantization.method: expected one of nf4|fp4|none, got \"int4\""}},
      {"unknown_scheduler.yaml", {7, "training.lr_scheduler: expected one of constant|linear|cosine, got \"polynomial\""}},
      {"unknown_target_module.yaml", {7, "lora.target_modules[1]: unknown module \"v_prj\"; did you mean \"v_proj\"?"}},
      {"unknown_template.yaml", {6, "data.template: expected one of alpaca|chatml|llama2|vicuna|none|smollm2|qwen2.5|qwen3|llama3|mistral|auto, got \"chatlm\"; did you mean \"chatml\"?"}},
      {"unknown_top_level_key.yaml", {6, "frobnicate: unknown key"}},
      {"yaml11_boolean.yaml", {7, "training.gradient_checkpointing: expected true or false, got \"yes\""}},
  };
  return table;
}

std::filesystem::path corpus_dir() { return test::source_dir() / "tests" / "badinput" / "configs"; }

TEST(BadInputConfig, EveryCorpusFileFailsWithOneLineNamingFileLineAndKey) {
  std::set<std::string> seen;
  for (const auto& entry : std::filesystem::directory_iterator(corpus_dir())) {
    if (entry.path().extension() != ".yaml") continue;
    const std::string name = entry.path().filename().string();
    seen.insert(name);
    SCOPED_TRACE(name);
    const auto it = expectations().find(name);
    ASSERT_NE(it, expectations().end()) << "add an expectation for " << name;
    const std::string path = entry.path().string();
    try {
      load_config(path);
      ADD_FAILURE() << "loaded without error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      const std::string prefix =
          it->second.line > 0 ? path + ":" + std::to_string(it->second.line) + ": " : path + ": ";
      EXPECT_EQ(msg.rfind(prefix, 0), 0u) << "expected prefix '" << prefix << "' in: " << msg;
      EXPECT_NE(msg.find(it->second.fragment), std::string::npos)
          << "expected '" << it->second.fragment << "' in: " << msg;
    }
  }
  for (const auto& [name, expect] : expectations())
    EXPECT_TRUE(seen.count(name)) << "expectation without a corpus file: " << name;
  EXPECT_GE(seen.size(), 15u);
}

TEST(BadInputConfig, OverridesCannotSmuggleBadValues) {
  const std::string good = (test::source_dir() / "configs" / "tiny" / "qlora.yaml").string();
  const std::map<std::string, std::string> cases = {
      {"lora.r=-1", "--set lora.r=-1: lora.r: expected a positive integer"},
      {"lora={r: 0}", "--set lora={r: 0}: lora.r: expected a positive integer"},
      {"data.train=", "--set data.train=: data.train: expected a non-empty string"},
      {"model={}", "--set model={}: model: set model.path"},
      {"training.seed=-5", "--set training.seed=-5: training.seed: expected an integer >= 0"},
      {"quantization.keep_16bit=[[a]]", "quantization.keep_16bit[0]: expected a name, got a list"},
      {"a.b.c.d=1", "--set a.b.c.d=1: a: unknown key"},
      {"=1", "--set =1: expected section.key=value"},
  };
  for (const auto& [set, fragment] : cases) {
    SCOPED_TRACE(set);
    try {
      load_config(good, {set});
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
    }
  }
}

TEST(BadInputConfig, ArbitraryBytesNeverCrash) {
  // Truncations of a valid config and a few hostile inputs: each either loads or throws qlora::Error.
  std::string text = "output_dir: o\nmodel: {path: m}\ndata: {train: t, field_map: {a: b}}\n"
                     "lora: {target_modules: [q_proj, v_proj]}\ntraining: {learning_rate: 1e-4}\n";
  std::vector<std::string> inputs;
  for (size_t n = 0; n <= text.size(); ++n) inputs.push_back(text.substr(0, n));
  inputs.push_back(std::string(1, '\0') + "x");
  inputs.push_back(std::string(2000, '['));
  inputs.push_back("? [a, b]\n: c\n");
  inputs.push_back("&a [*a]\n");
  inputs.push_back("output_dir: !!binary aGVsbG8=\n");
  inputs.push_back("\xff\xfe\x00o\x00u\x00t");
  for (const auto& in : inputs) {
    try {
      parse_config_string(in, "fuzz.yaml");
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "non-qlora exception for input of " << in.size() << " bytes: " << e.what();
    }
  }
}

}  // namespace
}  // namespace qlora
