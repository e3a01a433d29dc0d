// The `qlora` binary end to end: init-model → inspect → generate, and bad input giving one line,
// naming the path, with a non-zero exit and no stack trace.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <sys/wait.h>
#include <unistd.h>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/files.h"
#include "test_util.h"

namespace {
namespace fs = std::filesystem;

using CliRun = qlora::test::CommandResult;

CliRun run(const std::string& args) { return qlora::test::run_command(::qlora::test::qlora_bin() + " " + args); }

fs::path temp_dir(const std::string& name) { return qlora::test::fresh_temp_dir("cli_" + name); }

void write(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

// One line, "error: " + the path, exit 1, nothing like a backtrace.
void expect_clean_error(const CliRun& r, const std::string& fragment) {
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_EQ(r.out.rfind("error: ", 0), 0u) << r.out;
  EXPECT_NE(r.out.find(fragment), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  EXPECT_EQ(r.out.find("Exception raised from"), std::string::npos) << r.out;
}

// torchtune's override style (`tune run ... --config C key=value`): a positional section.key=value
// is a usage error (exit 2) that names --set, one line each (issue: a torchtune user's trial got
// only CLI11's "The following argument was not expected"). Parsing fails before any file is read.
TEST(Cli, PositionalOverrideSaysSet) {
  CliRun r = run("train base.yaml training.max_steps=5");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_EQ(r.out, "error: use --set training.max_steps=5 (overrides are --set section.key=value)\n");
  r = run("train base.yaml training.max_steps=5 lora.alpha=16 --set lora.r=8");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_EQ(r.out, "error: use --set training.max_steps=5 (overrides are --set section.key=value)\n"
                   "error: use --set lora.alpha=16 (overrides are --set section.key=value)\n");
  r = run("data preview base.yaml data.sequence_len=64");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_EQ(r.out, "error: use --set data.sequence_len=64 (overrides are --set section.key=value)\n");
  // A bare key (torchtune's `epochs=1`) or a key the config refuses: what the config says of it,
  // so the next command is right (a torchtune user's trial, session 21: "use --set dataset.packed=True"
  // failed again on --set).
  r = run("train base.yaml epochs=1");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_EQ(r.out, "error: epochs=1: overrides are --set section.key=value here, and epochs: unknown key; "
                   "torchtune's \"epochs\" is \"training.num_epochs\" here (docs/config.md)\n");
  r = run("train base.yaml lora.r=-1 training.max_steps=5");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_EQ(r.out, "error: lora.r=-1: overrides are --set section.key=value here, and lora.r: expected a positive "
                   "integer, got -1\n"
                   "error: use --set training.max_steps=5 (overrides are --set section.key=value)\n");
  // Another unexpected argument, or a command without --set: CLI11's message, no --set named.
  for (const char* args : {"train base.yaml extra", "train base.yaml training.max_steps=5 extra",
                           "generate m --prompt x training.max_steps=5"}) {
    r = run(args);
    EXPECT_EQ(r.status, 2) << args << ": " << r.out;
    EXPECT_NE(r.out.find("not expected"), std::string::npos) << args << ": " << r.out;
    EXPECT_EQ(r.out.find("--set"), std::string::npos) << args << ": " << r.out;
  }
}

// `qlora validate CONFIG` (torchtune's tune validate) said CLI11's "A subcommand is required",
// though one was given (a torchtune user's trial, session 21): an unknown command is named, with
// what does it here for another tool's command, else the nearest command, else the list; exit 2.
TEST(Cli, UnknownCommandIsNamedWithWhatDoesItHere) {
  const std::map<std::string, std::string> said = {
      {"validate c.yaml", "error: unknown command 'validate': qlora data preview CONFIG reads and checks a config "
                          "(every error at once) and renders its first examples without training\n"},
      {"cp llama3_2/1B_qlora_single_device .", "error: unknown command 'cp': the configs are plain files: cp "
                                               "configs/FAMILY/NAME.yaml my.yaml (one per model family, run line first)\n"},
      {"merge-lora", "error: unknown command 'merge-lora': qlora merge --base MODEL_DIR --adapter RUN_DIR --out DIR\n"},
      {"trian c.yaml", "error: unknown command 'trian'; did you mean 'train'?\n"},
      {"frobnicate", "error: unknown command 'frobnicate' (commands: inspect, generate, tokenize, init-model, train, "
                     "eval, merge, data, estimate, bench, import-gguf; qlora --help)\n"},
  };
  for (const auto& [args, out] : said) {
    const CliRun r = run(args);
    EXPECT_EQ(r.status, 2) << args;
    EXPECT_EQ(r.out, out) << args;
  }
  // A command, an option or nothing: as before.
  EXPECT_EQ(run("--help").status, 0);
  EXPECT_EQ(run("").status, 2);
  EXPECT_EQ(run("").out.find("unknown command"), std::string::npos);
}

// --max-time below 0 meant no limit (a trial, session 21: a wrapper's remaining time gone negative
// got an unbounded run): an out-of-range value, exit 1, before the config is read.
TEST(Cli, NegativeMaxTimeIsRefused) {
  for (const char* v : {"-5", "nan"}) {
    const CliRun r = run(std::string("train missing.yaml --max-time ") + v);
    EXPECT_EQ(r.status, 1) << v << ": " << r.out;
    EXPECT_EQ(r.out, std::string("error: --max-time ") + (std::string(v) == "nan" ? "nan" : "-5") +
                         ": expected a budget in seconds >= 0 (0: no limit); a budget already spent is not a run\n")
        << v;
  }
}

// CLI11 2.1 read integer options with strtoll / strtoull in base 0: `--seed 99999999999999999999999`
// ran with seed 2^64 - 1, `--seed -1` wrapped to it, `--seq-len 010` was 8 and `0x10` 16, all
// silently (session 23's list). Every integer option now takes a decimal integer of its type's range;
// anything else is a usage error (exit 2) naming the option, before anything is read or started.
TEST(Cli, IntegerOptionsAreDecimalAndInRange) {
  const std::map<std::string, std::string> refused = {
      {"generate m --prompt x --seed 99999999999999999999999",
       "--seed: 99999999999999999999999 is out of range (0..18446744073709551615)"},
      {"generate m --prompt x --seed -1", "--seed: -1 is below 0 (the option takes 0..18446744073709551615)"},
      {"generate m --prompt x --max-new-tokens 0x10", "--max-new-tokens: '0x10' is not a decimal integer"},
      {"init-model --preset tiny --out o --seed ' 5'", "--seed: ' 5' is not a decimal integer"},
      {"estimate --preset tiny --seq-len -9223372036854775809",
       "--seq-len: -9223372036854775809 is out of range (-9223372036854775808..9223372036854775807)"},
      {"bench --preset tiny --sweep --seq-lens 64 0x10", "--seq-lens: '0x10' is not a decimal integer"},
      // the launcher's option: refused before a rank starts
      {"train missing.yaml --nproc-per-node 0x2", "--nproc-per-node: '0x2' is not a decimal integer"},
  };
  for (const auto& [args, line] : refused) {
    const CliRun r = run(args);
    EXPECT_EQ(r.status, 2) << args << ": " << r.out;
    EXPECT_EQ(r.out.substr(0, r.out.find('\n')), line) << args;
    EXPECT_EQ(r.out.find("launch:"), std::string::npos) << args << ": " << r.out;
  }
  // Leading zeros and a sign are decimal, as YAML 1.2 and Python's int() read them.
  for (const char* v : {"010", "+10", "0010"}) {
    const CliRun r = run(std::string("estimate --preset tiny --seq-len ") + v);
    EXPECT_EQ(r.status, 0) << v << ": " << r.out;
    EXPECT_NE(r.out.find("micro-batch 1 \u00d7 10 tokens"), std::string::npos) << v << ": " << r.out;
  }
}

TEST(Cli, InitInspectGenerateOnTinyPreset) {
  fs::path d = temp_dir("tiny");
  fs::path corpus = d / "corpus.txt";
  {
    std::ofstream c(corpus);
    for (int i = 0; i < 400; ++i)
      c << "ticket " << i << ": my printer number " << i % 17 << " is broken, please help quickly\n"
        << "the invoice for order " << i * 7 << " was charged twice\n";
  }
  CliRun r = run("init-model --preset tiny --out " + (d / "m").string() + " --train-tokenizer " +
              corpus.string() + " --vocab-size 300 --seed 1");
  ASSERT_EQ(r.status, 0) << r.out;
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.model", "tokenizer_config.json"})
    EXPECT_TRUE(fs::exists(d / "m" / f)) << f;
  r = run("inspect " + (d / "m").string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("LlamaForCausalLM"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("total"), std::string::npos) << r.out;
  r = run("inspect --json " + (d / "m").string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("\"parameters\""), std::string::npos);
  // inspect --quant: double quant on by default, as train, generate --quant and estimate (before:
  // off, 4.5 bits per quantized parameter); --no-double-quant turns it off.
  r = run("inspect --json " + (d / "m").string() + " --quant nf4");
  ASSERT_EQ(r.status, 0) << r.out;
  nlohmann::json jq = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  EXPECT_EQ(jq["quant"]["double_quant"], true) << r.out;
  const double bits_dq = jq["bits_per_quantized_param"].get<double>();
  r = run("inspect --json " + (d / "m").string() + " --quant nf4 --no-double-quant");
  ASSERT_EQ(r.status, 0) << r.out;
  jq = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  EXPECT_EQ(jq["quant"]["double_quant"], false) << r.out;
  // fp32 absmax: exactly 4 + 32/64 bits; double quant's differ (on this tiny model its per-tensor
  // code table makes them more, on a 7B 4.127: docs/quantization.md)
  EXPECT_EQ(jq["bits_per_quantized_param"].get<double>(), 4.5) << r.out;
  EXPECT_NE(bits_dq, 4.5);
  EXPECT_EQ(run("inspect " + (d / "m").string() + " --no-double-quant").status, 2);  // needs --quant
  EXPECT_EQ(run("inspect " + (d / "m").string() + " --quant nf4 --double-quant --no-double-quant").status, 2);
  r = run("generate " + (d / "m").string() + " --prompt 'my printer' --max-new-tokens 5 --ids");
  ASSERT_EQ(r.status, 0) << r.out;
  // refuses to overwrite a non-empty directory
  expect_clean_error(run("init-model --preset tiny --out " + (d / "m").string() + " --train-tokenizer " +
                         corpus.string()),
                     "refusing to overwrite");
  // init-model writes a stored dtype (fp32, bf16, fp16, or torch's spellings of them): auto is
  // refused by init-model (exit 1), an unknown name by the command line (usage, exit 2); nothing
  // half-written either way
  const std::string init_m2 = "init-model --preset tiny --out " + (d / "m2").string() + " --train-tokenizer " +
                              corpus.string() + " --vocab-size 300 --dtype ";
  expect_clean_error(run(init_m2 + "auto"), "init-model: --dtype must be fp32, bf16 or fp16, got 'auto'");
  EXPECT_FALSE(fs::exists(d / "m2"));
  r = run(init_m2 + "half");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("dtype 'half' is not one of bf16, fp16, fp32, auto"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(d / "m2"));
  // generate computes in any spelling the one dtype parser knows, ours or Hugging Face's
  r = run("generate " + (d / "m").string() + " --prompt 'my printer' --max-new-tokens 2 --ids --dtype float32");
  EXPECT_EQ(r.status, 0) << r.out;
  r = run("generate " + (d / "m").string() + " --prompt x --dtype half");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("dtype 'half' is not one of bf16, fp16, fp32, auto"), std::string::npos) << r.out;
  qlora::remove_tree(d);
}

TEST(Cli, MissingDirectory) { expect_clean_error(run("inspect /nonexistent/model"), "/nonexistent/model"); }

// A directory that is an adapter / a training run's output, not a model: the error says what it is
// and what to pass instead (before: only "an HF model directory needs config.json").
TEST(Cli, AdapterOrRunDirectoryIsNamedAsSuch) {
  const fs::path d = temp_dir("adapter_dir");
  write(d / "adapter_config.json", R"({"peft_type": "LORA", "base_model_name_or_path": "models/SmolLM2-135M-Instruct"})");
  write(d / "run.json", "{}");
  for (const std::string cmd : {"inspect ", "generate --prompt x "}) {
    const CliRun r = run(cmd + d.string());
    expect_clean_error(r, (d / "config.json").string() + ": not found (an HF model directory needs config.json); it "
                          "holds adapter_config.json: a LoRA adapter (a training run's output_dir), not a model. Pass "
                          "the base model directory (its base: models/SmolLM2-135M-Instruct) and this directory as "
                          "--adapter " + d.string());
    EXPECT_NE(r.out.find("qlora merge --base BASE --adapter " + d.string() + " --out DIR"), std::string::npos) << r.out;
  }
  fs::remove(d / "adapter_config.json");  // a run interrupted before its first adapter
  expect_clean_error(run("inspect " + d.string()), "it holds run.json: a training run's output_dir (no adapter written "
                                                   "yet), not a model. Pass the run config's model.path");
  fs::remove(d / "run.json");  // an empty directory: the plain message
  const CliRun r = run("inspect " + d.string());
  expect_clean_error(r, "config.json: not found (an HF model directory needs config.json)");
  EXPECT_EQ(r.out.find("it holds"), std::string::npos) << r.out;
  qlora::remove_tree(d);
}

// generate refuses a bad --max-new-tokens / --temperature / --top-p before loading anything, as eval
// refuses --max-examples -2 (before: -5 printed nothing and exited 0).
TEST(Cli, GenerateRefusesBadSamplingFlags) {
  expect_clean_error(run("generate /nonexistent/model --prompt x --max-new-tokens -5"),
                     "generate: --max-new-tokens must be >= 1, got -5");
  expect_clean_error(run("generate /nonexistent/model --prompt x --max-new-tokens 0"),
                     "generate: --max-new-tokens must be >= 1, got 0");
  expect_clean_error(run("generate /nonexistent/model --prompt x --temperature -1"),
                     "generate: --temperature must be >= 0, got -1");
  expect_clean_error(run("generate /nonexistent/model --prompt x --top-p 0"), "generate: --top-p must be in (0, 1], got 0");
  expect_clean_error(run("generate /nonexistent/model --prompt x --top-k -1"), "generate: --top-k must be >= 0 (0 = off), got -1");
  expect_clean_error(run("generate /nonexistent/model --prompt x --repetition-penalty 0"),
                     "generate: --repetition-penalty must be > 0 (1 = off), got 0");
  expect_clean_error(run("generate /nonexistent/model --prompt x --repetition-penalty -1.2"),
                     "generate: --repetition-penalty must be > 0 (1 = off), got -1.2");
  expect_clean_error(run("generate /nonexistent/model --prompt x --stop ''"), "generate: --stop must not be empty");
  EXPECT_EQ(run("generate /nonexistent/model --prompt x --top-k abc").status, 2);  // does not parse: usage
}

std::string sq(const std::string& s) {  // single-quoted for /bin/sh
  std::string o = "'";
  for (char c : s) o += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return o + "'";
}

// The output's last line (the log lines on stderr come before it).
std::string last_line(std::string out) {
  while (!out.empty() && out.back() == '\n') out.pop_back();
  const size_t nl = out.rfind('\n');
  return nl == std::string::npos ? out : out.substr(nl + 1);
}

// `generate --prompts FILE`: a bad line is one line naming FILE:LINE and the key, before the model
// loads (the model dir does not exist here); --prompt and --prompts together, or neither: usage.
TEST(Cli, GeneratePromptsFileBadLinesNameFileLineAndKey) {
  const fs::path d = temp_dir("prompts_bad");
  const std::string f = (d / "p.jsonl").string();
  const auto error_for = [&](const std::string& body, const std::string& fragment) {
    write(f, body);
    expect_clean_error(run("generate /nonexistent/model --prompts " + f), fragment);
  };
  error_for("{\"prompt\": \"a\"}\n\n{\"prompt\": 3}\n", f + ":3: prompt: expected a string, got number");
  error_for("{\"prompt\": \"a\", \"sytem\": \"b\"}\n", f + ":1: sytem: unknown key");
  error_for("{\"prompt\": \"a\", \"system\": [1]}\n", f + ":1: system: expected a string, got array");
  error_for("{\"system\": \"a\"}\n", f + ":1: prompt: missing");
  error_for("{\"prompt\": \"a\"}\n[\"b\"]\n", f + ":2: expected a JSON object");
  error_for("{\"prompt\": \"a\"}\n{\"prompt\": \"b\"\n", f + ":2: invalid JSON: ");
  error_for("\n  \n", f + ": no prompts");
  expect_clean_error(run("generate /nonexistent/model --prompts " + (d / "none.jsonl").string()),
                     (d / "none.jsonl").string() + ": --prompts file not found");
  write(f, "{\"prompt\": \"a\"}\n");
  EXPECT_EQ(run("generate /nonexistent/model --prompts " + f + " --prompt x").status, 2);
  EXPECT_EQ(run("generate /nonexistent/model").status, 2);
  expect_clean_error(run("generate /nonexistent/model --prompts " + f + " --ids"), "generate: --ids prints one");
  qlora::remove_tree(d);
}

// `generate --prompts FILE` on the transformers fixture model (make_models.py): one JSON line per
// prompt, each equal to a `--prompt` run alone (ids, text, the sampling generator reseeded per
// prompt), with finish_reason stop / length / eos; a "system" without a template is refused naming
// the line, before the model loads.
TEST(Cli, GeneratePromptsFileEqualsSinglePromptRuns) {
  QLORA_REQUIRE_FIXTURE(model, "models/llama_gqa/generate_ref.json");
  const nlohmann::json ref = nlohmann::json::parse(std::ifstream(model));
  const fs::path d = temp_dir("prompts");
  const std::string m = model.parent_path().string(), stop = ref["stop"]["stop"];
  const std::vector<std::string> prompts = {ref["prompt"], "Hello", "The weather today"};
  {
    std::ofstream f(d / "p.jsonl");
    for (const std::string& p : prompts) f << nlohmann::json({{"prompt", p}}).dump() << "\n";
  }
  for (const std::string& flags : std::vector<std::string>{" --max-new-tokens 8 --dtype fp32 --stop " + sq(stop),
                                                         " --max-new-tokens 6 --dtype fp32 --temperature 0.9 --top-k 40 --seed 3"}) {
    CliRun r = run("generate " + m + " --prompts " + (d / "p.jsonl").string() + flags);
    ASSERT_EQ(r.status, 0) << r.out;
    std::vector<nlohmann::json> lines;
    std::istringstream is(r.out);
    for (std::string line; std::getline(is, line);)
      if (!line.empty() && line[0] == '{') lines.push_back(nlohmann::json::parse(line));
    ASSERT_EQ(lines.size(), prompts.size()) << r.out;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const nlohmann::json& l = lines[i];
      EXPECT_EQ(l["prompt"], prompts[i]);
      const CliRun ids = run("generate " + m + " --prompt " + sq(prompts[i]) + flags + " --ids");
      const CliRun text = run("generate " + m + " --prompt " + sq(prompts[i]) + flags);
      ASSERT_EQ(ids.status, 0) << ids.out;
      std::vector<int64_t> want;
      std::istringstream ws(last_line(ids.out));
      for (int64_t x; ws >> x;) want.push_back(x);
      EXPECT_EQ(l["ids"].get<std::vector<int64_t>>(), want) << flags << " " << i;
      EXPECT_EQ(l["output"].get<std::string>(), last_line(text.out)) << flags << " " << i;
      EXPECT_EQ(l["finish_reason"], i == 0 && flags.find("--stop") != std::string::npos ? "stop" : "length") << i;
    }
    if (flags.find("--stop") != std::string::npos) {  // transformers' stop_strings: same ids, text kept
      EXPECT_EQ(lines[0]["ids"], ref["stop"]["new_ids"]);
      EXPECT_EQ(lines[0]["output"], ref["stop"]["text"]);
    }
  }
  // an EOS id (generation_config.json's list) ends a line with finish_reason eos, the id last
  const fs::path m2 = d / "m";
  fs::create_directories(m2);
  for (const auto& e : fs::directory_iterator(m)) fs::copy_file(e.path(), m2 / e.path().filename());
  const int64_t eos = ref["new_ids"][2];
  write(m2 / "generation_config.json", "{\"bos_token_id\": 1, \"eos_token_id\": [2, " + std::to_string(eos) + "]}");
  write(d / "one.jsonl", nlohmann::json({{"prompt", prompts[0]}}).dump() + "\n");
  CliRun r = run("generate " + m2.string() + " --prompts " + (d / "one.jsonl").string() + " --dtype fp32");
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json l = nlohmann::json::parse(last_line(r.out));
  EXPECT_EQ(l["finish_reason"], "eos") << r.out;
  EXPECT_EQ(l["ids"], nlohmann::json(std::vector<int64_t>(ref["new_ids"].begin(), ref["new_ids"].begin() + 3)));
  // an empty prompt under a tokenizer that adds no BOS has no token to continue: named with its line
  write(m2 / "tokenizer_config.json", R"({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
      "add_bos_token": false, "add_eos_token": false, "legacy": true, "tokenizer_class": "LlamaTokenizer"})");
  write(d / "empty.jsonl", "{\"prompt\": \"a\"}\n{\"prompt\": \"\"}\n");
  expect_clean_error(run("generate " + m2.string() + " --prompts " + (d / "empty.jsonl").string()),
                     (d / "empty.jsonl").string() + ":2: prompt: no tokens to continue");
  expect_clean_error(run("generate " + m2.string() + " --prompt ''"), "generate: --prompt: no tokens to continue");
  // a "system" needs a template: named with its line before the model loads
  write(d / "sys.jsonl", "{\"prompt\": \"a\"}\n{\"prompt\": \"b\", \"system\": \"Be brief.\"}\n");
  expect_clean_error(run("generate " + m + " --prompts " + (d / "sys.jsonl").string()),
                     (d / "sys.jsonl").string() + ":2: system: needs --template NAME (or auto)");
  qlora::remove_tree(d);
}

// The CLI's sampling defaults are transformers': no --top-k means generation_config.json's top_k,
// else GenerationConfig's 50 (make_models.py sample_default_top_k: temperature 0.8, no top_k), and
// the draws equal transformers' for the same --seed; a bad top_k in the file names file and key.
TEST(Cli, GenerateSamplingDefaultsMatchTransformers) {
  QLORA_REQUIRE_FIXTURE(model, "models/llama_gqa/generate_ref.json");
  const nlohmann::json ref = nlohmann::json::parse(std::ifstream(model));
  const std::string gen = " --prompt " + sq(ref["prompt"]) + " --max-new-tokens 32 --dtype fp32 --ids";
  const auto ids_of = [](const CliRun& r) {
    std::vector<int64_t> v;
    std::istringstream is(last_line(r.out));
    for (int64_t x; is >> x;) v.push_back(x);
    return v;
  };
  const auto& dflt = ref["sample_default_top_k"];
  CliRun r = run("generate " + model.parent_path().string() + gen + " --temperature 0.8 --seed 11");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(ids_of(r), dflt["new_ids"].get<std::vector<int64_t>>()) << r.out;
  EXPECT_NE(r.out.find("generate: sampling (flags: do_sample true, temperature 0.8, max_new_tokens 32; transformers' "
                       "defaults: top_k 50, top_p 1, repetition_penalty 1)"), std::string::npos) << r.out;
  r = run("generate " + model.parent_path().string() + gen + " --temperature 0.8 --seed 11 --top-k 0");
  EXPECT_NE(ids_of(r), dflt["new_ids"].get<std::vector<int64_t>>()) << "--top-k 0 is off";
  // generation_config.json's top_k 20 is the default; the "sample" reference used top_k 20
  const fs::path d = temp_dir("topk");
  for (const auto& e : fs::directory_iterator(model.parent_path())) fs::copy_file(e.path(), d / e.path().filename());
  write(d / "generation_config.json", R"({"bos_token_id": 1, "eos_token_id": 2, "top_k": 20})");
  const auto& s = ref["sample"];
  r = run("generate " + d.string() + gen + " --temperature 0.8 --top-p 0.9 --seed 7");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(ids_of(r), s["new_ids"].get<std::vector<int64_t>>()) << r.out;
  EXPECT_NE(r.out.find((d / "generation_config.json").string() + ": top_k 20"), std::string::npos) << r.out;
  // --repetition-penalty with sampling (reference sample_penalty)
  const auto& sp = ref["sample_penalty"];
  r = run("generate " + d.string() + gen + " --temperature 0.7 --top-p 0.9 --repetition-penalty 1.3 --seed 5");
  EXPECT_EQ(ids_of(r), sp["new_ids"].get<std::vector<int64_t>>()) << r.out;
  write(d / "generation_config.json", R"({"bos_token_id": 1, "eos_token_id": 2, "top_k": "x"})");
  expect_clean_error(run("generate " + d.string() + gen + " --temperature 0.8"),
                     (d / "generation_config.json").string() + ": top_k: must be an integer >= 0, got \"x\"");
  // the file is read whole, greedy too, before the model loads
  expect_clean_error(run("generate " + d.string() + gen + " --greedy"),
                     (d / "generation_config.json").string() + ": top_k: must be an integer >= 0, got \"x\"");
  qlora::remove_tree(d);
}

// `qlora generate MODEL` with no decoding flag decodes as transformers' `torch.manual_seed(s);
// model.generate(ids)` on that dir (make_models.py generation_config_refs): llama_gqa_sampling's
// generation_config.json samples (do_sample, temperature 0.7, top_k 20, top_p 0.8,
// repetition_penalty 1.05, max_new_tokens 24); the flags override it key by key as generate()'s
// arguments do (--greedy = do_sample=False, --temperature 0.9 keeps sampling); with every flag
// given it is llama_gqa's own sampling reference; --prompts decodes each line the same way; the
// file's max_length counts the prompt. Before: greedy unless --temperature, 64 tokens.
TEST(Cli, GenerateDefaultsFromGenerationConfigMatchTransformers) {
  QLORA_REQUIRE_FIXTURE(sref, "models/llama_gqa_sampling/generate_ref.json");
  QLORA_REQUIRE_FIXTURE(lref, "models/llama_gqa_max_length/generate_ref.json");
  QLORA_REQUIRE_FIXTURE(gref, "models/llama_gqa/generate_ref.json");
  const nlohmann::json ref = nlohmann::json::parse(std::ifstream(sref));
  const std::string m = sref.parent_path().string(), gc = (sref.parent_path() / "generation_config.json").string();
  const std::string gen = " --prompt " + sq(ref["prompt"]) + " --dtype fp32 --ids";
  const auto ids_of = [](const CliRun& r) {
    std::vector<int64_t> v;
    std::istringstream is(last_line(r.out));
    for (int64_t x; is >> x;) v.push_back(x);
    return v;
  };
  const auto want = [&](const char* k) { return ref[k]["new_ids"].get<std::vector<int64_t>>(); };
  CliRun r = run("generate " + m + gen + " --seed 3");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(ids_of(r), want("default")) << r.out;
  EXPECT_NE(r.out.find("generate: sampling (" + gc + ": do_sample true, temperature 0.7, top_k 20, top_p 0.8, "
                       "repetition_penalty 1.05, max_new_tokens 24)"), std::string::npos) << r.out;
  r = run("generate " + m + gen + " --greedy");
  EXPECT_EQ(ids_of(r), want("greedy")) << r.out;
  EXPECT_NE(r.out.find("generate: greedy (flags: do_sample false; " + gc + ": repetition_penalty 1.05, max_new_tokens 24)"),
            std::string::npos) << r.out;
  EXPECT_EQ(ids_of(run("generate " + m + gen + " --temperature 0")), want("greedy"));  // 0 = greedy
  r = run("generate " + m + gen + " --temperature 0.9 --seed 4");
  EXPECT_EQ(ids_of(r), want("temperature")) << r.out;
  // every key from flags: llama_gqa's "sample" reference (no penalty, 32 tokens)
  const nlohmann::json g = nlohmann::json::parse(std::ifstream(gref));
  r = run("generate " + m + gen + " --temperature 0.8 --top-k 20 --top-p 0.9 --repetition-penalty 1 "
          "--max-new-tokens 32 --seed 7");
  EXPECT_EQ(ids_of(r), g["sample"]["new_ids"].get<std::vector<int64_t>>()) << r.out;
  r = run("generate " + m + gen + " --greedy --repetition-penalty 1 --max-new-tokens 32");
  EXPECT_EQ(ids_of(r), g["new_ids"].get<std::vector<int64_t>>()) << r.out;
  expect_clean_error(run("generate " + m + gen + " --greedy --temperature 0.5"),
                     "generate: --greedy contradicts --temperature 0.5");
  EXPECT_EQ(run("generate " + m + gen + " --greedy --do-sample").status, 2);  // excluded by the parser
  // --prompts: the same defaults, each line as --prompt alone
  const fs::path d = temp_dir("genconfig");
  write(d / "p.jsonl", nlohmann::json({{"prompt", ref["prompt"]}}).dump() + "\n");
  r = run("generate " + m + " --prompts " + (d / "p.jsonl").string() + " --dtype fp32 --seed 3");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(last_line(r.out))["ids"].get<std::vector<int64_t>>(), want("default")) << r.out;
  // max_length (prompt + new): 5 new tokens after this 12-token prompt, as transformers
  const nlohmann::json lr = nlohmann::json::parse(std::ifstream(lref));
  const std::string lm = lref.parent_path().string();
  r = run("generate " + lm + gen);
  EXPECT_EQ(ids_of(r), lr["default"]["new_ids"].get<std::vector<int64_t>>()) << r.out;
  EXPECT_EQ(ids_of(run("generate " + lm + gen + " --max-new-tokens 2")).size(), 2u);
  write(d / "long.jsonl", "{\"prompt\": \"a\"}\n" + nlohmann::json({{"prompt", ref["prompt"].get<std::string>() +
        " and then some more words, and then some more"}}).dump() + "\n");
  expect_clean_error(run("generate " + lm + " --prompts " + (d / "long.jsonl").string()),
                     (d / "long.jsonl").string() + ":2: prompt: ");
  expect_clean_error(run("generate " + lm + " --prompts " + (d / "long.jsonl").string()),
                     "tokens leave no new token under " + (lref.parent_path() / "generation_config.json").string() +
                     "'s max_length 17");
  // a bad value names the file and the key
  const fs::path bad = d / "m";
  fs::create_directories(bad);
  for (const auto& e : fs::directory_iterator(m)) fs::copy_file(e.path(), bad / e.path().filename());
  write(bad / "generation_config.json", R"({"bos_token_id": 1, "eos_token_id": 2, "do_sample": true, "top_p": 1.5})");
  expect_clean_error(run("generate " + bad.string() + gen),
                     (bad / "generation_config.json").string() + ": top_p: must be in (0, 1], got 1.5");
  qlora::remove_tree(d);
}

// Every --dtype takes torch's spellings too (the one dtype parser, model/options.h), as the
// config's model.dtype does: `--dtype float32` is `--dtype fp32`; anything else is a usage error.
TEST(Cli, DTypeOptionsTakeTorchSpellings) {
  const CliRun fp32 = run("estimate --preset tiny --dtype fp32");
  ASSERT_EQ(fp32.status, 0) << fp32.out;
  const CliRun float32 = run("estimate --preset tiny --dtype float32");
  EXPECT_EQ(float32.status, 0) << float32.out;
  EXPECT_EQ(float32.out, fp32.out);
  EXPECT_NE(run("estimate --preset tiny --dtype bfloat16").out, fp32.out);
  const CliRun bad = run("estimate --preset tiny --dtype float64");
  EXPECT_EQ(bad.status, 2) << bad.out;
  EXPECT_NE(bad.out.find("dtype 'float64' is not one of bf16, fp16, fp32, auto (or torch's bfloat16, float16, float32)"),
            std::string::npos) << bad.out;
  const CliRun auto16 = run("import-gguf /nonexistent.gguf --out /nonexistent_out --dtype float16");
  EXPECT_EQ(auto16.status, 2) << auto16.out;  // import-gguf stores bf16 or fp32 only
  EXPECT_NE(auto16.out.find("fp16 not in {bf16,fp32}"), std::string::npos) << auto16.out;
}

TEST(Cli, ConfigMissingAndBroken) {
  fs::path d = temp_dir("cfg");
  expect_clean_error(run("inspect " + d.string()), "config.json: not found");
  write(d / "config.json", "{\"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": 8}");
  expect_clean_error(run("inspect " + d.string()), "missing required field 'hidden_size'");
  write(d / "config.json", "{not json");
  expect_clean_error(run("inspect " + d.string()), "config.json:1:3: invalid JSON: syntax error while parsing object key");
  write(d / "config.json", "{\"architectures\": [\"BertModel\"]}");
  expect_clean_error(run("inspect " + d.string()), "'BertModel' is not supported");
  qlora::remove_tree(d);
}

// Every JSON file the commands read from a model, tokenizer or adapter directory, cut short as an
// interrupted copy leaves it, is named with the line and column where it ends (common/json_file.h);
// and a Git LFS pointer where a large file should be (a clone without git-lfs) is named as such
// instead of "header length ..." / "bad magic" / sentencepiece's "unk is not defined" (trial 24).
TEST(Cli, CutJsonFilesAndLfsPointersAreNamed) {
  QLORA_REQUIRE_FIXTURE(sharded, "models/mistral_sharded");
  QLORA_REQUIRE_FIXTURE(spm_model, "models/llama_gqa");
  QLORA_REQUIRE_FIXTURE(tok_json, "tokenizers/smollm2");
  const fs::path root = temp_dir("cut_json");
  auto copy_dir = [&](const fs::path& src, const std::string& name) {
    const fs::path d = root / name;
    qlora::remove_tree(d);
    fs::copy(src, d, fs::copy_options::recursive);
    return d;
  };
  auto cut = [](const fs::path& f) {  // keep the first half of the bytes
    std::ifstream in(f, std::ios::binary);
    const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    write(f, all.substr(0, all.size() / 2));
  };
  int checked = 0;
  auto expect_cut = [&](const CliRun& r, const fs::path& f) {  // the last line, one line (generate logs its options first)
    EXPECT_EQ(r.status, 1) << r.out;
    const size_t at = r.out.find("error: " + f.string() + ":");
    ASSERT_NE(at, std::string::npos) << r.out;
    EXPECT_EQ(r.out.find('\n', at), r.out.size() - 1) << r.out;
    const std::string after = r.out.substr(at + 7 + f.string().size());
    int line = 0, column = 0;
    EXPECT_EQ(std::sscanf(after.c_str(), ":%d:%d: invalid JSON: ", &line, &column), 2) << r.out;
    EXPECT_NE(r.out.find("; the file ends there (cut short?)"), std::string::npos) << r.out;
    ++checked;
  };
  for (const char* f : {"config.json", "model.safetensors.index.json"}) {
    const fs::path d = copy_dir(sharded, f);
    cut(d / f);
    expect_cut(run("inspect " + d.string()), d / f);
  }
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"}) {
    const fs::path d = copy_dir(tok_json, f);
    if (!fs::exists(d / f))  // a valid one first (the fixture dir has no special_tokens_map.json)
      write(d / f, std::string(f) == "generation_config.json" ? R"({"bos_token_id": 1, "eos_token_id": 2})"
                                                               : R"({"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"})");
    cut(d / f);
    expect_cut(run("tokenize " + d.string() + " --text hi"), d / f);
  }
  {
    const fs::path m = copy_dir(spm_model, "adapter_model"), a = root / "adapter";
    fs::create_directories(a);
    write(a / "adapter_config.json", R"({"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]})");
    cut(a / "adapter_config.json");
    expect_cut(run("generate " + m.string() + " --adapter " + a.string() + " --prompt hi --max-new-tokens 1"),
               a / "adapter_config.json");
  }
  EXPECT_EQ(checked, 7);
  // Git LFS pointers
  const std::string ptr = "version https://git-lfs.github.com/spec/v1\noid sha256:"
                          "4d1b5e3a8b1f0f6e1c9a2f3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f\nsize 17209920\n";
  const std::string tail = " itself: the repository was cloned without git-lfs (run `git lfs pull` in it)";
  const fs::path lfs = copy_dir(sharded, "lfs_shard");
  write(lfs / "model-00003-of-00006.safetensors", ptr);
  expect_clean_error(run("inspect " + lfs.string()),
                     (lfs / "model-00003-of-00006.safetensors").string() + ": a Git LFS pointer file, not the safetensors file" + tail);
  const fs::path spm = copy_dir(spm_model, "lfs_spm");
  write(spm / "tokenizer.model", ptr);
  expect_clean_error(run("tokenize " + spm.string() + " --text hi"),
                     (spm / "tokenizer.model").string() + ": a Git LFS pointer file, not the sentencepiece model" + tail);
  write(spm / "tokenizer.model", "");
  expect_clean_error(run("tokenize " + spm.string() + " --text hi"),
                     (spm / "tokenizer.model").string() + ": empty file, not a sentencepiece model (an interrupted copy?)");
  const fs::path tj = copy_dir(tok_json, "lfs_tokenizer_json");
  write(tj / "tokenizer.json", ptr);
  expect_clean_error(run("tokenize " + tj.string() + " --text hi"),
                     (tj / "tokenizer.json").string() + ": a Git LFS pointer file, not the JSON file" + tail);
  write(root / "model.gguf", ptr);
  expect_clean_error(run("import-gguf " + (root / "model.gguf").string() + " --out " + (root / "imported").string()),
                     (root / "model.gguf").string() + ": a Git LFS pointer file, not the GGUF file" + tail);
  EXPECT_FALSE(fs::exists(root / "imported"));
  qlora::remove_tree(root);
}

TEST(Cli, CorruptSafetensorsAndMissingTokenizer) {
  QLORA_REQUIRE_FIXTURE(src, "models/qwen2_bias");
  fs::path d = temp_dir("corrupt");
  fs::copy_file(src / "config.json", d / "config.json");
  // generate without a tokenizer: names the missing file
  fs::copy_file(src / "model.safetensors", d / "model.safetensors");
  expect_clean_error(run("generate " + d.string() + " --prompt hi"), "tokenizer.model");
  // truncated file
  fs::resize_file(d / "model.safetensors", fs::file_size(d / "model.safetensors") / 2);
  expect_clean_error(run("inspect " + d.string()), "model.safetensors");
  qlora::remove_tree(d);
}

}  // namespace
