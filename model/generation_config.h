// model/generation_config.h — how `qlora generate` decodes, torch-free: the decoding options
// (GenerateOptions), a model directory's generation_config.json read into typed optionals
// (GenerationConfig), and the one rule that resolves flags, that file and transformers' defaults
// into the options, as transformers' `model.generate(input_ids, **kwargs)` does (5.23,
// generation/utils.py GenerationMixin._prepare_generation_config and _prepare_generated_length;
// generation/configuration_utils.py GenerationConfig._get_default_generation_params). Torch-free so
// the reader runs under the fuzzer (tests/fuzz/fuzz_dataset.cpp).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace qlora {

struct GenerateOptions {
  int64_t max_new_tokens = 64;
  /// false: greedy (argmax, ties to the lowest id as torch.argmax; temperature, top_k and top_p
  /// unused, as transformers' do_sample=False); true: sample with the warpers below.
  bool do_sample = false;
  double temperature = 1.0;  ///< sampling only: > 0; 1 = off (transformers' default)
  /// Sampling only: keep the top_k highest scores (ties with the k-th included), 0 = off. This
  /// struct's default is off; resolve_generate_options() gives transformers' default 50.
  int64_t top_k = 0;
  double top_p = 1.0;               ///< sampling only: nucleus mass in (0, 1], 1 = off
  double repetition_penalty = 1.0;  ///< > 0; 1 = off. Greedy and sampling; over the prompt and the new ids
  uint64_t seed = 0;                ///< sampling seed: the CPU generator torch.manual_seed(seed) seeds
  /// Stop after emitting any of these ids (empty: never). Callers pass Tokenizer::eos_ids():
  /// generation_config.json's whole `eos_token_id` list, as transformers' generate() stops at
  /// any of them (Llama 3 Instruct: <|end_of_text|>, <|eom_id|>, <|eot_id|>).
  std::vector<int64_t> eos_token_ids;
  /// Stop once one of these appears in the text and overlaps the last new token (transformers'
  /// `stop_strings`, StopStringCriteria: the text includes the prompt's tail, so a string begun
  /// in the prompt and completed by a new token stops too); the ids that complete one are kept.
  /// Needs a decoder (generate()).
  std::vector<std::string> stop_strings;
};

/// Throws qlora::Error naming the flag for max_new_tokens < 1, temperature <= 0 (or NaN) when
/// sampling, top_k < 0, top_p outside (0, 1], repetition_penalty <= 0 (or NaN), or an empty stop
/// string (`qlora generate` calls it before loading the model).
void check_generate_options(const GenerateOptions& opts);

/// The decoding keys of a generation_config.json (transformers' GenerationConfig fields of the
/// same names); nullopt: the key is absent or null (transformers: None, then the default).
/// Also used for the CLI's flags (nullopt: not given), so both go through one resolution.
struct GenerationConfig {
  std::optional<bool> do_sample;
  std::optional<double> temperature;         ///< >= 0 (0 only matters, as an error, when sampling)
  std::optional<int64_t> top_k;              ///< >= 0 (0 = off)
  std::optional<double> top_p;               ///< in (0, 1]
  std::optional<double> repetition_penalty;  ///< > 0
  std::optional<int64_t> max_new_tokens;     ///< >= 1: new tokens
  std::optional<int64_t> max_length;         ///< >= 1: prompt + new tokens (transformers' count)
};

/// Parses the text of a generation_config.json (`path` names it in errors). Throws qlora::Error
/// `PATH: KEY: must be ..., got VALUE` for a key of the wrong type or out of range (do_sample a
/// bool; temperature a number >= 0; top_k an integer >= 0; top_p a number in (0, 1];
/// repetition_penalty a number > 0; max_new_tokens and max_length integers >= 1), and
/// `PATH:1: not a JSON object` for text that is not one. Other keys are ignored (eos_token_id is
/// the tokenizer's: data::Tokenizer::eos_ids()).
GenerationConfig parse_generation_config(const std::string& text, const std::string& path);

/// parse_generation_config of `model_dir`/generation_config.json; all nullopt when there is no
/// such file (transformers then uses its defaults).
GenerationConfig read_generation_config(const std::string& model_dir);

/// transformers' GenerationConfig defaults (configuration_utils.py, _get_default_generation_params):
/// do_sample False, temperature 1.0, top_k 50, top_p 1.0, repetition_penalty 1.0.
constexpr int64_t kTransformersDefaultTopK = 50;
/// Our default number of new tokens when neither a flag nor generation_config.json sets
/// max_new_tokens or max_length (transformers' default max_length 20 counts 20 new tokens).
constexpr int64_t kDefaultMaxNewTokens = 64;

/// The resolved decoding: `opts` (eos ids, stop strings and seed untouched) plus the length rule.
struct ResolvedGenerate {
  GenerateOptions opts;
  /// Set when the length comes from generation_config.json's max_length (no --max-new-tokens, no
  /// max_new_tokens in the file): each prompt gets max_length - its length new tokens
  /// (new_tokens_for()); opts.max_new_tokens is then unused.
  std::optional<int64_t> max_length;
  std::string config_path;  ///< generation_config.json (named in length errors)
  /// One line for the log: "greedy (...)" / "sampling (...)", each value with its source.
  std::string summary;
  /// max_new_tokens for a prompt of `prompt_len` ids. Throws qlora::Error naming the file and
  /// max_length when the prompt leaves no room (transformers raises "Input length of input_ids is
  /// N, but `max_length` is set to M").
  int64_t new_tokens_for(int64_t prompt_len) const;
};

/// The one resolution rule (transformers' `generate(input_ids, **kwargs)`, utils.py
/// _prepare_generation_config: "user-defined kwargs > self.generation_config > global default
/// values"), key by key: a flag (`flags`) wins; else generation_config.json's value (`file`, read
/// from `config_path`); else transformers' default (kTransformersDefaultTopK and the others above).
/// Sampling happens when do_sample resolves true. Our flags map onto do_sample as the CLI promised
/// before generation_config.json was read: `--temperature T` with T > 0 means do_sample true (in
/// transformers, generate(temperature=T) alone keeps the file's do_sample); `--temperature 0` means
/// greedy (do_sample false; transformers refuses temperature 0 when sampling). Callers put
/// --greedy / --do-sample in flags.do_sample; with a contradicting --temperature (--greedy and
/// T > 0, --do-sample and 0) it throws qlora::Error naming both flags. Length (_prepare_generated_length): max_new_tokens from
/// the flag, else the file's max_new_tokens, else the file's max_length counted as prompt + new
/// (ResolvedGenerate::max_length), else kDefaultMaxNewTokens. Throws qlora::Error naming the file and
/// key when sampling resolves with the file's temperature 0.
ResolvedGenerate resolve_generate_options(const GenerationConfig& flags, const GenerationConfig& file,
                                          const std::string& config_path);

}  // namespace qlora
