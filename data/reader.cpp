// qlora-cpp dataset readers. JSON is parsed by nlohmann::json; for a top-level array this file
// only finds where each element starts and ends (brackets outside strings) so that every record
// is parsed on its own and keeps its line number.
#include "data/reader.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "common/error.h"
#include "common/json_file.h"
#include "common/files.h"
#include "common/utf8.h"
#include "data/pyjson.h"

namespace qlora::data {
namespace fs = std::filesystem;
using json = nlohmann::ordered_json;  // keeps key order (tools are rendered in file order)

namespace {

// A JSON path inside a record: object keys, and array indices as decimal strings.
using JsonPath = std::vector<std::string>;

// A record-level problem: `reason` groups the skip counters, `message` is the text after file:line.
struct BadRecord {
  std::string reason, message;
  int64_t line_offset = 0;  // lines after the record's first line (JSON syntax errors)
  JsonPath at;              // the value at fault (its line is reported), empty = the record
};

[[noreturn]] void bad(const std::string& reason, const std::string& message, JsonPath at = {}) {
  throw BadRecord{reason, message, 0, std::move(at)};
}

// A byte as the messages show it, "0xC3": named, not echoed (an invalid byte would garble the terminal).
std::string hex_byte(char c) {
  char hex[8];
  std::snprintf(hex, sizeof hex, "0x%02X", static_cast<unsigned char>(c));
  return hex;
}

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// The byte offset of the value at `path` in `t`, the text of a JSON value that parsed (so it is
// well-formed), or npos when the path is not there. A linear scan, no recursion: the line of an
// error inside a pretty-printed record (nlohmann::json keeps no positions).
size_t value_offset(const std::string& t, const JsonPath& path) {
  size_t p = 0;
  auto ws = [&] {
    while (p < t.size() && is_ws(t[p])) ++p;
  };
  auto skip_string = [&] {  // at '"': past the closing '"'
    for (++p; p < t.size(); ++p) {
      if (t[p] == '\\') ++p;
      else if (t[p] == '"') {
        ++p;
        return;
      }
    }
  };
  auto skip_value = [&] {
    ws();
    if (p >= t.size()) return;
    if (t[p] == '"') return skip_string();
    if (t[p] == '{' || t[p] == '[') {
      for (int depth = 0; p < t.size();) {
        const char ch = t[p];
        if (ch == '"') {
          skip_string();
          continue;
        }
        ++p;
        if (ch == '{' || ch == '[') ++depth;
        else if ((ch == '}' || ch == ']') && --depth == 0) return;
      }
      return;
    }
    while (p < t.size() && t[p] != ',' && t[p] != '}' && t[p] != ']' && !is_ws(t[p])) ++p;
  };
  auto next_member = [&] {  // after a value: past the ',' if any
    ws();
    if (p < t.size() && t[p] == ',') ++p;
    ws();
  };
  ws();
  for (const std::string& step : path) {
    if (p >= t.size()) return std::string::npos;
    if (t[p] == '{') {
      ++p;
      ws();
      while (true) {
        if (p >= t.size() || t[p] != '"') return std::string::npos;
        const size_t k0 = p;
        skip_string();
        const json key = json::parse(t.substr(k0, std::min(p, t.size()) - k0), nullptr, false);
        ws();
        if (p >= t.size() || t[p] != ':') return std::string::npos;
        ++p;
        ws();
        if (key.is_string() && key.get<std::string>() == step) break;
        skip_value();
        next_member();
      }
    } else if (t[p] == '[') {
      if (step.empty() || step.size() > 18 || !std::all_of(step.begin(), step.end(), [](char c) { return c >= '0' && c <= '9'; }))
        return std::string::npos;
      const uint64_t want = std::stoull(step);
      ++p;
      ws();
      for (uint64_t i = 0; i < want; ++i) {
        if (p >= t.size() || t[p] == ']') return std::string::npos;
        skip_value();
        next_member();
      }
      if (p >= t.size() || t[p] == ']') return std::string::npos;
    } else {
      return std::string::npos;
    }
  }
  return std::min(p, t.size());
}

// (an integer beyond 64 bits is a binary value holding its digits: parse_json_as_python)
const char* type_name(const json& v) { return v.is_binary() ? "number" : v.type_name(); }

// The canonical field names field_map may rename (its keys).
const std::set<std::string>& canonical_fields() {
  static const std::set<std::string> k = {"instruction", "input",   "output", "system",  "conversations", "messages",
                                          "text",        "tools",   "tool_calls", "from", "value",         "role",
                                          "content"};
  return k;
}

std::string field_name(const DataOptions& o, const std::string& canonical) {
  auto it = o.field_map.find(canonical);
  return it == o.field_map.end() ? canonical : it->second;
}

// True when field_map gives canonical field `canonical`'s own name to another canonical field
// and does not map `canonical` itself: a rename, as HF datasets' rename_column, so {instruction:
// input} reads a file's `input` as the instruction only, not as alpaca's input too (torchtune's
// {input, output} columns).
bool renamed_away(const DataOptions& o, const std::string& canonical) {
  if (o.field_map.count(canonical)) return false;
  for (const auto& [ours, theirs] : o.field_map)
    if (theirs == canonical && canonical_fields().count(ours)) return true;
  return false;
}

// "" or, when data.field_map looks written the wrong way round for record `obj` (an entry whose value
// is one of our field names and whose key is not, but is a field of the record: `{question:
// instruction}` for a file with `question`), "; data.field_map {question: instruction} looks swapped
// (it maps our field name to the name in your file): write {instruction: question}". The map is
// named by its config key (o.field_map_key: data.train[1].field_map when the entry set it).
std::string swapped_field_map_hint(const json& obj, const DataOptions& o) {
  const std::set<std::string>& kOurs = canonical_fields();
  std::string got, want;
  for (const auto& [ours, theirs] : o.field_map) {
    if (kOurs.count(ours) || !kOurs.count(theirs) || !obj.is_object() || !obj.contains(ours)) continue;
    got += (got.empty() ? "" : ", ") + ours + ": " + theirs;
    want += (want.empty() ? "" : ", ") + theirs + ": " + ours;
  }
  if (got.empty()) return "";
  return "; " + o.field_map_key + " {" + got + "} looks swapped (it maps our field name to the name in your file): write {" +
         want + "}";
}

// A required (or optional) string field; empty strings are an error unless allow_empty.
bool get_string(const json& obj, const DataOptions& o, const std::string& canonical, bool required,
                bool allow_empty, std::string* out) {
  const std::string name = field_name(o, canonical);
  if (renamed_away(o, canonical)) {
    if (required)
      bad("missing field", o.field_map_key + " reads '" + canonical + "' as another field, so no field is read as " +
                               canonical + "; map " + canonical + " to a field of the file too");
    return false;
  }
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) {
    if (required) {
      if (it == obj.end()) bad("missing field", "missing field '" + name + "'" + swapped_field_map_hint(obj, o));
      bad("missing field", "field '" + name + "' is null (a string is needed)", {name});
    }
    return false;
  }
  if (!it->is_string())
    bad("wrong type", "field '" + name + "' must be a string, got " + type_name(*it), {name});
  *out = it->get<std::string>();
  if (out->empty() && !allow_empty) {
    if (required) bad("empty field", "field '" + name + "' is an empty string", {name});
    return false;
  }
  return true;
}

std::string map_role(const std::string& role, const DataOptions& o, const JsonPath& at) {
  static const std::map<std::string, std::string> kDefault = {
      {"human", "user"},        {"user", "user"},           {"gpt", "assistant"},
      {"assistant", "assistant"}, {"function_call", "assistant"}, {"observation", "tool"},
      {"tool", "tool"},         {"function", "tool"},       {"system", "system"}};
  std::string r = role;
  if (auto it = o.role_map.find(r); it != o.role_map.end()) r = it->second;
  if (auto it = kDefault.find(r); it != kDefault.end()) return it->second;
  bad("unknown role", "unknown role '" + role + "' (map it with " + o.role_map_key + " to system|user|assistant|tool)", at);
}

// "" or, for a record in a prompt/answer layout that is none of ours (TRL / OpenAI prompt-completion
// {"prompt", "completion"}, {"prompt", "response"}, {"question", "answer"}) with both values
// strings, the field_map that reads it as alpaca (the prompt masked, the answer trained):
// "data.field_map: {instruction: prompt, output: completion}". Our format `completion` is raw text
// ({"text"}), which is what a user tries first. TRL's conversational prompt-completion (lists of
// messages) is named too: it has no field_map, its two lists are one `messages` list.
std::string prompt_answer_hint(const json& j, const DataOptions& o) {
  static const std::pair<const char*, const char*> kPairs[] = {
      {"prompt", "completion"}, {"prompt", "response"}, {"question", "answer"}, {"input", "output"}};
  if (!j.is_object()) return "";
  for (const auto& [q, a] : kPairs) {
    auto qi = j.find(q), ai = j.find(a);
    if (qi == j.end() || ai == j.end()) continue;
    // {input, output}: torchtune's instruct_dataset columns (InputOutputToMessages); `output` is
    // already ours, so the map renames the input only
    const std::string map = std::string("{instruction: ") + q + (std::string(a) == "output" ? "" : ", output: " + std::string(a)) + "}";
    if (qi->is_string() && ai->is_string())
      return std::string("; a {\"") + q + "\", \"" + a + "\"} record reads as alpaca with " + o.field_map_key +
             ": " + map + " (the " + q + " masked, the " + a +
             " trained); format completion here means raw text, a \"text\" field trained whole";
    if (qi->is_array() && ai->is_array())
      return std::string("; TRL's conversational prompt-completion (\"") + q + "\" and \"" + a +
             "\" lists of messages) has no field_map here: write the two lists as one \"messages\" list "
             "(format messages)";
  }
  return "";
}

// "" or, for an object one of whose keys holds a list of objects (an export wrapping its records,
// {"version": ..., "data": [...]}, as Hugging Face datasets' load_dataset("json", field="data")
// reads), the hint to take that list out: "; 'data' holds a list of 3 objects: if those are the
// records, write them one per line (jq -c '.["data"][]' FILE > OUT.jsonl) or as a JSON array".
std::string wrapped_records_hint(const json& j, const std::string& file = "FILE") {
  if (!j.is_object()) return "";
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!it->is_array() || it->empty() || !(*it)[0].is_object()) continue;
    return "; '" + it.key() + "' holds a list of " + std::to_string(it->size()) +
           " objects: if those are the records, write them one per line (jq -c '.[\"" + it.key() +
           "\"][]' " + file + " > OUT.jsonl) or as a JSON array";
  }
  return "";
}

std::string detect(const json& j, const DataOptions& o) {
  if (!j.is_object()) bad("wrong type", std::string("record must be a JSON object, got ") + type_name(j));
  if (j.contains(field_name(o, "conversations"))) return "sharegpt";
  if (j.contains(field_name(o, "messages"))) return "messages";
  if (j.contains(field_name(o, "instruction"))) return "alpaca";
  if (j.contains(field_name(o, "text"))) return "completion";
  std::string keys;
  for (auto it = j.begin(); it != j.end(); ++it) keys += (keys.empty() ? "" : ", ") + it.key();
  std::string hint = swapped_field_map_hint(j, o);
  if (hint.empty()) hint = prompt_answer_hint(j, o);
  if (hint.empty()) hint = wrapped_records_hint(j);
  bad("unknown format", "cannot detect the format from the keys [" + keys + "]" +
                            (hint.empty() ? "; set " + o.format_key + " (alpaca|sharegpt|messages|completion) or " + o.field_map_key
                                          : hint));
}

void append_system(const json& j, const DataOptions& o, Record* r) {
  std::string sys;
  if (get_string(j, o, "system", false, true, &sys) && !sys.empty()) r->turns.push_back({"system", sys});
}

// One tool call: {"type": "function", "function": {"name", "arguments"}, "id"?} or {"name",
// "arguments", "id"?} (what transformers' templates accept). `where` names it in messages
// ("messages[1].tool_calls[0]"); `at` is its JSON path, or (inside_string: a call in a
// function_call turn's JSON text) the path of that string, whose line is the one reported.
ToolCall read_call(const json& c, const std::string& where, const JsonPath& at, bool inside_string) {
  auto path = [&](std::initializer_list<std::string> keys) {
    JsonPath p = at;
    if (!inside_string) p.insert(p.end(), keys);
    return p;
  };
  if (!c.is_object()) bad("wrong type", where + " must be an object (a tool call), got " + type_name(c), at);
  if (auto ty = c.find("type"); ty != c.end() && !(ty->is_string() && ty->get<std::string>() == "function"))
    bad("wrong type", where + ".type must be \"function\", got " + (ty->is_string() ? "'" + ty->get<std::string>() + "'" : std::string(type_name(*ty))),
        path({"type"}));
  const json* f = &c;
  std::string fw = where;
  JsonPath fat = at;
  if (auto fn = c.find("function"); fn != c.end()) {
    if (!fn->is_object()) bad("wrong type", where + ".function must be an object, got " + type_name(*fn), path({"function"}));
    f = &*fn;
    fw = where + ".function";
    fat = path({"function"});
  }
  auto fpath = [&](const std::string& key) {
    JsonPath p = fat;
    if (!inside_string) p.push_back(key);
    return p;
  };
  ToolCall call;
  auto n = f->find("name");
  if (n == f->end() || n->is_null()) bad("missing field", fw + ": missing field 'name' (the function called)", fat);
  if (!n->is_string()) bad("wrong type", fw + ".name must be a string, got " + type_name(*n), fpath("name"));
  call.name = n->get<std::string>();
  if (call.name.empty()) bad("empty field", fw + ".name is an empty string", fpath("name"));
  if (auto a = f->find("arguments"); a != f->end() && !a->is_null()) {
    if (a->is_object()) {
      call.arguments = py_json_dumps(*a);
    } else if (a->is_string()) {
      call.arguments = a->get<std::string>();
      call.arguments_is_string = true;
      if (parse_json_as_python(call.arguments, false).is_discarded())
        bad("invalid tool call", fw + ".arguments is a string that is not JSON (OpenAI writes the arguments "
                                      "object as JSON text)", fpath("arguments"));
    } else {
      bad("wrong type", fw + ".arguments must be an object or a string holding JSON, got " + type_name(*a), fpath("arguments"));
    }
  }
  if (auto id = c.find("id"); id != c.end() && !id->is_null()) {
    if (!id->is_string()) bad("wrong type", where + ".id must be a string, got " + type_name(*id), path({"id"}));
    call.id = id->get<std::string>();
  }
  return call;
}

Record normalise(const json& j, const std::string& format, const DataOptions& o) {
  if (!j.is_object()) bad("wrong type", std::string("record must be a JSON object, got ") + type_name(j));
  Record r;
  if (format == "alpaca") {
    std::string ins, in, out;
    get_string(j, o, "instruction", true, false, &ins);
    get_string(j, o, "input", false, true, &in);
    get_string(j, o, "output", true, false, &out);
    append_system(j, o, &r);
    r.turns.push_back({"user", in.empty() ? ins : ins + "\n\n" + in});
    r.turns.push_back({"assistant", out});
  } else if (format == "sharegpt" || format == "messages") {
    const bool sg = format == "sharegpt";
    const std::string list = field_name(o, sg ? "conversations" : "messages");
    const std::string role_key = field_name(o, sg ? "from" : "role");
    const std::string content_key = field_name(o, sg ? "value" : "content");
    auto it = j.find(list);
    if (it == j.end()) {
      // the other layout's list (sharegpt's "conversations" read as messages, or the reverse): name
      // the setting that reads it, by its first turn's keys
      const std::string other_list = sg ? "messages" : "conversations";
      std::string hint;
      if (auto ol = j.find(other_list); ol != j.end() && ol->is_array()) {
        const json first = ol->empty() ? json() : (*ol)[0];
        const auto has = [&](const char* a, const char* b) { return first.is_object() && first.contains(a) && first.contains(b); };
        const std::string rename = o.field_map_key + " {" + (sg ? "conversations" : "messages") + ": " + other_list + "}";
        const std::string other_format = o.format_key + ": " + (sg ? "messages" : "sharegpt");
        hint = " (the record has '" + other_list + "'" +
               (has("from", "value")   ? " with sharegpt's {from, value} turns: set " + (sg ? rename : other_format)
                : has("role", "content") ? " with {role, content} turns: set " + (sg ? other_format : rename)
                                         : ": set " + other_format + ", or " + rename) +
               ")";
      }
      bad("missing field", "missing field '" + list + "'" + hint);
    }
    if (!it->is_array()) bad("wrong type", "field '" + list + "' must be an array, got " + type_name(*it), {list});
    if (it->empty()) bad("empty field", "field '" + list + "' is an empty array", {list});
    append_system(j, o, &r);
    const std::string tools_key = field_name(o, "tools");
    if (auto tl = j.find(tools_key); tl != j.end() && !tl->is_null()) {
      if (tl->is_array()) r.tools = py_json_dumps(*tl);
      else if (tl->is_string()) r.tools = tl->get<std::string>();
      else bad("wrong type", "field '" + tools_key + "' must be an array or a string, got " + type_name(*tl), {tools_key});
    }
    const std::string calls_key = field_name(o, "tool_calls");
    for (size_t k = 0; k < it->size(); ++k) {
      const json& t = (*it)[k];
      const std::string where = list + "[" + std::to_string(k) + "]";
      const JsonPath at{list, std::to_string(k)};
      auto in_turn = [&](const std::string& key) { return JsonPath{list, std::to_string(k), key}; };
      if (!t.is_object()) bad("wrong type", where + " must be an object, got " + type_name(t), at);
      auto rk = t.find(role_key);
      if (rk == t.end()) {
        // The other conversation layout's keys (an Axolotl / LLaMA-Factory config followed literally:
        // format messages over sharegpt's {from, value} turns, or the reverse): say which setting reads it.
        const char* other_role = sg ? "role" : "from";
        const char* other_content = sg ? "content" : "value";
        std::string hint;
        if (t.contains(other_role) && t.contains(other_content)) {
          // the other format (its list renamed to this file's when needed), or this format with
          // the turn keys renamed (the map to write: the current one plus the two keys)
          const std::string other_format = sg ? "messages" : "sharegpt";
          const std::string other_list = sg ? "messages" : "conversations";
          std::string map;
          for (const auto& [ours, theirs] : o.field_map)
            if (ours != (sg ? "from" : "role") && ours != (sg ? "value" : "content")) map += ours + ": " + theirs + ", ";
          map += std::string(sg ? "from" : "role") + ": " + other_role + ", " + (sg ? "value" : "content") + ": " + other_content;
          hint = std::string(" (this is ") + (sg ? "the messages" : "sharegpt's") + " layout {" + other_role + ", " +
                 other_content + "}: set " + o.format_key + ": " + other_format +
                 (list == other_list ? "" : " with " + o.field_map_key + " {" + other_list + ": " + list + "}") + ", or " +
                 o.field_map_key + " {" + map + "})";
        }
        bad("missing field", where + ": missing field '" + role_key + "'" + hint, at);
      }
      if (!rk->is_string())
        bad("wrong type", where + "." + role_key + " must be a string, got " + type_name(*rk), in_turn(role_key));
      const std::string raw_role = rk->get<std::string>();
      Turn turn{map_role(raw_role, o, in_turn(role_key)), ""};
      auto rm = o.role_map.find(raw_role);
      const bool function_call = (rm == o.role_map.end() ? raw_role : rm->second) == "function_call";
      // OpenAI / transformers: {"role": "assistant", "content"?, "tool_calls": [call, ...]}
      if (auto tc = t.find(calls_key); tc != t.end() && !tc->is_null()) {
        const std::string cw = where + "." + calls_key;
        if (turn.role != "assistant" || function_call)
          bad("wrong type", cw + ": only an assistant message has tool calls (this one is '" + raw_role + "')", in_turn(calls_key));
        if (!tc->is_array()) bad("wrong type", cw + " must be an array of calls, got " + type_name(*tc), in_turn(calls_key));
        for (size_t i = 0; i < tc->size(); ++i)
          turn.tool_calls.push_back(read_call((*tc)[i], cw + "[" + std::to_string(i) + "]",
                                              {list, std::to_string(k), calls_key, std::to_string(i)}, false));
      }
      const bool calls = !turn.tool_calls.empty();
      auto ck = t.find(content_key);
      if (ck == t.end() || (calls && ck->is_null())) {
        if (!calls) bad("missing field", where + ": missing field '" + content_key + "'", at);
      } else {
        if (!ck->is_string())
          bad("wrong type", where + "." + content_key + " must be a string, got " + type_name(*ck), in_turn(content_key));
        turn.content = ck->get<std::string>();
      }
      if (function_call) {
        // glaive / LLaMA-Factory: the content is the call's JSON, or an array of calls
        const std::string cw = where + "." + content_key;
        const json v = parse_json_as_python(turn.content, false);
        if (v.is_discarded() || (v.is_array() && v.empty()))
          bad("invalid tool call", cw + ": a function_call turn's content must be JSON: a call {\"name\": ..., "
                                        "\"arguments\": ...} or an array of calls", in_turn(content_key));
        if (v.is_array()) {
          for (size_t i = 0; i < v.size(); ++i)
            turn.tool_calls.push_back(read_call(v[i], cw + "[" + std::to_string(i) + "]", in_turn(content_key), true));
        } else {
          turn.tool_calls.push_back(read_call(v, cw, in_turn(content_key), true));
        }
        turn.content.clear();
      }
      // Axolotl's per-message weight: 0 = do not train this turn, 1 = train it (null = absent)
      if (auto w = t.find("weight"); w != t.end() && !w->is_null()) {
        const bool number = w->is_number() && !w->is_boolean();
        const double v = number ? w->get<double>() : -1;
        if (!number || (v != 0 && v != 1))
          bad("wrong type", where + ".weight must be 0 (do not train this turn) or 1 (train it), got " +
                                (w->is_string() ? "'" + w->get<std::string>() + "'" : py_json_dumps(*w)), in_turn("weight"));
        turn.train = v == 1;
      }
      // Axolotl chat_template's per-message `training` (message_field_training): false = do not
      // train this turn, as weight 0 (true = as weight 1; null = absent)
      if (auto tr = t.find("training"); tr != t.end() && !tr->is_null()) {
        if (!tr->is_boolean())
          bad("wrong type", where + ".training must be true or false, got " + py_json_dumps(*tr), in_turn("training"));
        turn.train = turn.train && tr->get<bool>();
      }
      // An empty user / system / tool message renders as the jinja renders it (a trial: one such
      // message refused a whole file); an empty assistant answer without calls would train the
      // model to say nothing, so it stays an error, unless the turn is not trained (weight 0 /
      // training false: it is then rendered as the template renders "", and masked; trial 14).
      if (turn.content.empty() && !calls && turn.role == "assistant" && !function_call && turn.train)
        bad("empty field", where + "." + content_key + " is an empty string (an assistant answer with nothing to "
            "train: drop the turn, mark it \"weight\": 0 to keep it untrained, or set data.skip_invalid: true to skip "
            "the record)", in_turn(content_key));
      // transformers' reasoning_content (the thinking trace of an assistant message; qwen3 renders it)
      if (auto rc = t.find("reasoning_content"); rc != t.end() && !rc->is_null()) {
        if (turn.role != "assistant")
          bad("wrong type", where + ".reasoning_content: only an assistant message has reasoning_content (this one is '" +
                                raw_role + "')", in_turn("reasoning_content"));
        if (!rc->is_string())
          bad("wrong type", where + ".reasoning_content must be a string, got " + type_name(*rc), in_turn("reasoning_content"));
        turn.reasoning_content = rc->get<std::string>();
        turn.has_reasoning = true;
      }
      if (turn.role == "tool") {
        for (const char* key : {"tool_call_id", "name"}) {
          auto f = t.find(key);
          if (f == t.end() || f->is_null()) continue;
          if (!f->is_string()) bad("wrong type", where + "." + key + " must be a string, got " + type_name(*f), in_turn(key));
          if (std::string(key) == "tool_call_id") turn.tool_call_id = f->get<std::string>();
        }
      }
      r.turns.push_back(std::move(turn));
    }
  } else if (format == "completion") {
    // format completion is raw text; a prompt/answer record without "text" gets the field_map that reads it
    if (auto t = j.find(field_name(o, "text")); (t == j.end() || t->is_null()) && j.is_object()) {
      if (const std::string hint = prompt_answer_hint(j, o); !hint.empty())
        bad("missing field", "missing field '" + field_name(o, "text") + "'" + hint +
                                 " (set " + o.format_key + " to auto or alpaca with it)");
    }
    get_string(j, o, "text", true, false, &r.text);
    r.is_text = true;
  } else {
    fail(o.format_key, ": unknown format '", format, "' (auto|alpaca|sharegpt|messages|completion)");
  }
  return r;
}

// Parses one JSON value; a syntax error becomes BadRecord with the line offset inside the value.
json parse_value(const std::string& text) {
  try {
    return parse_json_as_python(text);
  } catch (const json::parse_error& e) {
    const std::string msg = json_error_reason(e);  // "syntax error while parsing ...", at most 160 bytes
    const size_t upto = std::min<size_t>(e.byte > 0 ? e.byte - 1 : 0, text.size());
    const int64_t off = std::count(text.begin(), text.begin() + upto, '\n');
    const size_t bad_at = first_invalid_utf8(text);
    if (bad_at != std::string::npos) {  // named as check_encoding names it, the byte not echoed
      throw BadRecord{"invalid UTF-8",
                      "invalid UTF-8 (byte " + hex_byte(text[bad_at]) + " at byte offset " + std::to_string(bad_at) +
                          " of the record); the file must be UTF-8",
                      std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(bad_at), '\n'),
                      {}};
    }
    throw BadRecord{"invalid JSON", "invalid JSON: " + msg, off, {}};
  } catch (const json::exception& e) {
    // e.g. out_of_range 406 "number overflow parsing '1e999'" (found by tests/fuzz/fuzz_dataset.cpp)
    throw BadRecord{"invalid JSON", "invalid JSON: " + json_error_reason(e), 0, {}};
  }
}

// Calls f(line, line_no) for each line of `buf` that is not all whitespace (JSONL: one JSON value
// per line, blank lines ignored), line_no 1-based.
void for_each_jsonl_line(const std::string& buf, const std::function<void(const std::string&, int64_t)>& f) {
  size_t begin = 0;
  int64_t ln = 1;
  while (begin <= buf.size()) {
    size_t end = buf.find('\n', begin);
    if (end == std::string::npos) end = buf.size();
    std::string_view l(buf.data() + begin, end - begin);
    if (!std::all_of(l.begin(), l.end(), is_ws)) f(std::string(l), ln);
    begin = end + 1;
    ++ln;
  }
}

// Collects records, applying skip_invalid.
class Collector {
 public:
  Collector(const std::string& path, const DataOptions& o, ReadStats* s) : path_(path), o_(o), s_(s) {
    format_ = o.format;
  }
  void add_json(const std::string& text, int64_t line) {
    const int64_t index = s_->records_read++;
    json j;
    try {
      j = parse_value(text);
      if (format_ == "auto") {
        format_ = detect(j, o_);
        detected_at_ = line;
      }
      Record r = normalise(j, format_, o_);
      r.file = path_;
      r.line = line;
      r.index = index;
      out_.push_back(std::move(r));
    } catch (BadRecord& b) {
      // a record of another format in a file whose format was detected from its first record
      // (merged exports; trial 14): said so, not only the field the detected format misses
      if (detected_at_ > 0 && detected_at_ != line && j.is_object()) {
        try {
          const std::string other = detect(j, o_);
          if (other != format_)
            b.message += " (the file's format " + format_ + " was detected from line " + std::to_string(detected_at_) +
                         "; this record's keys are format " + other +
                         ": one file holds one format: split it and list the parts in data.train)";
        } catch (const BadRecord&) {
        }
      }
      if (!b.at.empty()) {  // the line of the value at fault, not of the record's start
        const size_t off = value_offset(text, b.at);
        if (off != std::string::npos) b.line_offset = std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(off), '\n');
      }
      handle(b, line);
    }
  }
  void add_text(std::string text, int64_t line) {
    const int64_t index = s_->records_read++;
    if (!is_valid_utf8(text)) return handle({"invalid UTF-8", "invalid UTF-8 bytes in text", 0, {}}, line);
    Record r;
    r.text = std::move(text);
    r.is_text = true;
    r.file = path_;
    r.line = line;
    r.index = index;
    out_.push_back(std::move(r));
  }
  void handle(const BadRecord& b, int64_t line) {
    std::ostringstream m;
    m << path_ << ":" << line + b.line_offset << ": " << b.message;
    if (!o_.skip_invalid) throw Error(m.str());
    ++s_->skipped_invalid;
    ++s_->skip_reasons[b.reason];
    if (s_->skip_examples.size() < 5) s_->skip_examples.push_back(m.str());
  }
  std::vector<Record> take() {
    s_->format = format_;
    return std::move(out_);
  }

 private:
  std::string path_;
  const DataOptions& o_;
  ReadStats* s_;
  std::string format_;
  int64_t detected_at_ = 0;  ///< the line format_ was detected from (0: set by the options)
  std::vector<Record> out_;
};

void read_json_array(const std::string& path, const std::string& buf, size_t pos, int64_t line, Collector& c) {
  ++pos;  // '['
  auto skip_ws = [&]() {
    while (pos < buf.size() && is_ws(buf[pos])) line += buf[pos++] == '\n';
  };
  skip_ws();
  if (pos < buf.size() && buf[pos] == ']') return;
  while (true) {
    skip_ws();
    QLORA_CHECK(pos < buf.size(), path, ":", line, ": unterminated JSON array (missing ']')");
    const size_t start = pos;
    const int64_t start_line = line;
    int depth = 0;
    bool in_str = false, esc = false;
    for (; pos < buf.size(); ++pos) {
      const char ch = buf[pos];
      if (ch == '\n') ++line;
      if (in_str) {
        if (esc) esc = false;
        else if (ch == '\\') esc = true;
        else if (ch == '"') in_str = false;
        continue;
      }
      if (ch == '"') in_str = true;
      else if (ch == '{' || ch == '[') ++depth;
      else if (ch == '}' || ch == ']') {
        if (depth == 0) break;  // the array's own ']'
        --depth;
      } else if (ch == ',' && depth == 0) break;
    }
    QLORA_CHECK(pos < buf.size(), path, ":", start_line,
                in_str ? ": unterminated string in JSON array" : ": unterminated JSON array (missing ']')");
    c.add_json(buf.substr(start, pos - start), start_line);
    if (buf[pos] == ']') {
      ++pos;
      skip_ws();
      QLORA_CHECK(pos == buf.size(), path, ":", line, ": unexpected data after the JSON array");
      return;
    }
    ++pos;  // ','
  }
}

// JSON Lines holds one record per line. A first line that is not JSON by itself but starts a
// value spanning lines (pretty-printed records, or one object over the whole file: an export
// wrapping its records) is named as such, with what to do, instead of the syntax error of its
// first line. Throws qlora::Error `path:line: ...`; returns when the first line parses or no value
// spanning lines starts there (the line's own error then follows).
void check_one_record_per_line(const std::string& path, const std::string& buf, size_t pos, int64_t line) {
  size_t eol = buf.find('\n', pos);
  if (eol == std::string::npos) return;
  if (json::accept(buf.substr(pos, eol - pos))) return;
  std::istringstream in(buf.substr(pos));
  json value;
  try {
    in >> value;  // one value, the rest of the stream left unread
  } catch (const json::exception&) {
    return;
  }
  const std::streamoff used = in.tellg() < 0 ? static_cast<std::streamoff>(buf.size() - pos) : static_cast<std::streamoff>(in.tellg());
  const size_t end = pos + static_cast<size_t>(used);
  const int64_t last = line + std::count(buf.begin() + static_cast<std::ptrdiff_t>(pos),
                                         buf.begin() + static_cast<std::ptrdiff_t>(std::min(end, buf.size())), '\n');
  const bool alone = buf.find_first_not_of(" \t\r\n", end) == std::string::npos;
  if (alone && value.is_object())
    fail(path, ":", line, ": the file is one JSON object over lines ", line, "-", last,
         ", not JSON Lines (one record per line) or a JSON array of records", wrapped_records_hint(value, path));
  fail(path, ":", line, ": the first record spans lines ", line, "-", last,
       " (pretty-printed JSON?): JSON Lines needs one record per line; rewrite it, e.g. jq -c . ", path,
       " > OUT.jsonl, or write a JSON array");
}

}  // namespace

Record record_from_json(const std::string& json_text, const std::string& path, const DataOptions& opts) {
  ReadStats s;
  DataOptions o = opts;
  o.skip_invalid = false;
  Collector c(path, o, &s);
  c.add_json(json_text, 1);
  std::vector<Record> v = c.take();
  QLORA_CHECK(v.size() == 1, path, ":1: expected one record");
  return std::move(v[0]);
}

size_t check_encoding(const std::string& path, const std::string& buf, bool skip_invalid, const std::string& remedy) {
  auto starts = [&](const char* bom, size_t n) { return buf.size() >= n && buf.compare(0, n, bom, n) == 0; };
  // Compressed and columnar files by their magic (each format's specification), before the
  // UTF-16/32 guess their NUL bytes would otherwise lead to.
  struct Container {
    const char* magic;
    size_t n;
    const char* what;
    const char* remedy;
  };
  static const Container kContainers[] = {
      {"\x1F\x8B", 2, "gzip-compressed (magic 1f 8b)", "decompress it first: gunzip -k "},
      {"\x28\xB5\x2F\xFD", 4, "zstd-compressed (magic 28 b5 2f fd)", "decompress it first: zstd -d "},
      {"BZh", 3, "bzip2-compressed (magic \"BZh\")", "decompress it first: bunzip2 -k "},
      {"\xFD" "7zXZ\x00", 6, "xz-compressed (magic fd 37 7a 58 5a 00)", "decompress it first: unxz -k "},
      {"PK\x03\x04", 4, "a zip archive (magic \"PK\\3\\4\")", "extract it first: unzip "},
      {"PAR1", 4, "Apache Parquet (magic \"PAR1\")",
       "convert it to JSON Lines first, e.g. python3 -c \"import pandas; pandas.read_parquet('IN').to_json('OUT.jsonl', "
       "orient='records', lines=True, force_ascii=False)\" with IN = "},
      {"ARROW1", 6, "an Apache Arrow file (magic \"ARROW1\")",
       "convert it to JSON Lines first, e.g. datasets' Dataset.from_file('IN').to_json('OUT.jsonl') with IN = "},
  };
  for (const Container& k : kContainers)
    QLORA_CHECK(!starts(k.magic, k.n), path, ": the file is ", k.what,
                ", not text (data files are UTF-8 JSON, JSON Lines or .txt); ", k.remedy, path);
  const char* other = starts("\x00\x00\xFE\xFF", 4)   ? "UTF-32BE (byte-order mark 00 00 FE FF"
                      : starts("\xFF\xFE\x00\x00", 4) ? "UTF-32LE (byte-order mark FF FE 00 00"
                      : starts("\xFE\xFF", 2)           ? "UTF-16BE (byte-order mark FE FF"
                      : starts("\xFF\xFE", 2)           ? "UTF-16LE (byte-order mark FF FE"
                                                        : nullptr;
  QLORA_CHECK(!other, path, ": the file is ", other, " at byte offset 0); only UTF-8 is read: convert it, e.g. ",
              "iconv -f ", std::string(other).substr(0, 8), " -t UTF-8");
  const size_t start = starts("\xEF\xBB\xBF", 3) ? 3 : 0;  // a UTF-8 byte-order mark is skipped
  const size_t nul = buf.find('\0', start);
  if (nul != std::string::npos) {
    const int64_t line = 1 + std::count(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(nul), '\n');
    fail(path, ":", line, ": NUL byte at byte offset ", nul,
         ": the file looks like UTF-16 or UTF-32 without a byte-order mark (only UTF-8 is read)");
  }
  if (!skip_invalid) {  // with skip_invalid such records are skipped one by one
    const size_t bad_at = first_invalid_utf8(buf);
    if (bad_at != std::string::npos) {
      const int64_t line = 1 + std::count(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(bad_at), '\n');
      fail(path, ":", line, ": invalid UTF-8 at byte offset ", bad_at, " (byte ", hex_byte(buf[bad_at]), "); ", remedy);
    }
  }
  return start;
}

namespace {

// The `{{name}}` placeholders in `text`: an identifier ([A-Za-z_][A-Za-z0-9_]*) between double
// braces, spaces allowed inside, as in LLaMA-Factory's identity.json ("I am {{name}}, an AI
// assistant developed by {{author}}."), each as written.
std::vector<std::string> placeholders(const std::string& text) {
  std::vector<std::string> out;
  auto alpha = [](char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_'; };
  auto alnum = [&](char c) { return alpha(c) || (c >= '0' && c <= '9'); };
  for (size_t at = text.find("{{"); at != std::string::npos; at = text.find("{{", at + 1)) {
    size_t i = at + 2;
    while (i < text.size() && text[i] == ' ') ++i;
    if (i >= text.size() || !alpha(text[i])) continue;
    while (i < text.size() && alnum(text[i])) ++i;
    while (i < text.size() && text[i] == ' ') ++i;
    if (text.compare(i, 2, "}}") == 0) out.push_back(text.substr(at, i + 2 - at));
  }
  return out;
}

// Counts a record holding a `{{name}}` placeholder in ReadStats (placeholder_*).
void count_placeholders(const Record& r, ReadStats* s) {
  bool found = false;
  auto scan = [&](const std::string& text) {
    for (const std::string& p : placeholders(text)) {
      found = true;
      auto& names = s->placeholder_names;
      if (names.size() < 5 && std::find(names.begin(), names.end(), p) == names.end()) names.push_back(p);
    }
  };
  scan(r.text);
  for (const Turn& t : r.turns) scan(t.content);
  if (!found) return;
  if (s->placeholder_records++ == 0) s->placeholder_first = r.file + ":" + std::to_string(r.line);
}

}  // namespace

std::vector<Record> read_records(const std::string& path, const DataOptions& opts, ReadStats* stats) {
  ReadStats local;
  ReadStats* s = stats ? stats : &local;
  check_regular_file(path);
  QLORA_CHECK(fs::is_regular_file(path), path, ": dataset file not found", relative_path_note(path));
  Collector c(path, opts, s);
  const std::string ext = fs::path(path).extension().string();
  const std::string file = read_file(path);
  const size_t start = check_encoding(path, file, opts.skip_invalid);
  if (ext == ".csv" || ext == ".tsv") {
    const std::string delim = ext == ".tsv" ? ", delimiter='\\t'" : "";
    fail(path, ": ", ext == ".csv" ? "CSV" : "TSV",
         " is not read (data files are JSON, JSON Lines or .txt); convert it to JSON Lines, e.g. python3 -c \"import "
         "csv, json, sys; [print(json.dumps(r, ensure_ascii=False)) for r in csv.DictReader(open(sys.argv[1], "
         "newline=''", delim, "))]\" ", path, " > OUT.jsonl");
  }
  if (ext == ".txt") {
    // Plain text: documents separated by blank lines; each keeps its first line number.
    QLORA_CHECK(opts.format == "auto" || opts.format == "completion", path,
                ": a .txt file is read as format 'completion', not '", opts.format, "'");
    std::string doc;
    int64_t ln = 0, doc_line = 0;
    auto flush = [&]() {
      if (!doc.empty()) c.add_text(doc, doc_line);
      doc.clear();
    };
    for (size_t begin = start; begin < file.size();) {
      size_t end = file.find('\n', begin);
      if (end == std::string::npos) end = file.size();
      std::string line = file.substr(begin, end - begin);
      begin = end + 1;
      ++ln;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (std::all_of(line.begin(), line.end(), [](char ch) { return ch == ' ' || ch == '\t'; })) {
        flush();
        continue;
      }
      if (doc.empty()) doc_line = ln;
      else doc += '\n';
      doc += line;
    }
    flush();
  } else {
    const std::string buf = file.substr(start);
    size_t pos = 0;
    int64_t line = 1;
    while (pos < buf.size() && is_ws(buf[pos])) line += buf[pos++] == '\n';
    QLORA_CHECK(pos < buf.size(), path, ":", line, ": empty file (no records)");
    if (buf[pos] == '[') {
      read_json_array(path, buf, pos, line, c);
    } else {
      check_one_record_per_line(path, buf, pos, line);
      for_each_jsonl_line(buf, [&](const std::string& l, int64_t ln) { c.add_json(l, ln); });
    }
  }
  std::vector<Record> out = c.take();
  for (Record& r : out) {
    if (!r.is_text && !opts.default_system_message.empty() && (r.turns.empty() || r.turns[0].role != "system"))
      r.turns.insert(r.turns.begin(), Turn{"system", opts.default_system_message});
    count_placeholders(r, s);
  }
  QLORA_CHECK(!out.empty() || s->records_read > 0, path, ":1: empty file (no records)");
  QLORA_CHECK(!out.empty(), path, ": all ", s->records_read, " records are invalid (first: ",
              s->skip_examples.empty() ? std::string("?") : s->skip_examples[0], ")");
  if (s->format == "auto") s->format = "completion";
  return out;
}

std::vector<PromptLine> parse_prompts_jsonl(const std::string& bytes, const std::string& path) {
  // (generate has no data.skip_invalid: the remedy is the file's own, trial 21)
  const std::string buf = bytes.substr(check_encoding(path, bytes, /*skip_invalid=*/false, "the file must be UTF-8"));
  std::vector<PromptLine> out;
  for_each_jsonl_line(buf, [&](const std::string& text, int64_t line_no) {
    const std::string at = path + ":" + std::to_string(line_no) + ": ";
    json j;
    try {
      j = parse_value(text);
    } catch (const BadRecord& b) {
      fail(at, b.message);
    }
    QLORA_CHECK(j.is_object(), at, "expected a JSON object {\"prompt\": ..., \"system\"?: ...}, got ", j.type_name());
    PromptLine p;
    p.line = line_no;
    for (const auto& [key, v] : j.items()) {
      if (key == "prompt") {
        QLORA_CHECK(v.is_string(), at, "prompt: expected a string, got ", v.type_name());
        p.prompt = v.get<std::string>();
      } else if (key == "system") {
        QLORA_CHECK(v.is_string() || v.is_null(), at, "system: expected a string, got ", v.type_name());
        if (v.is_string()) p.system = v.get<std::string>();
      } else {
        fail(at, key, ": unknown key (a line has \"prompt\" and optionally \"system\")");
      }
    }
    QLORA_CHECK(j.contains("prompt"), at, "prompt: missing (each line is {\"prompt\": ..., \"system\"?: ...})");
    out.push_back(std::move(p));
  });
  QLORA_CHECK(!out.empty(), path, ": no prompts (one JSON object per line: {\"prompt\": ...})");
  return out;
}

std::vector<PromptLine> read_prompts_jsonl(const std::string& path) {
  check_regular_file(path);
  QLORA_CHECK(fs::is_regular_file(path), path, ": --prompts file not found", relative_path_note(path));
  return parse_prompts_jsonl(read_file(path), path);
}

}  // namespace qlora::data
