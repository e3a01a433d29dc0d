// Issue 15, CUDA training against the CPU path. The harness trains 5 QLoRA steps (NF4 bs64 double
// quant, LoRA r=8 all-linear, no dropout, gradient checkpointing on, AdamW, a padded row so the
// dense-mask SDPA path runs) on the `small` shape (vocab cut to 2048) from the same CPU-drawn
// weights and adapter init, and compares losses, step-1 gradients and the final adapter.
//   GpuPrepParity.*   (CPU) the harness tells fp32 from bf16 runs: it can fail.
//   CudaTraining.*    (GPU) fp32 CUDA vs CPU within the fp32 tolerance, bf16 CUDA vs CPU fp32
//                     within the bf16 tolerance, checkpointed LoRA dropout equal to the plain run
//                     (CUDA RNG restore), QLORA_DETERMINISTIC's attention repeating bit for bit,
//                     and `qlora train` stopped by SIGTERM after step 3 and resumed on CUDA
//                     byte-identical to the uninterrupted CUDA run.
// Cuda* cases skip without a GPU (tests/skip_allowlist.txt) and must report OK on the device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/files.h"
#include "test_util.h"
#include "model/model.h"
#include "trainer/tiny_run.h"
#include "trainer/train.h"

namespace qlora {
namespace {
namespace fs = std::filesystem;

// Tolerances, as relative L2 errors ‖x − ref‖ / ‖ref‖ (per tensor; the worst tensor counts).
// fp32: both paths round every op to fp32 (2^-24 ≈ 6e-8) but sum in other orders; a few hundred
// dependent ops per step and 5 steps leave ~1e-5 at most. AdamW's eps is 1e-6 here (the default
// 1e-8 lets a gradient element within rounding of zero flip its update by ±lr: a discontinuity, not
// an error); with it an update moves by at most lr/eps × the gradient's error. 1e-4 is >10× that.
constexpr double kFp32Tol = 1e-4;
// bf16: 8 significant bits (2^-9 ≈ 2e-3 per rounding). Calibrated here with this harness, CPU bf16
// against CPU fp32 (2026-11-30, GpuPrepParity): loss 1.9e-4, step-1 gradients 0.134, adapter after
// 5 steps 0.215 (small LoRA tensors: the bf16 gradient of each is a few % off, and Adam normalises
// it). CUDA's bf16 kernels round at the same places; the tolerances are ~3× those gaps.
constexpr double kBf16LossTol = 1e-3, kBf16GradTol = 0.4, kBf16TensorTol = 0.65;

struct TrainRun {
  std::vector<double> losses;
  std::vector<torch::Tensor> grads1;  // step-1 gradients (CPU fp32)
  std::vector<torch::Tensor> params;  // final LoRA A/B (CPU fp32)
};

/// B rows of T random tokens; every row but the first has its last `pad` positions padded.
data::Batch make_batch(int64_t B, int64_t T, int64_t vocab, uint64_t seed, int64_t pad) {
  data::Batch b;
  b.batch_size = B;
  b.seq_len = T;
  uint64_t x = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  for (int64_t r = 0; r < B; ++r) {
    for (int64_t t = 0; t < T; ++t) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      const bool padded = r > 0 && t >= T - pad;
      const int32_t id = static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(vocab));
      b.input_ids.push_back(padded ? 0 : id);
      b.labels.push_back(padded ? -100 : id);
      b.attention_mask.push_back(padded ? 0 : 1);
      b.position_ids.push_back(padded ? 0 : static_cast<int32_t>(t));
      b.segment_ids.push_back(padded ? 0 : 1);
    }
    b.example_ids.push_back(r);
  }
  return b;
}

TrainRun train_run(const torch::Device& dev, torch::Dtype dtype, int steps = 5) {
  ModelConfig cfg = preset_config("small");
  cfg.vocab_size = 2048;
  QuantOptions q;
  q.quant_type = kernels::Quant4Type::NF4;
  q.blocksize = 64;
  q.double_quant = true;
  LlamaModel m = LlamaModel::random_init(cfg, 11, dtype, dev, q);  // CPU draw on every device
  LoraOptions lo;
  lo.r = 8;
  lo.alpha = 16;
  lo.target_modules = {"all-linear"};
  lo.seed = 12;
  m.add_lora(lo);
  m.training = true;
  m.gradient_checkpointing = true;
  TrainingConfig tc;
  tc.adam_epsilon = 1e-6;
  auto opt = make_adamw(m.lora_parameters(), tc);
  TrainRun run;
  for (int s = 0; s < steps; ++s) {
    StepOptions so;
    so.lr = 1e-3;
    so.max_grad_norm = 1.0;
    const StepResult r = train_step(m, *opt, {make_batch(2, 96, cfg.vocab_size, 100 + s, 24)}, so);
    EXPECT_FALSE(r.skipped) << "step " << s + 1;
    run.losses.push_back(r.loss);
    if (s == 0)
      for (const torch::Tensor& p : m.lora_parameters()) run.grads1.push_back(p.grad().detach().cpu().to(torch::kFloat).clone());
  }
  for (const torch::Tensor& p : m.lora_parameters()) run.params.push_back(p.detach().cpu().to(torch::kFloat).clone());
  return run;
}

double rel(const torch::Tensor& a, const torch::Tensor& ref) {
  const double d = (a.to(torch::kDouble) - ref.to(torch::kDouble)).norm().item<double>();
  const double n = ref.to(torch::kDouble).norm().item<double>();
  return n > 0 ? d / n : d;
}

struct Gap {
  double loss = 0, grad = 0, param = 0;
};

Gap gap(const TrainRun& a, const TrainRun& ref) {
  Gap g;
  EXPECT_EQ(a.losses.size(), ref.losses.size());
  EXPECT_EQ(a.params.size(), ref.params.size());
  for (size_t i = 0; i < std::min(a.losses.size(), ref.losses.size()); ++i) {
    EXPECT_TRUE(std::isfinite(a.losses[i]));
    g.loss = std::max(g.loss, std::fabs(a.losses[i] - ref.losses[i]) / std::fabs(ref.losses[i]));
  }
  for (size_t i = 0; i < std::min(a.grads1.size(), ref.grads1.size()); ++i)
    if (ref.grads1[i].norm().item<double>() > 0) g.grad = std::max(g.grad, rel(a.grads1[i], ref.grads1[i]));
  for (size_t i = 0; i < std::min(a.params.size(), ref.params.size()); ++i) g.param = std::max(g.param, rel(a.params[i], ref.params[i]));
  std::printf("  worst relative gap: loss %.3g, step-1 gradient %.3g, adapter after %zu steps %.3g\n", g.loss, g.grad,
              a.losses.size(), g.param);
  return g;
}

const TrainRun& cpu_fp32() {
  static const TrainRun r = train_run(torch::kCPU, torch::kFloat32);
  return r;
}

// The harness on the CPU: bf16 compute lands inside the bf16 tolerance but outside the fp32 one,
// so the CUDA cases below can tell a precision problem from rounding.
TEST(GpuPrepParity, HarnessSeparatesFp32FromBf16) {
  const TrainRun& ref = cpu_fp32();
  ASSERT_EQ(ref.losses.size(), 5u);
  double moved = 0;  // it trains: every B starts at zero
  for (size_t i = 1; i < ref.params.size(); i += 2) moved += ref.params[i].abs().sum().item<double>();
  EXPECT_GT(moved, 0.0);
  const TrainRun again = train_run(torch::kCPU, torch::kFloat32);
  const Gap same = gap(again, ref);
  EXPECT_EQ(same.loss, 0.0);
  EXPECT_EQ(same.param, 0.0);
  const Gap g = gap(train_run(torch::kCPU, torch::kBFloat16), ref);
  EXPECT_LT(g.loss, kBf16LossTol);
  EXPECT_LT(g.grad, kBf16GradTol);
  EXPECT_LT(g.param, kBf16TensorTol);
  EXPECT_GT(std::max({g.loss, g.grad, g.param}), kFp32Tol);
}

// The fp32 tolerance admits what CUDA changes: other kernels summing the same fp32 math in another
// order. Here the CPU path with attention on SDPA's math backend instead of its flash kernel (the
// default for these shapes): a visible gap, inside kFp32Tol.
TEST(GpuPrepParity, Fp32ToleranceAdmitsAnotherAttentionKernel) {
  const TrainRun& ref = cpu_fp32();
  at::Context& ctx = at::globalContext();
  const bool flash = ctx.userEnabledFlashSDP();
  ctx.setSDPUseFlash(false);
  const TrainRun other = train_run(torch::kCPU, torch::kFloat32);
  ctx.setSDPUseFlash(flash);
  const Gap g = gap(other, ref);
  EXPECT_GT(std::max({g.loss, g.grad, g.param}), 0.0);
  EXPECT_LT(g.loss, kFp32Tol);
  EXPECT_LT(g.grad, kFp32Tol);
  EXPECT_LT(g.param, kFp32Tol);
}

TEST(CudaTraining, Fp32MatchesTheCpuPath) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible";
  // torch's default; TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 in the environment would turn TF32 on (10-bit
  // mantissas), and this tolerance is for IEEE fp32 matmuls
  ASSERT_FALSE(at::globalContext().allowTF32CuBLAS()) << "TF32 cuBLAS matmuls are on";
  const Gap g = gap(train_run(torch::Device(torch::kCUDA), torch::kFloat32), cpu_fp32());
  EXPECT_LT(g.loss, kFp32Tol);
  EXPECT_LT(g.grad, kFp32Tol);
  EXPECT_LT(g.param, kFp32Tol);
}

TEST(CudaTraining, Bf16WithinBf16ToleranceOfCpuFp32) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible";
  const Gap g = gap(train_run(torch::Device(torch::kCUDA), torch::kBFloat16), cpu_fp32());
  EXPECT_LT(g.loss, kBf16LossTol);
  EXPECT_LT(g.grad, kBf16GradTol);
  EXPECT_LT(g.param, kBf16TensorTol);
}

// LoRA dropout on CUDA under gradient checkpointing: the recompute in backward restores CUDA's
// generator (model.cpp RngState), so the dropout masks, the loss and the gradients equal those of
// the run without checkpointing; another seed gives other gradients (dropout is live). Only this
// case shows a wrong CUDA RNG restore: the byte-identity cases compare two runs that would be wrong
// alike. (LoraCheckpointing.DropoutSameGradsWithRngRestore is the CPU case.)
TEST(CudaTraining, CheckpointedDropoutSameGradsAsWithout) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible";
  ModelConfig cfg = preset_config("small");
  cfg.vocab_size = 2048;
  QuantOptions q;
  q.quant_type = kernels::Quant4Type::NF4;
  LlamaModel m = LlamaModel::random_init(cfg, 11, torch::kFloat32, torch::Device(torch::kCUDA), q);
  LoraOptions lo;
  lo.target_modules = {"all-linear"};
  lo.dropout = 0.1;
  lo.seed = 12;
  m.add_lora(lo);
  m.training = true;
  auto opt = make_adamw(m.lora_parameters(), TrainingConfig{});
  StepOptions so;
  so.lr = 0;  // the step leaves the adapter as it is (AdamW: p -= 0, p *= 1 - 0·wd)
  const data::Batch batch = make_batch(2, 96, cfg.vocab_size, 7, 24);
  auto run = [&](bool checkpointing, uint64_t seed) {
    m.gradient_checkpointing = checkpointing;
    torch::manual_seed(seed);
    const StepResult r = train_step(m, *opt, {batch}, so);
    std::vector<torch::Tensor> g;
    for (const torch::Tensor& p : m.lora_parameters()) g.push_back(p.grad().detach().cpu().clone());
    return std::make_pair(r.loss, g);
  };
  const auto off = run(false, 123), on = run(true, 123), other = run(false, 124);
  EXPECT_NEAR(on.first, off.first, 1e-6 * std::fabs(off.first));
  double worst = 0, moved = 0;
  for (size_t i = 0; i < off.second.size(); ++i) {
    const double scale = off.second[i].abs().max().item<double>();
    if (scale == 0) continue;  // A's gradient while B = 0
    worst = std::max(worst, (on.second[i] - off.second[i]).abs().max().item<double>() / scale);
    moved = std::max(moved, (other.second[i] - off.second[i]).abs().max().item<double>() / scale);
  }
  std::printf("  checkpointing vs not: worst relative gradient gap %.3g; another seed: %.3g\n", worst, moved);
  EXPECT_LT(worst, 1e-5) << "checkpointing with dropout changed a gradient (CUDA RNG not restored?)";
  EXPECT_GT(moved, 1e-3) << "another seed gave the same gradients: dropout is not active";
}

// What QLORA_DETERMINISTIC=1 does to attention on the GPU (set_deterministic_algorithms): the tiny
// run's attention shape (fp32, 2 rows × 4 heads of 16, a padding mask, here 320 keys = 5 key blocks)
// forward and backward five times, every gradient bit-identical. torch's default choice for it
// (printed) is memory-efficient attention, whose backward then sums dq over key splits with atomics.
TEST(CudaTraining, DeterministicModeAttentionBackwardRepeats) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible";
  at::Context& ctx = at::globalContext();
  const bool det = ctx.deterministicAlgorithms(), warn = ctx.deterministicAlgorithmsWarnOnly();
  const bool flash = ctx.userEnabledFlashSDP(), eff = ctx.userEnabledMemEfficientSDP(),
             cudnn = ctx.userEnabledCuDNNSDP(), math = ctx.userEnabledMathSDP();
  torch::manual_seed(3);
  const auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32);
  const torch::Tensor q0 = torch::randn({2, 4, 320, 16}, opts), k0 = torch::randn({2, 4, 320, 16}, opts),
                      v0 = torch::randn({2, 4, 320, 16}, opts), go = torch::randn({2, 4, 320, 16}, opts);
  // causal, the second row padded from key 250 on, every query attending at least itself (as build_mask)
  torch::Tensor mask = torch::ones({320, 320}, torch::kBool).tril().view({1, 1, 320, 320}).repeat({2, 1, 1, 1});
  mask.index_put_({1, torch::indexing::Slice(), torch::indexing::Slice(), torch::indexing::Slice(250, torch::indexing::None)}, false);
  mask = mask.logical_or(torch::eye(320, torch::kBool).view({1, 1, 320, 320})).to(torch::kCUDA);
  std::printf("  default SDPA backend for this shape: %d (0 math, 1 flash, 2 efficient, 3 cudnn)\n",
              static_cast<int>(at::_fused_sdp_choice(q0, k0, v0, mask)));
  set_deterministic_algorithms();
  EXPECT_EQ(static_cast<at::SDPBackend>(at::_fused_sdp_choice(q0, k0, v0, mask)), at::SDPBackend::math);
  std::vector<torch::Tensor> first;
  for (int run = 0; run < 5; ++run) {
    torch::Tensor q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true),
                  v = v0.clone().requires_grad_(true);
    at::scaled_dot_product_attention(q, k, v, mask).backward(go);
    const std::vector<torch::Tensor> got{q.grad().cpu(), k.grad().cpu(), v.grad().cpu()};
    if (run == 0) first = got;
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(torch::equal(got[i], first[i])) << "run " << run << " grad " << i;
  }
  ctx.setDeterministicAlgorithms(det, warn);
  ctx.setSDPUseFlash(flash);
  ctx.setSDPUseMemEfficient(eff);
  ctx.setSDPUseCuDNN(cudnn);
  ctx.setSDPUseMath(math);
}

// `qlora train` on CUDA (tiny NF4 model, fp32, LoRA dropout 0.1, checkpointing on: CUDA RNG restore
// is exercised), SIGTERM while step 4 loads (after step 3), resumed: adapter and every step's loss
// byte-identical to the uninterrupted CUDA run. Deterministic algorithms on (QLORA_DETERMINISTIC=1,
// CUBLAS_WORKSPACE_CONFIG=:4096:8): SDPA's backward and cuBLAS otherwise may sum in a different order.
TEST(CudaTraining, ResumeAfterSigtermIsByteIdentical) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible";
  const fs::path root = qlora::test::fresh_temp_dir("cuda_resume");
  auto o = qlora::test::make_tiny_run(root, 0);
  ASSERT_EQ(o.status, 0) << o.out;
  const std::string env = "QLORA_DETERMINISTIC=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 ";
  auto train = [&](const fs::path& out, const std::string& extra_env) {
    return qlora::test::run_command(env + extra_env + " " + ::qlora::test::qlora_bin() + " train " + (root / "run.yaml").string() +
                                    " --set output_dir=" + out.string());
  };
  o = train(root / "ref", "");
  ASSERT_EQ(o.status, 0) << o.out;
  ASSERT_NE(o.out.find("device cuda"), std::string::npos) << o.out;
  o = train(root / "cut", "QLORA_FAULT_SIGTERM_AT=4:0");
  ASSERT_EQ(o.status, 75) << o.out;
  o = train(root / "cut", "");
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_NE(o.out.find("resume: from"), std::string::npos) << o.out;
  EXPECT_EQ(read_file((root / "cut" / "adapter_model.safetensors").string()),
            read_file((root / "ref" / "adapter_model.safetensors").string()));
  auto losses = [](const fs::path& out) {
    std::map<int64_t, double> m;
    std::ifstream in(out / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      m[j["step"].get<int64_t>()] = j["loss"].get<double>();
    }
    return m;
  };
  EXPECT_EQ(losses(root / "cut"), losses(root / "ref"));
  qlora::remove_tree(root);
}

}  // namespace
}  // namespace qlora
