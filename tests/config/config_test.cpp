// test_config: the training-config schema (config/config.h).
// Every shipped config validates; overrides, number notations, booleans, defaults, cross-field
// rules and the to_yaml round trip. The bad-config corpus lives in tests/badinput/badinput_config.cpp.
#include <gtest/gtest.h>

#include <regex>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include "common/files.h"
#include "common/error.h"
#include "tests/test_util.h"
#include "config/config.h"

namespace qlora {
namespace {

const char* const kMinimal = R"(
output_dir: runs/t
model: {path: models/m}
data: {train: train.jsonl}
)";

Config parse(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return parse_config_string(text, "t.yaml", overrides);
}

/// The error message of parsing `text`, or "" when it parses.
std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse(text, overrides);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::vector<std::filesystem::path> shipped_configs() {
  std::vector<std::filesystem::path> out;
  for (const char* dir : {"configs", "examples"}) {
    const auto root = test::source_dir() / dir;
    if (!std::filesystem::exists(root)) continue;
    for (const auto& e : std::filesystem::recursive_directory_iterator(root))
      if (e.is_regular_file() && (e.path().extension() == ".yaml" || e.path().extension() == ".yml"))
        out.push_back(e.path());
  }
  return out;
}

TEST(Config, EveryShippedConfigValidatesAndRoundTrips) {
  const auto files = shipped_configs();
  ASSERT_GE(files.size(), 3u) << "expected configs/llama2, configs/mistral, configs/tiny";
  for (const auto& f : files) {
    SCOPED_TRACE(f.string());
    Config c;
    ASSERT_NO_THROW(c = load_config(f.string())) << [&] {
      try { load_config(f.string()); } catch (const std::exception& e) { return std::string(e.what()); }
      return std::string();
    }();
    EXPECT_EQ(parse(to_yaml(c)), c) << to_yaml(c);
  }
}

TEST(Config, ShippedConfigsStartWithTheirRunLine) {
  for (const auto& f : shipped_configs()) {
    if (f.string().find("/configs/") == std::string::npos) continue;
    std::ifstream in(f);
    std::string first;
    std::getline(in, first);
    const auto rel = std::filesystem::relative(f, test::source_dir()).generic_string();
    EXPECT_EQ(first, "# qlora train " + rel);
  }
}

// The shipped model configs hold eval data out of data.train (val_set_size), so `--set
// data.train=my.jsonl` alone is a working run (issue: configs/mistral named a fixed data/eval.jsonl);
// and a family template is the one of the model the config names (issue: configs/mistral used v0.3
// Instruct's template, with its [TOOL_CALLS] tokens, on the base Mistral-7B-v0.1, which has none).
TEST(Config, ShippedModelConfigsAreCoherent) {
  const std::map<std::string, std::pair<std::string, std::string>> want = {  // config: model.path, template
      {"llama2/7b_qlora.yaml", {"models/Llama-2-7b-hf", "llama2"}},
      {"llama3/8b_qlora.yaml", {"models/Meta-Llama-3-8B-Instruct", "llama3"}},
      {"mistral/7b_qlora.yaml", {"models/Mistral-7B-Instruct-v0.3", "mistral"}},
      {"qwen2.5/7b_qlora.yaml", {"models/Qwen2.5-7B-Instruct", "qwen2.5"}},
      {"qwen3/8b_qlora.yaml", {"models/Qwen3-8B", "qwen3"}},
      {"smollm2/135m_qlora.yaml", {"models/SmolLM2-135M-Instruct", "smollm2"}},
  };
  for (const auto& [file, mt] : want) {
    SCOPED_TRACE(file);
    const std::string path = (test::source_dir() / "configs" / file).string();
    const Config c = load_config(path);
    EXPECT_EQ(c.model.path, mt.first);
    EXPECT_EQ(c.data.template_name, mt.second);
    EXPECT_TRUE(c.data.eval.empty()) << "a fixed data.eval file";
    EXPECT_GT(c.data.val_set_size, 0.0);
    EXPECT_NO_THROW(load_config(path, {"data.train=my.jsonl"}));
  }
}

// What a valid config does that its writer may not mean: a line each, for the commands that use the
// config as the user's to log (train, data preview, eval CONFIG); nothing for the defaults.
TEST(Config, WarningsNameWhatIsIgnoredOrNeverLeft) {
  EXPECT_TRUE(config_warnings(parse_config_string(kMinimal, "t.yaml")).empty());
  const Config c = parse_config_string(kMinimal, "t.yaml",
                                       {"data.eval=e.jsonl", "data.val_set_size=0.05", "training.max_steps=10"});
  EXPECT_EQ(config_warnings(c),
            (std::vector<std::string>{
                "config: data.val_set_size (0.05) is ignored because data.eval is set",
                "config: training.warmup_steps (10) >= training.max_steps (10): the run never leaves warmup"}));
  // transformers' constant never warms up (a trial: ours did, from the default warmup_steps 10): a
  // warmup the file sets is said to be unused; the default is not one
  const Config constant = parse_config_string(kMinimal, "t.yaml", {"training.lr_scheduler=constant"});
  EXPECT_EQ(constant.training.warmup_steps, 0);
  EXPECT_TRUE(config_warnings(constant).empty());
  EXPECT_EQ(config_warnings(parse_config_string(kMinimal, "t.yaml", {"training.lr_scheduler=constant",
                                                                     "training.warmup_ratio=0.03"})),
            (std::vector<std::string>{"config: training.lr_scheduler constant does not warm up, as transformers' "
                                      "constant: training.warmup_ratio (0.03) is not used (lr_scheduler: "
                                      "constant_with_warmup warms up, then stays constant)"}));
  const Config c5 = parse_config_string(kMinimal, "t.yaml",
                                        {"training.lr_scheduler=constant", "training.warmup_steps=5", "training.max_steps=5"});
  EXPECT_EQ(config_warnings(c5),
            (std::vector<std::string>{"config: training.lr_scheduler constant does not warm up, as transformers' "
                                      "constant: training.warmup_steps (5) is not used (lr_scheduler: "
                                      "constant_with_warmup warms up, then stays constant)"}));
  EXPECT_EQ(parse_config_string(kMinimal, "t.yaml", {"training.lr_scheduler=constant_with_warmup"}).training.warmup_steps, 10);
}

TEST(Config, DefaultsMatchTheDocumentedSchema) {
  const Config c = parse(kMinimal);
  EXPECT_EQ(c.output_dir, "runs/t");
  EXPECT_EQ(c.model.path, "models/m");
  EXPECT_EQ(c.model.dtype, DType::kBF16);
  EXPECT_FALSE(c.model.random_init);
  EXPECT_EQ(c.quantization.quant_type, kernels::Quant4Type::NF4);
  EXPECT_TRUE(c.quantization.double_quant);
  EXPECT_EQ(c.quantization.blocksize, 64);
  EXPECT_EQ(c.quantization.keep_16bit, (std::vector<std::string>{"embed_tokens", "norm", "lm_head"}));
  EXPECT_EQ(c.lora.r, 16);
  EXPECT_EQ(c.lora.alpha, 32.0);
  EXPECT_EQ(c.lora.dropout, 0.05);
  EXPECT_EQ(c.lora.target_modules, std::vector<std::string>{kAllLinear});  // all-linear
  EXPECT_EQ(expand_target_modules(c.lora.target_modules), llama_linear_names());
  EXPECT_EQ(data::source_paths(c.data.train), "train.jsonl");
  EXPECT_EQ(c.data.template_name, "chatml");
  EXPECT_EQ(c.data.sequence_len, 2048);
  EXPECT_EQ(c.training.micro_batch_size, 1);
  EXPECT_EQ(c.training.gradient_accumulation_steps, 8);
  EXPECT_EQ(c.training.max_steps, -1);
  EXPECT_EQ(c.training.learning_rate, 2.0e-4);
  EXPECT_EQ(c.training.lr_scheduler, LrScheduler::kCosine);
  EXPECT_EQ(c.training.adam_epsilon, 1e-8);
  EXPECT_EQ(c.checkpoint.resume, ResumeMode::kAuto);
  EXPECT_EQ(c.checkpoint.keep_last, 3);
  EXPECT_EQ(c.cost.gpu_hour_price, 0.0);
}

TEST(Config, NumbersInEveryYamlNotation) {
  struct Case { const char* text; double want; };
  for (const Case& k : {Case{"1e-4", 1e-4}, Case{"2.0e-4", 2.0e-4}, Case{".5", 0.5}, Case{"100", 100.0},
                        Case{"0x10", 16.0}, Case{"0o10", 8.0}, Case{"1_000", 1000.0}, Case{"+3.", 3.0},
                        Case{"1E-3", 1e-3}, Case{"5e+2", 500.0}}) {
    SCOPED_TRACE(k.text);
    const Config c = parse(kMinimal, {std::string("training.learning_rate=") + k.text});
    EXPECT_EQ(c.training.learning_rate, k.want);
  }
  // Integer keys take integers in any notation, and floats with an integral value.
  EXPECT_EQ(parse(kMinimal, {"data.sequence_len=0x800"}).data.sequence_len, 2048);
  EXPECT_EQ(parse(kMinimal, {"training.max_steps=1e4"}).training.max_steps, 10000);
  EXPECT_EQ(parse(kMinimal, {"lora.r=8.0"}).lora.r, 8);
  EXPECT_NE(error_of(kMinimal, {"lora.r=8.5"}).find("lora.r: expected a positive integer, got 8.5"),
            std::string::npos);
  // A quoted number is a string.
  EXPECT_NE(error_of(kMinimal, {"lora.alpha='32'"}).find("(a quoted string)"), std::string::npos);
  // Not finite.
  EXPECT_NE(error_of(kMinimal, {"training.learning_rate=.inf"}).find("expected a positive number"),
            std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"training.learning_rate=1e999"}).find("expected a positive number"),
            std::string::npos);
}

TEST(Config, BooleansAreYaml12Core) {
  for (const char* t : {"true", "True", "TRUE"})
    EXPECT_TRUE(parse(kMinimal, {std::string("lora.use_rslora=") + t}).lora.use_rslora) << t;
  for (const char* f : {"false", "False", "FALSE"})
    EXPECT_FALSE(parse(kMinimal, {std::string("quantization.double_quant=") + f}).quantization.double_quant) << f;
  for (const char* bad : {"yes", "no", "on", "off", "1", "'true'"}) {
    const std::string e = error_of(kMinimal, {std::string("lora.use_rslora=") + bad});
    EXPECT_NE(e.find("lora.use_rslora: expected true or false"), std::string::npos) << bad << ": " << e;
  }
  EXPECT_NE(error_of(kMinimal, {"lora.use_rslora=yes"}).find("YAML 1.2"), std::string::npos);
}

TEST(Config, OverridesApplyBeforeValidation) {
  const Config c = parse(kMinimal, {"training.learning_rate=1e-4", "lora.target_modules=[q_proj, v_proj]",
                                    "data.field_map={instruction: prompt}", "cost.gpu_hour_price=2.5",
                                    "output_dir=runs/other", "checkpoint.resume=runs/t/checkpoints/step-100"});
  EXPECT_EQ(c.training.learning_rate, 1e-4);
  EXPECT_EQ(c.lora.target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));  // not all-linear
  EXPECT_EQ(c.data.field_map.at("instruction"), "prompt");
  EXPECT_EQ(c.cost.gpu_hour_price, 2.5);
  EXPECT_EQ(c.output_dir, "runs/other");
  EXPECT_EQ(c.checkpoint.resume, ResumeMode::kPath);
  EXPECT_EQ(c.checkpoint.resume_path, "runs/t/checkpoints/step-100");
  // Later overrides win; an override can supply a missing required key.
  EXPECT_EQ(parse(kMinimal, {"lora.r=4", "lora.r=8"}).lora.r, 8);
  EXPECT_EQ(data::source_paths(parse("output_dir: o\nmodel: {path: m}\n", {"data.train=x.jsonl"}).data.train), "x.jsonl");
  // An empty section in the file can be filled by an override.
  EXPECT_EQ(parse(std::string(kMinimal) + "cost:\n", {"cost.gpu_hour_price=1"}).cost.gpu_hour_price, 1.0);
}

TEST(Config, OverrideErrorsNameTheOverride) {
  EXPECT_EQ(error_of(kMinimal, {"training.lerning_rate=1e-4"}),
            "--set training.lerning_rate=1e-4: training.lerning_rate: unknown key; did you mean \"learning_rate\"?");
  EXPECT_EQ(error_of(kMinimal, {"training.micro_batch_size=four"}),
            "--set training.micro_batch_size=four: training.micro_batch_size: expected a positive integer, got \"four\"");
  EXPECT_EQ(error_of(kMinimal, {"no_equals_sign"}), "--set no_equals_sign: expected section.key=value");
  EXPECT_EQ(error_of(kMinimal, {"training..seed=1"}),
            "--set training..seed=1: expected section.key=value, got an empty key name");
  EXPECT_EQ(error_of(kMinimal, {"output_dir.x=1"}),
            "--set output_dir.x=1: output_dir is not a section (it holds \"runs/t\")");
  EXPECT_NE(error_of(kMinimal, {"lora.r=[1"}).find("--set lora.r=[1: value is not valid YAML"), std::string::npos);
}

TEST(Config, ErrorsNameFileLineAndKey) {
  const std::string text = "output_dir: o\nmodel: {path: m}\ndata: {train: t}\ntraining:\n  micro_batch_size: four\n";
  EXPECT_EQ(error_of(text), "t.yaml:5: training.micro_batch_size: expected a positive integer, got \"four\"");
  const std::string misplaced = std::string(kMinimal) + "learning_rate: 1e-4\n";
  EXPECT_EQ(error_of(misplaced),
            "t.yaml:5: learning_rate: unknown key; did you mean \"training.learning_rate\" (it belongs under training:)?");
  // Axolotl / PEFT names get ours, top level or inside a section
  EXPECT_EQ(error_of(std::string(kMinimal) + "lora_alpha: 32\n"),
            "t.yaml:5: lora_alpha: unknown key; Axolotl / Hugging Face / torchtune's \"lora_alpha\" is "
            "\"lora.alpha\" here (docs/config.md)");
  EXPECT_EQ(error_of(kMinimal, {"model.base_model=x"}),
            "--set model.base_model=x: model.base_model: unknown key; Axolotl / Hugging Face's \"base_model\" is "
            "\"model.path\" here (docs/config.md)");
}

// data.deduplicate (Axolotl's dataset_exact_deduplication): a bool, false by default, written back
// by to_yaml (config.resolved.yaml shows it, a resume compares it), read back equal; Axolotl's name,
// at the top level or in the data section, is answered with ours.
TEST(Config, DeduplicateKeyAndAxolotlsName) {
  EXPECT_FALSE(parse(kMinimal).data.deduplicate);
  const Config on = parse(kMinimal, {"data.deduplicate=true"});
  EXPECT_TRUE(on.data.deduplicate);
  EXPECT_NE(to_yaml(on).find("\n  deduplicate: true\n"), std::string::npos) << to_yaml(on);
  EXPECT_NE(to_yaml(parse(kMinimal)).find("\n  deduplicate: false\n"), std::string::npos);
  EXPECT_EQ(parse(to_yaml(on)), on);
  EXPECT_FALSE(parse(to_yaml(on)) == parse(kMinimal)) << "deduplicate is part of a config's identity";
  EXPECT_EQ(error_of("output_dir: o\nmodel: {path: m}\ndata: {train: t, deduplicate: 2}\n"),
            "t.yaml:3: data.deduplicate: expected true or false, got 2");
  const std::string hint = "unknown key; Axolotl's \"dataset_exact_deduplication\" is \"data.deduplicate\" here "
                           "(true: drop exact duplicate records in data.train before the val_set_size hold-out, in "
                           "data.eval, and data.eval records also in data.train) (docs/config.md)";
  EXPECT_EQ(error_of(std::string(kMinimal) + "dataset_exact_deduplication: true\n"),
            "t.yaml:5: dataset_exact_deduplication: " + hint);
  EXPECT_EQ(error_of("output_dir: o\nmodel: {path: m}\ndata: {train: t, dataset_exact_deduplication: true}\n"),
            "t.yaml:3: data.dataset_exact_deduplication: " + hint);
}

// A config brought over from Axolotl has many wrong keys; one run names every one of them (issue:
// a user needed 8 runs of `qlora train`, one hint each). Each line reads exactly as that error
// alone would; lines with a place in the file come in file order, then the --set ones.
TEST(Config, EveryErrorOfAConfigInOneRun) {
  const std::string text =
      "base_model: models/m\n"                        // 1: an Axolotl name
      "output_dir: runs/t\n"                          // 2
      "model: {path: models/m, dtype: float64}\n"     // 3: a value out of its choices
      "lora_r: 16\n"                                  // 4: an Axolotl name
      "learning_rate: 2e-4\n"                         // 5: a key of another section
      "data:\n"                                       // 6
      "  train:\n"                                    // 7
      "    - path: a.jsonl\n"                         // 8
      "      type: alpaca\n"                          // 9: an Axolotl entry key
      "  sequence_len: 0\n"                           // 10: out of range
      "lora:\n"                                       // 11
      "  target_modules: [q_proj, v_prj, k_prjo]\n"   // 12: two unknown modules
      "training:\n"                                   // 13
      "  micro_batch_size: four\n"                    // 14: not a number
      "  lerning_rate: 1e-4\n"                        // 15: a typo
      "  num_epochs: 0\n";                            // 16: a cross-key rule (nothing to train): after the keys
  const std::vector<std::string> want = {
      "t.yaml:1: base_model: unknown key; Axolotl / Hugging Face's \"base_model\" is \"model.path\" here (docs/config.md)",
      "t.yaml:3: model.dtype: expected one of bf16|fp16|fp32|auto (or torch's bfloat16|float16|float32), got \"float64\"",
      "t.yaml:4: lora_r: unknown key; Axolotl / Hugging Face's \"lora_r\" is \"lora.r\" here (docs/config.md)",
      "t.yaml:5: learning_rate: unknown key; did you mean \"training.learning_rate\" (it belongs under training:)?",
      "t.yaml:9: data.train[0].type: unknown key; Axolotl's \"type\" is \"format\" here (alpaca|sharegpt|messages|completion; "
      "Axolotl's chat_template type is messages) (docs/config.md)",
      "t.yaml:10: data.sequence_len: expected a token count in 1..2147483647, got 0",
      "t.yaml:12: lora.target_modules[1]: unknown module \"v_prj\"; did you mean \"v_proj\"?",
      "t.yaml:12: lora.target_modules[2]: unknown module \"k_prjo\"; did you mean \"k_proj\"?",
      "t.yaml:14: training.micro_batch_size: expected a positive integer, got \"four\"",
      "t.yaml:15: training.lerning_rate: unknown key; did you mean \"learning_rate\"?",
  };
  auto lines_of = [](const std::string& msg) {
    std::vector<std::string> out;
    std::istringstream is(msg);
    for (std::string l; std::getline(is, l);) out.push_back(l);
    return out;
  };
  EXPECT_EQ(lines_of(error_of(text)), want);
  // Thrown as an ErrorList (qlora prints each line as an error of its own); one error stays a
  // plain Error whose message is that one line.
  try {
    parse(text);
    ADD_FAILURE() << "parsed";
  } catch (const ErrorList& e) {
    EXPECT_EQ(e.lines(), want);
  }
  try {
    parse(kMinimal, {"lora.r=0"});
  } catch (const Error& e) {
    EXPECT_EQ(typeid(e), typeid(Error));
    EXPECT_EQ(std::string(e.what()), "--set lora.r=0: lora.r: expected a positive integer, got 0");
  }
  // Each line is the error the config gives with only that mistake.
  EXPECT_EQ(error_of(std::string(kMinimal) + "lora_r: 16\n"),
            "t.yaml:5: lora_r: unknown key; Axolotl / Hugging Face's \"lora_r\" is \"lora.r\" here (docs/config.md)");
  // A --set keeps its own source and comes after the file's lines.
  std::vector<std::string> with_set = want;
  with_set.push_back("--set training.seed=-1: training.seed: expected an integer >= 0, got -1");
  EXPECT_EQ(lines_of(error_of(text, {"training.seed=-1"})), with_set);
  // The cross-key rules run once the keys are clean, and name every broken rule.
  const std::string fixed = "output_dir: runs/t\nmodel: {path: models/m}\ndata:\n  train: a.jsonl\n"
                            "training:\n  num_epochs: 0\n  eval_steps: 5\n";
  EXPECT_EQ(lines_of(error_of(fixed)),
            (std::vector<std::string>{
                "t.yaml:6: training.num_epochs: nothing to train: set training.num_epochs > 0 or training.max_steps > 0",
                "t.yaml:7: training.eval_steps: no eval data: set data.eval or data.val_set_size > 0, or eval_steps: 0"}));
}

// checkpoint.keep_best ranks checkpoints by their eval_loss: without eval data none has one, so it
// is a one-line error naming the key and where it was set; default false (today's pruning).
TEST(Config, KeepBestNeedsEvalData) {
  EXPECT_FALSE(parse(kMinimal).checkpoint.keep_best);
  const std::string why = "checkpoint.keep_best: no eval data, so no checkpoint has an eval_loss: set data.eval or "
                          "data.val_set_size > 0, or keep_best: false";
  EXPECT_EQ(error_of("output_dir: runs/t\nmodel: {path: models/m}\ndata:\n  train: a.jsonl\ncheckpoint:\n"
                     "  keep_last: 1\n  keep_best: true\n"),
            "t.yaml:7: " + why);
  EXPECT_EQ(error_of(kMinimal, {"checkpoint.keep_best=true"}), "--set checkpoint.keep_best=true: " + why);
  EXPECT_TRUE(parse(kMinimal, {"checkpoint.keep_best=true", "data.val_set_size=0.1"}).checkpoint.keep_best);
  EXPECT_TRUE(parse(kMinimal, {"checkpoint.keep_best=true", "data.eval=e.jsonl"}).checkpoint.keep_best);
  EXPECT_NE(to_yaml(parse(kMinimal)).find("keep_best: false"), std::string::npos);
}

// What follows from an error is not reported as an error of its own: a missing or malformed
// section's keys are not "missing"; a refused list item does not make the list "empty".
TEST(Config, ErrorsDoNotCascade) {
  EXPECT_EQ(error_of("output_dir: o\nmodel: {path: m}\n"), "t.yaml: data: required section is missing");
  EXPECT_EQ(error_of("output_dir: o\nmodel: {path: m}\ndata: [a.jsonl]\n"),
            "t.yaml:3: data: expected a map of keys, got a list");
  EXPECT_EQ(error_of(std::string(kMinimal) + "lora: {target_modules: [[q_proj]]}\n"),
            "t.yaml:5: lora.target_modules[0]: expected a name, got a list");
  EXPECT_EQ(error_of(std::string(kMinimal) + "checkpoint: {resume: [a]}\n"),
            "t.yaml:5: checkpoint.resume: expected a string, got a list");
  // Two mistakes in one list entry and a second entry: all three (on one line: by column).
  EXPECT_EQ(error_of("output_dir: o\nmodel: {path: m}\ndata:\n  train:\n    - {path: a, format: alpacca, ds_type: json}\n"
                     "    - {format: sharegpt}\n"),
            "t.yaml:5: data.train[0].format: expected one of auto|alpaca|sharegpt|messages|completion, got \"alpacca\"; "
            "did you mean \"alpaca\"?\n"
            "t.yaml:5: data.train[0].ds_type: unknown key; Axolotl's \"ds_type\" is \"format\" here; the file type comes "
            "from the extension (.json, .jsonl, .txt) (docs/config.md)\n"
            "t.yaml:6: data.train[1].path: required key is missing");
  // A config of nothing but wrong keys lists the first 50 and counts the rest.
  std::string many = kMinimal;
  for (int i = 0; i < 60; ++i) many += "junk_key_" + std::to_string(i) + ": 1\n";
  const std::string msg = error_of(many);
  EXPECT_EQ(std::count(msg.begin(), msg.end(), '\n'), 50) << msg;
  EXPECT_EQ(msg.substr(msg.rfind('\n') + 1), "t.yaml: 10 more errors not listed");
  EXPECT_EQ(msg.rfind("t.yaml:5: junk_key_0: unknown key", 0), 0u) << msg;
}

// More Axolotl / Hugging Face names (issue: a new user's Axolotl config): each answered with the
// key(s) that do the same here, or what to do instead when there is none.
TEST(Config, AxolotlAndHuggingFaceNamesGetOurs) {
  auto top = [](const std::string& line) { return error_of(std::string(kMinimal) + line + "\n"); };
  const std::string p = "t.yaml:5: ";
  EXPECT_EQ(top("bnb_4bit_compute_dtype: bfloat16"),
            p + "bnb_4bit_compute_dtype: unknown key; Axolotl / Hugging Face's \"bnb_4bit_compute_dtype\" is "
                "\"model.dtype\" here (docs/config.md)");
  EXPECT_EQ(top("load_in_8bit: true"),
            p + "load_in_8bit: unknown key; Axolotl / Hugging Face's \"load_in_8bit\" has no key here: 8-bit bitsandbytes "
                "bases are not supported; \"quantization.method: nf4\" (or fp4) quantizes the base to 4 bits, none keeps "
                "it in model.dtype (docs/config.md)");
  EXPECT_EQ(top("strict: false"),
            p + "strict: unknown key; Axolotl / Hugging Face's \"strict\" has no key here: every config is read strictly "
                "(an unknown key is an error, as here) (docs/config.md)");
  EXPECT_EQ(top("save_total_limit: 2"),
            p + "save_total_limit: unknown key; Axolotl / Hugging Face's \"save_total_limit\" is \"checkpoint.keep_last\" "
                "here (docs/config.md)");
  for (const char* k : {"evaluation_strategy", "eval_strategy"})
    EXPECT_EQ(top(std::string(k) + ": steps"),
              p + k + ": unknown key; Axolotl / Hugging Face's \"" + k + "\" is \"training.eval_steps\" here (we count "
              "optimizer steps; 0: at the end of each epoch) (docs/config.md)");
  EXPECT_EQ(top("save_strategy: steps"),
            p + "save_strategy: unknown key; Axolotl / Hugging Face's \"save_strategy\" is \"checkpoint.save_steps\" here "
                "(we count optimizer steps; checkpoint.save_minutes saves by wall time) (docs/config.md)");
  EXPECT_EQ(top("datasets: [a.jsonl]"),
            p + "datasets: unknown key; Axolotl / Hugging Face's \"datasets\" is \"data.train\" here: a path, or a list "
                "of files whose examples are concatenated in order, each a path or {path: FILE, format: sharegpt, "
                "field_map: {...}, role_map: {...}} (docs/config.md)");
  EXPECT_EQ(top("lora_model_dir: ./old"),
            p + "lora_model_dir: unknown key; Axolotl / Hugging Face's \"lora_model_dir\" is \"lora.model_dir\" "
                "here (docs/config.md)");
  EXPECT_EQ(top("chat_template: tokenizer_default"),
            p + "chat_template: unknown key; Axolotl / Hugging Face's \"chat_template\" is \"data.template\" here (its "
                "tokenizer_default is template: auto; the names: docs/data.md, e.g. mistral is Mistral v0.3's jinja) "
                "(docs/config.md)");
  EXPECT_EQ(top("adapter: qlora"),
            p + "adapter: unknown key; Axolotl / Hugging Face's \"adapter\" is \"quantization.method\" here (adapter: "
                "qlora is method: nf4, adapter: lora is method: none) (docs/config.md)");
  for (const char* k : {"optimizer", "optim"})
    EXPECT_EQ(top(std::string(k) + ": paged_adamw_8bit"),
              p + k + ": unknown key; " +
                  (k == std::string("optim") ? "Axolotl / Hugging Face" : "Axolotl / Hugging Face / torchtune") +
                  "'s \"" + k + "\" has no key here: qlora-cpp trains with AdamW only, tuned by "
                  "training.learning_rate, weight_decay, adam_beta1, adam_beta2, adam_epsilon, max_grad_norm "
                  "(docs/config.md)");
  // A top-level seed: both seeds, and what each drives (config/config.h, data/options.h).
  EXPECT_EQ(top("seed: 7"),
            p + "seed: unknown key; Axolotl / Hugging Face / torchtune's \"seed\" is two keys here: "
                "\"training.seed\" (LoRA initialisation and dropout) and \"data.seed\" (the epoch shuffle and the "
                "val_set_size hold-out) (docs/config.md)");
  EXPECT_EQ(top("peft_use_rslora: true"),
            p + "peft_use_rslora: unknown key; Axolotl / Hugging Face's \"peft_use_rslora\" is \"lora.use_rslora\" "
                "here (docs/config.md)");
  EXPECT_EQ(top("lora_modules_to_save: [embed_tokens, lm_head]"),
            p + "lora_modules_to_save: unknown key; Axolotl / Hugging Face's \"lora_modules_to_save\" has no key "
                "here: only LoRA adapters train (no whole trained copy of lm_head or embed_tokens), so no token can "
                "be added to the vocabulary (docs/config.md)");
  EXPECT_EQ(top("torch_dtype: bfloat16"),
            p + "torch_dtype: unknown key; Axolotl / Hugging Face's \"torch_dtype\" is \"model.dtype\" here "
                "(docs/config.md)");
  // TRL's SFTConfig names (trial 23: a bare "unknown key")
  EXPECT_EQ(top("max_seq_length: 512"),
            p + "max_seq_length: unknown key; TRL's \"max_seq_length\" is \"data.sequence_len\" here (docs/config.md)");
  EXPECT_EQ(top("packing: true"),
            p + "packing: unknown key; TRL's \"packing\" is \"data.sample_packing\" here (best-fit decreasing, as "
                "TRL's packing_strategy bfd; attention kept within each example) (docs/config.md)");
  // The rest of a user trial's Axolotl config (issue: these got only "unknown key (expected one
  // of: ...)"): each says what this project does instead.
  const std::map<std::string, std::string> instead = {
      {"evals_per_epoch: 4", "has no key here: set \"training.eval_steps\" to S / evals_per_epoch, S being an "
                             "epoch's optimizer steps, ceil(micro-batches / gradient_accumulation_steps) (0: eval at "
                             "each epoch's end)"},
      {"saves_per_epoch: 1", "has no key here: set \"checkpoint.save_steps\" to S / saves_per_epoch, S being an "
                             "epoch's optimizer steps, ceil(micro-batches / gradient_accumulation_steps)"},
      {"pad_to_sequence_len: true", "has no key here: a batch is padded to its longest row; \"data.sample_packing: "
                                    "true\" fills rows up to data.sequence_len"},
      {"special_tokens: {pad_token: \"<|end_of_text|>\"}",
       "has no key here: BOS, EOS and PAD are the tokenizer's (tokenizer_config.json, special_tokens_map.json); "
       "batches are padded with EOS when it has no PAD, and no token is added to the vocabulary"},
      {"dataset_prepared_path: last_run_prepared",
       "has no key here: the data files are read and tokenised at the start of every run, nothing is cached "
       "(qlora data preview shows the result)"},
      {"model_type: LlamaForCausalLM", "has no key here: the architecture comes from \"model.path\"'s config.json "
                                       "(architectures), or from \"model.preset\""},
      {"tokenizer_type: AutoTokenizer", "has no key here: the tokenizer is read from \"model.path\" (tokenizer.json "
                                        "or tokenizer.model), or from \"model.tokenizer\""},
      {"flash_attention: true", "has no key here: attention is torch's SDPA, whose kernel (flash, memory-efficient "
                                "or math) torch picks for the device and dtype"},
      {"tf32: true", "has no key here: TF32 matmuls stay off (torch's default); \"model.dtype: bf16\" is the fast "
                     "GPU dtype"},
      {"rope_scaling: {type: linear, factor: 2}",
       "has no key here: RoPE scaling is read from \"model.path\"'s config.json (rope_scaling / rope_parameters: "
       "default, linear and llama3 run; other types are refused by name)"},
      {"group_by_length: false", "has no key here: rows are drawn in shuffled order (\"data.shuffle\"); "
                                 "\"data.sample_packing: true\" packs short examples into full rows instead"},
      // the QLoRA paper's keys as an Axolotl / HF user writes them (trial 12)
      {"lr_scheduler_kwargs: {min_lr: 1.0e-6}",
       "has no key here: each \"training.lr_scheduler\" runs with transformers' defaults (cosine and linear decay "
       "to 0, cosine_with_restarts one cycle, polynomial to 1e-7 at power 1)"},
      {"neftune_noise_alpha: 5", "has no key here: NEFTune (noise on the input embeddings) is not supported"},
  };
  // Axolotl / HF Trainer evaluation and reporting keys (issue: trial 8 got only "unknown key
  // (expected one of: ...)"): what evaluation does here (trainer/train.cpp evaluate_loss: rows of
  // micro_batch_size single examples; cli/commands_eval.cpp exact_match: reference length + 8).
  const std::string eval_batch = "has no key here: evaluation (eval_steps, qlora eval --metric loss) runs "
                                 "\"training.micro_batch_size\" examples a forward pass, each its own row, padded to "
                                 "the longest";
  const std::string metrics_file = "has no key here: nothing is sent to a tracker; every step's loss, lr, grad_norm, "
                                   "tokens and eval_loss are one JSON line in metrics.jsonl in output_dir "
                                   "(summary.json: the run's totals)";
  const std::string no_best = "has no key here: there is no choice by another metric and no early stopping; eval_loss "
                              "of each eval step is in metrics.jsonl, \"checkpoint.keep_best: true\" keeps the "
                              "checkpoint with the lowest eval_loss (summary.json best_eval.checkpoint) and "
                              "\"checkpoint.keep_last\" the newest: pass one (output_dir/checkpoints/checkpoint-N) to "
                              "qlora eval / generate / merge --adapter, or resume it into a new output_dir with "
                              "\"checkpoint.resume\": PATH and \"training.max_steps\": N to export its adapter";
  // load_best_model_at_end: keep_best keeps the best checkpoint from pruning as HF's rotation does,
  // but nothing loads it at the end; a checkpoint dir is an adapter for eval / generate / merge
  // (EvalCli.*, Generate.AdapterOfARunOrCheckpoint*: `--adapter RUN/checkpoints/checkpoint-N`).
  const std::string load_best = "is \"checkpoint.keep_best: true\" here without the load at the end: it keeps the "
                                "checkpoint with the lowest eval_loss besides the newest \"checkpoint.keep_last\" "
                                "(summary.json best_eval.checkpoint names it), and output_dir's adapter stays the last "
                                "step's; that checkpoint directory is an adapter: qlora eval CONFIG --adapter DIR, "
                                "qlora generate MODEL --adapter DIR, qlora merge --base MODEL --adapter DIR --out OUT";
  std::map<std::string, std::string> eval_keys = {
      {"test_datasets: [{path: held_out.jsonl, type: alpaca}]",
       "is \"data.eval\" here: a separate eval file, or a list of files as data.train takes (when set, "
       "data.val_set_size is not used)"},
      {"eval_batch_size: 4", eval_batch},
      {"per_device_eval_batch_size: 4", eval_batch},
      {"eval_sample_packing: false", "has no key here: evaluation never packs, each eval example is its own row "
                                     "(data.sample_packing packs training rows only)"},
      {"eval_max_new_tokens: 128", "has no key here: \"qlora eval --metric exact_match\" generates greedily up to "
                                   "each reference answer's length + 8 tokens; \"qlora generate --max-new-tokens N\" "
                                   "sets it for your own prompts"},
      {"do_causal_lm_eval: true", "has no key here: training evaluates eval_loss only; \"qlora eval --metric loss\" "
                                  "gives loss and perplexity, \"qlora eval --metric exact_match\" greedy exact match"},
  };
  for (const char* k : {"report_to: wandb", "logging_dir: ./logs", "wandb_project: p", "wandb_entity: e",
                        "wandb_name: n", "wandb_run_id: r", "wandb_watch: gradients", "wandb_log_model: end",
                        "wandb_mode: offline"})
    eval_keys[k] = metrics_file;
  for (const char* k : {"metric_for_best_model: eval_loss", "greater_is_better: false", "early_stopping_patience: 3"})
    eval_keys[k] = no_best;
  eval_keys["load_best_model_at_end: true"] = load_best;
  for (const auto& [line, hint] : eval_keys) {
    const std::string k = line.substr(0, line.find(':'));
    EXPECT_EQ(top(line), p + k + ": unknown key; Axolotl / Hugging Face's \"" + k + "\" " + hint + " (docs/config.md)");
  }
  for (const auto& [line, hint] : instead) {
    const std::string k = line.substr(0, line.find(':'));
    EXPECT_EQ(top(line), p + k + ": unknown key; Axolotl / Hugging Face's \"" + k + "\" " + hint + " (docs/config.md)");
  }
  // Axolotl's chat_template entry: message_property_mappings maps a message's property to the
  // file's key for it ({role: from, content: value}, docs.axolotl.ai dataset-formats/conversation),
  // which is our field_map's direction; in an entry, or flat in the data section.
  const std::string mpm = "unknown key; Axolotl's \"message_property_mappings\" is \"field_map\" here, the same way "
                          "round: {role: YOUR_ROLE_FIELD, content: YOUR_CONTENT_FIELD} for format: messages ({from: "
                          "..., value: ...} for sharegpt); the role names themselves go in \"role_map\" (docs/config.md)";
  EXPECT_EQ(error_of("output_dir: o\nmodel: {path: m}\ndata:\n  train:\n    - path: a.jsonl\n"
                     "      message_property_mappings: {role: from, content: value}\n"),
            "t.yaml:6: data.train[0].message_property_mappings: " + mpm);
  EXPECT_EQ(error_of("output_dir: o\nmodel: {path: m}\ndata:\n  train: a.jsonl\n"
                     "  message_property_mappings: {role: from, content: value}\n"),
            "t.yaml:5: data.message_property_mappings: " + mpm);
  // ... and what it says works: field_map {role: from, content: value} is accepted as written.
  EXPECT_EQ(parse("output_dir: o\nmodel: {path: m}\ndata:\n  train:\n    - path: a.jsonl\n      format: messages\n"
                  "      field_map: {role: from, content: value}\n")
                .data.train.at(0)
                .field_map.value(),
            (std::map<std::string, std::string>{{"content", "value"}, {"role", "from"}}));
  // Every hint names keys that exist: the sentence's keys are in the schema.
  std::vector<std::string> keys;
  for (const ConfigKey& k : config_keys()) keys.push_back(k.key);
  for (const char* k : {"checkpoint.keep_last", "checkpoint.keep_best", "training.eval_steps", "checkpoint.save_steps", "checkpoint.save_minutes",
                        "data.template", "quantization.method", "training.learning_rate", "training.weight_decay",
                        "training.adam_beta1", "training.adam_beta2", "training.adam_epsilon", "training.max_grad_norm",
                        "training.seed", "data.seed", "model.dtype", "data.sample_packing", "data.sequence_len",
                        "data.shuffle", "model.path", "model.preset", "model.tokenizer", "data.field_map",
                        "data.role_map", "training.gradient_accumulation_steps", "training.micro_batch_size",
                        "data.eval", "data.val_set_size", "checkpoint.resume", "training.max_steps"})
    EXPECT_NE(std::find(keys.begin(), keys.end(), k), keys.end()) << k;
  EXPECT_EQ(parse(kMinimal, {"data.template=auto"}).data.template_name, "auto");
  EXPECT_EQ(parse(kMinimal, {"quantization.method=none"}).quantization.quant_type, std::nullopt);
}

// torchtune's recipe config names (issue: a torchtune user's trial of a llama3_2/1B_lora_single_device
// config got no hint, or a wrong one: checkpointer -> "checkpoint", loss -> "lora"): each answered
// with the key(s) that do the same here, where they sit in torchtune's config (top level, or in
// its model / tokenizer / checkpointer / dataset / lr_scheduler sections).
TEST(Config, TorchtuneNamesGetOurs) {
  auto top = [](const std::string& line) { return error_of(std::string(kMinimal) + line + "\n"); };
  const std::string p = "t.yaml:5: ";
  const std::map<std::string, std::string> hints = {
      {"lora_rank: 64", "is \"lora.r\" here"},
      {"lora_attn_modules: [q_proj, v_proj, output_proj]",
       "is \"lora.target_modules\" here: q_proj, k_proj, v_proj as named, output_proj is o_proj"},
      {"apply_lora_to_mlp: true", "is \"lora.target_modules\" here: true is gate_proj, up_proj, down_proj in its "
                                  "list (torchtune's w1, w3, w2); all-linear is all seven"},
      {"apply_lora_to_output: false", "has no key here: LoRA on the output projection (lm_head) is not supported; "
                                      "\"lora.target_modules\" lists the decoder layers' projections"},
      {"tokenizer: {path: /tmp/m/original/tokenizer.model, max_seq_len: null}",
       "is \"model.tokenizer\" here for its path (unset: the tokenizer in model.path), and its max_seq_len is "
       "\"data.sequence_len\""},
      {"max_seq_len: 2048", "is \"data.sequence_len\" here"},
      {"checkpointer: {checkpoint_dir: /tmp/m, output_dir: o}",
       "is \"model.path\" here for its checkpoint_dir (the model directory: config.json, *.safetensors, found "
       "there without checkpoint_files), and its output_dir is the top-level \"output_dir\""},
      {"dataset: {packed: false}", "is the \"data\" section here: \"data.train\" is a local file (.json, .jsonl or "
                                   ".txt), its format \"data.format\"; column_map is \"data.field_map\", packed is "
                                   "\"data.sample_packing\", train_on_input is \"data.train_on_inputs\" (default "
                                   "false here; torchtune's alpaca_dataset defaults it to true)"},
      {"dataset_val: {split: validation}", "is \"data.eval\" here (a separate eval file; or \"data.val_set_size\" "
                                           "holds a part of data.train out)"},
      {"run_val_every_n_steps: 100", "is \"training.eval_steps\" here (optimizer steps; 0: at the end of each "
                                     "epoch)"},
      {"packed: true", "is \"data.sample_packing\" here (rows filled up to data.sequence_len, attention kept within "
                       "each example)"},
      {"batch_size: 4", "is \"training.micro_batch_size\" here (rows a forward pass, as torchtune's per-device batch; "
                        "gradient_accumulation_steps is ours too)"},
      {"epochs: 1", "is \"training.num_epochs\" here"},
      {"max_steps_per_epoch: 100", "has no key here: \"training.max_steps\" caps the whole run's optimizer steps, not "
                                   "each epoch's"},
      {"lr: 3e-4", "is \"training.learning_rate\" here"},
      {"num_warmup_steps: 100", "is \"training.warmup_steps\" here"},
      {"clip_grad_norm: 1.0", "is \"training.max_grad_norm\" here (null: 0, no clipping)"},
      {"loss: {_component_: torchtune.modules.loss.CEWithChunkedOutputLoss}",
       "has no key here: the loss is cross-entropy, the token-weighted mean over a step's label tokens (prompt "
       "tokens count only with data.train_on_inputs), as torchtune's CE losses"},
      {"log_every_n_steps: 1", "is \"training.logging_steps\" here (a console line every N optimizer steps; "
                               "metrics.jsonl has every step)"},
      {"metric_logger: {log_dir: logs}", "has no key here: nothing is sent to a tracker; every step's loss, lr, "
                                         "grad_norm, tokens and eval_loss are one JSON line in metrics.jsonl in "
                                         "output_dir (summary.json: the run's totals)"},
      {"enable_activation_checkpointing: false", "is \"training.gradient_checkpointing\" here (default true)"},
      {"enable_activation_offloading: false", "has no key here: activations stay on the GPU; "
                                              "\"training.gradient_checkpointing\" (default true) saves their memory"},
      {"compile: false", "has no key here: there is no torch.compile in LibTorch; the model runs eagerly"},
      {"save_adapter_weights_only: true",
       "has no key here: output_dir gets the PEFT adapter only (adapter_model.safetensors, adapter_config.json); "
       "\"qlora merge\" writes the merged model"},
      {"log_peak_memory_stats: true",
       "has no key here: every run measures its memory (peak allocated and reserved on CUDA, RSS on the CPU), logs "
       "it beside the estimate and writes memory_report.json in output_dir; every step's metrics.jsonl line has it"},
      {"profiler: {_component_: torchtune.training.setup_torch_profiler, enabled: false}",
       "has no key here: there is no profiler; metrics.jsonl has every step's time and tokens/s, \"qlora bench\" "
       "times steps and memory"},
      {"device: cuda", "has no key here: training runs on the GPU when CUDA sees one (cuda:LOCAL_RANK in a "
                       "data-parallel job), else on the CPU; CUDA_VISIBLE_DEVICES=\"\" makes it the CPU"},
      {"optimizer_in_bwd: false",
       "has no key here: AdamW steps after the backward of every \"training.gradient_accumulation_steps\" "
       "micro-batches; the LoRA gradients and AdamW states are small beside the 4-bit base"},
  };
  for (const auto& [line, hint] : hints) {
    const std::string k = line.substr(0, line.find(':'));
    EXPECT_EQ(top(line), p + k + ": unknown key; torchtune's \"" + k + "\" " + hint + " (docs/config.md)");
  }
  // Where torchtune's config has them: in the model section (a torchtune model section as written).
  const std::string model =
      "output_dir: o\ndata: {train: t}\nmodel:\n  path: m\n  _component_: torchtune.models.llama3_2.lora_llama3_2_1b\n"
      "  lora_rank: 64\n";
  EXPECT_EQ(error_of(model),
            "t.yaml:5: model._component_: unknown key; torchtune's \"_component_\" has no key here: nothing is built "
            "from a class name: the architecture comes from \"model.path\"'s config.json (or \"model.preset\"), data "
            "from local files (\"data.train\"); the optimizer is AdamW, the loss cross-entropy (docs/config.md)\n"
            "t.yaml:6: model.lora_rank: unknown key; torchtune's \"lora_rank\" is \"lora.r\" here (docs/config.md)");
  // column_map: in the data section or a data.train entry, as Axolotl's entry keys.
  const std::string column_map = "unknown key; torchtune's \"column_map\" is \"field_map\" here, the same way round: "
                                 "{instruction: YOUR_COLUMN, output: YOUR_COLUMN} (our field: the column in your file) "
                                 "(docs/config.md)";
  EXPECT_EQ(error_of("output_dir: o\nmodel: {path: m}\ndata:\n  train: a.jsonl\n  column_map: {output: answer}\n"),
            "t.yaml:5: data.column_map: " + column_map);
  EXPECT_EQ(error_of("output_dir: o\nmodel: {path: m}\ndata:\n  train:\n    - path: a.jsonl\n"
                     "      column_map: {output: answer}\n"),
            "t.yaml:6: data.train[0].column_map: " + column_map);
  // torchtune's dataset arguments source / split (a torchtune user's trial, session 21), in the data
  // section as in an entry.
  EXPECT_EQ(error_of("output_dir: o\nmodel: {path: m}\ndata:\n  train: a.jsonl\n  source: json\n"
                     "  split: train\n"),
            "t.yaml:5: data.source: unknown key; torchtune's \"source\" is what \"data.train\" names here (\"path\" "
            "in an entry of its list): a local file (.json, .jsonl or .txt, read by its extension; torchtune's source: "
            "json with data_files: FILE is data.train: FILE) (docs/config.md)\n"
            "t.yaml:6: data.split: unknown key; torchtune's \"split\" is not a key here: the whole file is read, and "
            "\"data.val_set_size\" holds a part out for evaluation (split: train[:95%] with the rest as validation is "
            "val_set_size: 0.05) (docs/config.md)");
  // Keys torchtune shares with Axolotl / HF: one hint, which names all three.
  EXPECT_EQ(top("resume_from_checkpoint: false"),
            p + "resume_from_checkpoint: unknown key; Axolotl / Hugging Face / torchtune's \"resume_from_checkpoint\" "
                "is \"checkpoint.resume\" here: true is auto (the newest checkpoint of output_dir), false is never, or "
                "a checkpoint path (docs/config.md)");
  EXPECT_EQ(top("lr_scheduler: {num_warmup_steps: 100}"),
            p + "lr_scheduler: unknown key; Axolotl / Hugging Face / torchtune's \"lr_scheduler\" is "
                "\"training.lr_scheduler\" here (cosine, linear, ...; torchtune's get_cosine_schedule_with_warmup is "
                "cosine, its num_warmup_steps \"training.warmup_steps\") (docs/config.md)");
  EXPECT_EQ(top("lora_dropout: 0.0"),
            p + "lora_dropout: unknown key; Axolotl / Hugging Face / torchtune's \"lora_dropout\" is \"lora.dropout\" "
                "here (docs/config.md)");
  // checkpoint.resume written as a boolean: the value that does the same.
  EXPECT_EQ(error_of(std::string(kMinimal) + "checkpoint: {resume: false}\n"),
            "t.yaml:5: checkpoint.resume: expected auto, never or a checkpoint path, got false; did you mean "
            "\"never\"? (a boolean resume_from_checkpoint: true is auto, false is never)");
  EXPECT_EQ(error_of(kMinimal, {"checkpoint.resume=True"}),
            "--set checkpoint.resume=True: checkpoint.resume: expected auto, never or a checkpoint path, got True; did "
            "you mean \"auto\"? (a boolean resume_from_checkpoint: true is auto, false is never)");
  EXPECT_NE(error_of(kMinimal, {"checkpoint.resume=no"}).find("did you mean \"never\"?"), std::string::npos);
  // ... and what it says works.
  EXPECT_EQ(parse(kMinimal, {"checkpoint.resume=never"}).checkpoint.resume, ResumeMode::kNever);
  // torchtune's module names in target_modules (its lora_attn_modules; FeedForward w1, w2, w3).
  EXPECT_EQ(error_of(std::string(kMinimal) + "lora: {target_modules: [q_proj, v_proj, output_proj, w1, w2, w3]}\n"),
            "t.yaml:5: lora.target_modules[2]: unknown module \"output_proj\"; torchtune's \"output_proj\" is "
            "\"o_proj\" here\n"
            "t.yaml:5: lora.target_modules[3]: unknown module \"w1\"; torchtune's \"w1\" is \"gate_proj\" here\n"
            "t.yaml:5: lora.target_modules[4]: unknown module \"w2\"; torchtune's \"w2\" is \"down_proj\" here\n"
            "t.yaml:5: lora.target_modules[5]: unknown module \"w3\"; torchtune's \"w3\" is \"up_proj\" here");
  // Every hint names keys that exist.
  std::vector<std::string> keys;
  for (const ConfigKey& k : config_keys()) keys.push_back(k.key);
  for (const char* k : {"lora.r", "lora.target_modules", "model.tokenizer", "data.sequence_len", "model.path",
                        "output_dir", "data.train", "data.format", "data.field_map", "data.sample_packing",
                        "training.micro_batch_size", "training.gradient_accumulation_steps", "training.num_epochs",
                        "training.max_steps", "training.learning_rate", "training.warmup_steps",
                        "training.max_grad_norm", "data.train_on_inputs", "training.logging_steps",
                        "training.gradient_checkpointing", "checkpoint.resume", "lora.dropout",
                        "training.lr_scheduler"})
    EXPECT_NE(std::find(keys.begin(), keys.end(), k), keys.end()) << k;
  EXPECT_EQ(parse(kMinimal, {"lora.target_modules=[q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]"})
                .lora.target_modules.size(),
            7u);
}

// model.dtype takes Hugging Face's torch_dtype spellings too, through the one dtype parser
// (model/options.h dtype_from_name); config.resolved.yaml (to_yaml) writes ours.
TEST(Config, DTypeTakesTorchSpellings) {
  const std::vector<std::pair<std::string, DType>> names = {
      {"bfloat16", DType::kBF16}, {"float16", DType::kFP16}, {"float32", DType::kFP32},
      {"bf16", DType::kBF16},     {"fp16", DType::kFP16},    {"fp32", DType::kFP32}, {"auto", DType::kAuto}};
  for (const auto& [name, d] : names) {
    const Config c = parse("output_dir: o\nmodel: {path: m, dtype: " + name + "}\ndata: {train: t}\n");
    EXPECT_EQ(c.model.dtype, d) << name;
    const std::string y = to_yaml(c);
    EXPECT_NE(y.find(std::string("dtype: ") + dtype_name(d) + "\n"), std::string::npos) << y;
    EXPECT_EQ(y.find("float"), std::string::npos) << y;
    EXPECT_EQ(parse(y), c);
    EXPECT_EQ(parse(kMinimal, {"model.dtype=" + name}).model.dtype, d) << name;
  }
  EXPECT_EQ(error_of("output_dir: o\nmodel: {path: m, dtype: float64}\ndata: {train: t}\n"),
            "t.yaml:2: model.dtype: expected one of bf16|fp16|fp32|auto (or torch's bfloat16|float16|float32), got "
            "\"float64\"");
  EXPECT_EQ(error_of(kMinimal, {"model.dtype=bf61"}),
            "--set model.dtype=bf61: model.dtype: expected one of bf16|fp16|fp32|auto (or torch's "
            "bfloat16|float16|float32), got \"bf61\"; did you mean \"bf16\"?");
}

// Config::key_sources keeps where each key was set, so the checks that need the files (model dir,
// data size) name the config's file:line like parse errors do (with_key_sources).
TEST(Config, KeySourcesNameFileLineForLaterErrors) {
  const std::string text = "output_dir: o\nmodel:\n  path: models/m\ndata:\n  train: t\n  val_set_size: 5000\n";
  const Config c = parse(text);
  EXPECT_EQ(c.key_sources.at("model.path"), "t.yaml:3");
  EXPECT_EQ(c.key_sources.at("data.val_set_size"), "t.yaml:6");
  EXPECT_EQ(c.key_sources.at("output_dir"), "t.yaml:1");
  EXPECT_EQ(c.key_sources.count("training.seed"), 0u) << "a default has no source";
  // docs/config.md's example: the shipped SmolLM2 config run without the imported model.
  const std::string smol = (test::source_dir() / "configs" / "smollm2" / "135m_qlora.yaml").string();
  const Config sc = load_config(smol);
  EXPECT_EQ(sc.model.path, "models/SmolLM2-135M-Instruct");
  EXPECT_EQ(sc.key_sources.at("model.path"), smol + ":10");
  const std::string msg =
      test::error_of([&] { with_key_sources(c, [] { fail("data.val_set_size: 5000 leaves no training record out of 681"); }); });
  EXPECT_EQ(msg, "t.yaml:6: data.val_set_size: 5000 leaves no training record out of 681");
  EXPECT_EQ(test::error_of([&] { with_key_sources(c, [&] { return tokenizer_source(c.model); }); }),
            "t.yaml:3: model.path: models/m: model directory not found (relative to the working directory " +
                std::filesystem::current_path().string() + ")");
  // A tokenizer that is not there is named by its key and file:line too (issue: configs/tiny said
  // only "../shared/tokenizers/llama2: tokenizer model not found").
  {
    const test::TempDir d("tok_source");
    const std::string dir = d.path.string();
    auto src = [&](const std::string& yaml) {
      const Config k = parse(yaml);
      return test::error_of([&] { with_key_sources(k, [&] { return tokenizer_source(k.model); }); });
    };
    EXPECT_EQ(src("output_dir: o\nmodel:\n  preset: tiny\n  init: random\n  tokenizer: " + dir + "/llama2\n"
                  "data: {train: t}\n"),
              "t.yaml:5: model.tokenizer: " + dir + "/llama2: tokenizer not found (expected a tokenizer.json or "
              "tokenizer.model file, or a directory holding one)");
    EXPECT_EQ(src("output_dir: o\nmodel:\n  preset: tiny\n  init: random\n  tokenizer: " + dir + "\n"
                  "data: {train: t}\n"),
              "t.yaml:5: model.tokenizer: " + dir + ": no tokenizer.json or tokenizer.model in this directory");
    EXPECT_EQ(src("output_dir: o\nmodel: {path: " + dir + "}\ndata: {train: t}\n"),
              "t.yaml:2: model.path: " + dir + ": no tokenizer.json or tokenizer.model in this directory "
              "(model.tokenizer names a tokenizer kept elsewhere)");
    std::ofstream(d.path / "tokenizer.json") << "{}";
    EXPECT_EQ(tokenizer_source(parse("output_dir: o\nmodel: {path: " + dir + "}\ndata: {train: t}\n").model), dir);
  }
  // A --set names itself; a key without a source, or another message, passes unchanged.
  const Config o = parse(text, {"data.val_set_size=0.5"});
  EXPECT_EQ(test::error_of([&] { with_key_sources(o, [] { fail("data.val_set_size: 0.5 ..."); }); }),
            "--set data.val_set_size=0.5: data.val_set_size: 0.5 ...");
  EXPECT_EQ(test::error_of([&] { with_key_sources(c, [] { fail("data.eval: x"); }); }), "data.eval: x");
  EXPECT_EQ(test::error_of([&] { with_key_sources(c, [] { fail("t: no such file"); }); }), "t: no such file");
  EXPECT_THROW(with_key_sources(c, [] { throw Interrupted("data.val_set_size: not this kind"); }), Interrupted);
  EXPECT_EQ(with_key_sources(c, [] { return 3; }), 3);
  // Not a setting: equal configs from different lines compare equal; config_with_overrides keeps
  // the base's sources and adds its overrides'.
  EXPECT_EQ(parse("\n" + text), c);
  const Config w = config_with_overrides(c, {"data.seed=1"}, "x");
  EXPECT_EQ(w.key_sources.at("model.path"), "t.yaml:3");
  EXPECT_EQ(w.key_sources.at("data.seed"), "--set data.seed=1");
}

// data.val_set_size as a fraction holds out ceil(fraction * n), as Hugging Face datasets'
// Dataset.train_test_split(test_size=fraction) does (src/datasets/arrow_dataset.py, train_test_split:
// `n_test = ceil(test_size * n_samples)`, the float product then ceil; Axolotl splits with it).
// The datasets package is not in the venv, so the reference is that formula, in Python float
// arithmetic (IEEE double, as here): e.g. 0.05 * 203 = 10.15 -> 11, 0.07 * 100 = 7.000000000000001 -> 8.
TEST(DataOptions, ValSetSizeFractionIsCeilAsHfTrainTestSplit) {
  struct Case { double size; int64_t n, want; };
  for (const Case& c : {Case{0.05, 203, 11}, Case{0.05, 200, 10}, Case{0.1, 681, 69}, Case{0.07, 100, 8},
                        Case{0.5, 3, 2}, Case{0.01, 10, 1}, Case{0.2, 5, 1}, Case{0.999, 1000, 999},
                        Case{5000, 681, 5000}, Case{1, 10, 1}, Case{0, 10, 0}})
    EXPECT_EQ(data::val_set_count(c.size, c.n), c.want) << c.size << " of " << c.n;
}

TEST(Config, CrossFieldRules) {
  EXPECT_NE(error_of(kMinimal, {"training.num_epochs=0"}).find("nothing to train"), std::string::npos);
  EXPECT_EQ(parse(kMinimal, {"training.num_epochs=0", "training.max_steps=5"}).training.max_steps, 5);
  EXPECT_NE(error_of(kMinimal, {"training.warmup_steps=5", "training.warmup_ratio=0.1"}).find("not both"),
            std::string::npos);
  const Config r = parse(kMinimal, {"training.warmup_ratio=0.1"});
  EXPECT_EQ(r.training.warmup_steps, 0);
  EXPECT_EQ(r.training.warmup_ratio, 0.1);
  EXPECT_NE(error_of(kMinimal, {"training.eval_steps=10"}).find("no eval data"), std::string::npos);
  EXPECT_EQ(parse(kMinimal, {"training.eval_steps=10", "data.val_set_size=100"}).data.val_set_size, 100.0);
  // transformers' scheduler names; polynomial decays to lr_end 1e-7, which the peak must exceed
  // (get_polynomial_decay_schedule_with_warmup raises otherwise).
  EXPECT_EQ(parse(kMinimal, {"training.lr_scheduler=constant_with_warmup"}).training.lr_scheduler,
            LrScheduler::kConstantWithWarmup);
  EXPECT_EQ(parse(kMinimal, {"training.lr_scheduler=cosine_with_restarts"}).training.lr_scheduler,
            LrScheduler::kCosineWithRestarts);
  EXPECT_EQ(parse(kMinimal, {"training.lr_scheduler=polynomial"}).training.lr_scheduler, LrScheduler::kPolynomial);
  EXPECT_NE(error_of(kMinimal, {"training.lr_scheduler=polynomial", "training.learning_rate=1e-7"})
                .find("training.learning_rate: must be larger than 1e-07, the learning rate that lr_scheduler "
                      "polynomial decays to"),
            std::string::npos)
      << error_of(kMinimal, {"training.lr_scheduler=polynomial", "training.learning_rate=1e-7"});
  EXPECT_NE(error_of(kMinimal, {"data.val_set_size=1.5"}).find("a fraction in [0, 1) or a whole count"),
            std::string::npos);
  // Model: path xor preset; a preset needs init: random.
  EXPECT_NE(error_of(kMinimal, {"model.preset=tiny"}).find("not both"), std::string::npos);
  const std::string preset = "output_dir: o\nmodel: {preset: tiny}\ndata: {train: t}\n";
  EXPECT_NE(error_of(preset).find("set model.init: random"), std::string::npos);
  const Config p = parse(preset, {"model.init=random"});
  EXPECT_TRUE(p.model.random_init);
  EXPECT_EQ(p.model.preset, "tiny");
  EXPECT_NE(error_of(preset, {"model.preset=llama-7b", "model.init=random"}).find("did you mean \"llama2-7b\"?"),
            std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"checkpoint.resume=ckpt/step-5", "checkpoint.resume_from_dir=x"})
                .find("only used with resume: auto"),
            std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"checkpoint.resume=no"}).find("expected auto, never or a checkpoint path"),
            std::string::npos);
  // truncation: split is for raw text: accepted with format auto / completion, refused (naming the
  // key) with a conversation format.
  EXPECT_EQ(parse(kMinimal, {"data.truncation=split"}).data.truncation, "split");
  EXPECT_EQ(parse(kMinimal, {"data.truncation=split", "data.format=completion"}).data.truncation, "split");
  EXPECT_NE(error_of(kMinimal, {"data.truncation=split", "data.format=alpaca"})
                .find("data.truncation: split cuts raw text (format completion) into pieces; data.format is alpaca"),
            std::string::npos)
      << error_of(kMinimal, {"data.truncation=split", "data.format=alpaca"});
}

TEST(Config, RangeChecks) {
  struct Case { const char* set; const char* fragment; };
  for (const Case& k : {
           Case{"lora.r=0", "lora.r: expected a positive integer, got 0"},
           Case{"lora.alpha=-1", "lora.alpha: expected a positive number"},
           Case{"lora.dropout=1", "lora.dropout: expected a number in [0, 1)"},
           Case{"quantization.blocksize=48", "quantization.blocksize: expected a power of two in [32, 4096]"},
           Case{"quantization.blocksize=8192", "a power of two in [32, 4096]"},
           Case{"quantization.method=int8", "quantization.method: expected one of nf4|fp4|none"},
           Case{"model.dtype=float64", "model.dtype: expected one of bf16|fp16|fp32|auto"},
           Case{"data.format=jsonl", "data.format: expected one of auto|alpaca|sharegpt|messages|completion"},
           Case{"data.template=chatlm", "did you mean \"chatml\"?"},
           Case{"training.lr_scheduler=cosin", "did you mean \"cosine\"?"},
           Case{"training.warmup_steps=-1", "training.warmup_steps: expected an integer >= 0"},
           // transformers 5 reads a warmup_steps below 1 as a ratio (trial 12)
           Case{"training.warmup_steps=0.03", "training.warmup_steps: expected an integer >= 0 (a fraction of the "
                                              "total steps, as transformers' warmup_steps < 1 means, is "
                                              "training.warmup_ratio), got 0.03"},
           Case{"training.lr_scheduler=cosine_with_min_lr",
                "(transformers' defaults each: cosine and linear decay to 0; cosine_with_min_lr, warmup_stable_decay, "
                "inverse_sqrt and reduce_lr_on_plateau are not supported)"},
           Case{"training.adam_beta2=1", "training.adam_beta2: expected a number in [0, 1)"},
           Case{"training.max_steps=-2", "training.max_steps: expected an integer >= -1"},
           Case{"checkpoint.keep_last=0", "checkpoint.keep_last: expected an integer >= 1"},
           Case{"lora.target_modules=[q_prj]", "lora.target_modules[0]: unknown module \"q_prj\"; did you mean \"q_proj\"?"},
           Case{"lora.target_modules=[]", "expected at least one module name"},
           Case{"lora.target_modules=q_proj", "expected \"all-linear\" or a list of module names"},
           Case{"lora.target_modules=[q_proj, q_proj]", "lora.target_modules[1]: \"q_proj\" is listed twice"},
       }) {
    const std::string e = error_of(kMinimal, {k.set});
    EXPECT_NE(e.find(k.fragment), std::string::npos) << k.set << " -> " << e;
  }
}

TEST(Config, ToYamlRoundTripsNonDefaultValues) {
  const Config c = parse(kMinimal, {
      "model.dtype=auto", "model.tokenizer=tok/tokenizer.model", "quantization.method=fp4",
      "quantization.double_quant=false", "quantization.blocksize=4096", "quantization.keep_16bit=[]",
      "lora.r=64", "lora.alpha=0.1", "lora.dropout=0.3333333333333333", "lora.target_modules=[down_proj]",
      "lora.use_rslora=true", "lora.model_dir=runs/old/checkpoints/checkpoint-40", "data.eval=e.jsonl", "data.format=sharegpt", "data.template=none",
      "data.truncation=truncate", "data.padding_side=left", "data.seed=18446744073",
      "data.role_map={human: user, gpt: assistant}", "data.field_map={'yes': 'null'}",
      "training.learning_rate=3.14159e-5", "training.lr_scheduler=linear", "training.warmup_ratio=0.05",
      "training.adam_epsilon=1e-12", "training.max_grad_norm=0", "training.seed=0",
      "checkpoint.resume=never", "checkpoint.resume_from_dir=/mnt/bucket/run",
      "checkpoint.sync_command='rsync -a {checkpoint} host:/backup/  # not a comment'",
      "cost.gpu_hour_price=2.49", "output_dir='123'"});
  EXPECT_EQ(c.output_dir, "123");
  EXPECT_EQ(c.checkpoint.sync_command, "rsync -a {checkpoint} host:/backup/  # not a comment");
  const std::string y = to_yaml(c);
  const Config back = parse(y);
  EXPECT_EQ(back, c) << y;
  EXPECT_EQ(to_yaml(back), y);
  // A checkpoint path that looks like a boolean survives quoted.
  const Config p = parse(kMinimal, {"checkpoint.resume='no'"});
  EXPECT_EQ(parse(to_yaml(p)), p) << to_yaml(p);
  // A literal "$" in a path ("$$" in the file) is written "$$" again, not expanded a second time
  // (found by fuzz_config: "$$sUNDEFINED" came back as the undefined variable $sUNDEFINED).
  const Config d = parse(kMinimal, {"data.train='$$sQLORA_UNDEFINED/a$$$$b.jsonl'", "checkpoint.resume='r$$1'"});
  EXPECT_EQ(data::source_paths(d.data.train), "$sQLORA_UNDEFINED/a$$b.jsonl");
  EXPECT_EQ(d.checkpoint.resume_path, "r$1");
  EXPECT_EQ(parse(to_yaml(d)), d) << to_yaml(d);
}

// data.train / data.eval: one path, or a list of files (Axolotl's `datasets:`), each a path or a
// map {path, format, field_map, role_map} whose settings replace the section's for that file.
TEST(Config, DataTrainIsAPathOrAListOfFiles) {
  using data::DataSource;
  using NameMap = std::map<std::string, std::string>;
  ::setenv("QLORA_T_DATA", "/data/sets", 1);
  // One path and a one-entry list are the same config, written back as the one path (as before lists).
  const Config one = parse(kMinimal);
  const Config listed = parse("output_dir: runs/t\nmodel: {path: models/m}\ndata: {train: [train.jsonl]}\n");
  EXPECT_EQ(one.data.train, std::vector<DataSource>{DataSource{"train.jsonl"}});
  EXPECT_EQ(listed, one);
  EXPECT_NE(to_yaml(one).find("\n  train: train.jsonl\n"), std::string::npos) << to_yaml(one);
  EXPECT_EQ(to_yaml(listed), to_yaml(one));
  EXPECT_TRUE(one.data.eval.empty());

  const std::string text = R"(output_dir: runs/t
model: {path: models/m}
data:
  train:
    - ${QLORA_T_DATA}/alpaca.json
    - path: $QLORA_T_DATA/chats.jsonl
      format: sharegpt
      role_map: {bot: assistant}
    - {path: "a$$b.jsonl", field_map: {instruction: prompt}}
  eval: [e1.jsonl, {path: e2.jsonl, format: messages}]
  field_map: {output: answer}
)";
  const Config c = parse(text);
  ASSERT_EQ(c.data.train.size(), 3u);
  EXPECT_EQ(c.data.train[0], DataSource{"/data/sets/alpaca.json"});
  EXPECT_TRUE(c.data.train[0].path_only());
  EXPECT_EQ(c.data.train[1].path, "/data/sets/chats.jsonl");
  EXPECT_EQ(c.data.train[1].format, std::optional<std::string>("sharegpt"));
  EXPECT_EQ(c.data.train[1].role_map, (std::optional<NameMap>(NameMap{{"bot", "assistant"}})));
  EXPECT_FALSE(c.data.train[1].field_map);
  EXPECT_EQ(c.data.train[2].path, "a$b.jsonl");
  EXPECT_EQ(c.data.train[2].field_map, (std::optional<NameMap>(NameMap{{"instruction", "prompt"}})));
  ASSERT_EQ(c.data.eval.size(), 2u);
  EXPECT_EQ(c.data.eval[1].format, std::optional<std::string>("messages"));
  EXPECT_EQ(c.key_sources.at("data.train[1].format"), "t.yaml:7");
  // The section's settings for files that set none; an entry's own replace them (not merged).
  EXPECT_EQ(data::options_for(c.data, c.data.train[0]).field_map, (std::map<std::string, std::string>{{"output", "answer"}}));
  EXPECT_EQ(data::options_for(c.data, c.data.train[2]).field_map, (std::map<std::string, std::string>{{"instruction", "prompt"}}));
  EXPECT_EQ(data::options_for(c.data, c.data.train[1]).format, "sharegpt");
  EXPECT_EQ(data::options_for(c.data, c.data.train[0]).format, "auto");
  // config.resolved.yaml round-trips (expanded paths, "$" written "$$"), and the checkpoint's reader
  // of a stored config reads the same lists.
  const std::string y = to_yaml(c);
  const Config back = parse(y);
  EXPECT_EQ(back, c) << y;
  EXPECT_EQ(to_yaml(back), y);
  EXPECT_EQ(data_sources_in(y, "train", "stored"), c.data.train);
  EXPECT_EQ(data_sources_in(y, "eval", "stored"), c.data.eval);
  EXPECT_EQ(data_sources_in(to_yaml(one), "train", "stored"), one.data.train);
  EXPECT_TRUE(data_sources_in(to_yaml(one), "eval", "stored").empty());
  // Another order, another override: another config.
  Config swapped = c;
  std::swap(swapped.data.train[0], swapped.data.train[1]);
  EXPECT_NE(swapped, c);
  Config reformatted = c;
  reformatted.data.train[1].format = "messages";
  EXPECT_NE(reformatted, c);
  // --set takes a flow list.
  const Config o = parse(kMinimal, {"data.train=[a.jsonl, {path: b.json, format: alpaca}]"});
  ASSERT_EQ(o.data.train.size(), 2u);
  EXPECT_EQ(o.data.train[1].format, std::optional<std::string>("alpaca"));
  EXPECT_EQ(parse(to_yaml(o)), o);
}

// config.resolved.yaml writes a list whose paths YAML would read as something else (null, a
// number, an alias, a comment, a flow collection) quoted, so they load back as the same strings.
TEST(Config, DataTrainListRoundTripsAwkwardPaths) {
  Config c = parse(kMinimal);
  c.data.train.clear();
  for (const char* p : {"null", "yes", "1e3", "0x10", "a: b", "- x", "#c", "a #b", "*x", "&y", "!t", "[a]", "{a}",
                        "'q'", "\"dq\"", "%x", "@x", "`x", " lead", "trail ", "$x", "a$$b", "?", "-", ":", "|", ">",
                        "tab\tin", "ünïcode/データ.jsonl"})
    c.data.train.push_back(data::DataSource{p});
  c.data.train[1].format = "completion";
  c.data.train[2].field_map = std::map<std::string, std::string>{{"true", "~"}};
  c.data.eval = {data::DataSource{"no"}};
  const std::string y = to_yaml(c);
  const Config back = parse(y);
  EXPECT_EQ(back, c) << y;
  EXPECT_EQ(to_yaml(back), y);
  EXPECT_EQ(data_sources_in(y, "train", "stored"), c.data.train) << y;
}

TEST(Config, BadDataTrainListEntriesNameTheEntryKeyAndLine) {
  ::unsetenv("QLORA_T_UNSET");
  auto data = [](const std::string& body) {
    return error_of("output_dir: runs/t\nmodel: {path: models/m}\ndata:\n" + body);
  };
  EXPECT_EQ(data("  train: []\n"),
            "t.yaml:4: data.train: expected at least one file (a path, or a list of files each a path or {path: FILE, "
            "format: ..., field_map: {...}, role_map: {...}}), got an empty list");
  EXPECT_EQ(data("  eval: []\n  train: t.jsonl\n").rfind("t.yaml:4: data.eval: expected at least one file", 0), 0u);
  EXPECT_EQ(data("  train:\n    - a.jsonl\n    - {path: b.jsonl, fromat: alpaca}\n"),
            "t.yaml:6: data.train[1].fromat: unknown key; did you mean \"format\"?");
  EXPECT_EQ(data("  train:\n    - path: b.jsonl\n      type: alpaca\n"),
            "t.yaml:6: data.train[0].type: unknown key; Axolotl's \"type\" is \"format\" here (alpaca|sharegpt|messages|"
            "completion; Axolotl's chat_template type is messages) (docs/config.md)");
  // written flat into the data section (a trial's `data.type: alpaca` got only the key list)
  EXPECT_EQ(data("  train: b.jsonl\n  type: alpaca\n"),
            "t.yaml:5: data.type: unknown key; Axolotl's \"type\" is \"format\" here (alpaca|sharegpt|messages|"
            "completion; Axolotl's chat_template type is messages) (docs/config.md)");
  EXPECT_EQ(data("  train: b.jsonl\n  data_files: c.jsonl\n").find("Axolotl"), std::string::npos);
  EXPECT_EQ(data("  train:\n    - path: b.jsonl\n      field_instruction: prompt\n"),
            "t.yaml:6: data.train[0].field_instruction: unknown key; Axolotl's \"field_instruction\" is \"field_map\" "
            "here: {instruction: YOUR_FIELD} (docs/config.md)");
  EXPECT_EQ(data("  train:\n    - path: b.jsonl\n      sequence_len: 512\n"),
            "t.yaml:6: data.train[0].sequence_len: unknown key; data.sequence_len applies to every file: set it in the "
            "data section (an entry sets path, format, field_map, role_map)");
  EXPECT_EQ(data("  train:\n    - a.jsonl\n    - format: alpaca\n"), "t.yaml:6: data.train[1].path: required key is missing");
  EXPECT_EQ(data("  train:\n    - a.jsonl\n    - {path: \"\"}\n"),
            "t.yaml:6: data.train[1].path: expected a non-empty string, got \"\" (a quoted string)");
  EXPECT_EQ(data("  train:\n    - a.jsonl\n    - \"\"\n"),
            "t.yaml:6: data.train[1]: expected a non-empty path, got \"\" (a quoted string)");
  EXPECT_EQ(data("  train:\n    - a.jsonl\n    - ~\n"),
            "t.yaml:6: data.train[1]: expected a path or a map {path: FILE, format: ..., field_map: {...}, role_map: "
            "{...}}, got nothing (an empty value)");
  EXPECT_EQ(data("  train:\n    - [a.jsonl]\n"),
            "t.yaml:5: data.train[0]: expected a path or a map {path: FILE, format: ..., field_map: {...}, role_map: "
            "{...}}, got a list");
  EXPECT_EQ(data("  train:\n    - {path: a.jsonl, format: csv}\n"),
            "t.yaml:5: data.train[0].format: expected one of auto|alpaca|sharegpt|messages|completion, got \"csv\"");
  EXPECT_EQ(data("  train:\n    - {path: a.jsonl, field_map: [a]}\n"),
            "t.yaml:5: data.train[0].field_map: expected a map of name: name, got a list");
  EXPECT_EQ(data("  train:\n    - {path: a.jsonl, path: b.jsonl}\n"),
            "t.yaml:5: data.train[0].path: duplicate key (first set on line 5)");
  EXPECT_EQ(data("  train:\n    - a.jsonl\n    - ${QLORA_T_UNSET}/b.jsonl\n"),
            "t.yaml:6: data.train[1]: environment variable QLORA_T_UNSET is not defined (in \"${QLORA_T_UNSET}/b.jsonl\")");
  EXPECT_EQ(data("  train:\n    - {path: $QLORA_T_UNSET/b.jsonl}\n"),
            "t.yaml:5: data.train[0].path: environment variable QLORA_T_UNSET is not defined (in \"$QLORA_T_UNSET/b.jsonl\")");
  EXPECT_EQ(data("  train: {path: a.jsonl}\n"),
            "t.yaml:4: data.train: expected a path, or a list of files each a path or {path: FILE, format: ..., "
            "field_map: {...}, role_map: {...}}, got a map");
  // An entry's conversation format cannot be split (as data.format: sharegpt cannot).
  EXPECT_EQ(data("  truncation: split\n  train:\n    - a.txt\n    - {path: b.jsonl, format: sharegpt}\n"),
            "t.yaml:7: data.train[1]: format sharegpt with data.truncation: split, which cuts raw text (format "
            "completion) into pieces (a conversation piece would train an answer without its prompt): use drop or "
            "truncate");
  // --set names itself.
  EXPECT_EQ(error_of(kMinimal, {"data.train=[]"}).rfind("--set data.train=[]: data.train: expected at least one file", 0), 0u);
}

TEST(Config, LoadConfigFileErrors) {
  EXPECT_THROW(load_config("/nonexistent/config.yaml"), Error);
  try {
    load_config((test::source_dir() / "configs").string());
    FAIL() << "a directory must not load";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is a directory"), std::string::npos);
  }
}

TEST(Config, PathKeysExpandHomeAndEnvironmentVariables) {
  ::setenv("HOME", "/home/tester", 1);
  ::setenv("QLORA_T_DATA", "/data/sets", 1);
  ::setenv("QLORA_T_RUN", "r1", 1);
  ::unsetenv("QLORA_T_UNSET");
  const Config c = parse(R"(
output_dir: ~/runs/${QLORA_T_RUN}
model: {path: $QLORA_T_DATA/model, tokenizer: "~"}
data:
  train: ${QLORA_T_DATA}/train.jsonl
  eval: $QLORA_T_DATA/eval.jsonl
checkpoint: {resume_from_dir: ~/bucket/$QLORA_T_RUN}
lora:
  model_dir: ~/adapters/${QLORA_T_RUN}
)");
  EXPECT_EQ(c.output_dir, "/home/tester/runs/r1");
  EXPECT_EQ(c.model.path, "/data/sets/model");
  EXPECT_EQ(c.model.tokenizer, "/home/tester");
  EXPECT_EQ(data::source_paths(c.data.train), "/data/sets/train.jsonl");
  EXPECT_EQ(data::source_paths(c.data.eval), "/data/sets/eval.jsonl");
  EXPECT_EQ(c.checkpoint.resume_from_dir, "/home/tester/bucket/r1");
  EXPECT_EQ(c.lora.model_dir, "/home/tester/adapters/r1");
  EXPECT_NE(to_yaml(c).find("model_dir: /home/tester/adapters/r1"), std::string::npos) << to_yaml(c);
  // Unset (a new adapter): left out of the resolved config, so a run recorded before the key existed
  // compares equal to one without it on resume.
  EXPECT_EQ(parse(kMinimal).lora.model_dir, "");
  EXPECT_EQ(to_yaml(parse(kMinimal)).find("model_dir"), std::string::npos);
  // checkpoint.resume as a path, and the literal forms: "$$", a "$" before a non-name, "~user", "a~b".
  const Config p = parse(kMinimal, {"checkpoint.resume=${QLORA_T_DATA}/ckpt/checkpoint-5", "data.train=a$$b$-c~/x",
                                    "model.path=~user/m", "output_dir=a~b"});
  EXPECT_EQ(p.checkpoint.resume, ResumeMode::kPath);
  EXPECT_EQ(p.checkpoint.resume_path, "/data/sets/ckpt/checkpoint-5");
  EXPECT_EQ(data::source_paths(p.data.train), "a$b$-c~/x");
  EXPECT_EQ(p.model.path, "~user/m");
  EXPECT_EQ(p.output_dir, "a~b");
  // The resolved config records the expanded paths (and round-trips).
  EXPECT_EQ(parse(to_yaml(c)), c);
  // An undefined variable is an error naming it, the key and the line; so is a malformed ${.
  std::string e = error_of(kMinimal, {"data.eval=${QLORA_T_UNSET}/e.jsonl"});
  EXPECT_NE(e.find("data.eval: environment variable QLORA_T_UNSET is not defined"), std::string::npos) << e;
  e = error_of("output_dir: runs/$QLORA_T_UNSET\nmodel: {path: m}\ndata: {train: t.jsonl}\n");
  EXPECT_EQ(e.rfind("t.yaml:1: output_dir: environment variable QLORA_T_UNSET is not defined", 0), 0u) << e;
  e = error_of(kMinimal, {"model.path=${QLORA_T_DATA"});
  EXPECT_NE(e.find("model.path: unterminated \"${\""), std::string::npos) << e;
  e = error_of(kMinimal, {"model.path=${1x}"});
  EXPECT_NE(e.find("is not a variable name"), std::string::npos) << e;
  ::unsetenv("HOME");
  e = error_of(kMinimal, {"output_dir=~/r"});
  EXPECT_NE(e.find("output_dir: cannot expand \"~\": HOME is not set"), std::string::npos) << e;
  ::setenv("HOME", "/home/tester", 1);
}

// ---- docs/config.md documents exactly the schema's keys ----

/// One row of a key table in docs/config.md: its dotted key and the names its type column lists
/// when that column is a `a`\|`b` choice (empty otherwise).
struct DocKey {
  int line;
  std::vector<std::string> choices;
};

/// The keys docs/config.md documents: each "### `section`" heading (a section's own key) and each
/// "| `key` | type | ..." row under it ("### top level": keys without a section).
std::map<std::string, DocKey> documented_keys(const std::filesystem::path& md) {
  std::ifstream in(md);
  EXPECT_TRUE(in.good()) << "cannot read " << md;
  std::map<std::string, DocKey> out;
  std::string section;  // "" = top level
  bool in_keys = false;  // below "## Keys"
  int n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    if (line.rfind("## ", 0) == 0) in_keys = line == "## Keys";
    if (!in_keys) continue;
    if (line.rfind("### ", 0) == 0) {
      const size_t a = line.find('`'), b = line.find('`', a + 1);
      section = a == std::string::npos || b == std::string::npos ? "" : line.substr(a + 1, b - a - 1);
      if (!section.empty()) {
        EXPECT_TRUE(out.insert({section, {n, {}}}).second) << "docs/config.md:" << n << ": " << section << " twice";
      }
      continue;
    }
    if (line.rfind("| `", 0) != 0) continue;
    const size_t end = line.find('`', 3);
    const std::string key = (section.empty() ? "" : section + ".") + line.substr(3, end - 3);
    // The type column: `a`\|`b`\|`c` is a choice; anything else (prose) is not.
    const size_t c0 = line.find('|', end) + 1, c1 = line.find(" | ", c0);
    std::string type = line.substr(c0, c1 - c0);
    type = type.substr(type.find_first_not_of(' '));
    std::vector<std::string> choices;
    bool choice = true;
    std::stringstream ts(type);
    for (std::string item; choice && std::getline(ts, item, '|');) {
      if (!item.empty() && item.back() == '\\') item.pop_back();
      choice = item.size() > 2 && item.front() == '`' && item.back() == '`';
      if (choice) choices.push_back(item.substr(1, item.size() - 2));
    }
    if (!choice || choices.size() < 2) choices.clear();
    EXPECT_TRUE(out.insert({key, {n, choices}}).second) << "docs/config.md:" << n << ": " << key << " twice";
  }
  return out;
}

TEST(Config, DocsDocumentEveryKeyAndNoOther) {
  const auto md = test::source_dir() / "docs" / "config.md";
  const std::map<std::string, DocKey> docs = documented_keys(md);
  const std::vector<ConfigKey> keys = config_keys();
  ASSERT_GE(keys.size(), 60u) << "the field table lost its keys";
  std::map<std::string, const ConfigKey*> schema;
  for (const ConfigKey& k : keys) schema[k.key] = &k;
  for (const ConfigKey& k : keys) {
    const auto it = docs.find(k.key);
    if (it == docs.end()) {
      ADD_FAILURE() << "docs/config.md does not document " << k.key;
      continue;
    }
    // A key with a fixed set of names lists exactly those, in order, in its type column.
    if (!k.choices.empty()) {
      EXPECT_EQ(it->second.choices, k.choices) << "docs/config.md:" << it->second.line << ": " << k.key;
    }
  }
  for (const auto& [key, d] : docs)
    EXPECT_TRUE(schema.count(key)) << "docs/config.md:" << d.line << " documents " << key << ", not a key of the schema";
  // The counts in the sentence above the tables (issue: it said 63 keys and 55 section keys while
  // the tables listed 57): N keys — `output_dir`, the S sections and their K keys; C choice keys.
  std::ifstream in(md);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::smatch m;
  ASSERT_TRUE(std::regex_search(text, m, std::regex(R"((\d+) keys — `output_dir`, the (\d+) sections and their (\d+) keys; (\d+) choice keys)")))
      << "docs/config.md lost its key-count sentence";
  size_t sections = 0, choice_keys = 0;
  for (const ConfigKey& k : keys) {
    sections += k.key != "output_dir" && k.key.find('.') == std::string::npos;
    choice_keys += !k.choices.empty();
  }
  EXPECT_EQ(std::stoul(m[1]), keys.size()) << m[0];
  EXPECT_EQ(std::stoul(m[2]), sections) << m[0];
  EXPECT_EQ(std::stoul(m[3]), keys.size() - sections - 1) << m[0];
  EXPECT_EQ(std::stoul(m[4]), choice_keys) << m[0];
}

// config.resolved.yaml writes model.path or model.preset, whichever is set: its header says so, and
// both kinds read back equal. Writing the other as "" is not done: "" is no preset a config reads,
// and a new key would change every earlier run's fingerprint (trainer/checkpoint.cpp run_fingerprint
// flattens the resolved config), so their output_dirs would no longer resume.
TEST(Config, ResolvedYamlWritesThePathOrThePreset) {
  const Config by_path = parse(kMinimal);
  const Config by_preset = parse("output_dir: o\nmodel:\n  preset: tiny\n  init: random\n  tokenizer: t.model\n"
                                 "data:\n  train: d.json\n");
  for (const Config* c : {&by_path, &by_preset}) {
    const std::string y = to_yaml(*c);
    EXPECT_EQ(y.rfind("# resolved qlora-cpp config: every key, defaults included; of model.path and model.preset, the "
                      "one set (docs/config.md)\n", 0), 0u) << y;
    EXPECT_EQ(y.find("preset:") != std::string::npos, c == &by_preset) << y;
    EXPECT_EQ(y.find("  path:") != std::string::npos, c == &by_path) << y;
    EXPECT_TRUE(parse(y) == *c) << y;
  }
  EXPECT_EQ(error_of("output_dir: o\nmodel:\n  path: m\n  preset: \"\"\ndata:\n  train: d.json\n"),
            "t.yaml:4: model.preset: expected one of tiny|small|llama2-7b|llama2-13b|mistral-7b|llama3-8b|qwen2.5-7b|"
            "qwen3-8b|codellama-34b|llama2-70b, got \"\" (a quoted string)");
}

TEST(Config, DocsCheckFailsOnAMissingOrExtraKey) {
  // The check above is only as good as the parser: on a copy with one row removed and one added,
  // the documented keys differ from the schema's by exactly those two.
  const auto md = test::source_dir() / "docs" / "config.md";
  std::ifstream in(md);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t row = text.find("| `adam_beta2` |");
  ASSERT_NE(row, std::string::npos);
  text.erase(row, text.find('\n', row) + 1 - row);
  text += "\n| `not_a_key` | bool | `false` | added by the test |\n";
  const auto tmp = test::fresh_temp_dir("config_docs") / "config.md";
  std::ofstream(tmp) << text;
  const auto docs = documented_keys(tmp);
  EXPECT_EQ(docs.count("training.adam_beta2"), 0u);
  EXPECT_EQ(docs.count("cost.not_a_key"), 1u);
  EXPECT_EQ(docs.size(), documented_keys(md).size());
  qlora::remove_tree(tmp.parent_path());
}

TEST(Config, ConfigKeysListTheTableInOrder) {
  const std::vector<ConfigKey> keys = config_keys();
  ASSERT_GE(keys.size(), 3u);
  EXPECT_EQ(keys[0].key, "output_dir");
  EXPECT_EQ(keys[1].key, "model");
  EXPECT_EQ(keys[2].key, "model.path");
  std::map<std::string, std::vector<std::string>> choices;
  for (const ConfigKey& k : keys) choices[k.key] = k.choices;
  EXPECT_EQ(choices.at("model.dtype"), (std::vector<std::string>{"bf16", "fp16", "fp32", "auto"}));
  EXPECT_EQ(choices.at("data.padding_side"), (std::vector<std::string>{"right", "left"}));
  EXPECT_EQ(choices.at("model.preset"), known_model_presets());
  EXPECT_TRUE(choices.at("lora.r").empty());
  EXPECT_EQ(choices.size(), keys.size()) << "a key listed twice";
}

// ---- a config built in code (qlora eval --model --data) ----

TEST(Config, ConfigWithOverridesValidatesLikeAFile) {
  Config base;
  base.output_dir = "eval";
  base.model.path = "models/m";
  base.model.dtype = DType::kAuto;
  base.data.train = {{"d.json"}};
  // No overrides: the base, with all-linear as when a file leaves target_modules out.
  const Config c = config_with_overrides(base, {}, "eval (no config)");
  EXPECT_EQ(c, parse("output_dir: eval\nmodel: {path: models/m, dtype: auto}\ndata: {train: d.json}\n"));
  EXPECT_EQ(expand_target_modules(c.lora.target_modules), llama_linear_names());
  // Overrides are checked as in a file, and cross-field rules see the result.
  const Config o = config_with_overrides(base, {"data.padding_side=left", "model.dtype=fp32", "lora.r=4"}, "x");
  EXPECT_EQ(o.data.padding_side, data::PaddingSide::kLeft);
  EXPECT_EQ(o.model.dtype, DType::kFP32);
  EXPECT_EQ(o.lora.r, 4);
  EXPECT_EQ(o.model.path, "models/m");
  auto error = [&](const std::vector<std::string>& ov) {
    try {
      config_with_overrides(base, ov, "eval (no config)");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error({"data.padding_side=up"}),
            "--set data.padding_side=up: data.padding_side: expected one of right|left, got \"up\"");
  EXPECT_EQ(error({"model.preset=tiny"}), "--set model.preset=tiny: model.preset: set model.path or model.preset, not both");
  EXPECT_NE(error({"training.eval_steps=5"}).find("training.eval_steps: no eval data"), std::string::npos);
  EXPECT_EQ(error({"lora.aplha=4"}), "--set lora.aplha=4: lora.aplha: unknown key; did you mean \"alpha\"?");
}

// The model options the config embeds (model/options.h): one dtype parser for our names and
// Hugging Face's, the one auto rule, and the quant method as an optional kernels::Quant4Type whose
// names are the config's choices. The HF names are torch's (str(torch.bfloat16) == "torch.bfloat16").
TEST(ModelOptions, DTypeSpellingsAndTheAutoRule) {
  const std::vector<std::pair<std::string, DType>> names = {
      {"bf16", DType::kBF16},     {"fp16", DType::kFP16},    {"fp32", DType::kFP32},   {"auto", DType::kAuto},
      {"bfloat16", DType::kBF16}, {"float16", DType::kFP16}, {"float32", DType::kFP32}};
  for (const auto& [name, d] : names) EXPECT_EQ(parse_dtype(name), d) << name;
  for (const char* bad : {"", "BF16", "float64", "half", "bf16 "}) {
    EXPECT_FALSE(dtype_from_name(bad).has_value()) << bad;
    EXPECT_EQ(test::error_of([&] { parse_dtype(bad); }),
              std::string("dtype '") + bad + "' is not one of bf16, fp16, fp32, auto");
  }
  EXPECT_FALSE(dtype_from_hf_name("bf16").has_value());  // config.json holds torch's names only
  EXPECT_EQ(dtype_from_hf_name("float16"), DType::kFP16);
  EXPECT_STREQ(hf_dtype_name(DType::kBF16), "bfloat16");
  EXPECT_STREQ(hf_dtype_name(DType::kFP32), "float32");
  EXPECT_THROW(hf_dtype_name(DType::kAuto), Error);
  EXPECT_EQ(stored_dtype("float32"), DType::kFP32);
  EXPECT_EQ(stored_dtype("int8"), DType::kBF16);
  EXPECT_EQ(resolve_dtype(DType::kAuto, /*cuda=*/true), DType::kBF16);
  EXPECT_EQ(resolve_dtype(DType::kAuto, /*cuda=*/false), DType::kFP32);
  EXPECT_EQ(resolve_dtype(DType::kFP16, /*cuda=*/false), DType::kFP16);
  EXPECT_EQ(dtype_bytes(DType::kFP32), 4);
  EXPECT_EQ(dtype_bytes(DType::kBF16), 2);
  EXPECT_THROW(dtype_bytes(DType::kAuto), Error);
}

TEST(ModelOptions, QuantMethodIsTheKernelsTypeOrNone) {
  EXPECT_EQ(parse_quant_method("nf4"), kernels::Quant4Type::NF4);
  EXPECT_EQ(parse_quant_method("fp4"), kernels::Quant4Type::FP4);
  EXPECT_EQ(parse_quant_method("none"), std::nullopt);
  EXPECT_EQ(test::error_of([] { parse_quant_method("int4"); }), "quant method 'int4' is not one of none, nf4, fp4");
  std::vector<std::string> choices;
  for (const ConfigKey& k : config_keys())
    if (k.key == "quantization.method") choices = k.choices;
  EXPECT_EQ(choices, (std::vector<std::string>{"nf4", "fp4", "none"}));
  for (const std::string& c : choices) EXPECT_EQ(quant_method_name(parse_quant_method(c)), c);
  EXPECT_EQ(parse("quantization: {method: none}\n" + std::string(kMinimal)).quantization.quant_type, std::nullopt);
  EXPECT_EQ(parse(kMinimal, {"quantization.method=fp4"}).quantization.type(), kernels::Quant4Type::FP4);
  EXPECT_FALSE(QuantOptions{}.enabled());  // the library default: no quantization
  EXPECT_TRUE(parse(kMinimal).quantization.enabled());  // the config's: NF4
}

}  // namespace
}  // namespace qlora
