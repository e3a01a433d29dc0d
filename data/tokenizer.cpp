// qlora-cpp tokenizer facade: picks the backend (tokenizer.json or tokenizer.model) and applies the
// special tokens of the HF model dir. See tokenizer.h for the contracts.
#include "data/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "common/error.h"
#include "common/json_file.h"
#include "common/gguf.h"
#include "common/files.h"
#include "data/tokenizer_backend.h"

namespace qlora::data {
namespace fs = std::filesystem;

namespace {

// A special token entry in tokenizer_config.json / special_tokens_map.json: "..." or {"content": "..."}.
std::string token_content(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  return "";
}

nlohmann::json read_json_if_exists(const fs::path& p) {
  if (!fs::exists(p)) return nlohmann::json();
  return read_json_object_file(p.string());
}

bool is_json_path(const fs::path& p) { return p.extension() == ".json"; }

// An id from generation_config.json / config JSON: an integer in int32 range, else an error.
int32_t json_id(const nlohmann::json& v, const fs::path& file, const std::string& key) {
  QLORA_CHECK(v.is_number_integer(), file.string(), ": ", key, ": expected an integer token id, got ", v.type_name());
  const int64_t x = v.get<int64_t>();
  QLORA_CHECK(x >= 0 && x < (int64_t(1) << 31), file.string(), ": ", key, ": token id ", x, " out of range");
  return static_cast<int32_t>(x);
}

// A true/false key of tokenizer_config.json; `def` when absent or null.
bool config_flag(const nlohmann::json& cfg, const fs::path& file, const char* key, bool def) {
  if (!cfg.is_object() || !cfg.contains(key) || cfg[key].is_null()) return def;
  QLORA_CHECK(cfg[key].is_boolean(), file.string(), ": ", key, ": expected true/false, got ", cfg[key].type_name());
  return cfg[key].get<bool>();
}

// A string key of a config JSON; "" when absent or null, an error naming the file and key otherwise.
std::string config_string(const nlohmann::json& cfg, const fs::path& file, const char* key) {
  if (!cfg.is_object() || !cfg.contains(key) || cfg[key].is_null()) return "";
  QLORA_CHECK(cfg[key].is_string(), file.string(), ": ", key, ": expected a string, got ", cfg[key].type_name());
  return cfg[key].get<std::string>();
}

// Model types whose tokenizer transformers 5.23 registers as TokenizersBackend (or
// MistralCommonBackend, which needs the mistral-common package and Mistral's own files): the
// Mistral family (TOKENIZER_MAPPING_NAMES, models/auto/tokenization_auto.py).
bool is_mistral_model_type(const std::string& t) {
  static const char* const kTypes[] = {"mistral",  "mixtral",  "ministral", "ministral3",
                                       "mistral3", "pixtral", "voxtral",   "mistral_large4"};
  return std::any_of(std::begin(kTypes), std::end(kTypes), [&](const char* k) { return t == k; });
}

// Qwen2Tokenizer's own components (models/qwen2/tokenization_qwen2.py, transformers 5.23): NFC,
// Split(PRETOKENIZE_REGEX, isolated) + ByteLevel(add_prefix_space=false, use_regex=false), decoder
// ByteLevel. (Its BPE model options are the file's: Qwen2Tokenizer's own are unk none, no
// byte_fallback, as every byte-level file has.)
nlohmann::json qwen2_pipeline() {
  using nlohmann::json;
  const std::string re =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  return {{"normalizer", {{"type", "NFC"}}},
          {"pre_tokenizer",
           {{"type", "Sequence"},
            {"pretokenizers",
             json::array({{{"type", "Split"}, {"pattern", {{"Regex", re}}}, {"behavior", "Isolated"}, {"invert", false}},
                          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                           {"use_regex", false}}})}}},
          {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}}};
}

// Which pipeline transformers 5.23 `AutoTokenizer.from_pretrained(dir)` builds for a dir
// (models/auto/tokenization_auto.py), from the hub class (tokenizer_config.json's
// `tokenizer_class`, else config.json's) and config.json's `model_type`:
struct HfTokenizerClass {
  /// Qwen2Tokenizer, which rebuilds the pipeline whatever tokenizer.json says (qwen2_pipeline).
  bool qwen2 = false;
  /// LlamaTokenizer's Metaspace prepend scheme (llama_pipeline; sentencepiece: the scheme), or
  /// nullopt where the file is read as `tokenizers` / sentencepiece read it.
  std::optional<PrependScheme> llama;
};

// The rules, in transformers' order:
//   - a Mistral-family model_type (is_mistral_model_type): TokenizersBackend, i.e. tokenizer.json as
//     written; tokenizer.model alone under a Llama class is converted with no "▁" prepended (kNever)
//     and a BOS only when `add_bos_token` says so (`legacy` / `add_prefix_space` are not read);
//   - Qwen2Tokenizer (tokenizer.json files only: it has no sentencepiece path): the hub class is
//     Qwen2Tokenizer[Fast]; or model_type `qwen2` (in MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS: its
//     registered Qwen2Tokenizer wins over any hub class, e.g. DeepSeek-R1-Distill-Qwen's
//     LlamaTokenizerFast); or a model_type registered as Qwen2Tokenizer (qwen2_moe, qwen3, qwen3_moe)
//     with no hub class;
//   - LlamaTokenizer / LlamaTokenizerFast as the hub class: a tokenizer.json whose text contains
//     "ByteLevel" (a Llama 3-style file, `_tokenizer_json_has_byte_level`) is TokenizersBackend (as
//     written); otherwise LlamaTokenizer (models/llama/tokenization_llama.py) with
//     _get_prepend_scheme (tokenization_utils_base.py): add_prefix_space (default true) false ->
//     never; else legacy (default false) true -> always, false -> first;
//   - anything else: the file as written.
HfTokenizerClass hf_tokenizer_class(const nlohmann::json& tok_cfg, const fs::path& tok_cfg_path,
                                    const nlohmann::json& model_cfg, const fs::path& model_cfg_path,
                                    const fs::path& tokenizer_file) {
  std::string cls = config_string(tok_cfg, tok_cfg_path, "tokenizer_class");
  if (cls.empty()) cls = config_string(model_cfg, model_cfg_path, "tokenizer_class");
  const std::string type = config_string(model_cfg, model_cfg_path, "model_type");
  const bool json_file = is_json_path(tokenizer_file), llama_class = cls == "LlamaTokenizer" || cls == "LlamaTokenizerFast";
  // type-checked whatever the branch
  const bool add_prefix_space = llama_class && config_flag(tok_cfg, tok_cfg_path, "add_prefix_space", true),
             legacy = llama_class && config_flag(tok_cfg, tok_cfg_path, "legacy", false);
  if (is_mistral_model_type(type))
    return {false, llama_class && !json_file ? std::optional<PrependScheme>(PrependScheme::kNever) : std::nullopt};
  if (json_file && (cls == "Qwen2Tokenizer" || cls == "Qwen2TokenizerFast" || type == "qwen2" ||
                    (cls.empty() && (type == "qwen2_moe" || type == "qwen3" || type == "qwen3_moe"))))
    return {true, std::nullopt};
  if (!llama_class) return {};
  if (json_file && read_file(tokenizer_file.string()).find("\"ByteLevel\"") != std::string::npos) return {};
  if (!add_prefix_space) return {false, PrependScheme::kNever};
  return {false, legacy ? PrependScheme::kAlways : PrependScheme::kFirst};
}

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::Tokenizer(const std::string& path) {
  load_file(path, std::nullopt);
  finish_specials();
}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

void Tokenizer::load_file(const std::string& path, std::optional<PrependScheme> llama, bool qwen2) {
  is_json_ = is_json_path(path);
  const PrependScheme scheme = llama.value_or(PrependScheme::kAlways);
  const nlohmann::json pipeline = qwen2 ? qwen2_pipeline() : llama ? llama_pipeline(*llama) : nlohmann::json();
  impl_ = is_json_ ? detail::load_hf_json(path, pipeline.is_null() ? nullptr : &pipeline) : detail::load_spm(path, scheme);
  prefix_after_special_ = scheme == PrependScheme::kAlways;
  path_ = path;
  vocab_size_ = impl_->vocab_size();
  const detail::FileSpecials s = impl_->specials();
  bos_id_ = s.bos;
  eos_id_ = s.eos;
  pad_id_ = s.pad;
  unk_id_ = s.unk;
  if (is_json_) {
    prefix_ = s.prefix;
    suffix_ = s.suffix;
  } else {
    prefix_.clear();
    suffix_.clear();
    if (bos_id_ >= 0) prefix_.push_back(bos_id_);  // LlamaTokenizer add_bos_token=True default
  }
}

// Extends vocab_size over declared ids and puts eos_id first in eos_ids.
void Tokenizer::finish_specials() {
  for (int32_t id : {bos_id_, eos_id_, pad_id_, unk_id_})
    if (id >= vocab_size_) vocab_size_ = id + 1;
  if (eos_id_ >= 0 && std::find(eos_ids_.begin(), eos_ids_.end(), eos_id_) == eos_ids_.end())
    eos_ids_.insert(eos_ids_.begin(), eos_id_);
  for (int32_t id : eos_ids_)
    if (id >= vocab_size_) vocab_size_ = id + 1;
}

Tokenizer Tokenizer::from_pretrained(const std::string& dir_or_file) {
  fs::path dir, file;
  if (std::error_code ec; fs::is_directory(dir_or_file, ec)) {
    dir = dir_or_file;
    file = fs::exists(dir / "tokenizer.json") ? dir / "tokenizer.json" : dir / "tokenizer.model";
    QLORA_CHECK(fs::exists(file), (dir / "tokenizer.model").string(),
                ": tokenizer model not found (neither tokenizer.json nor tokenizer.model in ", dir.string(), ")",
                gguf::gguf_instead_of_model_dir(dir_or_file));
  } else {
    check_regular_file(dir_or_file);  // a FIFO, a link loop: named before anything opens it
    const std::string gguf = gguf::gguf_instead_of_model_dir(dir_or_file);
    QLORA_CHECK(gguf.empty(), gguf);
    file = dir_or_file;
    dir = file.parent_path();
  }
  QLORA_CHECK(fs::exists(file), file.string(), ": tokenizer model not found", relative_path_note(file.string()));
  const fs::path tok_cfg_path = dir / "tokenizer_config.json", gen_cfg_path = dir / "generation_config.json",
                 model_cfg_path = dir / "config.json";
  const nlohmann::json tok_cfg = read_json_if_exists(tok_cfg_path), model_cfg = read_json_if_exists(model_cfg_path);
  const HfTokenizerClass cls = hf_tokenizer_class(tok_cfg, tok_cfg_path, model_cfg, model_cfg_path, file);
  Tokenizer t;
  t.load_file(file.string(), cls.llama, cls.qwen2);

  const nlohmann::json st_map = read_json_if_exists(dir / "special_tokens_map.json");
  const nlohmann::json gen_cfg = read_json_if_exists(gen_cfg_path);

  // Added tokens declared by id in tokenizer_config.json (e.g. "<pad>" = 32000 beyond the sp vocab).
  std::unordered_map<std::string, int32_t> added;
  if (tok_cfg.is_object() && tok_cfg.contains("added_tokens_decoder") &&
      tok_cfg["added_tokens_decoder"].is_object()) {
    for (const auto& [k, v] : tok_cfg["added_tokens_decoder"].items()) {
      const std::string c = token_content(v);
      if (c.empty()) continue;
      try {
        size_t used = 0;
        const long x = std::stol(k, &used);
        QLORA_CHECK(used == k.size() && x >= 0 && x < (1L << 31), "");
        added[c] = static_cast<int32_t>(x);
      } catch (const std::exception&) {
        fail(tok_cfg_path.string(), ":1: added_tokens_decoder key '", k, "' is not an integer id");
      }
      // tokenizer.model alone: the added tokens are split out of text by id, as transformers'
      // AutoTokenizer splits them ("<|im_start|>" was 7 text pieces, trial 24)
      if (!t.is_json_) {
        const bool special = !(v.is_object() && v.contains("special") && v["special"] == false);
        t.impl_->add_token(c, added[c], special);
        t.vocab_size_ = std::max(t.vocab_size_, added[c] + 1);
      }
    }
  }
  auto resolve = [&](const std::string& content, const fs::path& from) -> int32_t {
    if (auto it = added.find(content); it != added.end()) return it->second;
    const int32_t id = t.impl_->piece_to_id(content);
    if (id >= 0) return id;
    fail(from.string(), ":1: special token '", content, "' is neither in ", fs::path(t.path_).filename().string(),
         " nor in added_tokens_decoder");
  };
  auto pick = [&](const char* key, const char* id_key, int32_t current) -> int32_t {
    for (const auto& [j, file] : {std::pair{&tok_cfg, "tokenizer_config.json"},
                                  std::pair{&st_map, "special_tokens_map.json"}}) {
      if (j->is_object() && j->contains(key)) {
        const std::string c = token_content((*j)[key]);
        if (!c.empty()) return resolve(c, dir / file);
      }
    }
    if (gen_cfg.is_object() && gen_cfg.contains(id_key)) {
      const auto& v = gen_cfg[id_key];
      if (v.is_array()) {
        if (!v.empty()) return json_id(v[0], gen_cfg_path, std::string(id_key) + "[0]");
      } else if (!v.is_null()) {
        return json_id(v, gen_cfg_path, id_key);
      }
    }
    return current;
  };
  t.bos_id_ = pick("bos_token", "bos_token_id", t.bos_id_);
  t.eos_id_ = pick("eos_token", "eos_token_id", t.eos_id_);
  t.pad_id_ = pick("pad_token", "pad_token_id", t.pad_id_);
  t.unk_id_ = pick("unk_token", "unk_token_id", t.unk_id_);

  if (gen_cfg.is_object() && gen_cfg.contains("eos_token_id")) {
    const auto& v = gen_cfg["eos_token_id"];
    if (v.is_array()) {
      for (size_t i = 0; i < v.size(); ++i)
        t.eos_ids_.push_back(json_id(v[i], gen_cfg_path, "eos_token_id[" + std::to_string(i) + "]"));
    } else if (!v.is_null()) {
      t.eos_ids_.push_back(json_id(v, gen_cfg_path, "eos_token_id"));
    }
  }

  if (!t.is_json_) {
    // add_bos_token / add_eos_token (default false). add_bos_token's default: true as sentencepiece
    // Llama tokenizers always had it, except under a config naming LlamaTokenizer, whose transformers
    // 5 conversion of tokenizer.model adds no BOS unless the config says so.
    t.prefix_.clear();
    t.suffix_.clear();
    if (config_flag(tok_cfg, tok_cfg_path, "add_bos_token", !cls.llama) && t.bos_id_ >= 0) t.prefix_.push_back(t.bos_id_);
    if (config_flag(tok_cfg, tok_cfg_path, "add_eos_token", false) && t.eos_id_ >= 0) t.suffix_.push_back(t.eos_id_);
  }
  t.finish_specials();
  return t;
}

TokenIds Tokenizer::encode(const std::string& text, bool add_bos, bool add_eos) const {
  TokenIds ids;
  if (add_bos && bos_id_ >= 0) ids.push_back(bos_id_);
  if (!text.empty()) {
    TokenIds v = impl_->encode(text, nullptr, true);
    ids.insert(ids.end(), v.begin(), v.end());
  }
  if (add_eos && eos_id_ >= 0) ids.push_back(eos_id_);
  return ids;
}

TokenIds Tokenizer::encode_with_special_tokens(const std::string& text) const {
  TokenIds ids = prefix_;
  if (!text.empty()) {
    TokenIds v = impl_->encode(text, nullptr, true);
    ids.insert(ids.end(), v.begin(), v.end());
  }
  ids.insert(ids.end(), suffix_.begin(), suffix_.end());
  return ids;
}

TokenIds Tokenizer::encode_with_offsets(const std::string& text, std::vector<int64_t>* offsets,
                                        bool prefix) const {
  return impl_->encode(text, offsets, prefix);
}

std::string Tokenizer::decode(const TokenIds& ids, bool skip_special_tokens) const {
  return impl_->decode(ids, skip_special_tokens, *this);
}

std::string Tokenizer::id_to_piece(int32_t id) const { return impl_->id_to_piece(id); }

std::string Tokenizer::describe() const {
  const auto special = [this](const char* what, int32_t id) {
    return std::string(", ") + what + (id < 0 ? " none" : " '" + id_to_piece(id) + "' " + std::to_string(id));
  };
  return path_ + (is_json_ ? " (tokenizer.json)" : " (sentencepiece)") + ", " + std::to_string(vocab_size_) + " ids" +
         special("bos", bos_id_) + special("eos", eos_id_) + special("pad", pad_id_);
}

int32_t Tokenizer::piece_to_id(const std::string& piece) const { return impl_->piece_to_id(piece); }

bool Tokenizer::is_special(int32_t id) const {
  if (id < 0) return false;
  if (id == bos_id_ || id == eos_id_ || id == pad_id_ || id == unk_id_) return true;
  if (id >= impl_->vocab_size()) return impl_->id_to_piece(id).empty() || impl_->is_special(id);  // declared above the file's vocab
  return impl_->is_special(id);
}

}  // namespace qlora::data
