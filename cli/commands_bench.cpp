// `qlora bench`: synthetic-shape training throughput and memory. Random NF4 weights made in memory
// (LlamaModel::random_init quantizes layer by layer), LoRA all-linear, AdamW, train_step on random
// tokens; nothing is downloaded or written except the --sweep CSV/SVG.
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iomanip>
#include <random>
#include <sstream>

#include "common/error.h"
#include "common/files.h"
#include "common/format.h"
#include "common/log.h"
#include "data/batch.h"
#include "kernels/quant_tensor.h"
#include "cli/commands.h"
#include "cli/svg_chart.h"
#include "trainer/estimate.h"
#include "trainer/memory.h"
#include "model/model.h"
#include "trainer/train.h"

namespace qlora {
namespace {

/// A bench predicted to take longer than this without --max-time-s is refused (seconds).
constexpr double kUnboundedBenchLimitS = 600;

struct BenchPoint {
  int64_t seq_len = 0, micro_batch_size = 0;
  bool fits = true;
  double step_s = 0, tokens_per_s = 0, mfu = 0, hfu = 0, final_loss = 0;
  int64_t measured_peak = 0;    ///< CUDA peak allocated, or CPU peak RSS − RSS before the model
  int64_t measured_reserved = 0;///< CUDA peak reserved (0 on CPU)
  int64_t estimated = 0;        ///< estimate without the CUDA context constant (tensors + segment rounding)
  int64_t estimated_allocated = 0;  ///< the same without the allocator's segment rounding
};

/// Random tokens, every one a label, one example per row, no padding (causal SDPA, no mask).
data::Batch random_batch(int64_t rows, int64_t seq, int64_t vocab, std::mt19937_64& rng) {
  data::Batch b;
  b.batch_size = rows;
  b.seq_len = seq;
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(vocab - 1));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t t = 0; t < seq; ++t) {
      const int32_t id = tok(rng);
      b.input_ids.push_back(id);
      b.labels.push_back(id);
      b.attention_mask.push_back(1);
      b.position_ids.push_back(static_cast<int32_t>(t));
      b.segment_ids.push_back(1);
    }
    b.example_ids.push_back(r);
  }
  return b;
}

EstimateOptions point_options(const BenchOptions& o, int64_t seq, int64_t mb, const torch::Device& dev,
                              torch::Dtype dtype) {
  EstimateOptions e;
  e.method = EstimateOptions::Method::QLora;
  e.bits = 4;
  e.blocksize = 64;
  e.double_quant = true;
  e.lora_r = o.lora_r;
  e.lora_targets = {kAllLinear};
  e.lora_dropout = LoraConfig{}.dropout;
  e.micro_batch_size = mb;
  e.seq_len = seq;
  e.gradient_checkpointing = !o.no_gradient_checkpointing;
  e.compute_bytes = dtype == torch::kFloat32 ? 4 : 2;
  e.cuda = dev.is_cuda();
  e.overhead_bytes = 0;  // compared with allocator / RSS numbers, which exclude the context
  return e;
}

void drop_lora(LlamaModel& m) {
  for (FrozenLinear* f : m.linears()) f->lora = nullptr;
}

/// One grid point: o.steps optimizer steps (the first untimed unless it is the only one). Stops
/// after a step when `out_of_time()` says the --max-time-s budget is spent; `stopped` then says so,
/// and a point stopped before any timed step has step_s 0 (not measured).
BenchPoint run_point(LlamaModel& model, const BenchOptions& o, int64_t seq, int64_t mb, int64_t rss_base,
                     double peak_flops, const std::function<bool()>& out_of_time, bool* stopped) {
  const torch::Device dev = model.device();
  BenchPoint p;
  p.seq_len = seq;
  p.micro_batch_size = mb;
  const EstimateOptions eo = point_options(o, seq, mb, dev, model.dtype());
  const MemoryEstimate est = estimate_memory(model.config(), eo);
  p.estimated = est.total_bytes;
  p.estimated_allocated = est.total_bytes - est.reserved_only_bytes();
  const TrainingFlops fl = training_flops_per_token(model.config(), eo);
  const LoraConfig lc;
  std::mt19937_64 rng(o.seed + 7919 * static_cast<uint64_t>(seq) + static_cast<uint64_t>(mb));
  const data::Batch batch = random_batch(mb, seq, model.config().vocab_size, rng);
  reset_peak_memory(dev);
  double timed = 0;
  int64_t timed_steps = 0;
  try {
    LoraOptions lo;
    lo.r = o.lora_r;
    lo.alpha = lc.alpha;
    lo.dropout = lc.dropout;
    lo.target_modules = {kAllLinear};
    lo.seed = o.seed;
    model.add_lora(lo);
    auto opt = make_adamw(model.lora_parameters(), TrainingConfig{});
    for (int64_t s = 0; s < o.steps; ++s) {
      const auto t0 = std::chrono::steady_clock::now();
      StepOptions so;
      so.lr = 1e-4;
      so.max_grad_norm = 1.0;
      StepResult r = train_step(model, *opt, {batch}, so);
      if (dev.is_cuda()) torch::cuda::synchronize();
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      p.final_loss = r.loss;
      if (s > 0 || o.steps == 1) {  // the first step (allocator warm-up, Adam state creation) is not timed
        timed += dt;
        ++timed_steps;
      }
      if (s + 1 < o.steps && out_of_time()) {
        *stopped = true;
        break;
      }
    }
  } catch (const c10::OutOfMemoryError& e) {
    p.fits = false;
    log::warn("bench: seq_len ", seq, " × micro-batch ", mb, " does not fit: ", std::string(e.what_without_backtrace()).substr(0, 160));
  }
  drop_lora(model);
  const nlohmann::json m = memory_snapshot(dev);
  if (dev.is_cuda()) {
    p.measured_peak = m.value("cuda_peak_allocated_bytes", int64_t{0});
    p.measured_reserved = m.value("cuda_peak_reserved_bytes", int64_t{0});
  } else {
    p.measured_peak = m.value("peak_rss_bytes", int64_t{0}) - rss_base;
  }
  if (p.fits && timed_steps > 0) {
    p.step_s = timed / static_cast<double>(timed_steps);
    p.tokens_per_s = static_cast<double>(seq * mb) / p.step_s;
    if (peak_flops > 0) {
      p.mfu = fl.model_flops * p.tokens_per_s / peak_flops;
      p.hfu = fl.hardware_flops * p.tokens_per_s / peak_flops;
    }
  }
  reset_peak_memory(dev);
  return p;
}

/// Seconds one call of `f` takes: one untimed warm-up call, then calls until `budget_s` has passed
/// (at least one, at most 50), averaged; CUDA work is synchronised before each clock read.
double seconds_per_call(const std::function<void()>& f, bool cuda, double budget_s) {
  auto sync = [&] {
    if (cuda) torch::cuda::synchronize();
  };
  f();
  sync();
  const auto t0 = std::chrono::steady_clock::now();
  int calls = 0;
  double s = 0;
  do {
    f();
    sync();
    ++calls;
    s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (s < budget_s && calls < 50);
  return s / calls;
}

/// The environment variable that replaces the measured matmul throughput (GFLOP/s), for tests of
/// the refusal logic without a slow bench (docs/memory.md, "How long a bench takes").
constexpr const char* kTestMatmulGflopsEnv = "QLORA_BENCH_TEST_MATMUL_GFLOPS";

/// What `dev` does per second, measured in about a second before anything slow (DeviceRates):
/// a [min(tokens, 256 CPU / 4096 CUDA), H] × [H, min(I, 4096 CPU / 16384 CUDA)] matmul in `dtype`;
/// drawing a 4M-element random tensor as LlamaModel::random_init does (CPU generator, or the
/// device's when `draw_on_device`) and converting it to `dtype` (plain) or also quantizing it to
/// NF4 bs64 double quant; and dequantizing that to `dtype`.
DeviceRates measure_rates(const ModelConfig& cfg, const torch::Device& dev, torch::Dtype dtype, int64_t tokens,
                          bool draw_on_device) {
  const bool cuda = dev.is_cuda();
  DeviceRates r;
  const int64_t m = std::min<int64_t>(tokens, cuda ? 4096 : 256), k = cfg.hidden_size,
                n = std::min<int64_t>(cfg.intermediate_size, cuda ? 16384 : 4096);
  const auto opts = torch::TensorOptions().dtype(dtype).device(dev);
  const torch::Tensor a = torch::randn({m, k}, opts), b = torch::randn({k, n}, opts);
  r.matmul_flops = 2.0 * static_cast<double>(m * k * n) / seconds_per_call([&] { (void)torch::mm(a, b); }, cuda, 0.3);
  if (const char* g = std::getenv(kTestMatmulGflopsEnv); g && *g) r.matmul_flops = std::stod(g) * 1e9;

  const bool on_device = draw_on_device && cuda;
  at::Generator gen = on_device ? at::globalContext().defaultGenerator(dev).clone()
                                : at::make_generator<at::CPUGeneratorImpl>(uint64_t{0});
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(on_device ? dev : torch::Device(torch::kCPU));
  const int64_t sample = int64_t{4} << 20;
  const double plain_s =
      seconds_per_call([&] { (void)at::normal(0.0, 0.02, {sample}, gen, f32).to(dev, dtype); }, cuda, 0.1);
  QuantizedWeight qw;
  const double quant_s = seconds_per_call(
      [&] { qw = quantize(at::normal(0.0, 0.02, {sample}, gen, f32).to(dev, dtype), kernels::Quant4Type::NF4, 64, true); },
      cuda, 0.1);
  const double deq_s = seconds_per_call([&] { (void)qw.dequantize(dtype); }, cuda, 0.1);
  r.plain_init_elements = static_cast<double>(sample) / plain_s;
  r.quantized_init_elements = static_cast<double>(sample) / quant_s;
  r.dequant_elements = static_cast<double>(sample) / deq_s;
  return r;
}

/// Seconds as "940 s" below 10 minutes, else "1.3 h" / "25 min".
std::string duration_text(double s);

/// `x` with `digits` decimals ("107.6"), or as the stream prints it by default when digits < 0 ("30").
std::string format_number(double x, int digits = -1) {
  std::ostringstream os;
  if (digits >= 0) os << std::fixed << std::setprecision(digits);
  os << x;
  return os.str();
}

std::string duration_text(double s) {
  if (s < 600) return format_number(s, s < 10 ? 1 : 0) + " s";
  if (s < 7200) return format_number(s / 60, 0) + " min";
  return format_number(s / 3600, 1) + " h";
}

std::string pct(double x) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1) << 100.0 * x << "%";
  return os.str();
}

/// Peak memory (measured solid, estimated dashed) against sequence length, one colour per batch size.
std::string svg_chart(const std::vector<BenchPoint>& pts, const std::string& title, bool cuda) {
  LineChart c;
  c.title = title;
  c.x_label = "sequence length (tokens)";
  c.y_label = std::string("peak ") + (cuda ? "allocated" : "RSS growth") + " (GiB)";
  const double gib = 1 << 30;
  std::vector<int64_t> bss;
  for (const BenchPoint& p : pts) {
    const double x = static_cast<double>(p.seq_len);
    if (std::find(c.x_ticks.begin(), c.x_ticks.end(), x) == c.x_ticks.end()) c.x_ticks.push_back(x);
    auto it = std::find(bss.begin(), bss.end(), p.micro_batch_size);
    if (it == bss.end()) {
      bss.push_back(p.micro_batch_size);
      c.series.push_back({"batch " + std::to_string(p.micro_batch_size), {}, {}});
      it = bss.end() - 1;
    }
    ChartSeries& se = c.series[static_cast<size_t>(it - bss.begin())];
    se.solid.push_back({x, static_cast<double>(p.measured_peak) / gib, !p.fits});
    se.dashed.push_back({x, static_cast<double>(p.estimated_allocated) / gib, false});
  }
  return svg_line_chart(c);
}

}  // namespace

std::string cmd_bench(const BenchOptions& o) {
  const auto start = std::chrono::steady_clock::now();  // --max-time-s counts from here
  auto since_start = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  QLORA_CHECK(o.preset.empty() != o.model_dir.empty(), "bench: give exactly one of --preset NAME, --model DIR");
  QLORA_CHECK(o.steps > 0, "bench: --steps must be > 0, got ", o.steps);
  QLORA_CHECK(o.lora_r > 0, "bench: --lora-r must be > 0, got ", o.lora_r);
  QLORA_CHECK(std::isfinite(o.gpu_hour_price) && o.gpu_hour_price >= 0,
              "bench: --gpu-hour-price must be a finite number >= 0, got ", o.gpu_hour_price);
  QLORA_CHECK(std::isfinite(o.peak_tflops) && o.peak_tflops >= 0,
              "bench: --peak-tflops must be > 0 (or 0: from the GPU's name), got ", o.peak_tflops);
  QLORA_CHECK(o.max_time_s >= 0, "bench: --max-time-s must be >= 0, got ", o.max_time_s);
  std::vector<std::pair<int64_t, int64_t>> grid;
  if (o.sweep) {
    for (int64_t mb : o.sweep_batch_sizes)
      for (int64_t t : o.sweep_seq_lens) grid.emplace_back(t, mb);
  } else {
    grid.emplace_back(o.seq_len, o.micro_batch_size);
  }
  for (const auto& [t, mb] : grid)
    QLORA_CHECK(t > 1 && mb > 0, "bench: sequence lengths must be > 1 and micro-batch sizes > 0, got ", t, " × ", mb);
  const ModelConfig cfg = !o.preset.empty() ? preset_config(o.preset) : load_model_config(o.model_dir);
  // Validates r against the layer widths before anything is allocated.
  estimate_memory(cfg, point_options(o, grid[0].first, grid[0].second, torch::kCPU, torch::kFloat32));

  const torch::Device dev = torch::cuda::is_available() ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
  const torch::Dtype dtype = dev.is_cuda() ? torch::kBFloat16 : torch::kFloat32;
  const double peak_flops = o.peak_tflops > 0 ? o.peak_tflops * 1e12 : peak_flops_for_device_name(device_name(dev));
  QuantOptions q;
  q.quant_type = kernels::Quant4Type::NF4;
  q.blocksize = 64;
  q.double_quant = true;
  const bool cuda = dev.is_cuda();
  const std::string what = o.preset.empty() ? o.model_dir : o.preset;
  reset_peak_memory(dev);  // initialises CUDA first (memory.h)
  // How long this bench will take, from what this device does per second (about a second to
  // measure): the weights, and every step of every point. Without --max-time-s a bench predicted
  // over kUnboundedBenchLimitS is refused before anything slow.
  int64_t max_tokens = 0;
  for (const auto& [t, mb] : grid) max_tokens = std::max(max_tokens, t * mb);
  const DeviceRates rates = measure_rates(cfg, dev, dtype, max_tokens, /*draw_on_device=*/cuda);
  const std::string here = cuda ? "this GPU (" + device_name(dev) + ")" : std::string("this CPU");
  const double weights_est = random_weights_seconds(cfg, /*quantized=*/true, rates);
  auto step_est = [&](int64_t t, int64_t mb) {
    return training_step_seconds(cfg, point_options(o, t, mb, dev, dtype), rates);
  };
  double bench_est = weights_est, largest_step = 0;
  std::pair<int64_t, int64_t> largest{grid[0]};
  for (const auto& [t, mb] : grid) {
    const double s = step_est(t, mb);
    bench_est += static_cast<double>(o.steps) * s;
    if (s >= largest_step) {
      largest_step = s;
      largest = {t, mb};
    }
  }
  const std::string tokens_text = (largest.second > 1 ? std::to_string(largest.second) + " × " : std::string()) +
                                  std::to_string(largest.first) + " tokens";
  log::info("bench: one step of ", what, " at ", tokens_text, ": about ", duration_text(largest_step), " on ", here,
            " (measured ", format_number(rates.matmul_flops / 1e9, 1), " GFLOP/s", !cuda ? " in fp32" : "",
            "; the FLOPs at that speed plus the 4-bit dequantizations)");
  log::info("bench: the whole bench: about ", duration_text(bench_est), " (random weights about ",
            duration_text(weights_est), " + ", grid.size() * static_cast<size_t>(o.steps),
            grid.size() * static_cast<size_t>(o.steps) == 1 ? " step)" : " steps)");
  if (o.max_time_s <= 0 && bench_est > kUnboundedBenchLimitS)
    fail("bench: ", what, " would take about ", duration_text(bench_est), " on ", here, " (weights about ",
         duration_text(weights_est), ", one step at ", tokens_text, " about ", duration_text(largest_step),
         "), over the ", format_number(kUnboundedBenchLimitS), " s a bench runs without a limit; pass --max-time-s S "
         "to run it anyway (the whole command stops by S s), or use a smaller --preset or --seq-len");
  // The CSV is opened before anything slow (after the refusal above, which leaves no file), and
  // every row is appended as its point finishes.
  std::ofstream csv;
  if (o.sweep) {
    csv.open(o.out_prefix + ".csv", std::ios::trunc);
    QLORA_CHECK(csv.good(), "bench: cannot write ", o.out_prefix, ".csv");
    csv << "seq_len,micro_batch_size,fits,step_s,tokens_per_s,mfu,hfu,measured_peak_bytes,measured_reserved_bytes,"
           "estimated_bytes,relative_error,cost_per_million_tokens,estimated_allocated_bytes,start_unix_s,end_unix_s\n";
    csv.flush();
  }
  const int64_t rss_base = memory_snapshot(dev).value("rss_bytes", int64_t{0});
  torch::manual_seed(o.seed);
  const auto t0 = std::chrono::steady_clock::now();
  // On CUDA the random weights are drawn on the device (one CPU thread needs ~70-200 s for 7-8B).
  log::info("bench: making random NF4 weights for ", what, " (", cfg.num_parameters(), " parameters) on ", dev.str(),
            o.max_time_s > 0 ? ", within --max-time-s " + format_number(o.max_time_s) + " s" : std::string(),
            "; expect about ", duration_text(weights_est), " (from a 4M-element sample: ",
            format_number(rates.quantized_init_elements / 1e6, 1), " M elements/s drawn and quantized, ",
            format_number(rates.plain_init_elements / 1e6, 1), " M/s drawn only); rechecked after the first layer");
  bool told = false;
  // The first tensor is the embedding, drawn but not quantized (faster per element than the
  // layers); the layers' own rate, from the calls after it, predicts the rest.
  double first_s = -1;
  int64_t first_done = 0;
  auto progress = [&](int64_t done, int64_t total) {
    const double made_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (first_s < 0) {
      first_s = made_s;
      first_done = done;
    }
    const int64_t layer_done = done - first_done;
    const bool known = layer_done * cfg.num_hidden_layers >= total || done == total;  // about one layer made
    const double per_element = layer_done > 0 ? (made_s - first_s) / static_cast<double>(layer_done)
                                              : made_s / static_cast<double>(done);
    const double expect = made_s + per_element * static_cast<double>(total - done);
    const double pct_done = 100.0 * static_cast<double>(done) / static_cast<double>(total);
    if (known && !told && expect > 5 && done < total) {
      told = true;
      log::info("bench: weights ", format_number(pct_done, 0), "% made in ", format_number(made_s, 1),
                " s; expect about ", format_number(expect, 0), " s for all of them");
    }
    const double before = since_start() - made_s;  // CUDA init etc. before the weights
    if (o.max_time_s > 0 && (since_start() > o.max_time_s || (known && before + expect > o.max_time_s)))
      fail("bench: nothing measured: the --max-time-s budget of ", format_number(o.max_time_s), " s ",
           since_start() > o.max_time_s ? "ended" : "would end", " while making the random weights of ", what, " (",
           format_number(pct_done, 0), "% made in ", format_number(made_s, 1), " s on ", dev.str(), ", about ",
           format_number(expect, 0), " s for all); raise --max-time-s, use a smaller --preset, or a GPU");
  };
  LlamaModel model = LlamaModel::random_init(cfg, o.seed, dtype, dev, q, 0.02, /*draw_on_device=*/cuda, progress);
  if (cuda) torch::cuda::synchronize();
  const double init_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  model.gradient_checkpointing = !o.no_gradient_checkpointing;
  model.training = true;
  log::info("bench: ", what, " (", cfg.num_parameters(), " parameters), NF4 random weights made in ", init_s,
            " s on ", dev.str(), ", ", o.steps, " steps per point");

  auto row_text = [&](const BenchPoint& p, double err, double cost) {
    std::ostringstream os;
    os << std::right << std::setw(7) << p.seq_len << std::setw(6) << p.micro_batch_size;
    if (!p.fits) {
      os << "   does not fit (out of memory); estimated " << human_bytes(static_cast<double>(p.estimated));
      return os.str();
    }
    os << std::fixed << std::setprecision(3) << std::setw(10) << p.step_s << std::setprecision(0) << std::setw(11)
       << p.tokens_per_s << std::setw(8) << (peak_flops > 0 ? pct(p.mfu) : "-") << std::setw(8)
       << (peak_flops > 0 ? pct(p.hfu) : "-") << std::setw(14) << human_bytes(static_cast<double>(p.measured_peak))
       << std::setw(14) << human_bytes(static_cast<double>(p.estimated_allocated)) << std::setw(8) << pct(err);
    if (cuda) os << std::setw(14) << human_bytes(static_cast<double>(p.measured_reserved));
    if (o.gpu_hour_price > 0) os << std::setw(12) << std::setprecision(4) << cost;
    return os.str();
  };
  std::vector<BenchPoint> pts;
  std::vector<std::string> rows, not_started;
  double last_wall = 0;
  int64_t last_tokens = 0;
  auto out_of_time = [&] { return o.max_time_s > 0 && since_start() > o.max_time_s; };
  for (const auto& [t, mb] : grid) {
    const double elapsed = since_start();
    // From the last point's time per token; before any point ran, one step as measure_rates predicts
    // it (a running point stops after the step in which the budget ends).
    const double predicted =
        last_tokens > 0 ? last_wall * static_cast<double>(t * mb) / static_cast<double>(last_tokens) : step_est(t, mb);
    if (o.max_time_s > 0 && elapsed + predicted > o.max_time_s) {
      not_started.push_back(std::to_string(t) + "x" + std::to_string(mb));
      continue;
    }
    const auto p0 = std::chrono::steady_clock::now();
    auto unix_now = [] {
      return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    };
    const double start_unix = unix_now();
    bool stopped = false;
    const BenchPoint p = run_point(model, o, t, mb, rss_base, peak_flops, out_of_time, &stopped);
    last_wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - p0).count();
    last_tokens = t * mb;
    if (stopped && p.fits && p.step_s <= 0) {  // stopped before a timed step: no measurement
      not_started.push_back(std::to_string(t) + "x" + std::to_string(mb) + " (stopped after its untimed first step)");
      continue;
    }
    if (stopped) log::info("bench: seq_len ", t, " × micro-batch ", mb, ": --max-time-s reached, timed fewer steps");
    pts.push_back(p);
    // error of the allocated estimate against peak allocated (CUDA) or peak RSS growth (CPU)
    const double err = p.measured_peak > 0 ? (static_cast<double>(p.estimated_allocated) - p.measured_peak) / p.measured_peak : 0;
    const double cost = p.tokens_per_s > 0 && o.gpu_hour_price > 0 ? o.gpu_hour_price / 3600.0 / p.tokens_per_s * 1e6 : 0;
    rows.push_back(row_text(p, err, cost));
    log::info("bench: point done in ", last_wall, " s: ", rows.back());
    if (o.sweep) {
      // A value not measured or not defined is an empty field, not 0 (a 0 MFU on a CPU, a 0 step time
      // of a point that did not fit, would plot as a measurement).
      const auto field = [](bool known, double v) { return known ? format_number(v) : std::string(); };
      const bool timed = p.fits && p.step_s > 0;
      csv << p.seq_len << "," << p.micro_batch_size << "," << (p.fits ? "true" : "false") << ","
          << field(timed, p.step_s) << "," << field(timed, p.tokens_per_s) << "," << field(timed && peak_flops > 0, p.mfu)
          << "," << field(timed && peak_flops > 0, p.hfu) << "," << p.measured_peak << ","
          << (cuda ? std::to_string(p.measured_reserved) : std::string()) << "," << p.estimated << ","
          << field(p.measured_peak > 0, err) << "," << field(cost > 0, cost) << "," << p.estimated_allocated << "," << std::fixed
          << std::setprecision(3) << start_unix << "," << unix_now() << std::defaultfloat << std::setprecision(6) << "\n";
      csv.flush();
      QLORA_CHECK(csv.good(), "bench: writing ", o.out_prefix, ".csv failed");
      atomic_write_string(o.out_prefix + ".svg", svg_chart(pts, "qlora bench " + what + " on " + device_name(dev), cuda));
    }
  }

  std::ostringstream os;
  os << "bench " << what << " on " << device_name(dev) << ": NF4 bs64 double "
     << "quant, LoRA r=" << o.lora_r << " all-linear, checkpointing " << (o.no_gradient_checkpointing ? "off" : "on")
     << ", " << dtype_name(dtype_of(dtype)) << ", " << o.steps << " steps (first untimed)\n";
  os << std::right << std::setw(7) << "seq" << std::setw(6) << "batch" << std::setw(10) << "step s" << std::setw(11)
     << "tokens/s" << std::setw(8) << "MFU" << std::setw(8) << "HFU" << std::setw(14)
     << (cuda ? "peak alloc" : "peak RSS+") << std::setw(14) << "estimated" << std::setw(8) << "error";
  if (cuda) os << std::setw(14) << "peak reserved";
  if (o.gpu_hour_price > 0) os << std::setw(12) << "cost/1M tok";
  os << "\n";
  for (const std::string& r : rows) os << r << "\n";
  if (pts.empty()) {
    // Nothing was measured, which is no verdict on memory or speed: an error, not a result.
    if (o.sweep)
      atomic_write_string(o.out_prefix + ".svg", svg_chart(pts, "qlora bench " + what + ": no point run", cuda));
    fail("bench: nothing measured: the --max-time-s budget of ", format_number(o.max_time_s), " s ended before the "
         "first point finished a timed step (the random weights took ", format_number(init_s, 1), " s on ", dev.str(),
         "); raise --max-time-s, or use a smaller --preset or --seq-len");
  } else if (std::none_of(pts.begin(), pts.end(), [](const BenchPoint& p) { return p.fits; })) {
    os << "every point that ran was out of memory on " << device_name(dev) << "\n";
  }
  if (!not_started.empty()) {
    os << "not run (--max-time-s " << o.max_time_s << " s):";
    for (const std::string& n : not_started) os << " " << n;
    os << "\n";
  }
  if (peak_flops <= 0) os << "MFU: no peak FLOPs for this device (pass --peak-tflops)\n";
  os << "MFU counts 4·N_frozen + 6·N_lora + attention FLOPs per token (no weight gradients for the frozen base); "
        "HFU adds the checkpoint recompute (docs/memory.md)\n";
  os << "error = (estimated - measured) / measured: below 0, the estimate is under what was measured\n";
  os << "tokens/s = positions of full rows of seq_len per second (no padding in a bench row); a run pads each "
        "batch to its longest row and counts only real tokens: price a dataset by its batch positions "
        "(`qlora data preview CONFIG`), docs/memory.md \"Cost\"\n";
  if (!cuda) os << "CPU: measured = peak RSS − RSS before the model (includes allocator caching; docs/memory.md)\n";
  if (!cuda && o.sweep && pts.size() > 1)
    os << "CPU sweep: the points share one process, whose RSS keeps the pages earlier points freed: a point's "
          "measured peak depends on the points before it; bench one point per process for a clean number\n";
  if (o.sweep) {
    os << "wrote " << o.out_prefix << ".csv (" << pts.size() << " rows) and " << o.out_prefix << ".svg\n";
  }
  return os.str();
}

}  // namespace qlora
