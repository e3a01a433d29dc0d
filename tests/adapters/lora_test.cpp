// LoRA init/scale/targeting as PEFT does it, and the PEFT directory round trip with its errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "adapters/lora.h"
#include "adapters/peft.h"
#include "common/error.h"
#include "common/tensor_io.h"
#include "test_util.h"

namespace qlora {
namespace {
namespace fs = std::filesystem;

/// LoraOptions with rank `r` and alpha `alpha`, the rest default.
LoraOptions rank_alpha(int64_t r, double alpha) {
  LoraOptions o;
  o.r = r;
  o.alpha = alpha;
  return o;
}

TEST(Lora, InitIsPeftKaimingUniformAndZeroB) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  LoraAdapter a = LoraAdapter::create(400, 300, rank_alpha(8, 16), gen, torch::kCPU);
  EXPECT_EQ(a.A.sizes(), (std::vector<int64_t>{8, 400}));
  EXPECT_EQ(a.B.sizes(), (std::vector<int64_t>{300, 8}));
  EXPECT_TRUE(a.A.requires_grad() && a.B.requires_grad());
  EXPECT_EQ(a.B.abs().max().item<float>(), 0.f);
  const double bound = 1.0 / std::sqrt(400.0);
  EXPECT_LE(a.A.abs().max().item<double>(), bound);
  EXPECT_GT(a.A.abs().max().item<double>(), 0.95 * bound);  // 3200 draws reach near the bound
  EXPECT_NEAR(a.A.mean().item<double>(), 0.0, 0.05 * bound);
  EXPECT_DOUBLE_EQ(a.scale, 2.0);
  // same seed, same weights
  auto gen2 = at::make_generator<at::CPUGeneratorImpl>(3);
  EXPECT_TRUE(torch::equal(LoraAdapter::create(400, 300, rank_alpha(8, 16), gen2, torch::kCPU).A, a.A));
}

TEST(Lora, ScaleAndRslora) {
  EXPECT_DOUBLE_EQ(lora_scale(16, 32, false), 2.0);
  EXPECT_DOUBLE_EQ(lora_scale(16, 32, true), 8.0);
}

TEST(Lora, DeltaIsScaledBA) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  LoraAdapter a = LoraAdapter::create(6, 5, rank_alpha(2, 4), gen, torch::kCPU);
  torch::NoGradGuard ng;
  a.B.normal_();
  torch::Tensor x = torch::randn({3, 6});
  torch::Tensor want = 2.0 * x.matmul(a.A.t()).matmul(a.B.t());
  EXPECT_TRUE(torch::allclose(a.delta(x, false), want, 1e-6, 1e-6));
}

TEST(Lora, BadArgumentsThrow) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  EXPECT_THROW(LoraAdapter::create(4, 4, rank_alpha(0, 1), gen, torch::kCPU), Error);
  EXPECT_THROW(LoraAdapter::create(4, 4, rank_alpha(2, -1), gen, torch::kCPU), Error);
  LoraOptions full_dropout = rank_alpha(2, 1);
  full_dropout.dropout = 1.0;
  EXPECT_THROW(LoraAdapter::create(4, 4, full_dropout, gen, torch::kCPU), Error);
}

TEST(Lora, TargetMatchingFollowsPeft) {
  const std::string q = "model.layers.3.self_attn.q_proj";
  EXPECT_TRUE(lora_targets_module(q, {"q_proj"}));
  EXPECT_TRUE(lora_targets_module(q, {"self_attn.q_proj"}));
  EXPECT_TRUE(lora_targets_module(q, {"all-linear"}));
  EXPECT_FALSE(lora_targets_module(q, {"v_proj"}));
  EXPECT_FALSE(lora_targets_module(q, {"_proj"}));
  EXPECT_FALSE(lora_targets_module("lm_head", {"all-linear"}));
  EXPECT_TRUE(lora_targets_module("model.layers.0.mlp.down_proj", {"all-linear"}));
}

LoraWeights sample(int64_t r) {
  LoraWeights w;
  w["model.layers.0.self_attn.q_proj"] = {torch::randn({r, 8}), torch::randn({8, r})};
  w["model.layers.0.self_attn.v_proj"] = {torch::randn({r, 8}), torch::randn({4, r})};
  return w;
}
const std::map<std::string, std::pair<int64_t, int64_t>> kExpected = {
    {"model.layers.0.self_attn.q_proj", {8, 8}}, {"model.layers.0.self_attn.v_proj", {8, 4}}};

/// An adapter directory read as eval / generate / merge read it: config, then tensors.
LoraWeights read_adapter(const fs::path& dir, const ModuleShapes& expected) {
  return load_peft_adapter(dir.string(), read_peft_config(dir.string()), expected, kSelectedByAdapterConfig);
}

TEST(Peft, RoundTrip) {
  const test::TempDir tmp("lora_rt");  // removed when the test ends, pass or fail
  const fs::path d = tmp.path / "adapter";  // not created: save_peft_adapter makes it
  PeftConfig c;
  c.r = 2;
  c.lora_alpha = 4;
  c.target_modules = {"q_proj", "v_proj"};
  LoraWeights w = sample(2);
  save_peft_adapter(d.string(), c, w);
  st::SafetensorsFile f((d / "adapter_model.safetensors").string());
  EXPECT_TRUE(f.contains("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"));
  const PeftConfig back = read_peft_config(d.string());
  LoraWeights got = load_peft_adapter(d.string(), back, kExpected, kSelectedByAdapterConfig);
  EXPECT_EQ(back.r, 2);
  EXPECT_EQ(back.target_modules, c.target_modules);
  for (const auto& [m, ab] : w) {
    EXPECT_TRUE(torch::equal(got.at(m).first, ab.first)) << m;
    EXPECT_TRUE(torch::equal(got.at(m).second, ab.second)) << m;
  }
}

// adapter_config.json's lora_alpha is written as PEFT writes it: an integer for an integral alpha
// (PEFT's fixture file says "lora_alpha": 8; Ollama's converter refuses 8.0 for its uint32), a
// float otherwise (trial 15).
TEST(Peft, LoraAlphaIsWrittenAsPeftWritesIt) {
  QLORA_REQUIRE_FIXTURE(peft_made, "peft/adapter_init/adapter_config.json");
  const nlohmann::json theirs = nlohmann::json::parse(std::ifstream(peft_made));
  ASSERT_TRUE(theirs.at("lora_alpha").is_number_integer()) << theirs.at("lora_alpha");
  const test::TempDir tmp("lora_alpha");
  for (const double alpha : {8.0, 32.0, 0.5}) {
    const fs::path d = tmp.path / ("a" + std::to_string(static_cast<int>(alpha * 10)));
    PeftConfig c;
    c.r = 2;
    c.lora_alpha = alpha;
    c.target_modules = {"q_proj", "v_proj"};
    save_peft_adapter(d.string(), c, sample(2));
    const nlohmann::json ours = nlohmann::json::parse(std::ifstream(d / "adapter_config.json"));
    EXPECT_EQ(ours.at("lora_alpha").is_number_integer(), alpha != 0.5) << ours.at("lora_alpha");
    if (alpha == 8.0) {
      EXPECT_EQ(ours.at("lora_alpha").dump(), theirs.at("lora_alpha").dump());
    }
    EXPECT_EQ(read_peft_config(d.string()).lora_alpha, alpha);
  }
}

TEST(Peft, RefusesEmptyAndListsMismatches) {
  const test::TempDir tmp("lora_bad");  // removed when the test ends, pass or fail
  const fs::path d = tmp.path / "adapter";  // not created: save_peft_adapter makes it
  PeftConfig c;
  c.r = 2;
  EXPECT_THROW(save_peft_adapter(d.string(), c, {}), Error);
  EXPECT_FALSE(fs::exists(d / "adapter_config.json"));
  save_peft_adapter(d.string(), c, sample(2));
  // the model expects a module the adapter lacks, and the adapter has one the model lacks
  std::map<std::string, std::pair<int64_t, int64_t>> other = {{"model.layers.0.self_attn.q_proj", {8, 8}},
                                                              {"model.layers.1.self_attn.q_proj", {8, 8}}};
  try {
    read_adapter(d, other);
    FAIL();
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("missing key 'base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight'"), std::string::npos) << m;
    EXPECT_NE(m.find("unexpected key 'base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight' (not a module of "
                     "this model that adapter_config.json's target_modules selects)"),
              std::string::npos)
        << m;
  }
  // wrong shape
  std::map<std::string, std::pair<int64_t, int64_t>> wide = kExpected;
  wide["model.layers.0.self_attn.q_proj"] = {16, 8};
  EXPECT_THROW(read_adapter(d, wide), Error);
  // not LoRA
  std::ofstream(d / "adapter_config.json") << R"({"peft_type": "IA3", "r": 2})";
  EXPECT_THROW(read_adapter(d, kExpected), Error);
  // PEFT LoraConfig fields that would change the result and are not implemented: one line naming the
  // field, never ignored (modules_to_save's tensors once surfaced as an "unexpected key").
  const std::string cfg = (d / "adapter_config.json").string();
  const std::map<std::string, std::string> refused = {
      {R"("modules_to_save": ["lm_head"])",
       cfg + ": field 'modules_to_save' is [\"lm_head\"]: not supported (whole trained copies of modules, as PEFT's "
             "modules_to_save and Axolotl's lora_modules_to_save save them beside the LoRA tensors; only lora_A / "
             "lora_B are read)"},
      {R"("bias": "lora_only")", cfg + ": field 'bias': only \"none\" is supported, got \"lora_only\""},
      {R"("use_dora": true)", cfg + ": field 'use_dora' is true: not supported"},
      {R"("rank_pattern": {"q_proj": 4})",
       cfg + ": field 'rank_pattern' is not empty: per-module ranks / alphas are not supported"},
  };
  for (const auto& [field, want] : refused) {
    std::ofstream(d / "adapter_config.json") << R"({"peft_type": "LORA", "r": 2, "lora_alpha": 4, )" << field << "}";
    try {
      read_adapter(d, kExpected);
      ADD_FAILURE() << field;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), want);
    }
  }
  // Their empty values, as PEFT writes them by default, are read.
  std::ofstream(d / "adapter_config.json")
      << R"({"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q_proj", "v_proj"], )"
      << R"("modules_to_save": null, "bias": "none", "use_dora": false, "rank_pattern": {}, "alpha_pattern": {}})";
  EXPECT_EQ(read_adapter(d, kExpected).size(), kExpected.size());
  // An adapter saved with safe_serialization=False: the pickle is named, not read.
  {
    const fs::path bin = tmp.path / "bin";
    fs::create_directories(bin);
    fs::copy_file(d / "adapter_config.json", bin / "adapter_config.json");
    std::ofstream(bin / "adapter_model.bin") << "PK";
    try {
      read_adapter(bin, kExpected);
      ADD_FAILURE() << "adapter_model.bin only";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), (bin / "adapter_model.safetensors").string() +
                                           ": not found (adapter_model.bin is there: a pickle, which is not read; "
                                           "save the adapter with PEFT's default safe_serialization=True, or convert "
                                           "it with safetensors.torch.save_file)");
    }
  }
}

}  // namespace
}  // namespace qlora
