// What transformers 5 builds for its sentencepiece-style `LlamaTokenizer` (Llama 2, Mistral,
// TinyLlama, CodeLlama), shared by the tokenizer (data/tokenizer*.cpp: tokenizer.model, a Llama
// dir's tokenizer.json) and the GGUF importer (model/import_gguf.cpp: a "llama" vocabulary).
// Torch-free. References: transformers 5.23 models/llama/tokenization_llama.py (the pipeline),
// tokenization_utils_base.py (_get_prepend_scheme, generate_merges).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace qlora::data {

/// When a Metaspace pre-tokenizer prepends its "▁" (tokenizers' `PrependScheme`): to every text
/// split (`always`), only to the split at offset 0 of the input (`first`), or never.
/// LlamaTokenizer's: never if add_prefix_space is false, else always if legacy, else first.
enum class PrependScheme { kAlways, kFirst, kNever };

/// LlamaTokenizer's own components as tokenizer.json values, whatever a file says:
/// {"normalizer": null, "pre_tokenizer": Metaspace("▁", scheme, split=false), "decoder":
/// Replace("▁", " ") + ByteFallback + Fuse (+ Strip(" ", 1, 0) unless scheme is kNever, i.e.
/// add_prefix_space)}.
nlohmann::json llama_pipeline(PrependScheme scheme);

/// One BPE merge: `left` + `right` -> `merged`, indices into the piece list it was made from.
struct MergeRule {
  int32_t left, right, merged;
};

/// transformers' generate_merges(vocab, vocab_scores): every split (l, r), at code-point
/// boundaries, of every usable piece whose two halves are usable pieces, in rank order (first =
/// applied first). Without `scores`: by the merged piece's index, then the halves' lengths in code
/// points, ascending. With `scores` (one per piece): by the merged piece's score, then the halves'
/// lengths, descending; equal keys keep the pieces' order (Python's stable sort). A piece listed
/// twice counts at its first place with its last index and score (Python dicts). `usable` (may be
/// null = all; else one per piece): false keeps a piece out entirely (sentencepiece control,
/// unknown, unused and byte pieces). Quadratic in a piece's length: callers bound it.
std::vector<MergeRule> generate_merges(const std::vector<std::string>& pieces, const std::vector<double>* scores,
                                       const std::vector<bool>* usable);

}  // namespace qlora::data
