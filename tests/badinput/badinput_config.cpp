// Bad-config corpus: every file in tests/badinput/configs/ must fail load_config with one
// qlora::Error line that starts with `<file>[:line]:` and contains the expected fragment (the key
// name and the problem). Torch-free; runs under ASan+UBSan in the sanitizer build.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "common/error.h"
#include "tests/badinput/config_expectations.h"
#include "tests/test_util.h"
#include "config/config.h"
#include "data/dataset.h"
#include "data/tokenizer.h"

namespace qlora {
namespace {
namespace fs = std::filesystem;

std::filesystem::path corpus_dir() { return test::source_dir() / "tests" / "badinput" / "configs"; }

TEST(BadInputConfig, EveryCorpusFileFailsWithOneLineNamingFileLineAndKey) {
  std::set<std::string> seen;
  for (const auto& entry : std::filesystem::directory_iterator(corpus_dir())) {
    if (entry.path().extension() != ".yaml") continue;
    const std::string name = entry.path().filename().string();
    seen.insert(name);
    SCOPED_TRACE(name);
    const auto it = test::bad_config_expectations().find(name);
    ASSERT_NE(it, test::bad_config_expectations().end()) << "add an expectation for " << name;
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
  for (const auto& [name, expect] : test::bad_config_expectations())
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

// A data file that does not exist is named by its entry's key and the config's file:line
// (with_key_sources over data::load_datasets, as `qlora train` / `eval` / `data preview` call it);
// every missing file of data.train and data.eval at once, before any is read.
TEST(BadInputConfig, MissingDataFilesNameTheirEntryLine) {
  const test::TempDir tmp("missing_data");
  const fs::path dir = tmp.path;
  fs::create_directories(dir / "tok");
  fs::copy_file(test::source_dir() / "tests/badinput/tokenizers/valid_rich.json", dir / "tok" / "tokenizer.json");
  const data::Tokenizer tok = data::Tokenizer::from_pretrained((dir / "tok").string());
  std::ofstream(dir / "a.jsonl") << R"({"instruction": "hi", "output": "ho"})" << "\n";
  const std::string a = (dir / "a.jsonl").string(), y = (dir / "y.json").string(), z = (dir / "z.jsonl").string(),
                    e = (dir / "e.jsonl").string();
  const fs::path cfg = dir / "config.yaml";
  std::ofstream(cfg) << "output_dir: o\nmodel: {path: m}\ndata:\n  train:\n    - " << a << "\n    - " << y
                     << "\n    - {path: " << z << ", format: alpaca}\n  eval: " << e << "\n";
  const Config c = load_config(cfg.string());
  auto load = [&](const Config& conf) { with_key_sources(conf, [&] { return data::load_datasets(conf.data, tok); }); };
  try {
    load(c);
    ADD_FAILURE() << "loaded";
  } catch (const ErrorList& err) {
    EXPECT_EQ(err.lines(), (std::vector<std::string>{cfg.string() + ":6: data.train[1]: no such file: " + y,
                                                     cfg.string() + ":7: data.train[2]: no such file: " + z,
                                                     cfg.string() + ":8: data.eval: no such file: " + e}));
  }
  // One file: one plain line; a --set names itself; a directory is said to be one.
  EXPECT_EQ(test::error_of([&] { load(load_config(cfg.string(), {"data.eval=" + a, "data.train=[" + a + ", " + z + "]"})); }),
            "--set data.train=[" + a + ", " + z + "]: data.train[1]: no such file: " + z);
  std::ofstream(cfg, std::ios::trunc) << "output_dir: o\nmodel: {path: m}\ndata:\n  train: " << y << "\n";
  EXPECT_EQ(test::error_of([&] { load(load_config(cfg.string())); }),
            cfg.string() + ":4: data.train: no such file: " + y);
  EXPECT_EQ(test::error_of([&] { load(load_config(cfg.string(), {"data.train=" + dir.string()})); }),
            "--set data.train=" + dir.string() + ": data.train: " + dir.string() +
                " is a directory, expected a data file (.json, .jsonl or .txt)");
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
      // One error a line (a config with several gives them all), each naming the file.
      std::istringstream lines(e.what());
      for (std::string line; std::getline(lines, line);) EXPECT_EQ(line.rfind("fuzz.yaml", 0), 0u) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "non-qlora exception for input of " << in.size() << " bytes: " << e.what();
    }
  }
}

}  // namespace
}  // namespace qlora
