// JSON as Python's json module reads and writes it (data/pyjson.h).
#include "data/pyjson.h"

#include <charconv>
#include <vector>

namespace qlora::data {

namespace {

using ojson = nlohmann::ordered_json;

// nlohmann's own DOM builder, except for the numbers it reads as floats although they are written
// as integers (no '.', 'e' or 'E': an integer beyond int64 / uint64): those keep their digits, as
// Python's int does, in a binary value (JSON text never yields one, so it cannot be confused).
// sax_parse calls the handler's members statically, so hiding number_float is enough.
class PythonIntegers : public nlohmann::detail::json_sax_dom_parser<ojson> {
 public:
  using json_sax_dom_parser::json_sax_dom_parser;
  bool number_float(double val, const std::string& lexeme) {
    if (lexeme.find_first_of(".eE") != std::string::npos) return json_sax_dom_parser::number_float(val, lexeme);
    ojson::binary_t digits(std::vector<std::uint8_t>(lexeme.begin(), lexeme.end()));
    return json_sax_dom_parser::binary(digits);
  }
};

void dump(const ojson& v, std::string* out, int indent, int depth) {
  const auto sep = [&](bool first_item, int d) {
    if (indent > 0) {
      *out += first_item ? "\n" : ",\n";
      out->append(static_cast<size_t>(indent * d), ' ');
    } else if (!first_item) {
      *out += ", ";
    }
  };
  if (v.is_object() || v.is_array()) {
    const bool obj = v.is_object();
    *out += obj ? '{' : '[';
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      sep(first, depth + 1);
      first = false;
      if (obj) {
        *out += ojson(it.key()).dump();
        *out += ": ";
      }
      dump(it.value(), out, indent, depth + 1);
    }
    if (indent > 0 && !v.empty()) {
      *out += '\n';
      out->append(static_cast<size_t>(indent * depth), ' ');
    }
    *out += obj ? '}' : ']';
  } else if (v.is_number_float()) {
    *out += py_float_repr(v.get<double>());
  } else if (v.is_binary()) {
    const auto& digits = v.get_binary();  // an integer beyond 64 bits (parse_json_as_python)
    out->append(digits.begin(), digits.end());
  } else {
    // strings: nlohmann escapes exactly the characters json.dumps(ensure_ascii=False) escapes
    // (" \\ \b \f \n \r \t, other < 0x20 as \u00xx); integers as they are.
    *out += v.dump();
  }
}

}  // namespace

ojson parse_json_as_python(const std::string& text, bool allow_exceptions) {
  ojson result;
  PythonIntegers sax(result, allow_exceptions);
  ojson::sax_parse(text, &sax);
  if (sax.is_errored()) return ojson(ojson::value_t::discarded);
  return result;
}

std::string py_float_repr(double x) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  const std::string sci(buf, r.ptr);  // "-1.2345e+15", "0e+00"
  const size_t e_at = sci.find('e');
  const int exp10 = std::stoi(sci.substr(e_at + 1));
  const bool neg = sci[0] == '-';
  std::string digits;
  for (size_t i = neg ? 1 : 0; i < e_at; ++i)
    if (sci[i] != '.') digits += sci[i];
  std::string s = neg ? "-" : "";
  if (exp10 < -4 || exp10 >= 16) {
    s += digits.substr(0, 1);
    if (digits.size() > 1) s += "." + digits.substr(1);
    const int a = exp10 < 0 ? -exp10 : exp10;
    s += std::string(exp10 < 0 ? "e-" : "e+") + (a < 10 ? "0" : "") + std::to_string(a);
  } else if (exp10 < 0) {
    s += "0." + std::string(static_cast<size_t>(-exp10 - 1), '0') + digits;
  } else {
    const size_t int_len = static_cast<size_t>(exp10) + 1;
    if (digits.size() <= int_len) s += digits + std::string(int_len - digits.size(), '0') + ".0";
    else s += digits.substr(0, int_len) + "." + digits.substr(int_len);
  }
  return s;
}

std::string py_json_dumps(const ojson& v, int indent) {
  std::string s;
  dump(v, &s, indent, 0);
  return s;
}

}  // namespace qlora::data
