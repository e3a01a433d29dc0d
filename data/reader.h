// qlora-cpp dataset readers: JSON array, JSONL and plain text files -> normalised records.
//
// Formats (auto-detected from the first record's keys, after field_map):
//   alpaca     {instruction, input?, output, system?}   -> [system?] user(instruction[\n\ninput]) assistant(output)
//   sharegpt   {conversations: [{from, value}], system?, tools?} roles human|gpt|system|function_call|observation
//   messages   {messages: [{role, content}], tools?}    roles system|user|assistant|tool
// `tools` (a JSON array, or a string holding one) lists the functions offered to the model.
// Tool calls, in either conversation format: an assistant message with `tool_calls` (the OpenAI /
// transformers form; content absent, null, "" or text), or a `function_call` turn whose content
// is the call's JSON (the glaive form); both become Turn::tool_calls. A tool message may carry
// `tool_call_id` (kept) and `name` (checked, not rendered by any template).
// Any message may carry Axolotl's `weight` (0: do not train this turn, 1: train it; else an
// error); an assistant message may carry `reasoning_content` (a string: its thinking trace,
// rendered by qwen3 only, counted per file for the others: DataStats::reasoning_not_rendered).
//   completion {text} in JSON/JSONL, or a .txt file split into documents on blank lines -> raw text
// Roles are normalised to system|user|assistant|tool (role_map first, then the defaults
// human->user, gpt->assistant, function_call->assistant, observation->tool).
// field_map renames fields: key = canonical name above, value = the name in the file.
// Every record keeps its file and 1-based starting line; every error reads `file:line: problem`.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "data/options.h"

namespace qlora::data {

/// One tool call of an assistant turn: an OpenAI / transformers `tool_calls[i]` (either
/// {"type": "function", "function": {"name", "arguments"}, "id"?} or {"name", "arguments", "id"?}),
/// or the JSON of a sharegpt / messages `function_call` turn (one call, or an array of calls).
struct ToolCall {
  std::string name;
  /// The arguments as JSON text: a JSON value of the file (an object) re-serialised as Python's
  /// json.dumps writes it (py_json_dumps: key order and integers beyond 64 bits kept),
  /// or, when `arguments_is_string`, the file's string itself (OpenAI writes the arguments object
  /// as a JSON string; it is checked to hold JSON). Absent or null arguments read as "{}".
  std::string arguments = "{}";
  bool arguments_is_string = false;
  std::string id{};  ///< the call's `id` (OpenAI), "" when absent; mistral's jinja needs 9 characters
};

/// One turn of a conversation. role: "system" | "user" | "assistant" | "tool".
struct Turn {
  std::string role;
  /// The text; "" for an assistant turn that only calls tools (content absent, null or "").
  std::string content;
  /// An assistant turn's tool calls, in file order (all calls of one message stay one turn).
  /// Templates with a tool-call form (qwen2.5, qwen3, llama3.1, llama3.2, mistral) render them in it; the others
  /// write the content and then each call as JSON {"name": ..., "arguments": ...}, one a line.
  std::vector<ToolCall> tool_calls{};
  std::string tool_call_id{};  ///< a tool turn's `tool_call_id` (OpenAI), "" when absent
  /// An assistant message's `reasoning_content` (the thinking trace, as transformers' chat
  /// messages carry it); meaningful only when has_reasoning (the field is present and not null:
  /// qwen3's jinja tests `is defined and is not none`, so "" counts as given).
  std::string reasoning_content{};
  bool has_reasoning = false;
  /// Axolotl's per-message `weight` (sharegpt): false for `weight: 0`, an assistant turn then not
  /// trained (its labels -100, even under train_on_inputs); true for `weight: 1` or no weight.
  /// Other turns keep the flag but it changes nothing (as in Axolotl: inputs follow train_on_inputs).
  bool train = true;
};

/// A normalised record: a conversation, or (completion format) one raw text.
struct Record {
  std::vector<Turn> turns;  ///< empty for raw text
  std::string tools;        ///< the record's `tools` field as JSON text (array), "" when absent
  std::string text;         ///< raw text (completion format)
  bool is_text = false;
  std::string file;         ///< source file
  int64_t line = 0;         ///< 1-based line where the record starts
  int64_t index = 0;        ///< 0-based record number in the file (skipped records count too)
};

/// What a read skipped (skip_invalid = true) and why.
struct ReadStats {
  int64_t records_read = 0;                       ///< records seen, valid or not
  int64_t skipped_invalid = 0;                    ///< records skipped (skip_invalid)
  std::map<std::string, int64_t> skip_reasons;    ///< reason ("invalid JSON", "missing field", ...) -> count
  std::vector<std::string> skip_examples;         ///< the first few full messages, `file:line: problem`
  std::string format;                             ///< the format used (after auto-detection)
  int64_t placeholder_records = 0;                ///< records whose text holds a {{name}} placeholder
  std::vector<std::string> placeholder_names;     ///< the first few distinct placeholders, e.g. "{{name}}"
  std::string placeholder_first;                  ///< `file:line` of the first such record
};

/// Reads and normalises every record of `path` (format from opts.format, or detected).
/// opts.default_system_message, when set, becomes the first turn of each conversation without a
/// system turn. Records holding `{{name}}`-style placeholders (LLaMA-Factory's identity set) are
/// counted in `stats` (placeholder_*), not changed.
/// Throws qlora::Error `path:line: problem` for a missing/empty file, malformed JSON, wrong
/// types, missing or empty fields, unknown roles, invalid UTF-8, a UTF-16/32 file (see
/// check_encoding; a UTF-8 byte-order mark is skipped in every format); with opts.skip_invalid such
/// records are skipped and counted in `stats` instead (a file with no records still throws).
std::vector<Record> read_records(const std::string& path, const DataOptions& opts, ReadStats* stats);

/// One record from the JSON text of one object (format detected as in read_records), e.g. a
/// single conversation a user is debugging. Errors read `path:LINE: problem` (line 1 + offset).
Record record_from_json(const std::string& json_text, const std::string& path, const DataOptions& opts);

/// Checks a data file's bytes before parsing and returns where its text starts: 3 after a UTF-8
/// byte-order mark (EF BB BF, skipped), else 0. Throws qlora::Error naming `path` and the byte
/// offset for a UTF-16/UTF-32 byte-order mark, a NUL byte (UTF-16/32 without a mark), or, unless
/// `skip_invalid`, the first invalid UTF-8 byte ("path:line: invalid UTF-8 at byte offset N (byte
/// 0xXX); " + `remedy`).
size_t check_encoding(const std::string& path, const std::string& buf, bool skip_invalid,
                      const std::string& remedy =
                          "the file must be UTF-8 (or set data.skip_invalid: true to skip such records)");

/// One prompt of `qlora generate --prompts FILE`: its text and, when the line has one, its system message.
struct PromptLine {
  std::string prompt;
  std::optional<std::string> system;
  int64_t line = 0;  ///< 1-based line in the file
};

/// Parses the bytes of a `generate --prompts` file (`path` names it in errors): JSONL read as
/// read_records reads JSONL (check_encoding first: a UTF-8 byte-order mark skipped, UTF-16/32 and
/// invalid UTF-8 refused; blank lines ignored), each line an object with a string "prompt" and
/// optionally a string (or null) "system"; other keys are refused (a typo such as "sytem" would
/// otherwise drop the system message silently). Throws qlora::Error "PATH:LINE: KEY: problem" (or
/// "PATH:LINE: problem" for a line that is not a JSON object), or "PATH: no prompts ..." for a file
/// without one. Fuzzed (tests/fuzz/fuzz_dataset.cpp).
std::vector<PromptLine> parse_prompts_jsonl(const std::string& bytes, const std::string& path);

/// parse_prompts_jsonl of the file `path`; throws qlora::Error "PATH: --prompts file not found" or
/// naming an unreadable file.
std::vector<PromptLine> read_prompts_jsonl(const std::string& path);

}  // namespace qlora::data
