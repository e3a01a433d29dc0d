// qlora-cpp: capacity planning. A QLoRA-aware memory estimate per component (docs/memory.md has
// every formula and where it comes from), the cards it fits, the rule-of-thumb numbers beside it,
// FLOPs per trained token for MFU, cost arithmetic, and the per-run memory report
// (memory_report.json: measured next to estimated).
//
// All sizes are bytes, all lengths tokens, all times seconds unless a name says otherwise.
#pragma once
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <functional>
#include <string>
#include <vector>

#include "config/config.h"
#include "model/model_config.h"

namespace qlora {

/// What nvidia-smi shows beyond the caching allocator's reserved bytes: the CUDA context, loaded
/// kernel modules, and the memory of libraries that do not allocate through the caching allocator
/// (bytes). The cuBLAS workspaces and the allocator's segment rounding are separate components
/// (they are in reserved). Measured on an H200 (torch 2.11.0+cu130, driver 580, 2026-12-04): nvidia-smi
/// memory.used peak − peak reserved = 767–773 MiB over 16 `qlora bench` points (docs/memory.md).
constexpr int64_t kCudaOverheadBytes = 768LL << 20;

/// Peak reserved beyond peak allocated that the activations cost on CUDA, as a fraction of the
/// activation bytes at the peak: the caching allocator's cached free blocks, which the checkpointed
/// recompute and the gradient temporaries (many sizes, freed and re-made per layer) cannot reuse.
/// Fitted on the first H200 run (2026-12-04, torch 2.11.0+cu130): (peak reserved − the estimate
/// without it) / activations was 0.14–0.25 over llama2-7b seq 512–8192 × micro-batch 1/2/4 and
/// llama2-13b 2048 × 1; 0.18 leaves the reserved estimate between −0.8% and +3.3% of those 16
/// measurements, and llama3-8b (GQA, 128k vocabulary; not fitted) between −3.4% and +7.5% at seq
/// 2048/8192 × micro-batch 1/2 (tests/trainer/estimate_test.cpp, MeasuredOnH200). Counted in the reserved
/// estimate only, with the segment rounding (`reserved_only_bytes`).
constexpr double kActivationFragmentation = 0.18;

/// cuBLAS workspaces on CUDA, bytes: PyTorch gives each cuBLAS handle a workspace from the caching
/// allocator (so it shows in allocated/reserved, not in the context): 32 MiB per handle on sm_90
/// (PyTorch's CUDABlas getChosenWorkspaceSize for Hopper), and training uses two handles (the
/// forward's thread and the autograd engine's device thread). Not measured on its own: the H200 run
/// (2026-12-04) measured the peak allocated it is part of, 1.9–4.5% under the estimate.
constexpr int64_t kCublasWorkspaceBytesPerHandle = 32LL << 20;

/// What an estimate is for. Plain values; no config objects below this.
struct EstimateOptions {
  enum class Method { Inference, Lora, QLora, Full };
  Method method = Method::QLora;
  int bits = 4;                   ///< storage bits of the decoder linears: 16, 8 or 4
  int64_t blocksize = 64;         ///< 4-bit absmax blocksize (32..4096, power of two)
  bool double_quant = true;       ///< 4-bit: quantize the absmax constants (QLoRA double quant)
  int64_t lora_r = 16;            ///< LoRA rank
  std::vector<std::string> lora_targets = {kAllLinear};  ///< PEFT target names
  double lora_dropout = 0.05;     ///< > 0 makes every adapted linear keep its own dropout output
  int64_t micro_batch_size = 1;   ///< rows per forward/backward
  int64_t seq_len = 2048;         ///< tokens per row (no padding: causal SDPA, no mask)
  bool gradient_checkpointing = true;
  int64_t compute_bytes = 2;      ///< bytes per element of the compute dtype (bf16/fp16 2, fp32 4)
  int64_t ce_chunk_tokens = 1024; ///< chunked cross-entropy chunk (trainer/loss.h)
  bool cuda = true;               ///< CUDA: 1-byte dropout masks, context overhead; CPU: dtype-sized masks
  int64_t overhead_bytes = kCudaOverheadBytes;  ///< CUDA context + allocator; 0 for a CPU estimate
  /// A dense [B, 1, T, T] bool attention mask is built (a padded row, or packing: LlamaModel::build_mask)
  /// and SDPA turns it into a compute-dtype bias per layer call. false: causal SDPA, no [T, T] tensor,
  /// unless seq_len is past the model's sliding_window (estimate_memory then counts the mask anyway).
  bool attention_mask = false;
  int64_t cublas_handles = -1;    ///< CUDA: cuBLAS handles with a workspace; -1: 2 training, 1 inference
  bool allocator_rounding = true; ///< CUDA: add the caching allocator's segment rounding and activation fragmentation (peak reserved)
  /// Data-parallel ranks (docs/distributed.md); > 1 with LoRA/QLoRA adds each rank's flat fp32
  /// gradient allreduce buffer (4 × LoRA parameters). The estimate is per rank.
  int64_t world_size = 1;
};

/// What PyTorch's CUDA caching allocator reserves for tensors of `sizes` bytes allocated in this
/// order and never freed: requests rounded up to 512 B; ≤ 1 MiB from 2 MiB small-pool segments,
/// 1–10 MiB from 20 MiB segments, ≥ 10 MiB in segments rounded up to 2 MiB; a request takes the
/// smallest cached free block that fits (best fit), split when the rest is ≥ 512 B (small pool) or
/// > 1 MiB (large pool). Source: c10/cuda/CUDACachingAllocator.cpp (kMinBlockSize, kSmallSize,
/// kSmallBuffer, kLargeBuffer, kMinLargeAlloc, kRoundLarge; round_size, get_allocation_size,
/// should_split). Frees and streams are not modelled.
struct AllocatorFootprint {
  int64_t requested = 0;  ///< Σ sizes
  int64_t allocated = 0;  ///< Σ block sizes handed out (what allocated_bytes counts)
  int64_t reserved = 0;   ///< Σ segments (what reserved_bytes counts)
};
AllocatorFootprint caching_allocator_footprint(const std::vector<int64_t>& sizes);

/// "inference" | "lora" | "qlora" | "full". Throws qlora::Error naming the value.
EstimateOptions::Method parse_estimate_method(const std::string& s);
const char* to_string(EstimateOptions::Method m);

/// One line of the estimate. `in_total` is false for a working set that is not live at the peak
/// (the loss phase and the backward phase peak at different times; only the larger counts).
struct MemoryComponent {
  std::string name;
  int64_t bytes = 0;
  bool in_total = true;
  std::string note;  ///< formula, in words
};

/// One card model and its nvidia-smi memory.total, bytes ("RTX 4090", 24564 MiB).
struct GpuModel {
  std::string name;
  int64_t capacity_bytes;
};
/// A class of memory card: its models, smallest first.
struct GpuCard {
  std::string name;        ///< "24 GB (RTX 4090 / A10G / L4)"
  int64_t capacity_bytes;  ///< nvidia-smi memory.total of the class's smallest card (16 GB: T4, 15360 MiB)
  std::vector<GpuModel> models;  ///< every model of the class with its own total, ascending (models[0]: capacity_bytes)
};
/// 16, 24, 40, 48, 80, 141 GB classes (nvidia-smi totals of each model; docs/memory.md lists them).
/// An estimate fits a model when its total is at most that model's capacity_bytes, and fits the class
/// (`fits` in --json) when it fits the smallest.
const std::vector<GpuCard>& common_gpu_cards();
/// The fits-table verdict of one class for `total_bytes`: "yes, X spare" / "no, X short" when every
/// model of the class agrees (X against the smallest), otherwise which models it does not fit and
/// which it fits, each with its nvidia-smi MiB: "no on A10G (23,028 MiB) / L4 (23,034 MiB): 129.28 MiB
/// short on the A10G; yes on RTX 4090 (24,564 MiB): 1.37 GiB spare".
std::string card_verdict(const GpuCard& card, int64_t total_bytes);

struct MemoryEstimate {
  ModelConfig model;
  EstimateOptions options;
  int64_t num_parameters = 0;        ///< whole model
  int64_t quantizable_parameters = 0;///< the seven decoder linears' weights
  int64_t lora_parameters = 0;       ///< trainable adapter parameters (0 for inference / full)
  int64_t activation_bytes_per_layer = 0;               ///< saved for backward, one layer, no checkpointing
  int64_t activation_bytes_per_layer_checkpointed = 0;  ///< saved per layer with checkpointing (its input)
  std::vector<MemoryComponent> components;
  int64_t total_bytes = 0;           ///< sum of components with in_total
  /// What the user should know about the options (a seq_len beyond max_position_embeddings).
  std::vector<std::string> warnings;
  /// Bytes of the component named `name` (0 when absent).
  int64_t component(const std::string& name) const;
  /// Bytes counted in the peak-reserved estimate but not in peak allocated (CUDA only): the
  /// allocator's segment rounding and its activation fragmentation. total_bytes − this (− the
  /// context) is the peak-allocated estimate.
  int64_t reserved_only_bytes() const;
};

/// The estimate for `cfg` under `o`. Throws qlora::Error for non-positive sizes, bits not in
/// {16, 8, 4}, 4/8-bit with method lora or full, r larger than a targeted layer's width, a LoRA
/// target that matches no linear.
MemoryEstimate estimate_memory(const ModelConfig& cfg, const EstimateOptions& o);

/// The largest micro_batch_size in 1..`limit` whose estimate (estimate_memory of `cfg` under
/// `options_for(mb)`) totals at most `capacity_bytes`, by bisection (the total grows with the
/// micro-batch); 0 when micro-batch 1 does not fit. A size out of estimate_memory's range counts as
/// not fitting; any other error of micro-batch 1 is thrown (qlora::Error, as estimate_memory).
int64_t largest_micro_batch(const ModelConfig& cfg, const std::function<EstimateOptions(int64_t)>& options_for,
                            int64_t capacity_bytes, int64_t limit = 4096);

/// Per-layer saved-activation bytes (autograd's saved tensors of model/model.cpp layer_forward
/// in training, no checkpointing), itemised; docs/memory.md "Activations" derives each term.
std::vector<MemoryComponent> layer_activation_terms(const ModelConfig& cfg, const EstimateOptions& o);

/// The rule-of-thumb numbers (params × bytes, ×1.2 inference, 16 B/param full fine-tune), as
/// [{"rule", "bytes"}].
nlohmann::json rule_of_thumb(const MemoryEstimate& e);

/// The common claims for this shape checked against this estimate's total: for 6–8 B parameters
/// "a 7B QLoRA fine-tune fits in 16 GB", compared with the 16 GB card row of common_gpu_cards()
/// (a T4's nvidia-smi memory.total, 15,360 MiB); for 12–14 B "a 13B QLoRA fine-tune needs ~28 GB",
/// compared with 28e9 bytes. [{"claim", "compared_with", "limit_bytes", "total_bytes",
/// "holds" (fits-claim: total ≤ limit; needs-claim: total ≥ limit)}]; empty for other sizes and
/// for a method other than QLoRA (the claims are about QLoRA).
nlohmann::json claim_checks(const MemoryEstimate& e);

/// {"model", "options", "components", "total_bytes", "fits", "rule_of_thumb", "claims",
/// "warnings", ...}; "fits" is [{"card", "capacity_bytes", "headroom_bytes" (capacity − total;
/// negative: short), "fits"}] for a CUDA estimate, empty for a CPU one (then "fits_note" says why).
nlohmann::json estimate_to_json(const MemoryEstimate& e);
/// A readable table: warnings, components, total, card verdicts (CUDA only), rule of thumb, claims.
std::string format_estimate(const MemoryEstimate& e);

/// FLOPs per trained token (one forward + backward, and the recompute when checkpointing).
struct TrainingFlops {
  double model_flops = 0;     ///< what MFU counts: no recompute
  double hardware_flops = 0;  ///< + the checkpoint recompute (HFU)
  int64_t matmul_params = 0;  ///< frozen base linears + lm_head (N in "6N")
  int64_t lora_params = 0;
};
/// docs/memory.md "FLOPs": frozen base 4N (forward 2N + input gradient 2N, no weight gradient),
/// LoRA 6·N_lora, lm_head 4·V·H, causal attention 2·nh·hd·T per layer forward (×3 with backward);
/// checkpointing adds a forward of the layers (2N + 2·N_lora + attention) to hardware_flops only.
TrainingFlops training_flops_per_token(const ModelConfig& cfg, const EstimateOptions& o);

/// What a device measured just before `qlora bench` (cli/commands_bench.cpp, a second or less):
/// the rates a bench's time is predicted from. All per second; 0 = not measured (that term is left out).
struct DeviceRates {
  double matmul_flops = 0;            ///< dense [tokens, H] × [H, I]-shaped matmul in the compute dtype, FLOP/s
  double dequant_elements = 0;        ///< 4-bit weight elements dequantized to the compute dtype per s
  double quantized_init_elements = 0; ///< random weight elements drawn and quantized to NF4 per s
  double plain_init_elements = 0;     ///< random weight elements drawn and kept in the compute dtype per s
};
/// Predicted seconds of one training step of `cfg` under `o` (micro_batch_size × seq_len tokens):
/// hardware FLOPs (training_flops_per_token, recompute included) × tokens / matmul_flops, plus the
/// 4-bit base's dequantizations (each decoder linear once in forward, once in backward, and once in
/// the recompute when checkpointing; a 16-bit base: none) / dequant_elements. Elementwise ops,
/// attention kernels below matmul speed and the optimizer are not counted: a lower bound of sorts
/// (docs/memory.md, "How long a bench takes"). Throws qlora::Error when matmul_flops ≤ 0.
double training_step_seconds(const ModelConfig& cfg, const EstimateOptions& o, const DeviceRates& r);
/// Predicted seconds to make `cfg`'s random weights as `qlora bench` does (LlamaModel::random_init):
/// the 7·L decoder linears drawn and quantized (`quantized` true) at quantized_init_elements, the rest
/// (embeddings, lm_head, norms; all of it when not quantized) at plain_init_elements. Throws
/// qlora::Error when a rate it needs is ≤ 0.
double random_weights_seconds(const ModelConfig& cfg, bool quantized, const DeviceRates& r);

/// Dense bf16 peak of a CUDA device by name (H100/H200 989e12, A100 312e12, ...), 0 when unknown.
double peak_flops_for_device_name(const std::string& name);

/// Cost arithmetic: GPU-hours = tokens / tokens_per_s / 3600 / utilization; cost = hours × price.
struct CostEstimate {
  /// GPU-hours of all `devices` together (the bill), at full utilization and at `utilization`.
  double gpu_hours_full = 0, gpu_hours_at_utilization = 0, cost_full = 0, cost_at_utilization = 0;
  double cost_per_million_tokens = 0;  ///< at full utilization
  double job_tokens_per_s = 0;         ///< tokens_per_s × devices (ideal data-parallel scaling)
  double wall_hours_full = 0;          ///< wall-clock hours of the job = gpu_hours_full / devices
};
/// What a cost estimate is computed from (`qlora estimate --tokens ... --tokens-per-s ...`).
struct CostInputs {
  double tokens = 0;          ///< training tokens of the job, ≥ 0
  double tokens_per_s = 0;    ///< ONE device's throughput, > 0
  double gpu_hour_price = 0;  ///< price of one device-hour (currency-free), ≥ 0
  double utilization = 1;     ///< fraction of the time the devices compute, in (0, 1]
  int64_t devices = 1;        ///< data-parallel ranks, ≥ 1
};
/// `devices` run at `tokens_per_s` each (ideal scaling: the allreduce is not counted,
/// docs/distributed.md), so the job processes tokens_per_s × devices, and every device's hours are
/// billed. Throws qlora::Error for tokens_per_s ≤ 0, utilization outside (0, 1], tokens or price
/// < 0, devices < 1.
CostEstimate estimate_cost(const CostInputs& in);

/// EstimateOptions from a training config on `device` (compute dtype auto → bf16 on CUDA, fp32
/// on CPU; no CUDA overhead on CPU).
EstimateOptions estimate_options_for(const Config& cfg, const torch::Device& device);
/// The model shape a config names (model.path's config.json, or the preset); `vocab_size` > 0
/// overrides the vocabulary (a preset takes its tokenizer's).
ModelConfig model_config_for(const Config& cfg, int64_t vocab_size = 0);

/// Measured memory of a training run beside its estimate; written as OUTPUT_DIR/memory_report.json.
/// Phases: "before_load", "after_load", "after_first_step", "after_first_eval" (when the run
/// evaluates), "peak" (memory_snapshot of each; its peak counters are the run's so far, so a rise
/// from after_first_step to after_first_eval is what the evaluation pass added).
class MemoryTracker {
 public:
  /// Estimates (for one rank of `world_size`), logs the total, warns (log::warn) when it exceeds the
  /// visible CUDA device's memory, and records "before_load". Call before loading the model.
  /// `writes` false: the report is kept in memory only (data-parallel ranks other than 0).
  void begin(const Config& cfg, const ModelConfig& model, const torch::Device& device, int64_t world_size = 1,
             bool writes = true);
  /// Data parallel, rank 0: every rank's finish() report (index = rank) goes into the report as
  /// "ranks": [{"rank", "device", "phases", "comparison"}], and the file is rewritten.
  void add_ranks(const std::vector<nlohmann::json>& reports);
  /// Records a phase; rewrites OUTPUT_DIR/memory_report.json when the directory exists.
  void record(const std::string& phase);
  /// Turns writing on or off from now on (begin's `writes`); on: writes what was recorded so far.
  void set_writes(bool writes) {
    writes_ = writes;
    write();
  }
  /// Records "after_first_step" the first time it is called; later calls do nothing but note
  /// `longest_row`, the step's longest row in tokens (its batches' seq_len).
  void after_step(int64_t longest_row) {
    if (!first_step_done_) record("after_first_step");
    first_step_done_ = true;
    longest_row_ = std::max(longest_row_, longest_row);
  }
  /// Records "after_first_eval" the first time it is called (after the run's first evaluation
  /// pass); later calls do nothing. The estimate has no evaluation term: a no_grad forward keeps
  /// less than a training step, but on the CPU the allocator's RSS can still grow (docs/memory.md).
  void after_eval() {
    if (!first_eval_done_) record("after_first_eval");
    first_eval_done_ = true;
  }
  /// Records "peak", compares with the estimate, writes the report and logs the comparison table.
  /// When no step ran (after_step never called: a resume of a finished run) "comparison" is [] and
  /// "note" says why. When the run's rows were all shorter than the estimate's seq_len (rows are
  /// padded to their batch's longest, not to data.sequence_len), "rows" holds {"estimated_tokens",
  /// "longest_tokens"}, and where the measured peak came in under the estimate a log line says
  /// that is why (the estimate is of full-length rows). Returns the report.
  nlohmann::json finish();
  bool active() const { return active_; }
  /// The `qlora estimate ...` command of this run (its config, overrides and device) that the
  /// rows note extends with `--seq-len N`; "" = "qlora estimate --config CONFIG".
  void set_estimate_command(std::string command) { estimate_command_ = std::move(command); }

 private:
  std::string estimate_command_;
  void write() const;
  bool active_ = false;
  bool first_step_done_ = false;
  bool first_eval_done_ = false;
  int64_t longest_row_ = 0;  ///< the longest row of any step, tokens
  bool writes_ = true;
  std::string output_dir_;
  torch::Device device_ = torch::kCPU;
  MemoryEstimate estimate_;
  nlohmann::json report_;
};

/// Estimated vs measured, per comparable component: [{"component", "estimated_bytes",
/// "measured_bytes", "relative_error"}]. `phases` holds memory_snapshot objects by phase name.
/// CPU: RSS growth over "before_load"; CUDA: allocated and reserved separately.
nlohmann::json compare_memory(const MemoryEstimate& e, const nlohmann::json& phases, bool cuda);
/// The comparison as a table.
std::string format_comparison(const nlohmann::json& comparison);

}  // namespace qlora
