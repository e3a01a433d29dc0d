// qlora: the command-line entry point. Parses arguments (CLI11), runs one subcommand, and turns
// any error into one line on stderr and exit code 1. Nothing below main() exits the process.
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <iostream>

#include "common/error.h"
#include "common/log.h"
#include "trainer/commands.h"

namespace {

/// The first line of a message (c10::Error carries a backtrace after it).
std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

int run(int argc, char** argv) {
  CLI::App app{"qlora: LoRA / QLoRA fine-tuning of Llama-family models"};
  app.require_subcommand(1);
  bool verbose = false;
  app.add_flag("-v,--verbose", verbose, "debug logging");

  qlora::InspectOptions ins;
  auto* inspect = app.add_subcommand("inspect", "architecture, parameters and bytes per component");
  inspect->add_option("model_dir", ins.model_dir, "Hugging Face model directory")->required();
  inspect->add_flag("--json", ins.json, "machine-readable output");
  auto* ins_quant = inspect->add_option("--quant", ins.quant, "really quantize on load: nf4|fp4")
                        ->check(CLI::IsMember({"nf4", "fp4"}));
  inspect->add_flag("--double-quant", ins.double_quant, "with --quant: quantize the absmax constants")
      ->needs(ins_quant);
  inspect->add_option("--blocksize", ins.blocksize, "with --quant: 32..4096, power of two")
      ->capture_default_str()->needs(ins_quant);

  qlora::GenerateCliOptions gen;
  auto* generate = app.add_subcommand("generate", "generate text from a prompt");
  generate->add_option("model_dir", gen.model_dir, "Hugging Face model directory")->required();
  generate->add_option("--prompt", gen.prompt, "prompt text")->required();
  generate->add_option("--max-new-tokens", gen.gen.max_new_tokens, "tokens to generate")->capture_default_str();
  generate->add_option("--temperature", gen.gen.temperature, "0 = greedy")->capture_default_str();
  generate->add_option("--top-p", gen.gen.top_p, "nucleus sampling mass")->capture_default_str();
  generate->add_option("--seed", gen.gen.seed, "sampling seed")->capture_default_str();
  generate->add_option("--dtype", gen.dtype, "fp32|bf16|fp16|auto")->capture_default_str();
  generate->add_flag("--ids", gen.print_ids, "print the new token ids instead of text");

  qlora::InitModelOptions init;
  auto* init_model = app.add_subcommand("init-model", "write a random-init HF model directory");
  init_model->add_option("--preset", init.preset, "tiny|small|llama2-7b|...")->required();
  init_model->add_option("--out", init.out_dir, "output directory (must not exist or be empty)")->required();
  auto* tok_opt = init_model->add_option("--tokenizer", init.tokenizer, "tokenizer.model to copy");
  init_model->add_option("--train-tokenizer", init.train_tokenizer, "train a tokenizer on this text corpus")
      ->excludes(tok_opt);
  init_model->add_option("--vocab-size", init.vocab_size, "vocabulary of a trained tokenizer");
  init_model->add_option("--seed", init.seed, "weight seed")->capture_default_str();
  init_model->add_option("--dtype", init.dtype, "stored dtype fp32|bf16|fp16 (default: the preset's)");

  qlora::TrainCliOptions train;
  auto* train_cmd = app.add_subcommand("train", "train a LoRA / QLoRA adapter from a YAML config");
  train_cmd->add_option("config", train.config_path, "training config (YAML)")->required();
  train_cmd->add_option("--set", train.overrides, "override a config key: section.key=value");

  qlora::DataPreviewOptions preview;
  auto* data_cmd = app.add_subcommand("data", "inspect a dataset as training will see it");
  data_cmd->require_subcommand(1);
  auto* data_preview = data_cmd->add_subcommand("preview", "rendered examples, masked spans, statistics");
  data_preview->add_option("config", preview.config_path, "training config (YAML)")->required();
  data_preview->add_option("--n", preview.n, "examples to show")->capture_default_str();
  data_preview->add_option("--set", preview.overrides, "override a config key: section.key=value");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  qlora::log::setup(verbose ? qlora::log::Level::debug : qlora::log::Level::info);

  if (*inspect) std::cout << qlora::cmd_inspect(ins);
  if (*generate) std::cout << qlora::cmd_generate(gen);
  if (*init_model) qlora::cmd_init_model(init);
  if (*data_preview) std::cout << qlora::cmd_data_preview(preview);
  if (*train_cmd) qlora::cmd_train(train);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const qlora::Error& e) {
    std::cerr << "error: " << first_line(e.what()) << "\n";
  } catch (const c10::Error& e) {
    std::cerr << "error: " << first_line(e.what_without_backtrace()) << "\n";
  } catch (const std::exception& e) {
    std::cerr << "error: " << first_line(e.what()) << "\n";
  }
  return 1;
}
