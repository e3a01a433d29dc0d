// Model-family chat templates (smollm2, qwen2.5, qwen3, llama3, llama3.1, llama3.2, mistral) against transformers'
// apply_chat_template with each family's real jinja text (tests/fixtures/make_template_refs.py),
// their label rule, `template: auto`, and the jinja helpers (trim, tojson).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "common/files.h"
#include "common/error.h"
#include "data/dataset.h"
#include "data/pyjson.h"
#include "data/reader.h"
#include "data/template.h"
#include "tests/test_util.h"

using namespace qlora::data;
namespace fs = std::filesystem;

namespace {

const std::map<std::string, std::string> kJinja = {{"smollm2", "smollm2.jinja"},   {"qwen2.5", "qwen2.5.jinja"},
                                                   {"qwen3", "qwen3.jinja"},       {"llama3", "llama3.jinja"},
                                                   {"llama3.1", "llama3.1.jinja"}, {"llama3.2", "llama3.2.jinja"},
                                                   {"mistral", "mistral_v0.3.jinja"}};

std::vector<Record> records_of(const fs::path& jsonl) {
  DataOptions o;
  o.format = "messages";
  ReadStats st;
  return read_records(jsonl.string(), o, &st);
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

std::string concat(const std::vector<Segment>& segs, bool trainable_only) {
  std::string s;
  for (const Segment& g : segs)
    if (!trainable_only || g.trainable) s += g.text;
  return s;
}

// render_family's error message for `r` in template `tpl`, "" when it renders.
std::string render_error(const Record& r, const std::string& tpl, const std::string& bos, const std::string& eos) {
  try {
    render_family(r, tpl, bos, eos);
  } catch (const qlora::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// The rendered string of every conversation equals transformers' rendering with the real jinja.
TEST(FamilyTemplates, RenderedStringsMatchTransformers) {
  QLORA_REQUIRE_FIXTURE(refs, "templates/template_refs.json");
  const auto j = nlohmann::json::parse(std::ifstream(refs));
  std::map<std::string, std::vector<Record>> recs;
  std::map<std::string, int> checked;
  for (const auto& [name, file] : kJinja) recs[name] = records_of(refs.parent_path() / (name + ".jsonl"));
  for (const auto& c : j["cases"]) {
    const std::string name = c["template"];
    const Record& r = recs.at(name).at(c["index"].get<size_t>());
    const auto segs = render_family(r, name, c["bos_str"], c["eos_str"]);
    EXPECT_EQ(concat(segs, false), c["rendered"].get<std::string>()) << name << " #" << c["index"];
    ++checked[name];
  }
  for (const auto& [name, file] : kJinja) {
    EXPECT_GE(checked[name], 50) << name;
    EXPECT_EQ(checked[name], j["counts"][name].get<int>()) << name;
  }
  // docs/data.md's numbers: 85 conversations each (mistral 61), + 9 OpenAI tool_calls ones (mistral 6,
  // llama3.1/3.2 4), + 10 glaive ones in the OpenAI form (qwen2.5, llama3.1, llama3.2 5, mistral none),
  // + 7 with reasoning_content (mistral 5) and 2 with Axolotl weights
  EXPECT_EQ(checked, (std::map<std::string, int>{{"llama3", 113}, {"llama3.1", 103}, {"llama3.2", 103}, {"mistral", 74 * 4},
                                                 {"qwen2.5", 108}, {"qwen3", 113}, {"smollm2", 113}}));
  int total = 0;
  for (const auto& [name, n] : checked) total += n;
  EXPECT_EQ(total, 949);  // mistral 4 times: tokenizer.json and tokenizer.model, Llama and Mistral config
}

// Ids equal apply_chat_template(tokenize=True) with each family's tokenizer fixture; only
// assistant turns carry labels (assistant text + its closing token; the mask of the fixture
// script, computed from the rendered string and HF's token offsets), each closing token learned,
// but for an assistant turn of Axolotl `weight: 0` (none of its tokens).
TEST(FamilyTemplates, IdsMatchTransformersAndOnlyAssistantTurnsAreTrained) {
  QLORA_REQUIRE_FIXTURE(refs, "templates/template_refs.json");
  const auto j = nlohmann::json::parse(std::ifstream(refs));
  std::map<std::string, std::vector<Record>> recs;
  std::map<std::string, Tokenizer> toks;
  std::map<std::string, int> checked;
  for (const auto& [name, file] : kJinja) recs[name] = records_of(refs.parent_path() / (name + ".jsonl"));
  const std::map<std::string, std::string> closing = {{"smollm2", "<|im_end|>"}, {"qwen2.5", "<|im_end|>"},
                                                      {"qwen3", "<|im_end|>"},   {"llama3", "<|eot_id|>"},
                                                      {"llama3.1", "<|eot_id|>"}, {"llama3.2", "<|eot_id|>"},
                                                      {"mistral", "</s>"}};
  for (const auto& c : j["cases"]) {
    const std::string name = c["template"];
    ASSERT_TRUE(c.contains("ids")) << "template refs were made without the tokenizer fixtures (build/fixtures/tokenizers/): "
                                   << "run make_tokenizer_refs.py before make_template_refs.py";
    const std::string tdir = c["tokenizer"];
    if (!toks.count(tdir)) toks.emplace(tdir, Tokenizer::from_pretrained((qlora::test::fixtures_dir() / "tokenizers" / tdir).string()));
    const Tokenizer& tok = toks.at(tdir);
    const Record& r = recs.at(name).at(c["index"].get<size_t>());
    const auto segs = render(r, name, tok, /*add_eos=*/true);
    ASSERT_EQ(render_string(segs, tok), c["rendered"].get<std::string>()) << name << " #" << c["index"];
    const Example ex = tokenize(segs, tok, false);
    ASSERT_EQ(ex.input_ids, c["ids"].get<TokenIds>()) << name << " #" << c["index"] << ": " << c["rendered"];
    // BOS: exactly one, first, for the templates that write it; none for Qwen (no BOS token)
    const int32_t bos = tok.bos_id();
    if (name.rfind("llama3", 0) == 0 || name == "mistral") {
      EXPECT_EQ(ex.input_ids.front(), bos) << name;
      EXPECT_EQ(std::count(ex.input_ids.begin(), ex.input_ids.end(), bos), 1) << name;
    }
    // label rule: trained = each assistant turn's text and its closing token; the reference mask
    // is computed by the fixture script from the rendered string's structure and HF's offsets
    std::vector<bool> trained;
    int closing_trained = 0, assistant_turns = 0;
    const int32_t close_id = tok.piece_to_id(closing.at(name));
    ASSERT_GE(close_id, 0) << name << ": " << closing.at(name) << " not in " << tdir;
    for (size_t i = 0; i < ex.labels.size(); ++i) {
      trained.push_back(ex.labels[i] != kIgnoreIndex);
      if (trained.back()) {
        EXPECT_EQ(ex.labels[i], ex.input_ids[i]);
      }
      closing_trained += trained.back() && ex.input_ids[i] == close_id;
    }
    EXPECT_EQ(trained, c["trained"].get<std::vector<bool>>()) << name << " #" << c["index"] << ": " << c["rendered"];
    for (const Turn& t : r.turns) assistant_turns += t.role == "assistant" && t.train;  // weight 0: not trained
    EXPECT_EQ(closing_trained, assistant_turns) << name << " #" << c["index"];
    ++checked[name];
  }
  for (const auto& [name, file] : kJinja) EXPECT_GE(checked[name], 50) << name;
}

// OpenAI `tool_calls` records: read as they are in the file (null / absent / "" content, calls
// with and without "function", arguments as an object and as a JSON string, several calls in one
// message) they render as transformers renders the same messages (the cases above); a glaive
// conversation in the OpenAI form renders exactly as its function_call form, as transformers
// renders both (the fixture asserts that on its side) where the template makes that so.
TEST(FamilyTemplates, OpenAiToolCallsRenderAsTheirFunctionCallForm) {
  QLORA_REQUIRE_FIXTURE(refs, "templates/template_refs.json");
  const auto j = nlohmann::json::parse(std::ifstream(refs));
  ASSERT_TRUE(j.contains("pairs")) << "old template refs: rerun make_template_refs.py";
  std::map<std::string, std::vector<Record>> recs;
  for (const auto& [name, file] : kJinja) recs[name] = records_of(refs.parent_path() / (name + ".jsonl"));
  std::map<std::string, int> checked;
  for (const auto& c : j["pairs"]) {
    const std::string name = c["template"];
    const Record& glaive = recs.at(name).at(c["function_call"].get<size_t>());
    const Record& openai = recs.at(name).at(c["openai"].get<size_t>());
    ASSERT_EQ(glaive.turns.size(), openai.turns.size()) << name;
    int calls = 0;
    for (size_t k = 0; k < glaive.turns.size(); ++k) {
      EXPECT_EQ(glaive.turns[k].tool_calls.size(), openai.turns[k].tool_calls.size()) << name << " turn " << k;
      calls += int(openai.turns[k].tool_calls.size());
    }
    EXPECT_GE(calls, 1) << name;
    EXPECT_EQ(concat(render_family(openai, name, "<s>", "</s>"), false), concat(render_family(glaive, name, "<s>", "</s>"), false))
        << name << " #" << c["openai"];
    ++checked[name];
  }
  // 5 glaive conversations, arguments as an object and as a string (qwen2.5, llama3.1, llama3.2:
  // object only, they tojson a string argument into a quoted string): 45 pairs
  EXPECT_EQ(checked, (std::map<std::string, int>{{"llama3", 10}, {"llama3.1", 5}, {"llama3.2", 5}, {"qwen2.5", 5},
                                                 {"qwen3", 10}, {"smollm2", 10}}));
  // every OpenAI record: all calls of one message are one assistant turn
  int multi = 0;
  for (const auto& [name, rs] : recs)
    for (const Record& r : rs)
      for (const Turn& t : r.turns) multi += t.tool_calls.size() > 1;
  EXPECT_EQ(multi, 3 * 4 + 2);  // two-call messages: 3 in each of the smollm2 / qwen* / llama3 files, 2 in mistral's
                                // (none for llama3.1 / llama3.2: their jinja takes one call per message)
}

// The prompt `qlora generate --template` (data::chat_prompt) gives: transformers'
// apply_chat_template(add_generation_prompt=True) ids, per family and tokenizer fixture, with and
// without a system message (qwen3: enable_thinking=False).
TEST(FamilyTemplates, ChatPromptIsTheGenerationPromptOfTransformers) {
  QLORA_REQUIRE_FIXTURE(refs, "templates/template_refs.json");
  const auto j = nlohmann::json::parse(std::ifstream(refs));
  ASSERT_TRUE(j.contains("generation_prompts")) << "old template refs: rerun make_template_refs.py";
  std::map<std::string, int> checked;
  for (const auto& c : j["generation_prompts"]) {
    const std::string name = c["template"], tdir = c["tokenizer"];
    const Tokenizer tok = Tokenizer::from_pretrained((qlora::test::fixtures_dir() / "tokenizers" / tdir).string());
    const std::string sys = c["system"];
    const bool turn = c.value("system_turn", !sys.empty());  // "": an empty system turn (generate --system "")
    EXPECT_EQ(qlora::data::chat_prompt(tok, name, turn ? std::optional<std::string>(sys) : std::nullopt, c["user"]),
              c["ids"].get<TokenIds>())
        << name << " on " << tdir << ", system '" << sys << "'" << (turn ? " (a turn)" : "");
    ++checked[turn && sys.empty() ? "empty system turn " + name : name];
    // template_default_system (what `generate` logs as the system message rendered, issue: trial 8):
    // transformers' prompt without a system message equals ours with that text as the system message
    const std::string own = qlora::data::template_default_system(name);
    if (!turn && !own.empty()) {
      EXPECT_EQ(qlora::data::chat_prompt(tok, name, own, c["user"]), c["ids"].get<TokenIds>()) << name << " on " << tdir;
      ++checked["default system " + name];
    }
  }
  EXPECT_EQ(checked, (std::map<std::string, int>{{"llama3", 2}, {"llama3.1", 2}, {"llama3.2", 2}, {"mistral", 8}, {"qwen2.5", 2},
                                                 {"qwen3", 2}, {"smollm2", 2}, {"default system qwen2.5", 1},
                                                 {"default system smollm2", 1}, {"empty system turn llama3", 1},
                                                 {"empty system turn llama3.1", 1}, {"empty system turn llama3.2", 1},
                                                 {"empty system turn mistral", 4}, {"empty system turn qwen2.5", 1},
                                                 {"empty system turn qwen3", 1}, {"empty system turn smollm2", 1}}));
  EXPECT_EQ(qlora::data::template_default_system("smollm2"), "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  for (const std::string& name : template_names()) {
    if (name != "smollm2" && name != "qwen2.5") {
      EXPECT_EQ(qlora::data::template_default_system(name), "") << name;
    }
  }
}

// qlora-cpp's own templates and raw text on the Llama and byte-level tokenizer fixtures: ids as
// Axolotl tokenises the rendered prompt (transformers' tokenizer(text): BOS only where the
// tokenizer adds one), so chatml on SmolLM2 (bos <|im_start|>, eos <|im_end|>) writes each marker
// once, not <|im_start|><|im_start|> ... <|im_end|><|im_end|>.
TEST(BuiltinTemplates, BosAsTheTokenizerAddsItAndNoDoubledMarkers) {
  QLORA_REQUIRE_FIXTURE(refs, "templates/template_refs.json");
  // read as the records' files are read (key order and integers beyond 64 bits kept)
  const auto j = qlora::data::parse_json_as_python(read_text(refs));
  ASSERT_TRUE(j.contains("builtin")) << "old template refs: rerun make_template_refs.py";
  std::map<std::string, int> checked;
  for (const auto& c : j["builtin"]) {
    const std::string tdir = c["tokenizer"], name = c["template"];
    const Tokenizer tok = Tokenizer::from_pretrained((qlora::test::fixtures_dir() / "tokenizers" / tdir).string());
    Record r;
    if (name == "text") {
      r.is_text = true;
      r.text = c["text"];
    } else if (c.contains("record")) {  // an OpenAI tool_calls record, read as a file's
      r = record_from_json(qlora::data::py_json_dumps(c["record"]), "builtin.json", DataOptions{});
    } else {
      for (const auto& t : c["turns"]) r.turns.push_back({t["role"], t["content"]});
    }
    const Example ex = tokenize(render(r, name == "text" ? "chatml" : name, tok, true), tok, false);
    EXPECT_EQ(ex.input_ids, c["ids"].get<TokenIds>()) << name << " on " << tdir;
    for (size_t i = 1; i < ex.input_ids.size(); ++i)
      EXPECT_FALSE(ex.input_ids[i] == ex.input_ids[i - 1] && tok.is_special(ex.input_ids[i]))
          << name << " on " << tdir << ": " << tok.id_to_piece(ex.input_ids[i]) << " twice";
    ++checked[tdir];
  }
  EXPECT_EQ(checked, (std::map<std::string, int>{{"llama2_hf", 26}, {"llama3_bpe", 26}, {"qwen2_bpe", 26}, {"smollm2", 26}}));
}

// The masked view of `qlora tokenize --chat` / `data preview` on tokenizer.json dirs: without its
// [[ ]] markers it is transformers' tok.decode(ids) of the whole example. On the HF-saved Llama 2
// tokenizer (Metaspace, decoder Strip(" ", 1, 0)) decoding each run alone dropped the space after
// every boundary ("[/INST]]]Hello" for "[/INST] Hello"); the ids were right.
TEST(BuiltinTemplates, MaskedViewIsTransformersDecodeOfTheIds) {
  QLORA_REQUIRE_FIXTURE(refs, "templates/template_refs.json");
  const auto j = qlora::data::parse_json_as_python(read_text(refs));  // as the test above
  std::map<std::string, int> checked;
  int space_after_marker = 0;  // llama2_hf views with "]] " (a run starting with a space)
  for (const auto& c : j["builtin"]) {
    if (c["template"] == "text") continue;
    ASSERT_TRUE(c.contains("decoded")) << "old template refs: rerun make_template_refs.py";
    const std::string tdir = c["tokenizer"], name = c["template"];
    const Tokenizer tok = Tokenizer::from_pretrained((qlora::test::fixtures_dir() / "tokenizers" / tdir).string());
    Record r;
    if (c.contains("record")) {
      r = record_from_json(qlora::data::py_json_dumps(c["record"]), "builtin.json", DataOptions{});
    } else {
      for (const auto& t : c["turns"]) r.turns.push_back({t["role"], t["content"]});
    }
    const Example ex = tokenize(render(r, name, tok, true), tok, false);
    ASSERT_EQ(ex.input_ids, c["ids"].get<TokenIds>()) << name << " on " << tdir;
    const std::string view = render_masked(ex, tok);
    // The reference has no "[[" / "]]" (make_template_refs.py asserts it), so removing each marker
    // pair leaves exactly the text: a run of brackets keeps its parity.
    std::string text = view;
    for (const std::string mark : {"[[", "]]"})
      for (size_t at; (at = text.find(mark)) != std::string::npos;) text.erase(at, 2);
    EXPECT_EQ(text, c["decoded"].get<std::string>()) << name << " on " << tdir << ": " << view;
    if (tdir == "llama2_hf") space_after_marker += view.find("]] ") != std::string::npos;
    ++checked[tdir];
  }
  EXPECT_EQ(checked, (std::map<std::string, int>{{"llama2_hf", 24}, {"llama3_bpe", 24}, {"qwen2_bpe", 24}, {"smollm2", 24}}));
  EXPECT_GT(space_after_marker, 0);  // the case the per-run decode got wrong is among them
}

// `llama2` is Meta's Llama-2-chat jinja (tests/fixtures/chat_templates/llama2_chat.jinja) with one
// BOS: ids equal transformers' tokenizer(jinja rendered with bos_token "") on the HF-saved Llama 2
// tokenizer, for conversations with whitespace around system / user / assistant contents, which
// the jinja strips (content.strip()). Before, " Blue " gave "▁▁", "Blue", "▁▁" where Meta's gives "▁Blue".
TEST(BuiltinTemplates, Llama2IsMetasJinjaWithOneBos) {
  QLORA_REQUIRE_FIXTURE(refs, "templates/template_refs.json");
  QLORA_REQUIRE_FIXTURE(tdir, "tokenizers/llama2_hf");
  const auto j = nlohmann::json::parse(std::ifstream(refs));
  ASSERT_TRUE(j.contains("llama2_meta")) << "old template refs: rerun make_template_refs.py";
  const Tokenizer tok = Tokenizer::from_pretrained(tdir.string());
  int n = 0, exact = 0;
  for (const auto& c : j["llama2_meta"]) {
    Record r;
    for (const auto& t : c["turns"]) r.turns.push_back({t["role"], t["content"]});
    const auto segs = render(r, "llama2", tok, true);
    EXPECT_EQ(render_string(segs, tok), "<s>" + c["rendered_one_bos"].get<std::string>()) << c["turns"].dump();
    EXPECT_EQ(tokenize(segs, tok, false).input_ids, c["ids"].get<TokenIds>()) << c["turns"].dump();
    ++n;
    exact += c["exact"].get<bool>();
  }
  EXPECT_EQ(n, 14);
  EXPECT_EQ(exact, 11);
}

// A named template that is not the model's own family template is worth a warning (train, data
// preview): SmolLM2 with the default chatml. Nothing to say for the model's own template, or for a
// model without a known chat template.
TEST(BuiltinTemplates, MismatchNoteNamesTheModelsOwnTemplate) {
  QLORA_REQUIRE_FIXTURE(smol, "tokenizers/smollm2/tokenizer_config.json");
  QLORA_REQUIRE_FIXTURE(spm, "tokenizers/llama2_spm/tokenizer.model");
  EXPECT_EQ(template_mismatch_note("chatml", smol.parent_path().string()),
            "data.template is chatml, but the model's own chat template is smollm2's: the model was tuned on that "
            "format (data.template: auto, or smollm2, uses it)");
  EXPECT_EQ(template_mismatch_note("smollm2", smol.parent_path().string()), "");
  EXPECT_EQ(template_mismatch_note("alpaca", spm.parent_path().string()), "");
  EXPECT_EQ(template_mismatch_note("alpaca", "/nonexistent"), "");
  // data preview (given the model dir) starts with it; raw text is rendered without a template
  QLORA_REQUIRE_SHARED(alpaca, "data/alpaca_en_demo.json");
  QLORA_REQUIRE_SHARED(c4, "data/c4_demo.jsonl");
  const Tokenizer tok = Tokenizer::from_pretrained(smol.parent_path().string());
  DataOptions o;
  o.train = {{alpaca.string()}};
  o.template_name = "chatml";
  EXPECT_EQ(render_preview(o, tok, 0, nullptr, smol.parent_path().string())
                .rfind("warning: data.template is chatml, but the model's own chat template is smollm2's", 0), 0u);
  // (alpaca_en_demo's duplicate records are warned of: "warning: data: 14 records duplicate ...")
  EXPECT_EQ(render_preview(o, tok, 0).find("warning: data.template"), std::string::npos) << "no model dir, no note";
  o.train = {{c4.string()}};
  EXPECT_EQ(render_preview(o, tok, 0, nullptr, smol.parent_path().string()).find("warning:"), std::string::npos);
}

// template: auto finds each named template from the model's jinja text, in either file.
TEST(AutoTemplate, MatchesEachKnownJinjaAndRefusesOthers) {
  const fs::path src = qlora::test::source_dir() / "tests" / "fixtures" / "chat_templates";
  const fs::path d = qlora::test::fresh_temp_dir("auto_tmpl");
  for (const auto& [name, file] : kJinja) {
    const std::string text = read_text(src / file);
    ASSERT_FALSE(text.empty()) << file;
    fs::remove(d / "chat_template.jinja");
    std::ofstream(d / "tokenizer_config.json") << nlohmann::json{{"chat_template", text}}.dump();
    EXPECT_EQ(resolve_template("auto", d.string()), name) << file;
    std::ofstream(d / "chat_template.jinja") << text;
    EXPECT_EQ(resolve_template("auto", d.string()), name) << file;
  }
  EXPECT_EQ(resolve_template("chatml", "/nonexistent"), "chatml");  // a named template is kept
  std::ofstream(d / "chat_template.jinja") << "{{ messages }}";
  try {
    resolve_template("auto", d.string());
    FAIL() << "unknown template accepted";
  } catch (const qlora::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find((d / "chat_template.jinja").string()), std::string::npos) << m;
    EXPECT_NE(m.find("data.template: NAME"), std::string::npos) << m;
    EXPECT_NE(m.find("qwen2.5"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  fs::remove(d / "chat_template.jinja");
  std::ofstream(d / "tokenizer_config.json") << "{}";
  EXPECT_THROW(resolve_template("auto", d.string()), qlora::Error);
  qlora::remove_tree(d);
}

// Meta's Llama-2-chat jinja is not taken by `auto` (data.template: llama2 renders it with one BOS,
// docs/data.md) but named: the refusal says which template to set, and a run with another template
// on such a model is warned that the model was tuned on its own format (trial 24: "matches none").
TEST(AutoTemplate, NamesLlama2ChatWithoutTakingIt) {
  const fs::path d = qlora::test::fresh_temp_dir("auto_llama2");
  std::ofstream(d / "chat_template.jinja")
      << read_text(qlora::test::source_dir() / "tests/fixtures/chat_templates/llama2_chat.jinja");
  const std::string e = qlora::test::error_of([&] { resolve_template("auto", d.string()); });
  EXPECT_EQ(e, (d / "chat_template.jinja").string() +
                   ": chat template is Meta's Llama-2-chat template (llama2_chat.jinja); data.template: llama2 renders it "
                   "with one BOS per example where the jinja writes <s> before every [INST] (docs/data.md); "
                   "data.template: auto takes only exact matches: set data.template: llama2");
  EXPECT_EQ(template_mismatch_note("chatml", d.string()),
            "data.template is chatml, but the model's own chat template is Meta's Llama-2-chat template "
            "(llama2_chat.jinja); data.template: llama2 renders it with one BOS per example where the jinja writes <s> "
            "before every [INST] (docs/data.md): the model was tuned on that format");
  EXPECT_EQ(template_mismatch_note("llama2", d.string()), "");
  qlora::remove_tree(d);
}

// chatml's markers are single tokens in SmolLM2's and Qwen's vocabularies, text on Llama 2's: 7
// pieces each, as transformers' LlamaTokenizer splits them (['▁<', '|', 'im', '_', 'start', '|', '>'];
// Llama 3's header markers 9, 9 and 8). Training on them teaches text and generate never stops at
// <|im_end|>: warned (train, eval, data preview), not refused (trial 24: chatml, the default, on a
// Llama 2 model said nothing).
TEST(BuiltinTemplates, MarkersThatAreNotTokensAreWarned) {
  QLORA_REQUIRE_SHARED(l2, "tokenizers/llama2/tokenizer.model");
  QLORA_REQUIRE_FIXTURE(smol, "tokenizers/smollm2/tokenizer_config.json");
  const Tokenizer llama2(l2.string());
  const Tokenizer smollm2 = Tokenizer::from_pretrained(smol.parent_path().string());
  const std::string tail = "; the model learns them as text and generate does not stop at them. Use the model's own "
                           "format (data.template: auto, or llama2 / mistral / alpaca for a vocabulary without them)";
  EXPECT_EQ(template_tokens_note("chatml", llama2),
            "data.template chatml writes markers that are not tokens of this tokenizer: <|im_start|> (7 pieces), "
            "<|im_end|> (7 pieces)" + tail);
  EXPECT_EQ(template_tokens_note("llama3.1", llama2),
            "data.template llama3.1 writes markers that are not tokens of this tokenizer: <|start_header_id|> (9 pieces), "
            "<|end_header_id|> (9 pieces), <|eot_id|> (8 pieces)" + tail);
  for (const char* ok : {"llama2", "alpaca", "vicuna", "mistral", "none"}) EXPECT_EQ(template_tokens_note(ok, llama2), "") << ok;
  EXPECT_EQ(template_tokens_note("chatml", smollm2), "");
  EXPECT_EQ(template_tokens_note("smollm2", smollm2), "");
  // data preview: the warning first, without a model dir too (it is about the tokenizer)
  QLORA_REQUIRE_SHARED(alpaca, "data/alpaca_en_demo.json");
  DataOptions o;
  o.train = {{alpaca.string()}};
  o.template_name = "chatml";
  EXPECT_EQ(render_preview(o, llama2, 0).rfind("warning: data.template chatml writes markers that are not tokens", 0), 0u);
  EXPECT_EQ(template_warnings("chatml", smol.parent_path().string(), llama2, true).size(), 2u);  // mismatch, then markers
  EXPECT_EQ(template_warnings("smollm2", smol.parent_path().string(), smollm2, true).size(), 0u);
  // data.add_eos: false under a family template: said, because it renders the same ids (trial 26)
  const std::vector<std::string> eos_off = template_warnings("smollm2", smol.parent_path().string(), smollm2, false);
  ASSERT_EQ(eos_off.size(), 1u);
  EXPECT_EQ(eos_off[0], "data.add_eos: false does not change conversations under template smollm2: its format closes "
                        "every assistant turn with its own end-of-turn token, which is trained (as apply_chat_template "
                        "writes it); it applies to raw-text files only");
  for (const char* generic : {"chatml", "llama2", "alpaca", "vicuna", "none"}) EXPECT_EQ(add_eos_note(generic, false), "") << generic;
  Record r;
  r.turns = {{"user", "Hi"}, {"assistant", "Hello."}};
  for (const char* family : {"smollm2", "mistral"}) {
    const Tokenizer& t = std::string(family) == "mistral" ? llama2 : smollm2;
    const Example on = tokenize(render(r, family, t, true), t, false), off = tokenize(render(r, family, t, false), t, false);
    EXPECT_EQ(on.input_ids, off.input_ids) << family;
    EXPECT_EQ(on.labels, off.labels) << family;
    EXPECT_NE(add_eos_note(family, false), "") << family;
  }
  const Example on = tokenize(render(r, "alpaca", smollm2, true), smollm2, false),
                off = tokenize(render(r, "alpaca", smollm2, false), smollm2, false);
  EXPECT_EQ(on.input_ids.size(), off.input_ids.size() + 1) << "a generic template's EOS is add_eos's";
}

// Edited copies of each family jinja (make_template_refs.py's auto_variants): `auto` accepts exactly
// those that transformers renders as the family's jinja over the family's conversations. Before,
// whitespace was dropped everywhere, inside string literals too, so a fine-tune's Llama 3 jinja
// without the blank line after each header resolved to llama3 and trained on text the model never
// saw (trial 22).
TEST(AutoTemplate, AcceptsExactlyTheEditsThatRenderAsTheFamily) {
  QLORA_REQUIRE_FIXTURE(refs, "templates/template_refs.json");
  const auto j = nlohmann::json::parse(std::ifstream(refs));
  ASSERT_TRUE(j.contains("auto_variants")) << "old template refs: rerun make_template_refs.py";
  const fs::path d = qlora::test::fresh_temp_dir("auto_variants");
  int same = 0, other = 0;
  for (const auto& v : j["auto_variants"]) {
    const std::string family = v["family"], edit = v["edit"];
    std::ofstream(d / "chat_template.jinja", std::ios::binary) << v["jinja"].get<std::string>();
    if (v["renders_as_family"].get<bool>()) {
      EXPECT_EQ(resolve_template("auto", d.string()), family) << family << ": " << edit;
      ++same;
    } else {
      EXPECT_THROW(resolve_template("auto", d.string()), qlora::Error) << family << ": " << edit;
      ++other;
    }
  }
  EXPECT_GE(same, 20);   // 29 when written
  EXPECT_GE(other, 15);  // 18
  qlora::remove_tree(d);
}

// data.skip_invalid skips (and counts) a record the template refuses as it does one the reader
// refuses: mistral's jinja raises on user turns in a row (trial 26: the glaive demo could not be
// used with mistral at all, the first refused record ended the run).
TEST(FamilyTemplates, SkipInvalidSkipsRecordsTheTemplateRefuses) {
  QLORA_REQUIRE_FIXTURE(mistral, "tokenizers/mistral_hf/tokenizer.json");
  const Tokenizer tok = Tokenizer::from_pretrained(mistral.parent_path().string());
  const fs::path d = qlora::test::fresh_temp_dir("skip_refused");
  const fs::path f = d / "chats.jsonl";
  std::ofstream(f) << R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})" "\n"
                   << R"({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}, {"role": "assistant", "content": "c"}]})" "\n"
                   << R"({"messages": [{"role": "user", "content": "d"}, {"role": "assistant", "content": "e"}]})" "\n";
  DataOptions o;
  o.train = {{f.string()}};
  o.template_name = "mistral";
  const std::string refused = f.string() + ":2: template mistral: After the optional system message, conversation "
                                           "roles must alternate";
  EXPECT_EQ(qlora::test::error_of([&] { load_datasets(o, tok); }).rfind(refused, 0), 0u);
  o.skip_invalid = true;
  const Datasets ds = load_datasets(o, tok);
  EXPECT_EQ(ds.train.size(), 2u);
  EXPECT_EQ(ds.stats.read.records_read, 3);
  EXPECT_EQ(ds.stats.read.skipped_invalid, 1);
  EXPECT_EQ(ds.stats.read.skip_reasons, (std::map<std::string, int64_t>{{"template mistral refuses it", 1}}));
  ASSERT_EQ(ds.stats.read.skip_examples.size(), 1u);
  EXPECT_EQ(ds.stats.read.skip_examples[0].rfind(refused, 0), 0u) << ds.stats.read.skip_examples[0];
  // a system message is not rendered by mistral in a conversation ending with an answer: said
  std::ofstream(f, std::ios::app)
      << R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "f"}, {"role": "assistant", "content": "g"}]})" "\n";
  const Datasets sys = load_datasets(o, tok);
  EXPECT_EQ(render_string(render(records_of(f)[3], "mistral", tok, true), tok).find("Be brief."), std::string::npos);
  const std::vector<std::string> notes = file_notes(sys.stats, "mistral");
  EXPECT_NE(std::find(notes.begin(), notes.end(),
                      "1 record has a system message that template mistral does not render: Mistral v0.3's chat "
                      "template writes it only into a conversation's last message when that is a user message, never "
                      "into one that ends with an answer (as transformers' apply_chat_template does); put it into the "
                      "first user message, or use a template that renders it"),
            notes.end());
  // a template name that is wrong is no record's fault: still an error, skip_invalid or not
  o.template_name = "mistrall";
  EXPECT_NE(qlora::test::error_of([&] { load_datasets(o, tok); }), "");
  qlora::remove_tree(d);
}

TEST(FamilyTemplates, MistralRefusesWhatItsJinjaRefuses) {
  Record r;
  r.file = "chats.jsonl";
  r.line = 7;
  r.turns = {{"user", "a"}, {"user", "b"}, {"assistant", "c"}};
  try {
    render_family(r, "mistral", "<s>", "</s>");
    FAIL();
  } catch (const qlora::Error& e) {
    EXPECT_NE(std::string(e.what()).find("chats.jsonl:7: template mistral: After the optional system message, "
                                         "conversation roles must alternate"),
              std::string::npos)
        << e.what();
  }
  auto error = [&](const std::string& tpl) { return render_error(r, tpl, "<s>", "</s>"); };
  // tool results and calls need 9-character ids (the jinja's raise_exception)
  r.turns = {{"user", "a"}, {"tool", "{}"}, {"assistant", "c"}};
  EXPECT_EQ(error("mistral").rfind("chats.jsonl:7: template mistral: turn 1: Tool call IDs should be alphanumeric strings "
                                   "with length 9! (the jinja's error; tool_call_id is '')", 0), 0u) << error("mistral");
  r.turns[1].tool_call_id = "abcdefghi";
  EXPECT_EQ(error("mistral"), "");
  Turn call{"assistant", ""};
  call.tool_calls = {ToolCall{"f", R"({"x":1})", false, "12345678"}};
  r.turns = {{"user", "a"}, call};
  EXPECT_NE(error("mistral").find("turn 1: Tool call IDs should be alphanumeric strings with length 9! (the jinja's "
                                  "error; the call's id is '12345678')"), std::string::npos) << error("mistral");
  r.turns[1].tool_calls[0].id = "12345678é";  // 9 characters, 10 bytes: |length counts characters
  EXPECT_EQ(error("mistral"), "");
  // the jinja renders only [TOOL_CALLS] for a message with calls: its content would be lost
  r.turns[1].content = "Let me look.";
  EXPECT_NE(error("mistral").find("turn 1: a message with tool_calls renders as [TOOL_CALLS] only"), std::string::npos);
  EXPECT_EQ(error("qwen2.5"), "");
  // [AVAILABLE_TOOLS] reads OpenAI-form tools ({"type": "function", "function": {...}}), not glaive's
  r.turns[1].content.clear();
  r.tools = R"([{"name": "f", "parameters": {}}])";
  EXPECT_NE(error("mistral").find("chats.jsonl:7: template mistral: tools[0]: the jinja reads each tool in the OpenAI form"),
            std::string::npos)
      << error("mistral");
}

// Llama 3.1 / 3.2: the jinja raises on a message with two calls and writes only the call of a
// message with content beside it (the content would be lost): both are one-line errors; tools
// without a message to carry them are the jinja's own error.
TEST(FamilyTemplates, Llama31RefusesWhatItsJinjaRefusesOrDrops) {
  Record r;
  r.file = "calls.jsonl";
  r.line = 3;
  Turn call{"assistant", ""};
  call.tool_calls = {ToolCall{"f", R"({"x":1})", false, ""}, ToolCall{"g", "{}", false, ""}};
  r.turns = {{"user", "a"}, call};
  auto error = [&](const std::string& tpl) { return render_error(r, tpl, "<|begin_of_text|>", "<|eot_id|>"); };
  for (const std::string tpl : {"llama3.1", "llama3.2"}) {
    r.turns[1].tool_calls.resize(2);
    r.turns[1].content.clear();
    EXPECT_EQ(error(tpl), "calls.jsonl:3: template " + tpl + ": This model only supports single tool-calls at once!");
    r.turns[1].tool_calls.resize(1);
    EXPECT_EQ(error(tpl), "");
    r.turns[1].content = "Let me look.";
    EXPECT_NE(error(tpl).find("calls.jsonl:3: template " + tpl + ": an assistant message with both content and tool_calls"),
              std::string::npos)
        << error(tpl);
    r.turns[1].content.clear();
    r.tools = R"([{"name": "f"}])";
    Record only_system = r;
    only_system.turns = {{"system", "s"}};
    const std::string e = render_error(only_system, tpl, "<|begin_of_text|>", "<|eot_id|>");
    EXPECT_NE(e.find("Cannot put tools in the first user message"), std::string::npos) << tpl << ": " << e;
    r.tools.clear();
  }
  EXPECT_EQ(error("qwen2.5"), "");  // qwen2.5 writes content and calls
}

TEST(JinjaHelpers, TrimIsPythonStripAndTojsonIsJsonDumps) {
  EXPECT_EQ(py_strip(" \t\n x y \r\n"), "x y");
  EXPECT_EQ(py_strip("\u3000\u00a0\u2028x\u2009"), "x");
  EXPECT_EQ(py_strip("\u200bx"), "\u200bx");  // zero-width space is not whitespace in Python
  EXPECT_EQ(py_strip("   "), "");
  EXPECT_EQ(py_tojson(R"({"b": [1, 2.5, "é\n\u0001"], "a": {}, "c": null, "d": true})"),
            "{\"b\": [1, 2.5, \"é\\n\\u0001\"], \"a\": {}, \"c\": null, \"d\": true}");
  // floats as Python's repr writes them (the expected text is Python 3.11's json.dumps of this
  // list; a trial found 1e15 written as 1e+15 and 1234567890123456.7 as 1.2345678901234567e+15)
  EXPECT_EQ(py_tojson("[1e15, 1234567890123456.7, 1e16, 1e-4, 1e-5, 0.1, -0.0, 0.0, 2.5, 1e22, 123456789.125, "
                      "5e-324, 1.7976931348623157e308, 100.0, 1e-7, 0.30000000000000004, 12345678901234567890.0]"),
            "[1000000000000000.0, 1234567890123456.8, 1e+16, 0.0001, 1e-05, 0.1, -0.0, 0.0, 2.5, 1e+22, "
            "123456789.125, 5e-324, 1.7976931348623157e+308, 100.0, 1e-07, 0.30000000000000004, "
            "1.2345678901234567e+19]");
  // integers of any size as Python's int keeps them (a trial: beyond 64 bits they were read as
  // floats, 1.2345678901234568e+29); the edges of int64 / uint64 either side
  EXPECT_EQ(py_tojson("{\"n\": 123456789012345678901234567890, \"m\": [-98765432109876543210, 18446744073709551615, "
                      "18446744073709551616, -9223372036854775808, -9223372036854775809, 12345678901234567890.0]}"),
            "{\"n\": 123456789012345678901234567890, \"m\": [-98765432109876543210, 18446744073709551615, "
            "18446744073709551616, -9223372036854775808, -9223372036854775809, 1.2345678901234567e+19]}");
}

// Which templates render a record's `tools` (function schemas) is template_renders_tools(), and the
// renderers agree with it: an OpenAI-form record's schema description is in the rendered text
// exactly for qwen2.5, qwen3, llama3.1, llama3.2, mistral (their models' jinjas under transformers'
// apply_chat_template(tools=...), the parity cases above; SmolLM2's and Llama 3's jinjas ignore
// `tools`, the generic templates have no place for them).
TEST(ToolsNotRendered, TheRenderersAgreeWithTemplateRendersTools) {
  QLORA_REQUIRE_FIXTURE(smol, "tokenizers/smollm2/tokenizer_config.json");
  const Tokenizer tok = Tokenizer::from_pretrained(smol.parent_path().string());
  const Record r = record_from_json(
      R"({"messages": [{"role": "user", "content": "Weather in Paris?"},
          {"role": "assistant", "tool_calls": [{"id": "abcdefghi", "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
          {"role": "tool", "tool_call_id": "abcdefghi", "content": "sunny"},
          {"role": "assistant", "content": "Sunny."}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Zqx weather of a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]})",
      "tools.json", DataOptions{});
  std::vector<std::string> rendering;
  for (const std::string& name : template_names()) {
    std::string text;
    for (const Segment& s : is_family_template(name) ? render_family(r, name, "<s>", "</s>") : render(r, name, tok, true))
      text += s.text;
    EXPECT_EQ(text.find("Zqx weather of a city") != std::string::npos, template_renders_tools(name)) << name << ":\n" << text;
    if (template_renders_tools(name)) rendering.push_back(name);
  }
  EXPECT_EQ(rendering, (std::vector<std::string>{"qwen2.5", "qwen3", "llama3.1", "llama3.2", "mistral"}));
}

// The glaive demo's 300 records all carry tools: with smollm2 (or chatml) they are counted and
// warned about, per file, with the templates that would render them; none with qwen2.5.
TEST(ToolsNotRendered, CountedAndNotedPerFile) {
  QLORA_REQUIRE_FIXTURE(smol, "tokenizers/smollm2/tokenizer_config.json");
  QLORA_REQUIRE_FIXTURE(qwen, "tokenizers/qwen2_bpe/tokenizer_config.json");
  QLORA_REQUIRE_SHARED(glaive, "data/glaive_toolcall_en_demo.json");
  QLORA_REQUIRE_SHARED(alpaca, "data/alpaca_en_demo.json");
  const Tokenizer st = Tokenizer::from_pretrained(smol.parent_path().string());
  DataOptions o;
  o.train = {{glaive.string()}, {alpaca.string()}};
  o.template_name = "smollm2";
  o.sequence_len = 4096;
  const Datasets d = load_datasets(o, st);
  ASSERT_EQ(d.train_sources.size(), 2u);
  EXPECT_EQ(d.train_sources[0].stats.tools_not_rendered, 300);
  EXPECT_EQ(d.train_sources[1].stats.tools_not_rendered, 0);
  EXPECT_EQ(d.stats.tools_not_rendered, 300);
  EXPECT_EQ(tools_note(d.train_sources[0].stats, "smollm2"),
            "300 records carry tools that template smollm2 does not render (its chat template ignores them, as "
            "transformers' apply_chat_template does); use a template that renders tools (qwen2.5, qwen3, llama3.1, "
            "llama3.2, mistral) or put the schemas in the system message");
  EXPECT_EQ(tools_note(d.train_sources[1].stats, "smollm2"), "");
  // train and eval log a file's notes through file_notes, in this order: the glaive file has one
  // record over 4096 tokens besides its tools.
  EXPECT_EQ(file_notes(d.train_sources[0].stats, "smollm2"),
            (std::vector<std::string>{unused_records_note(d.train_sources[0].stats),
                                      tools_note(d.train_sources[0].stats, "smollm2")}));
  EXPECT_EQ(d.train_sources[0].stats.dropped_too_long, 1);
  EXPECT_EQ(file_notes(d.train_sources[1].stats, "smollm2"), std::vector<std::string>{});
  const std::string preview = render_preview(o, st, 0);
  EXPECT_NE(preview.find("warning: data: " + glaive.string() + ": 300 records carry tools that template smollm2"),
            std::string::npos) << preview;
  EXPECT_EQ(preview.find("warning: data: " + alpaca.string()), std::string::npos) << preview;

  o.train = {{glaive.string()}};
  o.template_name = "chatml";
  const DataStats chatml = load_datasets(o, st).stats;
  EXPECT_EQ(tools_note(chatml, "chatml"),
            "300 records carry tools that template chatml does not render (it has no place for them); use a template "
            "that renders tools (qwen2.5, qwen3, llama3.1, llama3.2, mistral) or put the schemas in the system message");

  o.template_name = "qwen2.5";
  const Datasets q = load_datasets(o, Tokenizer::from_pretrained(qwen.parent_path().string()));
  EXPECT_EQ(q.stats.tools_not_rendered, 0);
  EXPECT_EQ(tools_note(q.stats, "qwen2.5"), "");
}

// reasoning_content: qwen3 renders it (the parity cases above, records 92..98 of qwen3.jsonl);
// every other template leaves it out of the rendering, as each one's jinja does, and
// template_renders_reasoning says so (the list the per-file warning uses).
TEST(ReasoningNotRendered, TheRenderersAgreeWithTemplateRendersReasoning) {
  QLORA_REQUIRE_FIXTURE(smol, "tokenizers/smollm2/tokenizer_config.json");
  const Tokenizer tok = Tokenizer::from_pretrained(smol.parent_path().string());
  const Record r = record_from_json(
      R"({"messages": [{"role": "user", "content": "2+2?"},
          {"role": "assistant", "reasoning_content": "Zqx simple sum", "content": "4"}]})",
      "think.json", DataOptions{});
  ASSERT_TRUE(r.turns[1].has_reasoning);
  std::vector<std::string> rendering;
  for (const std::string& name : template_names()) {
    std::string text;
    for (const Segment& s : is_family_template(name) ? render_family(r, name, "<s>", "</s>") : render(r, name, tok, true))
      text += s.text;
    EXPECT_EQ(text.find("Zqx simple sum") != std::string::npos, template_renders_reasoning(name)) << name << ":\n" << text;
    if (template_renders_reasoning(name)) rendering.push_back(name);
  }
  EXPECT_EQ(rendering, std::vector<std::string>{"qwen3"});
  // the trial's record: transformers 5 renders the field in a think block, and it is trained
  const auto segs = render_family(r, "qwen3", "", "<|im_end|>");
  EXPECT_EQ(concat(segs, false),
            "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<think>\nZqx simple sum\n</think>\n\n4<|im_end|>\n");
  EXPECT_EQ(concat(segs, true), "<think>\nZqx simple sum\n</think>\n\n4<|im_end|>");
}

// A record carrying reasoning_content that the template does not render is counted and warned
// about per file (file_notes, data preview), as tools are; none with qwen3, none for "".
TEST(ReasoningNotRendered, CountedAndNotedPerFile) {
  QLORA_REQUIRE_FIXTURE(smol, "tokenizers/smollm2/tokenizer_config.json");
  QLORA_REQUIRE_FIXTURE(qwen, "tokenizers/qwen2_bpe/tokenizer_config.json");
  const qlora::test::TempDir tmp("reasoning");
  const fs::path p = tmp.path / "think.jsonl";
  std::ofstream(p) << R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "reasoning_content": "r", "content": "b"}]})" "\n"
                   << R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})" "\n"
                   << R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "reasoning_content": "", "content": "b"}]})" "\n"
                   << R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "reasoning_content": "r1", "content": "b"},)"
                   << R"( {"role": "user", "content": "c"}, {"role": "assistant", "reasoning_content": "r2", "content": "d"}]})" "\n";
  const Tokenizer st = Tokenizer::from_pretrained(smol.parent_path().string());
  DataOptions o;
  o.train = {{p.string()}};
  o.template_name = "smollm2";
  const Datasets d = load_datasets(o, st);
  EXPECT_EQ(d.stats.reasoning_not_rendered, 2);
  EXPECT_EQ(d.train_sources[0].stats.reasoning_not_rendered, 2);
  const std::string note =
      "2 records carry reasoning_content on an assistant message that template smollm2 does not render (its chat "
      "template ignores the field, as transformers' apply_chat_template does): the thinking is not trained; use qwen3 "
      "(the one template that renders it), or write it into the content";
  EXPECT_EQ(reasoning_note(d.train_sources[0].stats, "smollm2"), note);
  EXPECT_EQ(file_notes(d.train_sources[0].stats, "smollm2"), std::vector<std::string>{note});
  const std::string preview = render_preview(o, st, 0);
  EXPECT_NE(preview.find("warning: data: " + p.string() + ": " + note), std::string::npos) << preview;
  o.template_name = "chatml";
  EXPECT_EQ(reasoning_note(load_datasets(o, st).stats, "chatml"),
            "2 records carry reasoning_content on an assistant message that template chatml does not render (it has no "
            "place for it): the thinking is not trained; use qwen3 (the one template that renders it), or write it into "
            "the content");
  o.template_name = "qwen3";
  const Datasets q = load_datasets(o, Tokenizer::from_pretrained(qwen.parent_path().string()));
  EXPECT_EQ(q.stats.reasoning_not_rendered, 0);
  EXPECT_EQ(file_notes(q.train_sources[0].stats, "qwen3"), std::vector<std::string>{});
}
