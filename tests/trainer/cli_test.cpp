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
#include <nlohmann/json.hpp>

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
  fs::remove_all(d);
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
  fs::remove_all(d);
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
  expect_clean_error(run("inspect " + d.string()), "config.json: not valid JSON");
  write(d / "config.json", "{\"architectures\": [\"BertModel\"]}");
  expect_clean_error(run("inspect " + d.string()), "'BertModel' is not supported");
  fs::remove_all(d);
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
  fs::remove_all(d);
}

}  // namespace
