// qlora-cpp: reading the JSON files of a model, tokenizer or adapter directory (config.json,
// tokenizer.json, tokenizer_config.json, generation_config.json, adapter_config.json,
// *.safetensors.index.json) with one error format for all of them.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace qlora {

/// What nlohmann::json says of a parse exception, without its "[json.exception.parse_error.101]
/// parse error at line L, column C: " prefix, on one line, at most 160 bytes (a "last read" can echo
/// a long token). E.g. "syntax error while parsing object - unexpected end of input; expected '}'".
std::string json_error_reason(const nlohmann::json::exception& e);

/// Parses `text`, the bytes of the JSON file `path` (RFC 8259, as nlohmann::json reads it).
/// Throws qlora::Error, one line:
///  - "PATH: empty file, not JSON" when `text` is empty or only whitespace;
///  - "PATH:LINE:COLUMN: invalid JSON: REASON" on a syntax error, LINE and COLUMN 1-based, of the
///    byte where parsing stopped; "; the file ends there (cut short?)" is added when that is the end
///    of the text (an interrupted copy or download);
///  - "PATH: invalid JSON: REASON" for a number no double holds (1e999);
///  - "PATH:LINE:COLUMN: JSON nested deeper than 256 levels ..." at the bracket past kMaxJsonDepth.
nlohmann::json parse_json_file(const std::string& text, const std::string& path);

/// The deepest nesting of arrays and objects parse_json_file accepts (real tokenizer.json,
/// config.json and adapter_config.json files nest under 10 levels).
constexpr int kMaxJsonDepth = 256;

/// read_file(path) then parse_json_file, and the top level must be an object. Throws qlora::Error
/// as read_file and parse_json_file do, and "PATH:1: expected a JSON object at top level, got
/// TYPE" (array, string, number, ...) otherwise.
nlohmann::json read_json_object_file(const std::string& path);

}  // namespace qlora
