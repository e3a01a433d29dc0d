// qlora: the command-line entry point. Parses arguments (CLI11), runs one subcommand, and turns
// any error into one line on stderr and exit code 1. Nothing below main() exits the process.
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>

#include "common/error.h"
#include "common/format.h"
#include "common/log.h"
#include "config/config.h"
#include "cli/commands.h"
#include "model/import_gguf.h"
#include "model/model_config.h"
#include "model/options.h"
#include "trainer/launch.h"
#include "trainer/train.h"

using qlora::first_line;

namespace {

/// One line for a std::filesystem error that no command turned into its own: "PATH: REASON
/// (cannot OP[, PATH2])" instead of libstdc++'s "filesystem error: cannot rename: Not a directory
/// [a] [b]" (trial 27). Never throws.
std::string filesystem_error_line(const std::filesystem::filesystem_error& e) {
  const std::string reason = e.code().message();
  std::string op = e.what();
  if (const std::string pre = "filesystem error: "; op.rfind(pre, 0) == 0) op = op.substr(pre.size());
  if (const size_t at = op.find(": " + reason); at != std::string::npos) op = op.substr(0, at);
  if (const size_t bracket = op.find(" ["); bracket != std::string::npos) op = op.substr(0, bracket);
  const std::string p1 = e.path1().string(), p2 = e.path2().string();
  if (p1.empty()) return first_line(e.what());
  return p1 + ": " + reason + " (" + op + (p2.empty() ? "" : ", with " + p2) + ")";
}

/// Every --dtype: our names or torch's (bfloat16, float16, float32), read by the one dtype parser
/// (model/options.h dtype_from_name) and rewritten to ours, so a command sees bf16|fp16|fp32|auto
/// (each command then checks which of them it takes). Anything else is a usage error.
CLI::Validator dtype_names() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        const std::optional<qlora::DType> d = qlora::dtype_from_name(s);
        if (!d) return "dtype '" + s + "' is not one of bf16, fp16, fp32, auto (or torch's bfloat16, float16, float32)";
        s = qlora::dtype_name(*d);
        return std::string();
      },
      "DTYPE");
}

/// What the config says of `section.key=value` as an override: "" when `--set ARG` would be
/// taken, else the reason, e.g. "epochs: unknown key; torchtune's \"epochs\" is
/// \"training.num_epochs\" here (docs/config.md)" (config_with_overrides on the defaults, so one
/// command line gets the final key, not a second round trip through --set).
std::string override_verdict(const std::string& arg) {
  const std::string source = "--set " + arg;
  const std::string key = arg.substr(0, arg.find('='));
  qlora::Config base;
  base.output_dir = "OUT";  // the one key a config must set itself
  try {
    qlora::config_with_overrides(base, {arg}, source);
    return "";
  } catch (const std::exception& e) {
    std::string msg = first_line(e.what());
    if (msg.rfind(source + ": ", 0) == 0) msg = msg.substr(source.size() + 2);
    // Only what is said of this override's key, a section above it or an item below it (not of a
    // key a real config file would set, such as data.train).
    const std::string said = msg.substr(0, msg.find(':'));
    auto under = [](const std::string& a, const std::string& b) {  // a is b or inside it
      return a == b || (a.size() > b.size() && a.compare(0, b.size(), b) == 0 && (a[b.size()] == '.' || a[b.size()] == '['));
    };
    return under(key, said) || under(said, key) ? msg : "";
  }
}

/// After a CLI11 ExtrasError: a line for each unexpected argument of the form key=value or
/// section.key=value (torchtune's `tune run ... key=value` override style), where the command run
/// takes --set: "use --set ARG (...)" when the config takes it, else what the config says of it
/// (the key it means here); empty when there is none, or when another unexpected argument is not
/// of that form (CLI11's own message is then the one said).
std::vector<std::string> override_hints(const CLI::App& app) {
  const CLI::App* cmd = &app;  // the innermost subcommand given (data preview: data, then preview)
  for (bool deeper = true; deeper;) {
    deeper = false;
    for (const CLI::App* sub : cmd->get_subcommands())
      if (sub->parsed()) {
        cmd = sub;
        deeper = true;
        break;
      }
  }
  if (!cmd->get_option_no_throw("--set")) return {};
  std::vector<std::string> hints;
  for (const std::string& arg : app.remaining(true)) {
    const size_t eq = arg.find('=');
    const std::string key = arg.substr(0, eq);
    const bool override_like =
        eq != std::string::npos && !key.empty() &&
        (std::isalpha(static_cast<unsigned char>(key[0])) || key[0] == '_') &&
        std::all_of(key.begin(), key.end(), [](char ch) {
          return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '.';
        });
    if (!override_like) return {};
    const std::string verdict = override_verdict(arg);
    hints.push_back(verdict.empty() ? "use --set " + arg + " (overrides are --set section.key=value)"
                                    : arg + ": overrides are --set section.key=value here, and " + verdict);
  }
  return hints;
}

/// Other tools' commands a user types here (torchtune's `tune validate|cp|ls|run|download`,
/// Axolotl's `axolotl preprocess|inference|merge-lora|evaluate|fetch`), with what does it here.
const std::map<std::string, std::string>& peer_commands() {
  static const std::map<std::string, std::string> kPeers = {
      {"validate", "qlora data preview CONFIG reads and checks a config (every error at once) and renders its first "
                   "examples without training"},
      {"preprocess", "qlora data preview CONFIG reads, tokenises and renders the data (nothing is cached: every "
                     "train run tokenises at its start)"},
      {"cp", "the configs are plain files: cp configs/FAMILY/NAME.yaml my.yaml (one per model family, run line "
             "first)"},
      {"ls", "ls configs/*/ (one commented config per model family; docs/config.md)"},
      {"run", "qlora train CONFIG.yaml [--set section.key=value] (--nproc-per-node N for N processes)"},
      {"download", "nothing is downloaded: model.path is a local Hugging Face directory, or qlora import-gguf "
                   "FILE.gguf --out DIR makes one"},
      {"fetch", "nothing is downloaded: data.train is a local file (.json, .jsonl, .txt)"},
      {"inference", "qlora generate MODEL_DIR --adapter RUN_DIR --prompt TEXT"},
      {"chat", "qlora generate MODEL_DIR --adapter RUN_DIR --template auto --prompt TEXT"},
      {"merge-lora", "qlora merge --base MODEL_DIR --adapter RUN_DIR --out DIR"},
      {"evaluate", "qlora eval CONFIG.yaml --adapter RUN_DIR (or --model DIR --data FILE)"},
      {"quantize", "the base is quantized to NF4 as it loads (quantization.method in the config; qlora inspect "
                   "MODEL_DIR --quant nf4 shows it)"},
  };
  return kPeers;
}

/// One integer option value: "" with `s` rewritten to plain decimal (what CLI11's base-0 read then
/// takes as the same number), or why it is not a decimal integer of the option's 64-bit type.
std::string canonical_decimal(std::string& s, bool is_unsigned) {
  const bool sign = !s.empty() && (s[0] == '+' || s[0] == '-');
  const bool digits = s.size() > (sign ? 1u : 0u) &&
                      std::all_of(s.begin() + (sign ? 1 : 0), s.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
  if (!digits) return "'" + s + "' is not a decimal integer";
  const std::string range = is_unsigned ? "0.." + std::to_string(std::numeric_limits<uint64_t>::max())
                                        : std::to_string(std::numeric_limits<int64_t>::min()) + ".." +
                                              std::to_string(std::numeric_limits<int64_t>::max());
  const bool negative = s[0] == '-' && s.find_first_not_of("-0") != std::string::npos;
  if (is_unsigned && negative) return s + " is below 0 (the option takes " + range + ")";
  errno = 0;
  const std::string text = negative ? s : s.substr(sign ? 1 : 0);  // "-0" is 0
  const std::string v = is_unsigned ? std::to_string(std::strtoull(text.c_str(), nullptr, 10))
                                    : std::to_string(std::strtoll(text.c_str(), nullptr, 10));
  if (errno == ERANGE) return s + " is out of range (" + range + ")";
  s = v;
  return "";
}

/// CLI11 2.1 reads an integer option with strtoll / strtoull in base 0, so "010" was 8, "0x10" 16,
/// a value past 64 bits saturated and "-1" wrapped to 2^64 - 1 in an unsigned option, all silently
/// (`generate --seed 99999999999999999999999` ran with seed 18446744073709551615; session 23). Every
/// INT / UINT option of `app` and of its subcommands and option groups takes [-+]?[0-9]+ instead, read
/// in base 10 as YAML 1.2 and Python's int() read it ("010" is 10), with a value outside the 64-bit
/// range of its type a usage error naming the option; CLI11 still refuses what a narrower type can't hold.
// A transform (not a check): it rewrites the text to plain decimal before CLI11's read (per value of a list).
void decimal_integer_options(CLI::App& app) {
  for (CLI::Option* opt : app.get_options()) {
    std::string type = opt->get_type_name();  // "INT", or "INT:..." after a ->check's description
    type = type.substr(0, type.find(':'));
    if (type != "INT" && type != "UINT") continue;
    const bool is_unsigned = type == "UINT";
    opt->transform(CLI::Validator(
        [is_unsigned](std::string& s) { return canonical_decimal(s, is_unsigned); },
        ""));
  }
  for (CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) decimal_integer_options(*sub);
}

/// `qlora WORD ...` where WORD is neither a command nor an option: "unknown command 'WORD'" with
/// what does it here (peer_commands) or the nearest command; "" when WORD is a command, an option
/// or absent. CLI11 would say "A subcommand is required", though one was given.
std::string unknown_command_message(const CLI::App& app, int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-' || argv[1][0] == '\0') return "";
  const std::string word = argv[1];
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    if (sub->check_name(word)) return "";
    names.push_back(sub->get_name());
  }
  std::string msg = "unknown command '" + word + "'";
  if (auto it = peer_commands().find(word); it != peer_commands().end()) return msg + ": " + it->second;
  const std::string near = qlora::closest_match(word, names);
  if (!near.empty()) return msg + "; did you mean '" + near + "'?";
  std::string all;
  for (const std::string& n : names) all += (all.empty() ? "" : ", ") + n;
  return msg + " (commands: " + all + "; qlora --help)";
}

int run(int argc, char** argv) {
  CLI::App app{"qlora: LoRA / QLoRA fine-tuning of Llama-family models"};
  std::string presets;  // "tiny|small|...": every preset, from the one list (model/model_config.h)
  for (const std::string& n : qlora::preset_names()) presets += (presets.empty() ? "" : "|") + n;
  app.require_subcommand(1);
  bool verbose = false;
  app.add_flag("-v,--verbose", verbose, "debug logging");

  qlora::InspectOptions ins;
  auto* inspect = app.add_subcommand("inspect", "architecture, parameters and bytes per component");
  inspect->add_option("model_dir", ins.model_dir, "Hugging Face model directory")->required();
  inspect->add_flag("--json", ins.json, "machine-readable output");
  auto* ins_quant = inspect->add_option("--quant", ins.quant, "really quantize on load: nf4|fp4")
                        ->check(CLI::IsMember({"nf4", "fp4"}));
  auto* ins_dq = inspect->add_flag_callback("--double-quant", [&ins] { ins.double_quant = true; },
                                            "with --quant: quantize the absmax constants too (the default, as "
                                            "train's quantization.double_quant, generate --quant and estimate)")
                     ->needs(ins_quant);
  inspect->add_flag_callback("--no-double-quant", [&ins] { ins.double_quant = false; },
                             "with --quant: keep the absmax constants in fp32 (double quant is on by default)")
      ->needs(ins_quant)->excludes(ins_dq);
  inspect->add_option("--blocksize", ins.blocksize, "with --quant: 32..4096, power of two")
      ->capture_default_str()->needs(ins_quant);

  qlora::GenerateCliOptions gen;
  auto* generate = app.add_subcommand("generate", "generate text from a prompt");
  generate->add_option("model_dir", gen.model_dir, "Hugging Face model directory")->required();
  auto* gen_src = generate->add_option_group("prompt", "what to continue");
  gen_src->add_option("--prompt", gen.prompt, "prompt text");
  gen_src->add_option("--prompts", gen.prompts_file,
                      "JSONL file, one {\"prompt\": TEXT, \"system\"?: TEXT} per line: the model loads once and "
                      "each prompt prints one JSON line {\"prompt\", \"output\", \"ids\", \"finish_reason\": "
                      "eos|stop|length}, as --prompt alone would decode it");
  gen_src->require_option(1);
  // Decoding: each flag given wins; else the model dir's generation_config.json; else
  // transformers' defaults (resolve_generate_options, model/generation_config.h).
  generate->add_option("--max-new-tokens", gen.flags.max_new_tokens,
                       "tokens to generate (default: generation_config.json's max_new_tokens, else its max_length "
                       "minus the prompt's length, else 64)");
  generate->add_option("--temperature", gen.flags.temperature,
                       "0 = greedy; > 0 samples at this temperature (default when sampling: generation_config.json's "
                       "temperature, else 1.0)");
  auto* gen_greedy = generate->add_flag("--greedy", gen.greedy,
                                        "greedy decoding whatever generation_config.json says (transformers' "
                                        "generate(do_sample=False))");
  generate->add_flag("--do-sample", gen.do_sample,
                     "sample whatever generation_config.json says (transformers' generate(do_sample=True)); "
                     "default: its do_sample, else greedy")
      ->excludes(gen_greedy);
  generate->add_option("--top-k", gen.flags.top_k,
                       "sampling: keep the K most likely tokens (ties with the K-th too), 0 = off (default: "
                       "generation_config.json's top_k, else 50, transformers' GenerationConfig default)");
  generate->add_option("--top-p", gen.flags.top_p,
                       "sampling: nucleus mass in (0, 1], 1 = off (default: generation_config.json's top_p, else 1)");
  generate->add_option("--repetition-penalty", gen.flags.repetition_penalty,
                       "> 0, 1 = off: each token of the prompt and the output so far has its logit divided by P "
                       "(multiplied when negative), before temperature / top-k / top-p, greedy too "
                       "(transformers' repetition_penalty; default: generation_config.json's, else 1)");
  generate->add_option("--stop", gen.gen.stop_strings,
                       "stop once a new token completes this string, which may begin in the prompt (repeatable; "
                       "transformers' stop_strings); the output keeps it")
      ->allow_extra_args(false);  // one string per --stop, so a positional after it stays positional
  generate->add_option("--seed", gen.gen.seed, "sampling seed (torch.manual_seed)")->capture_default_str();
  generate->add_option("--dtype", gen.dtype, "fp32|bf16|fp16|auto")->capture_default_str()->transform(dtype_names());
  generate->add_flag("--ids", gen.print_ids, "print the new token ids instead of text");
  generate->add_option("--adapter", gen.adapter,
                       "PEFT LoRA adapter directory to apply; one trained here (a run dir or its checkpoint) "
                       "brings its run's data.template, data.default_system_message and quantization");
  generate->add_option("--template", gen.template_name,
                       "NAME|auto|raw: --prompt is a user message in that chat template (as training renders it), "
                       "followed by the assistant header; raw = the prompt as it is (default: the adapter run's "
                       "data.template, else raw)");
  const CLI::Option* gen_system = generate->add_option(
      "--system", gen.system,
      "with a template: a system message before the user message (default: the adapter run's "
      "data.default_system_message, else the template's own)");
  generate->add_option("--quant", gen.quant,
                       "nf4|fp4|none: the base quantized on load as training does (double quant, blocksize 64), "
                       "e.g. to decode a QLoRA adapter on the base it was trained on (default: the adapter run's "
                       "quantization, else none)")
      ->check(CLI::IsMember({"nf4", "fp4", "none"}));

  qlora::TokenizeOptions tkz;
  auto* tokenize = app.add_subcommand("tokenize", "ids and pieces of a text, or one chat rendered with labels");
  tokenize->add_option("model_dir", tkz.model_dir, "Hugging Face model directory (or tokenizer file)")->required();
  auto* tkz_src = tokenize->add_option_group("input", "what to tokenise");
  const CLI::Option* tkz_text = tkz_src->add_option("--text", tkz.text, "text to tokenise (\"\" = the empty text)");
  tkz_src->add_option("--file", tkz.file, "tokenise this file's bytes");
  tkz_src->add_option("--chat", tkz.chat, "one conversation {\"messages\": [...]} (JSON) to render with --template");
  tkz_src->require_option(1);
  tokenize->add_option("--template", tkz.template_name, "chat template for --chat: a name or auto");
  tokenize->add_flag("--json", tkz.json, "machine-readable output {\"ids\", \"pieces\"}");
  tokenize->add_flag("--no-special", tkz.no_special, "no BOS/EOS from the tokenizer's post-processor");

  qlora::InitModelOptions init;
  auto* init_model = app.add_subcommand("init-model", "write a random-init HF model directory");
  init_model->add_option("--preset", init.preset, presets)->required();
  init_model->add_option("--out", init.out_dir, "output directory (must not exist or be empty)")->required();
  auto* tok_opt = init_model->add_option("--tokenizer", init.tokenizer, "tokenizer.model to copy");
  init_model->add_option("--train-tokenizer", init.train_tokenizer, "train a tokenizer on this text corpus")
      ->excludes(tok_opt);
  init_model->add_option("--vocab-size", init.vocab_size, "vocabulary of a trained tokenizer");
  init_model->add_option("--seed", init.seed, "weight seed")->capture_default_str();
  init_model->add_option("--dtype", init.dtype, "stored dtype fp32|bf16|fp16 (default: the preset's)")
      ->transform(dtype_names());

  qlora::TrainCliOptions train;
  auto* train_cmd = app.add_subcommand("train", "train a LoRA / QLoRA adapter from a YAML config");
  train_cmd->add_option("config", train.config_path, "training config (YAML)")->required();
  train_cmd->add_option("--set", train.overrides, "override a config key: section.key=value");
  train_cmd->add_flag("--force", train.force, "resume even if run-meaning settings changed");
  train_cmd->add_option("--max-time", train.max_time_s,
                        "wall-clock budget in seconds (>= 0; 0: none): stop cleanly with a checkpoint, exit 75");
  train_cmd->add_flag("--overwrite-output-dir", train.overwrite_output_dir, "a fresh run moves a used output_dir aside");
  train_cmd->add_option("--nproc-per-node", train.nproc_per_node,
                        "start N local data-parallel ranks of this command (as torchrun; docs/distributed.md)")
      ->check(CLI::Range(1, 1024));

  qlora::EvalOptions ev;
  auto* eval_cmd = app.add_subcommand("eval", "held-out loss / perplexity, or greedy exact-match accuracy");
  eval_cmd->add_option("config", ev.config_path, "training config (YAML); or give --data and --model (or --adapter)");
  eval_cmd->add_option("--model", ev.model_dir,
                       "base model directory (overrides model.path; without it and a config: the base the adapter's "
                       "adapter_config.json names)");
  eval_cmd->add_option("--data", ev.data, "evaluate on this whole file instead of the config's eval set");
  eval_cmd->add_option("--adapter", ev.adapter, "PEFT LoRA adapter directory to apply");
  eval_cmd->add_option("--metric", ev.metric, "loss | exact_match")->capture_default_str()
      ->check(CLI::IsMember({"loss", "exact_match"}));
  eval_cmd->add_option("--out", ev.out, "result path (default: <adapter>/eval.json; no --adapter: <output_dir>/eval_base.json); - = the JSON on stdout, the summary on stderr");
  eval_cmd->add_option("--max-examples", ev.max_examples, "evaluate the first N examples only (0 = all)")
      ->capture_default_str();
  eval_cmd->add_option("--predictions", ev.predictions,
                       "with --metric exact_match: write every example's prediction here, one JSON line each "
                       "{id, source, reference, prediction, match} (the result file keeps the first 20)");
  eval_cmd->add_option("--set", ev.overrides, "override a config key: section.key=value");

  qlora::MergeOptions mrg;
  auto* merge_cmd = app.add_subcommand("merge", "merge a LoRA adapter into its base: a plain HF model directory");
  merge_cmd->add_option("--base", mrg.base_dir, "base model directory (16-bit or bitsandbytes 4-bit)")->required();
  merge_cmd->add_option("--adapter", mrg.adapter_dir, "PEFT LoRA adapter directory")->required();
  merge_cmd->add_option("--out", mrg.out_dir, "output directory (must not exist or be empty)")->required();
  merge_cmd->add_option("--dtype", mrg.dtype, "bf16|fp16|fp32|auto (auto: the base's stored dtype)")
      ->capture_default_str()->transform(dtype_names());
  merge_cmd->add_option("--max-shard-bytes", mrg.max_shard_bytes, "shard model.safetensors above this size")
      ->capture_default_str();

  qlora::DataPreviewOptions preview;
  auto* data_cmd = app.add_subcommand("data", "inspect a dataset as training will see it");
  data_cmd->require_subcommand(1);
  auto* data_preview = data_cmd->add_subcommand("preview", "rendered examples, masked spans, statistics");
  data_preview->add_option("config", preview.config_path, "training config (YAML)")->required();
  data_preview->add_option("--n", preview.n, "examples to show (of each data.train file)")->capture_default_str();
  data_preview->add_option("--set", preview.overrides, "override a config key: section.key=value");

  qlora::EstimateCliOptions est;
  auto* estimate = app.add_subcommand("estimate", "memory per component, cards that fit, cost (docs/memory.md)");
  auto* est_src = estimate->add_option_group("source", "model shape");
  est_src->add_option("--preset", est.preset, presets + " (with --config: the shape when model.path is not there yet)");
  est_src->add_option("--model", est.model_dir, "Hugging Face model directory (reads config.json only)");
  est_src->add_option("--config", est.config_path, "training config (YAML): its values, overridden by the options "
                      "given here");
  est_src->require_option(1, 2);
  estimate->add_option("--set", est.overrides, "with --config: override a config key: section.key=value");
  estimate->add_option("--method", est.method, "inference|lora|qlora|full")->capture_default_str()
      ->check(CLI::IsMember({"inference", "lora", "qlora", "full"}));
  estimate->add_option("--bits", est.bits, "16|8|4 (base weights; default 4 for qlora, 16 for inference, lora and "
                      "full; inference --bits 4: an NF4 base, as eval and generate --quant nf4 run it)");
  estimate->add_option("--blocksize", est.blocksize, "4-bit blocksize")->capture_default_str();
  auto* est_dq = estimate->add_flag_callback("--double-quant", [&est] { est.double_quant = true; },
                                             "4-bit: quantize the absmax constants too (the default, as "
                                             "quantization.double_quant)");
  estimate->add_flag_callback("--no-double-quant", [&est] { est.double_quant = false; },
                              "4-bit: keep the absmax constants in fp32 (double quant is on by default)")
      ->excludes(est_dq);
  estimate->add_option("--device", est.device, "cuda|cpu: a CPU run has no CUDA context, cuBLAS workspaces or "
                       "allocator rounding")->capture_default_str()->check(CLI::IsMember({"cuda", "cpu"}));
  estimate->add_option("--lora-r", est.lora_r, "LoRA rank")->capture_default_str();
  estimate->add_option("--lora-targets", est.lora_targets, "LoRA targets (all-linear, q_proj, ...)");
  estimate->add_option("--micro-batch-size", est.micro_batch_size, "rows per step")->capture_default_str();
  estimate->add_option("--seq-len", est.seq_len, "tokens per row")->capture_default_str();
  estimate->add_flag("--no-gradient-checkpointing", est.no_gradient_checkpointing, "keep every layer's activations");
  estimate->add_option("--dtype", est.dtype, "compute dtype bf16|fp16|fp32")->capture_default_str()
      ->transform(dtype_names());
  estimate->add_option("--world-size", est.world_size, "data-parallel ranks (per-rank memory; cost of all ranks)")
      ->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  estimate->add_flag("--json", est.json, "machine-readable output");
  estimate->add_option("--tokens", est.tokens, "planned training tokens (cost)");
  estimate->add_option("--tokens-per-s", est.tokens_per_s, "throughput for the cost (e.g. from qlora bench)");
  estimate->add_option("--gpu-hour-price", est.gpu_hour_price, "price of one GPU hour (any currency)");
  estimate->add_option("--utilization", est.utilization, "fraction of time training, (0, 1]")->capture_default_str();

  qlora::BenchOptions bench;
  auto* bench_cmd = app.add_subcommand("bench", "synthetic-shape QLoRA training: tokens/s, MFU, peak memory");
  auto* bench_src = bench_cmd->add_option_group("source", "model shape");
  bench_src->add_option("--preset", bench.preset, presets);
  bench_src->add_option("--model", bench.model_dir, "model directory (only config.json is read)");
  bench_src->require_option(1);
  bench_cmd->add_option("--seq-len", bench.seq_len, "tokens per row")->capture_default_str();
  bench_cmd->add_option("--micro-batch-size", bench.micro_batch_size, "rows per step")->capture_default_str();
  bench_cmd->add_option("--lora-r", bench.lora_r, "LoRA rank")->capture_default_str();
  bench_cmd->add_option("--steps", bench.steps, "optimizer steps per point (first untimed)")->capture_default_str();
  bench_cmd->add_flag("--sweep", bench.sweep, "grid of --seq-lens × --batch-sizes; OOM points = does not fit");
  bench_cmd->add_option("--seq-lens", bench.sweep_seq_lens, "sweep sequence lengths")->capture_default_str();
  bench_cmd->add_option("--batch-sizes", bench.sweep_batch_sizes, "sweep micro-batch sizes")->capture_default_str();
  bench_cmd->add_flag("--no-gradient-checkpointing", bench.no_gradient_checkpointing, "keep every layer's activations");
  bench_cmd->add_option("--gpu-hour-price", bench.gpu_hour_price, "price of one GPU hour: cost per 1M tokens");
  bench_cmd->add_option("--peak-tflops", bench.peak_tflops, "device peak for MFU (default: from the GPU name)");
  bench_cmd->add_option("--out", bench.out_prefix, "--sweep writes OUT.csv and OUT.svg")->capture_default_str();
  bench_cmd->add_option("--seed", bench.seed, "weights and tokens seed")->capture_default_str();
  bench_cmd->add_option("--max-time-s", bench.max_time_s, "start no point likely to end after this (0: none)")
      ->capture_default_str();

  qlora::ImportGgufOptions imp;
  auto* import_cmd = app.add_subcommand("import-gguf", "GGUF model file (llama.cpp / Ollama) -> Hugging Face model directory");
  import_cmd->add_option("gguf", imp.gguf_path, "the GGUF file (llama, qwen2 or qwen3 architecture; any name, e.g. an Ollama blob sha256-<hex>)")->required();
  import_cmd->add_option("--out", imp.out_dir, "output directory (must not exist or be empty)")->required();
  import_cmd->add_option("--dtype", imp.dtype, "stored dtype of model.safetensors")->capture_default_str()
      ->transform(dtype_names())->check(CLI::IsMember({"bf16", "fp32"}));

  decimal_integer_options(app);
  if (const std::string unknown = unknown_command_message(app, argc, argv); !unknown.empty()) {
    std::cerr << "error: " << unknown << "\n";
    return qlora::kExitUsage;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // An override written torchtune's way (`tune run ... key=value`): say it is --set here.
    if (dynamic_cast<const CLI::ExtrasError*>(&e)) {
      const std::vector<std::string> hints = override_hints(app);
      if (!hints.empty()) {
        for (const std::string& h : hints) std::cerr << "error: " << h << "\n";
        return qlora::kExitUsage;
      }
    }
    // --help / --version: 0; a usage error (unknown option, missing or malformed argument): CLI11's
    // message and exit 2, the usual code for a command-line usage error (README).
    return app.exit(e) == 0 ? 0 : qlora::kExitUsage;
  }
  qlora::log::setup(verbose ? qlora::log::Level::debug : qlora::log::Level::info);
  // estimate --config: the options given on the command line override the config's values.
  for (const CLI::App* a : {static_cast<const CLI::App*>(estimate), static_cast<const CLI::App*>(est_src)})
    for (const CLI::Option* opt : a->get_options())
      if (opt->count() > 0)
        est.given.insert(opt->get_name() == "--no-double-quant" ? std::string("--double-quant") : opt->get_name());

  if (*inspect) std::cout << qlora::cmd_inspect(ins);
  gen.has_system = gen_system->count() > 0;
  if (*generate) qlora::cmd_generate(gen, std::cout);
  tkz.has_text = tkz_text->count() > 0;
  if (*tokenize) std::cout << qlora::cmd_tokenize(tkz);
  if (*init_model) qlora::cmd_init_model(init);
  if (*merge_cmd) qlora::cmd_merge(mrg);
  if (*data_preview) std::cout << qlora::cmd_data_preview(preview);
  if (*train_cmd) {
    qlora::check_train_options(train);
    // `qlora train ... 2>&1 | tee log`: a Ctrl-C or a scheduler's SIGTERM to the job's process group
    // ends tee at once, and the stop message written to its pipe would kill the run by SIGPIPE
    // before its checkpoint (exit 141; a trial, session 21). Ignored, the write fails with EPIPE
    // and the run saves and exits 75. (Children reset it: sync commands, trainer/sync.cpp.)
    std::signal(SIGPIPE, SIG_IGN);
  }
  if (*train_cmd && train.nproc_per_node > 0)  // the launcher: starts the ranks, returns their status
    return qlora::launch_local_ranks(train.nproc_per_node,
                                     qlora::strip_nproc_option(std::vector<std::string>(argv, argv + argc)));
  if (*train_cmd) qlora::cmd_train(train);
  if (*estimate) std::cout << qlora::cmd_estimate(est);
  if (*bench_cmd) std::cout << qlora::cmd_bench(bench);
  if (*eval_cmd) std::cout << qlora::cmd_eval(ev);
  if (*import_cmd) std::cout << qlora::cmd_import_gguf(imp);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGXFSZ, SIG_IGN);  // a file-size limit (ulimit -f) fails the write with EFBIG instead of killing
  // QLORA_DETERMINISTIC=1: deterministic algorithms and math-only attention (trainer/train.h,
  // set_deterministic_algorithms); the CUDA resume-exactness and NCCL tests (tests/gpu) run with
  // it. Pair it with CUBLAS_WORKSPACE_CONFIG=:4096:8 in the environment for cuBLAS.
  if (const char* d = std::getenv("QLORA_DETERMINISTIC"); d && std::string(d) == "1")
    qlora::set_deterministic_algorithms();
  try {
    return run(argc, argv);
  } catch (const qlora::Interrupted& e) {
    std::cerr << "interrupted: " << first_line(e.what()) << "\n";
    return qlora::kExitInterrupted;
  } catch (const qlora::TryLater& e) {  // e.g. output_dir held by a live run: retry, not a bad input
    std::cerr << "error: " << first_line(e.what()) << "\n";
    return qlora::kExitInterrupted;
  } catch (const qlora::ErrorList& e) {  // several errors of one input (a config): each on its own line
    for (const std::string& line : e.lines()) std::cerr << "error: " << line << "\n";
  } catch (const qlora::RelayedError& e) {
    // rank 0's error, which rank 0 printed: once per job on the launcher's terminal, not once per rank
    if (!std::getenv("QLORA_LAUNCHED_NPROC")) std::cerr << "error: " << first_line(e.what()) << "\n";
  } catch (const qlora::Error& e) {
    std::cerr << "error: " << first_line(e.what()) << "\n";
  } catch (const c10::Error& e) {
    std::cerr << "error: " << first_line(e.what_without_backtrace()) << "\n";
  } catch (const std::filesystem::filesystem_error& e) {
    std::cerr << "error: " << filesystem_error_line(e) << "\n";
  } catch (const std::exception& e) {
    std::cerr << "error: " << first_line(e.what()) << "\n";
  }
  return 1;
}
