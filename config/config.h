// qlora-cpp training config: the YAML file (plus `--set key=value` overrides) parsed and validated
// once, at the edge, into plain typed structs.
//
// Nothing below this header sees YAML: the trainer hands each module the plain values it needs
// (LoraLinear gets r/alpha/dropout, the data pipeline gets data::DataOptions by value). Each
// section's keys are declared once, in config.cpp's field table (visit_fields): the key list,
// reading, to_yaml and operator== are driven from it. Every key, its type, default and meaning is
// documented in docs/config.md; test_config fails when that table and config_keys() differ.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include "common/error.h"

#include "adapters/target_modules.h"
#include "data/options.h"
#include "model/options.h"

namespace qlora {

/// Learning-rate schedule after warmup (`training.lr_scheduler`; trainer/schedule.h). The order is
/// the spelling list's (config.cpp kSchedulers).
enum class LrScheduler { kConstant, kLinear, kCosine, kConstantWithWarmup, kPolynomial, kCosineWithRestarts };
/// `polynomial`'s end learning rate and power: transformers' get_scheduler defaults (lr_end 1e-7,
/// power 1.0 of get_polynomial_decay_schedule_with_warmup).
constexpr double kPolynomialLrEnd = 1e-7;
constexpr double kPolynomialPower = 1.0;
/// What `checkpoint.resume` asks for: the newest complete checkpoint, none, or the one at a path.
enum class ResumeMode { kAuto, kNever, kPath };

/// `model:` — where the base model comes from and what it computes in.
struct ModelSource {
  std::string path;         ///< Hugging Face model directory ("" when `preset` is used)
  std::string preset;       ///< built-in architecture (see known_model_presets()), "" = none
  bool random_init = false; ///< YAML `init: random|pretrained`; a preset requires random
  std::string tokenizer;    ///< tokenizer file or dir; "" = the one inside `path`
  DType dtype = DType::kBF16; ///< compute dtype (model/options.h)
};

/// `lora:` — the adapters. y = W0·x + s·B·A·dropout(x), s = alpha/r (alpha/√r with use_rslora).
struct LoraConfig {
  int64_t r = 16;           ///< rank (> 0)
  double alpha = 32.0;      ///< scale numerator (> 0)
  double dropout = 0.05;    ///< on the adapter input, in [0, 1)
  /// Projection names adapted (llama_linear_names()), or {"all-linear"}: every one of them
  /// (YAML `target_modules: all-linear`; adapters/target_modules.h).
  std::vector<std::string> target_modules = {kAllLinear};
  bool use_rslora = false;  ///< rank-stabilised scale alpha/√r
  /// A PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors) a new run
  /// starts from instead of a fresh adapter (Axolotl's lora_model_dir); "" = a new adapter. Its
  /// r, lora_alpha and use_rslora must equal this section's (trainer/train.cpp). `~` and ${VAR} expanded.
  std::string model_dir;
};

/// `training:` — the optimisation loop.
struct TrainingConfig {
  int64_t micro_batch_size = 1;             ///< rows per forward/backward (> 0)
  int64_t gradient_accumulation_steps = 8;  ///< micro-batches per optimizer step (> 0)
  int64_t num_epochs = 1;                   ///< passes over the data (>= 0; used when max_steps <= 0)
  int64_t max_steps = -1;                   ///< optimizer steps; -1 = run num_epochs
  double learning_rate = 2.0e-4;            ///< peak LR (> 0)
  LrScheduler lr_scheduler = LrScheduler::kCosine;
  int64_t warmup_steps = 10;                ///< linear warmup steps (>= 0)
  double warmup_ratio = 0.0;                ///< warmup as a fraction of total steps, in [0, 1)
  double weight_decay = 0.0;                ///< AdamW decoupled decay (>= 0)
  double adam_beta1 = 0.9;                  ///< in [0, 1)
  double adam_beta2 = 0.999;                ///< in [0, 1)
  double adam_epsilon = 1e-8;               ///< > 0
  double max_grad_norm = 1.0;               ///< global-norm clip; 0 = no clipping
  bool gradient_checkpointing = true;       ///< recompute decoder layers in backward
  uint64_t seed = 42;                       ///< LoRA init and dropout RNG seed
  int64_t logging_steps = 1;                ///< log every N optimizer steps (>= 1)
  int64_t max_nonfinite_steps = 5;          ///< consecutive NaN/Inf-loss steps skipped before failing
  int64_t eval_steps = 0;                   ///< evaluate every N steps; 0 = at the end of each epoch
};

/// `checkpoint:` — when to save, what to keep, where to resume from.
struct CheckpointConfig {
  int64_t save_steps = 100;    ///< save every N optimizer steps; 0 = off
  double save_minutes = 30.0;  ///< also save every M minutes of wall time; 0 = off
  int64_t keep_last = 3;       ///< complete checkpoints kept (>= 1)
  /// Also keep the checkpoint with the lowest eval_loss (besides the newest keep_last; HF Trainer's
  /// load_best_model_at_end + save_total_limit never deletes the best either). Needs eval data.
  bool keep_best = false;
  ResumeMode resume = ResumeMode::kAuto;
  std::string resume_path;     ///< the checkpoint dir when resume == kPath
  std::string resume_from_dir; ///< dir searched by `resume: auto`; "" = <output_dir>/checkpoints
  std::string sync_command;    ///< shell command run after each completed checkpoint; "" = none
  /// Seconds the run waits, after its last checkpoint (end, signal, --max-time), for the sync
  /// commands still running; 0 = do not wait (they are left running).
  double sync_timeout_seconds = 600.0;
};

/// `cost:` — used to print the run's cost estimate.
struct CostConfig {
  double gpu_hour_price = 0.0;  ///< price of one GPU hour; 0 = don't print cost
};

/// The whole training config. Plain data: copyable, comparable, no YAML types inside.
struct Config {
  std::string output_dir;  ///< run directory (required)
  ModelSource model;
  QuantOptions quantization{kernels::Quant4Type::NF4};  ///< `quantization:` (model/options.h); NF4 by default
  LoraConfig lora;
  data::DataOptions data;
  TrainingConfig training;
  CheckpointConfig checkpoint;
  CostConfig cost;
  /// Where each key set by the file or a `--set` came from: dotted key ("data.val_set_size") ->
  /// "<file>:<line>" or "--set <key>=<value>" (the text config errors start with). Not a setting:
  /// operator==, to_yaml and the run's fingerprint ignore it. Filled by load_config /
  /// parse_config_string / config_with_overrides; used by with_key_sources().
  std::map<std::string, std::string> key_sources;
};

/// Field-by-field equality of two configs (including every data::DataOptions field).
bool operator==(const Config& a, const Config& b);
inline bool operator!=(const Config& a, const Config& b) { return !(a == b); }

/// Reads the YAML file at `path`, applies `overrides` ("section.key=value", each value parsed as a
/// YAML scalar or flow collection, e.g. "lora.target_modules=[q_proj, v_proj]") to the tree, and
/// validates the result against the schema. Throws qlora::Error with one line naming `path:line:`
/// (or the `--set` override) and the dotted key; a config with several errors that can each be
/// found on its own (unknown keys, type and range errors, ...) throws qlora::ErrorList, one such
/// line per error, in file order then the --set ones (docs/config.md, "Every error in one run").
/// On error nothing is returned.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

/// What a valid config does that its writer may not mean, each a line without a prefix:
/// data.val_set_size ignored because data.eval is set; training.warmup_steps >= max_steps (the run
/// never leaves warmup). Logged as warnings by the commands that use the config as the user's
/// (train, data preview, eval CONFIG), not when a command reads an earlier run's config (eval /
/// generate / merge --adapter RUN). Never throws.
std::vector<std::string> config_warnings(const Config& c);

/// As load_config, on YAML text; `source_name` stands for the file name in error messages.
Config parse_config_string(const std::string& yaml_text, const std::string& source_name,
                           const std::vector<std::string>& overrides = {});

/// `base` with `overrides` ("section.key=value", as for load_config) applied and validated the
/// way load_config validates a file: each overridden key is type- and range-checked, and every
/// section's cross-field rules run on the result. Keys no override sets keep base's values (path
/// keys are `~`/$VAR-expanded as in a file); a section load_config requires may come from base.
/// For commands that build their config in code (`qlora eval --model DIR --data FILE`).
/// `source_name` stands for the file name in error messages. Throws qlora::Error as load_config.
Config config_with_overrides(const Config& base, const std::vector<std::string>& overrides,
                             const std::string& source_name);

/// LoRA target modules given outside a config file (`qlora estimate --lora-targets`): `value` is
/// read as the YAML value of lora.target_modules, as `--set lora.target_modules=VALUE` reads it
/// ("all-linear", or a flow list "[q_proj, v_proj]"), by the config's own reader, so the same
/// names are accepted and refused. Returns the names ({"all-linear"} for all-linear). Throws
/// qlora::Error with one line starting with `source_name`, e.g. "<source_name>:
/// lora.target_modules[1]: unknown module \"v_prj\"; did you mean \"v_proj\"?".
std::vector<std::string> parse_target_modules(const std::string& value, const std::string& source_name);
/// The data.train (`key` "train") or data.eval ("eval") files of a config's YAML text (a
/// checkpoint's stored config.resolved.yaml), read as a config file's are; {} when the key is
/// absent. Only that key is read (the rest of the text may be an older schema). For the resume
/// check, which names what changed in a list of files. Throws qlora::Error naming `source_name`.
std::vector<data::DataSource> data_sources_in(const std::string& config_yaml, const std::string& key,
                                             const std::string& source_name);

/// `msg` with the source of its key in front when it starts with a dotted key of `c.key_sources`
/// and ": " ("data.val_set_size: ..." -> "t.yaml:12: data.val_set_size: ..."); else `msg`.
std::string with_key_source(const Config& c, const std::string& msg);

/// Runs `f()` and returns its result. A qlora::Error thrown by it whose message starts with a
/// dotted key of `c.key_sources` and ": " (the form data/model errors take: "data.val_set_size: 5000
/// leaves no training example out of 681") is rethrown with that key's source in front, as config
/// errors read: "t.yaml:12: data.val_set_size: ...". An ErrorList (several such errors, e.g. every
/// missing data file) is rethrown with each line so placed. Any other exception passes through
/// unchanged. For the checks only possible once files are read (model dir, data size), far from
/// the YAML.
template <class F>
auto with_key_sources(const Config& c, F&& f) -> decltype(f()) {
  try {
    return std::forward<F>(f)();
  } catch (const ErrorList& e) {
    std::vector<std::string> lines;
    for (const std::string& line : e.lines()) lines.push_back(with_key_source(c, line));
    throw ErrorList(lines);
  } catch (const Error& e) {
    if (typeid(e) != typeid(Error)) throw;
    const std::string msg = e.what();
    const std::string placed = with_key_source(c, msg);
    if (placed == msg) throw;
    throw Error(placed);
  }
}

/// Where the tokenizer comes from: `model.tokenizer` when set, else `model.path`. Checks the
/// files first, so a wrong path is named as what it is: throws qlora::Error
/// "model.path: <p>: model directory not found" / "model.path: <p> is a file, expected a Hugging
/// Face model directory ..." (a .gguf file: import it first), "model.tokenizer: a preset model
/// needs a tokenizer ..." when neither is set, and "<key>: <p>: tokenizer not found (...)" /
/// "<key>: <p>: no tokenizer.json or tokenizer.model in this directory" (key model.tokenizer when
/// set, else model.path) when Tokenizer::from_pretrained would find no tokenizer file; run it under
/// with_key_sources so the key's file:line comes first.
std::string tokenizer_source(const ModelSource& m);

/// For `model.init: pretrained` with a model.path (a preset or init: random reads no weights):
/// throws qlora::Error "model.path: <p>: no model.safetensors or model.safetensors.index.json
/// (<why>)" when the directory holds neither, what the load (SafetensorsCheckpoint) would fail on
/// after the data is read; <why> names a pytorch_model.bin or *.gguf file found there, else
/// model.init: random. Run it under with_key_sources so the key's file:line comes first.
void check_model_weights(const ModelSource& m);

/// The fully resolved config (every key, defaults included; of model.path and model.preset only
/// the one set, the other being "") as YAML, for config.resolved.yaml.
/// parse_config_string(to_yaml(c), ...) == c for every valid c.
std::string to_yaml(const Config& config);

/// Canonical spellings, as written in YAML ("cosine", "auto"; a DType's is dtype_name, a quant
/// method's quant_method_name, model/options.h).
const char* to_string(LrScheduler v);
const char* to_string(ResumeMode v);

/// One key of the schema, from the field table: its dotted name ("output_dir", "model",
/// "model.path", ...; a section's own name comes before its keys) and, for a key that takes one
/// of a fixed set of names, those names in order ("bf16", "fp16", ...); empty otherwise.
struct ConfigKey {
  std::string key;
  std::vector<std::string> choices;
};
/// Every key of the schema, in table order (the order to_yaml writes them).
std::vector<ConfigKey> config_keys();

/// Names accepted by `model.preset`.
const std::vector<std::string>& known_model_presets();

}  // namespace qlora
