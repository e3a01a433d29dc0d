// `qlora tokenize` on the SmolLM2 tokenizer fixture (ids against transformers), and generation
// stopping at a non-first id of generation_config.json's eos_token_id list.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

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
  expect_one_line_error(run("tokenize " + tdir.string() + " --chat " + chat.string() + " --template nosuch"), "'nosuch'");
  // another family's template: its markers are not tokens of SmolLM2's tokenizer
  expect_one_line_error(run("tokenize " + tdir.string() + " --chat " + chat.string() + " --template llama3"),
                        "data.template: llama3 writes <|start_header_id|> as one token, but the tokenizer ");
  expect_one_line_error(run("tokenize " + tdir.string() + " --chat " + (tmp / "missing.json").string() + " --template smollm2"),
                        (tmp / "missing.json").string());
  fs::remove_all(tmp);
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
  const std::vector<int64_t> full = parse_ids(r.out);
  ASSERT_GE(full.size(), 3u) << r.out;
  // the first new id not seen before position k (k >= 1) and not EOS: listed second, it must end generation there
  size_t k = 1;
  while (k < full.size() && (full[k] == 2 || std::count(full.begin(), full.begin() + k, full[k]) > 0)) ++k;
  ASSERT_LT(k, full.size()) << r.out;
  std::ofstream(d / "m" / "generation_config.json") << R"({"bos_token_id": 1, "eos_token_id": [2, )" << full[k] << "]}";
  r = run(gen);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(parse_ids(r.out), std::vector<int64_t>(full.begin(), full.begin() + k + 1)) << "stop id " << full[k];
  // --template: the prompt as a user message (ids: FamilyTemplates.ChatPromptIsTheGenerationPromptOfTransformers)
  r = run(gen + " --template alpaca --system 'Answer briefly.'");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_FALSE(parse_ids(r.out).empty()) << r.out;
  r = run(gen + " --system 'Answer briefly.'");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("generate: --system needs --template NAME (or auto)"), std::string::npos) << r.out;
  r = run(gen + " --template llama3");  // another family's markers: not tokens of this tokenizer
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("data.template: llama3 writes"), std::string::npos) << r.out;
  fs::remove_all(d);
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
  EXPECT_EQ(parse_ids(r.out), want) << r.out;
  r = run(gen);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(parse_ids(r.out), want) << "the unquantized base decodes as the NF4 one: the check cannot fail";
  r = run(gen + " --quant int8");
  EXPECT_EQ(r.status, 2) << r.out;  // a usage error
}
