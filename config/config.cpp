// qlora-cpp training config: YAML -> overrides -> strict schema walk -> typed structs.
//
// The schema is one field table per section (visit_fields, "the field table" below); the key
// lists, the reader, to_yaml, operator== and config_keys() (docs/config.md's test) all walk it.
//
// The schema walk never uses yaml-cpp's as<T>() conversions: every value is classified here so the
// rules are ours and documented (docs/config.md): YAML 1.2 core numbers and booleans, quoted
// scalars are always strings, unknown keys are errors with a did-you-mean, and every message is one
// line that starts with `file:line:` (or the `--set` override that supplied the value).
#include "common/files.h"
#include "config/config.h"
#include "common/format.h"
#include "common/safetensors.h"
#include "model/model_config.h"

#include <yaml-cpp/yaml.h>  // the emitter only (to_yaml); parsing is common/yaml.h (libyaml)

#include <algorithm>
#include <filesystem>
#include <cstring>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <limits>
#include <locale>
#include <map>
#include <optional>
#include <sstream>
#include <type_traits>
#include <utility>

#include "common/error.h"
#include "common/gguf.h"
#include "common/utf8.h"
#include "common/yaml.h"

namespace qlora {
namespace {

// The schema's keys are declared once, in the field table (visit_fields, below); these are its
// per-section key lists, built from it, for the unknown-key checks and their did-you-means.
struct SchemaSection {
  std::string name;               // "" = the top level
  std::vector<std::string> keys;  // in table order
};
const std::vector<SchemaSection>& schema_sections();
const std::vector<std::string>& section_keys(const std::string& name);

// The names each choice key accepts. For an enum (or bool) member a name's position is its value
// (kDTypes[int(DType::kFP32)] == "fp32"; kInits[random_init]), so the orders here are the enums'.
// The quant method is an optional kernels::Quant4Type: NF4, FP4, then none (choice_index below).
const std::vector<std::string> kDTypes = {dtype_name(DType::kBF16), dtype_name(DType::kFP16),
                                          dtype_name(DType::kFP32), dtype_name(DType::kAuto)};
const std::vector<std::string> kQuantMethods = {quant_method_name(kernels::Quant4Type::NF4),
                                                quant_method_name(kernels::Quant4Type::FP4),
                                                quant_method_name(std::nullopt)};
const std::vector<std::string> kSchedulers = {"constant", "linear", "cosine", "constant_with_warmup", "polynomial",
                                              "cosine_with_restarts"};
const std::vector<std::string> kInits = {"pretrained", "random"};
const std::vector<std::string> kFormats = {"auto", "alpaca", "sharegpt", "messages", "completion"};
// = data::template_names() plus "auto" (resolved from the model's chat template when the data
// is loaded: data::resolve_template). Keep in sync (tests/badinput pins this list).
const std::vector<std::string> kTemplates = {"alpaca", "chatml",  "llama2", "vicuna", "none", "smollm2",
                                             "qwen2.5", "qwen3", "llama3", "llama3.1", "llama3.2", "mistral", "auto"};
const std::vector<std::string> kTruncations = {"drop", "truncate", "split"};
const std::vector<std::string> kPaddingSides = {"right", "left"};

// ---- small string helpers ----

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

/// `s` made safe for a one-line message: control characters escaped, long text cut.
std::string one_line(const std::string& s, size_t max_len = 60) {
  std::string out;
  for (char c : s) {
    if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (static_cast<unsigned char>(c) < 0x20) out += '?';
    else out += c;
    if (out.size() >= max_len) return out + "...";
  }
  return out;
}

// ---- YAML 1.2 core-schema scalars (plus `_` digit separators) ----

bool is_plain(const yaml::Node& n) { return n.is_scalar() && n.plain; }

/// Removes `_` digit separators; nullopt when an underscore is not between two alphanumerics.
std::optional<std::string> strip_underscores(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '_') {
      out += s[i];
      continue;
    }
    if (i == 0 || i + 1 == s.size() || !std::isalnum(static_cast<unsigned char>(s[i - 1])) ||
        !std::isalnum(static_cast<unsigned char>(s[i + 1])))
      return std::nullopt;
  }
  return out;
}

/// Integer in YAML 1.2 core notation: [-+]?[0-9]+ | 0o[0-7]+ | 0x[0-9a-fA-F]+ (`_` separators ok).
/// nullopt when not an integer or out of int64 range.
std::optional<int64_t> parse_int(const std::string& text) {
  auto s = strip_underscores(text);
  if (!s || s->empty()) return std::nullopt;
  size_t i = 0;
  bool neg = false;
  if ((*s)[0] == '+' || (*s)[0] == '-') neg = (*s)[0] == '-', i = 1;
  int base = 10;
  if (s->compare(i, 2, "0x") == 0) base = 16, i += 2;
  else if (s->compare(i, 2, "0o") == 0) base = 8, i += 2;
  if (i >= s->size()) return std::nullopt;
  const std::string digits = s->substr(i);
  for (char c : digits) {
    const bool ok = base == 16 ? std::isxdigit(static_cast<unsigned char>(c)) != 0
                               : (c >= '0' && c < static_cast<char>('0' + base));
    if (!ok) return std::nullopt;
  }
  errno = 0;
  const unsigned long long mag = std::strtoull(digits.c_str(), nullptr, base);
  if (errno == ERANGE) return std::nullopt;
  const unsigned long long lim = static_cast<unsigned long long>(std::numeric_limits<int64_t>::max());
  if (mag > lim + (neg ? 1 : 0)) return std::nullopt;
  if (neg) return mag == lim + 1 ? std::numeric_limits<int64_t>::min() : -static_cast<int64_t>(mag);
  return static_cast<int64_t>(mag);
}

/// Float in YAML 1.2 core notation: [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?, .inf, .nan.
std::optional<double> parse_float(const std::string& text) {
  auto so = strip_underscores(text);
  if (!so || so->empty()) return std::nullopt;
  const std::string& s = *so;
  size_t i = 0;
  double sign = 1.0;
  if (s[0] == '+' || s[0] == '-') sign = s[0] == '-' ? -1.0 : 1.0, i = 1;
  const std::string rest = s.substr(i);
  if (rest == ".inf" || rest == ".Inf" || rest == ".INF") return sign * HUGE_VAL;
  if (i == 0 && (rest == ".nan" || rest == ".NaN" || rest == ".NAN")) return std::nan("");
  size_t int_digits = 0, frac_digits = 0;
  auto digit = [&](size_t k) { return k < s.size() && s[k] >= '0' && s[k] <= '9'; };
  while (digit(i)) ++i, ++int_digits;
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (digit(i)) ++i, ++frac_digits;
  }
  if (int_digits == 0 && frac_digits == 0) return std::nullopt;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    size_t exp_digits = 0;
    while (digit(i)) ++i, ++exp_digits;
    if (exp_digits == 0) return std::nullopt;
  }
  if (i != s.size()) return std::nullopt;
  std::istringstream is(s);
  is.imbue(std::locale::classic());
  double v = 0;
  is >> v;
  if (is.fail()) return std::strtod(s.c_str(), nullptr);  // out of range: inf (then rejected) or ~0
  return v;
}

bool is_null_word(const std::string& s) { return s == "~" || s == "null" || s == "Null" || s == "NULL"; }
bool is_true_word(const std::string& s) { return s == "true" || s == "True" || s == "TRUE"; }
bool is_false_word(const std::string& s) { return s == "false" || s == "False" || s == "FALSE"; }
/// YAML 1.1 booleans that YAML 1.2 (and this parser) reads as plain strings.
bool is_yaml11_bool_word(const std::string& s) {
  std::string l;
  for (char c : s) l += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return l == "yes" || l == "no" || l == "on" || l == "off" || l == "y" || l == "n";
}

/// What a node is, for "got ..." in messages.
std::string describe(const yaml::Node& n) {
  if (n.is_null()) return "nothing (an empty value)";
  if (n.is_sequence()) return "a list";
  if (n.is_map()) return "a map";
  const std::string& v = n.value;
  if (is_plain(n) && (parse_int(v) || parse_float(v) || is_true_word(v) || is_false_word(v)))
    return one_line(v);  // a number or boolean: shown as written
  const std::string q = "\"" + one_line(v) + "\"";
  return is_plain(n) ? q : q + " (a quoted string)";
}

// ---- where a value came from, and the schema walk ----

// Errors are collected, not thrown one at a time: a config converted from Axolotl often has many
// wrong keys, and each run of `qlora train` should name all of them. The reader records every
// error whose key can be skipped on its own (report(): unknown, duplicate and misplaced keys, type
// and range errors; the value keeps its default) and goes on; throw_if_errors() then throws them
// all as one qlora::Error, one line each. The cross-key checks (a section's `check`) need valid
// values, so they run only once the per-key errors are clear (read_config); they are collected the
// same way. Errors after which nothing sensible can be read (YAML syntax, a malformed `--set`, a
// top level that is not a map) are thrown at once, before the reading starts (fail, fail_at).

/// At most this many errors are listed; a last line counts the rest.
constexpr size_t kMaxListedErrors = 50;

struct Context {
  std::string source;                            // file name for messages
  std::map<std::string, std::string> overrides;  // dotted key -> "--set key=value"
  /// Config::key_sources being collected: each key a Section holds -> where() it was set.
  mutable std::map<std::string, std::string> key_sources;
  /// One recorded error: where it is in `source` (line -1: nowhere in it, e.g. a missing key or
  /// a --set) and its text.
  struct Problem {
    int64_t line, column;
    std::string text;
  };
  mutable std::vector<Problem> problems;  // in the order found

  /// `file:line` of `mark`, or the override that set `path` (or a section above it).
  std::string where(const std::string& path, const yaml::Mark& mark) const {
    if (const std::string* o = override_of(path)) return *o;
    if (mark.is_null() || mark.line < 0) return source;
    return source + ":" + std::to_string(mark.line + 1);
  }

  /// Records the error "where: path: msg" and returns (the caller keeps the value's default).
  void report(const std::string& path, const yaml::Mark& mark, const std::string& msg) const {
    std::string text = where(path, mark) + ": " + (path.empty() ? std::string() : path + ": ") + msg;
    for (const Problem& p : problems)
      if (p.text == text) return;  // the same node read twice says it once
    const bool in_file = !override_of(path) && !mark.is_null() && mark.line >= 0;
    problems.push_back({in_file ? mark.line : -1, in_file ? mark.column : -1, std::move(text)});
  }

  /// Records the error, then throws every error recorded (throw_if_errors).
  [[noreturn]] void fail_at(const std::string& path, const yaml::Mark& mark, const std::string& msg) const {
    report(path, mark, msg);
    throw_if_errors();
    fail("internal: config error not thrown");  // unreachable: report recorded one
  }

  /// Throws the errors recorded so far, if any: one line per error, those at a place in the file
  /// first, in file order (line, then column), then the others (missing keys, --set overrides) in
  /// the order found. One error is a plain qlora::Error whose message is that line (as before
  /// errors were collected); several are an ErrorList. A config with errors is never returned.
  void throw_if_errors() const {
    if (problems.empty()) return;
    std::vector<Problem> sorted = problems;
    std::stable_sort(sorted.begin(), sorted.end(), [](const Problem& a, const Problem& b) {
      if ((a.line < 0) != (b.line < 0)) return b.line < 0;
      return a.line != b.line ? a.line < b.line : a.column < b.column;
    });
    std::vector<std::string> lines;
    for (size_t i = 0; i < sorted.size() && i < kMaxListedErrors; ++i) lines.push_back(sorted[i].text);
    if (sorted.size() > kMaxListedErrors)
      lines.push_back(source + ": " + std::to_string(sorted.size() - kMaxListedErrors) + " more errors not listed");
    if (lines.size() == 1) throw Error(lines[0]);
    throw ErrorList(lines);
  }

 private:
  /// The `--set` that set `path` or a section above it; nullptr when the file did.
  const std::string* override_of(const std::string& path) const {
    std::string p = path;
    while (!p.empty()) {
      auto it = overrides.find(p);
      if (it != overrides.end()) return &it->second;
      const size_t cut = p.find_last_of(".[");
      if (cut == std::string::npos) break;
      p.resize(cut);
    }
    return nullptr;
  }
};

/// `~` and environment variables in a path value (POSIX shell rules, a subset): a leading "~" or
/// "~/" is $HOME; "${NAME}" and "$NAME" (NAME = [A-Za-z_][A-Za-z0-9_]*) are the variable's value;
/// "$$" is a literal "$"; any other "$" stays as it is. An undefined variable (or $HOME for "~")
/// sets `why` and returns "". "~user" is not expanded.
std::string expand_path(const std::string& v, std::string* why) {
  std::string out;
  size_t i = 0;
  if (!v.empty() && v[0] == '~' && (v.size() == 1 || v[1] == '/')) {
    const char* home = std::getenv("HOME");
    if (!home || !*home) {
      *why = "cannot expand \"~\": HOME is not set";
      return "";
    }
    out = home;
    i = 1;
  }
  auto name_char = [](char c, bool first) {
    return c == '_' || std::isalpha(static_cast<unsigned char>(c)) || (!first && std::isdigit(static_cast<unsigned char>(c)));
  };
  while (i < v.size()) {
    if (v[i] != '$' || i + 1 == v.size()) {
      out += v[i++];
      continue;
    }
    std::string name;
    size_t next;
    if (v[i + 1] == '$') {
      out += '$';
      i += 2;
      continue;
    } else if (v[i + 1] == '{') {
      const size_t close = v.find('}', i + 2);
      if (close == std::string::npos) {
        *why = "unterminated \"${\" in \"" + v + "\"";
        return "";
      }
      name = v.substr(i + 2, close - i - 2);
      bool ok = !name.empty() && name_char(name[0], true);
      for (char c : name) ok = ok && name_char(c, false);
      if (!ok) {
        *why = "\"${" + name + "}\" is not a variable name";
        return "";
      }
      next = close + 1;
    } else if (name_char(v[i + 1], true)) {
      next = i + 1;
      while (next < v.size() && name_char(v[next], false)) ++next;
      name = v.substr(i + 1, next - i - 1);
    } else {
      out += v[i++];
      continue;
    }
    const char* val = std::getenv(name.c_str());
    if (!val) {
      *why = "environment variable " + name + " is not defined (in \"" + v + "\")";
      return "";
    }
    out += val;
    i = next;
  }
  return out;
}

/// One YAML map of the schema: checks its keys on construction (duplicates, unknown keys with a
/// did-you-mean), then hands out typed values; each getter checks type and range. A problem is
/// reported to the Context (Context::report) and the getter returns the default it was given, so
/// reading goes on and every problem of the config is found in one pass.
class Section {
 public:
  /// `node` is the section's value (undefined or null: empty section); `key_mark` is where its
  /// key sits (for "missing key" errors); `path` is its dotted name ("" for the top level).
  /// `unknown`: what the section holds is not known (a required section that is missing, or one
  /// inside such a section; a value that is not a map is found here), so none of its keys is
  /// reported missing: that is one error, already reported.
  Section(const Context& ctx, std::string path, const yaml::Node& node, yaml::Mark key_mark,
          const std::vector<std::string>& keys, bool unknown = false)
      : ctx_(ctx), path_(std::move(path)), mark_(key_mark), keys_(keys), unknown_(unknown) {
    if (!node.is_defined() || node.is_null()) return;
    if (!node.is_map()) {
      ctx_.report(path_, node.mark,
                  "expected a map of " + (path_.empty() ? std::string("sections") : "keys") + ", got " +
                      describe(node));
      unknown_ = true;
      return;
    }
    for (const auto& [k, v] : node.entries) {
      if (!k.is_scalar() || k.value.empty()) {
        ctx_.report(path_, k.mark, "keys must be plain names, got " + describe(k));
        continue;
      }
      const std::string& name = k.value;
      const std::string full = key_path(name);
      if (const Entry* first = find(name)) {
        ctx_.report(full, k.mark, "duplicate key (first set on line " + std::to_string(first->key_mark.line + 1) + ")");
        continue;
      }
      if (!contains(keys_, name)) {
        ctx_.report(full, k.mark, unknown_key_message(name));
        continue;
      }
      entries_.push_back({name, k.mark, v});
      ctx_.key_sources[full] = ctx_.where(full, v.mark.is_null() ? k.mark : v.mark);
    }
  }

  bool has(const std::string& key) const { return find(key) != nullptr; }
  std::string key_path(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

  /// Reports a one-line error about `key` (at its value when present, else at the section).
  void error(const std::string& key, const std::string& msg) const {
    const auto* e = find(key);
    ctx_.report(key_path(key), e ? e->value.mark : mark_, msg);
  }
  /// Reports a one-line error about item `i` of the list under `key`.
  void item_error(const std::string& key, size_t i, const std::string& msg) const {
    ctx_.report(item_path(key, i), item_mark(key, i), msg);
  }
  /// "key[i]" under this section (data.train[1]).
  std::string item_path(const std::string& key, size_t i) const { return key_path(key) + "[" + std::to_string(i) + "]"; }
  /// Where item `i` of the list under `key` sits (the section's mark when there is no such item).
  yaml::Mark item_mark(const std::string& key, size_t i) const {
    const auto* e = find(key);
    return e && e->value.is_sequence() && i < e->value.items.size() ? e->value.items[i].mark : mark_;
  }
  /// Item `i` of the list under `key` (a map) read as a section of its own, named "key[i]",
  /// with `keys` (a static list); its errors name e.g. data.train[1].format.
  Section item_section(const std::string& key, size_t i, const std::vector<std::string>& keys) const {
    const yaml::Node& item = find(key)->value.items.at(i);
    return Section(ctx_, item_path(key, i), item, item.mark, keys);
  }
  /// Reports that required `key` is missing (unless the section itself is unknown: it is missing
  /// or not a map, and that is the error).
  void missing(const std::string& key) const {
    if (!unknown_) error(key, "required key is missing");
  }
  /// Reports a one-line error about the section itself.
  void section_error(const std::string& msg) const { ctx_.report(path_, mark_, msg); }
  /// Errors reported so far (to the whole config): a reader compares two counts to learn whether
  /// a part of a value was refused.
  size_t errors() const { return ctx_.problems.size(); }
  /// Where `key` was set (Context::where), recorded in Config::key_sources under `path`.
  void record_source(const std::string& path, const yaml::Mark& mark) const { ctx_.key_sources[path] = ctx_.where(path, mark); }

  /// A nested section; `required`: its absence is an error (reported; the section then reads as
  /// unknown, so its own required keys are not reported too).
  Section sub(const std::string& key, const std::vector<std::string>& keys, bool required) const {
    const auto* e = find(key);
    if (!e) {
      const bool reported = required && !unknown_;
      if (reported) ctx_.report(key_path(key), mark_, "required section is missing");
      return Section(ctx_, key_path(key), yaml::Node(), mark_, keys, reported || unknown_);
    }
    return Section(ctx_, key_path(key), e->value, e->key_mark, keys);
  }

  /// The raw value node of `key` (nullptr when absent). For keys with a shape of their own.
  const yaml::Node* raw(const std::string& key) const {
    const auto* e = find(key);
    return e ? &e->value : nullptr;
  }

  /// `key`'s string into *out (absent: `def`); false after reporting a problem (*out untouched):
  /// not a scalar, empty where `allow_empty` is false, or absent where it is required (no
  /// `allow_empty` and an empty `def`).
  bool read_string(const std::string& key, const std::string& def, bool allow_empty, std::string* out) const {
    const auto* e = find(key);
    if (!e) {
      if (!allow_empty && def.empty()) {
        missing(key);
        return false;
      }
      *out = def;
      return true;
    }
    std::string v;
    if (e->value.is_null()) {
      v = "";
    } else if (e->value.is_scalar()) {
      v = e->value.value;
    } else {
      error(key, "expected a string, got " + describe(e->value));
      return false;
    }
    if (v.empty() && !allow_empty) {
      error(key, "expected a non-empty string, got " + describe(e->value));
      return false;
    }
    *out = v;
    return true;
  }

  /// read_string's value; `def` after a reported problem.
  std::string get_string(const std::string& key, const std::string& def, bool allow_empty) const {
    std::string v = def;
    read_string(key, def, allow_empty, &v);
    return v;
  }

  /// A path key: get_string, then `~` and environment variables expanded (expand_path).
  std::string get_path(const std::string& key, const std::string& def, bool allow_empty) const {
    std::string raw;
    if (!read_string(key, def, allow_empty, &raw)) return def;
    std::string why;
    const std::string v = expand_path(raw, &why);
    if (!why.empty()) {
      error(key, why);
      return def;
    }
    if (v.empty() && !allow_empty) {
      error(key, "expected a non-empty path, got \"" + raw + "\" (after expansion)");
      return def;
    }
    return v;
  }

  /// One of `choices`; `alias` (optional) maps another accepted spelling to its name in `choices`
  /// (nullptr: not one), and `alias_note` says those spellings in the error message.
  std::string get_choice(const std::string& key, const std::string& def, const std::vector<std::string>& choices,
                         const char* (*alias)(const std::string&) = nullptr, const char* alias_note = nullptr) const {
    const auto* e = find(key);
    if (!e) return def;
    const std::string expected =
        "expected one of " + join(choices, "|") + (alias_note ? std::string(" ") + alias_note : std::string());
    if (!e->value.is_scalar()) {
      error(key, expected + ", got " + describe(e->value));
      return def;
    }
    const std::string& v = e->value.value;
    if (alias && !contains(choices, v))
      if (const char* name = alias(v)) return name;
    if (!contains(choices, v)) {
      const std::string near = closest_match(v, choices);
      error(key, expected + ", got " + describe(e->value) +
                     (near.empty() ? std::string() : "; did you mean \"" + near + "\"?"));
      return def;
    }
    return v;
  }

  bool get_bool(const std::string& key, bool def) const {
    const auto* e = find(key);
    if (!e) return def;
    if (is_plain(e->value)) {
      if (is_true_word(e->value.value)) return true;
      if (is_false_word(e->value.value)) return false;
    }
    std::string msg = "expected true or false, got " + describe(e->value);
    if (e->value.is_scalar() && is_yaml11_bool_word(e->value.value))
      msg += " (YAML 1.2 booleans: write true or false)";
    error(key, msg);
    return def;
  }

  /// An integer; floats with an integral value (1e4, 2.0) are accepted. `ok` is the range check,
  /// `expected` says it in words ("a positive integer").
  int64_t get_int(const std::string& key, int64_t def, const std::function<bool(int64_t)>& ok,
                  const std::string& expected) const {
    const auto* e = find(key);
    if (!e) return def;
    std::optional<int64_t> v;
    if (is_plain(e->value)) {
      v = parse_int(e->value.value);
      if (!v) {
        const auto f = parse_float(e->value.value);
        if (f && std::isfinite(*f) && std::floor(*f) == *f && std::fabs(*f) < 9.0e18)
          v = static_cast<int64_t>(*f);
      }
    }
    if (!v || !ok(*v)) {
      error(key, "expected " + expected + ", got " + describe(e->value));
      return def;
    }
    return *v;
  }

  /// A finite number in any YAML 1.2 notation (100, 2.0e-4, .5, 0x10). `ok` is the range check.
  double get_number(const std::string& key, double def, const std::function<bool(double)>& ok,
                    const std::string& expected) const {
    const auto* e = find(key);
    if (!e) return def;
    std::optional<double> v;
    if (is_plain(e->value)) {
      if (auto i = parse_int(e->value.value)) v = static_cast<double>(*i);
      else v = parse_float(e->value.value);
    }
    if (!v || !std::isfinite(*v) || !ok(*v)) {
      error(key, "expected " + expected + ", got " + describe(e->value));
      return def;
    }
    return *v;
  }

  /// A list of non-empty strings (null: empty list); `def` when absent, or when an item is
  /// refused (every refused item is reported).
  std::vector<std::string> get_string_list(const std::string& key,
                                           const std::vector<std::string>& def) const {
    const auto* e = find(key);
    if (!e) return def;
    if (e->value.is_null()) return {};
    if (!e->value.is_sequence()) {
      error(key, "expected a list of names, got " + describe(e->value));
      return def;
    }
    const size_t errors_before = errors();
    std::vector<std::string> out;
    for (size_t i = 0; i < e->value.items.size(); ++i) {
      const yaml::Node& item = e->value.items[i];
      const std::string ipath = item_path(key, i);
      if (!item.is_scalar() || item.value.empty())
        ctx_.report(ipath, item.mark, "expected a name, got " + describe(item));
      else if (contains(out, item.value))
        ctx_.report(ipath, item.mark, "\"" + one_line(item.value) + "\" is listed twice");
      else
        out.push_back(item.value);
    }
    return errors() == errors_before ? out : def;
  }

  /// A map of string -> string (absent or null: empty map); nullopt when an entry is refused
  /// (every refused entry is reported).
  std::optional<std::map<std::string, std::string>> get_string_map(const std::string& key) const {
    const auto* e = find(key);
    std::map<std::string, std::string> out;
    if (!e || e->value.is_null()) return out;
    if (!e->value.is_map()) {
      error(key, "expected a map of name: name, got " + describe(e->value));
      return std::nullopt;
    }
    const size_t errors_before = errors();
    for (const auto& [k, v] : e->value.entries) {
      if (!k.is_scalar() || k.value.empty()) {
        ctx_.report(key_path(key), k.mark, "keys must be plain names, got " + describe(k));
        continue;
      }
      const std::string kpath = key_path(key) + "." + k.value;
      if (out.count(k.value)) ctx_.report(kpath, k.mark, "duplicate key");
      else if (!v.is_scalar() || v.value.empty()) ctx_.report(kpath, v.mark, "expected a name, got " + describe(v));
      else out[k.value] = v.value;
    }
    if (errors() != errors_before) return std::nullopt;
    return out;
  }

 private:
  struct Entry {
    std::string name;
    yaml::Mark key_mark;
    yaml::Node value;
  };

  const Entry* find(const std::string& key) const {
    for (const auto& e : entries_)
      if (e.name == key) return &e;
    return nullptr;
  }

  /// Another tool's key and what does the same here: `ours` in quotes is the key (or key: value)
  /// that does it; one starting with a space is said as it is. `who`: whose name it is (nullptr:
  /// the table's own, Axolotl / Hugging Face for keys, Axolotl for data-file entry keys).
  struct PeerName {
    PeerName(std::string o, const char* w = nullptr) : ours(std::move(o)), who(w) {}  // NOLINT: a table row
    PeerName(const char* o, const char* w = nullptr) : ours(o), who(w) {}             // NOLINT: a table row
    std::string ours;
    const char* who;
  };

  std::string unknown_key_message(const std::string& name) const {
    // Axolotl / PEFT / transformers and torchtune names a user brings along, with ours.
    static const char* const kTorchtune = "torchtune";
    static const char* const kAll = "Axolotl / Hugging Face / torchtune";
    static const std::string kAdamKeys =
        "training.learning_rate, weight_decay, adam_beta1, adam_beta2, adam_epsilon, max_grad_norm";
    static const std::string kSeeds =
        " is two keys here: \"training.seed\" (LoRA initialisation and dropout) and \"data.seed\" (the "
        "epoch shuffle and the val_set_size hold-out)";
    static const std::string kEvalBatch =
      " has no key here: evaluation (eval_steps, qlora eval --metric loss) runs \"training.micro_batch_size\" "
      "examples a forward pass, each its own row, padded to the longest";
  static const std::string kMetricsFile =
      " has no key here: nothing is sent to a tracker; every step's loss, lr, grad_norm, tokens and eval_loss "
      "are one JSON line in metrics.jsonl in output_dir (summary.json: the run's totals)";
  static const std::string kNoBestModel =
      " has no key here: there is no choice by another metric and no early stopping; eval_loss of each eval step "
      "is in metrics.jsonl, \"checkpoint.keep_best: true\" keeps the checkpoint with the lowest eval_loss "
      "(summary.json best_eval.checkpoint) and \"checkpoint.keep_last\" the newest: pass one "
      "(output_dir/checkpoints/checkpoint-N) to qlora eval / generate / merge --adapter, or resume it "
      "into a new output_dir with \"checkpoint.resume\": PATH and \"training.max_steps\": N to export its adapter";
  // HF's load_best_model_at_end keeps the best checkpoint from rotation and loads it at the end;
  // keep_best does the first only: a checkpoint directory is a PEFT adapter (with trainer_state.json,
  // which eval / generate / merge read for the run's settings, cli/adapter_run.h).
  static const std::string kLoadBest =
      " is \"checkpoint.keep_best: true\" here without the load at the end: it keeps the checkpoint with the "
      "lowest eval_loss besides the newest \"checkpoint.keep_last\" (summary.json best_eval.checkpoint names it), "
      "and output_dir's adapter stays the last step's; that checkpoint directory is an adapter: qlora eval CONFIG "
      "--adapter DIR, qlora generate MODEL --adapter DIR, qlora merge --base MODEL --adapter DIR --out OUT";
  static const std::map<std::string, PeerName> kPeerNames = {
        {"base_model", "model.path"},
        {"lora_r", "lora.r"},
        {"lora_alpha", {"lora.alpha", kAll}},
        {"lora_dropout", {"lora.dropout", kAll}},
        {"lora_target_modules", "lora.target_modules"},
        {"lora_target_linear", "lora.target_modules: all-linear"},
        {"peft_use_rslora", "lora.use_rslora"},
        {"peft_use_dora", " has no key here: DoRA is not supported (plain LoRA, optionally lora.use_rslora)"},
        {"lora_modules_to_save", " has no key here: only LoRA adapters train (no whole trained copy of lm_head or "
                                 "embed_tokens), so no token can be added to the vocabulary"},
        {"load_in_4bit", "quantization.method: nf4"},
        // trial 26: a bare "unknown key" for these two of Axolotl's Mistral QLoRA example
        {"load_in_8bit", " has no key here: 8-bit bitsandbytes bases are not supported; \"quantization.method: nf4\" "
                         "(or fp4) quantizes the base to 4 bits, none keeps it in model.dtype"},
        {"strict", " has no key here: every config is read strictly (an unknown key is an error, as here)"},
        {"bnb_4bit_quant_type", "quantization.method"},
        {"bnb_4bit_use_double_quant", "quantization.double_quant"},
        {"adapter", " is \"quantization.method\" here (adapter: qlora is method: nf4, adapter: lora is method: none)"},
        {"datasets", " is \"data.train\" here: a path, or a list of files whose examples are concatenated in "
                     "order, each a path or {path: FILE, format: sharegpt, field_map: {...}, role_map: {...}}"},
        {"lora_model_dir", "lora.model_dir"},
        {"chat_template", " is \"data.template\" here (its tokenizer_default is template: auto; the names: "
                          "docs/data.md, e.g. mistral is Mistral v0.3's jinja)"},
        {"default_system_message", "data.default_system_message"},
        {"dataset_exact_deduplication", {" is \"data.deduplicate\" here (true: drop exact duplicate records in "
                                         "data.train before the val_set_size hold-out, in data.eval, and data.eval "
                                         "records also in data.train)", "Axolotl"}},
        {"per_device_train_batch_size", "training.micro_batch_size"},
        {"num_train_epochs", "training.num_epochs"},
        {"lr_scheduler_type", "training.lr_scheduler"},
        {"optimizer", {" has no key here: qlora-cpp trains with AdamW only, tuned by " + kAdamKeys, kAll}},
        {"optim", " has no key here: qlora-cpp trains with AdamW only, tuned by " + kAdamKeys},
        {"seed", {kSeeds, kAll}},
        {"evaluation_strategy", " is \"training.eval_steps\" here (we count optimizer steps; 0: at the end of each epoch)"},
        {"eval_strategy", " is \"training.eval_steps\" here (we count optimizer steps; 0: at the end of each epoch)"},
        {"save_strategy", " is \"checkpoint.save_steps\" here (we count optimizer steps; checkpoint.save_minutes saves by wall time)"},
        {"save_total_limit", "checkpoint.keep_last"},
        {"resume_from_checkpoint", {" is \"checkpoint.resume\" here: true is auto (the newest checkpoint of "
                                    "output_dir), false is never, or a checkpoint path", kAll}},
        {"bf16", "model.dtype: bf16"},
        {"torch_dtype", "model.dtype"},
        {"bnb_4bit_compute_dtype", "model.dtype"},
        {"lr_scheduler_kwargs", " has no key here: each \"training.lr_scheduler\" runs with transformers' defaults "
                                "(cosine and linear decay to 0, cosine_with_restarts one cycle, polynomial to 1e-7 "
                                "at power 1)"},
        {"neftune_noise_alpha", " has no key here: NEFTune (noise on the input embeddings) is not supported"},
        {"evals_per_epoch", " has no key here: set \"training.eval_steps\" to S / evals_per_epoch, S being an "
                            "epoch's optimizer steps, ceil(micro-batches / gradient_accumulation_steps) (0: eval at "
                            "each epoch's end)"},
        {"saves_per_epoch", " has no key here: set \"checkpoint.save_steps\" to S / saves_per_epoch, S being an "
                            "epoch's optimizer steps, ceil(micro-batches / gradient_accumulation_steps)"},
        {"pad_to_sequence_len", " has no key here: a batch is padded to its longest row; \"data.sample_packing: "
                                "true\" fills rows up to data.sequence_len"},
        {"special_tokens", " has no key here: BOS, EOS and PAD are the tokenizer's (tokenizer_config.json, "
                           "special_tokens_map.json); batches are padded with EOS when it has no PAD, and no token "
                           "is added to the vocabulary"},
        {"dataset_prepared_path", " has no key here: the data files are read and tokenised at the start of "
                                  "every run, nothing is cached (qlora data preview shows the result)"},
        {"model_type", " has no key here: the architecture comes from \"model.path\"'s config.json "
                       "(architectures), or from \"model.preset\""},
        {"tokenizer_type", " has no key here: the tokenizer is read from \"model.path\" (tokenizer.json or "
                           "tokenizer.model), or from \"model.tokenizer\""},
        {"flash_attention", " has no key here: attention is torch's SDPA, whose kernel (flash, memory-efficient "
                            "or math) torch picks for the device and dtype"},
        {"tf32", " has no key here: TF32 matmuls stay off (torch's default); \"model.dtype: bf16\" is the "
                 "fast GPU dtype"},
        {"group_by_length", " has no key here: rows are drawn in shuffled order (\"data.shuffle\"); "
                            "\"data.sample_packing: true\" packs short examples into full rows instead"},
        // TRL's SFTConfig and Axolotl's rope key (trial 23: a bare "unknown key").
        {"max_seq_length", {"data.sequence_len", "TRL"}},
        {"packing", {" is \"data.sample_packing\" here (best-fit decreasing, as TRL's packing_strategy bfd; "
                     "attention kept within each example)", "TRL"}},
        {"rope_scaling", " has no key here: RoPE scaling is read from \"model.path\"'s config.json "
                         "(rope_scaling / rope_parameters: default, linear and llama3 run; other types are refused "
                         "by name)"},
        // Evaluation and reporting (issue: a README-only trial's Axolotl / HF Trainer eval keys).
        {"test_datasets", " is \"data.eval\" here: a separate eval file, or a list of files as data.train takes "
                          "(when set, data.val_set_size is not used)"},
        {"eval_batch_size", kEvalBatch},
        {"per_device_eval_batch_size", kEvalBatch},
        {"eval_sample_packing", " has no key here: evaluation never packs, each eval example is its own row "
                                "(data.sample_packing packs training rows only)"},
        {"eval_max_new_tokens", " has no key here: \"qlora eval --metric exact_match\" generates greedily up to "
                                "each reference answer's length + 8 tokens; \"qlora generate --max-new-tokens N\" "
                                "sets it for your own prompts"},
        {"do_causal_lm_eval", " has no key here: training evaluates eval_loss only; \"qlora eval --metric loss\" "
                              "gives loss and perplexity, \"qlora eval --metric exact_match\" greedy exact match"},
        {"report_to", kMetricsFile},
        {"logging_dir", kMetricsFile},
        {"wandb_project", kMetricsFile},
        {"wandb_entity", kMetricsFile},
        {"wandb_name", kMetricsFile},
        {"wandb_run_id", kMetricsFile},
        {"wandb_watch", kMetricsFile},
        {"wandb_log_model", kMetricsFile},
        {"wandb_mode", kMetricsFile},
        {"metric_for_best_model", kNoBestModel},
        {"load_best_model_at_end", kLoadBest},
        {"greater_is_better", kNoBestModel},
        {"early_stopping_patience", kNoBestModel},
        // torchtune's recipe config (recipes/configs/*/*_lora_single_device.yaml, read by
        // lora_finetune_single_device.py; issue: a torchtune user's trial).
        {"_component_", {" has no key here: nothing is built from a class name: the architecture comes from "
                         "\"model.path\"'s config.json (or \"model.preset\"), data from local files "
                         "(\"data.train\"); the optimizer is AdamW, the loss cross-entropy", kTorchtune}},
        {"lora_rank", {"lora.r", kTorchtune}},
        {"lora_attn_modules", {" is \"lora.target_modules\" here: q_proj, k_proj, v_proj as named, output_proj "
                               "is o_proj", kTorchtune}},
        {"apply_lora_to_mlp", {" is \"lora.target_modules\" here: true is gate_proj, up_proj, down_proj in its "
                               "list (torchtune's w1, w3, w2); all-linear is all seven", kTorchtune}},
        {"apply_lora_to_output", {" has no key here: LoRA on the output projection (lm_head) is not supported; "
                                  "\"lora.target_modules\" lists the decoder layers' projections", kTorchtune}},
        {"tokenizer", {" is \"model.tokenizer\" here for its path (unset: the tokenizer in model.path), and its "
                       "max_seq_len is \"data.sequence_len\"", kTorchtune}},
        {"checkpointer", {" is \"model.path\" here for its checkpoint_dir (the model directory: config.json, "
                          "*.safetensors, found there without checkpoint_files), and its output_dir is the top-level "
                          "\"output_dir\"", kTorchtune}},
        {"dataset", {" is the \"data\" section here: \"data.train\" is a local file (.json, .jsonl or .txt), "
                     "its format \"data.format\"; column_map is \"data.field_map\", packed is "
                     "\"data.sample_packing\", train_on_input is \"data.train_on_inputs\" (default false here; "
                     "torchtune's alpaca_dataset defaults it to true)", kTorchtune}},
        {"dataset_val", {" is \"data.eval\" here (a separate eval file; or \"data.val_set_size\" holds a part "
                         "of data.train out)", kTorchtune}},
        {"run_val_every_n_steps", {" is \"training.eval_steps\" here (optimizer steps; 0: at the end of each "
                                   "epoch)", kTorchtune}},
        {"packed", {" is \"data.sample_packing\" here (rows filled up to data.sequence_len, attention kept "
                    "within each example)", kTorchtune}},
        {"batch_size", {" is \"training.micro_batch_size\" here (rows a forward pass, as torchtune's per-device "
                        "batch; gradient_accumulation_steps is ours too)", kTorchtune}},
        {"epochs", {"training.num_epochs", kTorchtune}},
        {"max_steps_per_epoch", {" has no key here: \"training.max_steps\" caps the whole run's optimizer steps, "
                                 "not each epoch's", kTorchtune}},
        {"lr", {"training.learning_rate", kTorchtune}},
        {"num_warmup_steps", {"training.warmup_steps", kTorchtune}},
        {"lr_scheduler", {" is \"training.lr_scheduler\" here (cosine, linear, ...; torchtune's "
                          "get_cosine_schedule_with_warmup is cosine, its num_warmup_steps \"training.warmup_steps\")",
                          kAll}},
        {"max_seq_len", {"data.sequence_len", kTorchtune}},
        {"clip_grad_norm", {" is \"training.max_grad_norm\" here (null: 0, no clipping)", kTorchtune}},
        {"loss", {" has no key here: the loss is cross-entropy, the token-weighted mean over a step's label "
                  "tokens (prompt tokens count only with data.train_on_inputs), as torchtune's CE losses",
                  kTorchtune}},
        {"log_every_n_steps", {" is \"training.logging_steps\" here (a console line every N optimizer steps; "
                               "metrics.jsonl has every step)", kTorchtune}},
        {"metric_logger", {kMetricsFile, kTorchtune}},
        {"enable_activation_checkpointing", {" is \"training.gradient_checkpointing\" here (default true)",
                                             kTorchtune}},
        {"enable_activation_offloading", {" has no key here: activations stay on the GPU; "
                                          "\"training.gradient_checkpointing\" (default true) saves their memory",
                                          kTorchtune}},
        {"compile", {" has no key here: there is no torch.compile in LibTorch; the model runs eagerly",
                     kTorchtune}},
        {"save_adapter_weights_only", {" has no key here: output_dir gets the PEFT adapter only "
                                       "(adapter_model.safetensors, adapter_config.json); \"qlora merge\" writes "
                                       "the merged model", kTorchtune}},
        {"log_peak_memory_stats", {" has no key here: every run measures its memory (peak allocated and reserved "
                                   "on CUDA, RSS on the CPU), logs it beside the estimate and writes "
                                   "memory_report.json in output_dir; every step's metrics.jsonl line has it",
                                   kTorchtune}},
        {"profiler", {" has no key here: there is no profiler; metrics.jsonl has every step's time and tokens/s, "
                      "\"qlora bench\" times steps and memory", kTorchtune}},
        {"device", {" has no key here: training runs on the GPU when CUDA sees one (cuda:LOCAL_RANK in a "
                    "data-parallel job), else on the CPU; CUDA_VISIBLE_DEVICES=\"\" makes it the CPU", kTorchtune}},
        {"optimizer_in_bwd", {" has no key here: AdamW steps after the backward of every "
                              "\"training.gradient_accumulation_steps\" micro-batches; the LoRA gradients and "
                              "AdamW states are small beside the 4-bit base", kTorchtune}},
    };
    // Axolotl's `datasets:` entry keys (in an entry of data.train / data.eval, or written flat
    // into the data section), and the data section's keys, which apply to every file.
    static const std::map<std::string, PeerName> kEntryNames = {
        {"type", "\"format\" here (alpaca|sharegpt|messages|completion; Axolotl's chat_template type is messages)"},
        {"ds_type", "\"format\" here; the file type comes from the extension (.json, .jsonl, .txt)"},
        {"data_files", "\"path\" here (one local file an entry; list several entries for several files)"},
        {"field_instruction", "\"field_map\" here: {instruction: YOUR_FIELD}"},
        {"field_input", "\"field_map\" here: {input: YOUR_FIELD}"},
        {"field_output", "\"field_map\" here: {output: YOUR_FIELD}"},
        {"field_system", "\"field_map\" here: {system: YOUR_FIELD}"},
        {"field_messages", "\"field_map\" here: {messages: YOUR_FIELD} (or {conversations: YOUR_FIELD})"},
        {"roles", "\"role_map\" here: {YOUR_ROLE: user}"},
        {"message_property_mappings",
         "\"field_map\" here, the same way round: {role: YOUR_ROLE_FIELD, content: YOUR_CONTENT_FIELD} for "
         "format: messages ({from: ..., value: ...} for sharegpt); the role names themselves go in \"role_map\""},
        {"source", {"what \"data.train\" names here (\"path\" in an entry of its list): a local file (.json, "
                    ".jsonl or .txt, read by its extension; torchtune's source: json with data_files: FILE is "
                    "data.train: FILE)", kTorchtune}},
        {"split", {"not a key here: the whole file is read, and \"data.val_set_size\" holds a part out for "
                   "evaluation (split: train[:95%] with the rest as validation is val_set_size: 0.05)",
                   kTorchtune}},
        {"column_map", {"\"field_map\" here, the same way round: {instruction: YOUR_COLUMN, output: YOUR_COLUMN} "
                        "(our field: the column in your file)", kTorchtune}},
    };
    const bool entry = !path_.empty() && path_.back() == ']';  // an entry of data.train / data.eval
    if (entry || (path_ == "data" && name != "data_files"))  // the section's file key is "train"
      if (auto it = kEntryNames.find(name); it != kEntryNames.end())
        return "unknown key; " + std::string(it->second.who ? it->second.who : "Axolotl") + "'s \"" + name +
               "\" is " + it->second.ours + " (docs/config.md)";
    if (entry) {
      const std::string near = closest_match(name, keys_);
      if (!near.empty()) return "unknown key; did you mean \"" + near + "\"?";
      if (contains(section_keys("data"), name))
        return "unknown key; data." + name + " applies to every file: set it in the data section (an entry sets " +
               join(keys_, ", ") + ")";
      return "unknown key (expected one of: " + join(keys_, ", ") + ")";
    }
    if (auto it = kPeerNames.find(name); it != kPeerNames.end()) {
      const std::string& ours = it->second.ours;
      return "unknown key; " + std::string(it->second.who ? it->second.who : "Axolotl / Hugging Face") + "'s \"" +
             name + "\"" +
             (ours[0] == ' ' ? ours : " is \"" + ours + "\" here") + " (docs/config.md)";
    }
    const std::string near = closest_match(name, keys_);
    if (!near.empty()) return "unknown key; did you mean \"" + near + "\"?";
    // A key of another section written in the wrong place (e.g. top-level `learning_rate`).
    for (const SchemaSection& section : schema_sections())
      if (!section.name.empty() && section.name != path_ && contains(section.keys, name))
        return "unknown key; did you mean \"" + section.name + "." + name + "\" (it belongs under " +
               section.name + ":)?";
    return "unknown key (expected one of: " + join(keys_, ", ") + ")";
  }

  const Context& ctx_;
  std::string path_;
  yaml::Mark mark_;
  const std::vector<std::string>& keys_;
  bool unknown_ = false;  // its contents are not known (missing, or not a map): no key is "missing"
  std::vector<Entry> entries_;
};

// ---- emitting ----

/// Shortest decimal text that reads back as exactly `v`.
std::string format_double(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) {  // integral: "20", not the shorter "2e+01"
    std::ostringstream os;
    os.imbue(std::locale::classic());
    os << std::fixed << std::setprecision(0) << v;
    return os.str();
  }
  std::string s;
  for (int p = 1; p <= 17; ++p) {
    std::ostringstream os;
    os.imbue(std::locale::classic());
    os << std::setprecision(p) << v;
    s = os.str();
    const auto back = parse_float(s);
    if (back && *back == v) break;
  }
  return s;
}

/// Strings that a plain YAML scalar would turn into something else (or that we reject as such).
bool needs_quotes(const std::string& s) {
  return s.empty() || is_null_word(s) || is_true_word(s) || is_false_word(s) || is_yaml11_bool_word(s) ||
         parse_int(s) || parse_float(s);
}

void emit_string(YAML::Emitter& out, const std::string& key, const std::string& v) {
  out << YAML::Key << key << YAML::Value;
  if (needs_quotes(v)) out << YAML::DoubleQuoted;
  out << v;
}
/// A path key as read back by get_path: its expanded value with every "$" written "$$", so no
/// part of it is expanded a second time (to_yaml's round trip).
std::string escape_dollars(const std::string& v) {
  std::string escaped;
  for (char ch : v) escaped += ch == '$' ? std::string("$$") : std::string(1, ch);
  return escaped;
}
void emit_path(YAML::Emitter& out, const std::string& key, const std::string& v) {
  emit_string(out, key, escape_dollars(v));
}
void emit_double(YAML::Emitter& out, const std::string& key, double v) {
  out << YAML::Key << key << YAML::Value << format_double(v);
}
template <typename T>
void emit_plain(YAML::Emitter& out, const std::string& key, const T& v) {
  out << YAML::Key << key << YAML::Value << v;
}
void emit_bool(YAML::Emitter& out, const std::string& key, bool v) {
  out << YAML::Key << key << YAML::Value << (v ? "true" : "false");
}
void emit_list(YAML::Emitter& out, const std::string& key, const std::vector<std::string>& v) {
  out << YAML::Key << key << YAML::Value << YAML::Flow << YAML::BeginSeq;
  for (const auto& s : v) {
    if (needs_quotes(s)) out << YAML::DoubleQuoted;
    out << s;
  }
  out << YAML::EndSeq;
}
void emit_map(YAML::Emitter& out, const std::string& key, const std::map<std::string, std::string>& m) {
  out << YAML::Key << key << YAML::Value << YAML::Flow << YAML::BeginMap;
  for (const auto& [k, v] : m) emit_string(out, k, v);
  out << YAML::EndMap;
}

// ---- the field table ----
//
// Each section's keys are declared once, in visit_fields(V&, Section*) below: the key, the member
// it fills and a spec (its YAML type, range and how it is written back). Visitors walk the table
// to list the schema's keys (unknown-key checks, did-you-means, docs/config.md's test), to read a
// section (Reader), to write it (Emitter: to_yaml) and to compare two configs (Equal). A section's
// cross-field rules (its `check`) run, in table order, once every key of the config has been read
// without error (read_config); every rule broken is reported.

/// A path: `~` and environment variables expanded (expand_path). `required`: absent or empty is an
/// error. `omit_empty`: to_yaml leaves the key out when empty.
struct PathSpec {
  bool required = false;
  bool omit_empty = false;
};
/// Data files (data::DataSource list): one path, or a list of paths and {path, format, field_map,
/// role_map} maps (read_sources). `required`: absent or empty is an error.
struct SourceListSpec {
  bool required = false;
};
/// A string taken as written ("" allowed; no expansion).
struct TextSpec {};
/// One of `names`. The member is the name itself (std::string), or an enum or bool whose value is
/// the name's position in `names`.
struct ChoiceSpec {
  const std::vector<std::string>& names;
  bool omit_empty = false;  ///< std::string members: to_yaml leaves the key out when ""
  /// Other accepted spellings: the name in `names` an alias stands for, nullptr for a non-alias.
  /// to_yaml writes the name. nullptr: none.
  const char* (*alias)(const std::string&) = nullptr;
  const char* alias_note = nullptr;  ///< the aliases, for the error message ("(or bfloat16|...)")
};
/// An integer (an integral float such as 1e4 too) for which `ok` holds; `expected` says the range.
struct IntSpec {
  bool (*ok)(int64_t);
  const char* expected;
};
/// A finite number for which `ok` holds; `expected` says the range.
struct NumberSpec {
  bool (*ok)(double);
  const char* expected;
};
/// true or false (YAML 1.2 core).
struct BoolSpec {};
/// A list of distinct non-empty names.
struct NameListSpec {};
/// A map of name -> name.
struct NameMapSpec {};
/// A key with a shape of its own that fills several members of section S: read, written and
/// compared by the three functions.
template <class S>
struct CustomSpec {
  void (*read)(const Section& s, const char* key, S& obj);
  void (*emit)(YAML::Emitter& out, const char* key, const S& obj);
  bool (*equal)(const S& a, const S& b);
};
/// A section of Config. `check` runs its cross-field rules after its keys are read (it sees the
/// sections above it, already read, through the Config).
struct SectionSpec {
  bool required;
  void (*check)(const Section& s, Config& c) = nullptr;
};

// -- keys with a shape of their own --

// target_modules: the scalar all-linear (kept as {"all-linear"}) or a list of projection names.
void read_target_modules(const Section& s, const char* key, LoraConfig& l) {
  const yaml::Node* t = s.raw(key);
  if (!t) return;
  if (t->is_scalar() && t->value == kAllLinear) {
    l.target_modules = {kAllLinear};
    return;
  }
  if (!t->is_sequence()) {
    s.error(key, "expected \"all-linear\" or a list of module names, got " + describe(*t));
    return;
  }
  const size_t errors_before = s.errors();
  const std::vector<std::string> names = s.get_string_list(key, {});
  if (s.errors() != errors_before) return;  // an item refused (reported): the default stays
  if (names.empty()) {
    s.error(key, "expected at least one module name");
    return;
  }
  const std::vector<std::string>& known = llama_linear_names();
  // torchtune's module names (lora_attn_modules; its FeedForward's w1, w2, w3) for ours.
  static const std::map<std::string, std::string> kTorchtuneModules = {
      {"output_proj", "o_proj"}, {"w1", "gate_proj"}, {"w2", "down_proj"}, {"w3", "up_proj"}};
  for (size_t i = 0; i < names.size(); ++i) {  // every unknown name is reported
    const std::string& name = names[i];
    if (contains(known, name)) continue;
    if (auto it = kTorchtuneModules.find(name); it != kTorchtuneModules.end()) {
      s.item_error(key, i,
                   "unknown module \"" + name + "\"; torchtune's \"" + name + "\" is \"" + it->second + "\" here");
      continue;
    }
    const std::string near = closest_match(name, known);
    s.item_error(key, i,
                 "unknown module \"" + one_line(name) + "\"" +
                     (near.empty() ? " (known: " + join(known, ", ") + ")" : "; did you mean \"" + near + "\"?"));
  }
  if (s.errors() == errors_before) l.target_modules = names;
}
void emit_target_modules(YAML::Emitter& out, const char* key, const LoraConfig& l) {
  if (l.target_modules == std::vector<std::string>{kAllLinear}) emit_plain(out, key, kAllLinear);
  else emit_list(out, key, l.target_modules);
}
bool equal_target_modules(const LoraConfig& a, const LoraConfig& b) { return a.target_modules == b.target_modules; }

void read_resume(const Section& s, const char* key, CheckpointConfig& c) {
  const yaml::Node* r = s.raw(key);
  if (!r) return;
  if (r->is_scalar() && is_plain(*r) &&
      (is_true_word(r->value) || is_false_word(r->value) || is_yaml11_bool_word(r->value))) {
    // torchtune's resume_from_checkpoint and HF's take a boolean: say which of ours it is.
    std::string l;
    for (char ch : r->value) l += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    const bool yes = l == "true" || l == "yes" || l == "on" || l == "y";
    s.error(key, "expected auto, never or a checkpoint path, got " + describe(*r) + "; did you mean \"" +
                     (yes ? "auto" : "never") + "\"? (a boolean resume_from_checkpoint: true is auto, false is never)");
    return;
  }
  std::string v;
  if (!s.read_string(key, "auto", false, &v)) return;  // reported; the default stays
  if (v == "auto") {
    c.resume = ResumeMode::kAuto;
  } else if (v == "never") {
    c.resume = ResumeMode::kNever;
  } else {
    const size_t errors_before = s.errors();
    const std::string p = s.get_path(key, "auto", false);
    if (s.errors() == errors_before) c.resume = ResumeMode::kPath, c.resume_path = p;
  }
}
void emit_resume(YAML::Emitter& out, const char* key, const CheckpointConfig& c) {
  if (c.resume == ResumeMode::kPath) emit_path(out, key, c.resume_path);
  else emit_plain(out, key, to_string(c.resume));
}
bool equal_resume(const CheckpointConfig& a, const CheckpointConfig& b) {
  return a.resume == b.resume && a.resume_path == b.resume_path;
}

// data.train / data.eval: one path (a one-entry list), or a list whose entries are paths or maps.
const std::vector<std::string> kSourceKeys = {"path", "format", "field_map", "role_map"};

void read_sources(const Section& s, const char* key, bool required, std::vector<data::DataSource>& out) {
  const yaml::Node* n = s.raw(key);
  if (!n) {
    if (required && out.empty()) s.missing(key);
    return;  // the default, or the base config's files
  }
  const std::string form = "a path, or a list of files each a path or {path: FILE, format: ..., field_map: {...}, "
                           "role_map: {...}}";
  if (n->is_null() || n->is_scalar()) {
    const std::string p = s.get_path(key, "", !required);
    out = p.empty() ? std::vector<data::DataSource>{} : std::vector<data::DataSource>{data::DataSource{p}};
    return;
  }
  if (!n->is_sequence()) {
    s.error(key, "expected " + form + ", got " + describe(*n));
    return;
  }
  if (n->items.empty()) {
    s.error(key, "expected at least one file (" + form + "), got an empty list");
    return;
  }
  const size_t errors_before = s.errors();
  std::vector<data::DataSource> v;
  for (size_t i = 0; i < n->items.size(); ++i) {
    const yaml::Node& item = n->items[i];
    // Where the entry sits: the data loader's errors about its file start "data.train[1]: ".
    s.record_source(s.item_path(key, i), item.mark);
    data::DataSource src;
    if (item.is_scalar() && !item.is_null()) {  // `- ~` is no path (not $HOME): the error below
      std::string why;
      src.path = expand_path(item.value, &why);
      if (!why.empty()) s.item_error(key, i, why);
      else if (src.path.empty()) s.item_error(key, i, "expected a non-empty path, got " + describe(item));
    } else if (item.is_map()) {
      const Section e = s.item_section(key, i, kSourceKeys);
      src.path = e.get_path("path", "", false);
      if (e.has("format")) src.format = e.get_choice("format", "", kFormats);
      if (e.has("field_map")) src.field_map = e.get_string_map("field_map");
      if (e.has("role_map")) src.role_map = e.get_string_map("role_map");
    } else {
      s.item_error(key, i, "expected a path or a map {path: FILE, format: ..., field_map: {...}, role_map: {...}}, got " +
                               describe(item));
    }
    v.push_back(std::move(src));
  }
  if (s.errors() == errors_before) out = std::move(v);  // else reported; the old value stays
}
/// One path, as before lists: the path itself; else a block list whose entries are plain paths or
/// maps of the keys the entry set (parse_config_string reads it back equal).
void emit_sources(YAML::Emitter& out, const char* key, const std::vector<data::DataSource>& v) {
  if (v.empty() || (v.size() == 1 && v[0].path_only())) {
    emit_path(out, key, v.empty() ? std::string() : v[0].path);
    return;
  }
  out << YAML::Key << key << YAML::Value << YAML::BeginSeq;
  for (const data::DataSource& src : v) {
    const std::string p = escape_dollars(src.path);
    if (src.path_only()) {
      if (needs_quotes(p)) out << YAML::DoubleQuoted;
      out << p;
      continue;
    }
    out << YAML::BeginMap;
    emit_string(out, "path", p);
    if (src.format) emit_string(out, "format", *src.format);
    if (src.field_map) emit_map(out, "field_map", *src.field_map);
    if (src.role_map) emit_map(out, "role_map", *src.role_map);
    out << YAML::EndMap;
  }
  out << YAML::EndSeq;
}

// -- cross-field rules, one function per section --

void check_model(const Section& s, Config& c) {
  const ModelSource& m = c.model;
  if (m.path.empty() && m.preset.empty())
    s.section_error("set model.path (a Hugging Face model dir) or model.preset (with init: random)");
  if (!m.path.empty() && !m.preset.empty()) s.error("preset", "set model.path or model.preset, not both");
  else if (!m.preset.empty() && !m.random_init)
    s.error(s.has("init") ? "init" : "preset", "a preset has no weights; set model.init: random");
}

void check_data(const Section& s, Config& c) {
  const data::DataOptions& d = c.data;
  if (d.truncation == "split" && d.format != "auto" && d.format != "completion")
    s.error("truncation", "split cuts raw text (format completion) into pieces; data.format is " + d.format +
                              " (a conversation piece would train an answer without its prompt): use drop or truncate");
  for (const char* key : {"train", "eval"}) {
    const std::vector<data::DataSource>& v = std::string(key) == "train" ? d.train : d.eval;
    for (size_t i = 0; i < v.size(); ++i)
      if (d.truncation == "split" && v[i].format && *v[i].format != "auto" && *v[i].format != "completion")
        s.item_error(key, i, "format " + *v[i].format + " with data.truncation: split, which cuts raw text (format "
                             "completion) into pieces (a conversation piece would train an answer without its "
                             "prompt): use drop or truncate");
  }
}

void check_training(const Section& s, Config& c) {
  TrainingConfig& t = c.training;
  const data::DataOptions& d = c.data;
  if (t.max_steps <= 0 && t.num_epochs <= 0)
    s.error(s.has("max_steps") ? "max_steps" : "num_epochs",
            "nothing to train: set training.num_epochs > 0 or training.max_steps > 0");
  if (t.warmup_ratio > 0) {
    if (s.has("warmup_steps") && t.warmup_steps > 0)
      s.error("warmup_ratio", "set training.warmup_steps or training.warmup_ratio, not both");
    t.warmup_steps = 0;  // the ratio replaces the default step count
  }
  // transformers' `constant` never warms up: the default step count does not apply to it (one set
  // in the file is kept, for config_warnings to say that it is not used)
  if (t.lr_scheduler == LrScheduler::kConstant && !s.has("warmup_steps")) t.warmup_steps = 0;
  if (t.lr_scheduler == LrScheduler::kPolynomial && !(t.learning_rate > kPolynomialLrEnd))
    s.error("learning_rate", "must be larger than 1e-07, the learning rate that lr_scheduler polynomial decays to "
                             "(transformers' lr_end)");
  if (t.eval_steps > 0 && d.eval.empty() && d.val_set_size <= 0)
    s.error("eval_steps", "no eval data: set data.eval or data.val_set_size > 0, or eval_steps: 0");
}

void check_checkpoint(const Section& s, Config& c) {
  if (c.checkpoint.resume == ResumeMode::kPath && !c.checkpoint.resume_from_dir.empty())
    s.error("resume_from_dir", "is only used with resume: auto (resume names a checkpoint path)");
  if (c.checkpoint.keep_best && c.data.eval.empty() && c.data.val_set_size <= 0)
    s.error("keep_best", "no eval data, so no checkpoint has an eval_loss: set data.eval or data.val_set_size > 0, "
                         "or keep_best: false");
}

// -- the tables (docs/config.md documents every key; test_config checks that it does) --

/// model.dtype's aliases: Hugging Face / torch names (`torch_dtype: bfloat16`) → ours, through the
/// one dtype parser (model/options.h dtype_from_name).
const char* dtype_alias(const std::string& s) {
  const std::optional<DType> d = dtype_from_name(s);
  return d ? dtype_name(*d) : nullptr;
}

bool positive(int64_t v) { return v > 0; }
bool non_negative(int64_t v) { return v >= 0; }
bool unit_interval(double v) { return v >= 0 && v < 1; }  // [0, 1)
bool positive_number(double v) { return v > 0; }
bool non_negative_number(double v) { return v >= 0; }
const IntSpec kPositiveInt{positive, "a positive integer"};
// batch positions and segment ids are int32 (data/batch.h): 99999999999 passed data preview (trial 23)
bool int32_token_count(int64_t v) { return v > 0 && v <= std::numeric_limits<int32_t>::max(); }
const IntSpec kTokenCount{int32_token_count, "a token count in 1..2147483647"};
const IntSpec kNonNegativeInt{non_negative, "an integer >= 0"};
const NumberSpec kUnitNumber{unit_interval, "a number in [0, 1)"};
const NumberSpec kPositiveNumber{positive_number, "a positive number"};

template <class V>
void visit_fields(V& v, ModelSource*) {
  v("path", &ModelSource::path, PathSpec{false, /*omit_empty=*/true});
  v("preset", &ModelSource::preset, ChoiceSpec{known_model_presets(), /*omit_empty=*/true});
  v("init", &ModelSource::random_init, ChoiceSpec{kInits});
  v("tokenizer", &ModelSource::tokenizer, PathSpec{});
  v("dtype", &ModelSource::dtype, ChoiceSpec{kDTypes, false, dtype_alias, "(or torch's bfloat16|float16|float32)"});
}

template <class V>
void visit_fields(V& v, QuantOptions*) {
  v("method", &QuantOptions::quant_type, ChoiceSpec{kQuantMethods});
  v("double_quant", &QuantOptions::double_quant, BoolSpec{});
  v("blocksize", &QuantOptions::blocksize, IntSpec{kernels::quant4_valid_blocksize, "a power of two in [32, 4096]"});
  v("keep_16bit", &QuantOptions::keep_16bit, NameListSpec{});
}

template <class V>
void visit_fields(V& v, LoraConfig*) {
  v("r", &LoraConfig::r, kPositiveInt);
  v("alpha", &LoraConfig::alpha, kPositiveNumber);
  v("dropout", &LoraConfig::dropout, kUnitNumber);
  v("target_modules", &LoraConfig::target_modules,
    CustomSpec<LoraConfig>{read_target_modules, emit_target_modules, equal_target_modules});
  v("use_rslora", &LoraConfig::use_rslora, BoolSpec{});
  v("model_dir", &LoraConfig::model_dir, PathSpec{false, /*omit_empty=*/true});
}

template <class V>
void visit_fields(V& v, data::DataOptions*) {
  using D = data::DataOptions;
  v("train", &D::train, SourceListSpec{/*required=*/true});
  v("eval", &D::eval, SourceListSpec{});
  v("format", &D::format, ChoiceSpec{kFormats});
  v("template", &D::template_name, ChoiceSpec{kTemplates});
  v("sequence_len", &D::sequence_len, kTokenCount);
  v("truncation", &D::truncation, ChoiceSpec{kTruncations});
  v("train_on_inputs", &D::train_on_inputs, BoolSpec{});
  v("add_eos", &D::add_eos, BoolSpec{});
  v("sample_packing", &D::sample_packing, BoolSpec{});
  v("padding_side", &D::padding_side, ChoiceSpec{kPaddingSides});
  v("val_set_size", &D::val_set_size,
    NumberSpec{[](double x) { return x >= 0 && (x < 1 || std::floor(x) == x); },
               "a fraction in [0, 1) or a whole count >= 1"});
  v("seed", &D::seed, kNonNegativeInt);
  v("shuffle", &D::shuffle, BoolSpec{});
  v("skip_invalid", &D::skip_invalid, BoolSpec{});
  v("deduplicate", &D::deduplicate, BoolSpec{});
  v("field_map", &D::field_map, NameMapSpec{});
  v("role_map", &D::role_map, NameMapSpec{});
  v("default_system_message", &D::default_system_message, TextSpec{});
}

template <class V>
void visit_fields(V& v, TrainingConfig*) {
  using T = TrainingConfig;
  v("micro_batch_size", &T::micro_batch_size, kPositiveInt);
  v("gradient_accumulation_steps", &T::gradient_accumulation_steps, kPositiveInt);
  v("num_epochs", &T::num_epochs, kNonNegativeInt);
  v("max_steps", &T::max_steps, IntSpec{[](int64_t x) { return x >= -1; }, "an integer >= -1 (-1: run num_epochs)"});
  v("learning_rate", &T::learning_rate, kPositiveNumber);
  v("lr_scheduler", &T::lr_scheduler,
    ChoiceSpec{kSchedulers, false, nullptr,
               "(transformers' defaults each: cosine and linear decay to 0; cosine_with_min_lr, "
               "warmup_stable_decay, inverse_sqrt and reduce_lr_on_plateau are not supported)"});
  v("warmup_steps", &T::warmup_steps,
    IntSpec{non_negative, "an integer >= 0 (a fraction of the total steps, as transformers' warmup_steps < 1 "
                          "means, is training.warmup_ratio)"});
  v("warmup_ratio", &T::warmup_ratio, kUnitNumber);
  v("weight_decay", &T::weight_decay, NumberSpec{non_negative_number, "a number >= 0"});
  v("adam_beta1", &T::adam_beta1, kUnitNumber);
  v("adam_beta2", &T::adam_beta2, kUnitNumber);
  v("adam_epsilon", &T::adam_epsilon, kPositiveNumber);
  v("max_grad_norm", &T::max_grad_norm, NumberSpec{non_negative_number, "a number >= 0 (0: no clipping)"});
  v("gradient_checkpointing", &T::gradient_checkpointing, BoolSpec{});
  v("seed", &T::seed, kNonNegativeInt);
  v("logging_steps", &T::logging_steps, kPositiveInt);
  v("max_nonfinite_steps", &T::max_nonfinite_steps, kNonNegativeInt);
  v("eval_steps", &T::eval_steps, kNonNegativeInt);
}

template <class V>
void visit_fields(V& v, CheckpointConfig*) {
  using K = CheckpointConfig;
  v("save_steps", &K::save_steps, IntSpec{non_negative, "an integer >= 0 (0: off)"});
  v("save_minutes", &K::save_minutes, NumberSpec{non_negative_number, "a number >= 0 (0: off)"});
  v("keep_last", &K::keep_last, IntSpec{positive, "an integer >= 1"});
  v("keep_best", &K::keep_best, BoolSpec{});
  v("resume", &K::resume, CustomSpec<K>{read_resume, emit_resume, equal_resume});
  v("resume_from_dir", &K::resume_from_dir, PathSpec{});
  v("sync_command", &K::sync_command, TextSpec{});
  v("sync_timeout_seconds", &K::sync_timeout_seconds, NumberSpec{non_negative_number, "a number >= 0 (0: do not wait)"});
}

template <class V>
void visit_fields(V& v, CostConfig*) {
  v("gpu_hour_price", &CostConfig::gpu_hour_price, NumberSpec{non_negative_number, "a number >= 0"});
}

/// The top level: output_dir and the sections, in the order they are read and written.
template <class V>
void visit_fields(V& v, Config*) {
  v("output_dir", &Config::output_dir, PathSpec{/*required=*/true});
  v("model", &Config::model, SectionSpec{/*required=*/true, check_model});
  v("quantization", &Config::quantization, SectionSpec{false});
  v("lora", &Config::lora, SectionSpec{false});
  v("data", &Config::data, SectionSpec{/*required=*/true, check_data});
  v("training", &Config::training, SectionSpec{false, check_training});
  v("checkpoint", &Config::checkpoint, SectionSpec{false, check_checkpoint});
  v("cost", &Config::cost, SectionSpec{false});
}

// ---- visitors ----

/// Index of an enum (or bool) value in its names list.
template <class E>
size_t choice_index(E v) { return static_cast<size_t>(v); }
/// The quant method: NF4, FP4, none (kQuantMethods).
size_t choice_index(const std::optional<kernels::Quant4Type>& t) { return t ? static_cast<size_t>(*t) : 2; }
/// The member value of the name at position i (the inverse of choice_index).
template <class M>
M from_choice_index(size_t i) {
  if constexpr (std::is_same_v<M, std::optional<kernels::Quant4Type>>)
    return i == 2 ? M() : M(static_cast<kernels::Quant4Type>(i));
  else
    return static_cast<M>(i);
}

/// Lists the keys of one section (the top level: output_dir and the section names), with the
/// names a choice key accepts.
struct KeyLister {
  std::vector<ConfigKey>* out;
  std::string prefix;  // "" or "section."
  template <class S, class M, class Spec>
  void operator()(const char* key, M S::*, const Spec& spec) {
    ConfigKey k{prefix + key, {}};
    if constexpr (std::is_same_v<Spec, ChoiceSpec>) k.choices = spec.names;
    out->push_back(std::move(k));
    if constexpr (std::is_same_v<Spec, SectionSpec>) {
      KeyLister sub{out, prefix + key + "."};
      visit_fields(sub, static_cast<M*>(nullptr));
    }
  }
};

/// Reads the keys of section `s` into `obj`; an absent key keeps obj's value (the default, or the
/// base config of config_with_overrides).
template <class S>
struct Reader {
  const Section& s;
  S& obj;
  void operator()(const char* key, std::string S::*m, const PathSpec& p) const {
    obj.*m = s.get_path(key, obj.*m, !p.required);
  }
  void operator()(const char* key, std::string S::*m, const TextSpec&) const { obj.*m = s.get_string(key, obj.*m, true); }
  void operator()(const char* key, std::vector<data::DataSource> S::*m, const SourceListSpec& p) const {
    read_sources(s, key, p.required, obj.*m);
  }
  template <class M>
  void operator()(const char* key, M S::*m, const ChoiceSpec& c) const {
    if constexpr (std::is_same_v<M, std::string>) {
      obj.*m = s.get_choice(key, obj.*m, c.names, c.alias, c.alias_note);
    } else {
      const std::string name = s.get_choice(key, c.names.at(choice_index(obj.*m)), c.names, c.alias, c.alias_note);
      obj.*m = from_choice_index<M>(static_cast<size_t>(std::find(c.names.begin(), c.names.end(), name) - c.names.begin()));
    }
  }
  template <class M>
  void operator()(const char* key, M S::*m, const IntSpec& i) const {
    obj.*m = static_cast<M>(s.get_int(key, static_cast<int64_t>(obj.*m), i.ok, i.expected));
  }
  void operator()(const char* key, double S::*m, const NumberSpec& n) const {
    obj.*m = s.get_number(key, obj.*m, n.ok, n.expected);
  }
  void operator()(const char* key, bool S::*m, const BoolSpec&) const { obj.*m = s.get_bool(key, obj.*m); }
  void operator()(const char* key, std::vector<std::string> S::*m, const NameListSpec&) const {
    obj.*m = s.get_string_list(key, obj.*m);
  }
  void operator()(const char* key, std::map<std::string, std::string> S::*m, const NameMapSpec&) const {
    if (!s.has(key)) return;
    if (auto v = s.get_string_map(key)) obj.*m = std::move(*v);
  }
  template <class M>
  void operator()(const char* key, M S::*, const CustomSpec<S>& c) const { c.read(s, key, obj); }
};

/// Writes section `obj` as YAML map entries (to_yaml).
template <class S>
struct Emitter {
  YAML::Emitter& out;
  const S& obj;
  void operator()(const char* key, std::string S::*m, const PathSpec& p) const {
    if (!(p.omit_empty && (obj.*m).empty())) emit_path(out, key, obj.*m);
  }
  void operator()(const char* key, std::string S::*m, const TextSpec&) const { emit_string(out, key, obj.*m); }
  void operator()(const char* key, std::vector<data::DataSource> S::*m, const SourceListSpec&) const {
    emit_sources(out, key, obj.*m);
  }
  template <class M>
  void operator()(const char* key, M S::*m, const ChoiceSpec& c) const {
    if constexpr (std::is_same_v<M, std::string>) {
      if (!(c.omit_empty && (obj.*m).empty())) emit_string(out, key, obj.*m);
    } else {
      emit_plain(out, key, c.names.at(choice_index(obj.*m)));
    }
  }
  template <class M>
  void operator()(const char* key, M S::*m, const IntSpec&) const { emit_plain(out, key, obj.*m); }
  void operator()(const char* key, double S::*m, const NumberSpec&) const { emit_double(out, key, obj.*m); }
  void operator()(const char* key, bool S::*m, const BoolSpec&) const { emit_bool(out, key, obj.*m); }
  void operator()(const char* key, std::vector<std::string> S::*m, const NameListSpec&) const {
    emit_list(out, key, obj.*m);
  }
  void operator()(const char* key, std::map<std::string, std::string> S::*m, const NameMapSpec&) const {
    emit_map(out, key, obj.*m);
  }
  template <class M>
  void operator()(const char* key, M S::*, const CustomSpec<S>& c) const { c.emit(out, key, obj); }
  template <class M>
  void operator()(const char* key, M S::*m, const SectionSpec&) const {
    out << YAML::Key << key << YAML::Value << YAML::BeginMap;
    Emitter<M> sub{out, obj.*m};
    visit_fields(sub, static_cast<M*>(nullptr));
    out << YAML::EndMap;
  }
};

/// Compares two configs member by member, through the table (custom keys compare every member
/// they fill).
template <class S>
struct Equal {
  const S& a;
  const S& b;
  bool same = true;
  template <class M, class Spec>
  void operator()(const char*, M S::*m, const Spec& spec) {
    if constexpr (std::is_same_v<Spec, CustomSpec<S>>) {
      same = same && spec.equal(a, b);
    } else if constexpr (std::is_same_v<Spec, SectionSpec>) {
      Equal<M> sub{a.*m, b.*m};
      visit_fields(sub, static_cast<M*>(nullptr));
      same = same && sub.same;
    } else {
      same = same && a.*m == b.*m;
    }
  }
};

/// Reads the whole config from the top-level section; `base` supplies every absent key (and,
/// when `sections_optional`, every absent section). Each section's cross-field rules are kept in
/// `checks`, in table order, to run once every key has been read without error (read_config).
struct TopReader {
  const Section& top;
  Config& c;
  bool sections_optional;
  std::vector<std::pair<Section, void (*)(const Section&, Config&)>> checks;
  template <class Spec>
  void operator()(const char* key, std::string Config::*m, const Spec& spec) {
    Reader<Config>{top, c}(key, m, spec);
  }
  template <class M>
  void operator()(const char* key, M Config::*m, const SectionSpec& spec) {
    Section s = top.sub(key, section_keys(key), spec.required && !sections_optional);
    Reader<M> r{s, c.*m};
    visit_fields(r, static_cast<M*>(nullptr));
    if (spec.check) checks.emplace_back(std::move(s), spec.check);
  }
};

const std::vector<SchemaSection>& schema_sections() {
  static const std::vector<SchemaSection> sections = [] {
    std::vector<ConfigKey> keys;
    KeyLister lister{&keys, ""};
    visit_fields(lister, static_cast<Config*>(nullptr));
    std::vector<SchemaSection> out{{"", {}}};
    for (const ConfigKey& k : keys) {
      const size_t dot = k.key.find('.');
      if (dot == std::string::npos) {
        out[0].keys.push_back(k.key);
        continue;
      }
      const std::string section = k.key.substr(0, dot);
      if (out.back().name != section) out.push_back({section, {}});
      out.back().keys.push_back(k.key.substr(dot + 1));
    }
    return out;
  }();
  return sections;
}

const std::vector<std::string>& section_keys(const std::string& name) {
  for (const auto& s : schema_sections())
    if (s.name == name) return s.keys;
  fail("internal: no config section ", name);
}

// ---- overrides ----

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

/// Applies one "a.b.c=value" to the tree; records the override as the source of "a.b.c".
void apply_override(yaml::Node& root, const std::string& spec, Context& ctx) {
  const std::string src = "--set " + one_line(spec, 200);
  const size_t eq = spec.find('=');
  if (eq == std::string::npos) fail(src, ": expected section.key=value");
  if (first_invalid_utf8(spec) != std::string::npos) fail(src, ": not valid UTF-8");
  const std::string key = trim(spec.substr(0, eq));
  std::vector<std::string> parts;
  std::stringstream ks(key);
  for (std::string p; std::getline(ks, p, '.');) parts.push_back(p);
  if (key.empty() || key.back() == '.' ||
      std::any_of(parts.begin(), parts.end(), [](const std::string& p) { return p.empty(); }))
    fail(src, ": expected section.key=value, got an empty key name");
  yaml::Node value;
  try {
    const auto docs = yaml::parse_all(spec.substr(eq + 1), src);
    if (docs.size() > 1) fail(src, ": value is more than one YAML document");
    if (!docs.empty()) value = docs[0];
  } catch (const Error& e) {
    fail(src, ": value is not valid YAML (", one_line(e.what(), 160), ")");
  }
  if (!value.is_defined()) value.kind = yaml::Node::Kind::kScalar, value.plain = true;  // "a.b=": null
  yaml::Node* cur = &root;
  std::string prefix;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    prefix += (i ? "." : "") + parts[i];
    yaml::Node* child = cur->find(parts[i]);
    if (!child || child->is_null()) {
      if (!child) {
        yaml::Node k;
        k.kind = yaml::Node::Kind::kScalar;
        k.value = parts[i];
        cur->entries.emplace_back(std::move(k), yaml::Node::map());
        child = &cur->entries.back().second;
      } else {
        *child = yaml::Node::map();
      }
      if (!ctx.overrides.count(prefix)) ctx.overrides[prefix] = src;  // the override made this section
    } else if (!child->is_map()) {
      fail(src, ": ", prefix, " is not a section (it holds ", describe(*child), ")");
    }
    cur = child;
  }
  if (yaml::Node* existing = cur->find(parts.back())) {
    *existing = std::move(value);
  } else {
    yaml::Node k;
    k.kind = yaml::Node::Kind::kScalar;
    k.value = parts.back();
    cur->entries.emplace_back(std::move(k), std::move(value));
  }
  ctx.overrides[key] = src;
}

/// Reads the config in `root` (overrides already applied) into `base`: a key the tree does not
/// set keeps base's value; `sections_optional`: a required section may be absent (base has it).
/// Every error is thrown together (Context::throw_if_errors): first those of the keys, then, when
/// there are none, those of the cross-field rules.
Config read_config(const yaml::Node& root, const Context& ctx, Config base, bool sections_optional) {
  const Section top(ctx, "", root, yaml::Mark{}, section_keys(""));
  TopReader reader{top, base, sections_optional, {}};
  visit_fields(reader, static_cast<Config*>(nullptr));
  ctx.throw_if_errors();  // the rules below need valid values
  for (const auto& [section, check] : reader.checks) check(section, base);
  ctx.throw_if_errors();
  for (const auto& [key, where] : ctx.key_sources) base.key_sources[key] = where;
  return base;
}

Config parse_tree(yaml::Node root, Context& ctx, const std::vector<std::string>& overrides) {
  if (!root.is_defined() || root.is_null())
    fail(ctx.source, ": the config is empty (expected a map with output_dir, model, data, ...)");
  if (!root.is_map())
    ctx.fail_at("", root.mark, "expected a map of sections at the top level, got " + describe(root));
  for (const auto& o : overrides) apply_override(root, o, ctx);
  return read_config(root, ctx, Config{}, /*sections_optional=*/false);
}

}  // namespace

const char* to_string(LrScheduler v) { return kSchedulers.at(static_cast<size_t>(v)).c_str(); }
const char* to_string(ResumeMode v) {
  switch (v) {
    case ResumeMode::kAuto: return "auto";
    case ResumeMode::kNever: return "never";
    case ResumeMode::kPath: return "path";
  }
  return "?";
}

const std::vector<std::string>& known_model_presets() {
  static const std::vector<std::string> presets = preset_names();  // model/model_config.h
  return presets;
}

std::vector<std::string> config_warnings(const Config& c) {
  std::vector<std::string> out;
  if (!c.data.eval.empty() && c.data.val_set_size > 0)
    out.push_back("config: data.val_set_size (" + format_double(c.data.val_set_size) +
                  ") is ignored because data.eval is set");
  const TrainingConfig& t = c.training;
  if (t.lr_scheduler == LrScheduler::kConstant && (t.warmup_steps > 0 || t.warmup_ratio > 0))
    out.push_back("config: training.lr_scheduler constant does not warm up, as transformers' constant: " +
                  std::string(t.warmup_ratio > 0 ? "training.warmup_ratio (" + format_double(t.warmup_ratio) + ")"
                                                 : "training.warmup_steps (" + std::to_string(t.warmup_steps) + ")") +
                  " is not used (lr_scheduler: constant_with_warmup warms up, then stays constant)");
  else if (t.max_steps > 0 && t.warmup_steps >= t.max_steps)
    out.push_back("config: training.warmup_steps (" + std::to_string(t.warmup_steps) + ") >= training.max_steps (" +
                  std::to_string(t.max_steps) + "): the run never leaves warmup");
  return out;
}

Config parse_config_string(const std::string& yaml_text, const std::string& source_name,
                           const std::vector<std::string>& overrides) {
  Context ctx{source_name, {}, {}, {}};
  if (const size_t bad = first_invalid_utf8(yaml_text); bad != std::string::npos)
    fail(source_name, ":", 1 + std::count(yaml_text.begin(), yaml_text.begin() + bad, '\n'),
         ": not valid UTF-8 (byte ", bad, "; YAML text must be UTF-8)");  // said here, with the byte, before libyaml
  std::vector<yaml::Node> docs;
  try {
    docs = yaml::parse_all(yaml_text, source_name);
  } catch (const yaml::ParseError& e) {
    // YAML forbids tabs in indentation; libyaml says only "found character that cannot start any token".
    std::istringstream lines(yaml_text);
    std::string text;
    for (int64_t i = 0; i <= e.mark.line && std::getline(lines, text); ++i) {}
    const size_t first = text.find_first_not_of(' ');
    if (e.mark.line < 0 || first == std::string::npos || text[first] != '\t') throw;
    fail(one_line(e.what(), 300), " (a tab in the indentation; YAML indents with spaces)");
  }
  if (docs.size() > 1)
    ctx.fail_at("", docs[1].mark, "expected one YAML document, found " + std::to_string(docs.size()));
  // A stream with no document, or one whose document is empty, has nothing to train.
  return parse_tree(docs.empty() ? yaml::Node() : docs[0], ctx, overrides);
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) fail(path, ": is a directory, expected a YAML config file");
  check_regular_file(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, ": cannot open config file");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) fail(path, ": cannot read config file");
  return parse_config_string(text.str(), path, overrides);
}

std::string to_yaml(const Config& c) {
  YAML::Emitter out;
  // A comment: not part of the run's fingerprint (run_fingerprint reads the flattened tree).
  out << YAML::Comment("resolved qlora-cpp config: every key, defaults included; of model.path and "
                       "model.preset, the one set (docs/config.md)");
  out << YAML::Newline << YAML::BeginMap;
  Emitter<Config> emitter{out, c};
  visit_fields(emitter, static_cast<Config*>(nullptr));
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

bool operator==(const Config& a, const Config& b) {
  Equal<Config> equal{a, b};
  visit_fields(equal, static_cast<Config*>(nullptr));
  return equal.same;
}

Config config_with_overrides(const Config& base, const std::vector<std::string>& overrides,
                             const std::string& source_name) {
  Context ctx{source_name, {}, {}, {}};
  yaml::Node root = yaml::Node::map();
  for (const auto& o : overrides) apply_override(root, o, ctx);
  return read_config(root, ctx, base, /*sections_optional=*/true);
}

std::vector<std::string> parse_target_modules(const std::string& value, const std::string& source_name) {
  Context ctx{source_name, {{"lora", source_name}, {"lora.target_modules", source_name}}, {}, {}};
  yaml::Node node;
  try {
    const auto docs = yaml::parse_all(value, source_name);
    if (docs.size() > 1) fail(source_name, ": value is more than one YAML document");
    if (!docs.empty()) node = docs[0];
  } catch (const Error& e) {
    fail(source_name, ": value is not valid YAML (", one_line(e.what(), 160), ")");
  }
  if (!node.is_defined()) node.kind = yaml::Node::Kind::kScalar, node.plain = true;
  yaml::Node key;
  key.kind = yaml::Node::Kind::kScalar;
  key.value = "target_modules";
  yaml::Node section = yaml::Node::map();
  section.entries.emplace_back(std::move(key), std::move(node));
  const Section lora(ctx, "lora", section, yaml::Mark{}, section_keys("lora"));
  LoraConfig l;
  read_target_modules(lora, "target_modules", l);  // the config's own reader and checks
  ctx.throw_if_errors();
  return l.target_modules;
}

std::vector<data::DataSource> data_sources_in(const std::string& config_yaml, const std::string& key,
                                             const std::string& source_name) {
  QLORA_CHECK(key == "train" || key == "eval", "internal: data_sources_in: no data key ", key);
  Context ctx{source_name, {}, {}, {}};
  const auto docs = yaml::parse_all(config_yaml, source_name);
  const yaml::Node* d = docs.empty() || !docs[0].is_map() ? nullptr : docs[0].find("data");
  const yaml::Node* v = d && d->is_map() ? d->find(key) : nullptr;
  if (!v) return {};
  yaml::Node k;
  k.kind = yaml::Node::Kind::kScalar;
  k.value = key;
  yaml::Node section = yaml::Node::map();
  section.entries.emplace_back(std::move(k), *v);
  const Section s(ctx, "data", section, yaml::Mark{}, section_keys("data"));
  std::vector<data::DataSource> out;
  read_sources(s, key.c_str(), false, out);  // the config's own reader
  ctx.throw_if_errors();
  return out;
}

std::vector<ConfigKey> config_keys() {
  std::vector<ConfigKey> keys;
  KeyLister lister{&keys, ""};
  visit_fields(lister, static_cast<Config*>(nullptr));
  return keys;
}

std::string with_key_source(const Config& c, const std::string& msg) {
  const size_t colon = msg.find(": ");
  if (colon == std::string::npos) return msg;
  const auto it = c.key_sources.find(msg.substr(0, colon));
  return it == c.key_sources.end() ? msg : it->second + ": " + msg;
}

std::string tokenizer_source(const ModelSource& m) {
  namespace fs = std::filesystem;
  if (!m.path.empty()) {
    std::error_code ec;
    QLORA_CHECK(fs::exists(m.path, ec), "model.path: ", m.path, ": model directory not found", relative_path_note(m.path));
    const std::string gguf = gguf::gguf_instead_of_model_dir(m.path);  // by its magic: Ollama's blobs have no .gguf
    QLORA_CHECK(fs::is_directory(m.path, ec) || gguf.empty(), "model.path: ", gguf);
    QLORA_CHECK(fs::is_directory(m.path, ec), "model.path: ", m.path,
                " is a file, expected a Hugging Face model directory (config.json, *.safetensors, tokenizer)",
                fs::path(m.path).extension() == ".gguf" ? "; import a GGUF file first: qlora import-gguf FILE --out DIR"
                                                        : "");
  }
  QLORA_CHECK(!m.tokenizer.empty() || !m.path.empty(),
              "model.tokenizer: a preset model needs a tokenizer (a tokenizer.model file or a model dir)");
  // What Tokenizer::from_pretrained reads (a tokenizer file, or a directory holding tokenizer.json
  // or tokenizer.model), checked here so that a missing one is named by its key and file:line.
  const bool own = !m.tokenizer.empty();
  const std::string src = own ? m.tokenizer : m.path;
  const char* key = own ? "model.tokenizer: " : "model.path: ";
  std::error_code ec;
  QLORA_CHECK(fs::exists(src, ec), key, src,
              ": tokenizer not found (expected a tokenizer.json or tokenizer.model file, or a directory holding one)",
              relative_path_note(src));
  if (fs::is_directory(src, ec))
    QLORA_CHECK(fs::exists(fs::path(src) / "tokenizer.json", ec) || fs::exists(fs::path(src) / "tokenizer.model", ec),
                key, src, ": no tokenizer.json or tokenizer.model in this directory",
                own ? "" : " (model.tokenizer names a tokenizer kept elsewhere)");
  return src;
}

void check_model_weights(const ModelSource& m) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (m.path.empty() || m.random_init || !fs::is_directory(m.path, ec)) return;  // tokenizer_source names a bad path
  if (st::SafetensorsCheckpoint::present_in(m.path)) return;  // what the model load opens
  std::string why = st::other_weights_hint(m.path);
  if (why.empty()) why = "a directory with config.json only gives a shape: model.init: random draws the weights";
  fail("model.path: ", m.path, ": no model.safetensors or model.safetensors.index.json (", why, ")");
}

}  // namespace qlora
