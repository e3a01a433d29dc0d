// Bad input for the chat templates: malformed tool calls / tools lists, conversations a family's
// jinja refuses, and broken model chat templates for `template: auto`. Each is one line naming
// the file (and line / JSON key). Torch-free; also run under ASan+UBSan by scripts/test.sh.
#include <gtest/gtest.h>

#include <fstream>

#include "common/files.h"
#include "common/error.h"
#include "data/reader.h"
#include "data/template.h"
#include "tests/test_util.h"

using namespace qlora::data;
namespace fs = std::filesystem;

namespace {

std::string render_error(const std::string& json_text, const std::string& tpl) {
  try {
    DataOptions o;
    const Record r = record_from_json(json_text, "chat.json", o);
    render_family(r, tpl, "<s>", "</s>");
  } catch (const qlora::Error& e) {
    return e.what();
  }
  return "";
}

void expect_prefix(const std::string& msg, const std::string& prefix) {
  EXPECT_EQ(msg.rfind(prefix, 0), 0u) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
}

std::string auto_error(const fs::path& dir) {
  try {
    resolve_template("auto", dir.string());
  } catch (const qlora::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(BadInputTemplate, ToolCallsAndToolsLists) {
  const std::string call = R"({"role": "function_call", "content": )";
  expect_prefix(render_error(R"({"messages": [{"role": "user", "content": "u"}], "tools": 3})", "qwen2.5"),
                "chat.json:1: field 'tools' must be an array or a string, got number");
  expect_prefix(render_error(R"({"messages": [{"role": "user", "content": "u"}], "tools": "[{"})", "qwen2.5"),
                "chat.json:1: template qwen2.5: tools: not valid JSON");
  expect_prefix(render_error(R"({"messages": [{"role": "user", "content": "u"}], "tools": "{}"})", "qwen3"),
                "chat.json:1: template qwen3: tools: must be a JSON array");
  // a function_call turn's content is read as the call's JSON (the reader: one path for both forms)
  expect_prefix(render_error(R"({"messages": [{"role": "user", "content": "u"}, )" + call + R"("{\"name\": "}]})", "qwen2.5"),
                "chat.json:1: messages[1].content: a function_call turn's content must be JSON: a call");
  expect_prefix(render_error(R"({"messages": [{"role": "user", "content": "u"}, )" + call + R"("{\"arguments\": {}}"}]})", "qwen3"),
                "chat.json:1: messages[1].content: missing field 'name' (the function called)");
  expect_prefix(render_error(R"({"messages": [{"role": "user", "content": "u"}, )" + call + R"("not json"}]})", "llama3"),
                "chat.json:1: messages[1].content: a function_call turn's content must be JSON");
  // the OpenAI form: tool_calls only on an assistant message; a call object; a string type "function"
  const std::string u = R"({"messages": [{"role": "user", "content": "u"}, )";
  expect_prefix(render_error(u + R"({"role": "user", "content": "x", "tool_calls": []}]})", "qwen2.5"),
                "chat.json:1: messages[1].tool_calls: only an assistant message has tool calls (this one is 'user')");
  expect_prefix(render_error(u + R"({"role": "assistant", "tool_calls": ["f"]}]})", "qwen2.5"),
                "chat.json:1: messages[1].tool_calls[0] must be an object (a tool call), got string");
  expect_prefix(render_error(u + R"({"role": "assistant", "tool_calls": [{"type": "custom", "function": {"name": "f"}}]}]})", "qwen3"),
                "chat.json:1: messages[1].tool_calls[0].type must be \"function\", got 'custom'");
  expect_prefix(render_error(u + R"({"role": "assistant", "tool_calls": [{"function": {"name": "f"}, "id": 7}]}]})", "mistral"),
                "chat.json:1: messages[1].tool_calls[0].id must be a string, got number");
  expect_prefix(render_error(u + R"({"role": "assistant", "tool_calls": []}]})", "qwen2.5"),
                "chat.json:1: messages[1]: missing field 'content'");
  expect_prefix(render_error(u + R"({"role": "tool", "content": "r", "tool_call_id": 3}]})", "qwen2.5"),
                "chat.json:1: messages[1].tool_call_id must be a string, got number");
}

TEST(BadInputTemplate, ConversationsTheJinjaRefuses) {
  expect_prefix(render_error(R"({"messages": [{"role": "assistant", "content": "a"}]})", "mistral"),
                "chat.json:1: template mistral: After the optional system message, conversation roles must alternate");
  expect_prefix(render_error(R"({"messages": [{"role": "user", "content": "u"}, {"role": "tool", "content": "{}"}]})", "mistral"),
                "chat.json:1: template mistral: turn 1: Tool call IDs should be alphanumeric strings with length 9!");
  expect_prefix(render_error(R"({"messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "I will.", )"
                             R"("tool_calls": [{"id": "abcdefghi", "function": {"name": "f", "arguments": {}}}]}]})", "mistral"),
                "chat.json:1: template mistral: turn 1: a message with tool_calls renders as [TOOL_CALLS] only: the jinja "
                "drops its content");
  expect_prefix(render_error(R"({"messages": [{"role": "user", "content": "u"}]})", "chatml"),
                "data.template: 'chatml' is not a model-family template");
}

TEST(BadInputTemplate, AutoWithBrokenModelTemplates) {
  const fs::path d = qlora::test::fresh_temp_dir("badinput_auto");
  const std::string cfg = (d / "tokenizer_config.json").string();
  expect_prefix(auto_error(d), cfg + ": not found");
  std::ofstream(d / "tokenizer_config.json") << R"({"chat_template": )";
  expect_prefix(auto_error(d), cfg + ":1:19: invalid JSON: ");
  std::ofstream(d / "tokenizer_config.json") << R"({"chat_template": 42})";
  expect_prefix(auto_error(d), cfg + ": chat_template: must be a string, got number");
  std::ofstream(d / "tokenizer_config.json") << R"({"chat_template": [{"name": "tool_use", "template": "x"}]})";
  expect_prefix(auto_error(d), cfg + ": chat_template: no entry named \"default\"");
  std::ofstream(d / "tokenizer_config.json") << R"({"bos_token": "<s>"})";
  expect_prefix(auto_error(d), cfg + ": chat_template: missing");
  std::ofstream(d / "chat_template.jinja") << "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}";
  const std::string m = auto_error(d);
  expect_prefix(m, (d / "chat_template.jinja").string() + ": chat template matches none of the named templates (");
  EXPECT_NE(m.find("smollm2, qwen2.5, qwen3, llama3, llama3.1, llama3.2, mistral"), std::string::npos) << m;
  EXPECT_NE(m.find("choose one with data.template: NAME"), std::string::npos) << m;
  qlora::remove_tree(d);
}
