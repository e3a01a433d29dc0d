// `qlora tokenize` on the SmolLM2 tokenizer fixture (ids against transformers), and generation
// stopping at a non-first id of generation_config.json's eos_token_id list.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/files.h"
#include "common/safetensors.h"
#include "common/tensor_io.h"
#include "test_util.h"

namespace {
namespace fs = std::filesystem;
using nlohmann::json;

qlora::test::CommandResult run(const std::string& args) {
  return qlora::test::run_command(::qlora::test::qlora_bin() + " " + args);
}

std::string q(const std::string& s) {  // single-quoted for /bin/sh
  std::string o = "'";
  for (char c : s) o += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return o + "'";
}

void expect_one_line_error(const qlora::test::CommandResult& r, const std::string& fragment) {
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_EQ(r.out.rfind("error: ", 0), 0u) << r.out;
  EXPECT_NE(r.out.find(fragment), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
}

std::vector<int64_t> parse_ids(const std::string& out) {
  std::istringstream is(out);
  std::vector<int64_t> v;
  int64_t x;
  while (is >> x) v.push_back(x);
  return v;
}

// The ids on the output's last line (the log lines come before it).
std::vector<int64_t> last_line_ids(std::string out) {
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return parse_ids(out.substr(out.rfind('\n') == std::string::npos ? 0 : out.rfind('\n') + 1));
}

}  // namespace

TEST(TokenizeCli, SmolLM2IdsPiecesAndChatLabelsMatchTransformers) {
  QLORA_REQUIRE_FIXTURE(tdir, "tokenizers/smollm2");
  QLORA_REQUIRE_FIXTURE(refs_path, "templates/tokenize_refs.json");
  const json refs = json::parse(std::ifstream(refs_path));
  const fs::path tmp = qlora::test::fresh_temp_dir("tokenize_cli");
  int checked = 0;
  for (const auto& t : refs["texts"]) {
    const std::string text = t["text"];
    auto r = run("tokenize " + tdir.string() + " --json --text " + q(text));
    ASSERT_EQ(r.status, 0) << r.out;
    json j = json::parse(r.out);
    EXPECT_EQ(j["ids"], t["ids"]) << text;
    EXPECT_EQ(j["pieces"], t["pieces"]) << text;
    r = run("tokenize " + tdir.string() + " --json --no-special --text " + q(text));
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_EQ(json::parse(r.out)["ids"], t["ids_no_special"]) << text;
    std::ofstream(tmp / "in.txt", std::ios::binary) << text;
    r = run("tokenize " + tdir.string() + " --json --file " + (tmp / "in.txt").string());
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_EQ(json::parse(r.out)["ids"], t["ids"]) << text;
    ++checked;
  }
  EXPECT_EQ(checked, 5);
  // one conversation, rendered and labelled as training does
  const fs::path chat = refs_path.parent_path() / refs["chat"]["file"].get<std::string>();
  auto r = run("tokenize " + tdir.string() + " --json --chat " + chat.string() + " --template smollm2");
  ASSERT_EQ(r.status, 0) << r.out;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["ids"], refs["chat"]["ids"]);
  EXPECT_EQ(j["trained"], refs["chat"]["trained"]);
  r = run("tokenize " + tdir.string() + " --chat " + chat.string() + " --template smollm2");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("[[<|im_start|>system"), std::string::npos) << r.out;  // the masked view
  EXPECT_NE(r.out.find("Madrid, since 1561.<|im_end|>[["), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("trained  \"Paris\""), std::string::npos) << r.out;
  // auto: the template found in the model dir is named
  r = run("tokenize " + tdir.string() + " --json --chat " + chat.string() + " --template auto");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(json::parse(r.out)["template"], "smollm2");
  EXPECT_EQ(json::parse(r.out)["ids"], refs["chat"]["ids"]);
  // bad input: one line naming the file / template, exit 1
  std::ofstream(tmp / "bad.json") << "{\"messages\": [{\"role\": \"user\", \"content\": 3}]}";
  expect_one_line_error(run("tokenize " + tdir.string() + " --chat " + (tmp / "bad.json").string() + " --template smollm2"),
                        (tmp / "bad.json").string() + ":1: messages[0].content must be a string");
  std::ofstream(tmp / "trunc.json") << "{\"messages\": [";
  expect_one_line_error(run("tokenize " + tdir.string() + " --chat " + (tmp / "trunc.json").string() + " --template smollm2"),
                        (tmp / "trunc.json").string() + ":1: invalid JSON");
  // a data file (JSONL, a JSON array) is not one record: its count, and the command for a data file
  // (issue: "FILE:2: invalid JSON: syntax error ... unexpected '{'")
  const std::string rec = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, "
                          "{\"role\": \"assistant\", \"content\": \"hello\"}]}";
  std::ofstream(tmp / "data.jsonl") << rec << "\n" << rec << "\n\n" << rec << "\n";
  std::ofstream(tmp / "data.json") << "[" << rec << ",\n" << rec << "]\n";
  std::ofstream(tmp / "one.json") << "[" << rec << "]";
  for (const auto& [file, what] : std::vector<std::pair<std::string, std::string>>{
           {"data.jsonl", "3 records (JSONL lines)"}, {"data.json", "2 records (a JSON array)"},
           {"one.json", "1 record (a JSON array)"}}) {
    const std::string path = (tmp / file).string();
    expect_one_line_error(run("tokenize " + tdir.string() + " --chat " + path + " --template smollm2"),
                          "error: " + path + " holds " + what + "; --chat takes one record (a JSON object): use "
                          "`qlora data preview CONFIG.yaml --set data.train=" + path + "` for a data file");
  }
  std::ofstream(tmp / "single.jsonl") << rec << "\n";  // one JSONL line is one record
  EXPECT_EQ(run("tokenize " + tdir.string() + " --chat " + (tmp / "single.jsonl").string() + " --template smollm2").status, 0);
  expect_one_line_error(run("tokenize " + tdir.string() + " --chat " + chat.string() + " --template nosuch"), "'nosuch'");
  // another family's template: its markers are not tokens of SmolLM2's tokenizer
  expect_one_line_error(run("tokenize " + tdir.string() + " --chat " + chat.string() + " --template llama3"),
                        "data.template: llama3 writes <|start_header_id|> as one token, but the tokenizer ");
  expect_one_line_error(run("tokenize " + tdir.string() + " --chat " + (tmp / "missing.json").string() + " --template smollm2"),
                        (tmp / "missing.json").string());
  // --file / --text must be UTF-8 (sentencepiece and `tokenizers` would see U+FFFD where we would
  // give byte tokens; a trial): the file and line, or --text, and the byte offset; UTF-16 as data
  // files say it
  std::ofstream(tmp / "bad.txt") << "ok\nb\xff";
  expect_one_line_error(run("tokenize " + tdir.string() + " --file " + (tmp / "bad.txt").string()),
                        (tmp / "bad.txt").string() + ":2: invalid UTF-8 at byte offset 4 (byte 0xFF)");
  std::ofstream(tmp / "utf16.txt") << std::string("\xff\xfeh\0i\0", 6);
  expect_one_line_error(run("tokenize " + tdir.string() + " --file " + (tmp / "utf16.txt").string()),
                        (tmp / "utf16.txt").string() + ": the file is UTF-16LE (byte-order mark FF FE at byte offset 0)");
  expect_one_line_error(run("tokenize " + tdir.string() + " --text \"$(printf 'a\\377b')\""),
                        "tokenize: --text: invalid UTF-8 at byte offset 1");
  // generate's text flags too, before anything loads (it decoded them with U+FFFD before, trial 21)
  for (const std::string flag : {"--prompt", "--system"})
    expect_one_line_error(run("generate " + tdir.string() + " --template smollm2 " +
                              (flag == "--prompt" ? "" : "--prompt hi ") + flag + " \"$(printf 'ab\377')\""),
                          "generate: " + flag + ": invalid UTF-8 at byte offset 2");
  expect_one_line_error(run("generate " + tdir.string() + " --template smollm2 --prompt hi --stop \"$(printf 'ab\377')\""),
                        "generate: --stop: invalid UTF-8 at byte offset 2");
  qlora::remove_tree(tmp);
}

// generation_config.json lists two eos ids; greedy generation stops at the second one.
// `--text ""` is the empty text, tokenised as transformers' tokenizer("") does: the post-processor's
// ids alone (the HF-saved Llama 2: [1] = BOS; SmolLM2: none), not "give exactly one of ...".
TEST(TokenizeCli, EmptyTextIsTokenizedAsTransformersDoes) {
  QLORA_REQUIRE_FIXTURE(refs_path, "templates/tokenize_refs.json");
  const json refs = json::parse(std::ifstream(refs_path));
  ASSERT_TRUE(refs.contains("empty_text")) << "old refs: rerun make_template_refs.py";
  for (const std::string d : {"llama2_hf", "smollm2"}) {
    QLORA_REQUIRE_FIXTURE(tdir, "tokenizers/" + d);
    auto r = run("tokenize " + tdir.string() + " --json --text ''");
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_EQ(json::parse(r.out)["ids"], refs["empty_text"][d]["ids"]) << d;
    r = run("tokenize " + tdir.string() + " --json --no-special --text ''");
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_EQ(json::parse(r.out)["ids"], refs["empty_text"][d]["ids_no_special"]) << d;
  }
  EXPECT_EQ(refs["empty_text"]["llama2_hf"]["ids"], json::array({1}));
}

TEST(Generate, StopsAtAnyEosIdOfGenerationConfig) {
  const fs::path d = qlora::test::fresh_temp_dir("gen_eos");
  {
    std::ofstream c(d / "corpus.txt");
    for (int i = 0; i < 300; ++i) c << "order " << i << " shipped to city " << i % 13 << " on day " << i % 7 << "\n";
  }
  auto r = run("init-model --preset tiny --out " + (d / "m").string() + " --train-tokenizer " + (d / "corpus.txt").string() +
               " --vocab-size 300 --seed 3");
  ASSERT_EQ(r.status, 0) << r.out;
  const std::string gen = "generate " + (d / "m").string() + " --prompt 'order 5 shipped' --max-new-tokens 12 --ids";
  std::ofstream(d / "m" / "generation_config.json") << R"({"bos_token_id": 1, "eos_token_id": 2})";
  r = run(gen);
  ASSERT_EQ(r.status, 0) << r.out;
  const std::vector<int64_t> full = last_line_ids(r.out);
  ASSERT_GE(full.size(), 3u) << r.out;
  // the first new id not seen before position k (k >= 1) and not EOS: listed second, it must end generation there
  size_t k = 1;
  while (k < full.size() && (full[k] == 2 || std::count(full.begin(), full.begin() + k, full[k]) > 0)) ++k;
  ASSERT_LT(k, full.size()) << r.out;
  std::ofstream(d / "m" / "generation_config.json") << R"({"bos_token_id": 1, "eos_token_id": [2, )" << full[k] << "]}";
  r = run(gen);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(last_line_ids(r.out), std::vector<int64_t>(full.begin(), full.begin() + k + 1)) << "stop id " << full[k];
  // --template: the prompt as a user message (ids: FamilyTemplates.ChatPromptIsTheGenerationPromptOfTransformers)
  r = run(gen + " --template alpaca --system 'Answer briefly.'");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_FALSE(last_line_ids(r.out).empty()) << r.out;
  r = run(gen + " --system 'Answer briefly.'");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("generate: --system needs --template NAME (or auto)"), std::string::npos) << r.out;
  r = run(gen + " --template llama3");  // another family's markers: not tokens of this tokenizer
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("data.template: llama3 writes"), std::string::npos) << r.out;
  // a tokenizer with more pieces than the model's vocab_size: refused as train and eval refuse it
  // (generate ran, and an id past the embedding ended in torch's "index out of range", trial 24)
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(d / "m" / "config.json"));
  cfg["vocab_size"] = 200;
  std::ofstream(d / "m" / "config.json") << cfg.dump(2);
  r = run(gen);
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_EQ(r.out, "error: model.tokenizer: the tokenizer has 300 pieces but the model's vocab_size is 200\n");
  qlora::remove_tree(d);
}

// `generate --quant nf4`: the base quantized on load as training does, so the CLI decodes as
// transformers + bitsandbytes (load_in_4bit, nf4, double quant, fp32 compute) does: greedy 12
// tokens of the real SmolLM2 in its chat template (make_real_model_refs.py greedy_nf4.safetensors),
// where the unquantized base (--quant none, the default) decodes otherwise.
TEST(Generate, QuantNf4DecodesAsTransformersBitsandbytes) {
  QLORA_REQUIRE_FIXTURE(root, "real/smollm2_135m");
  const qlora::st::SafetensorsFile ref((root.parent_path() / "greedy_nf4.safetensors").string());
  const torch::Tensor tt = qlora::load_tensor(ref, ref.info("tokens"));
  const std::vector<int64_t> want(tt.data_ptr<int64_t>(), tt.data_ptr<int64_t>() + tt.numel());
  ASSERT_EQ(want.size(), 12u);
  const std::string gen = "generate " + root.string() + " --template smollm2 --dtype fp32 --ids --max-new-tokens 12 "
                          "--prompt " + q("Triage this support ticket: my printer is jammed again, this is an emergency.");
  auto r = run(gen + " --quant nf4");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(last_line_ids(r.out), want) << r.out;
  r = run(gen);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(last_line_ids(r.out), want) << "the unquantized base decodes as the NF4 one: the check cannot fail";
  r = run(gen + " --quant int8");
  EXPECT_EQ(r.status, 2) << r.out;  // a usage error
}

// The system message really rendered is logged (issue: trial 8's log said data.default_system_message
// "" while SmolLM2's template rendered its own default), and an answer that is EOS at once (exit 0,
// an empty line) is warned of on stderr, with --system suggested when a chat template was used.
TEST(Generate, LogsTheSystemMessageRenderedAndWarnsOfAnEmptyAnswer) {
  QLORA_REQUIRE_FIXTURE(root, "real/smollm2_135m");
  const std::string smol = "generate " + root.string() + " --template smollm2 --dtype fp32 --max-new-tokens 1 --prompt hi";
  auto r = run(smol);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("generate: system message: the template's default \"You are a helpful AI assistant named "
                       "SmolLM, trained by Hugging Face\" (smollm2 writes it when a conversation has none; --system "
                       "TEXT replaces it)"), std::string::npos) << r.out;
  r = run(smol + " --system " + q("Be brief."));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("generate: system message: \"Be brief.\" from --system"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("non-thinking"), std::string::npos) << r.out;
  // --system '': an empty system turn, not the template's default (trial 21; the prompt's ids against
  // transformers: FamilyTemplates.ChatPromptIsTheGenerationPromptOfTransformers)
  r = run(smol + " --system ''");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("generate: system message: \"\" from --system (an empty system turn, as transformers renders "
                       "{\"role\": \"system\", \"content\": \"\"})"), std::string::npos) << r.out;
  // an unknown --template is named as the flag, before any line that would use it
  expect_one_line_error(run("generate " + root.string() + " --template nosuch --prompt hi"),
                        "generate: --template: unknown template 'nosuch' (alpaca|");
  // qwen3: the prompt is transformers' enable_thinking=False one, said (trial 22 compared with the default)
  r = run("generate " + root.string() + " --template qwen3 --dtype fp32 --max-new-tokens 1 --prompt hi");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("generate: prompt: qwen3's non-thinking generation prompt (transformers' apply_chat_template(..., "
                       "add_generation_prompt=True, enable_thinking=False)"), std::string::npos) << r.out;
  // --prompts: the line says which lines it is about (trial 13 read it as every line's)
  const fs::path pd = qlora::test::fresh_temp_dir("gen_prompts_system");
  std::ofstream(pd / "p.jsonl") << R"({"prompt": "hi"})" << "\n" << R"({"prompt": "hi", "system": "One word."})" << "\n"
                                << R"({"prompt": "yo"})" << "\n";
  r = run("generate " + root.string() + " --template smollm2 --dtype fp32 --max-new-tokens 1 --prompts " +
          (pd / "p.jsonl").string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("(smollm2 writes it when a conversation has none; --system TEXT replaces it) (for the 2 of 3 "
                       "lines without \"system\"; the other 1 render their own)"), std::string::npos) << r.out;
  // A tiny model whose generation_config.json lists the first id it would generate as an EOS id:
  // no text, finish_reason eos after 0 tokens.
  const fs::path d = qlora::test::fresh_temp_dir("gen_empty");
  {
    std::ofstream c(d / "corpus.txt");
    for (int i = 0; i < 300; ++i) c << "order " << i << " shipped to city " << i % 13 << " on day " << i % 7 << "\n";
  }
  r = run("init-model --preset tiny --out " + (d / "m").string() + " --train-tokenizer " + (d / "corpus.txt").string() +
          " --vocab-size 300 --seed 3");
  ASSERT_EQ(r.status, 0) << r.out;
  const std::string gen = "generate " + (d / "m").string() + " --prompt 'order 5 shipped' --max-new-tokens 4 --ids";
  for (const std::string tpl : {"", " --template chatml"}) {
    std::ofstream(d / "m" / "generation_config.json") << R"({"bos_token_id": 1, "eos_token_id": 2})";
    r = run(gen + tpl);
    ASSERT_EQ(r.status, 0) << r.out;
    const std::vector<int64_t> full = last_line_ids(r.out);
    ASSERT_FALSE(full.empty()) << r.out;
    EXPECT_EQ(r.out.find("no text"), std::string::npos) << r.out;
    std::ofstream(d / "m" / "generation_config.json") << R"({"bos_token_id": 1, "eos_token_id": [2, )" << full[0] << "]}";
    r = run(gen + tpl);
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_EQ(last_line_ids(r.out), std::vector<int64_t>{full[0]}) << r.out;
    const std::string warn = "generate: --prompt: no text: the model's first new token was EOS (id " +
                             std::to_string(full[0]) + "; finish_reason eos after 0 tokens)";
    EXPECT_NE(r.out.find(warn + (tpl.empty() ? "\n" : "; a model trained on records with their own system message may "
                                                       "need it: pass --system TEXT\n")), std::string::npos) << r.out;
    if (!tpl.empty()) EXPECT_NE(r.out.find("generate: system message: none (template chatml)"), std::string::npos) << r.out;
    else EXPECT_EQ(r.out.find("generate: system message"), std::string::npos) << r.out;
  }
  // --system given: the warning does not suggest it
  r = run(gen + " --template chatml --system " + q("Be brief."));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.find("pass --system"), std::string::npos) << r.out;
  // An adapter run says whether its records had system messages of their own (summary.json and
  // trainer_state.json data_system_records): 2 of 3 here gives the count, none gives no hint. The
  // runs take one step at learning rate 1e-30, so the adapter changes no greedy token.
  for (const bool with_system : {true, false}) {
    const fs::path data = d / "chats.jsonl", run_dir = d / (with_system ? "run_sys" : "run_plain");
    {
      std::ofstream f(data);
      for (int i = 0; i < 3; ++i)
        f << R"({"messages": [)" << (with_system && i < 2 ? R"({"role": "system", "content": "order desk"}, )" : "")
          << R"({"role": "user", "content": "order )" << i << R"("}, {"role": "assistant", "content": "shipped"}]})"
          << "\n";
    }
    std::ofstream(d / "run.yaml") << "output_dir: " << run_dir.string() << "\nmodel:\n  path: " << (d / "m").string()
                                  << "\n  dtype: fp32\nquantization:\n  method: none\nlora:\n  r: 4\n  alpha: 8\n"
                                  << "data:\n  train: " << data.string() << "\n  template: chatml\n  sequence_len: 512\n"
                                  << "training:\n  micro_batch_size: 1\n  gradient_accumulation_steps: 1\n  max_steps: 1\n"
                                  << "  learning_rate: 1.0e-30\n  warmup_steps: 0\n  eval_steps: 0\n"
                                  << "checkpoint:\n  save_steps: 1\n  save_minutes: 0\n";
    r = run("train " + q((d / "run.yaml").string()));
    ASSERT_EQ(r.status, 0) << r.out;
    const int64_t want = with_system ? 2 : 0;
    EXPECT_EQ(qlora::test::read_json(run_dir / "summary.json")["data_system_records"], want);
    EXPECT_EQ(qlora::test::read_json(run_dir / "checkpoints" / "checkpoint-1" / "trainer_state.json")["data_system_records"], want);
    for (const fs::path& adapter : {run_dir, run_dir / "checkpoints" / "checkpoint-1"}) {
      r = run(gen + " --adapter " + q(adapter.string()));
      ASSERT_EQ(r.status, 0) << r.out;
      ASSERT_NE(r.out.find("no text: the model's first new token was EOS"), std::string::npos) << r.out;
      if (with_system)
        EXPECT_NE(r.out.find("; the adapter's run trained on 2 records with a system message of their own: pass "
                             "--system TEXT (theirs)\n"), std::string::npos) << r.out;
      else
        EXPECT_EQ(r.out.find("pass --system"), std::string::npos) << r.out;
    }
  }
  // prompt + new tokens past max_position_embeddings: decoded, with transformers' kind of warning
  EXPECT_EQ(r.out.find("max_position_embeddings"), std::string::npos) << r.out;
  {
    json c = json::parse(std::ifstream(d / "m" / "config.json"));
    c["max_position_embeddings"] = 4;
    std::ofstream(d / "m" / "config.json") << c.dump(2);
  }
  r = run(gen);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find(" new ones pass the model's max_position_embeddings 4 (config.json); decoding goes on"),
            std::string::npos) << r.out;
  qlora::remove_tree(d);
}

// `generate --adapter RUN` (a run dir, or its checkpoint) decodes as the run trained: its
// data.template, data.default_system_message and quantization, exactly as the same settings given
// as flags to a plain PEFT copy of the adapter (before: a raw prompt on the unquantized base, an
// empty line for a chat adapter), and says where each came from. Flags win. A plain PEFT adapter
// dir (no config.resolved.yaml) decodes as before: raw prompt, no quantization, nothing logged.
TEST(Generate, AdapterRunBringsTemplateSystemMessageAndQuantization) {
  QLORA_REQUIRE_SHARED(data, "data/alpaca_en_demo.json");
  QLORA_REQUIRE_SHARED(tokenizer, "tokenizers/llama2/tokenizer.model");
  const qlora::test::TempDir d("gen_run");
  const fs::path model = d.path / "model", run_dir = d.path / "run", plain = d.path / "plain", cfg = d.path / "run.yaml";
  auto r = run("init-model --preset tiny --out " + model.string() + " --tokenizer " + tokenizer.string() + " --seed 0");
  ASSERT_EQ(r.status, 0) << r.out;
  std::ofstream(cfg) << "output_dir: " << run_dir.string() << "\nmodel:\n  path: " << model.string()
                     << "\n  dtype: fp32\nquantization:\n  method: nf4\nlora:\n  r: 4\n  alpha: 8\n"
                     << "data:\n  train: " << data.string() << "\n  template: chatml\n  sequence_len: 256\n"
                     << "  default_system_message: You are Quokka, made by Acme Labs.\n"
                     << "training:\n  micro_batch_size: 1\n  gradient_accumulation_steps: 1\n  max_steps: 2\n"
                     << "  learning_rate: 0.05\n  warmup_steps: 0\n  eval_steps: 0\n  gradient_checkpointing: false\n"
                     << "checkpoint:\n  save_steps: 1\n  save_minutes: 0\n";
  r = run("train " + q(cfg.string()));
  ASSERT_EQ(r.status, 0) << r.out;
  fs::create_directories(plain);
  for (const char* f : {"adapter_config.json", "adapter_model.safetensors"}) fs::copy_file(run_dir / f, plain / f);
  const std::string gen = "generate " + q(model.string()) + " --prompt " + q("Name a colour.") +
                          " --max-new-tokens 6 --ids --adapter ";
  const std::string as_flags =
      " --template chatml --system " + q("You are Quokka, made by Acme Labs.") + " --quant nf4";
  r = run(gen + q(plain.string()) + as_flags);
  ASSERT_EQ(r.status, 0) << r.out;
  const std::vector<int64_t> want = last_line_ids(r.out);
  ASSERT_EQ(want.size(), 6u) << r.out;
  for (const fs::path& adapter : {run_dir, run_dir / "checkpoints" / "checkpoint-2"}) {
    r = run(gen + q(adapter.string()));
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_EQ(last_line_ids(r.out), want) << r.out;
    EXPECT_NE(r.out.find("generate: data.template chatml, data.default_system_message \"You are Quokka, made by "
                         "Acme Labs.\", quantization nf4 (blocksize 64, double_quant true), model.dtype fp32 from " +
                         adapter.string()),
              std::string::npos) << r.out;
    EXPECT_NE(r.out.find("generate: compute dtype fp32 (the adapter's training run); quantization nf4\n"), std::string::npos)
        << r.out;
  }
  // --dtype wins over the run's model.dtype, and the line says the stored dtype transformers would keep
  r = run(gen + q(run_dir.string()) + " --dtype bf16");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("generate: model.dtype bf16 from --dtype (the run's: fp32)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("generate: compute dtype bf16 (--dtype); " + model.string() + " stores fp32, which transformers' "
                       "from_pretrained keeps by default (--dtype fp32 decodes as it does); quantization nf4\n"),
            std::string::npos) << r.out;
  // flags win: the raw prompt on the unquantized base is the plain adapter dir's default
  r = run(gen + q(plain.string()));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.find("generate: data."), std::string::npos) << r.out;  // nothing brought, nothing said
  EXPECT_EQ(r.out.find("generate: quantization"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("generate: compute dtype fp32 (auto: fp32 on a CPU); quantization none\n"), std::string::npos)
      << r.out;
  const std::vector<int64_t> raw = last_line_ids(r.out);
  EXPECT_NE(raw, want) << "the run's settings decode as the plain defaults: the check cannot fail";
  r = run(gen + q(run_dir.string()) + " --template raw --quant none");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(last_line_ids(r.out), raw) << r.out;
  EXPECT_NE(r.out.find("generate: data.template raw from --template (the run's: chatml)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("generate: quantization none from --quant (the run's: nf4 (blocksize 64, double_quant true))"),
            std::string::npos) << r.out;
  r = run(gen + q(run_dir.string()) + " --system ''");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("generate: data.default_system_message \"\" from --system (the run's: \"You are Quokka, made "
                       "by Acme Labs.\")"), std::string::npos) << r.out;
  // the base model dir's generation_config.json gives an adapter run its decoding defaults too (as
  // transformers' PeftModel.generate() takes the base's generation_config); --greedy decodes as before
  const std::string gc = (model / "generation_config.json").string();
  std::ofstream(gc) << R"({"bos_token_id": 1, "eos_token_id": 2, "do_sample": true, "temperature": 1.5, "top_k": 0})";
  r = run(gen + q(run_dir.string()) + " --seed 1");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("generate: sampling (" + gc + ": do_sample true, temperature 1.5, top_k 0; "), std::string::npos)
      << r.out;
  EXPECT_NE(last_line_ids(r.out), want) << r.out;
  r = run(gen + q(run_dir.string()) + " --greedy");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(last_line_ids(r.out), want) << r.out;
}

// A raw-text run whose format was detected (data.format auto, the default; no truncation: split):
// `generate --adapter` of the run dir or its checkpoint prompts raw text, as the run trained, from
// the data_format the run recorded (summary.json, trainer_state.json) (before: only a format set to
// completion or truncation split told, so this run's prompt was wrapped in chatml).
TEST(Generate, RawTextRunWithADetectedFormatPromptsRawText) {
  QLORA_REQUIRE_SHARED(c4, "data/c4_demo.jsonl");
  QLORA_REQUIRE_SHARED(tokenizer, "tokenizers/llama2/tokenizer.model");
  const qlora::test::TempDir d("gen_raw_run");
  const fs::path model = d.path / "model", run_dir = d.path / "run", plain = d.path / "plain", cfg = d.path / "run.yaml",
                 text = d.path / "c4.jsonl";
  auto r = run("init-model --preset tiny --out " + model.string() + " --tokenizer " + tokenizer.string() + " --seed 0");
  ASSERT_EQ(r.status, 0) << r.out;
  {
    std::ifstream in(c4);
    std::ofstream out(text);
    std::string line;
    for (int i = 0; i < 8 && std::getline(in, line); ++i) out << line << "\n";
  }
  std::ofstream(cfg) << "output_dir: " << run_dir.string() << "\nmodel:\n  path: " << model.string()
                     << "\n  dtype: fp32\nquantization:\n  method: none\nlora:\n  r: 4\n  alpha: 8\n"
                     << "data:\n  train: " << text.string() << "\n  sequence_len: 64\n  truncation: truncate\n"
                     << "training:\n  micro_batch_size: 1\n  gradient_accumulation_steps: 1\n  max_steps: 2\n"
                     << "  learning_rate: 0.05\n  warmup_steps: 0\n  eval_steps: 0\n  gradient_checkpointing: false\n"
                     << "checkpoint:\n  save_steps: 1\n  save_minutes: 0\n";
  r = run("train " + q(cfg.string()));
  ASSERT_EQ(r.status, 0) << r.out;
  const fs::path ck = run_dir / "checkpoints" / "checkpoint-2";
  for (const fs::path& f : {run_dir / "summary.json", ck / "trainer_state.json"}) {
    std::ifstream in(f);
    EXPECT_EQ(nlohmann::json::parse(in).value("data_format", ""), "completion") << f;
  }
  fs::create_directories(plain);
  for (const char* f : {"adapter_config.json", "adapter_model.safetensors"}) fs::copy_file(run_dir / f, plain / f);
  const std::string gen = "generate " + q(model.string()) + " --prompt " + q("The weather today") +
                          " --max-new-tokens 6 --ids --adapter ";
  r = run(gen + q(plain.string()) + " --template raw");
  ASSERT_EQ(r.status, 0) << r.out;
  const std::vector<int64_t> want = last_line_ids(r.out);
  r = run(gen + q(plain.string()) + " --template chatml");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(last_line_ids(r.out), want) << "chatml decodes as raw: the check cannot fail";
  for (const fs::path& adapter : {run_dir, ck}) {
    r = run(gen + q(adapter.string()));
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_EQ(last_line_ids(r.out), want) << r.out;
    EXPECT_NE(r.out.find("generate: data.template raw from the run's data (raw text) (the run's: chatml)"),
              std::string::npos) << r.out;
  }
}
