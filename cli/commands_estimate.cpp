// `qlora estimate`: memory per component, cards that fit, rules of thumb, cost of planned tokens.
#include <iomanip>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.h"
#include "cli/commands.h"
#include "config/config.h"
#include "trainer/estimate.h"

namespace qlora {
using json = nlohmann::json;

std::string cmd_estimate(const EstimateCliOptions& o) {
  const int sources = !o.preset.empty() + !o.model_dir.empty() + !o.config_path.empty();
  QLORA_CHECK(sources == 1, "estimate: give exactly one of --preset NAME, --model DIR, --config YAML");
  ModelConfig model;
  EstimateOptions e;
  const bool cuda = o.device == "cuda";
  if (!o.config_path.empty()) {
    const Config cfg = load_config(o.config_path);
    model = model_config_for(cfg);
    e = estimate_options_for(cfg, torch::Device(cuda ? torch::kCUDA : torch::kCPU));  // as `train` on that device
  } else {
    model = !o.preset.empty() ? preset_config(o.preset) : load_model_config(o.model_dir);
    e.method = parse_estimate_method(o.method);
    e.bits = e.method == EstimateOptions::Method::QLora ? o.bits : (o.bits == 4 ? 16 : o.bits);
    e.blocksize = o.blocksize;
    e.double_quant = o.double_quant;
    e.lora_r = o.lora_r;
    e.lora_targets = o.lora_targets;
    e.micro_batch_size = o.micro_batch_size;
    e.seq_len = o.seq_len;
    e.gradient_checkpointing = !o.no_gradient_checkpointing;
    QLORA_CHECK(o.dtype == "bf16" || o.dtype == "fp16" || o.dtype == "fp32", "estimate: --dtype must be bf16, fp16 "
                "or fp32, got '", o.dtype, "'");
    e.compute_bytes = dtype_bytes(parse_dtype(o.dtype));
    e.cuda = cuda;
    e.overhead_bytes = cuda ? kCudaOverheadBytes : 0;
  }
  e.world_size = o.world_size;
  const MemoryEstimate est = estimate_memory(model, e);

  json cost;
  if (o.tokens > 0 || o.tokens_per_s > 0) {
    QLORA_CHECK(o.tokens > 0 && o.tokens_per_s > 0, "estimate: cost needs both --tokens and --tokens-per-s");
    CostInputs in;
    in.tokens = o.tokens;
    in.tokens_per_s = o.tokens_per_s;
    in.gpu_hour_price = o.gpu_hour_price;
    in.utilization = o.utilization;
    in.devices = o.world_size;
    const CostEstimate c = estimate_cost(in);
    cost = {{"tokens", o.tokens},
            {"tokens_per_s", o.tokens_per_s},
            {"world_size", o.world_size},
            {"job_tokens_per_s", c.job_tokens_per_s},
            {"wall_hours_full_utilization", c.wall_hours_full},
            {"utilization", o.utilization},
            {"gpu_hour_price", o.gpu_hour_price},
            {"gpu_hours_full_utilization", c.gpu_hours_full},
            {"gpu_hours_at_utilization", c.gpu_hours_at_utilization},
            {"cost_full_utilization", c.cost_full},
            {"cost_at_utilization", c.cost_at_utilization},
            {"cost_per_million_tokens", c.cost_per_million_tokens}};
  }
  if (o.json) {
    json j = estimate_to_json(est);
    if (!cost.is_null()) j["cost"] = cost;
    return j.dump(2) + "\n";
  }
  std::ostringstream os;
  os << "device: " << (cuda ? "cuda (with the CUDA context, cuBLAS workspaces and allocator rounding; --device cpu "
                              "for a CPU run)"
                            : "cpu (no CUDA context, cuBLAS or allocator terms)")
     << "\n" << format_estimate(est);
  if (!cost.is_null()) {
    os << std::fixed << std::setprecision(2) << "\ncost of " << o.tokens << " tokens at " << o.tokens_per_s
       << " tokens/s";
    if (o.world_size > 1)
      os << " per rank x " << o.world_size << " ranks = " << cost["job_tokens_per_s"].get<double>() << " tokens/s (ideal scaling), "
         << cost["wall_hours_full_utilization"].get<double>() << " h wall-clock; GPU-hours of all ranks";
    os << ":\n  full utilization:   " << cost["gpu_hours_full_utilization"].get<double>() << " GPU-hours";
    if (o.gpu_hour_price > 0) os << ", " << cost["cost_full_utilization"].get<double>();
    os << "\n  at utilization " << o.utilization << ": " << cost["gpu_hours_at_utilization"].get<double>()
       << " GPU-hours";
    if (o.gpu_hour_price > 0)
      os << ", " << cost["cost_at_utilization"].get<double>() << "\n  per 1M tokens (full): "
         << cost["cost_per_million_tokens"].get<double>();
    os << "\n";
  }
  return os.str();
}

}  // namespace qlora
