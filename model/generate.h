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

#include "model/generation_config.h"
#include "model/model.h"

namespace qlora {

/// Why generation ended: an EOS id was emitted (it is the last id), a stop string was completed (see
/// generate()), or max_new_tokens ids were emitted (an EOS or stop on the last one wins).
enum class FinishReason { eos, stop, length };
/// "eos" | "stop" | "length" (the `finish_reason` of `qlora generate --prompts`).
const char* finish_reason_name(FinishReason r);

struct Generation {
  std::vector<int64_t> ids;  ///< the new ids only (the EOS id included when one ended generation)
  FinishReason finish_reason = FinishReason::length;
};

/// Turns ids into text, for stop strings: the tokenizer's decode. generate() passes the sequence's
/// tail (the prompt's last ids, then the new ids; never an EOS id it emitted itself).
using DecodeFn = std::function<std::string(const std::vector<int64_t>& ids)>;

/// Generates up to max_new_tokens after `prompt` (token ids, BOS included by the caller). Each step
/// takes the last position's logits as fp32 [1, vocab] and runs, in transformers' order:
/// repetition penalty (apply_repetition_penalty) over prompt + new ids; then greedy argmax
/// (do_sample false), or sample_warpers (temperature, top-k, top-p) -> softmax -> at::multinomial
/// on a CPU generator seeded with `seed`. With the same logits this is the draw transformers'
/// `torch.manual_seed(seed); generate(do_sample=True, ...)` makes (the same libtorch ops in the
/// same order; model/generate.cpp). After each id: EOS ids, then stop strings, then the length.
/// Stop strings follow transformers' StopStringCriteria (generation/stopping_criteria.py): it
/// matches over the whole sequence, prompt included, and fires when a stop string ends in the
/// text of the id just emitted; here `decode` of the sequence's last ids (the longest stop string's
/// bytes + 8 of them) must contain a stop string that ends past the text of the same ids without
/// the new one. So a string that begins in the prompt and ends in a new id stops generation; one
/// wholly inside the prompt does not. Matches `generate(do_sample=False)` token for token for
/// greedy decoding (Generate.* tests). Throws qlora::Error for an empty prompt, options
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

}  // namespace qlora
