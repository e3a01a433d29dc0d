// JSON as Python's json module reads and writes it, for the values a data file hands to a chat
// template (tool-call arguments, `tools` schemas): what transformers' apply_chat_template sees after
// json.loads and writes with jinja's `tojson` (json.dumps). Two differences from nlohmann's defaults
// matter there: key order (Python keeps the file's order) and integers of any size (Python keeps
// 123456789012345678901234567890 exact; nlohmann reads an integer beyond 64 bits as a double).
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace qlora::data {

/// Parses `text` as Python's json.loads does: objects keep their key order, and an integer that
/// does not fit int64 / uint64 keeps its digits (held as a binary value of its decimal text, which
/// no JSON text can produce; py_json_dumps writes it back as those digits). Everything else is
/// nlohmann::ordered_json::parse(text). Throws nlohmann::json::parse_error on a syntax error and
/// nlohmann::json::out_of_range for a number beyond double's range ("1e999"), as parse() does;
/// with `allow_exceptions` false returns a discarded value instead (is_discarded()).
nlohmann::ordered_json parse_json_as_python(const std::string& text, bool allow_exceptions = true);

/// Python's repr(float), which json.dumps writes (Objects/floatobject.c, float_repr_style "short"):
/// the shortest digits that read back as `x`, in fixed notation with at least one decimal
/// ("1000000000000000.0") when the decimal exponent is in [-4, 16), else "1e+16", "1e-05".
/// `x` must be finite (a JSON number is).
std::string py_float_repr(double x);

/// Python's json.dumps(v, ensure_ascii=False[, indent=indent]) (jinja's `tojson` in transformers'
/// chat templates): without indent, items joined by ", " and keys by ": "; with indent > 0, one
/// item per line at depth × indent spaces, items joined by ",", empty containers as {} / [];
/// floats as py_float_repr, integers beyond 64 bits (parse_json_as_python's binary values) as their
/// digits. Never throws.
std::string py_json_dumps(const nlohmann::ordered_json& v, int indent = 0);

}  // namespace qlora::data
