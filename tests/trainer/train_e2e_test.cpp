// `qlora train` / `qlora eval` / `qlora generate --adapter` end to end through the built binary:
//   - the main job on real input: a tiny NF4 Llama on the Llama-2 tokenizer trained on
//     ../shared/data/alpaca_en_demo.json (100 steps); the training loss and the held-out loss fall, and the
//     adapter loads in PEFT (tests/fixtures/peft_load_check.py; QLORA_PYTHON must be set);
//   - bad input: every config in tests/badinput/configs/, a missing data file, a missing
//     tokenizer: exit 1, one line on stderr, and output_dir never created.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "common/files.h"
#include "badinput/config_expectations.h"
#include "test_util.h"

namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;

using CliRun = qlora::test::CommandResult;

/// Runs `qlora ARGS` (in `cwd` when given), capturing stdout and stderr together.
CliRun run(const std::string& args, const fs::path& cwd = {}) {
  std::string cmd = ::qlora::test::qlora_bin() + " " + args;
  if (!cwd.empty()) cmd = "cd '" + cwd.string() + "' && " + cmd;
  return qlora::test::run_command(cmd);
}

fs::path temp_dir(const std::string& name) { return qlora::test::fresh_temp_dir("e2e_" + name); }

void write(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

using qlora::test::read_json;

std::string q(const fs::path& p) { return "'" + p.string() + "'"; }

// exit 1, the error as one last line "error: ..." containing `fragment` (info log lines written
// before it, e.g. by setup, may precede it), no backtrace.
void expect_one_line_error(const CliRun& r, const std::string& what, const std::string& fragment = "") {
  EXPECT_EQ(r.status, 1) << what << "\n" << r.out;
  const size_t last = r.out.rfind('\n', r.out.size() >= 2 ? r.out.size() - 2 : 0);
  const std::string last_line = last == std::string::npos ? r.out : r.out.substr(last + 1);
  EXPECT_EQ(last_line.rfind("error: ", 0), 0u) << what << "\n" << r.out;
  EXPECT_EQ(std::count(last_line.begin(), last_line.end(), '\n'), 1) << what << "\n" << r.out;
  EXPECT_EQ(r.out.find("error: "), r.out.size() - last_line.size()) << what << ": more than one error line\n" << r.out;
  EXPECT_EQ(r.out.find("Exception raised from"), std::string::npos) << what << "\n" << r.out;
  if (!fragment.empty()) {
    EXPECT_NE(r.out.find(fragment), std::string::npos) << what << "\n" << r.out;
  }
}

double mean(const std::vector<double>& v, size_t from, size_t to) {
  double s = 0;
  for (size_t i = from; i < to; ++i) s += v[i];
  return s / static_cast<double>(to - from);
}

TEST(TrainE2E, TinyNf4OnAlpacaDemoLearnsAndLoadsInPeft) {
  QLORA_REQUIRE_SHARED(data, "data/alpaca_en_demo.json");
  QLORA_REQUIRE_SHARED(tokenizer, "tokenizers/llama2/tokenizer.model");
  const fs::path d = temp_dir("alpaca");
  CliRun r = run("init-model --preset tiny --out " + q(d / "model") + " --tokenizer " + q(tokenizer) + " --seed 0");
  ASSERT_EQ(r.status, 0) << r.out;
  const int64_t steps = 100;
  const fs::path cfg = d / "qlora.yaml";
  write(cfg, "output_dir: " + (d / "run").string() + "\n" +
                 "model:\n  path: " + (d / "model").string() + "\n  dtype: fp32\n"
                 "quantization:\n  method: nf4\n  double_quant: true\n"
                 "lora:\n  r: 8\n  alpha: 16\n  dropout: 0.05\n  target_modules: all-linear\n"
                 "data:\n  train: " + data.string() + "\n  template: alpaca\n  sequence_len: 256\n  val_set_size: 20\n"
                 "training:\n  micro_batch_size: 4\n  gradient_accumulation_steps: 1\n  max_steps: " +
                 std::to_string(steps) +
                 "\n  learning_rate: 2.0e-3\n  lr_scheduler: cosine\n  warmup_steps: 5\n"
                 "  gradient_checkpointing: false\n  logging_steps: 20\n  eval_steps: 40\n  seed: 0\n"
                 "checkpoint:\n  save_steps: 0\n  save_minutes: 0\n  resume: never\n");

  // The preview reports the run's batching: micro_batch_size 4 without packing, so the micro-batches
  // are ceil(train examples / 4), and max_steps decides the steps.
  r = run("data preview " + q(cfg) + " --n 0");
  ASSERT_EQ(r.status, 0) << r.out;
  std::smatch m;
  // val_set_size 20 holds out 20 records before sequence_len 256 drops the long ones
  ASSERT_TRUE(std::regex_search(
      r.out, m, std::regex(R"(examples: (\d+) train, (\d+) eval \(val_set_size: 20 records held out, before the drops\))")))
      << r.out;
  const int64_t n_train = std::stoll(m[1]);
  EXPECT_GT(std::stoll(m[2]), 0);
  EXPECT_LE(std::stoll(m[2]), 20);
  EXPECT_NE(r.out.find("micro_batch_size 4, sample_packing false): " + std::to_string((n_train + 3) / 4) +
                       " micro-batches, " + std::to_string(n_train) + " rows holding " + std::to_string(n_train) +
                       " examples\n"),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find("; max_steps 100 runs 100 "), std::string::npos) << r.out;

  // Held-out loss of the base model (no adapter = an untrained adapter, whose B is zero).
  r = run("eval " + q(cfg) + " --out " + q(d / "eval_before.json"));
  ASSERT_EQ(r.status, 0) << r.out;
  const double before = read_json(d / "eval_before.json")["loss"].get<double>();

  r = run("train " + q(cfg));
  ASSERT_EQ(r.status, 0) << r.out;
  // sequence_len 256 drops the demo's longer records: said, not silent
  // named by its key: the same file may be data.train and data.eval (trial 14's two identical lines)
  EXPECT_NE(r.out.find("data: data.train " + data.string() + ": "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" records not used (999 records read, "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("longer than sequence_len 256 (dropped)"), std::string::npos) << r.out;
  for (const char* f : {"adapter_config.json", "adapter_model.safetensors", "metrics.jsonl", "summary.json",
                        "config.resolved.yaml"})
    EXPECT_TRUE(fs::exists(d / "run" / f)) << f;

  std::vector<double> loss;
  std::vector<std::pair<int64_t, double>> eval_loss;
  std::ifstream metrics(d / "run" / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const json j = json::parse(line);
    loss.push_back(j["loss"].get<double>());
    if (j.contains("eval_loss")) eval_loss.emplace_back(j["step"].get<int64_t>(), j["eval_loss"].get<double>());
  }
  ASSERT_EQ(static_cast<int64_t>(loss.size()), steps);
  {  // logging_steps 20: the console shows the mean loss of the 20 steps, as HF's Trainer logs it
    std::ostringstream want;
    want << "step 20/100  loss " << mean(loss, 0, 20) << " (mean of 20)  lr ";
    EXPECT_NE(r.out.find(want.str()), std::string::npos) << want.str() << "\n" << r.out;
    EXPECT_EQ(r.out.find("step 19/100"), std::string::npos) << r.out;
  }

  r = run("eval " + q(cfg) + " --adapter " + q(d / "run") + " --out " + q(d / "eval_after.json"));
  ASSERT_EQ(r.status, 0) << r.out;
  const double after = read_json(d / "eval_after.json")["loss"].get<double>();
  // Without a config, an adapter trained here brings its run's template, sequence_len (and the other
  // adapter_run_keys()); --set wins.
  r = run("eval --model " + q(d / "model") + " --data " + q(data) + " --adapter " + q(d / "run") +
          " --max-examples 4 --out " + q(d / "eval_nocfg.json"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("eval: data.template alpaca, data.sequence_len 256, "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" from " + (d / "run" / "config.resolved.yaml").string() + " (the adapter's training run)"),
            std::string::npos) << r.out;
  EXPECT_EQ(read_json(d / "eval_nocfg.json")["template"], "alpaca");
  EXPECT_EQ(read_json(d / "eval_nocfg.json")["sequence_len"], 256);
  r = run("eval --model " + q(d / "model") + " --data " + q(data) + " --adapter " + q(d / "run") +
          " --max-examples 4 --set data.template=chatml --out " + q(d / "eval_nocfg.json"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(read_json(d / "eval_nocfg.json")["template"], "chatml");

  std::ostringstream table;
  table << std::fixed << std::setprecision(4) << "step   train_loss   eval_loss\n";
  for (size_t i = 0; i < loss.size(); ++i)
    if (i < 3 || (i + 1) % 10 == 0) {
      table << std::setw(4) << i + 1 << std::setw(13) << loss[i];
      for (const auto& [s, e] : eval_loss)
        if (s == static_cast<int64_t>(i + 1)) table << std::setw(12) << e;
      table << "\n";
    }
  const double first10 = mean(loss, 0, 10), last10 = mean(loss, loss.size() - 10, loss.size());
  table << "train loss: mean of steps 1-10 " << first10 << ", of the last 10 " << last10 << "\n"
        << "held-out loss (qlora eval): before " << before << ", after " << after << "\n";
  std::cout << table.str();

  // A random tiny model's frozen lm_head (std 0.02) and final norm cap every logit near 1.3, so
  // over a 32000-piece vocabulary the loss cannot fall far below ln(32000) = 10.37 whatever the
  // adapter learns: the drops are small but systematic (measured: 0.09 train, 0.13 held-out).
  EXPECT_LT(last10, first10 - 0.04) << table.str();
  EXPECT_LT(after, before - 0.05) << table.str();
  ASSERT_FALSE(eval_loss.empty());
  EXPECT_NEAR(eval_loss.back().second, after, 1e-3) << "train's final eval_loss and qlora eval disagree";

  r = run("generate " + q(d / "model") + " --adapter " + q(d / "run") + " --prompt 'Describe a cat.' --max-new-tokens 4 --ids");
  EXPECT_EQ(r.status, 0) << r.out;

  {  // PEFT loads the adapter
    QLORA_REQUIRE_PYTHON_EXE(python);
    const fs::path check = ::qlora::test::source_dir() / "tests/fixtures/peft_load_check.py";
    FILE* p = popen((q(python) + " " + q(check) + " " + q(d / "model") + " " + q(d / "run") + " 2>&1").c_str(), "r");
    std::string out;
    std::array<char, 4096> buf;
    size_t n;
    while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
    EXPECT_EQ(pclose(p), 0) << out;
    EXPECT_NE(out.find("OK"), std::string::npos) << out;
  }
  qlora::remove_tree(d);
}

// Every file of the bad-config corpus, run by `qlora train` in a directory where its model path
// (models/m) and data file (train.jsonl) exist and are valid: so only the config error can fail
// the run (a control config with the same paths trains). The last line must be the one error
// line naming the file and the key (fragments shared with test_badinput), with no output_dir.
TEST(TrainE2E, BadConfigsFailBeforeWritingOutput) {
  const fs::path dir = ::qlora::test::source_dir() / "tests/badinput/configs";
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".yaml") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  ASSERT_GE(files.size(), 15u);
  ASSERT_EQ(files.size(), ::qlora::test::bad_config_expectations().size());

  const fs::path shared = temp_dir("badcfg_model");
  {
    std::ofstream c(shared / "corpus.txt");
    for (int i = 0; i < 300; ++i) c << "ticket " << i << ": the printer " << i % 13 << " is broken, please help\n";
  }
  CliRun r = run("init-model --preset tiny --out " + q(shared / "m") + " --train-tokenizer " + q(shared / "corpus.txt") +
                 " --vocab-size 400 --seed 1");
  ASSERT_EQ(r.status, 0) << r.out;
  auto prepare = [&](const fs::path& d) {
    fs::create_directories(d / "models");
    fs::create_directory_symlink(shared / "m", d / "models" / "m");
    write(d / "train.jsonl", "{\"instruction\": \"fix the printer\", \"output\": \"ok\"}\n"
                             "{\"instruction\": \"reset my password\", \"output\": \"done\"}\n");
  };
  {  // control: the corpus' paths with a valid config train
    const fs::path d = temp_dir("badcfg_control");
    prepare(d);
    write(d / "good.yaml", "output_dir: runs/good\nmodel:\n  path: models/m\ndata:\n  train: train.jsonl\n"
                           "lora:\n  r: 4\n  target_modules: [q_proj]\ntraining:\n  micro_batch_size: 1\n  max_steps: 1\n");
    r = run("train good.yaml", d);
    ASSERT_EQ(r.status, 0) << "the control config must train:\n" << r.out;
    EXPECT_TRUE(fs::exists(d / "runs" / "good" / "adapter_model.safetensors"));
    qlora::remove_tree(d);
  }
  for (const fs::path& f : files) {
    const std::string name = f.filename().string();
    const auto it = ::qlora::test::bad_config_expectations().find(name);
    ASSERT_NE(it, ::qlora::test::bad_config_expectations().end()) << "no expectation for " << name;
    const fs::path d = temp_dir("badcfg");
    prepare(d);
    fs::copy_file(f, d / name);
    // No --set output_dir: an override would be checked against the file's own keys first (a
    // duplicate output_dir would then be reported for the override, not the file). Every corpus
    // file's output_dir is relative (runs/...), so `d / "runs"` is where a write would land.
    r = run("train " + q(d / name), d);
    expect_one_line_error(r, name, it->second.fragment);
    EXPECT_NE(r.out.find((d / name).string()), std::string::npos) << name << ": the error must name the file\n" << r.out;
    EXPECT_FALSE(fs::exists(d / "runs")) << name << " created its own output_dir";
    qlora::remove_tree(d);
  }
  qlora::remove_tree(shared);
}

// A config with many errors (here an Axolotl-style one): `qlora train` prints every one, each as
// its own "error: " line, in file order, then the --set ones; exit 1, nothing written.
TEST(TrainE2E, EveryConfigErrorIsPrintedOnItsOwnLine) {
  const fs::path d = temp_dir("cfg_errors");
  write(d / "axolotl.yaml", "base_model: m\noutput_dir: runs/t\nmodel: {path: m}\nlora_r: 16\ndata:\n  train:\n"
                            "    - path: a.jsonl\n      type: alpaca\ntraining:\n  micro_batch_size: four\n");
  const CliRun r = run("train axolotl.yaml --set training.lerning_rate=1e-4", d);
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_EQ(r.out,
            "error: axolotl.yaml:1: base_model: unknown key; Axolotl / Hugging Face's \"base_model\" is \"model.path\" "
            "here (docs/config.md)\n"
            "error: axolotl.yaml:4: lora_r: unknown key; Axolotl / Hugging Face's \"lora_r\" is \"lora.r\" here "
            "(docs/config.md)\n"
            "error: axolotl.yaml:8: data.train[0].type: unknown key; Axolotl's \"type\" is \"format\" here "
            "(alpaca|sharegpt|messages|completion; Axolotl's chat_template type is messages) (docs/config.md)\n"
            "error: axolotl.yaml:10: training.micro_batch_size: expected a positive integer, got \"four\"\n"
            "error: --set training.lerning_rate=1e-4: training.lerning_rate: unknown key; did you mean "
            "\"learning_rate\"?\n");
  EXPECT_FALSE(fs::exists(d / "runs"));
  qlora::remove_tree(d);
}

TEST(TrainE2E, MissingDataOrTokenizerWritesNothing) {
  const fs::path d = temp_dir("baddata");
  {
    std::ofstream c(d / "corpus.txt");
    for (int i = 0; i < 300; ++i) c << "ticket " << i << ": the printer " << i % 13 << " is broken, please help\n";
  }
  CliRun r = run("init-model --preset tiny --out " + q(d / "model") + " --train-tokenizer " + q(d / "corpus.txt") +
                 " --vocab-size 400 --seed 1");
  ASSERT_EQ(r.status, 0) << r.out;
  write(d / "train.json", R"([{"instruction": "fix the printer", "output": "ok"}])");
  const std::string common = "\nlora:\n  r: 4\n  target_modules: [q_proj]\ntraining:\n  max_steps: 2\n";

  // A data file that does not exist.
  write(d / "missing_data.yaml", "output_dir: " + (d / "out1").string() + "\nmodel:\n  path: " +
                                     (d / "model").string() + "\ndata:\n  train: " + (d / "nope.json").string() + common);
  expect_one_line_error(run("train " + q(d / "missing_data.yaml")), "missing data",
                        (d / "missing_data.yaml").string() + ":5: data.train: no such file: " + (d / "nope.json").string());
  EXPECT_FALSE(fs::exists(d / "out1"));
  // Several files, two missing: both, each on its own error line with its entry's key and line.
  write(d / "missing_list.yaml", "output_dir: " + (d / "out1").string() + "\nmodel:\n  path: " + (d / "model").string() +
                                     "\ndata:\n  train:\n    - " + (d / "train.json").string() + "\n    - " +
                                     (d / "nope1.json").string() + "\n    - {path: " + (d / "nope2.jsonl").string() +
                                     ", format: alpaca}" + common);
  CliRun lr = run("train " + q(d / "missing_list.yaml"));
  EXPECT_EQ(lr.status, 1) << lr.out;
  const std::string list_cfg = (d / "missing_list.yaml").string();
  EXPECT_NE(lr.out.find("error: " + list_cfg + ":7: data.train[1]: no such file: " + (d / "nope1.json").string() +
                        "\nerror: " + list_cfg + ":8: data.train[2]: no such file: " + (d / "nope2.jsonl").string() +
                        "\n"),
            std::string::npos)
      << lr.out;
  EXPECT_FALSE(fs::exists(d / "out1"));

  // A template config whose model.path and data.train both still need setting: both named in one
  // run (model first), by train and by data preview alike.
  write(d / "missing_both.yaml", "output_dir: " + (d / "out1").string() + "\nmodel:\n  path: " +
                                     (d / "no_model").string() + "\ndata:\n  train: " + (d / "no_data.json").string() +
                                     common);
  const std::string both_cfg = (d / "missing_both.yaml").string();
  const std::string both_lines = "error: " + both_cfg + ":3: model.path: " + (d / "no_model").string() +
                                 ": model directory not found\nerror: " + both_cfg + ":5: data.train: no such file: " +
                                 (d / "no_data.json").string() + "\n";
  for (const char* cmd : {"train ", "data preview "}) {
    CliRun br = run(std::string(cmd) + q(d / "missing_both.yaml"));
    EXPECT_EQ(br.status, 1) << cmd << br.out;
    EXPECT_NE(br.out.find(both_lines), std::string::npos) << cmd << br.out;
  }
  EXPECT_FALSE(fs::exists(d / "out1"));

  // A preset whose tokenizer file does not exist.
  write(d / "missing_tok.yaml", "output_dir: " + (d / "out2").string() +
                                    "\nmodel:\n  preset: tiny\n  init: random\n  tokenizer: " +
                                    (d / "none" / "tokenizer.model").string() + "\ndata:\n  train: " +
                                    (d / "train.json").string() + common);
  // ... named by its key and the config's file:line, as other missing files are.
  expect_one_line_error(run("train " + q(d / "missing_tok.yaml")), "missing tokenizer",
                        "error: " + (d / "missing_tok.yaml").string() + ":5: model.tokenizer: " +
                            (d / "none" / "tokenizer.model").string() + ": tokenizer not found");
  EXPECT_FALSE(fs::exists(d / "out2"));

  // A model directory without its tokenizer.model.
  fs::copy(d / "model", d / "model_notok", fs::copy_options::recursive);
  fs::remove(d / "model_notok" / "tokenizer.model");
  write(d / "model_notok.yaml", "output_dir: " + (d / "out3").string() + "\nmodel:\n  path: " +
                                    (d / "model_notok").string() + "\ndata:\n  train: " + (d / "train.json").string() +
                                    common);
  expect_one_line_error(run("train " + q(d / "model_notok.yaml")), "model dir without tokenizer", "model_notok");
  EXPECT_FALSE(fs::exists(d / "out3"));

  // model.path that does not exist, or names a file: said as such (not "tokenizer model not found").
  const std::string set_out = " --set output_dir=" + q(d / "out4");
  expect_one_line_error(run("train " + q(d / "model_notok.yaml") + set_out + " --set model.path=" + q(d / "nowhere")),
                        "model.path missing", "model.path: " + (d / "nowhere").string() + ": model directory not found");
  expect_one_line_error(run("train " + q(d / "model_notok.yaml") + set_out + " --set model.path=" +
                            q(d / "model" / "model.safetensors")),
                        "model.path a file", "model.safetensors is a file, expected a Hugging Face model directory");
  write(d / "m.gguf", "GGUF");
  expect_one_line_error(run("train " + q(d / "model_notok.yaml") + set_out + " --set model.path=" + q(d / "m.gguf")),
                        "model.path a gguf", "m.gguf is a GGUF file (llama.cpp / Ollama), not a Hugging Face model "
                                             "directory: import it first: qlora import-gguf");
  expect_one_line_error(run("eval --model " + q(d / "nowhere") + " --data " + q(d / "train.json")),
                        "eval --model missing", "model directory not found");
  EXPECT_FALSE(fs::exists(d / "out4"));

  // A truncated model.safetensors (a copy cut short): the model loads before output_dir is locked,
  // created or written, so neither output_dir nor its run.lock / memory_report.json appears; an
  // existing output_dir keeps exactly what it held.
  fs::copy(d / "model", d / "model_cut", fs::copy_options::recursive);
  const fs::path st = d / "model_cut" / "model.safetensors";
  fs::resize_file(st, fs::file_size(st) - 64);
  const std::string set_cut = " --set model.path=" + q(d / "model_cut");
  r = run("train " + q(d / "model_notok.yaml") + set_cut + " --set output_dir=" + q(d / "out5"));
  expect_one_line_error(r, "truncated model.safetensors", st.string() + ": tensor '");
  EXPECT_NE(r.out.find("past the data buffer"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(d / "out5")) << r.out;
  fs::create_directories(d / "out6");
  write(d / "out6" / "eval.json", "{}");
  expect_one_line_error(run("train " + q(d / "model_notok.yaml") + set_cut + " --set output_dir=" + q(d / "out6")),
                        "truncated model.safetensors, existing output_dir", st.string() + ": tensor '");
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(d / "out6")) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"eval.json"});

  // The same bad inputs through `qlora eval`: one line, exit 1.
  expect_one_line_error(run("eval " + q(d / "missing_data.yaml")), "eval missing data", "nope.json");
  expect_one_line_error(run("eval --model " + q(d / "model") + " --data " + q(d / "train.json") + " --adapter " +
                            q(d / "no_adapter")),
                        "eval missing adapter", "no_adapter");
  qlora::remove_tree(d);
}

std::vector<double> losses_of(const fs::path& run_dir) {
  std::vector<double> loss;
  std::ifstream metrics(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) loss.push_back(json::parse(line)["loss"].get<double>());
  return loss;
}

// model.init: random with model.path (docs/config.md: "architecture from preset or path's
// config.json"; issue: it asked for model.safetensors): a directory holding only config.json and
// the tokenizer trains, on the same weights as the preset of that shape (same training.seed: the
// same draws), so both runs' losses are equal.
TEST(TrainE2E, InitRandomWithModelPathNeedsOnlyConfigJsonAndTokenizer) {
  const fs::path d = temp_dir("init_random_path");
  {
    std::ofstream c(d / "corpus.txt");
    for (int i = 0; i < 300; ++i) c << "ticket " << i << ": the printer " << i % 13 << " is broken, please help\n";
  }
  CliRun r = run("init-model --preset tiny --out " + q(d / "model") + " --train-tokenizer " + q(d / "corpus.txt") +
                 " --vocab-size 400 --seed 1");
  ASSERT_EQ(r.status, 0) << r.out;
  fs::create_directories(d / "shape");
  for (const auto& e : fs::directory_iterator(d / "model")) {
    const std::string name = e.path().filename().string();
    if (name.find("safetensors") == std::string::npos) fs::copy(e.path(), d / "shape" / name);
  }
  ASSERT_TRUE(fs::exists(d / "shape" / "config.json"));
  ASSERT_TRUE(fs::exists(d / "shape" / "tokenizer.model"));
  write(d / "train.json", R"([{"instruction": "fix the printer", "output": "ok"},
                              {"instruction": "the printer 3 is broken", "output": "please help"}])");
  write(d / "cfg.yaml", "output_dir: " + (d / "out_path").string() + "\nmodel:\n  path: " + (d / "shape").string() +
                            "\n  dtype: fp32\ndata:\n  train: " + (d / "train.json").string() +
                            "\n  template: alpaca\nlora:\n  r: 4\n  target_modules: [q_proj]\ntraining:\n  max_steps: 2\n");
  // init: pretrained (the default) still needs the weights.
  // Named by its key and file:line before the data is read, not by the loader after it.
  CliRun w = run("train " + q(d / "cfg.yaml"));
  expect_one_line_error(w, "pretrained without weights",
                        (d / "cfg.yaml").string() + ":3: model.path: " + (d / "shape").string() +
                            ": no model.safetensors or model.safetensors.index.json (a directory with config.json only "
                            "gives a shape: model.init: random draws the weights)");
  EXPECT_EQ(w.out.find("data: "), std::string::npos) << w.out;
  EXPECT_FALSE(fs::exists(d / "out_path"));
  write(d / "shape" / "pytorch_model.bin", "not read");
  expect_one_line_error(run("train " + q(d / "cfg.yaml")), "a pickle checkpoint only",
                        "(pytorch_model.bin is a pickle checkpoint, which is not read: save the model as safetensors");
  expect_one_line_error(run("eval " + q(d / "cfg.yaml") + " --data " + q(d / "train.json")), "eval of a pickle checkpoint",
                        ":3: model.path: " + (d / "shape").string() + ": no model.safetensors");
  // every command that opens the weights gives the same hint (trial 22: inspect, generate and merge did not)
  const std::string pickle = ": no model.safetensors or model.safetensors.index.json (pytorch_model.bin is a pickle "
                             "checkpoint, which is not read";
  expect_one_line_error(run("inspect " + q(d / "shape")), "inspect of a pickle checkpoint", pickle);
  expect_one_line_error(run("generate " + q(d / "shape") + " --prompt hi"), "generate of a pickle checkpoint", pickle);
  fs::remove(d / "shape" / "pytorch_model.bin");
  EXPECT_FALSE(fs::exists(d / "out_path"));
  {  // attention_dropout in config.json is not applied: said once, not silently (trial 22)
    nlohmann::json c = nlohmann::json::parse(std::ifstream(d / "shape" / "config.json"));
    c["attention_dropout"] = 0.1;
    std::ofstream(d / "shape" / "config.json") << c.dump(2);
  }
  r = run("train " + q(d / "cfg.yaml") + " --set model.init=random");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("model: config.json has attention_dropout 0.1, which qlora does not apply"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("model: init: random, the shape of " + (d / "shape").string() + "/config.json (no weights are read)"),
            std::string::npos)
      << r.out;
  EXPECT_TRUE(fs::exists(d / "out_path" / "adapter_model.safetensors"));
  const std::vector<double> from_path = losses_of(d / "out_path");
  ASSERT_EQ(from_path.size(), 2u) << r.out;
  // The preset of the same shape (init-model --preset tiny; vocab = the tokenizer's 400).
  write(d / "preset.yaml", "output_dir: " + (d / "out_preset").string() + "\nmodel:\n  preset: tiny\n  init: random\n"
                               "  tokenizer: " + (d / "shape").string() + "\n  dtype: fp32\ndata:\n  train: " +
                               (d / "train.json").string() + "\n  template: alpaca\nlora:\n  r: 4\n  target_modules: "
                               "[q_proj]\ntraining:\n  max_steps: 2\n");
  r = run("train " + q(d / "preset.yaml"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(losses_of(d / "out_preset"), from_path);
  qlora::remove_tree(d);
}

// configs/tiny/qlora.yaml as a user runs it: from a directory holding the quickstart's outputs
// (runs/quickstart/model's SmolLM2 tokenizer, runs/quickstart/data/train.json's alpaca records;
// examples/quickstart/run.sh). Issue: it pointed at ../shared, a test-only folder.
TEST(TrainE2E, TinyConfigRunsOnTheQuickstartsFiles) {
  const fs::path d = temp_dir("tiny_config");
  const fs::path tok = qlora::test::fixtures_dir() / "tokenizers" / "smollm2";
  ASSERT_TRUE(fs::exists(tok / "tokenizer.json")) << tok;
  fs::create_directories(d / "runs" / "quickstart" / "model");
  fs::create_directories(d / "runs" / "quickstart" / "data");
  for (const auto& e : fs::directory_iterator(tok)) fs::copy(e.path(), d / "runs" / "quickstart" / "model" / e.path().filename());
  {
    json recs = json::array();
    for (int i = 0; i < 40; ++i)
      recs.push_back({{"instruction", "Triage this support ticket: give its topic and urgency."},
                      {"input", "my printer " + std::to_string(i) + " is jammed"},
                      {"output", i % 2 ? "topic: hardware, urgency: urgent" : "topic: hardware, urgency: normal"}});
    write(d / "runs" / "quickstart" / "data" / "train.json", recs.dump(1));
  }
  const fs::path cfg = qlora::test::source_dir() / "configs" / "tiny" / "qlora.yaml";
  const CliRun r = run("train " + q(cfg) + " --set training.max_steps=2", d);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(fs::exists(d / "runs" / "tiny-qlora" / "adapter_model.safetensors")) << r.out;
  EXPECT_EQ(losses_of(d / "runs" / "tiny-qlora").size(), 2u) << r.out;
  // Without the quickstart's files: the missing tokenizer is named by its key and the config's line.
  qlora::remove_tree(d / "runs");
  const CliRun m = run("train " + q(cfg), d);
  EXPECT_EQ(m.status, 1) << m.out;
  EXPECT_NE(m.out.find("error: " + cfg.string() + ":14: model.tokenizer: runs/quickstart/model: tokenizer not found"),
            std::string::npos)
      << m.out;
  EXPECT_FALSE(fs::exists(d / "runs" / "tiny-qlora"));
  qlora::remove_tree(d);
}

// The glaive demo's tools (function schemas) with a template that drops them (smollm2: its jinja
// ignores `tools`, as transformers renders it): `data preview` warns, naming the file and the count.
// data.sample_packing on examples that never fit two to a row (issue: trial 8, silent at train time
// while data preview said "(1.00 a row)"): one warning at train start naming the lengths; none
// when packing packs.
TEST(TrainE2E, SamplePackingThatPacksNothingIsWarnedOf) {
  const fs::path d = temp_dir("packing_nothing");
  {
    std::ofstream c(d / "corpus.txt");
    for (int i = 0; i < 300; ++i) c << "ticket " << i << ": the printer " << i % 13 << " is broken, please help\n";
  }
  CliRun r = run("init-model --preset tiny --out " + q(d / "model") + " --train-tokenizer " + q(d / "corpus.txt") +
                 " --vocab-size 400 --seed 1");
  ASSERT_EQ(r.status, 0) << r.out;
  {
    std::ofstream t(d / "train.jsonl");
    for (int i = 0; i < 8; ++i) t << R"({"text": "the printer is broken, please help. the printer is broken, please help."})" "\n";
  }
  const auto cfg = [&](const std::string& name, int64_t seq) {
    write(d / (name + ".yaml"), "output_dir: " + (d / name).string() + "\nmodel:\n  path: " + (d / "model").string() +
                                    "\n  dtype: fp32\ndata:\n  train: " + (d / "train.jsonl").string() +
                                    "\n  sample_packing: true\n  sequence_len: " + std::to_string(seq) +
                                    "\nlora:\n  r: 4\n  target_modules: [q_proj]\ntraining:\n  max_steps: 1\n"
                                    "  gradient_accumulation_steps: 1\n  gradient_checkpointing: false\n"
                                    "checkpoint:\n  save_steps: 0\n  save_minutes: 0\n");
    return d / (name + ".yaml");
  };
  r = run("data preview " + q(cfg("probe", 512)) + " --n 0");
  ASSERT_EQ(r.status, 0) << r.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(max length (\d+))"))) << r.out;
  const int64_t len = std::stoll(m[1]);  // every example has this length
  ASSERT_GT(len, 4) << r.out;
  const int64_t seq = len + len / 2;     // one example a row: two never fit
  r = run("data preview " + q(cfg("none", seq)) + " --n 0");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("rows holding 8 examples (1.00 a row)"), std::string::npos) << r.out;
  r = run("train " + q(d / "none.yaml"));
  ASSERT_EQ(r.status, 0) << r.out;
  const std::string want = "data: sample_packing packs nothing: 1.00 examples a row in epoch 1 (8 examples in 8 rows); "
                           "the examples are " + std::to_string(len) + ".." + std::to_string(len) +
                           " tokens, so no two fit in one sequence_len " + std::to_string(seq) +
                           " row: set data.sample_packing: false, or raise data.sequence_len\n";
  EXPECT_NE(r.out.find(want), std::string::npos) << r.out;
  r = run("train " + q(cfg("packs", 4 * len)));  // four a row: no warning
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.find("sample_packing packs"), std::string::npos) << r.out;
  qlora::remove_tree(d);
}

TEST(TrainE2E, DataPreviewWarnsOfToolsTheTemplateDrops) {
  QLORA_REQUIRE_SHARED(glaive, "data/glaive_toolcall_en_demo.json");
  QLORA_REQUIRE_FIXTURE(smol, "tokenizers/smollm2/tokenizer_config.json");
  const fs::path d = temp_dir("tools_note");
  write(d / "c.yaml", "output_dir: " + (d / "out").string() + "\nmodel:\n  preset: tiny\n  init: random\n  tokenizer: " +
                          smol.parent_path().string() + "\ndata:\n  train: " + glaive.string() +
                          "\n  template: smollm2\n  sequence_len: 4096\n");
  CliRun r = run("data preview " + q(d / "c.yaml") + " --n 0");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("warning: data: " + glaive.string() +
                       ": 300 records carry tools that template smollm2 does not render (its chat template ignores "
                       "them, as transformers' apply_chat_template does); use a template that renders tools (qwen2.5, "
                       "qwen3, llama3.1, llama3.2, mistral) or put the schemas in the system message\n"),
            std::string::npos) << r.out;
  r = run("data preview " + q(d / "c.yaml") + " --n 0 --set data.template=chatml");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("records carry tools that template chatml does not render (it has no place for them)"),
            std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(d / "out"));
  qlora::remove_tree(d);
}

}  // namespace
