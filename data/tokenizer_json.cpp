// HF tokenizer.json backend of qlora::data::Tokenizer: the pipeline of the Rust `tokenizers`
// library (huggingface/tokenizers, tokenizers/src/tokenizer/mod.rs encode_single_sequence):
//   added tokens split out (non-normalized ones on the raw text, normalized ones after the
//   normalizer) -> normalizer -> pre-tokenizer -> model (BPE) -> post-processor (ids around the
//   sequence); decode: ids -> tokens (added tokens, then model vocab) -> decoder chain -> join.
// Supported components (anything else is refused naming its JSON path, never approximated):
//   model BPE (byte_fallback, ignore_merges, fuse_unk, unk_token, continuing_subword_prefix,
//   end_of_word_suffix, merges "a b" or ["a","b"], dropout null/0);
//   normalizers NFC, Prepend, Replace, Sequence; pre-tokenizers ByteLevel, Split, Digits,
//   Metaspace, Sequence; decoders ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace,
//   Sequence; post-processors TemplateProcessing, ByteLevel, Sequence.
// Regexes run on PCRE2 (UTF + UCP, JIT), written for Oniguruma (what `tokenizers` uses); `\s`/`\S`
// are rewritten to Oniguruma's White_Space set (PCRE2's UCP \s adds U+180E, lacks U+0085). NFC is utf8proc's.
// `padding` / `truncation` of tokenizer.json are ignored (transformers turns both off per call).
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <string_view>
#include <unordered_map>

#include "common/error.h"
#include "common/json_file.h"
#include "common/files.h"
#include "common/utf8.h"
#include "data/tokenizer_backend.h"

namespace qlora::data::detail {
namespace {

using json = nlohmann::json;

// ------------------------------------------------------------------------------------------
// UTF-8 helpers

// Decodes one code point at s[i] of a VALID UTF-8 string; returns its byte length.
inline int next_cp(const char* s, size_t n, size_t i, int32_t* cp) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  const utf8proc_ssize_t k =
      utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s + i), static_cast<utf8proc_ssize_t>(n - i), cp);
  if (k <= 0) {  // cannot happen on validated text; be safe
    *cp = 0xFFFD;
    return 1;
  }
  return static_cast<int>(k);
}

inline int cp_len(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c >> 5) == 0x6) return 2;
  if ((c >> 4) == 0xE) return 3;
  return 4;
}

void append_utf8(std::string& out, int32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Length of the valid UTF-8 sequence at s[i] (1-4), or 0 when invalid; *sub gets the length of
// the maximal subpart of a valid sequence that starts there (>= 1) when invalid.
int valid_seq(const unsigned char* s, size_t n, size_t i, int* sub) {
  const unsigned char c = s[i];
  if (c < 0x80) return 1;
  int need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    *sub = 1;
    return 0;
  }
  int k = 1;
  for (; k <= need; ++k) {
    if (i + k >= n) break;
    const unsigned char b = s[i + k];
    if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) break;
  }
  if (k == need + 1) return need + 1;
  *sub = k;
  return 0;
}

// Rust String::from_utf8_lossy / Python bytes.decode('utf-8', 'replace'): one U+FFFD per maximal
// invalid subpart. `to_raw` gets, per output byte, the input byte offset it comes from.
std::string utf8_lossy(const std::string& s, std::vector<uint32_t>* to_raw) {
  std::string out;
  out.reserve(s.size() + 8);
  to_raw->clear();
  to_raw->reserve(s.size() + 8);
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0; i < s.size();) {
    int sub = 0;
    const int k = valid_seq(p, s.size(), i, &sub);
    if (k > 0) {
      out.append(s, i, k);
      for (int b = 0; b < k; ++b) to_raw->push_back(static_cast<uint32_t>(i));
      i += k;
    } else {
      out += "\xEF\xBF\xBD";
      for (int b = 0; b < 3; ++b) to_raw->push_back(static_cast<uint32_t>(i));
      i += sub;
    }
  }
  return out;
}

// Unicode White_Space (what Rust's regex \s and Oniguruma's \s match).
bool is_white_space(int32_t c) {
  return (c >= 9 && c <= 13) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
         c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Rust regex \w (Unicode word character): letters, marks, decimal numbers, connector punctuation,
// join controls (Alphabetic's Nl and the rest approximated by the general category).
bool is_word_char(int32_t c) {
  if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  if (c == 0x200C || c == 0x200D) return true;
  switch (utf8proc_category(c)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

// Rust char::is_numeric: general category Nd, Nl or No.
bool is_numeric(int32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  const auto cat = utf8proc_category(c);
  return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}

// GPT-2 byte-level alphabet (tokenizers pre_tokenizers/byte_level.rs bytes_char): printable
// bytes map to themselves, the others to U+0100 + n in byte order.
struct ByteLevelTable {
  std::string byte_to_utf8[256];
  std::unordered_map<int32_t, uint8_t> cp_to_byte;
  ByteLevelTable() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const int32_t cp = keep ? b : 256 + n++;
      append_utf8(byte_to_utf8[b], cp);
      cp_to_byte[cp] = static_cast<uint8_t>(b);
    }
  }
};
const ByteLevelTable& byte_level() {
  static const ByteLevelTable t;
  return t;
}

// ------------------------------------------------------------------------------------------
// JSON access: every value is type-checked; errors name the file and the JSON path.

struct Ctx {
  std::string file;
};

template <typename... A>
[[noreturn]] void jfail(const Ctx& c, const std::string& path, const A&... a) {
  fail(c.file, ": ", path, ": ", a...);
}

std::string type_of(const json& v) { return v.type_name(); }

const json& req(const Ctx& c, const json& obj, const std::string& path, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end()) jfail(c, path.empty() ? key : path + "." + key, "missing");
  return *it;
}
std::string join(const std::string& path, const char* key) { return path.empty() ? key : path + "." + key; }
std::string idx(const std::string& path, size_t i) { return path + "[" + std::to_string(i) + "]"; }

std::string get_str(const Ctx& c, const json& obj, const std::string& path, const char* key) {
  const json& v = req(c, obj, path, key);
  if (!v.is_string()) jfail(c, join(path, key), "expected a string, got ", type_of(v));
  return v.get<std::string>();
}
// Optional string: absent or null -> `def`.
std::string opt_str(const Ctx& c, const json& obj, const std::string& path, const char* key, const std::string& def) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return def;
  if (!it->is_string()) jfail(c, join(path, key), "expected a string, got ", type_of(*it));
  return it->get<std::string>();
}
bool opt_bool(const Ctx& c, const json& obj, const std::string& path, const char* key, bool def) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return def;
  if (!it->is_boolean()) jfail(c, join(path, key), "expected true/false, got ", type_of(*it));
  return it->get<bool>();
}
int64_t get_int(const Ctx& c, const json& v, const std::string& path, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) jfail(c, path, "expected an integer, got ", type_of(v));
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(hi)) jfail(c, path, "value ", v.dump(), " out of range");
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) jfail(c, path, "value ", x, " out of range [", lo, ", ", hi, "]");
  return x;
}
int32_t get_id(const Ctx& c, const json& v, const std::string& path) {
  return static_cast<int32_t>(get_int(c, v, path, 0, (int64_t(1) << 31) - 2));
}
const json& get_obj(const Ctx& c, const json& obj, const std::string& path, const char* key) {
  const json& v = req(c, obj, path, key);
  if (!v.is_object()) jfail(c, join(path, key), "expected an object, got ", type_of(v));
  return v;
}
const json& get_arr(const Ctx& c, const json& obj, const std::string& path, const char* key) {
  const json& v = req(c, obj, path, key);
  if (!v.is_array()) jfail(c, join(path, key), "expected an array, got ", type_of(v));
  return v;
}
void expect_object(const Ctx& c, const json& v, const std::string& path) {
  if (!v.is_object()) jfail(c, path, "expected an object, got ", type_of(v));
}
// A single-character string (Metaspace replacement, Strip content).
int32_t get_char(const Ctx& c, const json& obj, const std::string& path, const char* key, const std::string& def) {
  const std::string s = def.empty() ? get_str(c, obj, path, key) : opt_str(c, obj, path, key, def);
  if (s.empty() || !is_valid_utf8(s)) jfail(c, join(path, key), "expected one character");
  int32_t cp = 0;
  const int k = next_cp(s.data(), s.size(), 0, &cp);
  if (size_t(k) != s.size()) jfail(c, join(path, key), "expected one character, got '", s, "'");
  return cp;
}

// ------------------------------------------------------------------------------------------
// Text pieces with alignment: orig[i] = byte offset in the (sanitised) input of the character
// that byte i of s comes from.

struct Piece {
  std::string s;
  std::vector<uint32_t> orig;
};

Piece slice(const Piece& p, size_t b, size_t e) {
  Piece q;
  q.s.assign(p.s, b, e - b);
  q.orig.assign(p.orig.begin() + b, p.orig.begin() + e);
  return q;
}

void prepend(Piece& p, const std::string& what) {
  const uint32_t o = p.orig.empty() ? 0 : p.orig.front();
  p.s.insert(0, what);
  p.orig.insert(p.orig.begin(), what.size(), o);
}

struct Span {
  uint32_t b, e;
  bool match;
};

enum class Behavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };

// NormalizedString::split (tokenizer/normalizer.rs): matches -> pieces per behaviour; empty
// pieces are dropped (PreTokenizedString::split).
void split_pieces(const Piece& p, const std::vector<Span>& spans, Behavior beh, std::vector<Piece>* out) {
  std::vector<Span> res;  // (range, remove)
  res.reserve(spans.size());
  switch (beh) {
    case Behavior::kIsolated:
      for (const Span& s : spans) res.push_back({s.b, s.e, false});
      break;
    case Behavior::kRemoved:
      res = spans;
      break;
    case Behavior::kContiguous: {
      bool prev = false;
      for (const Span& s : spans) {
        if (s.match == prev && !res.empty()) res.back().e = s.e;
        else res.push_back({s.b, s.e, false});
        prev = s.match;
      }
      break;
    }
    case Behavior::kMergedWithPrevious: {
      bool prev = false;
      for (const Span& s : spans) {
        if (s.match && !prev && !res.empty()) res.back().e = s.e;
        else res.push_back({s.b, s.e, false});
        prev = s.match;
      }
      break;
    }
    case Behavior::kMergedWithNext: {
      bool prev = false;
      for (size_t k = spans.size(); k-- > 0;) {
        const Span& s = spans[k];
        if (s.match && !prev && !res.empty()) res.back().b = s.b;
        else res.push_back({s.b, s.e, false});
        prev = s.match;
      }
      std::reverse(res.begin(), res.end());
      break;
    }
  }
  for (const Span& s : res)
    if (!s.match && s.e > s.b) out->push_back(slice(p, s.b, s.e));
}

// Matches -> the full cover of `n` bytes by (gap, false) and (match, true) spans (pattern.rs).
void cover(std::vector<Span>* spans, const std::vector<std::pair<uint32_t, uint32_t>>& m, uint32_t n) {
  spans->clear();
  uint32_t prev = 0;
  for (const auto& [b, e] : m) {
    if (prev != b) spans->push_back({prev, b, false});
    spans->push_back({b, e, true});
    prev = e;
  }
  if (prev != n) spans->push_back({prev, n, false});
  if (n == 0) spans->push_back({0, 0, false});
}

// ------------------------------------------------------------------------------------------
// Regex (PCRE2, UTF + UCP, JIT when available).

// Oniguruma's \s is Unicode White_Space; PCRE2's UCP \s differs (it lacks U+0085 and has U+180E),
// so \s / \S are rewritten to that exact set.
constexpr const char* kWhiteSpaceItems =
    "\\t\\n\\x0B\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";
std::string onig_to_pcre2(const std::string& re) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < re.size(); ++i) {
    const char c = re[i];
    if (c == '\\' && i + 1 < re.size()) {
      const char d = re[i + 1];
      if (d == 's') out += in_class ? std::string(kWhiteSpaceItems) : "[" + std::string(kWhiteSpaceItems) + "]";
      else if (d == 'S' && !in_class) out += "[^" + std::string(kWhiteSpaceItems) + "]";
      else out.append(re, i, 2);
      ++i;
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      if (i + 1 < re.size() && re[i + 1] == '^') out += re[++i];
      if (i + 1 < re.size() && re[i + 1] == ']') out += re[++i];  // literal ']' first in class
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

class Regex {
 public:
  Regex(const std::string& pattern, const Ctx& c, const std::string& path) {
    int err = 0;
    PCRE2_SIZE off = 0;
    const std::string p = onig_to_pcre2(pattern);
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(), PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
    if (!code_) {
      PCRE2_UCHAR buf[256];
      pcre2_get_error_message(err, buf, sizeof(buf));
      jfail(c, path, "regex rejected by PCRE2 at offset ", off, ": ", reinterpret_cast<const char*>(buf));
    }
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  ~Regex() { pcre2_code_free(code_); }

  // Non-overlapping matches left to right; an empty match advances one character.
  void find_all(const std::string& s, std::vector<std::pair<uint32_t, uint32_t>>* out) const;

 private:
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

struct MatchScratch {
  pcre2_match_data* md = nullptr;
  pcre2_match_context* mc = nullptr;
  pcre2_jit_stack* js = nullptr;
  MatchScratch() {
    md = pcre2_match_data_create(16, nullptr);
    mc = pcre2_match_context_create(nullptr);
    js = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr);
    pcre2_jit_stack_assign(mc, nullptr, js);
  }
  ~MatchScratch() {
    pcre2_match_data_free(md);
    pcre2_match_context_free(mc);
    pcre2_jit_stack_free(js);
  }
};

void Regex::find_all(const std::string& s, std::vector<std::pair<uint32_t, uint32_t>>* out) const {
  thread_local MatchScratch scratch;  // match data and JIT stack are per thread
  out->clear();
  const auto* subj = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t pos = 0;
  while (pos <= s.size()) {
    const int rc = pcre2_match(code_, subj, s.size(), pos, PCRE2_NO_UTF_CHECK, scratch.md, scratch.mc);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR buf[256];
      pcre2_get_error_message(rc, buf, sizeof(buf));
      fail("tokenizer.json: pre-tokenizer regex failed on the input: ", reinterpret_cast<const char*>(buf));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch.md);
    const size_t b = ov[0], e = ov[1];
    out->emplace_back(static_cast<uint32_t>(b), static_cast<uint32_t>(e));
    if (e > b) {
      pos = e;
    } else {
      if (e >= s.size()) break;
      pos = e + cp_len(static_cast<unsigned char>(s[e]));
    }
  }
}

// A Split / Replace pattern: {"String": "..."} (literal) or {"Regex": "..."}.
class Pattern {
 public:
  Pattern(const Ctx& c, const json& obj, const std::string& path) {
    const json& p = get_obj(c, obj, path, "pattern");
    const std::string pp = join(path, "pattern");
    if (p.contains("String")) {
      literal_ = get_str(c, p, pp, "String");
    } else if (p.contains("Regex")) {
      regex_ = std::make_unique<Regex>(get_str(c, p, pp, "Regex"), c, pp + ".Regex");
    } else {
      jfail(c, pp, "expected {\"String\": ...} or {\"Regex\": ...}");
    }
  }
  void find_all(const std::string& s, std::vector<std::pair<uint32_t, uint32_t>>* out) const {
    if (regex_) return regex_->find_all(s, out);
    out->clear();
    if (literal_.empty()) return;  // tokenizers: an empty literal matches nothing
    for (size_t pos = s.find(literal_); pos != std::string::npos; pos = s.find(literal_, pos + literal_.size()))
      out->emplace_back(static_cast<uint32_t>(pos), static_cast<uint32_t>(pos + literal_.size()));
  }

 private:
  std::string literal_;
  std::unique_ptr<Regex> regex_;
};

// Replaces every match of `pat` in p by `content` (NormalizedString::replace): the new bytes
// take the original offset of the match's first byte.
void replace_all(Piece& p, const Pattern& pat, const std::string& content) {
  std::vector<std::pair<uint32_t, uint32_t>> m;
  pat.find_all(p.s, &m);
  if (m.empty()) return;
  Piece q;
  q.s.reserve(p.s.size());
  q.orig.reserve(p.s.size());
  uint32_t prev = 0;
  for (const auto& [b, e] : m) {
    if (e == b) continue;
    q.s.append(p.s, prev, b - prev);
    q.orig.insert(q.orig.end(), p.orig.begin() + prev, p.orig.begin() + b);
    q.s += content;
    q.orig.insert(q.orig.end(), content.size(), p.orig[b]);
    prev = e;
  }
  q.s.append(p.s, prev, std::string::npos);
  q.orig.insert(q.orig.end(), p.orig.begin() + prev, p.orig.end());
  p = std::move(q);
}

// ------------------------------------------------------------------------------------------
// Normalizers

struct Normalizer {
  virtual ~Normalizer() = default;
  // `no_prefix`: the piece begins the caller's text and the caller asked for no prefix.
  virtual void apply(Piece& p, bool no_prefix) const = 0;
};

// NFC of `s` by utf8proc ("" when utf8proc fails, which valid UTF-8 never makes it do).
std::string nfc(const char* s, size_t n) {
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t k = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s), static_cast<utf8proc_ssize_t>(n),
                                          &out, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  std::string r = k >= 0 ? std::string(reinterpret_cast<const char*>(out), size_t(k)) : std::string(s, n);
  std::free(out);
  return r;
}

size_t count_cps(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// NFC (utf8proc) with the alignment `tokenizers` gets from unicode-normalization: text goes in
// runs that start at an ASCII byte (no composition or reordering crosses one); an unchanged run is
// copied; a changed run is cut into segments at starters (ccc 0) that do not compose with what
// precedes, and each segment's output characters map 1:1 to its input characters when the counts
// match (e.g. a compatibility ideograph), else all to the segment's first byte (compositions).
struct NfcNormalizer : Normalizer {
  static void changed_run(const Piece& p, size_t b, size_t e, Piece* q) {
    std::vector<size_t> starts;  // segment starts (byte offsets)
    for (size_t i = b; i < e;) {
      int32_t cp;
      const int k = next_cp(p.s.data(), e, i, &cp);
      if (i == b || utf8proc_get_property(cp)->combining_class == 0) starts.push_back(i);
      i += k;
    }
    starts.push_back(e);
    std::vector<size_t> segs = {starts[0]};
    for (size_t k = 1; k + 1 < starts.size(); ++k) {
      const size_t pb = segs.back(), mb = starts[k], me = starts[k + 1];
      const std::string joint = nfc(p.s.data() + pb, me - pb);
      if (joint == nfc(p.s.data() + pb, mb - pb) + nfc(p.s.data() + mb, me - mb)) segs.push_back(mb);
    }
    segs.push_back(e);
    for (size_t k = 0; k + 1 < segs.size(); ++k) {
      const size_t sb = segs[k], se = segs[k + 1];
      const std::string in = p.s.substr(sb, se - sb), out = nfc(in.data(), in.size());
      if (count_cps(out) == count_cps(in)) {
        size_t i = 0;
        for (size_t o = 0; o < out.size();) {
          const int ko = cp_len(static_cast<unsigned char>(out[o]));
          q->s.append(out, o, ko);
          q->orig.insert(q->orig.end(), size_t(ko), p.orig[sb + i]);
          o += ko;
          i += cp_len(static_cast<unsigned char>(in[i]));
        }
      } else {
        q->s += out;
        q->orig.insert(q->orig.end(), out.size(), p.orig[sb]);
      }
    }
  }
  void apply(Piece& p, bool) const override {
    const std::string& s = p.s;
    size_t i = 0;
    while (i < s.size() && static_cast<unsigned char>(s[i]) < 0x80) ++i;
    if (i == s.size()) return;
    Piece q;
    q.s.reserve(s.size());
    q.orig.reserve(s.size());
    size_t run = 0;  // start of the current run
    auto flush = [&](size_t end) {
      if (end <= run) return;
      bool ascii = true;
      for (size_t k = run; k < end && ascii; ++k) ascii = static_cast<unsigned char>(s[k]) < 0x80;
      if (ascii || nfc(s.data() + run, end - run).compare(0, std::string::npos, s, run, end - run) == 0) {
        q.s.append(s, run, end - run);
        q.orig.insert(q.orig.end(), p.orig.begin() + run, p.orig.begin() + end);
      } else {
        changed_run(p, run, end, &q);
      }
      run = end;
    };
    for (size_t k = 0; k < s.size(); ++k)
      if (static_cast<unsigned char>(s[k]) < 0x80) flush(k);
    flush(s.size());
    p = std::move(q);
  }
};

struct PrependNormalizer : Normalizer {
  std::string what;
  void apply(Piece& p, bool no_prefix) const override {
    if (!p.s.empty() && !no_prefix) prepend(p, what);
  }
};

struct ReplaceNormalizer : Normalizer {
  std::unique_ptr<Pattern> pattern;
  std::string content;
  void apply(Piece& p, bool) const override { replace_all(p, *pattern, content); }
};

struct SequenceNormalizer : Normalizer {
  std::vector<std::unique_ptr<Normalizer>> items;
  void apply(Piece& p, bool no_prefix) const override {
    for (const auto& n : items) n->apply(p, no_prefix);
  }
};

std::unique_ptr<Normalizer> parse_normalizer(const Ctx& c, const json& j, const std::string& path) {
  expect_object(c, j, path);
  const std::string type = get_str(c, j, path, "type");
  if (type == "NFC") return std::make_unique<NfcNormalizer>();
  if (type == "Prepend") {
    auto n = std::make_unique<PrependNormalizer>();
    n->what = get_str(c, j, path, "prepend");
    return n;
  }
  if (type == "Replace") {
    auto n = std::make_unique<ReplaceNormalizer>();
    n->pattern = std::make_unique<Pattern>(c, j, path);
    n->content = get_str(c, j, path, "content");
    return n;
  }
  if (type == "Sequence") {
    auto n = std::make_unique<SequenceNormalizer>();
    const json& a = get_arr(c, j, path, "normalizers");
    for (size_t i = 0; i < a.size(); ++i) n->items.push_back(parse_normalizer(c, a[i], idx(join(path, "normalizers"), i)));
    return n;
  }
  jfail(c, join(path, "type"), "unsupported '", type, "' (supported: NFC, Prepend, Replace, Sequence)");
}

// ------------------------------------------------------------------------------------------
// Pre-tokenizers

struct PreTokenizer {
  virtual ~PreTokenizer() = default;
  // Splits/changes each piece; `prefix`: the caller's text may get a prefix (see encode_with_offsets).
  virtual void apply(std::vector<Piece>* pieces, bool prefix) const = 0;
};

// Pieces at original offset 0 of a text the caller marked as continuing get no prefix.
inline bool no_prefix_for(const Piece& p, bool prefix) { return !prefix && !p.orig.empty() && p.orig.front() == 0; }

struct ByteLevelPre : PreTokenizer {
  bool add_prefix_space = true, use_regex = true;
  bool defer_mapping = false;  // last pre-tokenizer: the model maps bytes (cache keyed by raw bytes)
  std::unique_ptr<Regex> re;
  void apply(std::vector<Piece>* pieces, bool prefix) const override {
    std::vector<Piece> out;
    std::vector<std::pair<uint32_t, uint32_t>> m;
    std::vector<Span> spans;
    for (Piece& p : *pieces) {
      if (add_prefix_space && !no_prefix_for(p, prefix) && (p.s.empty() || p.s[0] != ' ')) prepend(p, " ");
      if (use_regex) {
        re->find_all(p.s, &m);
        cover(&spans, m, static_cast<uint32_t>(p.s.size()));
        split_pieces(p, spans, Behavior::kIsolated, &out);
      } else if (!p.s.empty()) {
        out.push_back(std::move(p));
      }
    }
    if (!defer_mapping) {
      const ByteLevelTable& t = byte_level();
      for (Piece& p : out) {
        Piece q;
        for (size_t i = 0; i < p.s.size(); ++i) {
          const std::string& u = t.byte_to_utf8[static_cast<unsigned char>(p.s[i])];
          q.s += u;
          q.orig.insert(q.orig.end(), u.size(), p.orig[i]);
        }
        p = std::move(q);
      }
    }
    *pieces = std::move(out);
  }
};

struct SplitPre : PreTokenizer {
  std::unique_ptr<Pattern> pattern;
  Behavior behavior = Behavior::kIsolated;
  bool invert = false;
  void apply(std::vector<Piece>* pieces, bool) const override {
    std::vector<Piece> out;
    std::vector<std::pair<uint32_t, uint32_t>> m;
    std::vector<Span> spans;
    for (const Piece& p : *pieces) {
      pattern->find_all(p.s, &m);
      cover(&spans, m, static_cast<uint32_t>(p.s.size()));
      if (invert)
        for (Span& s : spans) s.match = !s.match;
      split_pieces(p, spans, behavior, &out);
    }
    *pieces = std::move(out);
  }
};

// Splits on characters matching `pred` (one match event per character, pattern.rs `Fn(char)`).
template <typename Pred>
void char_spans(const std::string& s, Pred pred, std::vector<Span>* spans) {
  spans->clear();
  uint32_t last = 0;
  for (size_t i = 0; i < s.size();) {
    int32_t cp;
    const int k = next_cp(s.data(), s.size(), i, &cp);
    if (pred(cp)) {
      if (last < i) spans->push_back({last, uint32_t(i), false});
      spans->push_back({uint32_t(i), uint32_t(i + k), true});
      last = uint32_t(i + k);
    }
    i += k;
  }
  if (s.size() > last) spans->push_back({last, uint32_t(s.size()), false});
  if (s.empty()) spans->push_back({0, 0, false});
}

struct DigitsPre : PreTokenizer {
  bool individual = false;
  void apply(std::vector<Piece>* pieces, bool) const override {
    std::vector<Piece> out;
    std::vector<Span> spans;
    for (const Piece& p : *pieces) {
      char_spans(p.s, is_numeric, &spans);
      split_pieces(p, spans, individual ? Behavior::kIsolated : Behavior::kContiguous, &out);
    }
    *pieces = std::move(out);
  }
};

struct MetaspacePre : PreTokenizer {
  int32_t replacement = 0x2581;
  std::string rep;  // UTF-8 of replacement
  PrependScheme scheme = PrependScheme::kAlways;
  bool split = true;
  void apply(std::vector<Piece>* pieces, bool prefix) const override {
    std::vector<Piece> out;
    std::vector<Span> spans;
    for (Piece& p : *pieces) {
      if (p.s.find(' ') != std::string::npos) {
        Piece q;
        for (size_t i = 0; i < p.s.size(); ++i) {
          if (p.s[i] == ' ') {
            q.s += rep;
            q.orig.insert(q.orig.end(), rep.size(), p.orig[i]);
          } else {
            q.s += p.s[i];
            q.orig.push_back(p.orig[i]);
          }
        }
        p = std::move(q);
      }
      const bool starts = p.s.compare(0, rep.size(), rep) == 0;
      const bool at_start = !p.orig.empty() && p.orig.front() == 0;
      if (!starts && !no_prefix_for(p, prefix) &&
          (scheme == PrependScheme::kAlways || (scheme == PrependScheme::kFirst && at_start)))
        prepend(p, rep);
      if (split) {
        const int32_t r = replacement;
        char_spans(p.s, [r](int32_t c) { return c == r; }, &spans);
        split_pieces(p, spans, Behavior::kMergedWithNext, &out);
      } else if (!p.s.empty()) {
        out.push_back(std::move(p));
      }
    }
    *pieces = std::move(out);
  }
};

struct SequencePre : PreTokenizer {
  std::vector<std::unique_ptr<PreTokenizer>> items;
  void apply(std::vector<Piece>* pieces, bool prefix) const override {
    for (const auto& t : items) t->apply(pieces, prefix);
  }
};

Behavior parse_behavior(const Ctx& c, const json& j, const std::string& path) {
  const std::string b = get_str(c, j, path, "behavior");
  if (b == "Isolated") return Behavior::kIsolated;
  if (b == "Removed") return Behavior::kRemoved;
  if (b == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::kMergedWithNext;
  if (b == "Contiguous") return Behavior::kContiguous;
  jfail(c, join(path, "behavior"), "unsupported '", b, "'");
}

PrependScheme parse_scheme(const Ctx& c, const json& j, const std::string& path) {
  if (!j.contains("prepend_scheme") || j["prepend_scheme"].is_null()) {
    // tokenizers < 0.15 files: add_prefix_space (default true) instead of prepend_scheme.
    return opt_bool(c, j, path, "add_prefix_space", true) ? PrependScheme::kAlways : PrependScheme::kNever;
  }
  const std::string s = get_str(c, j, path, "prepend_scheme");
  if (s == "always") return PrependScheme::kAlways;
  if (s == "first") return PrependScheme::kFirst;
  if (s == "never") return PrependScheme::kNever;
  jfail(c, join(path, "prepend_scheme"), "unsupported '", s, "' (always, first, never)");
}

constexpr const char* kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::unique_ptr<PreTokenizer> parse_pre(const Ctx& c, const json& j, const std::string& path) {
  expect_object(c, j, path);
  const std::string type = get_str(c, j, path, "type");
  if (type == "ByteLevel") {
    auto t = std::make_unique<ByteLevelPre>();
    t->add_prefix_space = opt_bool(c, j, path, "add_prefix_space", true);
    t->use_regex = opt_bool(c, j, path, "use_regex", true);
    opt_bool(c, j, path, "trim_offsets", true);
    if (t->use_regex) t->re = std::make_unique<Regex>(kGpt2Regex, c, path);
    return t;
  }
  if (type == "Split") {
    auto t = std::make_unique<SplitPre>();
    t->pattern = std::make_unique<Pattern>(c, j, path);
    t->behavior = parse_behavior(c, j, path);
    t->invert = opt_bool(c, j, path, "invert", false);
    return t;
  }
  if (type == "Digits") {
    auto t = std::make_unique<DigitsPre>();
    t->individual = opt_bool(c, j, path, "individual_digits", false);
    return t;
  }
  if (type == "Metaspace") {
    auto t = std::make_unique<MetaspacePre>();
    t->replacement = get_char(c, j, path, "replacement", "\xE2\x96\x81");
    append_utf8(t->rep, t->replacement);
    t->scheme = parse_scheme(c, j, path);
    t->split = opt_bool(c, j, path, "split", true);
    return t;
  }
  if (type == "Sequence") {
    auto t = std::make_unique<SequencePre>();
    const json& a = get_arr(c, j, path, "pretokenizers");
    for (size_t i = 0; i < a.size(); ++i) t->items.push_back(parse_pre(c, a[i], idx(join(path, "pretokenizers"), i)));
    return t;
  }
  jfail(c, join(path, "type"), "unsupported '", type,
        "' (supported: ByteLevel, Split, Digits, Metaspace, Sequence)");
}

// ------------------------------------------------------------------------------------------
// Decoders: token strings -> token strings (decode_chain); the result is joined.

struct Decoder {
  virtual ~Decoder() = default;
  virtual void chain(std::vector<std::string>* tokens) const = 0;
};

struct ByteLevelDec : Decoder {
  void chain(std::vector<std::string>* tokens) const override {
    const ByteLevelTable& t = byte_level();
    std::string bytes;
    for (const std::string& tok : *tokens) {
      std::string b;
      bool all = true;
      for (size_t i = 0; i < tok.size() && all;) {
        int32_t cp;
        i += next_cp(tok.data(), tok.size(), i, &cp);
        auto it = t.cp_to_byte.find(cp);
        if (it == t.cp_to_byte.end()) all = false;
        else b += static_cast<char>(it->second);
      }
      bytes += all ? b : tok;
    }
    std::vector<uint32_t> unused;
    *tokens = {is_valid_utf8(bytes) ? bytes : utf8_lossy(bytes, &unused)};
  }
};

struct MetaspaceDec : Decoder {
  int32_t replacement = 0x2581;
  PrependScheme scheme = PrependScheme::kAlways;
  void chain(std::vector<std::string>* tokens) const override {
    for (size_t k = 0; k < tokens->size(); ++k) {
      const std::string& tok = (*tokens)[k];
      std::string o;
      for (size_t i = 0; i < tok.size();) {
        int32_t cp;
        const int n = next_cp(tok.data(), tok.size(), i, &cp);
        if (cp == replacement) {
          if (!(k == 0 && scheme != PrependScheme::kNever)) o += ' ';
        } else {
          o.append(tok, i, n);
        }
        i += n;
      }
      (*tokens)[k] = std::move(o);
    }
  }
};

struct ByteFallbackDec : Decoder {
  void chain(std::vector<std::string>* tokens) const override {
    std::vector<std::string> out;
    std::string pending;
    auto flush = [&]() {
      if (pending.empty()) return;
      if (is_valid_utf8(pending)) out.push_back(pending);
      else
        for (size_t i = 0; i < pending.size(); ++i) out.push_back("\xEF\xBF\xBD");
      pending.clear();
    };
    for (std::string& tok : *tokens) {
      auto hexv = [](char h) -> int {
        if (h >= '0' && h <= '9') return h - '0';
        if (h >= 'a' && h <= 'f') return h - 'a' + 10;
        if (h >= 'A' && h <= 'F') return h - 'A' + 10;
        return -1;
      };
      if (tok.size() == 6 && tok.compare(0, 3, "<0x") == 0 && tok[5] == '>' && hexv(tok[3]) >= 0 && hexv(tok[4]) >= 0) {
        pending += static_cast<char>(hexv(tok[3]) * 16 + hexv(tok[4]));
      } else {
        flush();
        out.push_back(std::move(tok));
      }
    }
    flush();
    *tokens = std::move(out);
  }
};

struct FuseDec : Decoder {
  void chain(std::vector<std::string>* tokens) const override {
    std::string s;
    for (const auto& t : *tokens) s += t;
    *tokens = {s};
  }
};

struct StripDec : Decoder {
  int32_t content = ' ';
  size_t start = 0, stop = 0;
  void chain(std::vector<std::string>* tokens) const override {
    for (std::string& tok : *tokens) {
      std::vector<std::pair<size_t, int32_t>> cps;  // (byte offset, code point)
      for (size_t i = 0; i < tok.size();) {
        int32_t cp;
        const int n = next_cp(tok.data(), tok.size(), i, &cp);
        cps.emplace_back(i, cp);
        i += n;
      }
      size_t a = 0, b = cps.size();
      for (size_t i = 0; i < std::min(start, cps.size()); ++i) {
        if (cps[i].second != content) break;
        a = i + 1;
      }
      for (size_t i = 0; i < stop && i < cps.size(); ++i) {
        const size_t k = cps.size() - i - 1;
        if (cps[k].second != content) break;
        b = k;
      }
      if (b < a) b = a;
      const size_t bb = a < cps.size() ? cps[a].first : tok.size();
      const size_t be = b < cps.size() ? cps[b].first : tok.size();
      tok = tok.substr(bb, be - bb);
    }
  }
};

struct ReplaceDec : Decoder {
  std::unique_ptr<Pattern> pattern;
  std::string content;
  void chain(std::vector<std::string>* tokens) const override {
    for (std::string& tok : *tokens) {
      Piece p{tok, std::vector<uint32_t>(tok.size(), 0)};
      replace_all(p, *pattern, content);
      tok = std::move(p.s);
    }
  }
};

struct SequenceDec : Decoder {
  std::vector<std::unique_ptr<Decoder>> items;
  void chain(std::vector<std::string>* tokens) const override {
    for (const auto& d : items) d->chain(tokens);
  }
};

std::unique_ptr<Decoder> parse_decoder(const Ctx& c, const json& j, const std::string& path) {
  expect_object(c, j, path);
  const std::string type = get_str(c, j, path, "type");
  if (type == "ByteLevel") return std::make_unique<ByteLevelDec>();
  if (type == "Metaspace") {
    auto d = std::make_unique<MetaspaceDec>();
    d->replacement = get_char(c, j, path, "replacement", "\xE2\x96\x81");
    d->scheme = parse_scheme(c, j, path);
    return d;
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDec>();
  if (type == "Fuse") return std::make_unique<FuseDec>();
  if (type == "Strip") {
    auto d = std::make_unique<StripDec>();
    d->content = get_char(c, j, path, "content", "");
    d->start = static_cast<size_t>(get_int(c, req(c, j, path, "start"), join(path, "start"), 0, 1 << 20));
    d->stop = static_cast<size_t>(get_int(c, req(c, j, path, "stop"), join(path, "stop"), 0, 1 << 20));
    return d;
  }
  if (type == "Replace") {
    auto d = std::make_unique<ReplaceDec>();
    d->pattern = std::make_unique<Pattern>(c, j, path);
    d->content = get_str(c, j, path, "content");
    return d;
  }
  if (type == "Sequence") {
    auto d = std::make_unique<SequenceDec>();
    const json& a = get_arr(c, j, path, "decoders");
    for (size_t i = 0; i < a.size(); ++i) d->items.push_back(parse_decoder(c, a[i], idx(join(path, "decoders"), i)));
    return d;
  }
  jfail(c, join(path, "type"), "unsupported '", type,
        "' (supported: ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, Sequence)");
}

// ------------------------------------------------------------------------------------------
// BPE model (models/bpe/model.rs, word.rs).

// (left id, right id) -> (rank, merged id): open addressing, linear probing (the merge loop's
// hot lookup; ids are < 2^31 so the all-ones key marks an empty slot).
class PairMap {
 public:
  using Value = std::pair<int32_t, int32_t>;
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n + 16) cap <<= 1;
    keys_.assign(cap, kEmpty);
    vals_.assign(cap, Value{0, 0});
    mask_ = cap - 1;
  }
  void set(uint64_t key, Value v) {  // later entries overwrite earlier ones (tokenizers collects a HashMap)
    if (keys_.empty() || 2 * (size_ + 1) > keys_.size()) grow();
    size_t i = slot(key);
    while (keys_[i] != kEmpty && keys_[i] != key) i = (i + 1) & mask_;
    if (keys_[i] == kEmpty) ++size_;
    keys_[i] = key;
    vals_[i] = v;
  }
  const Value* find(uint64_t key) const {
    if (keys_.empty()) return nullptr;
    for (size_t i = slot(key);; i = (i + 1) & mask_) {
      if (keys_[i] == key) return &vals_[i];
      if (keys_[i] == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t(0);
  size_t slot(uint64_t k) const {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return static_cast<size_t>(k) & mask_;
  }
  void grow() {
    std::vector<uint64_t> ok = std::move(keys_);
    std::vector<Value> ov = std::move(vals_);
    reserve(std::max<size_t>(16, ok.size()));
    size_ = 0;
    for (size_t i = 0; i < ok.size(); ++i)
      if (ok[i] != kEmpty) set(ok[i], ov[i]);
  }
  std::vector<uint64_t> keys_;
  std::vector<Value> vals_;
  size_t mask_ = 0, size_ = 0;
};

class BpeModel {
 public:
  void load(const Ctx& c, const json& m, const std::string& path);
  // Tokenizes one pre-tokenized piece; lens[i] = bytes of `piece` that token i covers. With
  // `raw_bytes` the piece holds raw bytes still to be mapped to the byte-level alphabet.
  void tokenize(const std::string& piece, bool raw_bytes, TokenIds* ids, std::vector<uint32_t>* lens) const;

  std::unordered_map<std::string, int32_t> vocab;
  std::unordered_map<int32_t, std::string> vocab_r;
  int32_t max_id = -1;
  std::string unk_token;  // "" = none

 private:
  void merge_word(const std::string& w, const std::vector<uint32_t>& units, TokenIds* ids,
                  std::vector<uint32_t>* lens) const;
  const std::pair<int32_t, int32_t>* merge(int32_t l, int32_t r) const {
    return merges_.find((uint64_t(uint32_t(l)) << 32) | uint32_t(r));
  }

  PairMap merges_;  // (left<<32|right) -> (rank, merged id)
  int32_t ascii_ids_[128];  // id of each ASCII character as a whole-word-free symbol, -1 if absent
  std::string prefix_, suffix_;
  bool byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false;
  int32_t byte_ids_[256];  // "<0xXX>" per byte, -1 if absent
  std::string file_;

  struct Entry {
    TokenIds ids;
    std::vector<uint32_t> lens;
  };
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, Entry> cache_;
  static constexpr size_t kCacheCapacity = 1 << 18;
  static constexpr size_t kCacheMaxLen = 256;  // tokenizers utils/cache.rs MAX_LENGTH
};

void BpeModel::load(const Ctx& c, const json& m, const std::string& path) {
  file_ = c.file;
  const std::string type = opt_str(c, m, path, "type", "BPE");
  if (type != "BPE")
    jfail(c, join(path, "type"), "unsupported '", type, "' (supported: BPE)");
  if (m.contains("dropout") && !m["dropout"].is_null()) {
    const json& d = m["dropout"];
    if (!d.is_number()) jfail(c, join(path, "dropout"), "expected a number or null, got ", type_of(d));
    if (d.get<double>() != 0.0) jfail(c, join(path, "dropout"), "unsupported BPE dropout ", d.dump(), " (must be null)");
  }
  unk_token = opt_str(c, m, path, "unk_token", "");
  prefix_ = opt_str(c, m, path, "continuing_subword_prefix", "");
  suffix_ = opt_str(c, m, path, "end_of_word_suffix", "");
  fuse_unk_ = opt_bool(c, m, path, "fuse_unk", false);
  byte_fallback_ = opt_bool(c, m, path, "byte_fallback", false);
  ignore_merges_ = opt_bool(c, m, path, "ignore_merges", false);

  const json& v = get_obj(c, m, path, "vocab");
  const std::string vp = join(path, "vocab");
  vocab.reserve(v.size());
  vocab_r.reserve(v.size());
  for (const auto& [k, val] : v.items()) {
    const int32_t id = get_id(c, val, vp + "." + k);
    if (!is_valid_utf8(k)) jfail(c, vp, "token is not valid UTF-8");
    auto [it, fresh] = vocab_r.emplace(id, k);
    if (!fresh) jfail(c, vp + "." + k, "duplicate id ", id, " (also '", it->second, "')");
    vocab.emplace(k, id);
    max_id = std::max(max_id, id);
  }
  std::fill(std::begin(byte_ids_), std::end(byte_ids_), -1);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = vocab.find(name);
    if (it != vocab.end()) byte_ids_[b] = it->second;
  }
  for (int ch = 0; ch < 128; ++ch) {
    auto it = vocab.find(std::string(1, static_cast<char>(ch)));
    ascii_ids_[ch] = it == vocab.end() ? -1 : it->second;
  }

  const json& ms = get_arr(c, m, path, "merges");
  const std::string mp = join(path, "merges");
  merges_.reserve(ms.size());
  for (size_t i = 0; i < ms.size(); ++i) {
    const json& e = ms[i];
    std::string a, b;
    if (e.is_string()) {  // "a b" (exactly one space)
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        jfail(c, idx(mp, i), "expected \"left right\" (one space), got '", s, "'");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      jfail(c, idx(mp, i), "expected \"left right\" or [\"left\", \"right\"], got ", e.dump().substr(0, 60));
    }
    auto ia = vocab.find(a), ib = vocab.find(b);
    if (ia == vocab.end()) jfail(c, idx(mp, i), "merge names unknown token '", a, "'");
    if (ib == vocab.end()) jfail(c, idx(mp, i), "merge names unknown token '", b, "'");
    if (b.size() < prefix_.size()) jfail(c, idx(mp, i), "right token '", b, "' shorter than continuing_subword_prefix");
    const std::string merged = a + b.substr(prefix_.size());
    auto im = vocab.find(merged);
    if (im == vocab.end()) jfail(c, idx(mp, i), "merged token '", merged, "' is not in the vocab");
    merges_.set((uint64_t(uint32_t(ia->second)) << 32) | uint32_t(ib->second), {static_cast<int32_t>(i), im->second});
  }
}

void BpeModel::tokenize(const std::string& piece, bool raw_bytes, TokenIds* ids, std::vector<uint32_t>* lens) const {
  if (piece.empty()) return;
  const bool cacheable = piece.size() < kCacheMaxLen;
  if (cacheable) {
    std::lock_guard<std::mutex> lk(cache_mu_);
    auto it = cache_.find(piece);
    if (it != cache_.end()) {
      ids->insert(ids->end(), it->second.ids.begin(), it->second.ids.end());
      lens->insert(lens->end(), it->second.lens.begin(), it->second.lens.end());
      return;
    }
  }
  // Word in the model's alphabet; units[i] = piece bytes behind byte i of w (0 for trailing
  // bytes of a character).
  std::string mapped;
  std::vector<uint32_t> units;
  const std::string* w = &piece;
  if (raw_bytes) {
    const ByteLevelTable& t = byte_level();
    mapped.reserve(piece.size() * 2);
    for (unsigned char b : piece) {
      const std::string& u = t.byte_to_utf8[b];
      mapped += u;
      units.push_back(1);
      for (size_t k = 1; k < u.size(); ++k) units.push_back(0);
    }
    w = &mapped;
  } else {
    units.assign(piece.size(), 1);
  }
  Entry e;
  auto whole = ignore_merges_ ? vocab.find(*w) : vocab.end();
  if (whole != vocab.end()) {
    e.ids.push_back(whole->second);
    e.lens.push_back(static_cast<uint32_t>(piece.size()));
  } else {
    merge_word(*w, units, &e.ids, &e.lens);
  }
  ids->insert(ids->end(), e.ids.begin(), e.ids.end());
  lens->insert(lens->end(), e.lens.begin(), e.lens.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lk(cache_mu_);
    if (cache_.size() < kCacheCapacity) cache_.emplace(piece, std::move(e));
  }
}

void BpeModel::merge_word(const std::string& w, const std::vector<uint32_t>& units, TokenIds* ids,
                          std::vector<uint32_t>* lens) const {
  struct Sym {
    int32_t id;
    uint32_t len;  // piece bytes
    int32_t prev, next;
    bool alive;
  };
  std::vector<Sym> syms;
  syms.reserve(w.size());
  auto add = [&](int32_t id, uint32_t len) {
    const int32_t n = static_cast<int32_t>(syms.size());
    syms.push_back({id, len, n - 1, n + 1, true});
  };
  int32_t unk_id = -1;
  uint32_t unk_len = 0;
  bool have_unk = false;
  std::string s;
  for (size_t i = 0; i < w.size();) {
    const int n = cp_len(static_cast<unsigned char>(w[i]));
    uint32_t plen = 0;
    for (int k = 0; k < n && i + k < w.size(); ++k) plen += units[i + k];
    const bool first = i == 0, last = i + n >= w.size();
    int32_t id = -1;
    if (prefix_.empty() && suffix_.empty() && n == 1 && static_cast<unsigned char>(w[i]) < 0x80 &&
        ascii_ids_[static_cast<unsigned char>(w[i])] >= 0) {
      id = ascii_ids_[static_cast<unsigned char>(w[i])];
    } else if (prefix_.empty() && suffix_.empty()) {
      auto it = vocab.find(w.substr(i, n));
      if (it != vocab.end()) id = it->second;
    } else {
      s.clear();
      if (!first) s += prefix_;
      s.append(w, i, n);
      if (last) s += suffix_;
      auto it = vocab.find(s);
      if (it != vocab.end()) id = it->second;
    }
    if (id >= 0) {
      if (have_unk) {
        add(unk_id, unk_len);
        have_unk = false;
      }
      add(id, plen);
    } else {
      std::string cs = (prefix_.empty() && suffix_.empty()) ? w.substr(i, n) : s;
      bool done = false;
      if (byte_fallback_) {
        bool all = true;
        for (unsigned char b : cs) all = all && byte_ids_[b] >= 0;
        if (all) {
          // tokenizers gives each byte token length 1 (in the word); spread the piece bytes.
          for (size_t k = 0; k < cs.size(); ++k) add(byte_ids_[static_cast<unsigned char>(cs[k])], k == 0 ? plen : 0);
          done = true;
        }
      }
      if (!done && !unk_token.empty()) {
        auto u = vocab.find(unk_token);
        if (u == vocab.end()) fail(file_, ": model.unk_token: '", unk_token, "' is not in the vocab");
        if (have_unk && fuse_unk_) {
          unk_len += plen;
        } else {
          if (have_unk) add(unk_id, unk_len);
          unk_id = u->second;
          unk_len = plen;
          have_unk = true;
        }
      }
    }
    i += n;
  }
  if (have_unk) add(unk_id, unk_len);
  if (!syms.empty()) syms.back().next = -1;

  struct Cand {
    int32_t rank, pos, merged;
  };
  auto worse = [](const Cand& a, const Cand& b) { return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos; };
  std::vector<Cand> heapv;
  heapv.reserve(syms.size());
  std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> heap(worse, std::move(heapv));
  for (size_t k = 0; k + 1 < syms.size(); ++k)
    if (auto m = merge(syms[k].id, syms[k + 1].id)) heap.push({m->first, int32_t(k), m->second});
  while (!heap.empty()) {
    const Cand cd = heap.top();
    heap.pop();
    Sym& sy = syms[cd.pos];
    if (!sy.alive || sy.next < 0) continue;
    Sym& r = syms[sy.next];
    auto m = merge(sy.id, r.id);
    if (!m || m->second != cd.merged) continue;
    sy.id = cd.merged;
    sy.len += r.len;
    r.alive = false;
    sy.next = r.next;
    if (sy.next >= 0) syms[sy.next].prev = cd.pos;
    if (sy.prev >= 0)
      if (auto pm = merge(syms[sy.prev].id, sy.id)) heap.push({pm->first, sy.prev, pm->second});
    if (sy.next >= 0)
      if (auto nm = merge(sy.id, syms[sy.next].id)) heap.push({nm->first, cd.pos, nm->second});
  }
  for (int32_t k = syms.empty() ? -1 : 0; k >= 0; k = syms[k].next) {
    ids->push_back(syms[k].id);
    lens->push_back(syms[k].len);
  }
}

// ------------------------------------------------------------------------------------------
// Added tokens (tokenizer/added_vocabulary.rs).

struct AddedToken {
  int32_t id;
  std::string content;  // as matched: content, or its normalized form for normalized tokens
  bool single_word, lstrip, rstrip, normalized, special;
};

// Leftmost-longest non-overlapping matching of a set of strings (what tokenizers' Aho-Corasick
// with MatchKind::LeftmostLongest gives), by first byte.
class AddedMatcher {
 public:
  void add(const std::string& s, size_t token) {
    if (s.empty()) return;
    by_first_[static_cast<unsigned char>(s[0])].emplace_back(s, token);
    any_ = true;
  }
  void finish() {
    for (auto& v : by_first_)
      std::stable_sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  }
  bool empty() const { return !any_; }
  // Longest entry matching at s[i]; returns the token index or -1.
  long match_at(const std::string& s, size_t i, size_t* len) const {
    for (const auto& [str, tok] : by_first_[static_cast<unsigned char>(s[i])]) {
      if (str.size() <= s.size() - i && s.compare(i, str.size(), str) == 0) {
        *len = str.size();
        return static_cast<long>(tok);
      }
    }
    return -1;
  }

 private:
  std::vector<std::pair<std::string, size_t>> by_first_[256];
  bool any_ = false;
};

// ------------------------------------------------------------------------------------------
// Post-processor: ids added around a single sequence.

void parse_post(const Ctx& c, const json& j, const std::string& path, TokenIds* prefix, TokenIds* suffix) {
  expect_object(c, j, path);
  const std::string type = get_str(c, j, path, "type");
  if (type == "ByteLevel") return;  // offsets only
  if (type == "Sequence") {
    const json& a = get_arr(c, j, path, "processors");
    for (size_t i = 0; i < a.size(); ++i) parse_post(c, a[i], idx(join(path, "processors"), i), prefix, suffix);
    return;
  }
  if (type != "TemplateProcessing")
    jfail(c, join(path, "type"), "unsupported '", type, "' (supported: TemplateProcessing, ByteLevel, Sequence)");
  const json& single = get_arr(c, j, path, "single");
  const json& specials = get_obj(c, j, path, "special_tokens");
  const std::string sp = join(path, "single"), stp = join(path, "special_tokens");
  bool seen_seq = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const json& it = single[i];
    const std::string ip = idx(sp, i);
    expect_object(c, it, ip);
    if (it.contains("Sequence")) {
      const json& s = get_obj(c, it, ip, "Sequence");
      if (get_str(c, s, ip + ".Sequence", "id") != "A") jfail(c, ip + ".Sequence.id", "expected \"A\" in a single template");
      if (seen_seq) jfail(c, ip, "sequence A appears twice");
      seen_seq = true;
    } else if (it.contains("SpecialToken")) {
      const json& s = get_obj(c, it, ip, "SpecialToken");
      const std::string name = get_str(c, s, ip + ".SpecialToken", "id");
      auto st = specials.find(name);
      if (st == specials.end()) jfail(c, ip + ".SpecialToken.id", "'", name, "' not in ", stp);
      const std::string stn = stp + "." + name;
      expect_object(c, *st, stn);
      const json& ids = get_arr(c, *st, stn, "ids");
      for (size_t k = 0; k < ids.size(); ++k) (seen_seq ? suffix : prefix)->push_back(get_id(c, ids[k], idx(stn + ".ids", k)));
    } else {
      jfail(c, ip, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
    }
  }
  if (!seen_seq) jfail(c, sp, "no {\"Sequence\": {\"id\": \"A\"}} item");
}

// ------------------------------------------------------------------------------------------

class JsonBackend final : public TokenizerBackend {
 public:
  JsonBackend(const std::string& path, const json* class_pipeline);
  TokenIds encode(const std::string& text, std::vector<int64_t>* offsets, bool prefix) const override;
  std::string decode(const TokenIds& ids, bool skip_special_tokens, const Tokenizer& facade) const override;
  std::string id_to_piece(int32_t id) const override {
    if (auto it = added_by_id_.find(id); it != added_by_id_.end()) return added_[it->second].content_raw;
    if (auto it = model_.vocab_r.find(id); it != model_.vocab_r.end()) return it->second;
    return "";
  }
  int32_t piece_to_id(const std::string& piece) const override {
    if (auto it = added_by_content_.find(piece); it != added_by_content_.end()) return added_[it->second].id;
    if (auto it = model_.vocab.find(piece); it != model_.vocab.end()) return it->second;
    return -1;
  }
  int32_t vocab_size() const override { return max_id_ + 1; }
  bool is_special(int32_t id) const override {
    auto it = added_by_id_.find(id);
    return it != added_by_id_.end() && added_[it->second].special;
  }
  FileSpecials specials() const override { return specials_; }

 private:
  struct Added : AddedToken {
    std::string content_raw;
  };
  void split_added(const Piece& p, const AddedMatcher& m, std::vector<std::pair<long, Piece>>* out) const;
  void run_model(std::vector<Piece>& pieces, TokenIds* ids, std::vector<int64_t>* offs) const;

  Ctx ctx_;
  BpeModel model_;
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_;
  std::unique_ptr<Decoder> decoder_;
  std::vector<Added> added_;
  std::unordered_map<int32_t, size_t> added_by_id_;
  std::unordered_map<std::string, size_t> added_by_content_;
  AddedMatcher raw_matcher_, norm_matcher_;
  bool defer_bytelevel_ = false;
  int32_t max_id_ = -1;
  FileSpecials specials_;
};

JsonBackend::JsonBackend(const std::string& path, const json* class_pipeline) {
  ctx_.file = path;
  const Ctx& c = ctx_;
  check_regular_file(path);
  QLORA_CHECK(std::filesystem::is_regular_file(path), path, ": tokenizer.json not found", relative_path_note(path));
  const json j = read_json_object_file(path);

  model_.load(c, get_obj(c, j, "", "model"), "model");
  max_id_ = model_.max_id;

  if (j.contains("normalizer") && !j["normalizer"].is_null()) normalizer_ = parse_normalizer(c, j["normalizer"], "normalizer");
  if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null()) pre_ = parse_pre(c, j["pre_tokenizer"], "pre_tokenizer");
  if (j.contains("decoder") && !j["decoder"].is_null()) decoder_ = parse_decoder(c, j["decoder"], "decoder");
  if (class_pipeline) {
    // a transformers 5 class that rebuilds these three whatever the file says (LlamaTokenizer,
    // Qwen2Tokenizer). The file's own ones were still parsed above, so a malformed one is an error
    // either way.
    const json& p = *class_pipeline;
    normalizer_.reset();
    if (!p["normalizer"].is_null()) normalizer_ = parse_normalizer(c, p["normalizer"], "normalizer");
    pre_ = parse_pre(c, p["pre_tokenizer"], "pre_tokenizer");
    decoder_ = parse_decoder(c, p["decoder"], "decoder");
  }
  if (j.contains("post_processor") && !j["post_processor"].is_null()) {
    parse_post(c, j["post_processor"], "post_processor", &specials_.prefix, &specials_.suffix);
  }
  // ByteLevel as the last pre-tokenizer: let the model map bytes (its cache then keys raw bytes).
  PreTokenizer* last = pre_.get();
  while (auto* s = dynamic_cast<SequencePre*>(last)) last = s->items.empty() ? nullptr : s->items.back().get();
  if (auto* bl = dynamic_cast<ByteLevelPre*>(last)) {
    bl->defer_mapping = true;
    defer_bytelevel_ = true;
  }

  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
    const json& a = get_arr(c, j, "", "added_tokens");
    for (size_t i = 0; i < a.size(); ++i) {
      const std::string p = idx("added_tokens", i);
      expect_object(c, a[i], p);
      Added t;
      t.id = get_id(c, req(c, a[i], p, "id"), p + ".id");
      t.content_raw = get_str(c, a[i], p, "content");
      if (t.content_raw.empty()) jfail(c, p + ".content", "empty");
      if (!is_valid_utf8(t.content_raw)) jfail(c, p + ".content", "not valid UTF-8");
      t.special = opt_bool(c, a[i], p, "special", false);
      t.single_word = opt_bool(c, a[i], p, "single_word", false);
      t.lstrip = opt_bool(c, a[i], p, "lstrip", false);
      t.rstrip = opt_bool(c, a[i], p, "rstrip", false);
      t.normalized = opt_bool(c, a[i], p, "normalized", !t.special);
      if (added_by_id_.count(t.id)) jfail(c, p + ".id", "duplicate id ", t.id);
      if (added_by_content_.count(t.content_raw)) jfail(c, p + ".content", "duplicate token '", t.content_raw, "'");
      if (auto v = model_.vocab.find(t.content_raw); v != model_.vocab.end() && v->second != t.id)
        jfail(c, p + ".id", "id ", t.id, " but the model vocab has '", t.content_raw, "' = ", v->second);
      if (auto v = model_.vocab_r.find(t.id); v != model_.vocab_r.end() && v->second != t.content_raw)
        jfail(c, p + ".id", "duplicate id ", t.id, ": the model vocab has '", v->second, "'");
      t.content = t.content_raw;
      if (t.normalized && normalizer_) {
        Piece q{t.content, std::vector<uint32_t>(t.content.size(), 1)};
        normalizer_->apply(q, false);
        t.content = q.s;
      }
      added_by_id_[t.id] = added_.size();
      added_by_content_[t.content_raw] = added_.size();
      max_id_ = std::max(max_id_, t.id);
      added_.push_back(std::move(t));
    }
  }
  for (size_t i = 0; i < added_.size(); ++i) (added_[i].normalized ? norm_matcher_ : raw_matcher_).add(added_[i].content, i);
  raw_matcher_.finish();
  norm_matcher_.finish();
  if (!model_.unk_token.empty()) specials_.unk = piece_to_id(model_.unk_token);
}

// AddedVocabulary::find_matches on one piece: alternating text pieces (index -1) and added
// tokens (index into added_).
void JsonBackend::split_added(const Piece& p, const AddedMatcher& m, std::vector<std::pair<long, Piece>>* out) const {
  if (m.empty()) {
    out->emplace_back(-1, p);
    return;
  }
  const std::string& s = p.s;
  size_t start_offset = 0;
  for (size_t i = 0; i < s.size();) {
    size_t len = 0;
    const long t = m.match_at(s, i, &len);
    if (t < 0) {
      ++i;
      continue;
    }
    const Added& a = added_[t];
    size_t start = i, stop = i + len;
    bool keep = true;
    if (a.single_word) {
      int32_t cp = 0;
      bool before_word = false, after_word = false;
      if (start > 0) {
        size_t b = start - 1;
        while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
        next_cp(s.data(), s.size(), b, &cp);
        before_word = is_word_char(cp);
      }
      if (stop < s.size()) {
        next_cp(s.data(), s.size(), stop, &cp);
        after_word = is_word_char(cp);
      }
      keep = !before_word && !after_word;
    }
    if (!keep) {
      i = stop;  // the matcher resumes after a discarded match
      continue;
    }
    if (a.lstrip) {
      size_t b = start;  // leftmost start of the whitespace run ending at `start`
      while (b > 0) {
        size_t q = b - 1;
        while (q > 0 && (static_cast<unsigned char>(s[q]) & 0xC0) == 0x80) --q;
        int32_t cp;
        next_cp(s.data(), s.size(), q, &cp);
        if (!is_white_space(cp)) break;
        b = q;
      }
      start = std::max(b, start_offset);
    }
    if (a.rstrip) {
      while (stop < s.size()) {
        int32_t cp;
        const int k = next_cp(s.data(), s.size(), stop, &cp);
        if (!is_white_space(cp)) break;
        stop += k;
      }
    }
    if (start_offset < start) out->emplace_back(-1, slice(p, start_offset, start));
    out->emplace_back(t, slice(p, start, stop));
    start_offset = stop;
    i = stop;
  }
  if (start_offset < s.size()) out->emplace_back(-1, slice(p, start_offset, s.size()));
}

void JsonBackend::run_model(std::vector<Piece>& pieces, TokenIds* ids, std::vector<int64_t>* offs) const {
  std::vector<uint32_t> lens;
  for (const Piece& p : pieces) {
    const size_t first = ids->size();
    lens.clear();
    model_.tokenize(p.s, defer_bytelevel_, ids, &lens);
    if (offs) {
      uint32_t at = 0;
      for (size_t k = first; k < ids->size(); ++k) {
        offs->push_back(p.orig[std::min<size_t>(at, p.orig.size() - 1)]);
        at += lens[k - first];
      }
    }
  }
}

TokenIds JsonBackend::encode(const std::string& raw, std::vector<int64_t>* offsets, bool prefix) const {
  QLORA_CHECK(raw.size() < (size_t(1) << 31), ctx_.file, ": text of ", raw.size(), " bytes is too long to tokenize");
  TokenIds ids;
  std::vector<int64_t> offs_local;
  std::vector<int64_t>* offs = offsets ? &offs_local : nullptr;
  if (offsets) offsets->clear();
  std::vector<uint32_t> to_raw;
  std::string lossy;
  const bool valid = is_valid_utf8(raw);
  if (!valid) lossy = utf8_lossy(raw, &to_raw);
  const std::string& text = valid ? raw : lossy;
  if (text.empty()) return ids;

  Piece whole;
  whole.s = text;
  whole.orig.resize(text.size());
  for (size_t i = 0; i < text.size(); ++i) whole.orig[i] = static_cast<uint32_t>(i);

  std::vector<std::pair<long, Piece>> level1, level2;
  split_added(whole, raw_matcher_, &level1);
  std::vector<Piece> pieces;
  for (auto& [t1, p1] : level1) {
    if (t1 >= 0) {
      ids.push_back(added_[t1].id);
      if (offs) offs->push_back(p1.orig.front());
      continue;
    }
    if (normalizer_) normalizer_->apply(p1, no_prefix_for(p1, prefix));
    if (p1.s.empty()) continue;
    level2.clear();
    split_added(p1, norm_matcher_, &level2);
    for (auto& [t2, p2] : level2) {
      if (t2 >= 0) {
        ids.push_back(added_[t2].id);
        if (offs) offs->push_back(p2.orig.front());
        continue;
      }
      pieces.clear();
      pieces.push_back(std::move(p2));
      if (pre_) pre_->apply(&pieces, prefix);
      run_model(pieces, &ids, offs);
    }
  }
  if (offsets) {
    offsets->reserve(offs_local.size());
    for (int64_t o : offs_local) offsets->push_back(valid ? o : int64_t(to_raw[size_t(o)]));
  }
  return ids;
}

std::string JsonBackend::decode(const TokenIds& ids, bool skip_special_tokens, const Tokenizer&) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (auto it = added_by_id_.find(id); it != added_by_id_.end()) {
      const Added& a = added_[it->second];
      if (skip_special_tokens && a.special) continue;
      tokens.push_back(a.content_raw);
    } else if (auto v = model_.vocab_r.find(id); v != model_.vocab_r.end()) {
      tokens.push_back(v->second);
    }
  }
  if (!decoder_) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  decoder_->chain(&tokens);
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

}  // namespace

std::unique_ptr<TokenizerBackend> load_hf_json(const std::string& path, const json* class_pipeline) {
  return std::make_unique<JsonBackend>(path, class_pipeline);
}

}  // namespace qlora::data::detail
