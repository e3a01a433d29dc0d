// sentencepiece tokenizer.model backend of qlora::data::Tokenizer. See tokenizer.h for the parity
// contract (transformers 5 LlamaTokenizer ids: HF merge ranks + Metaspace, not spm scores).
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "common/error.h"
#include "common/files.h"
#include "common/utf8.h"
#include "data/tokenizer_backend.h"

namespace qlora::data::detail {
namespace fs = std::filesystem;

namespace {

void check_status(const sentencepiece::util::Status& s, const std::string& what) {
  QLORA_CHECK(s.ok(), what, ": ", s.ToString());
}

class SpmBackend final : public TokenizerBackend {
 public:
  SpmBackend(const std::string& path, PrependScheme scheme);
  /// The text's ids: split at the strings of the control / unknown pieces ("<s>", "</s>",
  /// "<unk>"), each its own id, as transformers' converted tokenizer splits its special added
  /// tokens; the sections between encoded by encode_plain, the first with `prefix`, later ones
  /// with a "▁" prefix only under PrependScheme::kAlways (Metaspace "first" prepends at the
  /// input's start alone).
  TokenIds encode(const std::string& text, std::vector<int64_t>* offsets, bool prefix) const override;
  std::string decode(const TokenIds& ids, bool skip_special_tokens, const Tokenizer& facade) const override;
  std::string id_to_piece(int32_t id) const override {
    if (const auto a = added_.find(id); a != added_.end()) return a->second.first;
    if (id < 0 || id >= sp_->GetPieceSize()) return "";
    return sp_->IdToPiece(id);
  }
  int32_t piece_to_id(const std::string& piece) const override {
    for (const auto& [id, a] : added_)
      if (a.first == piece) return id;
    const int id = sp_->PieceToId(piece);
    return (id >= 0 && sp_->IdToPiece(id) == piece) ? id : -1;
  }
  int32_t vocab_size() const override { return sp_->GetPieceSize(); }
  bool is_special(int32_t id) const override {
    if (const auto a = added_.find(id); a != added_.end()) return a->second.second;
    return id >= 0 && id < sp_->GetPieceSize() && (sp_->IsControl(id) || sp_->IsUnknown(id));
  }
  void add_token(const std::string& content, int32_t id, bool special) override {
    for (const auto& sp : specials_)
      if (sp.first == content) return;  // a control piece already split out
    // an id of the model names its own piece (HF keeps the id); anything else is a new token
    if (content.empty() || (id < sp_->GetPieceSize() && sp_->IdToPiece(id) != content)) return;
    specials_.emplace_back(content, id);
    if (id >= sp_->GetPieceSize()) added_[id] = {content, special};
  }
  FileSpecials specials() const override {
    FileSpecials s;
    s.bos = sp_->bos_id();
    s.eos = sp_->eos_id();
    s.pad = sp_->pad_id();
    s.unk = sp_->unk_id();
    return s;
  }

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;  // vocab, piece types, decode
  std::unordered_map<std::string, int32_t> piece_ids_;           // single-character pieces and all others
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // (left<<32|right) -> (rank, merged id)
  int32_t byte_ids_[256];                                        // <0xXX> piece per byte, -1 if absent
  int32_t space_id_ = -1;                                        // "▁"
  int32_t unk_id_ = -1;
  PrependScheme scheme_;  // kNever: no "▁" prefix at all; else one when encode() is asked for it
  std::vector<std::pair<std::string, int32_t>> specials_;  // control / unknown / added token strings and ids
  std::map<int32_t, std::pair<std::string, bool>> added_;  // added ids past the model: (content, special)
  /// BPE of text without special strings (transformers' conversion of the model, see the constructor).
  TokenIds encode_plain(const std::string& text, std::vector<int64_t>* offsets, bool prefix) const;
};

SpmBackend::SpmBackend(const std::string& path, PrependScheme scheme) : scheme_(scheme) {
  check_regular_file(path);
  QLORA_CHECK(fs::is_regular_file(path), path, ": tokenizer model not found", relative_path_note(path));
  const std::string bytes = read_file(path);
  // An empty model parses as an empty proto, which sentencepiece reports as "unk is not defined"
  // (trial 24): say what the file is instead (an interrupted copy, a Git LFS pointer, ...).
  QLORA_CHECK(!bytes.empty(), path, ": empty file, not a sentencepiece model (an interrupted copy?)");
  check_not_git_lfs_pointer(bytes, path, "sentencepiece model");
  sp_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
  check_status(sp_->LoadFromSerializedProto(bytes), path + ": not a sentencepiece model");
  const int32_t n = sp_->GetPieceSize();
  unk_id_ = sp_->unk_id();

  // Vocabulary and merges exactly as transformers' SentencePieceExtractor/generate_merges build
  // them (data/llama_tokenizer.h, by piece id): every split of every piece whose two halves are
  // pieces is a merge. Control/unknown/unused (and byte) pieces take no part, so plain text can
  // never produce <s>, </s> or <unk> by merging.
  std::fill(std::begin(byte_ids_), std::end(byte_ids_), -1);
  std::vector<std::string> pieces(n);
  std::vector<bool> usable(n, false);
  for (int32_t i = 0; i < n; ++i) {
    pieces[i] = sp_->IdToPiece(i);
    if (sp_->IsByte(i)) {
      const unsigned v = std::stoul(pieces[i].substr(3, 2), nullptr, 16);  // "<0xAB>"
      if (v < 256) byte_ids_[v] = i;
      continue;
    }
    if ((sp_->IsControl(i) || sp_->IsUnknown(i)) && !pieces[i].empty()) specials_.emplace_back(pieces[i], i);
    if (sp_->IsControl(i) || sp_->IsUnknown(i) || sp_->IsUnused(i)) continue;
    usable[i] = true;
    piece_ids_.emplace(pieces[i], i);
  }
  const std::vector<MergeRule> rules = generate_merges(pieces, nullptr, &usable);
  for (size_t k = 0; k < rules.size(); ++k) {
    const uint64_t key = (uint64_t(uint32_t(rules[k].left)) << 32) | uint32_t(rules[k].right);
    merges_.emplace(key, std::pair<int32_t, int32_t>(int32_t(k), rules[k].merged));
  }
  auto sp = piece_ids_.find("\xe2\x96\x81");  // "▁"
  space_id_ = sp == piece_ids_.end() ? -1 : sp->second;
}

TokenIds SpmBackend::encode(const std::string& text, std::vector<int64_t>* offsets, bool prefix) const {
  if (offsets) offsets->clear();
  TokenIds ids;
  std::vector<int64_t> section_offsets;
  size_t start = 0;  // of the section not yet encoded
  auto flush = [&](size_t end) {
    if (end <= start) return;
    const TokenIds v = encode_plain(text.substr(start, end - start), offsets ? &section_offsets : nullptr,
                                    start == 0 ? prefix : scheme_ == PrependScheme::kAlways);
    ids.insert(ids.end(), v.begin(), v.end());
    if (offsets)
      for (int64_t o : section_offsets) offsets->push_back(o + static_cast<int64_t>(start));
  };
  for (size_t i = 0; i < text.size();) {
    const std::pair<std::string, int32_t>* hit = nullptr;  // the longest special string at i
    for (const auto& sp : specials_)
      if (text.compare(i, sp.first.size(), sp.first) == 0 && (!hit || sp.first.size() > hit->first.size())) hit = &sp;
    if (!hit) {
      ++i;
      continue;
    }
    flush(i);
    ids.push_back(hit->second);
    if (offsets) offsets->push_back(static_cast<int64_t>(i));
    i += hit->first.size();
    start = i;
  }
  flush(text.size());
  return ids;
}

TokenIds SpmBackend::encode_plain(const std::string& text, std::vector<int64_t>* offsets, bool prefix) const {
  if (offsets) offsets->clear();
  if (text.empty()) return {};
  // Symbols: a doubly linked list over the initial pieces; alive == false marks a merged-away symbol.
  struct Sym { int32_t id; int64_t offset; int32_t prev, next; bool alive; };
  std::vector<Sym> syms;
  syms.reserve(text.size() + 1);
  auto push = [&](int32_t id, int64_t off) {
    const int32_t n = static_cast<int32_t>(syms.size());
    syms.push_back({id, off, n - 1, n + 1, true});
  };
  const std::string kSpace("\xe2\x96\x81");
  const bool starts_with_space = text[0] == ' ' || text.compare(0, 3, kSpace) == 0;
  if (prefix && scheme_ != PrependScheme::kNever && !starts_with_space) push(space_id_ >= 0 ? space_id_ : unk_id_, 0);
  for (size_t i = 0; i < text.size();) {
    const int n = static_cast<int>(
        std::min(utf8_sequence_length(static_cast<unsigned char>(text[i])), text.size() - i));
    auto it = text[i] == ' ' ? piece_ids_.find(kSpace) : piece_ids_.find(text.substr(i, n));
    if (it != piece_ids_.end()) {
      push(it->second, int64_t(i));
    } else {
      for (int b = 0; b < n; ++b) {
        const int32_t bid = byte_ids_[static_cast<unsigned char>(text[i + b])];
        if (bid >= 0) {
          push(bid, int64_t(i + b));
        } else if (syms.empty() || syms.back().id != unk_id_) {  // HF fuse_unk
          push(unk_id_, int64_t(i + b));
        }
      }
    }
    i += n;
  }
  if (!syms.empty()) syms.back().next = -1;

  // HF BPE merge loop: lowest rank first, leftmost position on ties; stale entries are skipped.
  struct Cand { int32_t rank, pos, merged; };
  auto worse = [](const Cand& a, const Cand& b) { return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos; };
  std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> heap(worse);
  auto lookup = [&](int32_t l, int32_t r) -> const std::pair<int32_t, int32_t>* {
    auto it = merges_.find((uint64_t(uint32_t(l)) << 32) | uint32_t(r));
    return it == merges_.end() ? nullptr : &it->second;
  };
  for (size_t k = 0; k + 1 < syms.size(); ++k)
    if (auto m = lookup(syms[k].id, syms[k + 1].id)) heap.push({m->first, int32_t(k), m->second});
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    Sym& s = syms[c.pos];
    if (!s.alive || s.next < 0) continue;
    Sym& r = syms[s.next];
    auto m = lookup(s.id, r.id);
    if (!m || m->second != c.merged) continue;
    s.id = c.merged;
    r.alive = false;
    s.next = r.next;
    if (s.next >= 0) syms[s.next].prev = c.pos;
    if (s.prev >= 0)
      if (auto pm = lookup(syms[s.prev].id, s.id)) heap.push({pm->first, s.prev, pm->second});
    if (s.next >= 0)
      if (auto nm = lookup(s.id, syms[s.next].id)) heap.push({nm->first, c.pos, nm->second});
  }
  TokenIds ids;
  for (int32_t k = syms.empty() ? -1 : 0; k >= 0; k = syms[k].next) {
    ids.push_back(syms[k].id);
    if (offsets) offsets->push_back(syms[k].offset);
  }
  return ids;
}

std::string SpmBackend::decode(const TokenIds& ids, bool skip_special_tokens, const Tokenizer& facade) const {
  // Runs of ordinary ids go through sentencepiece; special ids are dropped or written as pieces.
  std::string out;
  std::vector<int> run;
  const int n = sp_->GetPieceSize();
  auto flush = [&]() {
    if (run.empty()) return;
    std::string s;
    check_status(sp_->Decode(run, &s), "tokenizer.model: decode");
    out += s;
    run.clear();
  };
  for (int32_t id : ids) {
    const bool special = facade.is_special(id);
    if (special || added_.count(id)) {  // an added token that is not special is written even when skipping
      if (skip_special_tokens && special) continue;
      flush();
      out += facade.id_to_piece(id);
    } else if (id >= 0 && id < n) {
      run.push_back(id);
    }
  }
  flush();
  return out;
}

class VectorIterator : public sentencepiece::SentenceIterator {
 public:
  explicit VectorIterator(const std::vector<std::string>& v) : v_(v) {}
  bool done() const override { return i_ >= v_.size(); }
  void Next() override { ++i_; }
  const std::string& value() const override { return v_[i_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& v_;
  size_t i_ = 0;
};

std::unordered_map<std::string, std::string> llama_like_args(int vocab_size, const std::string& prefix) {
  return {{"model_prefix", prefix},
          {"model_type", "bpe"},
          {"vocab_size", std::to_string(vocab_size)},
          {"byte_fallback", "true"},
          {"split_digits", "true"},
          {"remove_extra_whitespaces", "false"},
          {"normalization_rule_name", "identity"},
          {"character_coverage", "0.9995"},
          {"unk_id", "0"},
          {"bos_id", "1"},
          {"eos_id", "2"},
          {"pad_id", "-1"},
          {"hard_vocab_limit", "false"},
          {"num_threads", "1"},
          {"minloglevel", "2"}};
}

}  // namespace

std::unique_ptr<TokenizerBackend> load_spm(const std::string& path, PrependScheme scheme) {
  return std::make_unique<SpmBackend>(path, scheme);
}

}  // namespace qlora::data::detail

namespace qlora::data {
namespace fs = std::filesystem;

std::string Tokenizer::train(const std::vector<std::string>& corpus_paths, int vocab_size,
                             const std::string& out_prefix) {
  QLORA_CHECK(!corpus_paths.empty(), "Tokenizer::train: no corpus files given");
  std::string inputs;
  for (const auto& p : corpus_paths) {
    check_regular_file(p);
    QLORA_CHECK(fs::is_regular_file(p), p, ": corpus file not found");
    QLORA_CHECK(p.find(',') == std::string::npos, p, ": corpus path must not contain ','");
    inputs += (inputs.empty() ? "" : ",") + p;
  }
  auto args = detail::llama_like_args(vocab_size, out_prefix);
  args["input"] = inputs;
  detail::check_status(sentencepiece::SentencePieceTrainer::Train(args), out_prefix + ": tokenizer training failed");
  return out_prefix + ".model";
}

std::string Tokenizer::train_from_texts(const std::vector<std::string>& texts, int vocab_size,
                                        const std::string& out_prefix) {
  QLORA_CHECK(!texts.empty(), "Tokenizer::train_from_texts: no texts given");
  detail::VectorIterator it(texts);
  detail::check_status(
      sentencepiece::SentencePieceTrainer::Train(detail::llama_like_args(vocab_size, out_prefix), &it),
      out_prefix + ": tokenizer training failed");
  return out_prefix + ".model";
}

}  // namespace qlora::data
