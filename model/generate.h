// qlora-cpp: autoregressive generation with a KV cache: greedy or sampled, with transformers'
// logits processors (repetition penalty; temperature, top-k, top-p warpers) and stopping criteria
// (EOS ids, stop strings, max_new_tokens), as transformers' GenerationMixin.generate() (5.23,
// generation/utils.py _get_logits_processor, _sample) runs them.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "model/model.h"

namespace qlora {

struct GenerateOptions {
  int64_t max_new_tokens = 64;
  double temperature = 0.0;  ///< 0 = greedy (argmax, ties to the lowest id as torch.argmax); > 0 samples
  /// Sampling only: keep the top_k highest scores (ties with the k-th included), 0 = off. This
  /// struct's default is off; `qlora generate` defaults to generation_config.json's top_k, else
  /// transformers' GenerationConfig default 50 (kTransformersDefaultTopK).
  int64_t top_k = 0;
  double top_p = 1.0;               ///< sampling only: nucleus mass in (0, 1], 1 = off
  double repetition_penalty = 1.0;  ///< > 0; 1 = off. Greedy and sampling; over the prompt and the new ids
  uint64_t seed = 0;                ///< sampling seed: the CPU generator torch.manual_seed(seed) seeds
  /// Stop after emitting any of these ids (empty: never). Callers pass Tokenizer::eos_ids():
  /// generation_config.json's whole `eos_token_id` list, as transformers' generate() stops at
  /// any of them (Llama 3 Instruct: <|end_of_text|>, <|eom_id|>, <|eot_id|>).
  std::vector<int64_t> eos_token_ids;
  /// Stop once the decoded new text contains any of these (transformers' `stop_strings`,
  /// StopStringCriteria); the ids that complete one are kept. Needs a decoder (generate()).
  std::vector<std::string> stop_strings;
};

/// Throws qlora::Error naming the flag for max_new_tokens < 1, a negative temperature, top_k < 0,
/// top_p outside (0, 1], repetition_penalty <= 0 (or NaN), or an empty stop string (`qlora
/// generate` calls it before loading the model).
void check_generate_options(const GenerateOptions& opts);

/// Why generation ended: an EOS id was emitted (it is the last id), a stop string appeared in the
/// decoded new text, or max_new_tokens ids were emitted (an EOS or stop on the last one wins).
enum class FinishReason { eos, stop, length };
/// "eos" | "stop" | "length" (the `finish_reason` of `qlora generate --prompts`).
const char* finish_reason_name(FinishReason r);

struct Generation {
  std::vector<int64_t> ids;  ///< the new ids only (the EOS id included when one ended generation)
  FinishReason finish_reason = FinishReason::length;
};

/// Turns new ids (never an EOS id) into text, for stop strings: the tokenizer's decode.
using DecodeFn = std::function<std::string(const std::vector<int64_t>& ids)>;

/// Generates up to max_new_tokens after `prompt` (token ids, BOS included by the caller). Each step
/// takes the last position's logits as fp32 [1, vocab] and runs, in transformers' order:
/// repetition penalty (apply_repetition_penalty) over prompt + new ids; then greedy argmax
/// (temperature 0), or sample_warpers (temperature, top-k, top-p) -> softmax -> at::multinomial on
/// a CPU generator seeded with `seed`. With the same logits this is the draw transformers'
/// `torch.manual_seed(seed); generate(do_sample=True, ...)` makes (the same libtorch ops in the
/// same order; model/generate.cpp). After each id: EOS ids, then stop strings (the whole new text
/// decoded by `decode`), then the length. Matches `generate(do_sample=False)` token for token for
/// temperature 0 (Generate.* tests). Throws qlora::Error for an empty prompt, options
/// check_generate_options refuses, or stop strings without a decoder.
Generation generate(const LlamaModel& model, const std::vector<int64_t>& prompt, const GenerateOptions& opts,
                    const DecodeFn& decode = nullptr);

/// generate(model, prompt, opts).ids (no stop strings: they need a decoder).
std::vector<int64_t> generate_tokens(const LlamaModel& model, const std::vector<int64_t>& prompt,
                                     const GenerateOptions& opts);

/// transformers' RepetitionPenaltyLogitsProcessor (generation/logits_process.py): for each distinct
/// id in `seen` (clamped to the vocab; ids past it are not penalised), a score < 0 becomes
/// score * penalty, else score / penalty, once per id. scores: [1, vocab] float; returns a new
/// tensor. penalty 1 returns `scores` unchanged.
torch::Tensor apply_repetition_penalty(const torch::Tensor& scores, const std::vector<int64_t>& seen, double penalty);

/// transformers' sampling warpers in its order (logits_process.py): TemperatureLogitsWarper
/// (scores / temperature, unless 1), TopKLogitsWarper (scores below the k-th highest -> -inf; ties
/// with it stay; k = min(top_k, vocab); 0 = off), TopPLogitsWarper (sorted ascending, the tokens
/// whose cumulative softmax mass is <= 1 - top_p -> -inf, the highest always kept; 1 = off).
/// scores: [1, vocab] float; temperature > 0. Returns the masked scores (softmax gives the probabilities).
torch::Tensor sample_warpers(torch::Tensor scores, double temperature, int64_t top_k, double top_p);

/// `top_k` of `model_dir`/generation_config.json (nullopt: no file, no key, or null). Throws
/// qlora::Error naming the file and key for a value that is not an integer >= 0, or a file that is
/// not a JSON object.
std::optional<int64_t> generation_config_top_k(const std::string& model_dir);

/// transformers' GenerationConfig default top_k (configuration_utils.py,
/// _get_default_generation_params), used when sampling and generation_config.json sets none.
constexpr int64_t kTransformersDefaultTopK = 50;

}  // namespace qlora
