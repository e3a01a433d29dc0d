// Internal interface behind qlora::data::Tokenizer (data/tokenizer.h): one implementation per
// tokenizer file format. Not part of the public API; only data/tokenizer*.cpp include it.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "data/llama_tokenizer.h"
#include "data/tokenizer.h"

namespace qlora::data::detail {

/// Special tokens a tokenizer file itself declares (-1 = none); the facade overrides them from
/// tokenizer_config.json and friends.
struct FileSpecials {
  int32_t bos = -1, eos = -1, pad = -1, unk = -1;
  TokenIds prefix, suffix;  // post-processor ids around a single sequence
};

class TokenizerBackend {
 public:
  virtual ~TokenizerBackend() = default;
  /// Text -> ids (no post-processor specials); `offsets` (may be null) gets each token's first
  /// byte in `text`. `prefix` as Tokenizer::encode_with_offsets.
  virtual TokenIds encode(const std::string& text, std::vector<int64_t>* offsets, bool prefix) const = 0;
  /// Ids -> text. `facade` gives the sentencepiece path the declared specials (facade.is_special);
  /// the tokenizer.json path skips exactly the added tokens marked special, as `tokenizers` does.
  virtual std::string decode(const TokenIds& ids, bool skip_special_tokens,
                             const class Tokenizer& facade) const = 0;
  virtual std::string id_to_piece(int32_t id) const = 0;
  virtual int32_t piece_to_id(const std::string& piece) const = 0;
  /// 1 + largest id the file defines.
  virtual int32_t vocab_size() const = 0;
  /// True for ids the file itself marks special (spm control pieces, added tokens with special=true).
  virtual bool is_special(int32_t id) const = 0;
  virtual FileSpecials specials() const = 0;
  /// A token tokenizer_config.json's added_tokens_decoder declares (transformers' added tokens):
  /// encode() splits `content` out of text as the single id `id`, as transformers does; id_to_piece,
  /// piece_to_id and decode know it; `special` as its "special" flag (decode's skip_special_tokens).
  /// The sentencepiece path only: a tokenizer.json lists its added tokens itself.
  virtual void add_token(const std::string& content, int32_t id, bool special) {
    (void)content, (void)id, (void)special;
  }
};

/// sentencepiece tokenizer.model (data/tokenizer_spm.cpp). `scheme`: when encode(prefix=true)
/// prepends "▁" (kNever: never; otherwise whenever `prefix`, the caller deciding what a chunk
/// follows). Throws qlora::Error naming `path`.
std::unique_ptr<TokenizerBackend> load_spm(const std::string& path, PrependScheme scheme = PrependScheme::kAlways);
/// HF tokenizer.json (data/tokenizer_json.cpp). `class_pipeline` set ({"normalizer",
/// "pre_tokenizer", "decoder"} as tokenizer.json values, null = none): the file's three are
/// replaced by them, as transformers 5 classes that rebuild their own pipeline do (LlamaTokenizer:
/// llama_pipeline(); Qwen2Tokenizer). The file's own ones are still parsed (a malformed one is an
/// error either way). Throws qlora::Error naming `path` and the JSON path.
std::unique_ptr<TokenizerBackend> load_hf_json(const std::string& path, const nlohmann::json* class_pipeline = nullptr);

}  // namespace qlora::data::detail
