// qlora-cpp: the decoder's shape, read from a Hugging Face config.json.
//
// Supported architectures: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM
// (transformers `configuration_llama.py` / `configuration_mistral.py` / `configuration_qwen2.py` /
// `configuration_qwen3.py`, read with those classes' defaults). Both the
// transformers 4.x spelling (rope_theta, rope_scaling, torch_dtype) and the 5.x one
// (rope_parameters, dtype) are read.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace qlora {

/// RoPE frequency scaling. `type` "default" | "linear" | "llama3".
struct RopeConfig {
  std::string type = "default";
  double theta = 10000.0;
  double factor = 1.0;                    // linear, llama3
  double low_freq_factor = 1.0;           // llama3
  double high_freq_factor = 4.0;          // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3
};

/// Everything the decoder needs to know about its shape. Names are config.json's.
struct ModelConfig {
  std::string architecture = "LlamaForCausalLM";  ///< HF class name
  std::string model_type = "llama";               ///< llama | mistral | qwen2 | qwen3
  int64_t vocab_size = 32000;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 32;
  int64_t head_dim = 128;
  double rms_norm_eps = 1e-5;
  RopeConfig rope;
  int64_t max_position_embeddings = 4096;
  bool attention_bias = false;  ///< bias on q/k/v/o (Llama `attention_bias`)
  bool qkv_bias = false;        ///< bias on q/k/v only (Qwen2)
  bool qk_norm = false;         ///< RMSNorm over head_dim on each q and k head before RoPE (Qwen3)
  bool mlp_bias = false;
  bool tie_word_embeddings = false;
  int64_t sliding_window = 0;   ///< 0 = none (Mistral's window, when set)
  /// transformers drops attention probabilities with it in train mode; qlora-cpp does not (the
  /// trainer warns when it is > 0; eval and generate are unaffected: transformers skips it there).
  double attention_dropout = 0.0;
  std::string torch_dtype = "float32";  ///< dtype the weights were saved in
  int64_t bos_token_id = 1, eos_token_id = 2, pad_token_id = -1;  ///< -1 = unset

  /// Parameters of the whole model (embeddings, all layers, final norm, untied lm_head; a tied
  /// lm_head is the embedding matrix and counts once).
  int64_t num_parameters() const;
  /// config.json object that transformers loads as this architecture (used by init-model and merge).
  nlohmann::json to_hf_json() const;
  /// Checks internal consistency (positive sizes, heads divide, ...). Throws qlora::Error naming
  /// `source` and the field.
  void validate(const std::string& source) const;
};

/// Parses an HF config.json object. `source` names the file in errors. Throws qlora::Error naming
/// the file and field for a missing required field, a wrong type, an unsupported architecture,
/// rope type, activation, or an unsupported feature (e.g. Qwen2/Qwen3 use_sliding_window: true or a
/// "sliding_attention" entry in layer_types). head_dim defaults to hidden_size / num_attention_heads,
/// except for Qwen3, whose config class defaults it to 128.
ModelConfig parse_model_config(const nlohmann::json& j, const std::string& source);

/// Reads MODEL_DIR/config.json. Throws qlora::Error for a missing directory or file, invalid JSON,
/// or any parse_model_config error. A directory without config.json that holds adapter_config.json
/// (a LoRA adapter / `qlora train` output_dir) or run.json (a run's output_dir) is named as such in
/// the error, with what to pass instead (the base model dir and --adapter, or qlora merge).
ModelConfig load_model_config(const std::string& model_dir);

/// Throws qlora::Error "model.tokenizer: the tokenizer has N pieces but the model's vocab_size is M"
/// when `tokenizer_pieces` (Tokenizer::vocab_size, added tokens included) exceeds the model's
/// vocab_size: an id past the embedding would index out of range (train, eval, generate).
void check_tokenizer_fits(const ModelConfig& cfg, int64_t tokenizer_pieces);

/// "" unless `seq_len` (tokens) exceeds the model's max_position_embeddings (when set, > 0); then
/// one line for a warning: "sequence length L exceeds the model's max_position_embeddings P
/// (config.json): positions past it were never trained (RoPE extrapolation)". estimate, train (its
/// estimate) and data preview say it. Never throws.
std::string positions_note(int64_t seq_len, const ModelConfig& cfg);

/// Adds the pre-transformers-5 RoPE keys a config.json with `rope_parameters` lacks: a top-level
/// `rope_theta` and, for a rope_type other than "default", `rope_scaling` (rope_parameters without
/// rope_theta), as transformers 4.x wrote them (Llama 3.1's config.json). transformers 5 reads
/// rope_parameters first, so nothing changes for it; converters that read only the old keys
/// (llama.cpp's convert_hf_to_gguf.py before rope_parameters, Ollama's convert_llama.go) would
/// otherwise take their default base 10000 silently. Keys already present are kept. Throws nothing.
void add_legacy_rope_keys(nlohmann::json* config);

/// Named shapes for init-model / estimate / bench: tiny, small, llama2-7b, llama2-13b, mistral-7b,
/// llama3-8b, qwen2.5-7b, qwen3-8b, codellama-34b, llama2-70b (the released models' config.json
/// numbers; tests/fixtures/make_preset_refs.py checks them against transformers + PEFT). Throws qlora::Error listing the names for an unknown one.
ModelConfig preset_config(const std::string& name);
/// Names accepted by preset_config.
std::vector<std::string> preset_names();

/// The identity of the files a model load reads, for resuming a run whose model moved (a new VM,
/// another mount point): "model.path/<name>" -> sampled_file_digest (common/files.h) for each of
/// MODEL_DIR's config.json, generation_config.json, tokenizer.json, tokenizer.model,
/// tokenizer_config.json, special_tokens_map.json, *.safetensors and *.safetensors.index.json that
/// exists, and "model.tokenizer/<name>" for `tokenizer` (a file: itself; a directory: its tokenizer
/// files), and "lora.model_dir/<name>" for the adapter_config.json and adapter_model.safetensors of
/// `adapter_dir` (lora.model_dir, the adapter a run starts from). "" or a directory that is not
/// there skips it. About 2 MiB read per file, so it costs milliseconds even for a 70B model.
/// Throws qlora::Error naming a file that exists but cannot be read.
std::map<std::string, std::string> model_file_digests(const std::string& model_dir, const std::string& tokenizer,
                                                      const std::string& adapter_dir = "");

}  // namespace qlora
