// `qlora estimate`: memory per component, cards that fit, rules of thumb, cost of planned tokens.
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.h"
#include "common/format.h"
#include "cli/commands.h"
#include "config/config.h"
#include "trainer/estimate.h"

namespace qlora {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

/// `x` rounded to an integer with thousands separators: 100000000 -> "100,000,000".
std::string with_separators(double x) {
  std::string digits = std::to_string(static_cast<int64_t>(std::llround(std::fabs(x))));
  for (int i = static_cast<int>(digits.size()) - 3; i > 0; i -= 3) digits.insert(static_cast<size_t>(i), ",");
  return (x < 0 ? "-" : "") + digits;
}

/// The presets as "a, b, c" for messages.
std::string preset_list() {
  std::string s;
  for (const std::string& n : preset_names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

/// --lora-targets read as the training config reads lora.target_modules (parse_target_modules):
/// "all-linear" alone, or the arguments as the items of one YAML flow list, so `q_proj v_proj`,
/// "q_proj, v_proj" and "[q_proj, v_proj]" are the same two modules. Throws qlora::Error naming
/// the value and an unknown module, as the config does.
std::vector<std::string> lora_targets_arg(const std::vector<std::string>& args) {
  std::string value;
  if (args.size() == 1 && (args[0] == kAllLinear || args[0].rfind('[', 0) == 0)) {
    value = args[0];
  } else {
    for (const std::string& a : args) value += (value.empty() ? "" : ", ") + a;
    value = "[" + value + "]";
  }
  return parse_target_modules(value, "estimate: --lora-targets " + value);
}

}  // namespace

std::string cmd_estimate(const EstimateCliOptions& o) {
  const int shapes = !o.preset.empty() + !o.model_dir.empty();
  QLORA_CHECK(shapes + !o.config_path.empty() >= 1 && shapes <= 1,
              "estimate: give one of --preset NAME, --model DIR, --config YAML (--config may add --preset or --model "
              "for the shape)");
  QLORA_CHECK(o.overrides.empty() || !o.config_path.empty(), "estimate: --set needs --config YAML");
  auto given = [&](const char* name) { return o.given.count(name) > 0; };
  // The cost flags, checked as given (a value out of range is an error, never read as "not given";
  // trial 19: --tokens 1e30 printed a negative count, --tokens-per-s 0 said it was missing).
  if (given("--tokens"))
    QLORA_CHECK(std::isfinite(o.tokens) && o.tokens >= 1 && o.tokens <= 1e18,
                "estimate: --tokens must be a token count in 1..1e18, got ", o.tokens);
  if (given("--tokens-per-s"))
    QLORA_CHECK(std::isfinite(o.tokens_per_s) && o.tokens_per_s > 0, "estimate: --tokens-per-s must be > 0, got ",
                o.tokens_per_s);
  if (given("--gpu-hour-price"))
    QLORA_CHECK(std::isfinite(o.gpu_hour_price) && o.gpu_hour_price >= 0,
                "estimate: --gpu-hour-price must be a finite number >= 0, got ", o.gpu_hour_price);
  QLORA_CHECK(std::isfinite(o.utilization) && o.utilization > 0 && o.utilization <= 1,
              "estimate: --utilization must be in (0, 1], got ", o.utilization);
  ModelConfig model;
  EstimateOptions e;
  const bool cuda = o.device == "cuda";
  double price = o.gpu_hour_price;
  std::vector<std::string> applied;  // "--seq-len 4096", ...: flags that replaced the config's values
  bool packing = false;              // the config's data.sample_packing (a mask at every micro-batch)
  if (!o.config_path.empty()) {
    const Config cfg = load_config(o.config_path, o.overrides);
    packing = cfg.data.sample_packing;
    if (shapes == 0) {
      const std::string& p = cfg.model.path;
      QLORA_CHECK(p.empty() || fs::exists(fs::path(p) / "config.json"), o.config_path, ": model.path ", p,
                  " has no config.json (not downloaded yet?); estimate without the weights: add --preset NAME for "
                  "the shape (", preset_list(), "), or --model DIR with a directory holding the model's config.json");
      model = model_config_for(cfg);
    }
    e = estimate_options_for(cfg, torch::Device(cuda ? torch::kCUDA : torch::kCPU));  // as `train` on that device
    if (!given("--gpu-hour-price")) price = cfg.cost.gpu_hour_price;
    // Every flag given explicitly overrides the config's value.
    auto note = [&](const std::string& flag, const std::string& value) { applied.push_back(flag + " " + value); };
    if (given("--method")) {
      e.method = parse_estimate_method(o.method);
      // Without --bits: inference keeps the config's base (a quantized base is run at 4 bits, as
      // `eval` and `generate --quant nf4` run it); qlora quantizes a 16-bit config's base to 4 bits;
      // lora and full train a 16-bit base.
      if (!given("--bits")) {
        using M = EstimateOptions::Method;
        if (e.method == M::QLora && e.bits == 16) e.bits = 4;
        if (e.method == M::Lora || e.method == M::Full) e.bits = 16;
      }
      note("--method", o.method);
    }
    if (given("--bits")) {
      e.bits = o.bits;
      note("--bits", std::to_string(o.bits));
    }
    if (given("--blocksize")) {
      e.blocksize = o.blocksize;
      note("--blocksize", std::to_string(o.blocksize));
    }
    if (given("--double-quant")) {
      e.double_quant = o.double_quant;
      applied.push_back(o.double_quant ? "--double-quant" : "--no-double-quant");
    }
    if (given("--lora-r")) {
      e.lora_r = o.lora_r;
      note("--lora-r", std::to_string(o.lora_r));
    }
    if (given("--lora-targets")) {
      e.lora_targets = lora_targets_arg(o.lora_targets);
      std::string t;
      for (const std::string& s : o.lora_targets) t += (t.empty() ? "" : ",") + s;
      note("--lora-targets", t);
    }
    if (given("--micro-batch-size")) {
      e.micro_batch_size = o.micro_batch_size;
      e.attention_mask = cfg.data.sample_packing || e.micro_batch_size > 1;  // as estimate_options_for
      note("--micro-batch-size", std::to_string(o.micro_batch_size));
    }
    if (given("--seq-len")) {
      e.seq_len = o.seq_len;
      note("--seq-len", std::to_string(o.seq_len));
    }
    if (given("--no-gradient-checkpointing")) {
      e.gradient_checkpointing = false;
      applied.push_back("--no-gradient-checkpointing");
    }
    if (given("--dtype")) {
      QLORA_CHECK(o.dtype == "bf16" || o.dtype == "fp16" || o.dtype == "fp32",
                  "estimate: --dtype must be bf16, fp16 or fp32, got '", o.dtype, "'");
      e.compute_bytes = dtype_bytes(parse_dtype(o.dtype));
      note("--dtype", o.dtype);
    }
  } else {
    e.method = parse_estimate_method(o.method);
    // --bits given: as given (estimate_memory refuses a conflict such as --method lora --bits 4);
    // not given: 4 for qlora, 16 for inference, lora and full.
    e.bits = given("--bits") || e.method == EstimateOptions::Method::QLora ? o.bits : 16;
    e.blocksize = o.blocksize;
    e.double_quant = o.double_quant;
    e.lora_r = o.lora_r;
    if (given("--lora-targets")) e.lora_targets = lora_targets_arg(o.lora_targets);
    e.micro_batch_size = o.micro_batch_size;
    // train pads a micro-batch's rows to its longest: above one row, the mask (as --config; trial
    // 29: --model promised one micro-batch more than --config). bench's equal rows have none.
    e.attention_mask = e.micro_batch_size > 1;
    e.seq_len = o.seq_len;
    e.gradient_checkpointing = !o.no_gradient_checkpointing;
    QLORA_CHECK(o.dtype == "bf16" || o.dtype == "fp16" || o.dtype == "fp32", "estimate: --dtype must be bf16, fp16 "
                "or fp32, got '", o.dtype, "'");
    e.compute_bytes = dtype_bytes(parse_dtype(o.dtype));
    e.cuda = cuda;
    e.overhead_bytes = cuda ? kCudaOverheadBytes : 0;
  }
  if (shapes == 1) model = !o.preset.empty() ? preset_config(o.preset) : load_model_config(o.model_dir);
  e.world_size = o.world_size;
  const MemoryEstimate est = estimate_memory(model, e);

  // Per card class: the largest micro_batch_size that fits, everything else as estimated (rows of
  // a micro-batch above 1 are padded and get the attention mask, as in `train`).
  json largest = json::array();
  if (e.cuda) {
    auto options_for = [&](int64_t mb) {
      EstimateOptions x = e;
      x.micro_batch_size = mb;
      x.attention_mask = packing || mb > 1;
      return x;
    };
    for (const GpuCard& g : common_gpu_cards())
      largest.push_back({{"card", g.name}, {"capacity_bytes", g.capacity_bytes},
                         {"micro_batch_size", largest_micro_batch(model, options_for, g.capacity_bytes)}});
  }

  // Cost: needs planned tokens and one GPU's throughput; what is missing is said, not an error.
  json cost;
  std::string cost_note;
  const std::string bench_cmd =
      "`qlora bench " + (!o.preset.empty() ? "--preset " + o.preset : !o.model_dir.empty() ? "--model " + o.model_dir
                                                                                           : std::string("--model DIR")) +
      " --seq-len " + std::to_string(e.seq_len) + " --micro-batch-size " + std::to_string(e.micro_batch_size) +
      "` on the target GPU prints it";
  if (o.tokens > 0 && o.tokens_per_s > 0) {
    CostInputs in;
    in.tokens = o.tokens;
    in.tokens_per_s = o.tokens_per_s;
    in.gpu_hour_price = price;
    in.utilization = o.utilization;
    in.devices = o.world_size;
    const CostEstimate c = estimate_cost(in);
    cost = {{"tokens", o.tokens},
            {"tokens_per_s", o.tokens_per_s},
            {"world_size", o.world_size},
            {"job_tokens_per_s", c.job_tokens_per_s},
            {"wall_hours_full_utilization", c.wall_hours_full},
            {"wall_hours_at_utilization", c.wall_hours_full / o.utilization},
            {"utilization", o.utilization},
            {"gpu_hour_price", price},
            {"gpu_hours_full_utilization", c.gpu_hours_full},
            {"gpu_hours_at_utilization", c.gpu_hours_at_utilization},
            {"cost_full_utilization", c.cost_full},
            {"cost_at_utilization", c.cost_at_utilization},
            {"cost_per_million_tokens", c.cost_per_million_tokens}};
  } else if (o.tokens > 0) {
    cost_note = "cost: --tokens needs --tokens-per-s (one GPU's training throughput; " + bench_cmd + ")";
  } else if (o.tokens_per_s > 0 || price > 0) {
    cost_note = std::string("cost: ") + (price > 0 ? "a GPU-hour price is set" : "--tokens-per-s is set") +
                "; give --tokens N (the planned training tokens)" +
                (o.tokens_per_s > 0 ? "" : " and --tokens-per-s R (one GPU's training throughput; " + bench_cmd + ")") +
                " to price the run";
  }
  if (o.json) {
    json j = estimate_to_json(est);
    if (!applied.empty()) j["overrides"] = applied;
    if (!largest.empty()) j["largest_micro_batch_size"] = largest;
    if (!cost.is_null()) j["cost"] = cost;
    if (!cost_note.empty()) j["cost_note"] = cost_note;
    return j.dump(2) + "\n";
  }
  std::ostringstream os;
  if (!o.config_path.empty()) {
    os << "config: " << o.config_path;
    if (!o.overrides.empty() || !applied.empty()) {
      os << " with overrides:";
      for (const std::string& s : o.overrides) os << " --set " << s;
      for (const std::string& s : applied) os << " " << s;
    }
    if (shapes == 1) os << " (shape from " << (!o.preset.empty() ? "--preset " + o.preset : "--model " + o.model_dir) << ")";
    os << "\n";
  }
  os << "device: " << (cuda ? "cuda (with the CUDA context, cuBLAS workspaces and allocator rounding; --device cpu "
                              "for a CPU run)"
                            : "cpu (no CUDA context, cuBLAS or allocator terms)")
     << "\n" << format_estimate(est);
  if (!largest.empty()) {
    os << "\nlargest micro_batch_size that fits (" << e.seq_len << "-token rows, the rest as above; 4096 at most):\n";
    for (const json& l : largest) {
      const int64_t mb = l["micro_batch_size"].get<int64_t>();
      os << "  " << std::left << std::setw(36) << l["card"].get<std::string>() << std::setw(12)
         << human_bytes(static_cast<double>(l["capacity_bytes"].get<int64_t>()))
         << (mb > 0 ? std::to_string(mb) : std::string("none (micro-batch 1 does not fit)")) << "\n";
    }
  }
  if (!cost.is_null()) {
    os << std::fixed << std::setprecision(2) << "\ncost of " << with_separators(o.tokens) << " tokens at "
       << o.tokens_per_s << " tokens/s";
    if (o.world_size > 1)
      os << " per rank x " << o.world_size << " ranks = " << cost["job_tokens_per_s"].get<double>() << " tokens/s (ideal scaling), "
         << cost["wall_hours_full_utilization"].get<double>() << " h wall-clock; GPU-hours of all ranks";
    os << ":\n  full utilization: " << cost["gpu_hours_full_utilization"].get<double>() << " GPU-hours ("
       << cost["wall_hours_full_utilization"].get<double>() << " h wall-clock)";
    if (price > 0) os << ", cost " << cost["cost_full_utilization"].get<double>() << " at " << price << " per GPU-hour";
    if (o.utilization < 1) {
      os << "\n  at utilization " << o.utilization << ": " << cost["gpu_hours_at_utilization"].get<double>()
         << " GPU-hours (" << cost["wall_hours_at_utilization"].get<double>() << " h wall-clock)";
      if (price > 0) os << ", cost " << cost["cost_at_utilization"].get<double>();
    }
    if (price > 0) os << "\n  per 1M tokens (full utilization): " << cost["cost_per_million_tokens"].get<double>();
    if (price <= 0) os << "\n  (no price: --gpu-hour-price P or cost.gpu_hour_price in the config adds the cost)";
    os << "\n  (--tokens are batch positions, padding included, as bench's tokens/s counts them: `qlora data "
          "preview CONFIG` prints a dataset's per epoch)\n";
  }
  if (!cost_note.empty()) os << "\n" << cost_note << "\n";
  return os.str();
}

}  // namespace qlora
