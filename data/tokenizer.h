// qlora-cpp tokenizer: a sentencepiece `tokenizer.model` (Llama family) with the special-token ids
// that the Hugging Face model dir declares.
//
// Parity contract (tests/data/test_tokenizer.cpp; reference ids by tests/fixtures/make_data_refs.py):
// encode() gives the ids of transformers 5.x `LlamaTokenizer(legacy=True)` built from the same
// tokenizer.model, i.e. HF's BPE, not sentencepiece's:
//   - pre-tokenisation = HF Metaspace(prepend_scheme=always, split=False): ' ' -> '▁', and a '▁'
//     is prepended unless the text already starts with one (so " Hello" -> [▁Hello], where raw
//     sentencepiece gives [▁, ▁Hello]);
//   - merges are applied by HF rank (transformers' generate_merges: ordered by the merged piece's
//     id, then by left-part length), lowest rank first, leftmost on ties; characters missing
//     from the vocab fall back to <0xXX> byte pieces. Sentencepiece merges by piece score and
//     differs from HF on whitespace runs ("\n   public": HF [▁▁, public], spm [▁, ▁public]).
//   - text is never scanned for "<s>" / "</s>": user data cannot inject control ids (HF splits
//     such strings out as special ids unless split_special_tokens=True, which the reference uses).
// tokenizer.model is read with sentencepiece (pieces, types, decode, training).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace qlora::data {

/// Token ids: int32, the vocabulary index of sentencepiece (and of the HF tokenizer).
using TokenIds = std::vector<int32_t>;

class Tokenizer {
 public:
  /// Loads `<model_dir>/tokenizer.model` and the special tokens declared in the dir's
  /// tokenizer_config.json, special_tokens_map.json and generation_config.json (first that
  /// names a token wins, in that order; then the ids stored in tokenizer.model).
  /// A path to a `.model` file is also accepted (then only the sibling JSON files are read).
  /// Throws qlora::Error naming the path when a file is missing or unreadable.
  static Tokenizer from_pretrained(const std::string& model_dir_or_file);

  /// Loads a sentencepiece model file; special ids come from the model itself (pad may be -1).
  /// Throws qlora::Error naming the path when the file is missing or not a sentencepiece model.
  explicit Tokenizer(const std::string& tokenizer_model_path);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  /// Tokenizes `text` (UTF-8) as HF does one chunk of text (see the parity contract above):
  /// "▁" prepended unless present. Empty text gives no tokens (plus BOS/EOS if asked).
  TokenIds encode(const std::string& text, bool add_bos = false, bool add_eos = false) const;

  /// Like encode(text) without BOS/EOS, also returning for every token the byte offset in `text`
  /// of its first byte (the prepended "▁" has offset 0). `prefix`=false skips the "▁" prefix
  /// (text continuing a chunk). Used by the template renderer to label tokens by segment.
  TokenIds encode_with_offsets(const std::string& text, std::vector<int64_t>* offsets,
                               bool prefix = true) const;

  /// Ids -> UTF-8 text (special ids are dropped, byte-fallback pieces are re-assembled).
  std::string decode(const TokenIds& ids) const;

  /// The vocabulary string of one id ("▁Hello", "<0x0A>", "<s>"); "" for an id outside the vocab.
  std::string id_to_piece(int32_t id) const;

  /// Id of a vocabulary piece, or -1 when the piece is not in the vocabulary.
  int32_t piece_to_id(const std::string& piece) const;

  /// Number of ids (sentencepiece pieces, extended to cover any declared special id above them).
  int32_t vocab_size() const { return vocab_size_; }
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  /// -1 when the model has no pad token (Llama 2); batches then pad with eos_id (see batch.h).
  int32_t pad_id() const { return pad_id_; }
  int32_t unk_id() const { return unk_id_; }
  /// True when `id` is BOS, EOS, PAD, UNK or another control piece.
  bool is_special(int32_t id) const;
  /// The file the tokenizer was loaded from.
  const std::string& path() const { return path_; }

  /// Trains a small Llama-style tokenizer (BPE, byte_fallback, split_digits, no extra-whitespace
  /// removal, unk=0 bos=1 eos=2, no pad) on UTF-8 text files, one sentence per line, and writes
  /// `<out_prefix>.model` and `<out_prefix>.vocab`. Returns the .model path.
  /// Throws qlora::Error when sentencepiece's trainer fails (message from sentencepiece).
  static std::string train(const std::vector<std::string>& corpus_paths, int vocab_size,
                           const std::string& out_prefix);
  /// Same, from in-memory sentences.
  static std::string train_from_texts(const std::vector<std::string>& texts, int vocab_size,
                                      const std::string& out_prefix);

 private:
  Tokenizer() = default;
  void load(const std::string& tokenizer_model_path);

  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;  // vocab, piece types, decode
  std::unordered_map<std::string, int32_t> piece_ids_;           // single-character pieces and all others
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // (left<<32|right) -> (rank, merged id)
  int32_t byte_ids_[256];                                        // <0xXX> piece per byte, -1 if absent
  int32_t space_id_ = -1;                                        // "▁"
  std::string path_;
  int32_t vocab_size_ = 0, bos_id_ = -1, eos_id_ = -1, pad_id_ = -1, unk_id_ = -1;
};

}  // namespace qlora::data
