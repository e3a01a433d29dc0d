// Logits parity with transformers on tiny random models built by tests/fixtures/make_models.py,
// padded batches (left vs right), and greedy generation token for token.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "common/files.h"
#include "common/error.h"
#include "cli/commands.h"
#include "common/tensor_io.h"
#include "test_util.h"
#include "data/tokenizer.h"
#include "model/generate.h"
#include "model/model.h"

namespace qlora {
namespace {
using test::error_of;

struct Ref {
  torch::Tensor ids, mask, pos, logits_fp32, logits_bf16;
};

Ref load_ref(const std::filesystem::path& dir, const std::string& side) {
  st::SafetensorsFile f((dir / "parity_ref.safetensors").string());
  auto get = [&](const std::string& n) { return load_tensor(f, f.info(side + "." + n)).clone(); };
  return {get("input_ids"), get("attention_mask"), get("position_ids"), get("logits.fp32"),
          get("logits.bf16")};
}

// Logits at real (unpadded) positions only: [n_real, vocab].
torch::Tensor real(const torch::Tensor& logits, const torch::Tensor& mask) {
  return logits.index({mask.to(torch::kBool)});
}

class Parity : public ::testing::TestWithParam<std::string> {};

// fp32: the same ops in the same order as transformers; differences are float reassociation in
// matmul / SDPA kernels only, far below 1e-4 on logits of magnitude ~1 (issue bar: 1e-4).
TEST_P(Parity, Fp32LogitsMatchTransformers) {
  QLORA_REQUIRE_FIXTURE(dir, "models/" + GetParam());
  LlamaModel m = LlamaModel::load(dir.string(), torch::kFloat32, torch::kCPU);
  torch::NoGradGuard ng;
  for (const std::string side : {"right", "left"}) {
    Ref r = load_ref(dir, side);
    torch::Tensor ours = m.forward({r.ids, r.mask, r.pos, {}});
    const double d = (real(ours, r.mask) - real(r.logits_fp32, r.mask)).abs().max().item<double>();
    std::cout << GetParam() << " " << side << " fp32 max|dlogit| = " << d << "\n";
    EXPECT_LE(d, 1e-4) << side;
  }
}

// bf16: both sides round every op's output to bf16 (8 significant bits, relative step 2^-8).
// Through 2 layers the logits may differ by a few bf16 steps of their magnitude; we allow
// 4 steps of the largest |logit| (4 · 2^-8 · max|ref|); measured 2026-11-29: at most 2.3 steps.
TEST_P(Parity, Bf16LogitsMatchTransformers) {
  QLORA_REQUIRE_FIXTURE(dir, "models/" + GetParam());
  LlamaModel m = LlamaModel::load(dir.string(), torch::kBFloat16, torch::kCPU);
  torch::NoGradGuard ng;
  for (const std::string side : {"right", "left"}) {
    Ref r = load_ref(dir, side);
    torch::Tensor ours = m.forward({r.ids, r.mask, r.pos, {}}).to(torch::kFloat32);
    torch::Tensor ref = real(r.logits_bf16, r.mask);
    const double d = (real(ours, r.mask) - ref).abs().max().item<double>();
    const double tol = 4.0 / 256.0 * ref.abs().max().item<double>();
    std::cout << GetParam() << " " << side << " bf16 max|dlogit| = " << d << " (tol " << tol << ")\n";
    EXPECT_LE(d, tol) << side;
  }
}

// Left and right padding give the same logits on real tokens (positions from the mask).
TEST_P(Parity, LeftAndRightPaddingAgree) {
  QLORA_REQUIRE_FIXTURE(dir, "models/" + GetParam());
  LlamaModel m = LlamaModel::load(dir.string(), torch::kFloat32, torch::kCPU);
  torch::NoGradGuard ng;
  Ref r = load_ref(dir, "right"), l = load_ref(dir, "left");
  // no explicit position ids: the model derives them from the attention mask
  torch::Tensor a = real(m.forward({r.ids, r.mask, {}, {}}), r.mask);
  torch::Tensor b = real(m.forward({l.ids, l.mask, {}, {}}), l.mask);
  EXPECT_LE((a - b).abs().max().item<double>(), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Models, Parity,
                         ::testing::Values("llama_gqa", "llama_tied_llama3", "qwen2_bias", "qwen3_qknorm",
                                           "mistral_sharded", "mistral_window"));

// Mistral's sliding window (5) on sequences of 12 and 7 tokens (mistral_window; Parity above
// compares the logits): the same weights without the window give logits > 1e-2 away, so the
// window is really exercised; greedy generation past the window through the KV cache matches
// transformers' generate.
TEST(SlidingWindow, WindowShorterThanTheSequence) {
  QLORA_REQUIRE_FIXTURE(dir, "models/mistral_window/nowindow_ref.safetensors");
  LlamaModel m = LlamaModel::load(dir.parent_path().string(), torch::kFloat32, torch::kCPU);
  ASSERT_EQ(m.config().sliding_window, 5);
  st::SafetensorsFile f(dir.string());
  torch::NoGradGuard ng;
  for (const std::string side : {"right", "left"}) {
    Ref r = load_ref(dir.parent_path(), side);
    const torch::Tensor nowin = load_tensor(f, f.info(side + ".logits_nowindow")).clone();
    torch::Tensor ours = m.forward({r.ids, r.mask, r.pos, {}});
    EXPECT_GT((real(ours, r.mask) - real(nowin, r.mask)).abs().max().item<double>(), 1e-2) << side;
  }
  QLORA_REQUIRE_FIXTURE(gen, "models/mistral_window/generate_ref.json");
  std::ifstream in(gen);
  auto j = nlohmann::json::parse(in);
  GenerateOptions g;
  g.max_new_tokens = 16;
  g.eos_token_ids = {2};
  const auto prompt = j["prompt_ids"].get<std::vector<int64_t>>();
  const auto expect = j["new_ids"].get<std::vector<int64_t>>();
  ASSERT_GT(prompt.size() + expect.size(), 5u * 2) << "the reference generation does not pass the window";
  EXPECT_EQ(generate_tokens(m, prompt, g), expect);
}

// Tied embeddings (SmolLM2, Qwen2.5 <= 3B, Llama 3.2 1B/3B): no lm_head.weight in the checkpoint;
// lm_head IS embed_tokens (one tensor), stays in the compute dtype when the decoder linears are
// quantized on load, and is counted once.
TEST(TiedEmbeddings, LmHeadIsTheEmbeddingAndStaysUnquantized) {
  QLORA_REQUIRE_FIXTURE(dir, "models/llama_tied_llama3");
  QuantOptions q;
  q.quant_type = kernels::Quant4Type::NF4;
  for (torch::Dtype dt : {torch::kFloat32, torch::kBFloat16}) {
    LlamaModel m = LlamaModel::load(dir.string(), dt, torch::kCPU, q);
    EXPECT_TRUE(m.config().tie_word_embeddings);
    EXPECT_TRUE(m.lm_head.is_same(m.embed_tokens));
    EXPECT_EQ(m.lm_head.scalar_type(), dt);
    for (const FrozenLinear* f : m.linears()) EXPECT_TRUE(f->quantized()) << f->name;
    for (const auto& [name, t] : m.named_tensors()) EXPECT_NE(name, "lm_head.weight");
  }
  LlamaModel plain = LlamaModel::load(dir.string(), torch::kFloat32, torch::kCPU);
  int64_t n = 0;
  for (const auto& [name, t] : plain.named_tensors()) n += t.numel();
  EXPECT_EQ(n, plain.config().num_parameters());
}

// tie_word_embeddings: true with a stored lm_head.weight: a copy equal to embed_tokens (a duplicate
// save) loads as the tied model; a different one is refused naming config.json and the fix, since
// transformers 5 then unties them and uses the stored lm_head (trial 22: a silently tied model
// evaluated 7.9432 where transformers gave 8.0078).
TEST(TiedEmbeddings, AStoredLmHeadUnderTheTieFlagMustEqualTheEmbeddings) {
  QLORA_REQUIRE_FIXTURE(tied, "models/llama_tied_llama3");
  QLORA_REQUIRE_FIXTURE(untied, "models/llama_gqa");
  namespace fs = std::filesystem;
  const fs::path d = test::fresh_temp_dir("tied_lm_head");
  const auto with_tie_flag = [&](const fs::path& src, const fs::path& dst) {
    fs::create_directories(dst);
    fs::copy_file(src / "model.safetensors", dst / "model.safetensors");
    nlohmann::json c = nlohmann::json::parse(std::ifstream(src / "config.json"));
    c["tie_word_embeddings"] = true;
    std::ofstream(dst / "config.json") << c.dump(2);
  };
  with_tie_flag(untied, d / "different");
  const std::string e = error_of([&] { LlamaModel::load((d / "different").string(), torch::kFloat32, torch::kCPU); });
  EXPECT_NE(e.find((d / "different" / "config.json").string() + ": tie_word_embeddings is true, but "), std::string::npos) << e;
  EXPECT_NE(e.find("stores an lm_head.weight that differs from model.embed_tokens.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("set tie_word_embeddings: false in config.json"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  InspectOptions io;
  io.model_dir = (d / "different").string();
  EXPECT_EQ(error_of([&] { cmd_inspect(io); }), e);  // inspect says so too (it showed "tied" and an lm_head row)

  // the tied fixture saved again with lm_head.weight = embed_tokens (as some exporters write it)
  LlamaModel ref = LlamaModel::load(tied.string(), torch::kFloat32, torch::kCPU);
  std::vector<std::pair<std::string, torch::Tensor>> ts = ref.named_tensors();
  ts.emplace_back("lm_head.weight", ref.embed_tokens);
  with_tie_flag(tied, d / "duplicate");
  save_tensors((d / "duplicate" / "model.safetensors").string(), ts);
  LlamaModel dup = LlamaModel::load((d / "duplicate").string(), torch::kFloat32, torch::kCPU);
  EXPECT_TRUE(dup.lm_head.is_same(dup.embed_tokens));
  const Ref r = load_ref(tied, "right");
  torch::NoGradGuard ng;
  EXPECT_TRUE(torch::equal(dup.forward({r.ids, r.mask, r.pos, {}}), ref.forward({r.ids, r.mask, r.pos, {}})));
  qlora::remove_tree(d);
}

// An untied config whose checkpoint lacks lm_head.weight: load refuses it naming the tensor and the
// flag; `inspect` showed the directory as if it loaded (session 22) and now says what is missing, in
// its text and its JSON (missing_tensors: [] for a complete directory). Every missing weight is listed.
TEST(MissingWeights, InspectNamesWhatLoadRefuses) {
  QLORA_REQUIRE_FIXTURE(untied, "models/llama_gqa");
  namespace fs = std::filesystem;
  const fs::path d = test::fresh_temp_dir("missing_weights") / "no_lm_head";
  fs::create_directories(d);
  fs::copy_file(untied / "config.json", d / "config.json");
  LlamaModel ref = LlamaModel::load(untied.string(), torch::kFloat32, torch::kCPU);
  std::vector<std::pair<std::string, torch::Tensor>> ts;
  for (auto& [name, t] : ref.named_tensors())
    if (name != "lm_head.weight" && name != "model.layers.1.mlp.up_proj.weight") ts.emplace_back(name, t);
  ASSERT_EQ(ts.size() + 2, ref.named_tensors().size());
  save_tensors((d / "model.safetensors").string(), ts);

  const std::string e = error_of([&] { LlamaModel::load(d.string(), torch::kFloat32, torch::kCPU); });
  EXPECT_EQ(e, d.string() + ": tensor 'model.layers.1.mlp.up_proj.weight' is missing from the checkpoint") << e;
  EXPECT_EQ(missing_weights(st::SafetensorsCheckpoint(d.string()), ref.config()),
            (std::vector<std::string>{"model.layers.1.mlp.up_proj.weight", "lm_head.weight"}));
  EXPECT_EQ(missing_weight_message("lm_head.weight"),
            "tensor 'lm_head.weight' is missing from the checkpoint (config.json has tie_word_embeddings: false)");
  InspectOptions io;
  io.model_dir = d.string();
  const std::string text = cmd_inspect(io);
  EXPECT_NE(text.find("\nnot loadable (train, eval and generate refuse this directory): tensor "
                      "'model.layers.1.mlp.up_proj.weight' is missing from the checkpoint, and 1 more (--json lists them all)\n"),
            std::string::npos) << text;
  io.json = true;
  EXPECT_EQ(nlohmann::json::parse(cmd_inspect(io))["missing_tensors"],
            nlohmann::json({"model.layers.1.mlp.up_proj.weight", "lm_head.weight"}));
  io.model_dir = untied.string();
  EXPECT_EQ(nlohmann::json::parse(cmd_inspect(io))["missing_tensors"], nlohmann::json::array());
  {  // Mistral's window is shown (trial 26: inspect said nothing of it)
    QLORA_REQUIRE_FIXTURE(window, "models/mistral_window");
    InspectOptions w;
    w.model_dir = window.string();
    EXPECT_NE(cmd_inspect(w).find(", sliding window 5, 1 shard(s)\n"), std::string::npos) << cmd_inspect(w);
  }
  io.json = false;
  EXPECT_EQ(cmd_inspect(io).find("not loadable"), std::string::npos);

  // a config.json vocab_size above the embedding's rows (trial 24: inspect said nothing, load refused)
  const fs::path v = d.parent_path() / "vocab_above_rows";
  fs::create_directories(v);
  nlohmann::json cj = nlohmann::json::parse(std::ifstream(untied / "config.json"));
  const int64_t V = cj["vocab_size"].get<int64_t>(), H = cj["hidden_size"].get<int64_t>();
  cj["vocab_size"] = V + 8;
  std::ofstream(v / "config.json") << cj.dump();
  fs::copy_file(untied / "model.safetensors", v / "model.safetensors");
  const std::string shapes = "expected shape [" + std::to_string(V + 8) + ", " + std::to_string(H) + "], got [" +
                             std::to_string(V) + ", " + std::to_string(H) + "]";
  EXPECT_EQ(error_of([&] { LlamaModel::load(v.string(), torch::kFloat32, torch::kCPU); }),
            (v / "model.safetensors").string() + ": tensor 'model.embed_tokens.weight': " + shapes);
  io.model_dir = v.string();
  EXPECT_NE(cmd_inspect(io).find("\nnot loadable (train, eval and generate refuse this directory): tensor "
                                 "'model.embed_tokens.weight': " + shapes + ", and 1 more (--json lists them all)\n"),
            std::string::npos) << cmd_inspect(io);
  io.json = true;
  const nlohmann::json ij = nlohmann::json::parse(cmd_inspect(io));
  EXPECT_EQ(ij["missing_tensors"], nlohmann::json::array());
  EXPECT_EQ(ij["misshapen_tensors"],
            nlohmann::json::parse("[{\"name\": \"model.embed_tokens.weight\", \"expected_shape\": [" + std::to_string(V + 8) + ", " +
                                  std::to_string(H) + "], \"shape\": [" + std::to_string(V) + ", " + std::to_string(H) +
                                  "]}, {\"name\": \"lm_head.weight\", \"expected_shape\": [" + std::to_string(V + 8) + ", " +
                                  std::to_string(H) + "], \"shape\": [" + std::to_string(V) + ", " + std::to_string(H) + "]}]"));
  qlora::remove_tree(d.parent_path());
}

// A LoRA target on lm_head or embed_tokens is refused with the reason (tied: it would change both);
// the same for an adapter's target list (lora_shapes, used when loading a PEFT adapter).
TEST(TiedEmbeddings, LoraOnLmHeadOrEmbeddingsIsRefusedWithTheReason) {
  QLORA_REQUIRE_FIXTURE(tied, "models/llama_tied_llama3");
  QLORA_REQUIRE_FIXTURE(untied, "models/llama_gqa");
  LlamaModel m = LlamaModel::load(tied.string(), torch::kFloat32, torch::kCPU);
  LoraOptions lo;
  lo.r = 4;
  lo.alpha = 8;
  lo.seed = 1;
  for (const std::string t : {"lm_head", "embed_tokens", "model.embed_tokens"}) {
    lo.target_modules = {"q_proj", t};
    const std::string e = error_of([&] { m.add_lora(lo); });
    EXPECT_NE(e.find("lora.target_modules: '" + t + "' cannot carry a LoRA adapter"), std::string::npos) << e;
    EXPECT_NE(e.find("tie_word_embeddings: true"), std::string::npos) << e;
    EXPECT_NE(error_of([&] { m.lora_shapes({t}); }).find("cannot carry"), std::string::npos) << t;
  }
  for (const FrozenLinear* f : m.linears()) EXPECT_FALSE(f->lora) << "nothing attached on error";
  LlamaModel u = LlamaModel::load(untied.string(), torch::kFloat32, torch::kCPU);
  lo.target_modules = {"lm_head"};
  const std::string e = error_of([&] { u.add_lora(lo); });
  EXPECT_NE(e.find("stay frozen and unquantized"), std::string::npos) << e;
  EXPECT_EQ(e.find("tie_word_embeddings"), std::string::npos) << e;
  lo.target_modules = {"all-linear"};
  EXPECT_EQ(u.add_lora(lo).size(), 7u);  // never lm_head
}

TEST(Generate, GreedyMatchesTransformersGenerate) {
  QLORA_REQUIRE_FIXTURE(dir, "models/llama_gqa/generate_ref.json");
  std::ifstream in(dir);
  auto j = nlohmann::json::parse(in);
  LlamaModel m = LlamaModel::load(dir.parent_path().string(), torch::kFloat32, torch::kCPU);
  GenerateOptions g;
  g.max_new_tokens = 32;
  g.eos_token_ids = {2};
  auto ids = generate_tokens(m, j["prompt_ids"].get<std::vector<int64_t>>(), g);
  EXPECT_EQ(ids, j["new_ids"].get<std::vector<int64_t>>());
}

// transformers' RepetitionPenaltyLogitsProcessor(1.3) in greedy decoding (make_models.py
// decoding_refs): token for token, and not the plain greedy sequence (which repeats 10920).
TEST(Generate, RepetitionPenaltyMatchesTransformersGenerate) {
  QLORA_REQUIRE_FIXTURE(dir, "models/llama_gqa/generate_ref.json");
  const auto j = nlohmann::json::parse(std::ifstream(dir));
  const auto& ref = j["repetition_penalty"];
  ASSERT_NE(ref["new_ids"], j["new_ids"]) << "the reference does not test the penalty";
  LlamaModel m = LlamaModel::load(dir.parent_path().string(), torch::kFloat32, torch::kCPU);
  GenerateOptions g;
  g.max_new_tokens = 32;
  g.eos_token_ids = {2};
  g.repetition_penalty = ref["repetition_penalty"].get<double>();
  const auto prompt = j["prompt_ids"].get<std::vector<int64_t>>();
  EXPECT_EQ(generate_tokens(m, prompt, g), ref["new_ids"].get<std::vector<int64_t>>());
  g.top_k = 3;  // greedy: the sampling warpers do not apply (transformers: do_sample=False)
  g.top_p = 0.5;
  g.temperature = 0.1;
  EXPECT_EQ(generate_tokens(m, prompt, g), ref["new_ids"].get<std::vector<int64_t>>());
}

// Sampling draws what transformers' `torch.manual_seed(seed); generate(do_sample=True, ...)` draws:
// the same processors in the same order (penalty, temperature, top-k, top-p), the same libtorch
// ops on [1, vocab] fp32, the same generator state, and at::multinomial (one draw: argmax of
// probs / Exponential(1)). Our fp32 logits differ from transformers' by float reassociation only
// (Parity.Fp32LogitsMatchTransformers), which changes no draw of these 32-token references.
TEST(Generate, SamplingMatchesTransformersForTheSameSeed) {
  QLORA_REQUIRE_FIXTURE(dir, "models/llama_gqa/generate_ref.json");
  const auto j = nlohmann::json::parse(std::ifstream(dir));
  LlamaModel m = LlamaModel::load(dir.parent_path().string(), torch::kFloat32, torch::kCPU);
  const auto prompt = j["prompt_ids"].get<std::vector<int64_t>>();
  for (const std::string name : {"sample", "sample_penalty", "sample_default_top_k"}) {
    const auto& ref = j[name];
    GenerateOptions g;
    g.max_new_tokens = 32;
    g.eos_token_ids = {2};
    g.seed = ref["seed"].get<uint64_t>();
    g.do_sample = true;
    g.temperature = ref["temperature"].get<double>();
    g.top_k = ref.value("top_k", kTransformersDefaultTopK);  // none given: GenerationConfig's default
    g.top_p = ref.value("top_p", 1.0);
    g.repetition_penalty = ref.value("repetition_penalty", 1.0);
    const std::vector<int64_t> ids = generate_tokens(m, prompt, g);
    EXPECT_EQ(ids, ref["new_ids"].get<std::vector<int64_t>>()) << name;
    EXPECT_NE(ids, j["new_ids"].get<std::vector<int64_t>>()) << name << ": not greedy";
    g.seed += 1;
    EXPECT_NE(generate_tokens(m, prompt, g), ids) << name << ": the seed matters";
  }
  // top_k 1 keeps only the argmax: sampling is greedy decoding, whatever the seed and temperature
  GenerateOptions g;
  g.max_new_tokens = 32;
  g.eos_token_ids = {2};
  g.do_sample = true;
  g.temperature = 1.7;
  g.top_k = 1;
  g.seed = 123;
  EXPECT_EQ(generate_tokens(m, prompt, g), j["new_ids"].get<std::vector<int64_t>>());
}

// The llama_gqa fixture's generate_ref.json (make_models.py), its model and tokenizer, and the
// tokenizer's decode as the DecodeFn stop strings need.
struct GqaGenerateRef {
  nlohmann::json j;
  LlamaModel m;
  data::Tokenizer tok;
  std::vector<int64_t> prompt, greedy;  ///< prompt_ids; new_ids of greedy decoding
  DecodeFn decode() const {
    return [this](const std::vector<int64_t>& ids) { return tok.decode(data::TokenIds(ids.begin(), ids.end())); };
  }
  static GqaGenerateRef load(const std::filesystem::path& ref_file) {
    GqaGenerateRef r{nlohmann::json::parse(std::ifstream(ref_file)),
                     LlamaModel::load(ref_file.parent_path().string(), torch::kFloat32, torch::kCPU),
                     data::Tokenizer::from_pretrained(ref_file.parent_path().string()), {}, {}};
    r.prompt = r.j["prompt_ids"].get<std::vector<int64_t>>();
    r.greedy = r.j["new_ids"].get<std::vector<int64_t>>();
    return r;
  }
};

// Stop strings as transformers' stop_strings (StopStringCriteria): generation ends at the token that
// completes the string (here spanning new tokens 6..8), which is kept; EOS ids and the length give
// the other finish reasons.
TEST(Generate, StopStringsEosAndLengthEndGenerationAsTransformers) {
  QLORA_REQUIRE_FIXTURE(dir, "models/llama_gqa/generate_ref.json");
  const GqaGenerateRef g_ref = GqaGenerateRef::load(dir);
  const auto& ref = g_ref.j["stop"];
  const LlamaModel& m = g_ref.m;
  const DecodeFn decode = g_ref.decode();
  const auto& prompt = g_ref.prompt;
  const auto& greedy = g_ref.greedy;
  GenerateOptions g;
  g.max_new_tokens = 32;
  g.eos_token_ids = {2};
  g.stop_strings = {"never in this text", ref["stop"].get<std::string>()};
  Generation r = generate(m, prompt, g, decode);
  EXPECT_EQ(r.ids, ref["new_ids"].get<std::vector<int64_t>>());
  EXPECT_EQ(r.finish_reason, FinishReason::stop);
  EXPECT_EQ(decode(r.ids), ref["text"].get<std::string>());  // the stop string stays in the text
  EXPECT_NE(error_of([&] { generate(m, prompt, g); }).find("stop strings need a decoder"), std::string::npos);
  g.stop_strings.clear();
  g.eos_token_ids = {2, greedy[3]};
  r = generate(m, prompt, g);
  EXPECT_EQ(r.ids, std::vector<int64_t>(greedy.begin(), greedy.begin() + 4));
  EXPECT_EQ(r.finish_reason, FinishReason::eos);
  g.eos_token_ids = {2};
  g.max_new_tokens = 5;
  r = generate(m, prompt, g);
  EXPECT_EQ(r.ids, std::vector<int64_t>(greedy.begin(), greedy.begin() + 5));
  EXPECT_EQ(r.finish_reason, FinishReason::length);
  EXPECT_STREQ(finish_reason_name(FinishReason::length), "length");
}

// transformers' StopStringCriteria matches over prompt + new ids: a stop string made of the
// prompt's last characters and new tokens 1..2 (make_models.py stop_prompt) stops after 2 new
// tokens, as transformers does, though the new text alone never contains it (before: decoding
// only the new ids, it ran to max_new_tokens). One wholly inside the prompt never stops.
TEST(Generate, StopStringBegunInThePromptStopsAsTransformers) {
  QLORA_REQUIRE_FIXTURE(dir, "models/llama_gqa/generate_ref.json");
  const GqaGenerateRef g_ref = GqaGenerateRef::load(dir);
  const auto& ref = g_ref.j["stop_prompt"];
  const LlamaModel& m = g_ref.m;
  const DecodeFn decode = g_ref.decode();
  const auto& prompt = g_ref.prompt;
  const auto& greedy = g_ref.greedy;
  GenerateOptions g;
  g.max_new_tokens = 32;
  g.eos_token_ids = {2};
  g.stop_strings = {ref["stop"].get<std::string>()};
  ASSERT_EQ(decode(greedy).find(g.stop_strings[0]), std::string::npos) << "the new text alone has it";
  Generation r = generate(m, prompt, g, decode);
  EXPECT_EQ(r.ids, ref["new_ids"].get<std::vector<int64_t>>());
  EXPECT_EQ(r.finish_reason, FinishReason::stop);
  g.stop_strings = {"upon a time"};  // in the prompt only: StopStringCriteria needs the last token in it
  r = generate(m, prompt, g, decode);
  EXPECT_EQ(r.ids, greedy);
  EXPECT_EQ(r.finish_reason, FinishReason::length);
}

// The processors on hand-made scores, as transformers' logits_process.py computes them:
// RepetitionPenaltyLogitsProcessor divides a positive score and multiplies a negative one, once per
// distinct id, and ignores ids past the vocab; TopKLogitsWarper keeps ties with the k-th score;
// TopPLogitsWarper drops the ascending tokens whose cumulative mass is <= 1 - top_p.
TEST(Generate, LogitsProcessorsFollowTransformers) {
  const torch::Tensor s = torch::tensor({2.0f, -2.0f, 1.0f, 1.0f, 0.5f}).unsqueeze(0);
  torch::Tensor p = apply_repetition_penalty(s, {0, 1, 1, 0, 7}, 2.0);
  EXPECT_TRUE(torch::equal(p, torch::tensor({1.0f, -4.0f, 1.0f, 1.0f, 0.5f}).unsqueeze(0))) << p;
  EXPECT_TRUE(torch::equal(apply_repetition_penalty(s, {0, 1}, 1.0), s));
  const float inf = std::numeric_limits<float>::infinity();
  torch::Tensor k = sample_warpers(s, 1.0, 3, 1.0);  // 3rd highest is 1.0, held by two ids: 4 kept
  EXPECT_TRUE(torch::equal(k, torch::tensor({2.0f, -inf, 1.0f, 1.0f, -inf}).unsqueeze(0))) << k;
  EXPECT_TRUE(torch::equal(sample_warpers(s, 1.0, 99, 1.0), s));  // k past the vocab: all kept
  EXPECT_TRUE(torch::allclose(sample_warpers(s, 0.5, 0, 1.0), s * 2));
  // probs of [ln 6, ln 3, ln 1] = [0.6, 0.3, 0.1]: top_p 0.85 drops only the 0.1 (its ascending
  // cumulative 0.1 <= 0.15); top_p 0.95 drops none; top_p 0.5 keeps only the highest
  const torch::Tensor t = torch::tensor({std::log(6.0f), std::log(3.0f), 0.0f}).unsqueeze(0);
  EXPECT_TRUE(torch::equal(sample_warpers(t, 1.0, 0, 0.85).isinf(), torch::tensor({false, false, true}).unsqueeze(0)));
  EXPECT_FALSE(sample_warpers(t, 1.0, 0, 0.95).isinf().any().item<bool>());
  EXPECT_TRUE(torch::equal(sample_warpers(t, 1.0, 0, 0.5).isinf(), torch::tensor({false, true, true}).unsqueeze(0)));
}

// Bad options are refused naming the flag (cmd_generate checks them before loading anything).
TEST(Generate, CheckGenerateOptionsNamesTheFlag) {
  const auto err = [](auto set) {
    GenerateOptions g;
    set(g);
    return error_of([&] { check_generate_options(g); });
  };
  EXPECT_EQ(err([](GenerateOptions& g) { g.top_k = -1; }), "generate: --top-k must be >= 0 (0 = off), got -1");
  EXPECT_EQ(err([](GenerateOptions& g) { g.repetition_penalty = 0; }),
            "generate: --repetition-penalty must be > 0 (1 = off), got 0");
  EXPECT_NE(err([](GenerateOptions& g) { g.repetition_penalty = std::nan(""); }).find("--repetition-penalty must be > 0"),
            std::string::npos);
  EXPECT_EQ(err([](GenerateOptions& g) { g.stop_strings = {"ok", ""}; }), "generate: --stop must not be empty");
  EXPECT_EQ(err([](GenerateOptions& g) { g.top_k = 0; g.repetition_penalty = 0.5; }), "");
  EXPECT_EQ(err([](GenerateOptions& g) { g.do_sample = true; g.temperature = 0; }),
            "generate: --temperature must be > 0 when sampling, got 0");
  EXPECT_EQ(err([](GenerateOptions& g) { g.temperature = 0; }), "");  // greedy: unused
}

// generation_config.json read as transformers' GenerationConfig takes it: the decoding keys typed
// and bounded (a bad value names the file and the key), null = absent, other keys ignored.
TEST(Generate, GenerationConfigReadsTheDecodingKeysAndNamesFileAndKey) {
  const std::string f = "/m/generation_config.json";
  GenerationConfig c = parse_generation_config(
      R"({"bos_token_id": 1, "eos_token_id": [2, 3], "do_sample": true, "temperature": 0.7, "top_k": 20,
          "top_p": 0.8, "repetition_penalty": 1.05, "max_new_tokens": 24, "max_length": 4096, "min_p": null})", f);
  EXPECT_EQ(c.do_sample, true);
  EXPECT_EQ(c.temperature, 0.7);
  EXPECT_EQ(c.top_k, 20);
  EXPECT_EQ(c.top_p, 0.8);
  EXPECT_EQ(c.repetition_penalty, 1.05);
  EXPECT_EQ(c.max_new_tokens, 24);
  EXPECT_EQ(c.max_length, 4096);
  c = parse_generation_config(R"({"do_sample": null, "temperature": 1, "top_k": null, "top_p": 1})", f);
  EXPECT_FALSE(c.do_sample);
  EXPECT_EQ(c.temperature, 1.0);  // an integer number is a number
  EXPECT_FALSE(c.top_k);
  EXPECT_EQ(c.top_p, 1.0);
  const auto err = [&](const std::string& text) { return error_of([&] { parse_generation_config(text, f); }); };
  EXPECT_EQ(err(R"({"top_p": 1.5})"), f + ": top_p: must be in (0, 1], got 1.5");
  EXPECT_EQ(err(R"({"top_p": 0})"), f + ": top_p: must be in (0, 1], got 0");
  EXPECT_EQ(err(R"({"do_sample": "true"})"), f + ": do_sample: must be true or false, got \"true\"");
  EXPECT_EQ(err(R"({"do_sample": 1})"), f + ": do_sample: must be true or false, got 1");
  EXPECT_EQ(err(R"({"temperature": -0.5})"), f + ": temperature: must be >= 0, got -0.5");
  EXPECT_EQ(err(R"({"temperature": "hot"})"), f + ": temperature: must be a number >= 0, got \"hot\"");
  EXPECT_EQ(err(R"({"top_k": 20.0})"), f + ": top_k: must be an integer >= 0, got 20.0");
  EXPECT_EQ(err(R"({"top_k": -1})"), f + ": top_k: must be an integer >= 0, got -1");
  EXPECT_EQ(err(R"({"top_k": 18446744073709551615})"), f + ": top_k: must be an integer >= 0, got 18446744073709551615");
  EXPECT_EQ(err(R"({"repetition_penalty": 0})"), f + ": repetition_penalty: must be > 0, got 0");
  EXPECT_EQ(err(R"({"repetition_penalty": true})"), f + ": repetition_penalty: must be a number > 0, got true");
  EXPECT_EQ(err(R"({"max_new_tokens": 0})"), f + ": max_new_tokens: must be an integer >= 1, got 0");
  EXPECT_EQ(err(R"({"max_length": [20]})"), f + ": max_length: must be an integer >= 1, got [20]");
  EXPECT_EQ(err("[1]"), f + ":1: expected a JSON object at top level, got array");
  // cut short: where (line:column, common/json_file.h), not "not an object"
  EXPECT_EQ(err("{\"top_k\": 2"), f + ":1:12: invalid JSON: syntax error while parsing object - unexpected end of input; "
                                      "expected '}'; the file ends there (cut short?)");
  EXPECT_EQ(err("{\"top_k\": 1e999}"), f + ": invalid JSON: number overflow parsing '1e999'");  // no double holds it
  // no file: every key unset (transformers' defaults)
  const test::TempDir d("genconfig");
  const GenerationConfig none = read_generation_config(d.path.string());
  EXPECT_FALSE(none.do_sample || none.temperature || none.top_k || none.top_p || none.repetition_penalty ||
               none.max_new_tokens || none.max_length);
}

// The resolution rule, key by key: a flag wins, else generation_config.json's value, else
// transformers' GenerationConfig default (do_sample False, temperature 1.0, top_k 50, top_p 1.0,
// repetition_penalty 1.0); --temperature T > 0 samples and 0 is greedy; max_new_tokens, else the
// file's max_new_tokens, else its max_length counting the prompt, else 64. The summary names each
// value's source.
TEST(Generate, ResolveGenerateOptionsFlagThenFileThenTransformersDefault) {
  const std::string f = "/m/generation_config.json";
  GenerationConfig qwen;  // Qwen2.5-Instruct's generation_config.json
  qwen.do_sample = true;
  qwen.temperature = 0.7;
  qwen.top_p = 0.8;
  qwen.top_k = 20;
  qwen.repetition_penalty = 1.05;
  ResolvedGenerate r = resolve_generate_options({}, qwen, f);
  EXPECT_TRUE(r.opts.do_sample);
  EXPECT_EQ(r.opts.temperature, 0.7);
  EXPECT_EQ(r.opts.top_k, 20);
  EXPECT_EQ(r.opts.top_p, 0.8);
  EXPECT_EQ(r.opts.repetition_penalty, 1.05);
  EXPECT_EQ(r.opts.max_new_tokens, 64);
  EXPECT_EQ(r.summary, "sampling (" + f + ": do_sample true, temperature 0.7, top_k 20, top_p 0.8, repetition_penalty "
            "1.05; qlora's default: max_new_tokens 64)");
  // no file keys (SmolLM2): greedy, transformers' defaults
  r = resolve_generate_options({}, {}, f);
  EXPECT_FALSE(r.opts.do_sample);
  EXPECT_EQ(r.opts.repetition_penalty, 1.0);
  EXPECT_EQ(r.summary, "greedy (transformers' defaults: do_sample false, repetition_penalty 1; qlora's default: "
            "max_new_tokens 64)");
  // do_sample from the file, nothing else: transformers' sampling defaults (temperature 1, top_k 50)
  GenerationConfig sample_only;
  sample_only.do_sample = true;
  r = resolve_generate_options({}, sample_only, f);
  EXPECT_TRUE(r.opts.do_sample);
  EXPECT_EQ(r.opts.temperature, 1.0);
  EXPECT_EQ(r.opts.top_k, kTransformersDefaultTopK);
  EXPECT_EQ(r.opts.top_p, 1.0);
  // flags win key by key
  GenerationConfig flags;
  flags.temperature = 0.9;
  flags.top_k = 0;
  flags.max_new_tokens = 5;
  r = resolve_generate_options(flags, qwen, f);
  EXPECT_TRUE(r.opts.do_sample);
  EXPECT_EQ(r.opts.temperature, 0.9);
  EXPECT_EQ(r.opts.top_k, 0);
  EXPECT_EQ(r.opts.top_p, 0.8);
  EXPECT_EQ(r.opts.max_new_tokens, 5);
  EXPECT_EQ(r.summary, "sampling (flags: do_sample true, temperature 0.9, top_k 0, max_new_tokens 5; " + f +
            ": top_p 0.8, repetition_penalty 1.05)");
  // --temperature 0 and --greedy: greedy whatever the file says; the file's penalty stays
  for (const bool use_greedy : {false, true}) {
    GenerationConfig g;
    if (use_greedy) g.do_sample = false; else g.temperature = 0;
    r = resolve_generate_options(g, qwen, f);
    EXPECT_FALSE(r.opts.do_sample) << use_greedy;
    EXPECT_EQ(r.opts.repetition_penalty, 1.05);
  }
  // --temperature > 0 samples over a greedy file; --do-sample takes the file's temperature
  flags = {};
  flags.temperature = 0.8;
  EXPECT_TRUE(resolve_generate_options(flags, {}, f).opts.do_sample);
  flags = {};
  flags.do_sample = true;
  r = resolve_generate_options(flags, qwen, f);
  EXPECT_TRUE(r.opts.do_sample);
  EXPECT_EQ(r.opts.temperature, 0.7);
  // contradictions and bad flags are named
  flags.temperature = 0;
  EXPECT_EQ(error_of([&] { resolve_generate_options(flags, {}, f); }),
            "generate: --do-sample contradicts --temperature 0 (--temperature 0 means greedy, > 0 sampling)");
  flags.do_sample = false;
  flags.temperature = 0.5;
  EXPECT_EQ(error_of([&] { resolve_generate_options(flags, {}, f); }),
            "generate: --greedy contradicts --temperature 0.5 (--temperature 0 means greedy, > 0 sampling)");
  flags = {};
  flags.top_p = 1.5;  // named even when greedy leaves it unused
  EXPECT_EQ(error_of([&] { resolve_generate_options(flags, {}, f); }), "generate: --top-p must be in (0, 1], got 1.5");
  flags = {};
  flags.temperature = -1;
  EXPECT_EQ(error_of([&] { resolve_generate_options(flags, {}, f); }),
            "generate: --temperature must be >= 0, got -1");
  // the file's temperature 0 with do_sample true: transformers refuses it, so do we (file and key)
  GenerationConfig zero = qwen;
  zero.temperature = 0;
  EXPECT_NE(error_of([&] { resolve_generate_options({}, zero, f); })
                .find(f + ": temperature: must be > 0 when sampling (do_sample true), got 0"),
            std::string::npos);
  zero.do_sample = false;
  EXPECT_FALSE(resolve_generate_options({}, zero, f).opts.do_sample);  // greedy: unused, as transformers
  // lengths: the file's max_new_tokens; else its max_length counts the prompt
  GenerationConfig len;
  len.max_length = 20;
  r = resolve_generate_options({}, len, f);
  EXPECT_EQ(r.new_tokens_for(15), 5);
  EXPECT_NE(error_of([&] { r.new_tokens_for(20); }).find(f + ": max_length: 20 leaves no new token after a 20-token "
                                                       "prompt"), std::string::npos);
  EXPECT_NE(r.summary.find(f + ": max_length 20 (prompt + new tokens)"), std::string::npos) << r.summary;
  len.max_new_tokens = 7;  // transformers: max_new_tokens takes precedence over max_length
  EXPECT_EQ(resolve_generate_options({}, len, f).new_tokens_for(15), 7);
  flags = {};
  flags.max_new_tokens = 3;  // the flag over both
  EXPECT_EQ(resolve_generate_options(flags, len, f).new_tokens_for(50), 3);
}

TEST(Generate, KvCacheMatchesFullRecompute) {
  QLORA_REQUIRE_FIXTURE(dir, "models/qwen2_bias");
  LlamaModel m = LlamaModel::load(dir.string(), torch::kFloat32, torch::kCPU);
  torch::NoGradGuard ng;
  torch::Tensor ids = torch::randint(3, 500, {1, 10}, torch::kLong);
  torch::Tensor full = m.forward({ids, {}, {}, {}});
  KVCache cache;
  torch::Tensor a = m.forward({ids.slice(1, 0, 6), {}, {}, {}}, &cache);
  torch::Tensor b = m.forward({ids.slice(1, 6, 10), {}, {}, {}}, &cache);
  EXPECT_LE((torch::cat({a, b}, 1) - full).abs().max().item<double>(), 1e-5);
}

TEST(Model, PackedSegmentsEqualSeparateSequences) {
  QLORA_REQUIRE_FIXTURE(dir, "models/llama_gqa");
  LlamaModel m = LlamaModel::load(dir.string(), torch::kFloat32, torch::kCPU);
  torch::NoGradGuard ng;
  torch::Tensor a = torch::randint(3, 500, {1, 5}, torch::kLong), b = torch::randint(3, 500, {1, 7}, torch::kLong);
  torch::Tensor packed = torch::cat({a, b}, 1);
  torch::Tensor seg = torch::cat({torch::full({1, 5}, 1, torch::kLong), torch::full({1, 7}, 2, torch::kLong)}, 1);
  torch::Tensor pos = torch::cat({torch::arange(5), torch::arange(7)}).unsqueeze(0);
  torch::Tensor lp = m.forward({packed, {}, pos, seg});
  torch::Tensor la = m.forward({a, {}, {}, {}}), lb = m.forward({b, {}, {}, {}});
  EXPECT_LE((lp - torch::cat({la, lb}, 1)).abs().max().item<double>(), 1e-4);
}

TEST(ModelConfig, RejectsUnsupportedArchitectureNamingTheField) {
  nlohmann::json j = {{"architectures", {"GPT2LMHeadModel"}}};
  try {
    parse_model_config(j, "x/config.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("x/config.json: field 'architectures'"), std::string::npos) << e.what();
  }
}

TEST(ModelConfig, MissingRequiredFieldNamesIt) {
  nlohmann::json j = {{"architectures", {"LlamaForCausalLM"}}, {"vocab_size", 10}};
  try {
    parse_model_config(j, "m/config.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "m/config.json: missing required field 'hidden_size'");
  }
}

// Sizes no model has are refused by name before anything is allocated (trial 27: num_hidden_layers
// 3,000,000 ran 33 s into std::bad_alloc).
TEST(ModelConfig, AbsurdSizesAreRefusedByName) {
  const nlohmann::json ok = {{"architectures", {"LlamaForCausalLM"}}, {"vocab_size", 10}, {"hidden_size", 8},
                             {"intermediate_size", 16}, {"num_hidden_layers", 1}, {"num_attention_heads", 2}};
  EXPECT_NO_THROW(parse_model_config(ok, "m/config.json"));
  nlohmann::json j = ok;
  j["num_hidden_layers"] = 3000000;
  EXPECT_EQ(error_of([&] { parse_model_config(j, "m/config.json"); }),
            "m/config.json: field 'num_hidden_layers' is 3000000, above the 10000 this program accepts (no model "
            "has so many; a corrupt config.json?)");
  j = ok;
  j["num_hidden_layers"] = 10000;  // the bound itself is accepted
  EXPECT_NO_THROW(parse_model_config(j, "m/config.json"));
  for (const char* field : {"vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
                            "max_position_embeddings"}) {
    j = ok;
    j[field] = int64_t{1} << 40;
    EXPECT_NE(error_of([&] { parse_model_config(j, "m/config.json"); })
                  .find(std::string("m/config.json: field '") + field + "' is 1099511627776, above the "),
              std::string::npos) << field;
  }
}

TEST(ModelConfig, UnsupportedRopeTypeIsAnError) {
  nlohmann::json j = {{"architectures", {"LlamaForCausalLM"}}, {"vocab_size", 10}, {"hidden_size", 8},
                      {"intermediate_size", 16}, {"num_hidden_layers", 1}, {"num_attention_heads", 2},
                      {"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}}};
  EXPECT_THROW(parse_model_config(j, "c.json"), Error);
}

nlohmann::json qwen3_json() {
  return {{"architectures", {"Qwen3ForCausalLM"}}, {"vocab_size", 100}, {"hidden_size", 64},
          {"intermediate_size", 128}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
          {"num_key_value_heads", 2}, {"tie_word_embeddings", true}};
}

// Qwen3's config class defaults: head_dim 128 (not hidden / heads), no bias, q/k norm; the parameter
// count includes q_norm / k_norm and counts the tied embedding once; to_hf_json round-trips.
TEST(ModelConfig, Qwen3DefaultsAndRoundTrip) {
  ModelConfig c = parse_model_config(qwen3_json(), "q/config.json");
  EXPECT_EQ(c.model_type, "qwen3");
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.attention_bias || c.qkv_bias || c.mlp_bias);
  const int64_t q = 4 * 128, kv = 2 * 128;
  const int64_t layer = 64 * q * 2 + 64 * kv * 2 + 3 * 64 * 128 + 2 * 64 + 2 * 128;
  EXPECT_EQ(c.num_parameters(), 100 * 64 + 2 * layer + 64);
  ModelConfig back = parse_model_config(c.to_hf_json(), "round trip");
  EXPECT_EQ(back.num_parameters(), c.num_parameters());
  EXPECT_EQ(back.head_dim, 128);
  EXPECT_TRUE(back.qk_norm && back.tie_word_embeddings);
}

TEST(ModelConfig, QwenSlidingWindowLayersAreRefusedByName) {
  nlohmann::json j = qwen3_json();
  j["layer_types"] = {"full_attention", "sliding_attention"};
  EXPECT_NE(error_of([&] { parse_model_config(j, "q/config.json"); })
                .find("q/config.json: field 'layer_types': \"sliding_attention\" is not supported"),
            std::string::npos);
  j = qwen3_json();
  j["use_sliding_window"] = true;
  EXPECT_NE(error_of([&] { parse_model_config(j, "q/config.json"); }).find("field 'use_sliding_window'"),
            std::string::npos);
}

// Fields transformers honours that change the model: "swish" is SiLU (ACT2FN), so accepted;
// partial_rotary_factor < 1 (top level or in rope_parameters) is refused by name, not run with full
// rotary as before; attention_dropout is read (the trainer warns that it is not applied) and
// checked (trial 22).
TEST(ModelConfig, SwishPartialRotaryAndAttentionDropout) {
  nlohmann::json j = qwen3_json();
  j["hidden_act"] = "swish";
  EXPECT_EQ(parse_model_config(j, "q/config.json").num_parameters(), parse_model_config(qwen3_json(), "q").num_parameters());
  j["hidden_act"] = "gelu";
  EXPECT_NE(error_of([&] { parse_model_config(j, "q/config.json"); })
                .find("q/config.json: field 'hidden_act': 'gelu' is not supported (only silu, or its alias swish)"),
            std::string::npos);
  j = qwen3_json();
  j["partial_rotary_factor"] = 0.5;
  EXPECT_NE(error_of([&] { parse_model_config(j, "q/config.json"); })
                .find("q/config.json: field 'partial_rotary_factor': 0.5 is not supported"),
            std::string::npos);
  j = qwen3_json();
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}, {"partial_rotary_factor", 0.25}};
  EXPECT_NE(error_of([&] { parse_model_config(j, "q/config.json"); })
                .find("field 'rope_parameters.partial_rotary_factor': 0.25 is not supported"),
            std::string::npos);
  j["rope_parameters"]["partial_rotary_factor"] = 1.0;
  EXPECT_EQ(parse_model_config(j, "q/config.json").rope.theta, 1e6);
  j = qwen3_json();
  j["attention_dropout"] = 0.3;
  EXPECT_EQ(parse_model_config(j, "q/config.json").attention_dropout, 0.3);
  j["attention_dropout"] = 1.0;
  EXPECT_NE(error_of([&] { parse_model_config(j, "q/config.json"); }).find("field 'attention_dropout' must be in [0, 1)"),
            std::string::npos);
}

TEST(ModelConfig, PresetsRoundTripThroughHfJson) {
  for (const auto& name : preset_names()) {
    ModelConfig c = preset_config(name);
    ModelConfig back = parse_model_config(c.to_hf_json(), name);
    EXPECT_EQ(back.num_parameters(), c.num_parameters()) << name;
  }
  EXPECT_NEAR(preset_config("llama2-7b").num_parameters() / 1e9, 6.74, 0.01);
}

}  // namespace
}  // namespace qlora
