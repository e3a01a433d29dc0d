#include "common/json_file.h"

#include <algorithm>

#include "common/error.h"
#include "common/files.h"

namespace qlora {

std::string json_error_reason(const nlohmann::json::exception& e) {
  std::string msg = e.what();
  const size_t pe = msg.find("parse error");
  const size_t colon = pe == std::string::npos ? std::string::npos : msg.find(": ", pe);
  if (colon != std::string::npos) {
    msg = msg.substr(colon + 2);
  } else if (const size_t close = msg.find("] "); close != std::string::npos) {
    msg = msg.substr(close + 2);  // "[json.exception.out_of_range.406] number overflow parsing '1e999'"
  }
  if (msg.size() > 160) msg = msg.substr(0, 160) + "...";
  std::replace(msg.begin(), msg.end(), '\n', ' ');
  return msg;
}

namespace {

// Throws when `text` nests arrays / objects deeper than kMaxJsonDepth, naming the line and column of
// the bracket that goes past it. Brackets inside strings do not count. A linear scan before the
// parse, so a hostile file fails at once (trial 27: a tokenizer.json pre_tokenizer nested 10,000
// deep took 3 GB to parse and read).
void check_json_depth(const std::string& text, const std::string& path) {
  int depth = 0;
  bool in_string = false, escaped = false;
  int64_t line = 1;
  size_t line_start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n') {
      ++line;
      line_start = i + 1;
    }
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth)
        fail(path, ":", line, ":", i - line_start + 1, ": JSON nested deeper than ", kMaxJsonDepth,
             " levels (no model, tokenizer or adapter file is; a corrupt or hostile file?)");
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

}  // namespace

nlohmann::json parse_json_file(const std::string& text, const std::string& path) {
  QLORA_CHECK(text.find_first_not_of(" \t\r\n") != std::string::npos, path, ": empty file, not JSON");
  check_not_git_lfs_pointer(text, path, "JSON file");
  check_json_depth(text, path);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    // e.byte: 1-based index of the last byte read (one past the end when the input ran out).
    const size_t at = std::min<size_t>(e.byte > 0 ? e.byte - 1 : 0, text.size());
    const auto begin = text.begin(), stop = text.begin() + static_cast<std::ptrdiff_t>(at);
    const int64_t line = 1 + std::count(begin, stop, '\n');
    const size_t nl = at == 0 ? std::string::npos : text.rfind('\n', at - 1);
    const size_t column = 1 + at - (nl == std::string::npos ? 0 : nl + 1);
    const bool at_end = text.find_first_not_of(" \t\r\n", at) == std::string::npos;
    fail(path, ":", line, ":", column, ": invalid JSON: ", json_error_reason(e),
         at_end ? "; the file ends there (cut short?)" : "");
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": invalid JSON: ", json_error_reason(e));
  }
}

nlohmann::json read_json_object_file(const std::string& path) {
  nlohmann::json j = parse_json_file(read_file(path), path);
  QLORA_CHECK(j.is_object(), path, ":1: expected a JSON object at top level, got ", j.type_name());
  return j;
}

}  // namespace qlora
