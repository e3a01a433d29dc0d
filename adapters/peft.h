// qlora-cpp: the PEFT LoRA adapter directory (peft/utils/save_and_load.py, peft/config.py):
//   adapter_config.json       {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r", "lora_alpha",
//                              "lora_dropout", "target_modules", "use_rslora", "bias": "none",
//                              "base_model_name_or_path", ...}
//   adapter_model.safetensors base_model.model.<HF module path>.lora_A.weight  [r, in]
//                             base_model.model.<HF module path>.lora_B.weight  [out, r]
#pragma once
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "adapters/lora.h"

namespace qlora {

/// The adapter_config.json fields qlora-cpp writes and reads.
struct PeftConfig {
  int64_t r = 8;
  double lora_alpha = 16;
  double lora_dropout = 0.0;
  std::vector<std::string> target_modules;  ///< as configured (e.g. ["q_proj", "v_proj"] or ["all-linear"])
  bool use_rslora = false;
  std::string base_model_name_or_path;
  /// target_modules given as a string other than "all-linear": PEFT full-matches it as a regular
  /// expression against each module path (re.fullmatch); target_modules is then empty.
  std::string target_regex;
  /// Only these layer indices (PEFT layers_to_transform; empty = every layer). Applies to the
  /// list form of target_modules, not to a regex or an exact full-path entry (as in PEFT).
  std::vector<int64_t> layers_to_transform;
  /// The module-path component before the layer index (PEFT layers_pattern, e.g. ["layers"]);
  /// empty = the first "<name>.<digits>." in the path.
  std::vector<std::string> layers_pattern;
  /// PEFT exclude_modules: a regex string (exclude_regex) or a list of names / path suffixes.
  std::vector<std::string> exclude_modules;
  std::string exclude_regex;
};

/// The LoraOptions of an adapter config: r, lora_alpha, lora_dropout, target_modules, use_rslora
/// (seed 0; a loaded adapter is not drawn).
LoraOptions lora_options(const PeftConfig& c);

/// Whether the adapter config `c` adapts the module at HF path `module` ("model.layers.1.mlp.down_proj"),
/// exactly as PEFT's check_target_module_exists (peft/tuners/tuners_utils.py, PEFT 0.18+): excluded
/// modules first; a string target_modules is re.fullmatch'ed; else the path equals an entry
/// (no layer filter), or ends with "." + an entry ("all-linear": the seven Llama projections),
/// then layers_to_transform keeps only the listed layer indices, the index being the number after
/// the first path component named in layers_pattern (or the first "<name>.<digits>." when empty).
/// Regexes use PCRE2 (Python `re` and PCRE2 agree on the syntax PEFT configs use). Throws
/// qlora::Error naming the pattern when it does not compile.
bool peft_targets_module(const PeftConfig& c, const std::string& module);

/// LoRA weights by HF module path ("model.layers.0.self_attn.q_proj"): {A [r, in], B [out, r]}.
using LoraWeights = std::map<std::string, std::pair<torch::Tensor, torch::Tensor>>;

/// PEFT's tensor key for a module's A or B: "base_model.model.<module>.lora_A.weight".
std::string peft_key(const std::string& module, bool is_a);

/// Writes `dir`/adapter_config.json and `dir`/adapter_model.safetensors (fp32 unless the tensors
/// are another float dtype), each atomically; creates `dir`. Throws qlora::Error when `weights`
/// is empty, when a pair's shapes disagree with r, or on an I/O error.
void save_peft_adapter(const std::string& dir, const PeftConfig& cfg, const LoraWeights& weights);

/// Module path → {in_features, out_features}: the LoRA modules an adapter must hold, in their shapes.
using ModuleShapes = std::map<std::string, std::pair<int64_t, int64_t>>;

/// Reads the tensors of the PEFT LoRA directory `dir`, whose adapter_config.json the caller has
/// read into `cfg` (read_peft_config; r gives the expected shapes: lora_A [r, in], lora_B
/// [out, r]). `expected`: the modules it must hold; `selected_by` says where that set comes from
/// ("adapter_config.json's target_modules", "lora.target_modules"), for the note on an unexpected
/// key. Every key is checked before anything is returned: a missing module, an unexpected key, a
/// wrong shape, or an adapter with no tensors throws one qlora::Error naming
/// adapter_model.safetensors and listing the problems (never a partial load); a directory with only
/// adapter_model.bin (a pickle) is named as such. Tensors come back fp32 on CPU.
LoraWeights load_peft_adapter(const std::string& dir, const PeftConfig& cfg, const ModuleShapes& expected,
                              const std::string& selected_by);

/// load_peft_adapter's `selected_by` when `expected` is what the adapter's own config selects in
/// the model (peft_module_shapes): eval, generate, merge.
inline const std::string kSelectedByAdapterConfig = "adapter_config.json's target_modules";

/// Parses `dir`/adapter_config.json (target_modules as a list or a regex string, layers_to_transform
/// as an int or a list, layers_pattern as a string or a list, exclude_modules). Throws qlora::Error
/// naming the file and field, also for fields that would change the result and are not supported
/// (non-empty rank_pattern / alpha_pattern, use_dora, fan_in_fan_out true).
PeftConfig read_peft_config(const std::string& dir);

}  // namespace qlora
