// LoRA / QLoRA training against PEFT (fixtures from tests/fixtures/make_peft_refs.py): loss, every
// lora_A / lora_B gradient and the adapter after 5 AdamW steps for a 16-bit and an NF4 base;
// gradient checkpointing on vs off (with and without LoRA dropout); gradient accumulation
// (4 rows × 1 vs 1 row × 4); the PEFT adapter round trip both ways; `qlora merge`.
//
// Tolerances. Everything runs in fp32 on the CPU. Our decoder and transformers' differ in op order
// (attention: at::scaled_dot_product_attention with our mask vs transformers' sdpa call; the CE:
// our chunked fused CE vs F.cross_entropy; matmul blocking), so each value differs by a few fp32
// ulps times the depth of the computation. Measured (printed by each test): loss ≲ 2e-7 relative,
// gradients ≲ 1.2e-6 of the tensor's largest entry (fp32 and NF4 base), weights after 5 steps
// ≲ 3e-7 absolute, logits 0 (adapter round trip) and ≲ 1.1e-6 (merged vs unmerged). Gradients are
// compared as max|g − g_ref| ≤ tol · max|g_ref| (per tensor, so a tensor with small gradients is not
// judged against a global scale), tol = 1e-4: two orders above the measured noise and three below
// a real bug (a wrong scale, a missing term or a transposed factor changes gradients by O(1)). After
// 5 AdamW steps the weights are compared absolutely: each step moves a weight by ≈ lr = 1e-3 (Adam
// normalises the gradient), so the step size amplifies a relative gradient error ε to ≈ lr·ε per
// step; 5 steps of 1e-4 relative error stay below 5e-7; tol 1e-5 (1% of one step).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>

#include <ATen/CPUGeneratorImpl.h>

#include "adapters/lora.h"
#include "adapters/peft.h"
#include "common/error.h"
#include "common/files.h"
#include "common/tensor_io.h"
#include "test_util.h"
#include "trainer/batch_tensors.h"
#include "cli/commands.h"
#include "adapters/merge.h"
#include "model/model.h"
#include "trainer/train.h"
#include "peft_parity.h"

namespace qlora {
namespace {
using namespace peft_test;
using json = nlohmann::json;

constexpr double kGradTol = 1e-4;    // relative to the tensor's max |g_ref|
constexpr double kStateTol = 1e-5;   // absolute, adapter weights after 5 AdamW steps
constexpr double kLogitTol = 1e-4;   // absolute, fp32 logits (|logits| ≲ 1)

const std::vector<std::string> kTargets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

/// The fixtures' LoraConfig (make_peft_refs.py: r=4, lora_alpha=8, lora_dropout=0) on `targets`,
/// drawn from `seed`.
LoraOptions fixture_lora(const std::vector<std::string>& targets, uint64_t seed) {
  LoraOptions o;
  o.r = 4;
  o.alpha = 8;
  o.target_modules = targets;
  o.seed = seed;
  return o;
}

// ---------------------------------------------------------------------------------------------
// Gradient parity with PEFT

/// Loss, every gradient at step 0, the loss of each of 5 AdamW steps and the weights after them,
/// against transformers + PEFT (torch.optim.AdamW) on `base` with the fixture's initial adapter.
struct ParityRun {
  std::string adapter = "adapter_init";  ///< initial adapter dir under peft/
  double weight_decay = 0.0;             ///< AdamW weight decay
  double max_grad_norm = 0.0;            ///< clip (0: none); the fixture's grad_norms are pre-clip
};

/// `family`: "" (the Llama runs) or "qwen2" / "qwen3" (peft/<family>/, same layout).
void check_peft_parity(const std::string& base, const std::string& ref_file, const std::string& label,
                       const ParityRun& run = {}, const std::string& family = "") {
  QLORA_REQUIRE_FIXTURE(root, family.empty() ? std::string("peft") : "peft/" + family);
  const Refs ref = load_refs(root / ref_file);
  LlamaModel m = with_adapter(root / base, root / run.adapter);
  m.training = true;
  const data::Batch b = to_batch(ref.at("input_ids"), ref.at("labels"), ref.at("attention_mask"));

  Refs g;
  const double loss = loss_and_grads(m, {b}, &g);
  const double ref_loss = ref.at("loss").item<double>();
  EXPECT_NEAR(loss, ref_loss, 1e-5 * std::abs(ref_loss)) << label;
  ASSERT_EQ(g.size(), 2u * 7 * 2) << label;  // 2 layers × 7 modules × {A, B}
  double worst = 0;
  std::string worst_name;
  for (const auto& [name, t] : g) {
    const torch::Tensor& r = ref.at(name + ".grad");
    ASSERT_EQ(t.sizes(), r.sizes()) << name;
    ASSERT_GT(max_abs(r), 0) << name << ": the fixture's gradient is zero (B must be non-zero)";
    const double rel = max_diff(t, r) / max_abs(r);
    EXPECT_LE(rel, kGradTol) << label << " " << name;
    if (rel > worst) worst = rel, worst_name = name;
  }

  auto opt = make_adamw(m.lora_parameters(), adamw_config(run.weight_decay));
  const torch::Tensor losses = ref.at("losses");
  const torch::Tensor norms = ref.at("grad_norms");
  double worst_loss = 0, worst_norm = 0;
  for (int s = 0; s < 5; ++s) {
    StepOptions so;
    so.lr = 1e-3;
    so.max_grad_norm = run.max_grad_norm;
    const StepResult r = train_step(m, *opt, {b}, so);
    ASSERT_FALSE(r.skipped);
    const double rl = losses[s].item<double>();
    EXPECT_NEAR(r.loss, rl, 1e-5 * std::abs(rl)) << label << " step " << s;
    worst_loss = std::max(worst_loss, std::abs(r.loss - rl) / std::abs(rl));
    const double rn = norms[s].item<double>();
    EXPECT_NEAR(r.grad_norm, rn, 1e-4 * rn) << label << " grad norm (before clipping) at step " << s;
    worst_norm = std::max(worst_norm, std::abs(r.grad_norm - rn) / rn);
    if (run.max_grad_norm > 0) {
      EXPECT_GT(rn, run.max_grad_norm) << label << ": step " << s << " was not clipped";
    }
  }
  double worst_w = 0, moved = 0;
  const LoraWeights init = with_adapter(root / base, root / run.adapter).lora_weights();
  for (const auto& [module, ab] : m.lora_weights()) {
    const double da = max_diff(ab.first, ref.at(module + ".lora_A.step5"));
    const double db = max_diff(ab.second, ref.at(module + ".lora_B.step5"));
    EXPECT_LE(da, kStateTol) << label << " " << module << ".lora_A";
    EXPECT_LE(db, kStateTol) << label << " " << module << ".lora_B";
    worst_w = std::max({worst_w, da, db});
    moved = std::max(moved, max_diff(ab.second, init.at(module).second));
  }
  EXPECT_GT(moved, 1e-3) << "the 5 steps did not move the adapter";
  std::cout << "[peft parity " << label << "] loss " << loss << " vs " << ref_loss << " (rel "
            << std::abs(loss - ref_loss) / ref_loss << "); worst grad rel " << worst << " (" << worst_name
            << "); worst step loss rel " << worst_loss << "; worst grad norm rel " << worst_norm
            << "; weights after 5 steps max |diff| " << worst_w
            << " (max move " << moved << ")\n";
}

TEST(LoraPeftParity, Fp32Base) { check_peft_parity("base", "ref_fp32.safetensors", "fp32"); }
TEST(LoraPeftParity, Nf4Base) { check_peft_parity("base_nf4", "ref_nf4.safetensors", "nf4"); }
// AdamW weight decay 0.1 (decoupled, torch.optim.AdamW) and clip_grad_norm_ to 0.05 at every step.
TEST(LoraPeftParity, WeightDecayAndClipping) {
  check_peft_parity("base", "ref_fp32_wd_clip.safetensors", "fp32 wd 0.1 clip 0.05",
                    ParityRun{"adapter_init", 0.1, 0.05});
}
// rsLoRA: scale alpha / sqrt(r), read from the PEFT adapter_config.json's use_rslora.
TEST(LoraPeftParity, RsLora) {
  QLORA_REQUIRE_FIXTURE(cfg, "peft/adapter_init_rslora/adapter_config.json");
  EXPECT_TRUE(read_peft_config(cfg.parent_path().string()).use_rslora);
  check_peft_parity("base", "ref_fp32_rslora.safetensors", "fp32 rslora", ParityRun{"adapter_init_rslora"});
}

// Qwen2 (q/k/v bias, tied embeddings) and Qwen3 (q_norm / k_norm, head_dim 32 != hidden/heads):
// same bars as the Llama runs. The NF4 bases are bitsandbytes checkpoints whose biases are fp32.
TEST(LoraPeftParity, Qwen2Fp32Base) { check_peft_parity("base", "ref_fp32.safetensors", "qwen2 fp32", {}, "qwen2"); }
TEST(LoraPeftParity, Qwen2Nf4Base) { check_peft_parity("base_nf4", "ref_nf4.safetensors", "qwen2 nf4", {}, "qwen2"); }
TEST(LoraPeftParity, Qwen3Fp32Base) { check_peft_parity("base", "ref_fp32.safetensors", "qwen3 fp32", {}, "qwen3"); }
TEST(LoraPeftParity, Qwen3Nf4Base) { check_peft_parity("base_nf4", "ref_nf4.safetensors", "qwen3 nf4", {}, "qwen3"); }

// Quantize-on-load of the 16-bit Qwen2 base gives bitsandbytes' bytes for every (bias-carrying)
// linear, and the biases stay in the compute dtype, equal to the stored fp32 values.
TEST(LoraPeftParity, Qwen2QuantizeOnLoadEqualsBitsandbytesAndKeepsBias) {
  QLORA_REQUIRE_FIXTURE(root, "peft/qwen2");
  QuantOptions q;
  q.quant_type = kernels::Quant4Type::NF4;
  const LlamaModel ours = LlamaModel::load((root / "base").string(), torch::kFloat32, torch::kCPU, q);
  const LlamaModel bnb = LlamaModel::load((root / "base_nf4").string(), torch::kFloat32, torch::kCPU);
  const LlamaModel plain = LlamaModel::load((root / "base").string(), torch::kFloat32, torch::kCPU);
  const auto lo = ours.linears(), lb = bnb.linears(), lp = plain.linears();
  int64_t with_bias = 0;
  for (size_t i = 0; i < lo.size(); ++i) {
    ASSERT_TRUE(lo[i]->quantized() && lb[i]->quantized()) << lo[i]->name;
    EXPECT_TRUE(torch::equal(lo[i]->qweight->packed, lb[i]->qweight->packed)) << lo[i]->name;
    EXPECT_TRUE(torch::equal(lo[i]->qweight->absmax_q, lb[i]->qweight->absmax_q)) << lo[i]->name;
    // The nested (fp32) constants come from a mean over the block absmaxes, whose summation order
    // differs from bitsandbytes' by fp32 ulps (measured: offsets print equal to 6 digits).
    EXPECT_TRUE(torch::allclose(lo[i]->qweight->nested_absmax, lb[i]->qweight->nested_absmax, 1e-6, 0))
        << lo[i]->name;
    EXPECT_NEAR(lo[i]->qweight->offset, lb[i]->qweight->offset, 1e-6 * std::abs(lb[i]->qweight->offset))
        << lo[i]->name;
    ASSERT_EQ(lo[i]->bias.defined(), lp[i]->bias.defined()) << lo[i]->name;
    if (!lo[i]->bias.defined()) continue;
    ++with_bias;
    EXPECT_EQ(lo[i]->bias.scalar_type(), torch::kFloat32) << lo[i]->name;
    EXPECT_TRUE(torch::equal(lo[i]->bias, lp[i]->bias)) << lo[i]->name;
    EXPECT_TRUE(torch::equal(lb[i]->bias, lp[i]->bias)) << lo[i]->name;
  }
  EXPECT_EQ(with_bias, 2 * 3);  // q/k/v of 2 layers
  EXPECT_TRUE(ours.lm_head.is_same(ours.embed_tokens));  // tied, 16-bit
}

// ---------------------------------------------------------------------------------------------
// Gradient checkpointing

// Standard init (B = 0): checkpointing changes nothing, bit for bit; at step 1 A's gradient is
// exactly zero (it is multiplied by B) and B's is not.
TEST(LoraCheckpointing, SameLossAndGradsStandardInit) {
  QLORA_REQUIRE_FIXTURE(root, "peft");
  const Refs ref = load_refs(root / "ref_fp32.safetensors");
  const data::Batch b = to_batch(ref.at("input_ids"), ref.at("labels"), ref.at("attention_mask"));
  LlamaModel m = LlamaModel::load((root / "base").string(), torch::kFloat32, torch::kCPU);
  m.add_lora(fixture_lora({"all-linear"}, 7));
  m.training = true;
  Refs off, on;
  const double l_off = loss_and_grads(m, {b}, &off);
  m.gradient_checkpointing = true;
  const double l_on = loss_and_grads(m, {b}, &on);
  EXPECT_EQ(l_off, l_on);
  double worst = 0;
  for (const auto& [name, t] : off) {
    worst = std::max(worst, max_diff(t, on.at(name)));
    if (name.size() > 7 && name.substr(name.size() - 7) == ".lora_A") {
      EXPECT_EQ(max_abs(t), 0.0) << name << ": A's gradient must be zero while B = 0";
    } else {
      EXPECT_GT(max_abs(t), 0.0) << name << ": B's gradient must be non-zero at step 1";
    }
  }
  EXPECT_EQ(worst, 0.0) << "checkpointing changed a gradient";
}

// LoRA dropout 0.1 in train mode: the recompute restores the RNG state, so the dropout masks and
// therefore the gradients are identical; another seed gives other gradients (dropout is live).
TEST(LoraCheckpointing, DropoutSameGradsWithRngRestore) {
  QLORA_REQUIRE_FIXTURE(root, "peft");
  const Refs ref = load_refs(root / "ref_fp32.safetensors");
  const data::Batch b = to_batch(ref.at("input_ids"), ref.at("labels"), ref.at("attention_mask"));
  LlamaModel m = LlamaModel::load((root / "base").string(), torch::kFloat32, torch::kCPU);
  LoraOptions lo = fixture_lora({"all-linear"}, 7);
  lo.dropout = 0.1;
  m.add_lora(lo);
  {
    torch::NoGradGuard ng;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
    for (FrozenLinear* f : m.linears()) f->lora->B.normal_(0, 0.05, gen);
  }
  m.training = true;
  Refs off, on, other;
  torch::manual_seed(123);
  const double l_off = loss_and_grads(m, {b}, &off);
  m.gradient_checkpointing = true;
  torch::manual_seed(123);
  const double l_on = loss_and_grads(m, {b}, &on);
  m.gradient_checkpointing = false;
  torch::manual_seed(124);
  loss_and_grads(m, {b}, &other);
  EXPECT_EQ(l_off, l_on);
  double worst = 0, diff_other = 0;
  for (const auto& [name, t] : off) {
    worst = std::max(worst, max_diff(t, on.at(name)));
    diff_other = std::max(diff_other, max_diff(t, other.at(name)) / max_abs(t));
  }
  EXPECT_EQ(worst, 0.0) << "checkpointing with dropout changed a gradient (RNG not restored?)";
  EXPECT_GT(diff_other, 1e-3) << "another seed gave the same gradients: dropout is not active";
}

// ---------------------------------------------------------------------------------------------
// Gradient accumulation

// One Batch of 4 rows (lengths 9, 6, 4, 7, right-padded to 9) vs four Batches of 1 row each (no
// padding): the same loss, gradients and update. Only summation order differs (fp32): loss
// relative 1e-6, gradients 1e-5 of the tensor's max, weights 1e-6 absolute (a step moves ≈ 1e-3;
// Adam's first step is lr·g/(|g| + eps) ≈ lr·sign(g), insensitive to relative noise in g unless
// |g| ≲ 1e-8).
TEST(LoraGradAccumulation, FourByOneEqualsOneByFour) {
  QLORA_REQUIRE_FIXTURE(root, "peft");
  const std::vector<int64_t> lens = {9, 6, 4, 7};
  const int64_t T = 9, prompt = 2;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  std::vector<torch::Tensor> rows;
  for (int64_t n : lens) rows.push_back(torch::randint(3, 512, {n}, gen, torch::kLong));
  auto make = [&](const std::vector<size_t>& which, int64_t len) {
    torch::Tensor ids = torch::zeros({(int64_t)which.size(), len}, torch::kLong);
    torch::Tensor mask = torch::zeros_like(ids);
    for (size_t i = 0; i < which.size(); ++i) {
      const int64_t n = lens[which[i]];
      ids[i].narrow(0, 0, n).copy_(rows[which[i]]);
      mask[i].narrow(0, 0, n).fill_(1);
    }
    torch::Tensor labels = ids.masked_fill(mask == 0, -100);
    labels.narrow(1, 0, prompt).fill_(-100);
    return to_batch(ids, labels, mask);
  };
  const data::Batch four = make({0, 1, 2, 3}, T);
  std::vector<data::Batch> ones;
  for (size_t i = 0; i < lens.size(); ++i) ones.push_back(make({i}, lens[i]));

  LlamaModel x = with_adapter(root / "base", root / "adapter_init");
  LlamaModel y = with_adapter(root / "base", root / "adapter_init");
  x.training = y.training = true;
  auto ox = make_adamw(x.lora_parameters(), adamw_config());
  auto oy = make_adamw(y.lora_parameters(), adamw_config());
  StepOptions so;
  so.lr = 1e-3;
  const StepResult rx = train_step(x, *ox, {four}, so);
  const StepResult ry = train_step(y, *oy, ones, so);
  EXPECT_EQ(rx.targets, ry.targets);
  EXPECT_NEAR(rx.loss, ry.loss, 1e-6 * rx.loss);
  const auto px = x.lora_parameters(), py = y.lora_parameters();
  ASSERT_EQ(px.size(), py.size());
  double worst_g = 0, worst_w = 0;
  for (size_t i = 0; i < px.size(); ++i) {
    const double rel = max_diff(px[i].grad(), py[i].grad()) / max_abs(px[i].grad());
    EXPECT_LE(rel, 1e-5) << "parameter " << i;
    EXPECT_LE(max_diff(px[i], py[i]), 1e-6) << "parameter " << i;
    worst_g = std::max(worst_g, rel);
    worst_w = std::max(worst_w, max_diff(px[i], py[i]));
  }
  std::cout << "[grad accumulation] loss " << rx.loss << " vs " << ry.loss << "; worst grad rel " << worst_g
            << "; worst weight |diff| after the step " << worst_w << "\n";
}

// ---------------------------------------------------------------------------------------------
// Adapter round trip

// An adapter saved by PEFT (after its 5 training steps) loads into qlora and gives PEFT's logits.
TEST(LoraAdapterRoundTrip, PeftSavedLoadsWithPeftLogits) {
  QLORA_REQUIRE_FIXTURE(root, "peft");
  const Refs ref = load_refs(root / "ref_fp32.safetensors");
  LlamaModel m = with_adapter(root / "base", root / "adapter_trained");
  const torch::Tensor ours = logits_of(m, ref);
  const double d = max_diff(ours, real(ref.at("logits"), ref));
  EXPECT_LE(d, kLogitTol);
  std::cout << "[PEFT adapter -> qlora] logits max |diff| " << d << "\n";
}

// bf16 inference with a trained adapter (eval, generate): PeftModel.from_pretrained keeps lora_A /
// lora_B in float32 (autocast_adapter_dtype=True, its default), computes the branch in float32 and
// rounds the sum to bf16 once. Ours gives those logits, not those of the adapter cast to bf16
// (autocast_adapter_dtype=False), which is what we computed before (trial 21: a bf16 adapter's
// greedy text differed from PeftModel's on 5 of 5 prompts).
TEST(LoraAdapterRoundTrip, Bf16InferenceComputesTheAdapterInFloat32AsPeft) {
  QLORA_REQUIRE_FIXTURE(refs, "peft/ref_bf16_infer.safetensors");
  const fs::path root = refs.parent_path();
  const Refs ref = load_refs(refs);
  LlamaModel m = LlamaModel::load((root / "base").string(), torch::kBFloat16, torch::kCPU);
  const PeftConfig pc = read_peft_config((root / "adapter_trained").string());
  m.set_lora(load_peft_adapter((root / "adapter_trained").string(), pc, m.lora_shapes(pc.target_modules),
                               kSelectedByAdapterConfig),
             lora_options(pc));
  const torch::Tensor ours = logits_of(m, ref);
  const torch::Tensor peft = real(ref.at("logits"), ref), cast = real(ref.at("logits_adapter_bf16"), ref);
  const int64_t n = ours.numel();
  const int64_t same_as_peft = ours.eq(peft).sum().item<int64_t>(), same_as_cast = ours.eq(cast).sum().item<int64_t>();
  std::cout << "[bf16 inference] of " << n << " logits, equal to PEFT's: " << same_as_peft
            << ", to the bf16-cast adapter's: " << same_as_cast << "; max |diff| " << max_diff(ours, peft) << " vs "
            << max_diff(ours, cast) << "\n";
  EXPECT_GE(same_as_peft, n - n / 1000);  // all 11264 equal when written; room for a CPU whose kernels sum otherwise
  EXPECT_LE(same_as_cast, n - n / 20);    // the other rounding differs visibly
}

// Our adapter (after a training step), saved with save_peft_adapter, loaded by PEFT onto the
// transformers model gives our logits.
TEST(LoraAdapterRoundTrip, OursLoadsIntoPeftWithOurLogits) {
  QLORA_REQUIRE_PYTHON();
  QLORA_REQUIRE_FIXTURE(root, "peft");
  const Refs ref = load_refs(root / "ref_fp32.safetensors");
  LlamaModel m = LlamaModel::load((root / "base").string(), torch::kFloat32, torch::kCPU);
  m.add_lora(fixture_lora(kTargets, 11));
  m.training = true;
  auto opt = make_adamw(m.lora_parameters(), adamw_config());
  const data::Batch b = to_batch(ref.at("input_ids"), ref.at("labels"), ref.at("attention_mask"));
  StepOptions so;
  so.lr = 1e-2;
  for (int s = 0; s < 3; ++s) train_step(m, *opt, {b}, so);  // A and B both non-zero now
  m.training = false;
  TempDir tmp("ours_to_peft");
  PeftConfig pc;
  pc.r = 4;
  pc.lora_alpha = 8;
  pc.target_modules = kTargets;
  pc.base_model_name_or_path = (root / "base").string();
  save_peft_adapter((tmp.path / "adapter").string(), pc, m.lora_weights());
  const torch::Tensor theirs = python_logits(root / "base", (tmp.path / "adapter").string(), ref, tmp.path);
  ASSERT_TRUE(theirs.defined());
  const torch::Tensor ours = logits_of(m, ref);
  const double d = max_diff(ours, theirs);
  EXPECT_LE(d, kLogitTol);
  // The adapter really changes the output (a no-op adapter would pass trivially).
  LlamaModel plain = LlamaModel::load((root / "base").string(), torch::kFloat32, torch::kCPU);
  EXPECT_GT(max_diff(logits_of(plain, ref), ours), 100 * kLogitTol);
  std::cout << "[qlora adapter -> PEFT] logits max |diff| " << d << "\n";
}

// ---------------------------------------------------------------------------------------------
// qlora merge

MergeOptions merge_opts(const fs::path& base, const fs::path& adapter, const fs::path& out, const std::string& dtype) {
  MergeOptions o;
  o.base_dir = base.string();
  o.adapter_dir = adapter.string();
  o.out_dir = out.string();
  o.dtype = dtype;
  return o;
}

// 16-bit base + PEFT's trained adapter: the merged dir (LlamaModel::load and transformers) gives
// base+adapter logits; config and tokenizer files as expected; a second merge into it is refused.
TEST(LoraMerge, Fp32BaseMatchesBasePlusAdapter) {
  QLORA_REQUIRE_FIXTURE(root, "peft");
  const Refs ref = load_refs(root / "ref_fp32.safetensors");
  TempDir tmp("merge_fp32");
  const fs::path out = tmp.path / "merged";
  cmd_merge(merge_opts(root / "base", root / "adapter_trained", out, "fp32"));
  EXPECT_TRUE(fs::exists(out / "model.safetensors"));
  EXPECT_TRUE(fs::exists(out / "tokenizer_config.json"));
  const json cfg = json::parse(read_file((out / "config.json").string()));
  EXPECT_FALSE(cfg.contains("quantization_config"));
  EXPECT_EQ(cfg.value("torch_dtype", ""), "float32");
  const torch::Tensor expect = logits_of(with_adapter(root / "base", root / "adapter_trained"), ref);
  const torch::Tensor merged = logits_of(LlamaModel::load(out.string(), torch::kFloat32, torch::kCPU), ref);
  const double d = max_diff(merged, expect);
  EXPECT_LE(d, kLogitTol);
  EXPECT_LE(max_diff(merged, real(ref.at("logits"), ref)), kLogitTol);  // and PEFT's own logits
  std::cout << "[merge fp32] merged vs base+adapter logits max |diff| " << d << "\n";
  const std::string err = error_of([&] { cmd_merge(merge_opts(root / "base", root / "adapter_trained", out, "fp32")); });
  EXPECT_NE(err.find("not empty"), std::string::npos) << err;
  {  // transformers on the merged directory
    QLORA_REQUIRE_PYTHON();
    const torch::Tensor hf = python_logits(out, "-", ref, tmp.path);
    ASSERT_TRUE(hf.defined());
    EXPECT_LE(max_diff(hf, expect), kLogitTol);
    std::cout << "[merge fp32] transformers on the merged dir vs our base+adapter max |diff| " << max_diff(hf, expect)
              << "\n";
  }
}

// NF4 (bitsandbytes) base: dequantized, merged, written in 16 bits without quantization_config;
// matches our NF4 base + adapter.
TEST(LoraMerge, Nf4BaseDequantizesAndMatches) {
  QLORA_REQUIRE_FIXTURE(root, "peft");
  const Refs ref = load_refs(root / "ref_nf4.safetensors");
  TempDir tmp("merge_nf4");
  const fs::path out = tmp.path / "merged";
  cmd_merge(merge_opts(root / "base_nf4", root / "adapter_trained", out, "fp32"));
  const json cfg = json::parse(read_file((out / "config.json").string()));
  EXPECT_FALSE(cfg.contains("quantization_config"));
  const torch::Tensor expect = logits_of(with_adapter(root / "base_nf4", root / "adapter_trained"), ref);
  const torch::Tensor merged = logits_of(LlamaModel::load(out.string(), torch::kFloat32, torch::kCPU), ref);
  const double d = max_diff(merged, expect);
  EXPECT_LE(d, kLogitTol);
  std::cout << "[merge nf4] merged vs nf4 base+adapter logits max |diff| " << d << "\n";
  {  // transformers on the merged directory
    QLORA_REQUIRE_PYTHON();
    const torch::Tensor hf = python_logits(out, "-", ref, tmp.path);
    ASSERT_TRUE(hf.defined());
    EXPECT_LE(max_diff(hf, expect), kLogitTol);
  }
}

// Tied embeddings, sharded output (a 100 kB shard limit): index + shards, no lm_head tensor, and
// the logits of base + adapter; bf16 output stays within bf16 rounding.
TEST(LoraMerge, TiedEmbeddingsShardedOutput) {
  QLORA_REQUIRE_FIXTURE(root, "peft");
  const Refs ref = load_refs(root / "ref_fp32.safetensors");
  TempDir tmp("merge_tied");
  LlamaModel m = LlamaModel::load((root / "base_tied").string(), torch::kFloat32, torch::kCPU);
  m.add_lora(fixture_lora(kTargets, 5));
  {
    torch::NoGradGuard ng;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
    for (FrozenLinear* f : m.linears()) f->lora->B.normal_(0, 0.05, gen);
  }
  PeftConfig pc;
  pc.r = 4;
  pc.lora_alpha = 8;
  pc.target_modules = kTargets;
  save_peft_adapter((tmp.path / "adapter").string(), pc, m.lora_weights());
  MergeOptions o = merge_opts(root / "base_tied", tmp.path / "adapter", tmp.path / "merged", "fp32");
  o.max_shard_bytes = 100'000;
  cmd_merge(o);
  const fs::path out = tmp.path / "merged";
  ASSERT_TRUE(fs::exists(out / "model.safetensors.index.json"));
  const json idx = json::parse(read_file((out / "model.safetensors.index.json").string()));
  EXPECT_FALSE(idx["weight_map"].contains("lm_head.weight"));
  std::set<std::string> shards;
  for (const auto& [k, v] : idx["weight_map"].items()) shards.insert(v.get<std::string>());
  EXPECT_GT(shards.size(), 1u);
  const torch::Tensor expect = logits_of(m, ref);
  const torch::Tensor merged = logits_of(LlamaModel::load(out.string(), torch::kFloat32, torch::kCPU), ref);
  EXPECT_LE(max_diff(merged, expect), kLogitTol);
  std::cout << "[merge tied, " << shards.size() << " shards] logits max |diff| " << max_diff(merged, expect) << "\n";
  {  // transformers on the merged directory
    QLORA_REQUIRE_PYTHON();
    const torch::Tensor hf = python_logits(out, "-", ref, tmp.path);
    ASSERT_TRUE(hf.defined());
    EXPECT_LE(max_diff(hf, expect), kLogitTol);
  }
  // bf16: every weight rounded once (relative 2^-9), logits within a loose bound.
  ::testing::internal::CaptureStdout();  // spdlog's default logger (this binary calls no log::setup)
  ::testing::internal::CaptureStderr();  // the CLI's (log::setup: stderr)
  cmd_merge(merge_opts(root / "base_tied", tmp.path / "adapter", tmp.path / "merged_bf16", "bf16"));
  const std::string log_text = ::testing::internal::GetCapturedStderr() + ::testing::internal::GetCapturedStdout();
  EXPECT_NE(log_text.find("merge: W + s·B·A is rounded to bfloat16"), std::string::npos) << log_text;
  const json cfg = json::parse(read_file((tmp.path / "merged_bf16" / "config.json").string()));
  EXPECT_EQ(cfg.value("torch_dtype", ""), "bfloat16");
  EXPECT_TRUE(cfg.value("tie_word_embeddings", false));  // the merged model stays tied
  // the base's RoPE base also as transformers 4's top-level rope_theta, which GGUF converters read
  // (transformers 5 saved the base with rope_parameters only; trial 15: llama.cpp's older
  // convert_hf_to_gguf.py then wrote no freq_base and the model ran at 10000)
  const json base_cfg = json::parse(read_file((root / "base_tied" / "config.json").string()));
  ASSERT_TRUE(base_cfg.contains("rope_parameters"));
  EXPECT_EQ(cfg.at("rope_theta"), base_cfg["rope_parameters"]["rope_theta"]);
  EXPECT_TRUE(json::parse(read_file((out / "config.json").string())).value("tie_word_embeddings", false));
  {
    st::SafetensorsFile f((tmp.path / "merged_bf16" / "model.safetensors").string());
    bool has_embed = false;
    for (const st::TensorInfo& t : f.tensors()) {
      EXPECT_NE(t.name, "lm_head.weight");
      has_embed = has_embed || t.name == "model.embed_tokens.weight";
    }
    EXPECT_TRUE(has_embed);
  }
  const torch::Tensor mb = logits_of(LlamaModel::load((tmp.path / "merged_bf16").string(), torch::kFloat32,
                                                      torch::kCPU), ref);
  EXPECT_LE(max_diff(mb, expect), 0.05);
}

// A LoRA on lm_head: refused with a clear error (tied: it would change the embeddings too).
TEST(LoraMerge, RefusesLmHeadAdapter) {
  QLORA_REQUIRE_FIXTURE(root, "peft");
  TempDir tmp("merge_lm_head");
  LlamaModel m = LlamaModel::load((root / "base_tied").string(), torch::kFloat32, torch::kCPU);
  m.add_lora(fixture_lora({"q_proj"}, 5));
  PeftConfig pc;
  pc.r = 4;
  pc.lora_alpha = 8;
  pc.target_modules = {"q_proj", "lm_head"};
  save_peft_adapter((tmp.path / "adapter").string(), pc, m.lora_weights());
  std::string err = error_of([&] {
    cmd_merge(merge_opts(root / "base_tied", tmp.path / "adapter", tmp.path / "out", "fp32"));
  });
  EXPECT_NE(err.find("lm_head"), std::string::npos) << err;
  EXPECT_NE(err.find("tie"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(tmp.path / "out"));
  err = error_of([&] { cmd_merge(merge_opts(root / "base", tmp.path / "adapter", tmp.path / "out", "fp32")); });
  EXPECT_NE(err.find("lm_head"), std::string::npos) << err;
  // PEFT's modules_to_save: a whole lm_head saved beside the LoRA tensors is not "a LoRA on lm_head"
  // (a trial's merge said so); it is refused by its field, as eval and generate refuse it.
  json ac = json::parse(read_file((tmp.path / "adapter" / "adapter_config.json").string()));
  ac["target_modules"] = {"q_proj"};
  ac["modules_to_save"] = {"lm_head"};
  std::ofstream(tmp.path / "adapter" / "adapter_config.json") << ac.dump();
  err = error_of([&] { cmd_merge(merge_opts(root / "base_tied", tmp.path / "adapter", tmp.path / "out", "fp32")); });
  EXPECT_EQ(err, (tmp.path / "adapter" / "adapter_config.json").string() +
                     ": field 'modules_to_save' is [\"lm_head\"]: not supported (whole trained copies of modules, as "
                     "PEFT's modules_to_save and Axolotl's lora_modules_to_save save them beside the LoRA tensors; "
                     "only lora_A / lora_B are read)");
  EXPECT_FALSE(fs::exists(tmp.path / "out"));
}

// The CLI: `qlora merge` writes the directory; an existing non-empty --out is one error line, exit 1.
TEST(LoraMerge, Cli) {
  QLORA_REQUIRE_FIXTURE(root, "peft");
  TempDir tmp("merge_cli");
  const fs::path out = tmp.path / "merged", log = tmp.path / "log.txt";
  const std::string cmd = ::qlora::test::qlora_bin() + " merge --base " + (root / "base").string() + " --adapter " +
                          (root / "adapter_trained").string() + " --out " + out.string() + " --dtype bf16 > " +
                          log.string() + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(log.string());
  EXPECT_TRUE(fs::exists(out / "model.safetensors"));
  EXPECT_EQ(json::parse(read_file((out / "config.json").string())).value("torch_dtype", ""), "bfloat16");
  const int rc = std::system(cmd.c_str());
  EXPECT_EQ(WEXITSTATUS(rc), 1);
  const std::string msg = read_file(log.string());
  EXPECT_NE(msg.find("not empty"), std::string::npos) << msg;
}

// parameter_checksum is the first 64 bits of the SHA-256 of the tensors' bytes, in order; the
// reference is Python's hashlib (issue 13):
//   a = torch.arange(6, dtype=torch.float32).reshape(2, 3) * 0.5; b = torch.tensor([1.0, -2.0])
//   hashlib.sha256(a.numpy().tobytes() + b.numpy().tobytes()).hexdigest()[:16] == "26dd96348d66fecd"
TEST(ParameterChecksum, IsTheFirst64BitsOfTheSha256OfTheBytes) {
  const torch::Tensor a = torch::arange(6, torch::kFloat32).reshape({2, 3}) * 0.5;
  const torch::Tensor b = torch::tensor({1.0f, -2.0f});
  EXPECT_EQ(parameter_checksum({a, b}), 0x26dd96348d66fecdULL);
  EXPECT_EQ(parameter_checksum({a.t().contiguous().t(), b}), 0x26dd96348d66fecdULL);  // layout-independent
  torch::Tensor c = b.clone();
  c[1] = std::nextafter(-2.0f, 0.0f);  // one bit
  EXPECT_NE(parameter_checksum({a, c}), 0x26dd96348d66fecdULL);
}

}  // namespace
}  // namespace qlora
