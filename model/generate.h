// qlora-cpp: autoregressive generation with a KV cache (greedy or temperature / top-p sampling).
#pragma once
#include <cstdint>
#include <vector>

#include "model/model.h"

namespace qlora {

struct GenerateOptions {
  int64_t max_new_tokens = 64;
  double temperature = 0.0;  ///< 0 = greedy (argmax, ties to the lowest id as torch.argmax)
  double top_p = 1.0;        ///< nucleus sampling mass in (0, 1]
  uint64_t seed = 0;         ///< sampling seed (CPU generator)
  /// Stop after emitting any of these ids (empty: never). Callers pass Tokenizer::eos_ids():
  /// generation_config.json's whole `eos_token_id` list, as transformers' generate() stops at
  /// any of them (Llama 3 Instruct: <|end_of_text|>, <|eom_id|>, <|eot_id|>).
  std::vector<int64_t> eos_token_ids;
};

/// Throws qlora::Error naming the flag for max_new_tokens < 1, a negative temperature, or top_p
/// outside (0, 1] (`qlora generate` calls it before loading the model).
void check_generate_options(const GenerateOptions& opts);

/// Generates up to max_new_tokens after `prompt` (token ids, BOS included by the caller) and
/// returns only the new ids (the EOS id included when one ended generation). Matches transformers'
/// `generate(do_sample=False)` for temperature 0. Throws qlora::Error for an empty prompt or
/// options check_generate_options refuses.
std::vector<int64_t> generate_tokens(const LlamaModel& model, const std::vector<int64_t>& prompt,
                                     const GenerateOptions& opts);

}  // namespace qlora
