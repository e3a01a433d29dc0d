// The memory estimator (trainer/estimate.h): components add up, the weight / quantization-constant /
// LoRA / optimizer terms equal the bytes of an instantiated model to the byte, the 7B QLoRA weight
// footprint is the one docs/quantization.md measures (4.127 bits/param), checkpointing shrinks the
// activations, bad input is refused, and `qlora bench` / `qlora estimate` run end to end.
#include <gtest/gtest.h>

#include "test_util.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <unistd.h>
#include <regex>
#include <sys/wait.h>

#include "common/error.h"
#include "common/format.h"
#include "trainer/estimate.h"
#include "model/model.h"
#include "trainer/train.h"

namespace qlora {
namespace {

EstimateOptions qlora_opts(int64_t compute_bytes = 2) {
  EstimateOptions o;
  o.compute_bytes = compute_bytes;
  return o;
}

TEST(Estimate, ComponentsSumToTotal) {
  for (const char* preset : {"tiny", "llama2-7b", "mistral-7b", "llama3-8b", "llama2-70b"}) {
    for (auto m : {EstimateOptions::Method::Inference, EstimateOptions::Method::Lora, EstimateOptions::Method::QLora,
                   EstimateOptions::Method::Full}) {
      for (bool ck : {true, false}) {
        EstimateOptions o;
        o.method = m;
        o.bits = m == EstimateOptions::Method::QLora || m == EstimateOptions::Method::Inference ? 4 : 16;
        o.gradient_checkpointing = ck;
        const MemoryEstimate e = estimate_memory(preset_config(preset), o);
        int64_t sum = 0;
        for (const MemoryComponent& c : e.components) {
          EXPECT_GE(c.bytes, 0) << c.name;
          if (c.in_total) sum += c.bytes;
        }
        EXPECT_EQ(sum, e.total_bytes) << preset << " " << to_string(m);
        EXPECT_EQ(estimate_to_json(e)["total_bytes"].get<int64_t>(), e.total_bytes);
      }
    }
  }
}

TEST(Estimate, SevenBQLoraWeightsAreAbout4Point127BitsPlus16BitEmbeddings) {
  const MemoryEstimate e = estimate_memory(preset_config("llama2-7b"), qlora_opts());
  const int64_t q = e.component("quantized weights (4-bit packed)") + e.component("quantization constants");
  EXPECT_NEAR(8.0 * q / e.quantizable_parameters, 4.127, 0.001);
  const int64_t weights = q + e.component("unquantized modules");
  EXPECT_GT(weights, 3.5e9);
  EXPECT_LT(weights, 3.9e9);
  // r=16 all-linear on Llama-2-7B: 39,976,960 trainable parameters (PEFT prints the same).
  EXPECT_EQ(e.lora_parameters, 39976960);
  EXPECT_EQ(e.component("AdamW states (exp_avg + exp_avg_sq, fp32)"), 8 * 39976960LL);
}

TEST(Estimate, CheckpointingReducesActivations) {
  EstimateOptions on = qlora_opts(), off = qlora_opts();
  off.gradient_checkpointing = false;
  const ModelConfig c = preset_config("llama2-7b");
  const MemoryEstimate a = estimate_memory(c, on), b = estimate_memory(c, off);
  EXPECT_LT(a.component("activations saved for backward"), b.component("activations saved for backward") / 5);
  EXPECT_LT(a.total_bytes, b.total_bytes);
  EXPECT_EQ(a.activation_bytes_per_layer_checkpointed, 2048LL * 4096 * 2);
  // Activations scale linearly in tokens: no [T, T] term (SDPA). Constant: the bf16 casts of A
  // and B (lora_parameters · 2 bytes); RoPE cos/sin are 2·T·hd·2 bytes.
  EstimateOptions longer = off;
  longer.seq_len = 4096;
  const int64_t casts = b.lora_parameters * 2;
  EXPECT_EQ(estimate_memory(c, longer).component("activations saved for backward") - 2 * 4096 * 128 * 2 - casts,
            2 * (b.component("activations saved for backward") - 2 * 2048 * 128 * 2 - casts));
}

TEST(Estimate, WeightConstantLoraAndOptimizerTermsMatchTheInstantiatedModel) {
  ModelConfig cfg = preset_config("tiny");
  cfg.vocab_size = 500;
  for (bool dq : {true, false}) {
    QuantOptions q;
    q.quant_type = kernels::Quant4Type::NF4;
    q.blocksize = 64;
    q.double_quant = dq;
    LlamaModel m = LlamaModel::random_init(cfg, 1, torch::kFloat32, torch::kCPU, q);
    LoraOptions lo;
    lo.r = 8;
    lo.alpha = 16;
    lo.target_modules = {"all-linear"};
    lo.seed = 1;
    m.add_lora(lo);
    int64_t qbytes = 0, packed = 0, plain = 0, lora = 0;
    for (const FrozenLinear* f : m.linears()) {
      qbytes += f->qweight->bytes();
      packed += f->qweight->packed.numel();
    }
    for (const auto& [name, t] : m.named_tensors()) plain += t.numel() * t.element_size();
    for (const torch::Tensor& p : m.lora_parameters()) lora += p.numel() * p.element_size();
    EstimateOptions o = qlora_opts(4);
    o.double_quant = dq;
    o.lora_r = 8;
    const MemoryEstimate e = estimate_memory(cfg, o);
    EXPECT_EQ(e.component("quantized weights (4-bit packed)"), packed);
    EXPECT_EQ(e.component("quantization constants"), qbytes - packed);
    EXPECT_EQ(e.component("unquantized modules"), plain);
    EXPECT_EQ(e.component("LoRA parameters (fp32)"), lora);

    // One optimizer step creates exactly the gradient and AdamW-state bytes estimated.
    auto opt = make_adamw(m.lora_parameters(), TrainingConfig{});
    data::Batch b;
    b.batch_size = 1;
    b.seq_len = 16;
    for (int t = 0; t < 16; ++t) {
      b.input_ids.push_back(t * 7 % 500);
      b.labels.push_back(t * 7 % 500);
      b.attention_mask.push_back(1);
      b.position_ids.push_back(t);
      b.segment_ids.push_back(1);
    }
    b.example_ids = {0};
    m.training = true;
    StepOptions so;
    so.lr = 1e-3;
    so.max_grad_norm = 1.0;
    train_step(m, *opt, {b}, so);
    int64_t grads = 0, states = 0;
    for (const torch::Tensor& p : m.lora_parameters()) grads += p.grad().numel() * p.grad().element_size();
    for (const auto& [key, st] : opt->state()) {
      const auto& s = static_cast<const torch::optim::AdamWParamState&>(*st);
      states += s.exp_avg().numel() * s.exp_avg().element_size() + s.exp_avg_sq().numel() * s.exp_avg_sq().element_size();
    }
    EXPECT_EQ(e.component("LoRA gradients (fp32)"), grads);
    EXPECT_EQ(e.component("AdamW states (exp_avg + exp_avg_sq, fp32)"), states);
  }
}

TEST(Estimate, BadInputIsRefused) {
  const ModelConfig c = preset_config("tiny");
  EstimateOptions o = qlora_opts();
  o.lora_r = 65;  // tiny's hidden size is 64
  EXPECT_THROW(estimate_memory(c, o), Error);
  o = qlora_opts();
  o.seq_len = 0;
  EXPECT_THROW(estimate_memory(c, o), Error);
  o = qlora_opts();
  o.micro_batch_size = -1;
  EXPECT_THROW(estimate_memory(c, o), Error);
  o = qlora_opts();
  o.bits = 3;
  EXPECT_THROW(estimate_memory(c, o), Error);
  o = qlora_opts();
  o.lora_targets = {"nothing"};
  EXPECT_THROW(estimate_memory(c, o), Error);
  EXPECT_THROW(preset_config("llama9-1t"), Error);
  EXPECT_THROW(parse_estimate_method("half"), Error);
  CostInputs no_rate;
  no_rate.tokens = 1e9;
  no_rate.tokens_per_s = 0;
  no_rate.gpu_hour_price = 2.0;
  EXPECT_THROW(estimate_cost(no_rate), Error);
}

/// 3.6e9 tokens at 1000 tokens/s per device, 2.0 per device-hour, 50% utilization, on `devices`.
CostInputs cost_example(int64_t devices = 1) {
  CostInputs in;
  in.tokens = 3.6e9;
  in.tokens_per_s = 1000;
  in.gpu_hour_price = 2.0;
  in.utilization = 0.5;
  in.devices = devices;
  return in;
}

TEST(Estimate, CostArithmetic) {
  const CostEstimate c = estimate_cost(cost_example());
  EXPECT_DOUBLE_EQ(c.gpu_hours_full, 1000.0);
  EXPECT_DOUBLE_EQ(c.gpu_hours_at_utilization, 2000.0);
  EXPECT_DOUBLE_EQ(c.cost_full, 2000.0);
  EXPECT_DOUBLE_EQ(c.cost_at_utilization, 4000.0);
  EXPECT_NEAR(c.cost_per_million_tokens, 2.0 / 3.6, 1e-12);
}

// Data parallel (docs/distributed.md): each rank adds one flat fp32 gradient buffer of 4 bytes per
// LoRA parameter (Distributed::sum_gradients), nothing else; the count from Llama-2-7B's shapes:
// 32 layers × r 16 × (4 × (4096 + 4096) [q, k, v, o] + 3 × (4096 + 11008) [gate, up, down]).
TEST(Estimate, WorldSizeAddsTheFlatAllreduceBufferPerRank) {
  const int64_t lora = 32LL * 16 * (4 * (4096 + 4096) + 3 * (4096 + 11008));
  ASSERT_EQ(lora, 39976960);
  const ModelConfig c = preset_config("llama2-7b");
  EstimateOptions o = qlora_opts();
  const MemoryEstimate one = estimate_memory(c, o);
  EXPECT_EQ(one.component("gradient allreduce buffer (fp32, flat)"), 0);
  for (int64_t n : {2, 8}) {
    o.world_size = n;
    const MemoryEstimate e = estimate_memory(c, o);
    EXPECT_EQ(e.lora_parameters, lora);
    EXPECT_EQ(e.component("gradient allreduce buffer (fp32, flat)"), 4 * lora);
    EXPECT_EQ(e.total_bytes - one.total_bytes, 159907840) << "world size " << n;
  }
  // Cost: one device's tokens/s, N devices: the job runs N times faster, the bill is the same.
  const CostEstimate c1 = estimate_cost(cost_example()), c8 = estimate_cost(cost_example(8));
  EXPECT_DOUBLE_EQ(c8.job_tokens_per_s, 8000.0);
  EXPECT_DOUBLE_EQ(c8.wall_hours_full, 125.0);
  EXPECT_DOUBLE_EQ(c8.gpu_hours_full, 1000.0);
  EXPECT_DOUBLE_EQ(c8.gpu_hours_full, c1.gpu_hours_full);
  EXPECT_DOUBLE_EQ(c8.cost_at_utilization, 4000.0);
  EXPECT_NEAR(c8.cost_per_million_tokens, 2.0 / 3.6, 1e-12);
  EXPECT_THROW(estimate_cost(cost_example(0)), Error);
}

TEST(Estimate, FlopsCountFrozenBaseAsFourN) {
  EstimateOptions o = qlora_opts();
  o.gradient_checkpointing = false;
  const ModelConfig c = preset_config("llama2-7b");
  const TrainingFlops f = training_flops_per_token(c, o);
  const double attn = 2.0 * 4096 * 2048 * 32;
  EXPECT_DOUBLE_EQ(f.model_flops, 4.0 * f.matmul_params + 6.0 * f.lora_params + 3 * attn);
  EXPECT_DOUBLE_EQ(f.hardware_flops, f.model_flops);
  o.gradient_checkpointing = true;
  const TrainingFlops g = training_flops_per_token(c, o);
  EXPECT_DOUBLE_EQ(g.model_flops, f.model_flops);
  EXPECT_DOUBLE_EQ(g.hardware_flops - g.model_flops,
                   2.0 * (g.matmul_params - 32000.0 * 4096) + 2.0 * g.lora_params + attn);
}

// The predicted bench time (docs/memory.md, "How long a bench takes"): a step is its hardware FLOPs
// at the measured matmul speed plus each decoder linear dequantized 3 times (forward, recompute,
// backward; 2 without checkpointing); the weights are the 7·L linears at the quantize rate and the
// rest (embeddings, lm_head, norms) at the plain rate. Before: no prediction of a step at all, and
// the weights' time extrapolated from the embedding (drawn, not quantized): 105 s said, 200 s taken.
TEST(Estimate, BenchStepAndWeightSecondsFromMeasuredRates) {
  const ModelConfig c = preset_config("llama3-8b");
  EstimateOptions o = qlora_opts(4);
  o.seq_len = 2048;
  DeviceRates r;
  r.matmul_flops = 100e9;
  const double flops = training_flops_per_token(c, o).hardware_flops * 2048;
  EXPECT_DOUBLE_EQ(training_step_seconds(c, o, r), flops / 100e9);  // no dequant rate: that term left out
  r.dequant_elements = 1e9;
  const double linear = static_cast<double>(estimate_memory(c, o).quantizable_parameters);
  EXPECT_DOUBLE_EQ(training_step_seconds(c, o, r), flops / 100e9 + 3 * linear / 1e9);
  o.gradient_checkpointing = false;
  EXPECT_DOUBLE_EQ(training_step_seconds(c, o, r),
                   training_flops_per_token(c, o).hardware_flops * 2048 / 100e9 + 2 * linear / 1e9);
  // llama3-8b at 2048 tokens on a 2-core CPU (~100 GFLOP/s): over 15 minutes a step (docs/memory.md).
  EXPECT_NEAR(flops / 2048 / 1e9, 46.5, 0.05);
  EXPECT_NEAR(flops / 1e12, 95.2, 0.05);
  EXPECT_GT(flops / 100e9, 900);
  r.quantized_init_elements = 40e6;
  r.plain_init_elements = 160e6;
  const double plain = static_cast<double>(c.num_parameters()) - linear;
  EXPECT_GT(plain, 2 * 128256.0 * 4096);  // embed_tokens + lm_head (untied)
  EXPECT_DOUBLE_EQ(random_weights_seconds(c, true, r), linear / 40e6 + plain / 160e6);
  EXPECT_DOUBLE_EQ(random_weights_seconds(c, false, r), static_cast<double>(c.num_parameters()) / 160e6);
  EXPECT_THROW(training_step_seconds(c, o, DeviceRates{}), Error);
  EXPECT_THROW(random_weights_seconds(c, true, DeviceRates{}), Error);
}

using CliRun = qlora::test::CommandResult;
CliRun run(const std::string& args) { return qlora::test::run_command(::qlora::test::qlora_bin() + " " + args); }

// The estimate against the first GPU measurement (docs/memory.md, "GPU check 2026-12-04"): `qlora
// bench` on an H200, torch 2.11.0+cu130, NF4 bs64 double quant, r 16 all-linear, checkpointing,
// bf16, the caching allocator's peak allocated and peak reserved after 3 steps, bytes, copied from
// its bench-7b.csv / bench-13b.csv / bench-8b.csv. kActivationFragmentation was fitted to the llama2
// rows: the bounds are what the fit leaves (reserved −0.8%..+3.3%; llama3-8b, not fitted, −3.4%..+7.5%)
// and what the allocated terms gave (+1.9..+4.5%, no fitted term).
TEST(Estimate, MeasuredOnH200) {
  struct Row { const char* preset; int64_t seq, mb, peak_allocated, peak_reserved; };
  const Row rows[] = {
      {"llama2-7b", 512, 1, 4845263872, 5228199936},    {"llama2-7b", 1024, 1, 5086071808, 5809111040},
      {"llama2-7b", 2048, 1, 5637991424, 6440353792},   {"llama2-7b", 4096, 1, 6843190272, 7868514304},
      {"llama2-7b", 8192, 1, 9256520704, 10817110016},  {"llama2-7b", 512, 2, 5086055424, 5809111040},
      {"llama2-7b", 1024, 2, 5637991424, 6440353792},   {"llama2-7b", 2048, 2, 6843173888, 7868514304},
      {"llama2-7b", 4096, 2, 9256504320, 10817110016},  {"llama2-7b", 8192, 2, 14082640896, 16512974848},
      {"llama2-7b", 512, 4, 5637991424, 6440353792},    {"llama2-7b", 1024, 4, 6843157504, 7868514304},
      {"llama2-7b", 2048, 4, 9256487936, 10817110016},  {"llama2-7b", 4096, 4, 14082624512, 16512974848},
      {"llama2-7b", 8192, 4, 23730179072, 27856470016}, {"llama2-13b", 2048, 1, 9761969152, 10678697984},
      // not fitted: another family (GQA, 128k vocabulary), measured in the same run (bench-8b.csv)
      {"llama3-8b", 2048, 1, 8218670080, 8881438720},    {"llama3-8b", 8192, 1, 11433585664, 12243173376},
      {"llama3-8b", 2048, 2, 8854563840, 10068426752},   {"llama3-8b", 8192, 2, 16591580160, 17817403392},
  };
  double lo = 1, hi = -1;
  for (const Row& r : rows) {
    EstimateOptions o;  // qlora bench's point_options: the defaults, no context
    o.seq_len = r.seq;
    o.micro_batch_size = r.mb;
    o.overhead_bytes = 0;
    const MemoryEstimate e = estimate_memory(preset_config(r.preset), o);
    const double res = (static_cast<double>(e.total_bytes) - r.peak_reserved) / r.peak_reserved;
    const double alloc = (static_cast<double>(e.total_bytes - e.reserved_only_bytes()) - r.peak_allocated) / r.peak_allocated;
    const std::string what = std::string(r.preset) + " " + std::to_string(r.seq) + "x" + std::to_string(r.mb);
    const bool fitted = std::string(r.preset) != "llama3-8b";
    EXPECT_GE(res, fitted ? -0.009 : -0.035) << what;
    EXPECT_LE(res, fitted ? 0.034 : 0.076) << what;
    EXPECT_GE(alloc, 0.0) << what << ": the allocated estimate is under the measurement";
    EXPECT_LE(alloc, 0.046) << what;
    if (fitted) lo = std::min(lo, res), hi = std::max(hi, res);
  }
  std::printf("  reserved estimate vs the H200 (fitted rows): %+.1f%% .. %+.1f%%\n", 100 * lo, 100 * hi);
}

TEST(EstimateCli, TableJsonAndErrors) {
  CliRun r = run("estimate --preset llama2-7b --double-quant --tokens 1e8 --tokens-per-s 2000 --gpu-hour-price 2 "
                 "--utilization 0.5");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("TOTAL (peak)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("claim \"a 7B QLoRA fine-tune fits in 16 GB\": this config's total"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("GPU-hours"), std::string::npos) << r.out;
  r = run("estimate --preset tiny --json");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["options"]["method"], "qlora");
  // --world-size: per-rank total + the flat buffer; the cost line counts all ranks.
  r = run("estimate --preset llama2-7b --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const int64_t total1 = nlohmann::json::parse(r.out)["total_bytes"].get<int64_t>();
  // double quant is on by default, as training's quantization.double_quant
  auto total_of = [](const CliRun& c) { return nlohmann::json::parse(c.out)["total_bytes"].get<int64_t>(); };
  r = run("estimate --preset llama2-7b --json --double-quant");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(total_of(r), total1);
  r = run("estimate --preset llama2-7b --json --no-double-quant");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_GT(total_of(r), total1);
  // --device cpu: no CUDA context, cuBLAS workspaces or allocator rounding
  r = run("estimate --preset llama2-7b --json --device cpu");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["options"]["cuda"], false);
  EXPECT_LT(total_of(r), total1 - (int64_t{768} << 20) - (int64_t{64} << 20));
  EXPECT_EQ(run("estimate --preset llama2-7b --device tpu").status, 2);  // a usage error (README)
  r = run("estimate --preset llama2-7b --json --world-size 4 --tokens 1.44e8 --tokens-per-s 1000 --gpu-hour-price 2");
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j4 = nlohmann::json::parse(r.out);
  EXPECT_EQ(j4["total_bytes"].get<int64_t>() - total1, 4 * 39976960LL);
  EXPECT_EQ(j4["options"]["world_size"], 4);
  EXPECT_DOUBLE_EQ(j4["cost"]["job_tokens_per_s"].get<double>(), 4000.0);
  EXPECT_DOUBLE_EQ(j4["cost"]["wall_hours_full_utilization"].get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(j4["cost"]["gpu_hours_full_utilization"].get<double>(), 40.0);
  r = run("estimate --preset llama2-7b --world-size 4 --tokens 1.44e8 --tokens-per-s 1000");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("data parallel over 4 ranks: the memory below is per rank"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("gradient allreduce buffer (fp32, flat)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tokens/s per rank x 4 ranks = 4000.00 tokens/s (ideal scaling), 10.00 h wall-clock"),
            std::string::npos) << r.out;
  r = run("estimate --preset tiny --world-size 0");
  EXPECT_NE(r.status, 0) << r.out;
  r = run("estimate --preset nope");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("unknown preset 'nope'"), std::string::npos) << r.out;
  r = run("estimate --preset tiny --lora-r 100");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("larger than"), std::string::npos) << r.out;
  r = run("estimate --preset tiny --seq-len 0");
  EXPECT_EQ(r.status, 1);
  r = run("estimate --model /nonexistent-dir");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("/nonexistent-dir"), std::string::npos) << r.out;
  // Sizes whose int64 byte counts would wrap around (trial 19: a negative total that "fit" every
  // card, exit 0), and cost values out of range (1e30 tokens printed as a negative count; a zero
  // rate read as missing; an infinite price priced the run at inf): one-line errors, exit 1.
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"estimate --preset llama3-8b --seq-len 4194304 --micro-batch-size 4194304",
       "error: estimate: --micro-batch-size 4194304 x --seq-len 4194304 is out of range for this model (its "
       "activations alone would pass 2^62 bytes, 4 EiB)"},
      {"estimate --preset llama3-8b --seq-len 2147483648", "error: estimate: --micro-batch-size 1 x --seq-len 2147483648 is out of range"},
      {"estimate --preset tiny --tokens 1e30 --tokens-per-s 10", "error: estimate: --tokens must be a token count in 1..1e18, got 1e+30"},
      {"estimate --preset tiny --tokens -1e9 --tokens-per-s 10", "error: estimate: --tokens must be a token count in 1..1e18, got -1e+09"},
      {"estimate --preset tiny --tokens 1e9 --tokens-per-s 0", "error: estimate: --tokens-per-s must be > 0, got 0"},
      {"estimate --preset tiny --tokens 1e9 --tokens-per-s -5", "error: estimate: --tokens-per-s must be > 0, got -5"},
      {"estimate --preset tiny --tokens 1e9 --tokens-per-s 10 --gpu-hour-price inf",
       "error: estimate: --gpu-hour-price must be a finite number >= 0, got inf"},
      {"estimate --preset tiny --utilization 0", "error: estimate: --utilization must be in (0, 1], got 0"},
      {"bench --preset tiny --peak-tflops -5", "error: bench: --peak-tflops must be > 0 (or 0: from the GPU's name), got -5"},
      {"bench --preset tiny --gpu-hour-price inf", "error: bench: --gpu-hour-price must be a finite number >= 0, got inf"}};
  for (const auto& [cmd, message] : refused) {
    r = run(cmd);
    EXPECT_EQ(r.status, 1) << cmd << "\n" << r.out;
    EXPECT_NE(r.out.find(message), std::string::npos) << cmd << "\n" << r.out;
  }
  // A large size that does not wrap around is estimated (and fits no card).
  r = run("estimate --preset llama3-8b --seq-len 100000000 --json");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_GT(nlohmann::json::parse(r.out)["total_bytes"].get<int64_t>(), int64_t{50} << 40) << r.out;
}

// The presets of released models have those models' shapes: the parameter count of the model
// transformers builds from the hub config.json numbers, and PEFT's trainable count for LoRA r=16
// all-linear (tests/fixtures/make_preset_refs.py, meta device: no weights). Qwen2.5-7B: 40,370,176;
// Qwen3-8B: 43,646,976; Llama-3-8B: 41,943,040.
TEST(Estimate, PresetsMatchTransformersAndPeft) {
  QLORA_REQUIRE_FIXTURE(refs_path, "preset_refs.json");
  std::ifstream in(refs_path);
  const nlohmann::json refs = nlohmann::json::parse(in);
  ASSERT_GE(refs.size(), 6u);
  for (const auto& [name, ref] : refs.items()) {
    SCOPED_TRACE(name);
    const ModelConfig c = preset_config(name);
    EXPECT_EQ(c.num_parameters(), ref["num_parameters"].get<int64_t>());
    EstimateOptions o = qlora_opts();
    o.lora_r = 16;
    EXPECT_EQ(estimate_memory(c, o).lora_parameters, ref["lora_parameters_r16_all_linear"].get<int64_t>());
  }
  EXPECT_EQ(refs["qwen2.5-7b"]["lora_parameters_r16_all_linear"], 40370176);
  EXPECT_EQ(refs["qwen3-8b"]["lora_parameters_r16_all_linear"], 43646976);
  EXPECT_EQ(refs["llama3-8b"]["lora_parameters_r16_all_linear"], 41943040);
}

std::string config_path(const std::string& rel) { return "'" + (test::source_dir() / "configs" / rel).string() + "'"; }

// --lora-targets is read by the training config's own lora.target_modules reader: `q_proj v_proj`,
// "q_proj, v_proj", "[q_proj, v_proj]" and " q_proj" "v_proj" are the same two modules, whose
// trainable count is PEFT's for target_modules=["q_proj", "v_proj"] (make_preset_refs.py); an
// unknown name (a typo next to a good one) is the config's one-line error naming it, with or
// without --config. Before: the typo was silently dropped and "[q_proj, v_proj]" counted q_proj only.
TEST(EstimateCli, LoraTargetsAreReadAsTheConfigReadsThem) {
  QLORA_REQUIRE_FIXTURE(refs_path, "preset_refs.json");
  std::ifstream in(refs_path);
  const nlohmann::json refs = nlohmann::json::parse(in);
  const int64_t peft_qv = refs["llama2-7b"]["lora_parameters_r16_q_v"].get<int64_t>();
  EXPECT_EQ(peft_qv, 8388608);
  for (const char* spelling : {"q_proj v_proj", "'q_proj, v_proj'", "'[q_proj, v_proj]'", "' q_proj' v_proj",
                                      "q_proj,v_proj"}) {
    SCOPED_TRACE(spelling);
    const CliRun r = run(std::string("estimate --preset llama2-7b --json --lora-targets ") + spelling);
    ASSERT_EQ(r.status, 0) << r.out;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["lora_parameters"].get<int64_t>(), peft_qv);
    EXPECT_EQ(j["options"]["lora_targets"], nlohmann::json({"q_proj", "v_proj"}));
  }
  CliRun r = run("estimate --preset llama2-7b --lora-targets all-linear --json");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["lora_parameters"].get<int64_t>(),
            refs["llama2-7b"]["lora_parameters_r16_all_linear"].get<int64_t>());
  // The config's message for the same value (--set lora.target_modules=[q_proj, v_proj_typo]).
  std::string config_msg;
  try {
    load_config((test::source_dir() / "configs/llama3/8b_qlora.yaml").string(), {"lora.target_modules=[q_proj, v_proj_typo]"});
  } catch (const Error& e) {
    config_msg = e.what();
  }
  const std::string unknown = "lora.target_modules[1]: unknown module \"v_proj_typo\" (known: q_proj, k_proj, v_proj, "
                              "o_proj, gate_proj, up_proj, down_proj)";
  EXPECT_NE(config_msg.find(unknown), std::string::npos) << config_msg;
  for (const std::string& cmd : {std::string("estimate --preset llama2-7b --lora-targets q_proj v_proj_typo"),
                                 "estimate --config " + config_path("llama3/8b_qlora.yaml") +
                                     " --preset llama3-8b --lora-targets q_proj v_proj_typo"}) {
    SCOPED_TRACE(cmd);
    r = run(cmd);
    EXPECT_EQ(r.status, 1) << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
    EXPECT_NE(r.out.find("--lora-targets [q_proj, v_proj_typo]: " + unknown), std::string::npos) << r.out;
  }
  r = run("estimate --preset llama2-7b --lora-targets qq");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("unknown module \"qq\" (known: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)"),
            std::string::npos) << r.out;
  // The estimator's own check (EstimateOptions built in code) names the value it could not match.
  EstimateOptions o = qlora_opts();
  o.lora_targets = {"nothing", "lm_head"};
  const std::string e = test::error_of([&] { estimate_memory(preset_config("tiny"), o); });
  EXPECT_NE(e.find("the LoRA targets [nothing, lm_head] match no linear"), std::string::npos) << e;
}

// `estimate --config`: options given on the command line override the config's values (and the
// header says which), --set works as for train; a model.path that is not there yet says how to
// estimate without the weights (--preset), and --preset gives the shape then.
TEST(EstimateCli, ConfigTakesExplicitFlagsAndSet) {
  const std::string cfg = config_path("llama3/8b_qlora.yaml");
  CliRun r = run("estimate --config " + cfg);
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("model.path models/Meta-Llama-3-8B-Instruct has no config.json"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("add --preset NAME"), std::string::npos) << r.out;
  r = run("estimate --config " + cfg + " --preset llama3-8b --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json base = nlohmann::json::parse(r.out);
  EXPECT_EQ(base["options"]["seq_len"], 2048);
  EXPECT_EQ(base["options"]["lora_r"], 16);
  EXPECT_FALSE(base.contains("overrides"));
  r = run("estimate --config " + cfg + " --preset llama3-8b --json --seq-len 4096 --micro-batch-size 2 --lora-r 64 "
          "--dtype fp32 --no-gradient-checkpointing --no-double-quant");
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["options"]["seq_len"], 4096);
  EXPECT_EQ(j["options"]["micro_batch_size"], 2);
  EXPECT_EQ(j["options"]["lora_r"], 64);
  EXPECT_EQ(j["options"]["compute_bytes"], 4);
  EXPECT_EQ(j["options"]["gradient_checkpointing"], false);
  EXPECT_EQ(j["options"]["double_quant"], false);
  EXPECT_EQ(j["overrides"], (nlohmann::json{"--no-double-quant", "--lora-r 64", "--micro-batch-size 2",
                                            "--seq-len 4096", "--no-gradient-checkpointing", "--dtype fp32"}));
  EXPECT_GT(j["total_bytes"].get<int64_t>(), 2 * base["total_bytes"].get<int64_t>());
  // The same numbers as the flags on the preset alone (the config's values equal the defaults but
  // for the attention mask a micro-batch > 1 pads: compare with micro-batch 1).
  r = run("estimate --config " + cfg + " --preset llama3-8b --json --seq-len 4096 --lora-r 64 --dtype fp32 "
          "--no-gradient-checkpointing --no-double-quant");
  ASSERT_EQ(r.status, 0) << r.out;
  CliRun p = run("estimate --preset llama3-8b --json --seq-len 4096 --lora-r 64 --dtype fp32 "
                 "--no-gradient-checkpointing --no-double-quant");
  ASSERT_EQ(p.status, 0) << p.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["total_bytes"], nlohmann::json::parse(p.out)["total_bytes"]);
  // --set as for train; the text header names the overrides
  r = run("estimate --config " + cfg + " --preset llama3-8b --set data.sequence_len=1024 --lora-r 8");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("with overrides: --set data.sequence_len=1024 --lora-r 8 (shape from --preset llama3-8b)"),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find("micro-batch 1 × 1024 tokens"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("LoRA r=8 "), std::string::npos) << r.out;
  EXPECT_EQ(run("estimate --preset tiny --set data.sequence_len=1024").status, 1);  // --set needs --config
  EXPECT_EQ(run("estimate --preset tiny --model /x").status, 1);
  // the help says double quant is on by default (no "{false}" on the negation)
  r = run("estimate --help");
  EXPECT_EQ(r.out.find("{false}"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("double quant is on by default"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("qwen2.5-7b"), std::string::npos) << r.out;
}

// Inference on an NF4 base (what `eval` and `generate --quant nf4` run): `--method inference --bits 4`
// is estimated at 4 bits with the dequantization scratch of the largest linear (llama2-7b: the MLP's
// 11008 × 4096 in bf16 = 90,177,536 bytes) and the packed weights; without --bits inference is
// 16-bit. With --config an nf4 config stays 4-bit under --method inference. --method lora/full with
// --bits 4 is an error (conflicting flags). Before: --bits 4 became 16 for inference (12.55 GiB of
// "unquantized modules", no scratch, "bits": 16), the nf4 config said 16-bit, and lora ignored --bits.
TEST(EstimateCli, InferenceAtFourBitsKeepsNf4AndConflictsAreErrors) {
  auto component = [](const nlohmann::json& j, const std::string& name) {
    for (const nlohmann::json& c : j["components"])
      if (c["name"] == name) return c["bytes"].get<int64_t>();
    return int64_t{-1};
  };
  CliRun r = run("estimate --preset llama2-7b --method inference --bits 4 --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j4 = nlohmann::json::parse(r.out);
  EXPECT_EQ(j4["options"]["method"], "inference");
  EXPECT_EQ(j4["options"]["bits"], 4);
  EXPECT_EQ(component(j4, "dequantization scratch"), int64_t{11008} * 4096 * 2);
  EXPECT_GT(component(j4, "quantized weights (4-bit packed)"), 0);
  EstimateOptions o;
  o.method = EstimateOptions::Method::Inference;
  o.bits = 4;
  EXPECT_EQ(j4["total_bytes"].get<int64_t>(), estimate_memory(preset_config("llama2-7b"), o).total_bytes);
  r = run("estimate --preset llama2-7b --method inference --bits 4");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("method inference, 4-bit base"), std::string::npos) << r.out;
  r = run("estimate --preset llama2-7b --method inference --json");  // no --bits: a 16-bit base
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j16 = nlohmann::json::parse(r.out);
  EXPECT_EQ(j16["options"]["bits"], 16);
  EXPECT_EQ(component(j16, "dequantization scratch"), 0);
  EXPECT_GT(j16["total_bytes"].get<int64_t>(), 2 * j4["total_bytes"].get<int64_t>());  // 14.66 vs 6.10 GiB (docs/memory.md)
  r = run("estimate --preset llama2-7b --method inference --bits 8 --json");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["options"]["bits"], 8);
  // --config with quantization.method nf4: inference keeps 4 bits (and the config's blocksize).
  const std::string cfg = config_path("llama3/8b_qlora.yaml");
  r = run("estimate --config " + cfg + " --preset llama3-8b --method inference --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json jc = nlohmann::json::parse(r.out);
  EXPECT_EQ(jc["options"]["bits"], 4);
  EXPECT_GT(component(jc, "dequantization scratch"), 0);
  r = run("estimate --config " + cfg + " --preset llama3-8b --method inference --bits 16 --json");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["options"]["bits"], 16);
  r = run("estimate --config " + cfg + " --preset llama3-8b --method lora --json");  // lora: 16-bit base
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["options"]["bits"], 16);
  // Conflicting flags: one line, exit 1, with or without --config.
  for (const std::string& args : {std::string("--preset llama2-7b --method lora --bits 4"),
                                  std::string("--preset llama2-7b --method full --bits 4"),
                                  "--config " + cfg + " --preset llama3-8b --method lora --bits 4"}) {
    r = run("estimate " + args);
    EXPECT_EQ(r.status, 1) << args << "\n" << r.out;
    EXPECT_NE(r.out.find("--bits"), std::string::npos) << args << "\n" << r.out;
  }
  // The rule of thumb follows the estimate's bits: weights × 1.2 at 4 bits.
  for (const nlohmann::json& rule : j4["rule_of_thumb"]) {
    if (rule["rule"] == "inference = weights × 1.2 (at --bits)") {
      EXPECT_EQ(rule["bytes"].get<int64_t>(), static_cast<int64_t>(j4["model"]["num_parameters"].get<double>() * 0.5 * 1.2));
    }
  }
}

// Fits: the capacity of the class's smallest card (16 GB: T4, 15360 MiB) and the headroom.
TEST(EstimateCli, FitsStatesCapacityAndHeadroom) {
  CliRun r = run("estimate --preset llama2-70b --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const int64_t total = j["total_bytes"].get<int64_t>();
  ASSERT_EQ(j["fits"].size(), common_gpu_cards().size());
  EXPECT_EQ(j["fits"][0]["capacity_bytes"], int64_t{15360} << 20);
  EXPECT_EQ(j["fits"][1]["capacity_bytes"], int64_t{23028} << 20);
  for (const nlohmann::json& f : j["fits"]) {
    EXPECT_FALSE(f.contains("total_bytes")) << f;
    EXPECT_EQ(f["headroom_bytes"].get<int64_t>(), f["capacity_bytes"].get<int64_t>() - total) << f;
    EXPECT_EQ(f["fits"].get<bool>(), f["headroom_bytes"].get<int64_t>() >= 0) << f;
  }
  r = run("estimate --preset llama2-70b");
  ASSERT_EQ(r.status, 0) << r.out;
  const std::string short16 = human_bytes(static_cast<double>(total - (int64_t{15360} << 20)));
  const std::string spare80 = human_bytes(static_cast<double>((int64_t{81559} << 20) - total));
  EXPECT_NE(r.out.find("16 GB (T4 / V100-16 / A4000)        15.00 GiB   no, " + short16 + " short"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("yes, " + spare80 + " spare"), std::string::npos) << r.out;
}

// "What micro_batch_size fits in 80 GB?" answered per card class (trial 19 looped by hand): the
// largest N is the boundary of the estimate itself, which fits at N and not at N + 1 (each checked
// by its own `estimate --micro-batch-size`), 0 where micro-batch 1 does not fit; the text lists it.
TEST(EstimateCli, LargestMicroBatchPerCardIsTheEstimatesBoundary) {
  const std::string shape = "estimate --preset llama3-8b --seq-len 2048";
  CliRun r = run(shape + " --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json largest = nlohmann::json::parse(r.out)["largest_micro_batch_size"];
  ASSERT_EQ(largest.size(), common_gpu_cards().size()) << largest;
  auto fits = [&](int64_t mb, size_t card) {
    const CliRun e = run(shape + " --micro-batch-size " + std::to_string(mb) + " --json");
    EXPECT_EQ(e.status, 0) << e.out;
    return nlohmann::json::parse(e.out)["fits"][card]["fits"].get<bool>();
  };
  int64_t previous = 0;
  for (size_t c = 0; c < largest.size(); ++c) {
    const int64_t n = largest[c]["micro_batch_size"].get<int64_t>();
    EXPECT_GE(n, previous) << largest;  // the classes ascend in capacity
    previous = n;
    if (c != 0 && c != 2 && c + 1 != largest.size()) continue;  // three classes checked, each two runs
    ASSERT_GT(n, 0) << largest[c];  // an 8B QLoRA at 2048 tokens fits micro-batch 1 on a 16 GB card
    EXPECT_TRUE(fits(n, c)) << largest[c];
    EXPECT_FALSE(fits(n + 1, c)) << largest[c];
  }
  r = run(shape);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("largest micro_batch_size that fits (2048-token rows, the rest as above; 4096 at most):\n"),
            std::string::npos) << r.out;
  // A 70B at 16 bits fits no micro-batch on a 16 GB card.
  r = run("estimate --preset llama2-70b --method lora --json");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["largest_micro_batch_size"][0]["micro_batch_size"], 0) << r.out;
  r = run("estimate --preset llama2-70b --method lora");
  EXPECT_NE(r.out.find("none (micro-batch 1 does not fit)"), std::string::npos) << r.out;
  // No GPU card on a CPU estimate.
  r = run("estimate --preset tiny --device cpu --json");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_FALSE(nlohmann::json::parse(r.out).contains("largest_micro_batch_size")) << r.out;
}

// The dense mask is counted where `train` builds it: a padded micro-batch (above one row; --model /
// --preset too, as --config: trial 29 saw --model promise one micro-batch more) and rows past a
// sliding window (Mistral's 4096) at any micro-batch (LlamaModel::build_mask; trial 29: left out).
TEST(EstimateCli, MaskCountedForPaddedRowsAndPastTheSlidingWindow) {
  const auto mask_bytes = [](const std::string& args) -> int64_t {
    const CliRun r = run("estimate " + args + " --json");
    EXPECT_EQ(r.status, 0) << r.out;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    for (const nlohmann::json& c : j["components"])
      if (c["name"] == "attention mask (dense bool [B,1,T,T])") return c["bytes"].get<int64_t>();
    return 0;
  };
  EXPECT_EQ(mask_bytes("--preset llama3-8b --seq-len 4096"), 0);
  EXPECT_EQ(mask_bytes("--preset llama3-8b --seq-len 4096 --micro-batch-size 2"), int64_t{2} * 4096 * 4096);
  EXPECT_EQ(mask_bytes("--preset mistral-7b --seq-len 4096"), 0);  // within the window: causal SDPA
  EXPECT_EQ(mask_bytes("--preset mistral-7b --seq-len 8192"), int64_t{8192} * 8192);
  // --model and --config agree on a micro-batch of 2 (the config sets no packing)
  const qlora::test::TempDir d("estimate_mask");
  const std::filesystem::path cfg = d.path / "c.yaml";
  std::ofstream(cfg) << "output_dir: " << (d.path / "run").string()
                     << "\nmodel:\n  preset: llama3-8b\n  init: random\ndata:\n  train: x.jsonl\n  sequence_len: 4096\n"
                        "training:\n  micro_batch_size: 2\n";
  const CliRun a = run("estimate --preset llama3-8b --seq-len 4096 --micro-batch-size 2 --json"),
               b = run("estimate --config " + cfg.string() + " --json");
  ASSERT_EQ(a.status, 0) << a.out;
  ASSERT_EQ(b.status, 0) << b.out;
  EXPECT_EQ(nlohmann::json::parse(a.out)["total_bytes"], nlohmann::json::parse(b.out)["total_bytes"]);
  EXPECT_EQ(nlohmann::json::parse(a.out)["largest_micro_batch_size"],
            nlohmann::json::parse(b.out)["largest_micro_batch_size"]);
}

// A class whose cards disagree names each (before: "24 GB (RTX 4090 / A10G / L4) no, 129.28 MiB
// short" for codellama-34b, judged on the A10G's 23,028 MiB while an RTX 4090's 24,564 MiB fits).
TEST(EstimateCli, SplitCardClassNamesWhichCardsFit) {
  CliRun r = run("estimate --preset codellama-34b --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const int64_t total = j["total_bytes"].get<int64_t>();
  const nlohmann::json& c24 = j["fits"][1];
  ASSERT_EQ(c24["card"], "24 GB (RTX 4090 / A10G / L4)");
  EXPECT_FALSE(c24["fits"].get<bool>());  // the class: its smallest card
  ASSERT_EQ(c24["models"].size(), 3u);
  for (const nlohmann::json& m : c24["models"]) {
    EXPECT_EQ(m["headroom_bytes"].get<int64_t>(), m["capacity_bytes"].get<int64_t>() - total) << m;
    EXPECT_EQ(m["fits"].get<bool>(), m["model"] == "RTX 4090") << m;
  }
  EXPECT_EQ(c24["models"][2]["capacity_bytes"], int64_t{24564} << 20);
  r = run("estimate --preset codellama-34b");
  ASSERT_EQ(r.status, 0) << r.out;
  const std::string row = "24 GB (RTX 4090 / A10G / L4)        22.49 GiB   no on A10G (23,028 MiB) / L4 (23,034 MiB): " +
                          human_bytes(static_cast<double>(total - (int64_t{23028} << 20))) +
                          " short on the A10G; yes on RTX 4090 (24,564 MiB): " +
                          human_bytes(static_cast<double>((int64_t{24564} << 20) - total)) + " spare\n";
  EXPECT_NE(r.out.find(row), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("22.49 GiB   no, "), std::string::npos) << r.out;
  // docs/memory.md's numbers for it
  EXPECT_EQ(human_bytes(static_cast<double>(total)), "23.18 GiB");
  EXPECT_EQ(human_bytes(static_cast<double>(total - (int64_t{23028} << 20))), "705.87 MiB");
  EXPECT_EQ(human_bytes(static_cast<double>((int64_t{24564} << 20) - total)), "830.13 MiB");
}

// docs/memory.md states every card's nvidia-smi MiB as the code has it ("Fits"), and its 7B / 13B /
// 34B / 70B table's params, totals and smallest card that fits are what `qlora estimate` says.
TEST(EstimateCli, MemoryDocCardsAndTableAreTheCodes) {
  std::ifstream f(test::source_dir() / "docs" / "memory.md");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string doc = ss.str();
  ASSERT_FALSE(doc.empty());
  const size_t fits_at = doc.find("**Fits.**");
  ASSERT_NE(fits_at, std::string::npos);
  std::string fits = doc.substr(fits_at, doc.find("\n\n", fits_at) - fits_at);
  std::replace(fits.begin(), fits.end(), '\n', ' ');
  int models = 0;
  for (const GpuCard& g : common_gpu_cards()) {
    const std::string cls = g.name.substr(0, g.name.find(" ("));  // "24 GB"
    std::string list;
    for (const GpuModel& m : g.models) list += (list.empty() ? "" : ", ") + m.name + " " + std::to_string(m.capacity_bytes >> 20);
    EXPECT_NE(fits.find(cls + ": " + list + " MiB"), std::string::npos) << cls + ": " + list << "\n" << fits;
    models += static_cast<int>(g.models.size());
  }
  EXPECT_EQ(models, 12);
  const std::regex row(R"(\| \d+B \(`([a-z0-9.-]+)`\) \| ([0-9.]+) B \|.*\| \*\*([0-9.]+)\*\* \| ([^|]+) \|)");
  int rows = 0;
  for (std::sregex_iterator it(doc.begin(), doc.end(), row), end; it != end; ++it, ++rows) {
    const std::smatch& m = *it;
    SCOPED_TRACE(m.str());
    const CliRun r = run("estimate --preset " + m[1].str() + " --method qlora --lora-r 16 --seq-len 2048 "
                         "--micro-batch-size 1 --double-quant --json");
    ASSERT_EQ(r.status, 0) << r.out;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    std::ostringstream params;
    params << std::fixed << std::setprecision(2) << j["model"]["num_parameters"].get<double>() / 1e9;
    EXPECT_EQ(m[2].str(), params.str());
    std::ostringstream total;
    total << std::fixed << std::setprecision(2) << j["total_bytes"].get<double>() / (1 << 30);
    EXPECT_EQ(m[3].str(), total.str());
    // the first class with a card that fits: "16 GB", or "24 GB: RTX 4090 only (A10G / L4: no)"
    std::string smallest;
    for (const nlohmann::json& c : j["fits"]) {
      std::string yes, no;
      for (const nlohmann::json& mo : c["models"])
        (mo["fits"].get<bool>() ? yes : no) += ((mo["fits"].get<bool>() ? yes : no).empty() ? "" : " / ") +
                                                mo["model"].get<std::string>();
      if (yes.empty()) continue;
      const std::string name = c["card"].get<std::string>();
      smallest = name.substr(0, name.find(" ("));
      if (!no.empty()) smallest += ": " + yes + " only (" + no + ": no)";
      break;
    }
    EXPECT_EQ(m[4].str(), smallest);
  }
  EXPECT_EQ(rows, 4);
}

// The presets the code accepts (preset_names(), the one list) are the README's "Presets:" line and
// every --preset help text; no command line in the README lists only some of them (before: `qlora
// bench --preset tiny|small|llama2-7b`, while llama3-8b and the rest were accepted).
TEST(EstimateCli, ReadmeAndHelpListEveryPreset) {
  std::ifstream f(test::source_dir() / "README.md");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string readme = ss.str();
  std::string ticks, bars;
  for (const std::string& n : preset_names()) {
    ticks += (ticks.empty() ? "`" : ", `") + n + "`";
    bars += (bars.empty() ? "" : "|") + n;
  }
  std::string line = readme.substr(readme.find("Presets ("));
  line = line.substr(line.find(": ") + 2);
  std::replace(line.begin(), line.end(), '\n', ' ');
  EXPECT_EQ(line.substr(0, ticks.size() + 1), ticks + ".") << line.substr(0, 300);
  EXPECT_EQ(readme.find("--preset tiny|"), std::string::npos);
  for (const std::string cmd : {"bench", "estimate", "init-model"}) {
    const CliRun r = run(cmd + " --help");
    EXPECT_NE(r.out.find(bars), std::string::npos) << cmd << ":\n" << r.out;
  }
}

// Cost: the config's cost.gpu_hour_price applies (a flag overrides it); incomplete inputs say what
// is missing and how to measure tokens/s, and the memory estimate still prints; token counts are
// integers with separators; utilization 1 prints one line.
TEST(EstimateCli, CostFromConfigAndHints) {
  const std::string tiny = config_path("tiny/qlora.yaml");
  CliRun r = run("estimate --config " + tiny + " --set cost.gpu_hour_price=2 --tokens 3.6e6 --tokens-per-s 1000 --json");
  ASSERT_EQ(r.status, 0) << r.out;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_DOUBLE_EQ(j["cost"]["gpu_hour_price"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(j["cost"]["cost_full_utilization"].get<double>(), 2.0);
  r = run("estimate --config " + tiny + " --set cost.gpu_hour_price=2 --gpu-hour-price 3 --tokens 3.6e6 "
          "--tokens-per-s 1000 --json");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_DOUBLE_EQ(nlohmann::json::parse(r.out)["cost"]["cost_full_utilization"].get<double>(), 3.0);
  r = run("estimate --preset llama2-7b --gpu-hour-price 2");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("TOTAL (peak)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cost: a GPU-hour price is set; give --tokens N (the planned training tokens) and "
                       "--tokens-per-s R (one GPU's training throughput; `qlora bench --preset llama2-7b --seq-len "
                       "2048 --micro-batch-size 1` on the target GPU prints it) to price the run"),
            std::string::npos) << r.out;
  r = run("estimate --preset llama2-7b --tokens 1e8");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("cost: --tokens needs --tokens-per-s (one GPU's training throughput; `qlora bench --preset "
                       "llama2-7b"),
            std::string::npos) << r.out;
  r = run("estimate --preset llama2-7b --tokens 1e8 --json");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(nlohmann::json::parse(r.out)["cost_note"].get<std::string>().find("qlora bench"), std::string::npos);
  r = run("estimate --preset llama2-7b --tokens 1e8 --tokens-per-s 2000 --gpu-hour-price 2");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("cost of 100,000,000 tokens at 2000.00 tokens/s:\n  full utilization: 13.89 GPU-hours (13.89 h "
                       "wall-clock), cost 27.78 at 2.00 per GPU-hour\n  per 1M tokens (full utilization): 0.28\n"),
            std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("at utilization"), std::string::npos) << r.out;
  r = run("estimate --preset llama2-7b --tokens 1e8 --tokens-per-s 2000 --gpu-hour-price 2 --utilization 0.5");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("\n  at utilization 0.50: 27.78 GPU-hours (27.78 h wall-clock), cost 55.56\n"), std::string::npos)
      << r.out;
}

// The "7B in 16 GB" claim is a verdict on this config against the number it is compared with (the
// 16 GB row's T4 15,360 MiB); a --device cpu estimate judges no GPU card; a sequence longer than
// config.json's max_position_embeddings (4096 for Llama 2, as the hub config) is warned about.
// Before: "claim: a 7B QLoRA fine-tune fits in 16 GB   14.90 GiB" (16e9 bytes, no verdict), the
// card table on --device cpu, and no warning at 8192.
TEST(EstimateCli, ClaimVerdictCpuCardsAndLengthWarning) {
  const int64_t t4 = int64_t{15360} << 20;
  CliRun r = run("estimate --preset llama2-7b --json");
  ASSERT_EQ(r.status, 0) << r.out;
  nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["claims"].size(), 1u) << j["claims"];
  EXPECT_EQ(j["claims"][0]["limit_bytes"].get<int64_t>(), t4);
  EXPECT_EQ(j["claims"][0]["total_bytes"], j["total_bytes"]);
  EXPECT_TRUE(j["claims"][0]["holds"].get<bool>());
  EXPECT_TRUE(j["warnings"].empty()) << j["warnings"];
  for (const nlohmann::json& rule : j["rule_of_thumb"])
    EXPECT_EQ(rule["rule"].get<std::string>().find("claim"), std::string::npos) << rule;
  r = run("estimate --preset llama2-7b");
  ASSERT_EQ(r.status, 0) << r.out;
  const std::string total = human_bytes(static_cast<double>(j["total_bytes"].get<int64_t>()));
  EXPECT_NE(r.out.find("claim \"a 7B QLoRA fine-tune fits in 16 GB\": this config's total " + total +
                       " fits the 15.00 GiB it is compared with (16 GB (T4 / V100-16 / A4000): a T4's nvidia-smi "
                       "memory.total, 15,360 MiB)\n"),
            std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("warning:"), std::string::npos) << r.out;
  // 8192 × 4: too long for Llama 2 and too big for a T4.
  r = run("estimate --preset llama2-7b --seq-len 8192 --micro-batch-size 4");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("\nwarning: sequence length 8192 exceeds the model's max_position_embeddings 4096"),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find("does not fit the 15.00 GiB it is compared with"), std::string::npos) << r.out;
  r = run("estimate --preset llama2-7b --seq-len 8192 --micro-batch-size 4 --json");
  j = nlohmann::json::parse(r.out);
  EXPECT_FALSE(j["claims"][0]["holds"].get<bool>());
  EXPECT_GT(j["total_bytes"].get<int64_t>(), t4);
  ASSERT_EQ(j["warnings"].size(), 1u);
  // The QLoRA claim is not judged on a 16-bit LoRA (or full / inference) config (a trial saw "this
  // config's total 15.14 GiB does not fit" for --method lora).
  for (const char* m : {"lora", "full", "inference"}) {
    r = run(std::string("estimate --preset llama2-7b --method ") + m + " --json");
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_TRUE(nlohmann::json::parse(r.out)["claims"].empty()) << m;
    r = run(std::string("estimate --preset llama2-7b --method ") + m);
    EXPECT_EQ(r.out.find("claim \""), std::string::npos) << m << r.out;
  }
  // --device cpu: no card verdicts, said why; the claim is labelled a GPU claim.
  r = run("estimate --preset llama2-7b --device cpu");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.find("fits on (capacity"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("spare"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fits on: not applicable to --device cpu"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("a GPU claim, and this is a --device cpu estimate"), std::string::npos) << r.out;
  r = run("estimate --preset llama2-7b --device cpu --json");
  j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["fits"].empty());
  EXPECT_NE(j["fits_note"].get<std::string>().find("--device cpu"), std::string::npos);
  EXPECT_FALSE(j.contains("cuda_note"));
  // A CUDA estimate says, in its text and JSON, what GPU checked it, and only that (trial 29)
  r = run("estimate --preset llama2-7b --json");
  EXPECT_NE(nlohmann::json::parse(r.out)["cuda_note"].get<std::string>().find("checked on one GPU only (an H200"), std::string::npos);
  r = run("estimate --preset llama2-7b");
  EXPECT_NE(r.out.find("\nnote: the CUDA estimate was checked on one GPU only (an H200, torch 2.11, 2026-12-04: peak "
                       "reserved within -0.8%..+3.3% for llama2-7b/13b, which it was fitted to, and -3.4%..+7.5% for llama3-8b"),
            std::string::npos) << r.out;
  // The 13B claim: compared with 28e9 bytes.
  r = run("estimate --preset llama2-13b --json");
  j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["claims"].size(), 1u);
  EXPECT_EQ(j["claims"][0]["limit_bytes"].get<int64_t>(), 28000000000);
}

// The shipped configs' "Memory:" comment lines state what `qlora estimate` prints for them.
TEST(EstimateCli, ShippedConfigMemoryCommentsAreTrue) {
  const std::regex line(R"(# Memory: `qlora estimate --config (\S+) --preset (\S+)` \(no download needed\) gives ([0-9.]+ GiB) per GPU\.)");
  int checked = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(test::source_dir() / "configs")) {
    if (e.path().extension() != ".yaml") continue;
    std::ifstream in(e.path());
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(text.find("Fits one"), std::string::npos) << e.path();
    std::smatch m;
    if (!std::regex_search(text, m, line)) continue;
    SCOPED_TRACE(e.path().string());
    EXPECT_EQ(test::source_dir() / m[1].str(), e.path());
    const CliRun r = run("estimate --config " + config_path(std::filesystem::relative(e.path(),
                         test::source_dir() / "configs").string()) + " --preset " + m[2].str() + " --json");
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_EQ(human_bytes(static_cast<double>(nlohmann::json::parse(r.out)["total_bytes"].get<int64_t>())), m[3].str());
    ++checked;
  }
  EXPECT_EQ(checked, 5);  // llama2, llama3, mistral, qwen2.5, qwen3
}

// `qlora bench --preset tiny --steps 3`: runs, reports throughput and peak memory measured next to
// the estimate. CPU peak RSS includes glibc's cached free blocks and libtorch's own allocations, so
// only a loose bound holds (docs/memory.md, "CPU measurement").
TEST(BenchCli, TinySmoke) {
  // gradient checkpointing on (the default), unpadded rows: the plain causal path
  const CliRun r = run("bench --preset tiny --steps 3 --seq-len 128 --micro-batch-size 2");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("tokens/s"), std::string::npos) << r.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(\n\s+128\s+2\s+[0-9.]+\s+[0-9]+)"))) << r.out;
}

// --max-time-s bounds the whole command, the weight build included, and a bench that measured no
// point is an error (exit 1) saying why, after a line saying what it was doing. Before: the
// weights of llama2-7b took 107 s of silence past a 30 s budget, then exit 0 with no number.
TEST(BenchCli, MaxTimeBoundsTheWeightBuildAndNothingMeasuredIsAnError) {
  test::TempDir d("bench_budget");
  for (const std::string& extra : {std::string(), " --sweep --seq-lens 64 --batch-sizes 1 --out " + (d.path / "b").string()}) {
    SCOPED_TRACE(extra);
    const CliRun r = run("bench --preset small --steps 2 --seq-len 64 --max-time-s 0.001" + extra);
    EXPECT_EQ(r.status, 1) << r.out;
    EXPECT_NE(r.out.find("bench: making random NF4 weights for small"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("error: bench: nothing measured: the --max-time-s budget of 0.001 s ended while making the "
                         "random weights of small"),
              std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("tokens/s"), std::string::npos) << r.out;
  }
}

// Before the weights, bench says how long a step and the whole bench will take here; predicted over
// 10 minutes without --max-time-s it refuses (exit 1) naming --max-time-s, and --max-time-s lets the
// same bench run. The matmul speed is forced (QLORA_BENCH_TEST_MATMUL_GFLOPS) so that one step of
// tiny at 32 tokens is predicted at ~40 s and 20 steps at ~800 s; the real steps take milliseconds.
// Before: no prediction, and llama3-8b at 2048 tokens ran 10 minutes on 2 cores until killed.
TEST(BenchCli, RefusesABenchPredictedOverTenMinutesUnlessMaxTimeIsGiven) {
  EstimateOptions e;
  e.seq_len = 32;
  e.compute_bytes = 4;
  const double flops = training_flops_per_token(preset_config("tiny"), e).hardware_flops * 32;
  std::ostringstream gflops;
  gflops << std::setprecision(17) << flops / 40 / 1e9;
  const std::string cmd = "QLORA_BENCH_TEST_MATMUL_GFLOPS=" + gflops.str() + " " + test::qlora_bin() +
                          " bench --preset tiny --steps 20 --seq-len 32";
  CliRun r = qlora::test::run_command(cmd);
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("bench: one step of tiny at 32 tokens: about 40 s on this CPU (measured "), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("bench: the whole bench: about 13 min (random weights about "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("error: bench: tiny would take about 13 min on this CPU"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("over the 600 s a bench runs without a limit; pass --max-time-s S to run it anyway"),
            std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("making random NF4 weights"), std::string::npos) << r.out;  // refused before the slow part
  r = qlora::test::run_command(cmd + " --max-time-s 60");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("making random NF4 weights for tiny"), std::string::npos) << r.out;
  std::smatch m;
  EXPECT_TRUE(std::regex_search(r.out, m, std::regex(R"(\n\s+32\s+1\s+[0-9.]+\s+[0-9]+)"))) << r.out;
  // a 2-step bench predicted at ~80 s runs without --max-time-s
  r = qlora::test::run_command("QLORA_BENCH_TEST_MATMUL_GFLOPS=" + gflops.str() + " " + test::qlora_bin() +
                               " bench --preset tiny --steps 2 --seq-len 32");
  EXPECT_EQ(r.status, 0) << r.out;
}

// The activation term against a measurement: `qlora bench --preset small` (H 256, I 688, 4 layers,
// V 32000; fp32 on CPU; no checkpointing, so every layer's saved activations count) at seq 256 and at seq 1024, one process
// each so that each peak RSS starts clean. Everything but the token-dependent terms (saved
// activations, loss buffers, logits chunk, backward temporaries) is the same in both runs, so the
// growth of the estimated total is the estimator's activation growth and the growth of the measured
// peak (VmHWM − RSS before the model) is the same thing as the process saw it.
// One step per run (the peak is the first step's forward/backward; a second step only adds glibc
// reuse noise). Measured here (2026-11-29, 2 shared cores, loaded): measured growth 354.2 MiB
// (188.7 -> 542.9 MiB), estimated 380.2 MiB: +7.3% (an earlier build: 366.1 MiB, +3.9%); with
// --steps 2: 342.4 vs 380.2 MiB, +11.0%; 128 -> 512 tokens: 185.3 vs 190.1 MiB, +2.6%.
// Tolerance ±25%, about twice the worst error seen:
// CPU RSS counts pages, not tensors (glibc keeps and reuses freed blocks, first-use thread-pool and
// OpenMP buffers, page granularity); these mostly cancel in a difference of two runs, not fully.
// The 5% goal of issue 7 applies to CUDA peak reserved (docs/memory.md, "CPU measurement").
// Runtime: ~7 s on an idle machine (+4.5% there), ~20-40 s on a loaded one (two processes).
struct BenchCsvPoint {
  int64_t measured = 0, estimated = 0;
};
BenchCsvPoint bench_small_point(int64_t seq, const std::filesystem::path& dir) {
  const std::string prefix = (dir / ("act-" + std::to_string(seq))).string();
  const CliRun r = run("bench --preset small --steps 1 --no-gradient-checkpointing --sweep --seq-lens " +
                       std::to_string(seq) + " --batch-sizes 1 --out " + prefix);
  EXPECT_EQ(r.status, 0) << r.out;
  std::ifstream f(prefix + ".csv");
  std::string header, row;
  std::getline(f, header);
  std::getline(f, row);
  // seq_len,micro_batch_size,fits,step_s,tokens_per_s,mfu,hfu,measured_peak_bytes,measured_reserved_bytes,
  // estimated_bytes,relative_error,cost_per_million_tokens
  std::vector<std::string> cols;
  std::stringstream ss(row);
  for (std::string c; std::getline(ss, c, ',');) cols.push_back(c);
  BenchCsvPoint p;
  if (cols.size() < 10) {
    ADD_FAILURE() << "bad CSV row '" << row << "' in " << prefix << ".csv\n" << r.out;
    return p;
  }
  EXPECT_EQ(cols[2], "true") << r.out;
  // on a CPU without a price: no MFU / HFU (no peak FLOP/s known), no reserved bytes, no cost: empty
  // fields, not 0 (before: 0, which plots as a measurement); the step time is measured
  EXPECT_FALSE(cols[3].empty()) << row;
  EXPECT_EQ(cols[5] + cols[6] + cols[8] + cols[11], "") << row;
  p.measured = std::stoll(cols[7]);
  p.estimated = std::stoll(cols[9]);
  return p;
}

TEST(BenchCli, ActivationTermMatchesMeasuredCpuPeakGrowth) {
  const qlora::test::TempDir dir("bench_act");
  const BenchCsvPoint a = bench_small_point(256, dir.path), b = bench_small_point(1024, dir.path);
  ASSERT_GT(a.measured, 0);
  ASSERT_GT(b.measured, a.measured);
  const double measured = static_cast<double>(b.measured - a.measured);
  const double estimated = static_cast<double>(b.estimated - a.estimated);
  const double err = (estimated - measured) / measured;
  RecordProperty("measured_growth_bytes", std::to_string(b.measured - a.measured));
  RecordProperty("estimated_growth_bytes", std::to_string(b.estimated - a.estimated));
  EXPECT_NEAR(err, 0.0, 0.25) << "peak growth 256 -> 1024 tokens: measured " << human_bytes(measured)
                              << ", estimated " << human_bytes(estimated) << " (" << 100 * err << "%)";
  std::printf("activation growth 256 -> 1024 tokens (small, fp32, CPU): measured %.1f MiB, estimated %.1f MiB, "
              "error %+.1f%%\n", measured / (1 << 20), estimated / (1 << 20), 100 * err);
}

}  // namespace
}  // namespace qlora
