// qlora-cpp chat templates. The strings here are documented verbatim in docs/data.md.
#include "data/template.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.h"
#include "common/json_file.h"
#include "common/files.h"
#include "data/pyjson.h"

namespace qlora::data {

namespace {

using ojson = nlohmann::ordered_json;

// A call's arguments as a JSON value (a string argument stays a string, as the jinja sees it).
ojson call_arguments(const ToolCall& c) { return c.arguments_is_string ? ojson(c.arguments) : parse_json_as_python(c.arguments); }

// A call as the JSON text of one call, {"name": "NAME", "arguments": ARGS}: the glaive
// `function_call` form (json.dumps of {name, arguments}); a string argument (JSON text, checked by
// the reader) is written as it is, as qwen3's jinja writes it.
std::string call_json(const ToolCall& c) {
  return "{\"name\": " + py_json_dumps(ojson(c.name)) + ", \"arguments\": " +
         (c.arguments_is_string ? c.arguments : py_json_dumps(parse_json_as_python(c.arguments))) + "}";
}

// What an assistant turn trains in a template without a tool-call form (smollm2, llama3 and the
// qlora-cpp templates): its content, then each call's JSON, one a line.
std::string assistant_text(const Turn& t) {
  std::string s = t.content;
  for (const ToolCall& c : t.tool_calls) s += (s.empty() ? "" : "\n") + call_json(c);
  return s;
}

const char* kAlpacaSystem =
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.";
const char* kVicunaSystem =
    "A chat between a curious user and an artificial intelligence assistant. The assistant gives helpful, "
    "detailed, and polite answers to the user's questions.";

struct Builder {
  std::vector<Segment> segs;
  bool mask = false;  // the turn being written has weight 0: its segments are never trained
  void text(const std::string& t, bool train) {
    if (!t.empty()) segs.push_back({t, -1, train && !mask, false, mask});
  }
  void special(int32_t id, bool train) {
    if (id >= 0) segs.push_back({"", id, train && !mask, false, mask});
  }
};

// System turns are folded into the next user turn (llama2) or the preamble.
std::string leading_system(const Record& r, size_t* first) {
  std::string sys;
  size_t k = 0;
  for (; k < r.turns.size() && r.turns[k].role == "system"; ++k) sys += (sys.empty() ? "" : "\n") + r.turns[k].content;
  *first = k;
  return sys;
}

}  // namespace

const std::vector<std::string>& template_names() {
  static const std::vector<std::string> k = {"alpaca", "chatml", "llama2", "vicuna", "none",
                                             "smollm2", "qwen2.5", "qwen3", "llama3", "llama3.1", "llama3.2",
                                             "mistral"};
  return k;
}

void check_template_name(const std::string& name, const std::string& key, const std::vector<std::string>& also) {
  std::vector<std::string> names = template_names();
  names.insert(names.end(), also.begin(), also.end());
  if (std::find(names.begin(), names.end(), name) != names.end()) return;
  std::string all;
  for (const std::string& n : names) all += (all.empty() ? "" : "|") + n;
  fail(key, ": unknown template '", name, "' (", all, ")");
}

bool is_family_template(const std::string& name) {
  return name == "smollm2" || name == "qwen2.5" || name == "qwen3" || name == "llama3" || name == "llama3.1" ||
         name == "llama3.2" || name == "mistral";
}

bool template_renders_tools(const std::string& name) {
  return name == "qwen2.5" || name == "qwen3" || name == "llama3.1" || name == "llama3.2" || name == "mistral";
}

bool template_renders_reasoning(const std::string& name) { return name == "qwen3"; }

std::vector<Segment> render(const Record& r, const std::string& name, const Tokenizer& tok, bool add_eos) {
  if (is_family_template(name) && !r.is_text) {
    const auto piece = [&](int32_t id) { return id >= 0 ? tok.id_to_piece(id) : std::string(); };
    std::vector<Segment> segs = render_family(r, name, piece(tok.bos_id()), piece(tok.eos_id()));
    // A family's markers are single tokens of its tokenizer; spelled out as text by another
    // tokenizer they would train a format the model never saw. (Mistral's [INST] / [/INST] are
    // text in its v0.1/v0.2 vocabularies, so only the others are checked.)
    if (name != "mistral")
      for (const Segment& s : segs)
        if (s.control && tok.piece_to_id(s.text) < 0)
          fail("data.template: ", name, " writes ", s.text, " as one token, but the tokenizer ", tok.path(),
               " has no such token: it is not that family's tokenizer (data.template: auto picks the model's own)");
    return segs;
  }
  // BOS as the tokenizer adds it itself (transformers' `tokenizer(text)`, which Axolotl's prompt
  // tokenizers use): Llama 2 / Llama 3 / Mistral prepend theirs; GPT-2-style tokenizers (SmolLM2,
  // Qwen) prepend nothing, and SmolLM2's bos_token is <|im_start|>, which chatml writes itself.
  Builder b;
  const int32_t eos = add_eos ? tok.eos_id() : -1;
  b.special(tok.add_bos_default() ? tok.bos_id() : -1, false);
  if (r.is_text) {
    b.text(r.text, true);
    b.special(eos, true);
    return b.segs;
  }
  size_t k = 0;
  std::string sys = leading_system(r, &k);
  if (name == "chatml") {
    // <|im_start|>{role}\n{content}<|im_end|>\n ; assistant: header masked, content+<|im_end|>+EOS trained
    // (no second EOS when the EOS is <|im_end|> itself: SmolLM2, Qwen instruct tokenizers)
    const int32_t turn_eos = eos >= 0 && tok.id_to_piece(eos) == "<|im_end|>" ? -1 : eos;
    for (const Turn& t : r.turns) {
      b.mask = t.role == "assistant" && !t.train;
      if (t.role == "assistant") {
        b.text("<|im_start|>assistant\n", false);
        b.text(assistant_text(t) + "<|im_end|>", true);
        b.special(turn_eos, true);
        b.text("\n", false);
      } else {
        b.text("<|im_start|>" + t.role + "\n" + t.content + "<|im_end|>\n", false);
      }
    }
  } else if (name == "llama2") {
    // Meta's Llama-2-chat jinja (tests/fixtures/chat_templates/llama2_chat.jinja):
    //   user:      bos_token + '[INST] ' + content.strip() + ' [/INST]', the first user turn's content
    //              being '<<SYS>>\n' + system + '\n<</SYS>>\n\n' + user (stripped as a whole)
    //   assistant: ' ' + content.strip() + ' ' + eos_token
    // but one BOS (Meta: one before every [INST]), and lenient roles (tool turns as user turns,
    // a later system turn folded into the next user turn) where the jinja raises.
    for (; k < r.turns.size(); ++k) {
      const Turn& t = r.turns[k];
      b.mask = t.role == "assistant" && !t.train;
      if (t.role == "assistant") {
        b.text(" " + py_strip(assistant_text(t)) + " ", true);
        b.special(eos, true);
      } else if (t.role == "system") {
        sys += (sys.empty() ? "" : "\n") + t.content;
      } else {
        std::string u = t.content;
        if (!sys.empty()) u = "<<SYS>>\n" + sys + "\n<</SYS>>\n\n" + u;
        sys.clear();
        b.text("[INST] " + py_strip(u) + " [/INST]", false);
      }
    }
  } else if (name == "vicuna" || name == "alpaca") {
    // vicuna: {system} USER: {user} ASSISTANT: + " {assistant}" EOS ; next turns "USER: ..."
    // alpaca: {system}\n\n### Instruction:\n{user}\n\n### Response:\n + "{assistant}" EOS
    const bool vicuna = name == "vicuna";
    const std::string system_sep = vicuna ? " " : "\n\n";
    const std::string user_prefix = vicuna ? "USER: " : "### Instruction:\n";
    const std::string user_suffix = vicuna ? " ASSISTANT:" : "\n\n### Response:\n";
    const std::string assistant_prefix = vicuna ? " " : "";
    b.text((sys.empty() ? std::string(vicuna ? kVicunaSystem : kAlpacaSystem) : sys) + system_sep, false);
    for (; k < r.turns.size(); ++k) {
      const Turn& t = r.turns[k];
      b.mask = t.role == "assistant" && !t.train;
      if (t.role == "assistant") {
        b.text(assistant_prefix + assistant_text(t), true);
        b.special(eos, true);
      } else if (t.role == "system") {
        b.text(t.content + system_sep, false);
      } else {
        b.text(user_prefix + t.content + user_suffix, false);
      }
    }
  } else if (name == "none") {
    // contents concatenated as they are; assistant content + EOS trained
    for (const Turn& t : r.turns) {
      b.mask = t.role == "assistant" && !t.train;
      b.text(t.role == "assistant" ? assistant_text(t) : t.content, t.role == "assistant");
      if (t.role == "assistant") b.special(eos, true);
    }
  } else {
    check_template_name(name, "data.template");
  }
  return b.segs;
}

Example tokenize(const std::vector<Segment>& segs_in, const Tokenizer& tok, bool train_on_inputs) {
  Example ex;
  // a weight-0 turn's segments are never trained; train_on_inputs trains every other one
  const auto trained = [&](const Segment& seg) { return seg.trainable || (train_on_inputs && !seg.masked); };
  // A leading BOS id (our templates' and raw text's: the one the tokenizer's post-processor adds in
  // transformers) is not part of the text: the text after it is tokenised as starting at offset 0
  // (Metaspace "first" prepends its "▁"), as tokenizer(text) does.
  std::vector<Segment> segs_rest;
  const std::vector<Segment>* segs_p = &segs_in;
  bool leading_bos = false;
  if (!segs_in.empty() && segs_in.front().special_id >= 0 && segs_in.front().special_id == tok.bos_id()) {
    leading_bos = true;
    segs_rest.assign(segs_in.begin() + 1, segs_in.end());
    segs_p = &segs_rest;
    ex.input_ids.push_back(tok.bos_id());
    ex.labels.push_back(trained(segs_in.front()) ? tok.bos_id() : kIgnoreIndex);
  }
  const std::vector<Segment>& segs = *segs_p;
  std::string chunk;
  std::vector<std::pair<size_t, bool>> starts;  // (byte offset where a segment starts, its label kept)
  std::vector<int64_t> offs;
  auto flush = [&]() {
    if (chunk.empty()) return;
    // HF's Metaspace prepends "▁" to a split after a special token only under "always" (legacy);
    // "first" only to the split at offset 0 (nothing before the chunk)
    const bool at_start = ex.input_ids.size() == (leading_bos ? 1u : 0u);
    const TokenIds ids = tok.encode_with_offsets(chunk, &offs, at_start || tok.prefix_after_special());
    size_t s = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      while (s + 1 < starts.size() && starts[s + 1].first <= size_t(offs[i])) ++s;
      ex.input_ids.push_back(ids[i]);
      ex.labels.push_back(starts[s].second ? ids[i] : kIgnoreIndex);
    }
    chunk.clear();
    starts.clear();
  };
  if (tok.is_hf_json()) {
    // tokenizer.json: the whole rendered string in one pass, as HF tokenises apply_chat_template's
    // output: the tokenizer splits the added tokens (control pieces, BOS/EOS) out of it itself,
    // and its pre-tokenizer sees each split as HF does (Metaspace prepend_scheme, ByteLevel).
    for (const Segment& seg : segs) {
      const std::string t = seg.special_id >= 0 ? tok.id_to_piece(seg.special_id) : seg.text;
      if (t.empty()) continue;
      starts.emplace_back(chunk.size(), trained(seg));
      chunk += t;
    }
    flush();
    return ex;
  }
  for (const Segment& seg : segs) {
    const int32_t id = seg.special_id >= 0 ? seg.special_id : seg.control ? tok.piece_to_id(seg.text) : -1;
    if (id >= 0) {
      flush();
      ex.input_ids.push_back(id);
      ex.labels.push_back(trained(seg) ? id : kIgnoreIndex);
    } else if (!seg.text.empty()) {
      starts.emplace_back(chunk.size(), trained(seg));
      chunk += seg.text;
    }
  }
  flush();
  return ex;
}

std::pair<size_t, size_t> last_answer_span(const Example& ex) {
  size_t end = ex.labels.size();
  while (end > 0 && ex.labels[end - 1] == kIgnoreIndex) --end;
  size_t start = end;
  while (start > 0 && ex.labels[start - 1] != kIgnoreIndex) --start;
  return {start, end};
}

TokenIds chat_prompt(const Tokenizer& tok, const std::string& name, const std::optional<std::string>& system,
                     const std::string& user) {
  Record r;
  r.file = "--prompt";
  if (system) r.turns.push_back({"system", *system});
  r.turns.push_back({"user", user});
  // Mistral's jinja has no generation prompt: a user-last conversation (which keeps the system
  // message, dropped when an assistant turn is last) is the prompt itself.
  if (name == "mistral") return tokenize(render(r, name, tok, true), tok, false).input_ids;
  r.turns.push_back({"assistant", ""});
  const Example ex = tokenize(render(r, name, tok, /*add_eos=*/true), tok, /*train_on_inputs=*/false);
  const size_t start = last_answer_span(ex).first;
  QLORA_CHECK(start > 0, "template ", name, ": no prompt before the assistant turn");
  return TokenIds(ex.input_ids.begin(), ex.input_ids.begin() + static_cast<std::ptrdiff_t>(start));
}

std::string render_string(const std::vector<Segment>& segs, const Tokenizer& tok) {
  std::string s;
  for (const Segment& seg : segs) s += seg.special_id >= 0 ? tok.id_to_piece(seg.special_id) : seg.text;
  return s;
}

// ---------------------------------------------------------------------------------------------
// Model-family templates. Each function below follows its jinja text in
// tests/fixtures/chat_templates/ statement by statement (comments quote the jinja); messages are
// the record's turns in order (role, content, tool_calls, tool_call_id: the OpenAI message). For
// smollm2 and llama3, whose jinja has no tool-call syntax, an assistant turn's calls are first
// written into its content (assistant_text), as for the qlora-cpp templates.

namespace {

const char* kSmolSystem = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";
const char* kQwenSystem = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
}  // namespace

std::string template_default_system(const std::string& name) {
  if (name == "smollm2") return kSmolSystem;
  if (name == "qwen2.5") return kQwenSystem;
  return "";
}

namespace {

const char* kQwenToolsHead =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
const char* kQwenToolsTail =
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call>";

struct FamilyRenderer {
  const Record& r;
  const std::string& name;
  std::vector<Turn> msgs;
  std::vector<ojson> tools;  // empty = no tools
  std::vector<Segment> segs;
  bool mask = false;  // the message being written is an assistant turn of weight 0 (never trained)

  /// Starts writing message i (each loop over msgs calls it first): sets `mask`.
  void at(size_t i) { mask = msgs[i].role == "assistant" && !msgs[i].train; }

  [[noreturn]] void bad(const std::string& what) const {
    fail(r.file.empty() ? std::string("record") : r.file, ":", r.line, ": template ", name, ": ", what);
  }
  void text(const std::string& t, bool train = false) {
    if (!t.empty()) segs.push_back({t, -1, train && !mask, false, mask});
  }
  void control(const std::string& piece, bool train = false) {
    if (!piece.empty()) segs.push_back({piece, -1, train && !mask, true, mask});
  }
  /// One ChatML turn, '<|im_start|>' + head [+ body] + '<|im_end|>' + '\n' (smollm2, qwen2.5,
  /// qwen3): head is prompt-side text; body, '<|im_end|>' are trained when `train`. The head and
  /// the body stay separate segments (tokenized apart) exactly when a body is given.
  void im_turn(const std::string& head, const std::string& body = {}, bool train = false) {
    control("<|im_start|>");
    text(head);
    text(body, train);
    control("<|im_end|>", train);
    text("\n");
  }

  FamilyRenderer(const Record& rec, const std::string& n) : r(rec), name(n), msgs(rec.turns) {
    if (name == "smollm2" || name == "llama3")
      for (Turn& m : msgs)
        if (!m.tool_calls.empty()) {
          m.content = assistant_text(m);
          m.tool_calls.clear();
        }
    if (!r.tools.empty()) {
      ojson t;
      try {
        t = parse_json_as_python(r.tools);
      } catch (const std::exception&) {
        bad("tools: not valid JSON");
      }
      if (!t.is_array()) bad("tools: must be a JSON array");
      for (const ojson& x : t) tools.push_back(x);
    }
    if (!template_renders_tools(name)) tools.clear();  // smollm2, llama3: their jinjas ignore `tools`
  }

  // <tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call> (qwen2.5 tojson's the
  // arguments; qwen3 writes a string argument as it is)
  static std::string qwen_call(const ToolCall& c, bool string_args_verbatim) {
    const std::string args =
        string_args_verbatim && c.arguments_is_string ? c.arguments : py_json_dumps(call_arguments(c));
    return "<tool_call>\n{\"name\": \"" + c.name + "\", \"arguments\": " + args + "}\n</tool_call>";
  }

  // {%- elif message.role == "tool" %} of qwen2.5 / qwen3: consecutive tool results share one user turn.
  void qwen_tool(size_t i) {
    if (i == 0 || msgs[i - 1].role != "tool") {
      control("<|im_start|>");
      text("user");
    }
    text("\n<tool_response>\n" + msgs[i].content + "\n</tool_response>");
    if (i + 1 == msgs.size() || msgs[i + 1].role != "tool") {
      control("<|im_end|>");
      text("\n");
    }
  }

  void qwen_tools_system(const std::string& head) {
    std::string s = "system\n" + head + kQwenToolsHead;
    for (const ojson& t : tools) s += "\n" + py_json_dumps(t);
    im_turn(s + kQwenToolsTail);
  }

  void smollm2() {
    // {% if loop.first and messages[0]['role'] != 'system' %} default system {% endif %}
    // '<|im_start|>' + role + '\n' + content + '<|im_end|>' + '\n'
    for (size_t i = 0; i < msgs.size(); ++i) {
      if (i == 0 && msgs[0].role != "system") im_turn(std::string("system\n") + kSmolSystem);
      at(i);
      im_turn(msgs[i].role + "\n", msgs[i].content, msgs[i].role == "assistant");
    }
  }

  void qwen25() {
    const bool sys0 = !msgs.empty() && msgs[0].role == "system";
    if (!tools.empty()) {
      qwen_tools_system((sys0 ? msgs[0].content : std::string(kQwenSystem)) + "\n\n");
    } else {
      im_turn("system\n" + (sys0 ? msgs[0].content : std::string(kQwenSystem)));
    }
    for (size_t i = 0; i < msgs.size(); ++i) {
      at(i);
      const Turn& m = msgs[i];
      if (m.role == "user" || (m.role == "system" && i > 0)) {
        im_turn(m.role + "\n" + m.content);
      } else if (m.role == "assistant") {
        // '<|im_start|>' + role [+ '\n' + content] + ('\n<tool_call>...' per call) + '<|im_end|>\n'
        std::string body = m.content;
        for (size_t c = 0; c < m.tool_calls.size(); ++c)
          body += (c == 0 && m.content.empty() ? "" : "\n") + qwen_call(m.tool_calls[c], false);
        im_turn("assistant\n", body, true);
      } else if (m.role == "tool") {
        qwen_tool(i);
      }
    }
  }

  void qwen3() {
    const bool sys0 = !msgs.empty() && msgs[0].role == "system";
    if (!tools.empty()) {
      qwen_tools_system(sys0 ? msgs[0].content + "\n\n" : std::string());
    } else if (sys0) {
      im_turn("system\n" + msgs[0].content);
    }
    // last_query_index: the last user message that is not a wrapped tool response
    size_t last_query = msgs.size() - 1;
    for (size_t k = msgs.size(); k-- > 0;) {
      const std::string& c = msgs[k].content;
      const bool wrapped = c.rfind("<tool_response>", 0) == 0 && c.size() >= 16 &&
                           c.compare(c.size() - 16, 16, "</tool_response>") == 0;
      if (msgs[k].role == "user" && !wrapped) {
        last_query = k;
        break;
      }
    }
    for (size_t i = 0; i < msgs.size(); ++i) {
      at(i);
      const Turn& m = msgs[i];
      if (m.role == "user" || (m.role == "system" && i > 0)) {
        im_turn(m.role + "\n" + m.content);
      } else if (m.role == "assistant") {
        std::string content = m.content, reasoning;
        const size_t close = content.find("</think>");
        if (m.has_reasoning) {
          // {%- if message.reasoning_content is defined and message.reasoning_content is not none %}:
          // the field as given (even ""), the content not split
          reasoning = m.reasoning_content;
        } else if (close != std::string::npos) {
          // content.split('</think>')[-1].lstrip('\n'); split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n')
          std::string head = content.substr(0, close);
          content = content.substr(content.rfind("</think>") + 8);
          content.erase(0, content.find_first_not_of('\n') == std::string::npos ? content.size() : content.find_first_not_of('\n'));
          while (!head.empty() && head.back() == '\n') head.pop_back();
          const size_t open = head.rfind("<think>");
          reasoning = open == std::string::npos ? head : head.substr(open + 7);
          reasoning.erase(0, std::min(reasoning.size(), reasoning.find_first_not_of('\n')));
        }
        const bool has_content = !content.empty();  // the jinja's `content`, before any lstrip
        control("<|im_start|>");
        const bool last = i + 1 == msgs.size();
        if (i > last_query && (last || !reasoning.empty())) {
          // '\n<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' + content.lstrip('\n')
          std::string rs = reasoning;
          while (!rs.empty() && rs.back() == '\n') rs.pop_back();
          rs.erase(0, std::min(rs.size(), rs.find_first_not_of('\n')));
          content.erase(0, std::min(content.size(), content.find_first_not_of('\n')));
          text("assistant\n");
          // an empty think block (non-thinking form) is prompt-side; real reasoning is trained
          text("<think>\n" + rs + "\n</think>\n\n", !rs.empty());
        } else {
          text("assistant\n");
        }
        text(content, true);
        // each call: '\n' unless it is the first one after an empty content
        for (size_t c = 0; c < m.tool_calls.size(); ++c)
          text((c == 0 && !has_content ? "" : "\n") + qwen_call(m.tool_calls[c], true), true);
        control("<|im_end|>", true);
        text("\n");
      } else if (m.role == "tool") {
        qwen_tool(i);
      }
    }
  }

  // '<|start_header_id|>' + role + '<|end_header_id|>\n\n' (prompt side)
  void llama_header(const std::string& role) {
    control("<|start_header_id|>");
    text(role);
    control("<|end_header_id|>");
    text("\n\n");
  }

  void llama3(const std::string& bos) {
    // '<|start_header_id|>' + role + '<|end_header_id|>\n\n' + content|trim + '<|eot_id|>', bos_token first
    for (size_t i = 0; i < msgs.size(); ++i) {
      const bool a = msgs[i].role == "assistant";
      if (i == 0) control(bos);
      at(i);
      llama_header(msgs[i].role);
      text(py_strip(msgs[i].content), a);
      control("<|eot_id|>", a);
    }
  }

  // Llama 3.1 / 3.3 (llama3.1.jinja) and 3.2 (llama3.2.jinja): a system turn always, with
  // "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n" before the system
  // message (3.1's date_string default; 3.2's jinja writes strftime_now("%d %b %Y"), the day of
  // rendering, where the renderer defines it: we write the jinja's fallback date so that a run's
  // data do not change with the day, docs/data.md). With tools ("Environment: ipython\n" in the
  // system turn; tools_in_user_message, the default): the first message after the system one is
  // the user turn that lists the tools (tojson(indent=4)). A call (one per message, the jinja's
  // rule): an assistant turn {"name": N, "parameters": ARGS|tojson} (the content is not written);
  // a tool result: an `ipython` turn of content|tojson (a string is iterable in jinja, so it is
  // written as a JSON string).
  void llama31(const std::string& bos) {
    control(bos);
    size_t first = 0;
    std::string sys;
    if (msgs[0].role == "system") {
      sys = py_strip(msgs[0].content);
      first = 1;
    }
    llama_header("system");
    text(std::string(tools.empty() ? "" : "Environment: ipython\n") +
         "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n" + sys);
    control("<|eot_id|>");
    if (!tools.empty()) {
      if (first == msgs.size()) bad("Cannot put tools in the first user message when there's no first user message!");
      std::string s =
          "Given the following functions, please respond with a JSON for a function call with its proper arguments "
          "that best answers the given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": "
          "dictionary of argument name and its value}.Do not use variables.\n\n";
      for (const ojson& t : tools) s += py_json_dumps(t, 4) + "\n\n";
      llama_header("user");
      text(s + py_strip(msgs[first].content));
      control("<|eot_id|>");
      ++first;
    }
    for (size_t i = first; i < msgs.size(); ++i) {
      at(i);
      const Turn& m = msgs[i];
      if (m.role == "tool" || m.role == "ipython") {
        llama_header("ipython");
        text(py_json_dumps(ojson(m.content)));
        control("<|eot_id|>");
      } else if (!m.tool_calls.empty()) {
        if (m.tool_calls.size() != 1) bad("This model only supports single tool-calls at once!");
        if (!m.content.empty())
          bad("an assistant message with both content and tool_calls: the jinja writes only the call, so the "
              "content would be lost; put the text in a message of its own");
        const ToolCall& c = m.tool_calls[0];
        llama_header("assistant");
        text("{\"name\": \"" + c.name + "\", \"parameters\": " + py_json_dumps(call_arguments(c)) + "}", true);
        control("<|eot_id|>", true);
      } else {
        const bool a = m.role == "assistant";
        llama_header(m.role);
        text(py_strip(m.content), a);
        control("<|eot_id|>", a);
      }
    }
  }

  // `tool_call.id|length != 9` / `message.tool_call_id|length != 9` of mistral's jinja (characters)
  void mistral_id(size_t turn, const std::string& id, const char* what) const {
    size_t chars = 0;
    for (const char c : id) chars += (static_cast<unsigned char>(c) & 0xc0) != 0x80;
    if (chars != 9)
      bad("turn " + std::to_string(turn) + ": Tool call IDs should be alphanumeric strings with length 9! (the jinja's " +
          "error; " + what + " is '" + id + "')");
  }

  // "[AVAILABLE_TOOLS] [" + per tool '{"type": "function", "function": {' + its keys but "return"
  // ('"k": "v"' for a string, '"k": ' + v|tojson otherwise) + '}}', ", "-separated + "]" + "[/AVAILABLE_TOOLS]"
  void mistral_tools() {
    std::string s = " [";
    for (size_t t = 0; t < tools.size(); ++t) {
      const ojson& tool = tools[t];
      if (!tool.is_object() || !tool.contains("function") || !tool["function"].is_object())
        bad("tools[" + std::to_string(t) + "]: the jinja reads each tool in the OpenAI form {\"type\": \"function\", "
            "\"function\": {\"name\": ..., \"parameters\": ...}}");
      s += "{\"type\": \"function\", \"function\": {";
      bool first = true;
      for (auto it = tool["function"].begin(); it != tool["function"].end(); ++it) {
        if (it.key() == "return") continue;
        s += std::string(first ? "" : ", ") + "\"" + it.key() + "\": " +
             (it.value().is_string() ? "\"" + it.value().get<std::string>() + "\"" : py_json_dumps(it.value()));
        first = false;
      }
      s += t + 1 < tools.size() ? "}}, " : "}}]";
    }
    control("[AVAILABLE_TOOLS]");
    text(s);
    control("[/AVAILABLE_TOOLS]");
  }

  void mistral(const std::string& bos, const std::string& eos) {
    size_t first = 0;
    bool has_sys = false;
    std::string sys;
    if (!msgs.empty() && msgs[0].role == "system") {
      has_sys = true;
      sys = msgs[0].content;
      first = 1;
    }
    // the alternation check skips tool results and messages with tool calls
    size_t idx = 0;
    std::string last_user;
    for (size_t i = first; i < msgs.size(); ++i) {
      const Turn& m = msgs[i];
      if (m.role == "user") last_user = m.content;
      if (m.role == "tool" || !m.tool_calls.empty()) continue;
      if ((m.role == "user") != (idx % 2 == 0))
        bad("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...");
      ++idx;
    }
    control(bos);
    for (size_t i = first; i < msgs.size(); ++i) {
      at(i);
      const Turn& m = msgs[i];
      if (m.role == "user") {
        // tools before the last user message (the jinja compares messages: every user message
        // equal to the last one gets them)
        if (!tools.empty() && m.content == last_user) mistral_tools();
        // '[INST] ' + [system + '\n\n' if last and system] + content + '[/INST]'
        control("[INST]");
        text(" " + (i + 1 == msgs.size() && has_sys ? sys + "\n\n" : std::string()) + m.content);
        control("[/INST]");
      } else if (!m.tool_calls.empty()) {
        // "[TOOL_CALLS] [" + per call (function|tojson)[:-1] + ', "id": "' + id + '"}', ", "-separated + "]" + eos
        if (!m.content.empty())
          bad("turn " + std::to_string(i) + ": a message with tool_calls renders as [TOOL_CALLS] only: the jinja drops "
              "its content (not trained on silently; remove it, or use qwen2.5 / qwen3, which render both)");
        std::string s = " [";
        for (size_t c = 0; c < m.tool_calls.size(); ++c) {
          const ToolCall& call = m.tool_calls[c];
          mistral_id(i, call.id, "the call's id");
          ojson fn = ojson::object();
          fn["name"] = call.name;
          fn["arguments"] = call_arguments(call);
          std::string out = py_json_dumps(fn);
          out.pop_back();
          s += out + ", \"id\": \"" + call.id + "\"}" + (c + 1 < m.tool_calls.size() ? ", " : "]");
        }
        control("[TOOL_CALLS]", true);
        text(s, true);
        control(eos, true);
      } else if (m.role == "assistant") {
        text(" " + py_strip(m.content), true);
        control(eos, true);
      } else if (m.role == "tool") {
        // '[TOOL_RESULTS] {"content": ' + content + ', "call_id": "' + tool_call_id + '"}[/TOOL_RESULTS]'
        mistral_id(i, m.tool_call_id, "tool_call_id");
        control("[TOOL_RESULTS]");
        text(" {\"content\": " + m.content + ", \"call_id\": \"" + m.tool_call_id + "\"}");
        control("[/TOOL_RESULTS]");
      } else {
        bad("Only user and assistant roles are supported, with the exception of an initial optional system message!");
      }
    }
  }
};

// Normalised jinja texts of the named family templates (tests/fixtures/chat_templates/*.jinja;
// tests/data/test_templates.cpp recomputes each from its file).
struct KnownTemplate {
  const char* name;
  uint64_t hash;
};
const KnownTemplate kKnown[] = {
#include "data/template_hashes.inc"
};

/// Jinja templates `auto` recognises but does not take, because the named template that renders
/// them differs from the jinja by design (docs/data.md): what to say instead of "matches none".
struct NearTemplate {
  const char* name;  ///< the named template to set
  uint64_t hash;     ///< template_text_hash of the jinja (tests/fixtures/chat_templates/)
  const char* what;  ///< whose jinja it is and how `name` differs from it
};
const NearTemplate kNear[] = {
    {"llama2", 0xca2627215ed618dfull,
     "Meta's Llama-2-chat template (llama2_chat.jinja); data.template: llama2 renders it with one BOS per "
     "example where the jinja writes <s> before every [INST] (docs/data.md)"},
};
const NearTemplate* near_template(uint64_t h) {
  for (const NearTemplate& n : kNear)
    if (n.hash == h) return &n;
  return nullptr;
}

/// The model's own chat template text and the file it came from: `<dir>/chat_template.jinja`,
/// else tokenizer_config.json `chat_template` (a string, or the list entry named "default").
std::pair<std::string, std::string> model_chat_template(const std::string& model_dir);

}  // namespace

std::vector<Segment> render_family(const Record& r, const std::string& name, const std::string& bos,
                                   const std::string& eos) {
  QLORA_CHECK(is_family_template(name), "data.template: '", name, "' is not a model-family template");
  FamilyRenderer f(r, name);
  if (f.msgs.empty()) f.bad("no turns");
  if (name == "smollm2") f.smollm2();
  else if (name == "qwen2.5") f.qwen25();
  else if (name == "qwen3") f.qwen3();
  else if (name == "llama3") f.llama3(bos);
  else if (name == "llama3.1" || name == "llama3.2") f.llama31(bos);  // the two jinjas differ only in branches never taken here
  else f.mistral(bos, eos);
  return std::move(f.segs);
}

namespace {
/// What of a jinja template decides its output, as one string: the text between tags as Jinja
/// outputs it (whitespace control applied), each tag's code without its whitespace, and string
/// literals decoded; two templates with the same form render the same strings.
std::string template_canonical_form(const std::string& jinja_in) {
  // Jinja's lexer as transformers configures it (ImmutableSandboxedEnvironment(trim_blocks=True,
  // lstrip_blocks=True), keep_trailing_newline off; jinja2/lexer.py): "\r\n" is read as "\n"; one
  // trailing newline of the source is dropped; text between tags is output, less the newline right
  // after a block or comment tag (trim_blocks), the spaces and tabs from a line's start up to a
  // block or comment tag (lstrip_blocks, unless "{%+"), and every whitespace next to a "-" marker.
  std::string jinja;
  for (size_t i = 0; i < jinja_in.size(); ++i)
    if (!(jinja_in[i] == '\r' && i + 1 < jinja_in.size() && jinja_in[i + 1] == '\n')) jinja += jinja_in[i];
  if (!jinja.empty() && jinja.back() == '\n') jinja.pop_back();
  const auto is_ws = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  struct Tag {
    size_t begin = 0, end = 0;  // [begin, end) of "{%...%}" etc.
    char kind = 0;              // '{' variable, '%' block, '#' comment
    bool strip_before = false, strip_after = false, keep_before = false;
    std::string body;           // whitespace outside string literals removed, literals decoded
  };
  std::vector<Tag> tags;
  for (size_t i = 0; i + 1 < jinja.size();) {
    if (jinja[i] != '{' || (jinja[i + 1] != '{' && jinja[i + 1] != '%' && jinja[i + 1] != '#')) {
      ++i;
      continue;
    }
    Tag t;
    t.begin = i;
    t.kind = jinja[i + 1];
    const char close = t.kind == '{' ? '}' : t.kind;
    size_t j = i + 2;
    if (j < jinja.size() && jinja[j] == '-') t.strip_before = true, ++j;
    else if (j < jinja.size() && jinja[j] == '+') t.keep_before = true, ++j;
    bool closed = false;
    while (j < jinja.size()) {
      const char c = jinja[j];
      if (t.kind != '#' && (c == '\'' || c == '"')) {  // a string literal: kept, its escapes decoded
        std::string lit;
        size_t k = j + 1;
        for (; k < jinja.size() && jinja[k] != c; ++k) {
          if (jinja[k] == '\\' && k + 1 < jinja.size()) {
            const char e = jinja[++k];
            lit += e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
            if (e != 'n' && e != 't' && e != 'r' && e != '\\' && e != '\'' && e != '"') lit.insert(lit.size() - 1, 1, '\\');
          } else {
            lit += jinja[k];
          }
        }
        t.body += "\x01" + std::to_string(lit.size()) + ":" + lit;  // length-prefixed: no quoting ambiguity
        j = k + 1;
        continue;
      }
      if (c == '-' && j + 2 < jinja.size() && jinja[j + 1] == close && jinja[j + 2] == '}') {
        t.strip_after = true;
        t.end = j + 3;
        closed = true;
        break;
      }
      if (c == close && j + 1 < jinja.size() && jinja[j + 1] == '}') {
        t.end = j + 2;
        closed = true;
        break;
      }
      if (t.kind != '#' && !is_ws(c)) t.body += c;
      ++j;
    }
    if (!closed) break;  // an unclosed tag: the rest is compared as text
    tags.push_back(std::move(t));
    i = tags.back().end;
  }
  std::string out;
  size_t pos = 0;  // where the text after tags[n - 1] starts
  for (size_t n = 0; n <= tags.size(); ++n) {
    const size_t text_end = n < tags.size() ? tags[n].begin : jinja.size();
    std::string text = jinja.substr(pos, text_end - pos);
    bool line_starting = n == 0;  // jinja's lexer: did the previous token end a line?
    if (n > 0) {
      const Tag& prev = tags[n - 1];
      size_t k = 0;
      if (prev.strip_after)
        while (k < text.size() && is_ws(text[k])) ++k;
      else if (prev.kind != '{' && !text.empty() && text[0] == '\n')
        k = 1;
      line_starting = k > 0 && text[k - 1] == '\n';
      text.erase(0, k);
    }
    if (n < tags.size()) {
      const Tag& next = tags[n];
      if (next.strip_before) {
        while (!text.empty() && is_ws(text.back())) text.pop_back();
      } else if (next.kind != '{' && !next.keep_before) {
        const size_t l_pos = text.rfind('\n') + 1;  // npos + 1 = 0
        bool blank = l_pos < text.size();
        for (size_t k = l_pos; k < text.size(); ++k) blank = blank && is_ws(text[k]);
        if ((l_pos > 0 || line_starting) && blank) text.erase(l_pos);
      }
    }
    if (!text.empty()) out += "\x02" + std::to_string(text.size()) + ":" + text;
    if (n < tags.size() && tags[n].kind != '#') out += std::string("\x03") + tags[n].kind + tags[n].body;
    if (n < tags.size()) pos = tags[n].end;
  }
  return out;
}
}  // namespace

uint64_t template_text_hash(const std::string& jinja) {
  uint64_t h = 1469598103934665603ull;
  for (const char c : template_canonical_form(jinja)) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

namespace {
std::pair<std::string, std::string> model_chat_template(const std::string& model_dir) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::is_directory(model_dir) ? fs::path(model_dir) : fs::path(model_dir).parent_path();
  std::string text, source;
  if (fs::is_regular_file(dir / "chat_template.jinja")) {
    source = (dir / "chat_template.jinja").string();
    text = read_file(source);
  } else {
    source = (dir / "tokenizer_config.json").string();
    QLORA_CHECK(fs::is_regular_file(source), source,
                ": not found; data.template: auto reads the model's chat template (set data.template: NAME)");
    const nlohmann::json j = read_json_object_file(source);
    auto ct = j.find("chat_template");
    QLORA_CHECK(ct != j.end() && !ct->is_null(), source,
                ": chat_template: missing; the model has no chat template (set data.template: NAME)");
    if (ct->is_array()) {  // [{"name": "default", "template": ...}, ...]
      for (const auto& e : *ct)
        if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string())
          text = e["template"].get<std::string>();
      QLORA_CHECK(!text.empty(), source, ": chat_template: no entry named \"default\" (set data.template: NAME)");
    } else {
      QLORA_CHECK(ct->is_string(), source, ": chat_template: must be a string, got ", ct->type_name());
      text = ct->get<std::string>();
    }
  }
  return {text, source};
}
}  // namespace

std::string resolve_template(const std::string& name, const std::string& model_dir) {
  if (name != "auto") return name;
  const auto [text, source] = model_chat_template(model_dir);
  const uint64_t h = template_text_hash(text);
  for (const KnownTemplate& k : kKnown)
    if (k.hash == h) return k.name;
  if (const NearTemplate* n = near_template(h))
    fail(source, ": chat template is ", n->what, "; data.template: auto takes only exact matches: set data.template: ",
         n->name);
  std::string names;
  for (const std::string& n : template_names()) names += (names.empty() ? "" : ", ") + n;
  fail(source, ": chat template matches none of the named templates (", names,
       "); choose one with data.template: NAME (docs/data.md)");
}

std::string template_mismatch_note(const std::string& name, const std::string& model_dir) {
  uint64_t h = 0;
  try {
    h = template_text_hash(model_chat_template(model_dir).first);
  } catch (const Error&) {
    return "";
  }
  for (const KnownTemplate& k : kKnown)
    if (k.hash == h)
      return k.name == name ? ""
                            : "data.template is " + name + ", but the model's own chat template is " + k.name +
                                  "'s: the model was tuned on that format (data.template: auto, or " + k.name +
                                  ", uses it)";
  if (const NearTemplate* n = near_template(h); n && n->name != name)
    return "data.template is " + name + ", but the model's own chat template is " + n->what +
           ": the model was tuned on that format";
  return "";
}

namespace {
/// The strings a template writes that its family's tokenizer has as single (special) tokens.
std::vector<std::string> template_markers(const std::string& name) {
  if (name == "chatml" || name == "smollm2" || name == "qwen2.5" || name == "qwen3") return {"<|im_start|>", "<|im_end|>"};
  if (name == "llama3" || name == "llama3.1" || name == "llama3.2")
    return {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};
  // alpaca, vicuna, llama2, none: their markers are text in their families too. mistral: [INST] is
  // text in v0.1's 32000-token vocabulary but a control token in v0.3's 32768, so neither is required.
  return {};
}
}  // namespace

std::string template_tokens_note(const std::string& name, const Tokenizer& tok) {
  std::string pieces;
  for (const std::string& m : template_markers(name))
    if (const size_t n = tok.encode(m).size(); n != 1)
      pieces += (pieces.empty() ? "" : ", ") + m + " (" + std::to_string(n) + " pieces)";
  if (pieces.empty()) return "";
  return "data.template " + name + " writes markers that are not tokens of this tokenizer: " + pieces +
         "; the model learns them as text and generate does not stop at them. Use the model's own format "
         "(data.template: auto, or llama2 / mistral / alpaca for a vocabulary without them)";
}

std::string add_eos_note(const std::string& name, bool add_eos) {
  if (add_eos || !is_family_template(name)) return "";
  return "data.add_eos: false does not change conversations under template " + name +
         ": its format closes every assistant turn with its own end-of-turn token, which is trained (as "
         "apply_chat_template writes it); it applies to raw-text files only";
}

std::vector<std::string> template_warnings(const std::string& name, const std::string& model_dir, const Tokenizer& tok,
                                           bool add_eos) {
  std::vector<std::string> out;
  for (std::string note : {model_dir.empty() ? "" : template_mismatch_note(name, model_dir), template_tokens_note(name, tok),
                           add_eos_note(name, add_eos)})
    if (!note.empty()) out.push_back(std::move(note));
  return out;
}

std::string py_tojson(const std::string& json_text) {
  ojson v;
  try {
    v = parse_json_as_python(json_text);
  } catch (const std::exception& e) {
    fail("tojson: not JSON: ", e.what());
  }
  return py_json_dumps(v);
}

std::string py_strip(const std::string& s) {
  // Python's str.isspace() code points: \t-\r, \x1c-\x1f, space, \x85, \xa0, \u1680,
  // \u2000-\u200a, \u2028, \u2029, \u202f, \u205f, \u3000.
  auto is_space = [](uint32_t c) {
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
  };
  auto decode = [&](size_t i, size_t* len) -> uint32_t {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) { *len = 1; return b; }
    const int n = b >= 0xf0 ? 4 : b >= 0xe0 ? 3 : b >= 0xc0 ? 2 : 1;
    if (n == 1 || i + n > s.size()) { *len = 1; return 0xFFFD; }
    uint32_t c = b & (0x7f >> n);
    for (int k = 1; k < n; ++k) c = (c << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    *len = size_t(n);
    return c;
  };
  size_t b = 0, len = 0;
  while (b < s.size() && is_space(decode(b, &len))) b += len;
  size_t e = s.size();
  while (e > b) {
    size_t st = e - 1;  // start of the last code point
    while (st > b && (static_cast<unsigned char>(s[st]) & 0xc0) == 0x80) --st;
    if (!is_space(decode(st, &len))) break;
    e = st;
  }
  return s.substr(b, e - b);
}

}  // namespace qlora::data
