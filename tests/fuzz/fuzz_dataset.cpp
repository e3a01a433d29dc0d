// libFuzzer target: dataset files through qlora::data::read_records (JSON array, JSONL, .txt).
// The first input byte picks the file suffix, the format and skip_invalid; the rest is the file.
// Contract (data/reader.h): records, or qlora::Error `file:line: problem`; nothing else escapes.
// The same bytes also go through qlora::parse_generation_config (a model dir's
// generation_config.json, model/generation_config.h): a GenerationConfig whose values are in their
// documented ranges, or qlora::Error; and through qlora::data::parse_prompts_jsonl (a `generate
// --prompts` file): prompts with 1-based line numbers in increasing order, or qlora::Error; and
// through qlora::data::template_text_hash (a model's chat_template, which `data.template: auto`
// lexes as Jinja does): a hash, never a throw or an out-of-bounds read.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/error.h"
#include "data/reader.h"
#include "data/template.h"
#include "model/generation_config.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const char* kSuffix[] = {".jsonl", ".json", ".txt", ".jsonl"};
  static const char* kFormat[] = {"auto", "auto", "alpaca", "sharegpt", "messages", "completion", "auto", "auto"};
  const uint8_t sel = data[0];
  qlora::data::DataOptions opts;
  opts.format = kFormat[(sel >> 2) & 7];
  opts.skip_invalid = (sel >> 5) & 1;
  if ((sel >> 6) & 1) opts.field_map = {{"instruction", "prompt"}, {"output", "completion"}};
  if ((sel >> 7) & 1) opts.role_map = {{"bot", "assistant"}, {"person", "user"}};
  const std::string path = qlora::fuzz::scratch_file(data + 1, size - 1, kSuffix[sel & 3]);
  try {
    qlora::data::ReadStats stats;
    const auto records = qlora::data::read_records(path, opts, &stats);
    volatile size_t sink = 0;
    for (const auto& r : records) {
      sink += r.text.size() + r.turns.size();
      for (const auto& t : r.turns) sink += t.role.size() + t.content.size();
    }
    (void)sink;
  } catch (const qlora::Error&) {
  }
  try {
    const qlora::GenerationConfig c = qlora::parse_generation_config(
        std::string(reinterpret_cast<const char*>(data + 1), size - 1), "generation_config.json");
    const bool ok = (!c.temperature || (std::isfinite(*c.temperature) && *c.temperature >= 0)) &&
                    (!c.top_k || *c.top_k >= 0) && (!c.top_p || (*c.top_p > 0 && *c.top_p <= 1)) &&
                    (!c.repetition_penalty || (std::isfinite(*c.repetition_penalty) && *c.repetition_penalty > 0)) &&
                    (!c.max_new_tokens || *c.max_new_tokens >= 1) && (!c.max_length || *c.max_length >= 1);
    if (!ok) std::abort();  // a value outside its documented range got through
  } catch (const qlora::Error&) {
  }
  try {
    const auto prompts = qlora::data::parse_prompts_jsonl(std::string(reinterpret_cast<const char*>(data + 1), size - 1),
                                                          "prompts.jsonl");
    int64_t last = 0;
    for (const auto& p : prompts) {
      if (p.line <= last) std::abort();  // line numbers must increase
      last = p.line;
    }
  } catch (const qlora::Error&) {
  }
  volatile uint64_t hash = qlora::data::template_text_hash(std::string(reinterpret_cast<const char*>(data + 1), size - 1));
  (void)hash;
  return 0;
}
