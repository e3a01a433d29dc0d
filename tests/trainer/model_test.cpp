// Logits parity with transformers on tiny random models built by tests/fixtures/make_models.py,
// padded batches (left vs right), and greedy generation token for token.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "common/error.h"
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
  g.temperature = 1.7;
  g.top_k = 1;
  g.seed = 123;
  EXPECT_EQ(generate_tokens(m, prompt, g), j["new_ids"].get<std::vector<int64_t>>());
}

// Stop strings as transformers' stop_strings (StopStringCriteria): generation ends at the token that
// completes the string (here spanning new tokens 6..8), which is kept; EOS ids and the length give
// the other finish reasons.
TEST(Generate, StopStringsEosAndLengthEndGenerationAsTransformers) {
  QLORA_REQUIRE_FIXTURE(dir, "models/llama_gqa/generate_ref.json");
  const auto j = nlohmann::json::parse(std::ifstream(dir));
  const auto& ref = j["stop"];
  LlamaModel m = LlamaModel::load(dir.parent_path().string(), torch::kFloat32, torch::kCPU);
  const data::Tokenizer tok = data::Tokenizer::from_pretrained(dir.parent_path().string());
  const DecodeFn decode = [&](const std::vector<int64_t>& ids) {
    return tok.decode(data::TokenIds(ids.begin(), ids.end()));
  };
  const auto prompt = j["prompt_ids"].get<std::vector<int64_t>>();
  const auto greedy = j["new_ids"].get<std::vector<int64_t>>();
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
