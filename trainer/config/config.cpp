// qlora-cpp training config: YAML -> overrides -> strict schema walk -> typed structs.
//
// The schema walk never uses yaml-cpp's as<T>() conversions: every value is classified here so the
// rules are ours and documented (docs/config.md): YAML 1.2 core numbers and booleans, quoted
// scalars are always strings, unknown keys are errors with a did-you-mean, and every message is one
// line that starts with `file:line:` (or the `--set` override that supplied the value).
#include "trainer/config/config.h"
#include "trainer/model_config.h"

#include <spdlog/spdlog.h>
#include <yaml-cpp/yaml.h>  // the emitter only (to_yaml); parsing is common/yaml.h (libyaml)

#include <algorithm>
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
#include <tuple>
#include <utility>

#include "common/error.h"
#include "common/utf8.h"
#include "common/yaml.h"

namespace qlora {
namespace {

// ---- the schema's key lists (one per section; docs/config.md documents each key) ----

const std::vector<std::string> kTopKeys = {"output_dir", "model",    "quantization", "lora",
                                           "data",       "training", "checkpoint",   "cost"};
const std::vector<std::string> kModelKeys = {"path", "preset", "init", "tokenizer", "dtype"};
const std::vector<std::string> kQuantKeys = {"method", "double_quant", "blocksize", "keep_16bit"};
const std::vector<std::string> kLoraKeys = {"r", "alpha", "dropout", "target_modules", "use_rslora"};
const std::vector<std::string> kDataKeys = {
    "train",          "eval",       "format",        "template",    "sequence_len", "truncation",
    "train_on_inputs", "add_eos",   "sample_packing", "padding_side", "val_set_size", "seed",
    "shuffle",        "skip_invalid", "field_map",   "role_map"};
const std::vector<std::string> kTrainingKeys = {
    "micro_batch_size", "gradient_accumulation_steps", "num_epochs",   "max_steps",
    "learning_rate",    "lr_scheduler",                "warmup_steps", "warmup_ratio",
    "weight_decay",     "adam_beta1",                  "adam_beta2",   "adam_epsilon",
    "max_grad_norm",    "gradient_checkpointing",      "seed",         "logging_steps",
    "max_nonfinite_steps", "eval_steps"};
const std::vector<std::string> kCheckpointKeys = {"save_steps", "save_minutes",    "keep_last",
                                                  "resume",     "resume_from_dir", "sync_command"};
const std::vector<std::string> kCostKeys = {"gpu_hour_price"};

const std::vector<std::pair<std::string, const std::vector<std::string>*>> kSections = {
    {"model", &kModelKeys}, {"quantization", &kQuantKeys},   {"lora", &kLoraKeys},
    {"data", &kDataKeys},   {"training", &kTrainingKeys},    {"checkpoint", &kCheckpointKeys},
    {"cost", &kCostKeys}};

const std::vector<std::string> kDTypes = {"bf16", "fp16", "fp32", "auto"};
const std::vector<std::string> kQuantMethods = {"nf4", "fp4", "none"};
const std::vector<std::string> kSchedulers = {"constant", "linear", "cosine"};
const std::vector<std::string> kInits = {"pretrained", "random"};
const std::vector<std::string> kFormats = {"auto", "alpaca", "sharegpt", "messages", "completion"};
// = data::template_names() plus "auto" (resolved from the model's chat template when the data
// is loaded: data::resolve_template). Keep in sync (tests/badinput pins this list).
const std::vector<std::string> kTemplates = {"alpaca", "chatml",  "llama2", "vicuna", "none", "smollm2",
                                             "qwen2.5", "qwen3", "llama3", "mistral", "auto"};
const std::vector<std::string> kTruncations = {"drop", "truncate"};
const std::vector<std::string> kPaddingSides = {"right", "left"};

// ---- small string helpers ----

/// Optimal-string-alignment distance (Levenshtein plus adjacent transpositions).
size_t edit_distance(const std::string& a, const std::string& b) {
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[n][m];
}

/// The candidate closest to `word` when it is close enough to be a likely typo, else "".
std::string closest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const auto& c : candidates) {
    const size_t d = edit_distance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  const size_t limit = std::max<size_t>(2, word.size() / 3);
  return best_d <= limit ? best : std::string();
}

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

struct Context {
  std::string source;                            // file name for messages
  std::map<std::string, std::string> overrides;  // dotted key -> "--set key=value"

  /// `file:line` of `mark`, or the override that set `path` (or a section above it).
  std::string where(const std::string& path, const yaml::Mark& mark) const {
    std::string p = path;
    while (!p.empty()) {
      auto it = overrides.find(p);
      if (it != overrides.end()) return it->second;
      const size_t cut = p.find_last_of(".[");
      if (cut == std::string::npos) break;
      p.resize(cut);
    }
    if (mark.is_null() || mark.line < 0) return source;
    return source + ":" + std::to_string(mark.line + 1);
  }

  [[noreturn]] void error(const std::string& path, const yaml::Mark& mark, const std::string& msg) const {
    fail(where(path, mark), ": ", path.empty() ? std::string() : path + ": ", msg);
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
/// did-you-mean), then hands out typed values; each getter checks type and range.
class Section {
 public:
  /// `node` is the section's value (undefined or null: empty section); `key_mark` is where its
  /// key sits (for "missing key" errors); `path` is its dotted name ("" for the top level).
  Section(const Context& ctx, std::string path, const yaml::Node& node, yaml::Mark key_mark,
          const std::vector<std::string>& keys)
      : ctx_(ctx), path_(std::move(path)), mark_(key_mark), keys_(keys) {
    if (!node.is_defined() || node.is_null()) return;
    if (!node.is_map()) {
      ctx_.error(path_, node.mark,
                 "expected a map of " + (path_.empty() ? std::string("sections") : "keys") +
                     ", got " + describe(node));
    }
    for (const auto& [k, v] : node.entries) {
      if (!k.is_scalar() || k.value.empty())
        ctx_.error(path_, k.mark, "keys must be plain names, got " + describe(k));
      const std::string& name = k.value;
      const std::string full = key_path(name);
      for (const auto& e : entries_)
        if (e.name == name)
          ctx_.error(full, k.mark,
                     "duplicate key (first set on line " + std::to_string(e.key_mark.line + 1) + ")");
      if (!contains(keys_, name)) ctx_.error(full, k.mark, unknown_key_message(name));
      entries_.push_back({name, k.mark, v});
    }
  }

  bool has(const std::string& key) const { return find(key) != nullptr; }
  std::string key_path(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

  /// Throws a one-line error about `key` (at its value when present, else at the section).
  [[noreturn]] void error(const std::string& key, const std::string& msg) const {
    const auto* e = find(key);
    ctx_.error(key_path(key), e ? e->value.mark : mark_, msg);
  }
  /// Throws a one-line error about item `i` of the list under `key`.
  [[noreturn]] void item_error(const std::string& key, size_t i, const std::string& msg) const {
    const auto* e = find(key);
    const yaml::Mark m = e && e->value.is_sequence() && i < e->value.items.size() ? e->value.items[i].mark : mark_;
    ctx_.error(key_path(key) + "[" + std::to_string(i) + "]", m, msg);
  }
  /// Throws a one-line error about the section itself.
  [[noreturn]] void section_error(const std::string& msg) const { ctx_.error(path_, mark_, msg); }

  /// A nested section; `required`: its absence is an error.
  Section sub(const std::string& key, const std::vector<std::string>& keys, bool required) const {
    const auto* e = find(key);
    if (!e) {
      if (required) ctx_.error(key_path(key), mark_, "required section is missing");
      return Section(ctx_, key_path(key), yaml::Node(), mark_, keys);
    }
    return Section(ctx_, key_path(key), e->value, e->key_mark, keys);
  }

  /// The raw value node of `key` (nullptr when absent). For keys with a shape of their own.
  const yaml::Node* raw(const std::string& key) const {
    const auto* e = find(key);
    return e ? &e->value : nullptr;
  }

  std::string get_string(const std::string& key, const std::string& def, bool allow_empty) const {
    const auto* e = find(key);
    if (!e) {
      if (!allow_empty && def.empty()) error(key, "required key is missing");
      return def;
    }
    std::string v;
    if (e->value.is_null()) v = "";
    else if (e->value.is_scalar()) v = e->value.value;
    else error(key, "expected a string, got " + describe(e->value));
    if (v.empty() && !allow_empty) error(key, "expected a non-empty string, got " + describe(e->value));
    return v;
  }

  /// A path key: get_string, then `~` and environment variables expanded (expand_path).
  std::string get_path(const std::string& key, const std::string& def, bool allow_empty) const {
    std::string why;
    const std::string raw = get_string(key, def, allow_empty);
    const std::string v = expand_path(raw, &why);
    if (!why.empty()) error(key, why);
    if (v.empty() && !allow_empty) error(key, "expected a non-empty path, got \"" + raw + "\" (after expansion)");
    return v;
  }

  std::string get_choice(const std::string& key, const std::string& def,
                         const std::vector<std::string>& choices) const {
    const auto* e = find(key);
    if (!e) return def;
    const std::string expected = "expected one of " + join(choices, "|");
    if (!e->value.is_scalar()) error(key, expected + ", got " + describe(e->value));
    const std::string& v = e->value.value;
    if (!contains(choices, v)) {
      const std::string near = closest(v, choices);
      error(key, expected + ", got " + describe(e->value) +
                     (near.empty() ? std::string() : "; did you mean \"" + near + "\"?"));
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
    if (!v || !ok(*v)) error(key, "expected " + expected + ", got " + describe(e->value));
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
    if (!v || !std::isfinite(*v) || !ok(*v))
      error(key, "expected " + expected + ", got " + describe(e->value));
    return *v;
  }

  /// A list of non-empty strings (null: empty list).
  std::vector<std::string> get_string_list(const std::string& key,
                                           const std::vector<std::string>& def) const {
    const auto* e = find(key);
    if (!e) return def;
    if (e->value.is_null()) return {};
    if (!e->value.is_sequence()) error(key, "expected a list of names, got " + describe(e->value));
    std::vector<std::string> out;
    for (size_t i = 0; i < e->value.items.size(); ++i) {
      const yaml::Node& item = e->value.items[i];
      const std::string ipath = key_path(key) + "[" + std::to_string(i) + "]";
      if (!item.is_scalar() || item.value.empty())
        ctx_.error(ipath, item.mark, "expected a name, got " + describe(item));
      if (contains(out, item.value)) ctx_.error(ipath, item.mark, "\"" + one_line(item.value) + "\" is listed twice");
      out.push_back(item.value);
    }
    return out;
  }

  /// A map of string -> string (null: empty map).
  std::map<std::string, std::string> get_string_map(const std::string& key) const {
    const auto* e = find(key);
    std::map<std::string, std::string> out;
    if (!e || e->value.is_null()) return out;
    if (!e->value.is_map()) error(key, "expected a map of name: name, got " + describe(e->value));
    for (const auto& [k, v] : e->value.entries) {
      if (!k.is_scalar() || k.value.empty())
        ctx_.error(key_path(key), k.mark, "keys must be plain names, got " + describe(k));
      const std::string kpath = key_path(key) + "." + k.value;
      if (out.count(k.value)) ctx_.error(kpath, k.mark, "duplicate key");
      if (!v.is_scalar() || v.value.empty())
        ctx_.error(kpath, v.mark, "expected a name, got " + describe(v));
      out[k.value] = v.value;
    }
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

  std::string unknown_key_message(const std::string& name) const {
    const std::string near = closest(name, keys_);
    if (!near.empty()) return "unknown key; did you mean \"" + near + "\"?";
    // A key of another section written in the wrong place (e.g. top-level `learning_rate`).
    for (const auto& [section, keys] : kSections)
      if (section != path_ && contains(*keys, name))
        return "unknown key; did you mean \"" + section + "." + name + "\" (it belongs under " + section + ":)?";
    return "unknown key (expected one of: " + join(keys_, ", ") + ")";
  }

  const Context& ctx_;
  std::string path_;
  yaml::Mark mark_;
  const std::vector<std::string>& keys_;
  std::vector<Entry> entries_;
};

// ---- range checks, in words ----

const auto kPositive = [](int64_t v) { return v > 0; };
const auto kNonNegative = [](int64_t v) { return v >= 0; };
const char* const kPositiveInt = "a positive integer";
const char* const kNonNegativeInt = "an integer >= 0";

template <typename E>
E enum_from(const std::string& s, const std::vector<std::string>& names) {
  return static_cast<E>(std::find(names.begin(), names.end(), s) - names.begin());
}

// ---- sections ----

ModelSource read_model(const Section& top) {
  const Section s = top.sub("model", kModelKeys, /*required=*/true);
  ModelSource m;
  m.path = s.get_path("path", "", true);
  if (s.has("preset")) m.preset = s.get_choice("preset", "", known_model_presets());
  m.random_init = s.get_choice("init", "pretrained", kInits) == "random";
  m.tokenizer = s.get_path("tokenizer", "", true);
  m.dtype = enum_from<DType>(s.get_choice("dtype", "bf16", kDTypes), kDTypes);
  if (m.path.empty() && m.preset.empty())
    s.section_error("set model.path (a Hugging Face model dir) or model.preset (with init: random)");
  if (!m.path.empty() && !m.preset.empty()) s.error("preset", "set model.path or model.preset, not both");
  if (!m.preset.empty() && !m.random_init)
    s.error(s.has("init") ? "init" : "preset", "a preset has no weights; set model.init: random");
  return m;
}

QuantConfig read_quantization(const Section& top) {
  const Section s = top.sub("quantization", kQuantKeys, false);
  QuantConfig q;
  q.method = enum_from<QuantMethod>(s.get_choice("method", "nf4", kQuantMethods), kQuantMethods);
  q.double_quant = s.get_bool("double_quant", q.double_quant);
  q.blocksize = s.get_int("blocksize", q.blocksize,
                          [](int64_t v) { return v >= 32 && v <= 4096 && (v & (v - 1)) == 0; },
                          "a power of two in [32, 4096]");
  q.keep_16bit = s.get_string_list("keep_16bit", q.keep_16bit);
  return q;
}

LoraConfig read_lora(const Section& top) {
  const Section s = top.sub("lora", kLoraKeys, false);
  LoraConfig l;
  l.r = s.get_int("r", l.r, kPositive, kPositiveInt);
  l.alpha = s.get_number("alpha", l.alpha, [](double v) { return v > 0; }, "a positive number");
  l.dropout = s.get_number("dropout", l.dropout, [](double v) { return v >= 0 && v < 1; },
                           "a number in [0, 1)");
  const yaml::Node* t = s.raw("target_modules");
  if (!t || (t->is_scalar() && t->value == "all-linear")) {
    l.all_linear = true;
    l.target_modules = known_lora_targets();
  } else if (t->is_sequence()) {
    l.all_linear = false;
    l.target_modules = s.get_string_list("target_modules", {});
    if (l.target_modules.empty()) s.error("target_modules", "expected at least one module name");
    for (size_t i = 0; i < l.target_modules.size(); ++i) {
      const std::string& name = l.target_modules[i];
      if (contains(known_lora_targets(), name)) continue;
      const std::string near = closest(name, known_lora_targets());
      s.item_error("target_modules", i,
                   "unknown module \"" + one_line(name) + "\"" +
                       (near.empty() ? " (known: " + join(known_lora_targets(), ", ") + ")"
                                     : "; did you mean \"" + near + "\"?"));
    }
  } else {
    s.error("target_modules", "expected \"all-linear\" or a list of module names, got " + describe(*t));
  }
  l.use_rslora = s.get_bool("use_rslora", l.use_rslora);
  return l;
}

data::DataOptions read_data(const Section& top) {
  const Section s = top.sub("data", kDataKeys, /*required=*/true);
  data::DataOptions d;
  d.train = s.get_path("train", "", /*allow_empty=*/false);
  d.eval = s.get_path("eval", d.eval, true);
  d.format = s.get_choice("format", d.format, kFormats);
  d.template_name = s.get_choice("template", d.template_name, kTemplates);
  d.sequence_len = s.get_int("sequence_len", d.sequence_len, kPositive, kPositiveInt);
  d.truncation = s.get_choice("truncation", d.truncation, kTruncations);
  d.train_on_inputs = s.get_bool("train_on_inputs", d.train_on_inputs);
  d.add_eos = s.get_bool("add_eos", d.add_eos);
  d.sample_packing = s.get_bool("sample_packing", d.sample_packing);
  d.padding_side = s.get_choice("padding_side", d.padding_side, kPaddingSides);
  d.val_set_size = s.get_number("val_set_size", d.val_set_size,
                                [](double v) { return v >= 0 && (v < 1 || std::floor(v) == v); },
                                "a fraction in [0, 1) or a whole count >= 1");
  d.seed = static_cast<uint64_t>(s.get_int("seed", static_cast<int64_t>(d.seed), kNonNegative, kNonNegativeInt));
  d.shuffle = s.get_bool("shuffle", d.shuffle);
  d.skip_invalid = s.get_bool("skip_invalid", d.skip_invalid);
  d.field_map = s.get_string_map("field_map");
  d.role_map = s.get_string_map("role_map");
  if (!d.eval.empty() && d.val_set_size > 0)
    spdlog::warn("config: data.val_set_size ({}) is ignored because data.eval is set", d.val_set_size);
  return d;
}

TrainingConfig read_training(const Section& top, const data::DataOptions& d) {
  const Section s = top.sub("training", kTrainingKeys, false);
  TrainingConfig t;
  auto unit = [](double v) { return v >= 0 && v < 1; };
  t.micro_batch_size = s.get_int("micro_batch_size", t.micro_batch_size, kPositive, kPositiveInt);
  t.gradient_accumulation_steps =
      s.get_int("gradient_accumulation_steps", t.gradient_accumulation_steps, kPositive, kPositiveInt);
  t.num_epochs = s.get_int("num_epochs", t.num_epochs, kNonNegative, kNonNegativeInt);
  t.max_steps = s.get_int("max_steps", t.max_steps, [](int64_t v) { return v >= -1; },
                          "an integer >= -1 (-1: run num_epochs)");
  t.learning_rate = s.get_number("learning_rate", t.learning_rate, [](double v) { return v > 0; },
                                 "a positive number");
  t.lr_scheduler = enum_from<LrScheduler>(s.get_choice("lr_scheduler", "cosine", kSchedulers), kSchedulers);
  t.warmup_steps = s.get_int("warmup_steps", t.warmup_steps, kNonNegative, kNonNegativeInt);
  t.warmup_ratio = s.get_number("warmup_ratio", t.warmup_ratio, unit, "a number in [0, 1)");
  t.weight_decay = s.get_number("weight_decay", t.weight_decay, [](double v) { return v >= 0; },
                                "a number >= 0");
  t.adam_beta1 = s.get_number("adam_beta1", t.adam_beta1, unit, "a number in [0, 1)");
  t.adam_beta2 = s.get_number("adam_beta2", t.adam_beta2, unit, "a number in [0, 1)");
  t.adam_epsilon = s.get_number("adam_epsilon", t.adam_epsilon, [](double v) { return v > 0; },
                                "a positive number");
  t.max_grad_norm = s.get_number("max_grad_norm", t.max_grad_norm, [](double v) { return v >= 0; },
                                 "a number >= 0 (0: no clipping)");
  t.gradient_checkpointing = s.get_bool("gradient_checkpointing", t.gradient_checkpointing);
  t.seed = static_cast<uint64_t>(s.get_int("seed", static_cast<int64_t>(t.seed), kNonNegative, kNonNegativeInt));
  t.logging_steps = s.get_int("logging_steps", t.logging_steps, kPositive, kPositiveInt);
  t.max_nonfinite_steps = s.get_int("max_nonfinite_steps", t.max_nonfinite_steps, kNonNegative, kNonNegativeInt);
  t.eval_steps = s.get_int("eval_steps", t.eval_steps, kNonNegative, kNonNegativeInt);

  // Cross-field rules.
  if (t.max_steps <= 0 && t.num_epochs <= 0)
    s.error(s.has("max_steps") ? "max_steps" : "num_epochs",
            "nothing to train: set training.num_epochs > 0 or training.max_steps > 0");
  if (t.warmup_ratio > 0) {
    if (s.has("warmup_steps") && t.warmup_steps > 0)
      s.error("warmup_ratio", "set training.warmup_steps or training.warmup_ratio, not both");
    t.warmup_steps = 0;  // the ratio replaces the default step count
  }
  if (t.eval_steps > 0 && d.eval.empty() && d.val_set_size <= 0)
    s.error("eval_steps", "no eval data: set data.eval or data.val_set_size > 0, or eval_steps: 0");
  if (t.max_steps > 0 && t.warmup_steps >= t.max_steps)
    spdlog::warn("config: training.warmup_steps ({}) >= training.max_steps ({}): the run never leaves warmup",
                 t.warmup_steps, t.max_steps);
  return t;
}

CheckpointConfig read_checkpoint(const Section& top) {
  const Section s = top.sub("checkpoint", kCheckpointKeys, false);
  CheckpointConfig c;
  c.save_steps = s.get_int("save_steps", c.save_steps, kNonNegative, "an integer >= 0 (0: off)");
  c.save_minutes = s.get_number("save_minutes", c.save_minutes, [](double v) { return v >= 0; },
                                "a number >= 0 (0: off)");
  c.keep_last = s.get_int("keep_last", c.keep_last, kPositive, "an integer >= 1");
  if (const yaml::Node* r = s.raw("resume")) {
    if (r->is_scalar() && is_plain(*r) &&
        (is_true_word(r->value) || is_false_word(r->value) || is_yaml11_bool_word(r->value)))
      s.error("resume", "expected auto, never or a checkpoint path, got " + describe(*r));
    const std::string v = s.get_string("resume", "auto", false);
    if (v == "auto") c.resume = ResumeMode::kAuto;
    else if (v == "never") c.resume = ResumeMode::kNever;
    else c.resume = ResumeMode::kPath, c.resume_path = s.get_path("resume", "auto", false);
  }
  c.resume_from_dir = s.get_path("resume_from_dir", "", true);
  c.sync_command = s.get_string("sync_command", "", true);
  if (c.resume == ResumeMode::kPath && !c.resume_from_dir.empty())
    s.error("resume_from_dir", "is only used with resume: auto (resume names a checkpoint path)");
  return c;
}

CostConfig read_cost(const Section& top) {
  const Section s = top.sub("cost", kCostKeys, false);
  CostConfig c;
  c.gpu_hour_price = s.get_number("gpu_hour_price", c.gpu_hour_price, [](double v) { return v >= 0; },
                                  "a number >= 0");
  return c;
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

// ---- emitting ----

/// Shortest decimal text that reads back as exactly `v`.
std::string format_double(double v) {
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

Config parse_tree(yaml::Node root, Context& ctx, const std::vector<std::string>& overrides) {
  if (!root.is_defined() || root.is_null())
    fail(ctx.source, ": the config is empty (expected a map with output_dir, model, data, ...)");
  if (!root.is_map())
    ctx.error("", root.mark, "expected a map of sections at the top level, got " + describe(root));
  for (const auto& o : overrides) apply_override(root, o, ctx);

  const Section top(ctx, "", root, yaml::Mark{}, kTopKeys);
  Config c;
  c.output_dir = top.get_path("output_dir", "", /*allow_empty=*/false);
  c.model = read_model(top);
  c.quantization = read_quantization(top);
  c.lora = read_lora(top);
  c.data = read_data(top);
  c.training = read_training(top, c.data);
  c.checkpoint = read_checkpoint(top);
  c.cost = read_cost(top);
  return c;
}

}  // namespace

const char* to_string(DType v) { return kDTypes.at(static_cast<size_t>(v)).c_str(); }
const char* to_string(QuantMethod v) { return kQuantMethods.at(static_cast<size_t>(v)).c_str(); }
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
  static const std::vector<std::string> presets = preset_names();  // trainer/model_config.h
  return presets;
}

const std::vector<std::string>& known_lora_targets() {
  static const std::vector<std::string> targets = {"q_proj", "k_proj",  "v_proj",   "o_proj",
                                                   "gate_proj", "up_proj", "down_proj"};
  return targets;
}

Config parse_config_string(const std::string& yaml_text, const std::string& source_name,
                           const std::vector<std::string>& overrides) {
  Context ctx{source_name, {}};
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
    ctx.error("", docs[1].mark, "expected one YAML document, found " + std::to_string(docs.size()));
  // A stream with no document, or one whose document is empty, has nothing to train.
  return parse_tree(docs.empty() ? yaml::Node() : docs[0], ctx, overrides);
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) fail(path, ": is a directory, expected a YAML config file");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, ": cannot open config file");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) fail(path, ": cannot read config file");
  return parse_config_string(text.str(), path, overrides);
}

std::string to_yaml(const Config& c) {
  YAML::Emitter out;
  out << YAML::Comment("resolved qlora-cpp config: every key, defaults included (docs/config.md)");
  out << YAML::Newline << YAML::BeginMap;
  emit_string(out, "output_dir", c.output_dir);

  out << YAML::Key << "model" << YAML::Value << YAML::BeginMap;
  if (!c.model.path.empty()) emit_string(out, "path", c.model.path);
  if (!c.model.preset.empty()) emit_string(out, "preset", c.model.preset);
  emit_plain(out, "init", c.model.random_init ? "random" : "pretrained");
  emit_string(out, "tokenizer", c.model.tokenizer);
  emit_plain(out, "dtype", to_string(c.model.dtype));
  out << YAML::EndMap;

  out << YAML::Key << "quantization" << YAML::Value << YAML::BeginMap;
  emit_plain(out, "method", to_string(c.quantization.method));
  emit_bool(out, "double_quant", c.quantization.double_quant);
  emit_plain(out, "blocksize", c.quantization.blocksize);
  emit_list(out, "keep_16bit", c.quantization.keep_16bit);
  out << YAML::EndMap;

  out << YAML::Key << "lora" << YAML::Value << YAML::BeginMap;
  emit_plain(out, "r", c.lora.r);
  emit_double(out, "alpha", c.lora.alpha);
  emit_double(out, "dropout", c.lora.dropout);
  if (c.lora.all_linear) emit_plain(out, "target_modules", "all-linear");
  else emit_list(out, "target_modules", c.lora.target_modules);
  emit_bool(out, "use_rslora", c.lora.use_rslora);
  out << YAML::EndMap;

  const auto& d = c.data;
  out << YAML::Key << "data" << YAML::Value << YAML::BeginMap;
  emit_string(out, "train", d.train);
  emit_string(out, "eval", d.eval);
  emit_plain(out, "format", d.format);
  emit_plain(out, "template", d.template_name);
  emit_plain(out, "sequence_len", d.sequence_len);
  emit_plain(out, "truncation", d.truncation);
  emit_bool(out, "train_on_inputs", d.train_on_inputs);
  emit_bool(out, "add_eos", d.add_eos);
  emit_bool(out, "sample_packing", d.sample_packing);
  emit_plain(out, "padding_side", d.padding_side);
  emit_double(out, "val_set_size", d.val_set_size);
  emit_plain(out, "seed", d.seed);
  emit_bool(out, "shuffle", d.shuffle);
  emit_bool(out, "skip_invalid", d.skip_invalid);
  emit_map(out, "field_map", d.field_map);
  emit_map(out, "role_map", d.role_map);
  out << YAML::EndMap;

  const auto& t = c.training;
  out << YAML::Key << "training" << YAML::Value << YAML::BeginMap;
  emit_plain(out, "micro_batch_size", t.micro_batch_size);
  emit_plain(out, "gradient_accumulation_steps", t.gradient_accumulation_steps);
  emit_plain(out, "num_epochs", t.num_epochs);
  emit_plain(out, "max_steps", t.max_steps);
  emit_double(out, "learning_rate", t.learning_rate);
  emit_plain(out, "lr_scheduler", to_string(t.lr_scheduler));
  emit_plain(out, "warmup_steps", t.warmup_steps);
  emit_double(out, "warmup_ratio", t.warmup_ratio);
  emit_double(out, "weight_decay", t.weight_decay);
  emit_double(out, "adam_beta1", t.adam_beta1);
  emit_double(out, "adam_beta2", t.adam_beta2);
  emit_double(out, "adam_epsilon", t.adam_epsilon);
  emit_double(out, "max_grad_norm", t.max_grad_norm);
  emit_bool(out, "gradient_checkpointing", t.gradient_checkpointing);
  emit_plain(out, "seed", t.seed);
  emit_plain(out, "logging_steps", t.logging_steps);
  emit_plain(out, "max_nonfinite_steps", t.max_nonfinite_steps);
  emit_plain(out, "eval_steps", t.eval_steps);
  out << YAML::EndMap;

  const auto& k = c.checkpoint;
  out << YAML::Key << "checkpoint" << YAML::Value << YAML::BeginMap;
  emit_plain(out, "save_steps", k.save_steps);
  emit_double(out, "save_minutes", k.save_minutes);
  emit_plain(out, "keep_last", k.keep_last);
  if (k.resume == ResumeMode::kPath) emit_string(out, "resume", k.resume_path);
  else emit_plain(out, "resume", to_string(k.resume));
  emit_string(out, "resume_from_dir", k.resume_from_dir);
  emit_string(out, "sync_command", k.sync_command);
  out << YAML::EndMap;

  out << YAML::Key << "cost" << YAML::Value << YAML::BeginMap;
  emit_double(out, "gpu_hour_price", c.cost.gpu_hour_price);
  out << YAML::EndMap;

  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

bool operator==(const Config& a, const Config& b) {
  auto model = [](const ModelSource& m) { return std::tie(m.path, m.preset, m.random_init, m.tokenizer, m.dtype); };
  auto quant = [](const QuantConfig& q) { return std::tie(q.method, q.double_quant, q.blocksize, q.keep_16bit); };
  auto lora = [](const LoraConfig& l) {
    return std::tie(l.r, l.alpha, l.dropout, l.all_linear, l.target_modules, l.use_rslora);
  };
  auto data = [](const data::DataOptions& d) {
    return std::tie(d.train, d.eval, d.format, d.template_name, d.sequence_len, d.truncation,
                    d.train_on_inputs, d.add_eos, d.sample_packing, d.padding_side, d.val_set_size,
                    d.seed, d.shuffle, d.skip_invalid, d.field_map, d.role_map);
  };
  auto train = [](const TrainingConfig& t) {
    return std::tie(t.micro_batch_size, t.gradient_accumulation_steps, t.num_epochs, t.max_steps,
                    t.learning_rate, t.lr_scheduler, t.warmup_steps, t.warmup_ratio, t.weight_decay,
                    t.adam_beta1, t.adam_beta2, t.adam_epsilon, t.max_grad_norm,
                    t.gradient_checkpointing, t.seed, t.logging_steps, t.max_nonfinite_steps,
                    t.eval_steps);
  };
  auto ckpt = [](const CheckpointConfig& k) {
    return std::tie(k.save_steps, k.save_minutes, k.keep_last, k.resume, k.resume_path,
                    k.resume_from_dir, k.sync_command);
  };
  return a.output_dir == b.output_dir && model(a.model) == model(b.model) &&
         quant(a.quantization) == quant(b.quantization) && lora(a.lora) == lora(b.lora) &&
         data(a.data) == data(b.data) && train(a.training) == train(b.training) &&
         ckpt(a.checkpoint) == ckpt(b.checkpoint) && a.cost.gpu_hour_price == b.cost.gpu_hour_price;
}

}  // namespace qlora
