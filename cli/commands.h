// qlora-cpp: the `qlora` subcommands, each a plain function taking typed options.
// Each throws qlora::Error for user-caused failures; main() prints it on one line and exits 1.
#pragma once
#include <cstdint>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "adapters/peft.h"
#include "model/generate.h"

namespace qlora {

struct InspectOptions {
  std::string model_dir;
  bool json = false;
  std::string quant;          ///< "" = headers only; "nf4" | "fp4" = really quantize on load
  bool double_quant = true;   ///< with quant: quantize the absmax constants too (training's default)
  int64_t blocksize = 64;     ///< with quant: 32..4096, power of two
};
/// `qlora inspect MODEL_DIR [--json]`: architecture, parameters and bytes per component, dtypes.
/// Reads only config.json and the safetensors headers (and, under tie_word_embeddings: true, a
/// stored lm_head.weight and the embeddings to compare them: check_tied_lm_head). Returns the text it printed.
/// With `--quant nf4|fp4 [--no-double-quant] [--blocksize N]` (double quant on by default, as
/// training's quantization.double_quant): loads the model on the CPU, quantizing
/// the decoder linears as it streams them (LlamaModel::load with QuantOptions; a bitsandbytes
/// checkpoint is read as stored), and reports bytes of the quantized weights, of the quantization
/// constants and of the unquantized (stored-dtype) modules, bits per parameter, the rule of thumb
/// params × 0.5 byte, and this process's peak RSS (VmHWM). Throws qlora::Error as load does.
std::string cmd_inspect(const InspectOptions& o);

struct GenerateCliOptions {
  std::string model_dir;
  std::string prompt;
  /// --prompts FILE: JSONL, one {"prompt": TEXT, "system"?: TEXT} per line (blank lines skipped),
  /// instead of --prompt; the model loads once and each line prints one JSON line.
  std::string prompts_file;
  std::string dtype = "auto";
  bool print_ids = false;  ///< print new token ids instead of text
  /// The decoding flags given (nullopt: not given): --max-new-tokens, --temperature, --top-k,
  /// --top-p, --repetition-penalty; do_sample is set from greedy / do_sample below. Resolved
  /// against the model dir's generation_config.json by resolve_generate_options().
  GenerationConfig flags;
  bool greedy = false;     ///< --greedy: do_sample false
  bool do_sample = false;  ///< --do-sample: do_sample true
  /// PEFT adapter directory to apply ("" = base model only). One trained here (config.resolved.yaml,
  /// or a checkpoint's trainer_state.json "config") brings its run's template,
  /// default_system_message and quantization (adapter_run_keys() with for_prompt) unless given below.
  std::string adapter;
  std::string template_name;  ///< --template NAME|auto|raw: --prompt is a user message in that chat template ("" = the adapter run's, else raw; raw = the prompt as it is)
  std::string system;         ///< --system TEXT: a system message before it (with a template)
  bool has_system = false;    ///< --system was given (so --system '' means none, not the run's)
  /// --quant nf4|fp4|none: quantize the base's decoder linears on load as `train` / `eval` do with
  /// quantization.method (double quant, blocksize 64), so a QLoRA adapter decodes on the base it was
  /// trained on (bitsandbytes users: load_in_4bit + PeftModel); none = the stored 16/32-bit weights.
  /// "" = the adapter run's quantization section, else none.
  std::string quant;
  GenerateOptions gen;  ///< stop_strings = --stop (repeatable) and seed = --seed; the rest is resolved from `flags`
};
/// `qlora generate MODEL_DIR --prompt TEXT [...]`: writes the continuation (or its ids) and a
/// newline to `out`: the new ids decoded, EOS ids left out, a stop string and whatever its last
/// token adds after it kept (as transformers' output ids decode). Decodes as transformers'
/// `model.generate(input_ids)` does for MODEL_DIR: each decoding flag given wins, else
/// generation_config.json's do_sample / temperature / top_k / top_p / repetition_penalty /
/// max_new_tokens / max_length, else transformers' defaults (resolve_generate_options; logged in
/// one line with each value's source). Stops at any id of the tokenizer's eos_ids()
/// (generation_config.json's eos_token_id list), at a --stop string (which may begin in the
/// prompt, as transformers' StopStringCriteria), or after max_new_tokens. With --prompts FILE: one
/// JSON line per prompt, {"prompt", "output", "ids", "finish_reason": "eos"|"stop"|"length"}, each
/// flushed when done; every prompt decodes as `--prompt` alone would (the sampling generator
/// reseeded with --seed for each). With an adapter trained here, logs each brought setting and
/// where its value came from. Throws qlora::Error for bad options (check_generate_options,
/// resolve_generate_options), a bad generation_config.json value (file and key), a bad --prompts
/// line (FILE:LINE and the key, before the model loads), a prompt with no tokens (an empty text,
/// no BOS) or one that fills generation_config.json's max_length, --system without a template, an
/// unknown template, a bad model or adapter.
void cmd_generate(const GenerateCliOptions& o, std::ostream& out);


struct TokenizeOptions {
  std::string model_dir;      ///< model dir (or tokenizer file) to load the tokenizer from
  std::string text;           ///< --text
  bool has_text = false;      ///< --text was given (so --text "" is the empty text, not no input)
  std::string file;           ///< --file: tokenise this file's bytes
  bool json = false;          ///< --json
  bool no_special = false;    ///< --no-special: no post-processor BOS/EOS (add_special_tokens=False)
  std::string chat;           ///< --chat FILE.json: one conversation {"messages": [...], "tools"?}
  std::string template_name;  ///< --template NAME (or auto) for --chat
};
/// `qlora tokenize MODEL_DIR (--text S | --file F) [--json] [--no-special]`: the ids and pieces of
/// the text (= tokenizers' encode(text, add_special_tokens=!no_special)); json: {"ids", "pieces"}.
/// `--chat FILE.json --template NAME`: renders that one conversation as training does (render,
/// tokenize, and data preview's masked view) and marks each token trained or masked; json adds
/// "labels" (-100 = masked) and "trained". Throws qlora::Error for an unreadable file, a chat file
/// that is not one valid conversation (file:line: problem), or an unknown template name.
std::string cmd_tokenize(const TokenizeOptions& o);

struct InitModelOptions {
  std::string preset;
  std::string out_dir;
  std::string tokenizer;        ///< path to a tokenizer.model to copy
  std::string train_tokenizer;  ///< or: a text/JSON(L) corpus to train one on
  int vocab_size = 0;           ///< with train_tokenizer (0: 2000)
  uint64_t seed = 0;
  std::string dtype;            ///< stored dtype: fp32|bf16|fp16 ("" = the preset's)
};
/// `qlora init-model --preset NAME --out DIR ...`: writes a random-init HF model directory
/// (config.json, model.safetensors, generation_config.json, tokenizer files). Refuses an existing
/// non-empty DIR; builds in DIR.tmp-<pid> and renames, so DIR is complete or absent.
void cmd_init_model(const InitModelOptions& o);

struct DataPreviewOptions {
  std::string config_path;
  std::vector<std::string> overrides;  ///< --set key=value
  int n = 3;                           ///< examples to render
};
/// `qlora data preview CONFIG [--n N] [--set k=v]`: loads the config's data section with its
/// tokenizer and returns rendered examples (masked spans marked) and dataset statistics.
/// Throws qlora::Error for config, tokenizer or dataset errors (file:line / key named).
std::string cmd_data_preview(const DataPreviewOptions& o);

struct TrainCliOptions {
  std::string config_path;
  std::vector<std::string> overrides;  ///< --set key=value
  bool force = false;                  ///< resume despite changed run-meaning settings
  double max_time_s = 0;               ///< --max-time budget in seconds (0 = none)
  bool overwrite_output_dir = false;   ///< a fresh run moves a used output_dir aside instead of refusing
  int nproc_per_node = 0;              ///< --nproc-per-node N: launch N local ranks (trainer/launch.h); 0 = be one
};
/// The train options a command line can get out of range, checked before the launcher starts ranks
/// or the config is read: --max-time below 0 or not a number (qlora::Error, exit 1, as README's
/// out-of-range values; a wrapper's remaining time gone negative must not mean "no limit").
void check_train_options(const TrainCliOptions& o);
/// `qlora train CONFIG [--set k=v]`: validates the config, trains, writes the adapter and reports
/// into output_dir. Bad config or data: qlora::Error before anything is written to output_dir.
/// Stopped by a stop signal (trainer::kStopSignals) or --max-time: checkpoint written, then qlora::Interrupted
/// whose message gives the exact command that resumes. A fresh run in a used output_dir, a resume
/// path without a valid checkpoint, or changed data content on resume: qlora::Error
/// (docs/checkpoints.md, "Run safety").
void cmd_train(const TrainCliOptions& o);

struct EvalOptions {
  std::string config_path;             ///< training config ("" = none: then data and model_dir or adapter are required)
  std::string model_dir;               ///< --model: base model dir (overrides model.path; none, no config: adapter_config.json's base)
  std::string data;                    ///< --data: use this file as the eval set
  std::string adapter;                 ///< --adapter: PEFT adapter dir ("" = base model only)
  std::string metric = "loss";         ///< loss | exact_match
  std::string out;                     ///< result path ("" = <adapter>/eval.json; no adapter: <output_dir>/eval_base.json)
  int64_t max_examples = 0;            ///< evaluate the first N examples only (0 = all)
  std::string predictions;             ///< --predictions: exact_match's every prediction as JSONL ("" = none)
  std::vector<std::string> overrides;  ///< --set key=value
};
/// `qlora eval CONFIG|--model DIR --data FILE [--adapter DIR] [--metric loss|exact_match]` (no
/// config and no --model: the base directory the adapter's adapter_config.json names):
/// mean next-token CE (nats) and perplexity over the eval set (the config's data.eval or its
/// val_set_size hold-out; with --data, that whole file), memory bounded by one batch. With
/// exact_match also greedy-generates each example's last assistant answer from its prompt
/// (stopping at any id of the tokenizer's eos_ids() or after reference length + 8 tokens) and counts trimmed exact matches.
/// Writes the result (EvalOptions::out) after checking up front that it can be created there
/// (check_can_create); returns the text it printed. Throws qlora::Error for bad input; a failed
/// final write prints the result to stdout, then throws.
std::string cmd_eval(const EvalOptions& o);

/// Loads a PEFT LoRA adapter directory into `model` (strict: every module and shape checked
/// first, nothing attached on error), dropout off. Returns the adapter's config.
PeftConfig attach_peft_adapter(LlamaModel& model, const std::string& adapter_dir);

struct MergeOptions {
  std::string base_dir;     ///< HF model dir: 16-bit, or a bitsandbytes 4-bit checkpoint (dequantized)
  std::string adapter_dir;  ///< PEFT LoRA adapter dir (adapter_config.json + adapter_model.safetensors)
  std::string out_dir;      ///< must not exist or be empty
  std::string dtype = "auto";  ///< bf16 | fp16 | fp32 | auto (the base's stored torch_dtype)
  int64_t max_shard_bytes = 5'000'000'000;  ///< above this, shards + model.safetensors.index.json
};
/// `qlora merge --base DIR --adapter DIR --out DIR [--dtype bf16|fp16|fp32] [--max-shard-bytes N]`:
/// W' = W + s·B·A for every adapted decoder linear (s = alpha/r, or alpha/√r with rsLoRA), computed
/// in fp32 from the base loaded in fp32 (a 4-bit base is dequantized, never re-quantized), then cast
/// to the output dtype. Writes a standard HF dir (model.safetensors or shards + index, config.json
/// without quantization_config, generation/tokenizer files copied) into <out>.tmp-<pid> and renames
/// it, so <out> is complete or absent. Throws qlora::Error for a non-empty --out, a bad --dtype, an
/// adapter that does not fit the base (load_peft_adapter's checks), DoRA / rank_pattern adapters,
/// or a LoRA on lm_head (named: tied embeddings would change the input embeddings too).
void cmd_merge(const MergeOptions& o);

struct EstimateCliOptions {
  std::string preset, model_dir, config_path;  ///< one of preset / model_dir; or config_path, optionally with one
  std::string method = "qlora";                ///< inference | lora | qlora | full
  int bits = 4;                                ///< 16 | 8 | 4
  int64_t blocksize = 64;
  bool double_quant = true;                    ///< --double-quant / --no-double-quant (training's default: on)
  std::string device = "cuda";                 ///< cuda | cpu: the device the run will use
  int64_t lora_r = 16;
  std::vector<std::string> lora_targets = {kAllLinear};
  int64_t micro_batch_size = 1;
  int64_t seq_len = 2048;
  bool no_gradient_checkpointing = false;
  std::string dtype = "bf16";                  ///< compute dtype: bf16 | fp16 | fp32
  bool json = false;
  double tokens = 0, gpu_hour_price = 0, tokens_per_s = 0, utilization = 1.0;  ///< cost (tokens > 0)
  int64_t world_size = 1;                      ///< data-parallel ranks: per-rank memory, all ranks' cost
  std::vector<std::string> overrides;          ///< --set section.key=value (with --config)
  /// The options given on the command line ("--seq-len", "--double-quant", ...; main.cpp fills it):
  /// with --config, these override the config's values; the others come from the config.
  std::set<std::string> given;
};
/// `qlora estimate (--preset NAME | --model DIR | --config YAML [--preset NAME | --model DIR]) [...]`:
/// the memory estimate per component (trainer/estimate.h, docs/memory.md), the cards it fits with
/// the headroom, the rules of thumb; with --tokens and --tokens-per-s, GPU-hours and cost. A
/// --config (plus --set overrides) gives method, quantization, LoRA, batch, length, dtype and
/// cost.gpu_hour_price; every option given explicitly (o.given) overrides the config's value and the
/// output says so. The model shape comes from --preset / --model when given, else from the config
/// (model.path's config.json or model.preset). Incomplete cost inputs give a note saying what is
/// missing, not an error. Returns the text (or JSON) to print. Throws qlora::Error for bad input
/// (unknown preset, non-positive sizes, r wider than a layer, a model dir without config.json: the
/// message says how to estimate without the weights).
std::string cmd_estimate(const EstimateCliOptions& o);

struct BenchOptions {
  std::string preset, model_dir;  ///< exactly one; a model dir gives only its shape (config.json)
  int64_t seq_len = 512;
  int64_t micro_batch_size = 1;
  int64_t lora_r = 16;
  int64_t steps = 5;              ///< optimizer steps per point; the first is warm-up when steps > 1
  bool sweep = false;             ///< grid seq_lens × batch_sizes
  std::vector<int64_t> sweep_seq_lens = {512, 1024, 2048, 4096};
  std::vector<int64_t> sweep_batch_sizes = {1, 2, 4};
  bool no_gradient_checkpointing = false;
  double gpu_hour_price = 0;      ///< > 0: cost per 1M tokens
  double peak_tflops = 0;         ///< 0: from the device name (CUDA), none on CPU
  std::string out_prefix = "bench";  ///< --sweep writes PREFIX.csv and PREFIX.svg
  uint64_t seed = 0;
  double max_time_s = 0;          ///< > 0: start no point that would likely end after this many seconds
};
/// `qlora bench`: trains `steps` optimizer steps on random tokens with random NF4 (double quant,
/// blocksize 64) weights made in memory, LoRA all-linear; prints tokens/s, step time, MFU/HFU and
/// peak memory measured vs estimated. --sweep runs the grid, records "does not fit" on CUDA OOM,
/// prints a table and writes CSV + SVG. The CSV header is written first and each row as its point
/// finishes (flushed; the SVG is rewritten too), so a killed sweep keeps the points it finished;
/// each finished point is also logged. Points run micro-batch-major (all of the first batch size
/// first). With max_time_s, a point starts only when the previous point's time scaled by tokens
/// says it ends inside the budget (the first point: one step as predicted below); points not
/// started are listed. Before making the weights it measures the device (about a second:
/// matmul FLOP/s, the weight-making and dequantization rates) and logs how long one step of the
/// largest point and the whole bench will take (training_step_seconds, random_weights_seconds);
/// without max_time_s a bench predicted over 600 s is refused (qlora::Error naming --max-time-s).
/// The env variable QLORA_BENCH_TEST_MATMUL_GFLOPS replaces the measured matmul speed (tests).
/// Nothing is downloaded. Returns the printed text.
std::string cmd_bench(const BenchOptions& o);

}  // namespace qlora
