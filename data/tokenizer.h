// qlora-cpp tokenizer: one type, `Tokenizer`, over two implementations chosen by the files of a
// Hugging Face model dir (as transformers' fast tokenizer chooses):
//   1. `tokenizer.json` (the HF `tokenizers` format: byte-level BPE of Llama 3 / Qwen2 / SmolLM2,
//      Metaspace + byte_fallback BPE of Llama 2 / Mistral converted by transformers), used whenever
//      the dir has one; parity contract: ids equal to the Rust `tokenizers` library
//      (`Tokenizer.from_file(...).encode(text, add_special_tokens)` / `.decode(ids,
//      skip_special_tokens)`), see data/tokenizer_json.h and docs/data.md;
//   2. sentencepiece `tokenizer.model` (Llama 2 family), when there is no tokenizer.json.
// A dir whose tokenizer_config.json (or config.json) names `LlamaTokenizer` / `LlamaTokenizerFast`
// (Llama 2, TinyLlama, CodeLlama dirs) is read as transformers 5 `AutoTokenizer.from_pretrained`
// reads it, which is not what its tokenizer.json alone says: that class replaces the file's
// normalizer, pre-tokenizer and decoder by its own, with the Metaspace prepend scheme from the
// config's `legacy` (default false: "first", no "▁" after a special token) and `add_prefix_space`
// (false: "never"); except under a Mistral-family config.json `model_type` and for a byte-level
// tokenizer.json, which transformers reads as written; see from_pretrained(). Loading the file
// itself (the constructor) keeps the `tokenizers` contract. Reference ids:
// tests/fixtures/make_tokenizer_refs.py (`auto_*` keys).
//
// Parity contract of the sentencepiece path (tests/data/test_tokenizer.cpp; reference ids by
// tests/fixtures/make_data_refs.py): encode() gives the ids of transformers 5.x
// `LlamaTokenizer(legacy=True)` built from the same tokenizer.model, i.e. HF's BPE, not sentencepiece's
// (under a LlamaTokenizer config, its `legacy` / `add_prefix_space` as above):
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
#include <optional>
#include <string>
#include <vector>

namespace qlora::data {

/// Token ids: int32, the vocabulary index (sentencepiece piece id / HF token id).
using TokenIds = std::vector<int32_t>;

enum class PrependScheme;  // data/llama_tokenizer.h
namespace detail {
class TokenizerBackend;  // data/tokenizer_backend.h (internal)
}

class Tokenizer {
 public:
  /// Loads a tokenizer from a Hugging Face model dir:
  ///   - `<dir>/tokenizer.json` when it exists (transformers' fast-tokenizer precedence), else
  ///     `<dir>/tokenizer.model` (sentencepiece);
  ///   - special tokens (`bos_token`, `eos_token`, `pad_token`, `unk_token`) from the dir's
  ///     tokenizer_config.json, special_tokens_map.json, then generation_config.json ids (first
  ///     that names a token wins, in that order), then the tokenizer file's own;
  ///   - `add_bos_token` / `add_eos_token` of tokenizer_config.json for the sentencepiece path
  ///     (defaults true / false; false / false when the config names LlamaTokenizer, as transformers
  ///     5 converts tokenizer.model); for tokenizer.json the post-processor decides (what
  ///     `tokenizers` and transformers 5 do), see add_bos_default();
  ///   - `tokenizer_class` LlamaTokenizer / LlamaTokenizerFast (tokenizer_config.json, else
  ///     config.json), as transformers 5.23 AutoTokenizer picks the class
  ///     (models/auto/tokenization_auto.py):
  ///       * config.json `model_type` mistral / mixtral (the Mistral family): tokenizer.json as
  ///         written; tokenizer.model with no "▁" prepended and no BOS unless `add_bos_token`;
  ///       * a tokenizer.json whose text contains "ByteLevel" (Llama 3-style): as written;
  ///       * otherwise LlamaTokenizer's pipeline (no normalizer; Metaspace("▁", scheme,
  ///         split=False); decoder Replace("▁"," ") + ByteFallback + Fuse + Strip(" ",1,0) unless
  ///         add_prefix_space is false) with scheme = never if `add_prefix_space` (default true)
  ///         is false, else always if `legacy` (default false), else first;
  ///     a non-boolean `legacy` / `add_prefix_space` or non-string `tokenizer_class` /
  ///     `model_type` is an error naming the file and the key;
  ///   - eos_ids(): generation_config.json `eos_token_id` (int or list) plus eos_id().
  /// A path to a `tokenizer.model` / `tokenizer.json` file is also accepted (then only the sibling
  /// JSON files are read). Throws qlora::Error naming the file (and JSON path) when a file is
  /// missing, unreadable, malformed or uses an unsupported tokenizers component.
  static Tokenizer from_pretrained(const std::string& model_dir_or_file);

  /// Loads one tokenizer file: a sentencepiece `.model`, or an HF `tokenizer.json` (by a `.json`
  /// extension). Special ids come from the file itself (pad may be -1). Throws qlora::Error
  /// naming the path when the file is missing or invalid.
  explicit Tokenizer(const std::string& tokenizer_file_path);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  /// Tokenizes `text` (UTF-8 bytes) as one chunk, without the post-processor's special tokens,
  /// then adds bos_id() in front if `add_bos` and eos_id() at the end if `add_eos` (ids < 0 are
  /// never added).
  ///   - tokenizer.json: = `tokenizers` encode(text, add_special_tokens=False).ids: added tokens
  ///     (special or not) typed in the text are split out first and give their ids; invalid UTF-8
  ///     is first replaced by U+FFFD per maximal invalid subpart (Rust from_utf8_lossy = Python
  ///     bytes.decode('utf-8', 'replace')).
  ///   - sentencepiece: see the parity contract above ("▁" prepended unless present; text never
  ///     produces control ids). Empty text gives no tokens (plus BOS/EOS if asked).
  TokenIds encode(const std::string& text, bool add_bos = false, bool add_eos = false) const;

  /// = `tokenizers` encode(text, add_special_tokens=True).ids: special_prefix() + encode(text) +
  /// special_suffix(). For the sentencepiece path the prefix/suffix are [bos]/[eos] as
  /// tokenizer_config.json's add_bos_token (default true) / add_eos_token (default false) say.
  TokenIds encode_with_special_tokens(const std::string& text) const;

  /// Ids the post-processor (TemplateProcessing `single`, before / after the sequence) adds
  /// around a single sequence; empty when none. Sentencepiece path: from add_bos_token/add_eos_token.
  const TokenIds& special_prefix() const { return prefix_; }
  const TokenIds& special_suffix() const { return suffix_; }
  /// True when encode_with_special_tokens() starts with bos_id() (Llama 2, Llama 3) / ends with
  /// eos_id(). SmolLM2 and Qwen2 add nothing: both false.
  bool add_bos_default() const { return !prefix_.empty() && prefix_.front() == bos_id_ && bos_id_ >= 0; }
  bool add_eos_default() const { return !suffix_.empty() && suffix_.back() == eos_id_ && eos_id_ >= 0; }

  /// Like encode(text) without BOS/EOS, also returning for every token the byte offset in `text`
  /// of its first byte (a prepended "▁" / prefix space takes the offset of the text it precedes; a
  /// token made from a text change (NFC composition, Replace) takes the offset of the changed
  /// span's first byte; invalid UTF-8 replaced by U+FFFD: the first invalid byte). `prefix`=false
  /// marks text continuing a chunk: no "▁" / prefix space is prepended (sentencepiece "▁";
  /// tokenizer.json: Prepend normalizer, Metaspace prepend, ByteLevel add_prefix_space).
  /// tokenizer.json: added tokens are split out of `text` first, as HF does (lstrip / rstrip /
  /// single_word / normalized honoured); each gives its id at the offset where its match begins.
  /// Used by the template renderer to label tokens by segment.
  TokenIds encode_with_offsets(const std::string& text, std::vector<int64_t>* offsets,
                               bool prefix = true) const;

  /// Ids -> UTF-8 text. tokenizer.json: = `tokenizers` decode(ids, skip_special_tokens) (ids
  /// outside the vocab are dropped, as there). Sentencepiece: byte-fallback pieces re-assembled;
  /// with skip_special_tokens special ids are dropped, else they are written as their pieces.
  std::string decode(const TokenIds& ids, bool skip_special_tokens = true) const;

  /// The vocabulary string of one id ("▁Hello", "Ġworld", "<0x0A>", "<|im_end|>"); "" for an id
  /// outside the vocab. Added tokens included.
  std::string id_to_piece(int32_t id) const;

  /// Id of a vocabulary piece (added tokens included), or -1 when the piece is not in the vocabulary.
  int32_t piece_to_id(const std::string& piece) const;

  /// Sentencepiece path: whether a text chunk that follows a special id (a template's BOS / EOS)
  /// gets the "▁" prefix again, as HF's Metaspace prepend_scheme "always" (legacy=True) does;
  /// false for "first" and "never". The tokenizer.json path tokenises a rendered example in one
  /// pass and its pre-tokenizer decides; there it only says which scheme the Llama class chose.
  bool prefix_after_special() const { return prefix_after_special_; }

  /// Number of ids: 1 + the largest id of the vocabulary, added tokens and declared special ids.
  int32_t vocab_size() const { return vocab_size_; }
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  /// Every id that ends generation: generation_config.json `eos_token_id` (int or list, in file
  /// order), with eos_id() first if it is >= 0 and not listed. E.g. Llama 3 Instruct
  /// [128001, 128008, 128009].
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  /// -1 when the model has no pad token (Llama 2); batches then pad with eos_id (see batch.h).
  int32_t pad_id() const { return pad_id_; }
  /// The id batches are padded with (batch.h): pad_id(), else eos_id() (-1 when neither exists).
  int32_t batch_pad_id() const { return pad_id_ >= 0 ? pad_id_ : eos_id_; }
  int32_t unk_id() const { return unk_id_; }
  /// True when `id` is BOS, EOS, PAD, UNK, a sentencepiece control piece or an added token
  /// marked `"special": true` in tokenizer.json.
  bool is_special(int32_t id) const;
  /// The file the tokenizer was loaded from (tokenizer.json or tokenizer.model).
  const std::string& path() const { return path_; }
  /// True when loaded from an HF tokenizer.json (false: sentencepiece tokenizer.model).
  bool is_hf_json() const { return is_json_; }
  /// One line naming what was loaded, for logs (train, eval, data preview): "PATH (tokenizer.json
  /// | sentencepiece), N ids, bos '<s>' 1, eos '</s>' 2, pad none" (a special token without an id:
  /// "none"). A directory holding both files uses tokenizer.json (transformers' fast tokenizer).
  std::string describe() const;

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
  Tokenizer();
  /// `llama_scheme`: a LlamaTokenizer dir's pipeline; `qwen2`: a Qwen2Tokenizer dir's (tokenizer.json
  /// only); neither: the file's own.
  void load_file(const std::string& path, std::optional<PrependScheme> llama_scheme, bool qwen2 = false);
  void finish_specials();

  std::unique_ptr<detail::TokenizerBackend> impl_;
  std::string path_;
  bool is_json_ = false, prefix_after_special_ = true;
  int32_t vocab_size_ = 0, bos_id_ = -1, eos_id_ = -1, pad_id_ = -1, unk_id_ = -1;
  std::vector<int32_t> eos_ids_;
  TokenIds prefix_, suffix_;
};

}  // namespace qlora::data
