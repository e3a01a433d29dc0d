#include "trainer/estimate.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <set>
#include <sstream>
#include <unistd.h>

#include "adapters/lora.h"
#include "common/error.h"
#include "common/files.h"
#include "common/format.h"
#include "common/log.h"
#include "kernels/quant4.h"
#include "trainer/memory.h"

namespace qlora {
namespace fs = std::filesystem;
using json = nlohmann::json;

EstimateOptions::Method parse_estimate_method(const std::string& s) {
  if (s == "inference") return EstimateOptions::Method::Inference;
  if (s == "lora") return EstimateOptions::Method::Lora;
  if (s == "qlora") return EstimateOptions::Method::QLora;
  if (s == "full") return EstimateOptions::Method::Full;
  fail("estimate: --method '", s, "' is not one of inference, lora, qlora, full");
}

const char* to_string(EstimateOptions::Method m) {
  switch (m) {
    case EstimateOptions::Method::Inference: return "inference";
    case EstimateOptions::Method::Lora: return "lora";
    case EstimateOptions::Method::QLora: return "qlora";
    case EstimateOptions::Method::Full: return "full";
  }
  return "?";
}

const std::vector<GpuCard>& common_gpu_cards() {
  // nvidia-smi memory.total (MiB) of each model: T4 15360, V100-16 16160, A4000 16376; A10G 23028,
  // L4 23034, RTX 4090 24564; A100-40 40960; L40S 46068, A6000 49140; H100 81559, A100-80 81920;
  // H200 143771. A class's capacity is its smallest model's.
  static const std::vector<GpuCard> cards = [] {
    const std::vector<std::pair<std::string, std::vector<GpuModel>>> classes = {
        {"16 GB (T4 / V100-16 / A4000)", {{"T4", 15360LL << 20}, {"V100-16", 16160LL << 20}, {"A4000", 16376LL << 20}}},
        {"24 GB (RTX 4090 / A10G / L4)", {{"A10G", 23028LL << 20}, {"L4", 23034LL << 20}, {"RTX 4090", 24564LL << 20}}},
        {"40 GB (A100-40)", {{"A100-40", 40960LL << 20}}},
        {"48 GB (A6000 / L40S)", {{"L40S", 46068LL << 20}, {"A6000", 49140LL << 20}}},
        {"80 GB (A100-80 / H100)", {{"H100", 81559LL << 20}, {"A100-80", 81920LL << 20}}},
        {"141 GB (H200)", {{"H200", 143771LL << 20}}},
    };
    std::vector<GpuCard> out;
    for (const auto& [name, models] : classes) out.push_back({name, models.front().capacity_bytes, models});
    return out;
  }();
  return cards;
}

namespace {
/// "23,028 MiB": bytes in whole MiB with thousands separators.
std::string mib_text(int64_t bytes) {
  std::string d = std::to_string(bytes >> 20);
  for (int i = static_cast<int>(d.size()) - 3; i > 0; i -= 3) d.insert(static_cast<size_t>(i), ",");
  return d + " MiB";
}
}  // namespace

std::string card_verdict(const GpuCard& card, int64_t total_bytes) {
  std::vector<GpuModel> no, yes;
  for (const GpuModel& m : card.models) (total_bytes <= m.capacity_bytes ? yes : no).push_back(m);
  if (no.empty() || yes.empty()) {
    const int64_t headroom = card.capacity_bytes - total_bytes;
    return headroom >= 0 ? "yes, " + human_bytes(static_cast<double>(headroom)) + " spare"
                         : "no, " + human_bytes(static_cast<double>(-headroom)) + " short";
  }
  auto names = [](const std::vector<GpuModel>& ms) {
    std::string s;
    for (const GpuModel& m : ms) s += (s.empty() ? "" : " / ") + m.name + " (" + mib_text(m.capacity_bytes) + ")";
    return s;
  };
  // Models ascend, so no.front() is the shortest of the too-small ones and yes.front() the tightest fit.
  return "no on " + names(no) + ": " + human_bytes(static_cast<double>(total_bytes - no.front().capacity_bytes)) +
         " short on the " + no.front().name + "; yes on " + names(yes) + ": " +
         human_bytes(static_cast<double>(yes.front().capacity_bytes - total_bytes)) + " spare";
}

int64_t MemoryEstimate::component(const std::string& name) const {
  for (const MemoryComponent& c : components)
    if (c.name == name) return c.bytes;
  return 0;
}

int64_t MemoryEstimate::reserved_only_bytes() const {
  return component("allocator segment rounding (persistent tensors)") +
         component("allocator fragmentation (activations)");
}

namespace {

/// Why a CPU estimate judges no GPU card.
/// Said beside every CUDA estimate: what it was checked against, and only that (trial 29: a card's
/// "yes, 3.44 GiB spare" read as measured on that card).
constexpr const char* kCudaUnmeasuredNote =
    "the CUDA estimate was checked on one GPU only (an H200, torch 2.11, 2026-12-04: peak reserved within "
    "-0.8%..+3.3% for llama2-7b/13b, which it was fitted to, and -3.4%..+7.5% for llama3-8b; the 768 MiB "
    "context measured; docs/memory.md); another card, driver or torch version can differ: leave a margin";
constexpr const char* kCpuFitsNote =
    "not applicable to --device cpu (no CUDA context, cuBLAS workspaces or allocator rounding); "
    "--device cuda judges GPU cards";

/// One decoder linear of one layer: {suffix, in, out, has_bias}.
struct LinearShape {
  std::string name;
  int64_t in, out;
  bool bias;
};

std::vector<LinearShape> layer_linears(const ModelConfig& c) {
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  const int64_t Q = c.num_attention_heads * c.head_dim, K = c.num_key_value_heads * c.head_dim;
  const bool qkv_b = c.attention_bias || c.qkv_bias, o_b = c.attention_bias, m_b = c.mlp_bias;
  return {{"q_proj", H, Q, qkv_b},    {"k_proj", H, K, qkv_b}, {"v_proj", H, K, qkv_b}, {"o_proj", Q, H, o_b},
          {"gate_proj", H, I, m_b},   {"up_proj", H, I, m_b},  {"down_proj", I, H, m_b}};
}

bool targeted(const EstimateOptions& o, const std::string& name) {
  if (o.method != EstimateOptions::Method::Lora && o.method != EstimateOptions::Method::QLora) return false;
  const bool attn = name == "q_proj" || name == "k_proj" || name == "v_proj" || name == "o_proj";
  return lora_targets_module(std::string("model.layers.0.") + (attn ? "self_attn." : "mlp.") + name, o.lora_targets);
}

bool training(const EstimateOptions& o) { return o.method != EstimateOptions::Method::Inference; }

void validate(const ModelConfig& cfg, const EstimateOptions& o) {
  cfg.validate("estimate");
  QLORA_CHECK(o.bits == 16 || o.bits == 8 || o.bits == 4, "estimate: --bits must be 16, 8 or 4, got ", o.bits);
  QLORA_CHECK(o.micro_batch_size > 0, "estimate: --micro-batch-size must be > 0, got ", o.micro_batch_size);
  QLORA_CHECK(o.seq_len > 0, "estimate: --seq-len must be > 0, got ", o.seq_len);
  QLORA_CHECK(o.compute_bytes == 2 || o.compute_bytes == 4, "estimate: compute dtype must be 2 or 4 bytes");
  QLORA_CHECK(o.ce_chunk_tokens > 0, "estimate: the cross-entropy chunk must be > 0 tokens");
  QLORA_CHECK(o.overhead_bytes >= 0, "estimate: overhead must be >= 0 bytes");
  if (o.bits == 4) {
    QLORA_CHECK(o.blocksize >= 32 && o.blocksize <= 4096 && (o.blocksize & (o.blocksize - 1)) == 0,
                "estimate: --blocksize must be a power of two in 32..4096, got ", o.blocksize);
  }
  // Every term is int64 bytes: sizes whose activations pass 2^62 bytes (4 EiB) would wrap around
  // to a negative total that "fits" every card (trial 19). An upper bound, in floating point: the
  // tokens of a micro-batch x the widest row x 64 bytes x the layers, the B·T² masks, the weights.
  const long double tokens = static_cast<long double>(o.micro_batch_size) * static_cast<long double>(o.seq_len);
  const long double widest = static_cast<long double>(std::max({cfg.hidden_size, cfg.intermediate_size,
                                                                cfg.num_attention_heads * cfg.head_dim, cfg.vocab_size}));
  const long double bound = tokens * widest * 64.0L * static_cast<long double>(cfg.num_hidden_layers + 2) +
                            8.0L * tokens * static_cast<long double>(o.seq_len) +  // the [B,1,T,T] masks
                            16.0L * static_cast<long double>(cfg.num_parameters());
  QLORA_CHECK(bound < 0x1p62L, "estimate: --micro-batch-size ", o.micro_batch_size, " x --seq-len ", o.seq_len,
              " is out of range for this model (its activations alone would pass 2^62 bytes, 4 EiB)");
  using M = EstimateOptions::Method;
  QLORA_CHECK(!(o.method == M::QLora && o.bits == 16), "estimate: qlora needs --bits 4 or 8 (use --method lora for a 16-bit base)");
  QLORA_CHECK(!(o.method == M::Lora && o.bits != 16), "estimate: lora means a 16-bit base; use --method qlora for --bits ", o.bits);
  QLORA_CHECK(!(o.method == M::Full && o.bits != 16), "estimate: a full fine-tune trains 16-bit weights; --bits must be 16");
  if (o.method == M::Lora || o.method == M::QLora) {
    QLORA_CHECK(o.lora_r > 0, "estimate: --lora-r must be > 0, got ", o.lora_r);
    QLORA_CHECK(o.lora_dropout >= 0 && o.lora_dropout < 1, "estimate: LoRA dropout must be in [0, 1)");
    bool any = false;
    for (const LinearShape& l : layer_linears(cfg)) {
      if (!targeted(o, l.name)) continue;
      any = true;
      QLORA_CHECK(o.lora_r <= std::min(l.in, l.out), "estimate: --lora-r ", o.lora_r, " is larger than ", l.name,
                  "'s width ", std::min(l.in, l.out));
    }
    std::string given;
    for (const std::string& t : o.lora_targets) given += (given.empty() ? "" : ", ") + t;
    QLORA_CHECK(any, "estimate: the LoRA targets [", given, "] match no linear (q_proj, k_proj, v_proj, o_proj, "
                "gate_proj, up_proj, down_proj, all-linear)");
  }
}

}  // namespace

std::vector<MemoryComponent> layer_activation_terms(const ModelConfig& c, const EstimateOptions& o) {
  using M = EstimateOptions::Method;
  const int64_t B = o.micro_batch_size, T = o.seq_len, N = B * T, b = o.compute_bytes;
  const int64_t H = c.hidden_size, I = c.intermediate_size, nh = c.num_attention_heads;
  const int64_t Q = nh * c.head_dim;
  std::vector<MemoryComponent> t;
  if (!training(o)) return t;
  // rms_norm: x.to(fp32) is kept by pow() and mul(), rsqrt's output [N, 1] by mul().
  t.push_back({"input_layernorm fp32 copy", 4 * N * H + 4 * N, true, "4·N·H + 4·N"});
  // SDPA (flash / memory-efficient / CPU flash) keeps q, k, v after RoPE (k, v already repeated to
  // nh heads by repeat_kv), its output, and a fp32 logsumexp [B, nh, T]. No [T, T] tensor.
  t.push_back({"attention q, k, v (after RoPE, k/v repeated)", 3 * N * Q * b, true, "3·N·nh·hd·b"});
  t.push_back({"attention output + logsumexp", N * Q * b + B * nh * T * 4, true, "N·nh·hd·b + B·nh·T·4"});
  // With a dense bool mask, SDPA converts it to a compute-dtype additive bias [B, 1, T, T] on every
  // call (aten convert_boolean_attn_mask), which the memory-efficient kernel keeps for backward.
  if (o.attention_mask)
    t.push_back({"attention mask as SDPA bias [B,1,T,T]", B * T * T * b, true, "B·T²·b (padding, packing or a sliding window only)"});
  t.push_back({"post_attention_layernorm fp32 copy", 4 * N * H + 4 * N, true, "4·N·H + 4·N"});
  // silu(g) keeps g; silu(g)·u keeps silu(g) and u.
  t.push_back({"MLP gate, silu(gate), up", 3 * N * I * b, true, "3·N·I·b"});
  if (o.method == M::Full) {
    // Each linear keeps its input for the weight gradient: x1 (q,k,v), attention output (o),
    // x2 (gate,up), silu(g)·u (down).
    t.push_back({"linear inputs (weight gradients)", N * (2 * H + Q + I) * b, true, "N·(2H + nh·hd + I)·b"});
    return t;
  }
  // LoRA: a frozen base keeps nothing of x (16-bit: mm keeps the weight, a parameter;
  // 4-bit: Dequant4Linear keeps only the 4-bit weight). The adapter keeps its input (dropout's
  // output when dropout > 0, plus the dropout mask), h·Aᵀ [N, r], and the casts of A and B.
  const bool drop = o.lora_dropout > 0;
  const int64_t mask_bytes = o.cuda ? 1 : b;  // CUDA native_dropout: bool mask; CPU: input · noise
  int64_t inputs = 0, r_terms = 0;
  bool x1 = false, x2 = false;
  for (const LinearShape& l : layer_linears(c)) {
    if (!targeted(o, l.name)) continue;
    r_terms += N * o.lora_r * b + (l.in + l.out) * o.lora_r * b;
    if (drop) {
      inputs += N * l.in * (b + mask_bytes);
    } else if (l.name == "q_proj" || l.name == "k_proj" || l.name == "v_proj") {
      if (!x1) inputs += N * l.in * b;  // the shared normed input, kept once
      x1 = true;
    } else if (l.name == "gate_proj" || l.name == "up_proj") {
      if (!x2) inputs += N * l.in * b;
      x2 = true;
    } else {
      inputs += N * l.in * b;
    }
  }
  t.push_back({drop ? "LoRA inputs (dropout output + mask, per adapted linear)" : "LoRA inputs (shared)", inputs,
               true, drop ? "Σ N·in·(b + mask)" : "N·in·b per distinct input"});
  t.push_back({"LoRA x·Aᵀ and A/B casts", r_terms, true, "Σ N·r·b + (in + out)·r·b"});
  return t;
}

MemoryEstimate estimate_memory(const ModelConfig& cfg, const EstimateOptions& given) {
  validate(cfg, given);
  // Rows longer than a sliding window (Mistral's) get the dense mask whatever the padding
  // (LlamaModel::build_mask limits each query to the window through it; trial 29: left out).
  EstimateOptions o = given;
  if (cfg.sliding_window > 0 && o.seq_len > cfg.sliding_window) o.attention_mask = true;
  using M = EstimateOptions::Method;
  MemoryEstimate e;
  e.model = cfg;
  e.options = o;
  if (const std::string note = positions_note(o.seq_len, cfg); !note.empty())
    e.warnings.push_back(note + "; the memory below is for the length given");
  e.num_parameters = cfg.num_parameters();
  const int64_t L = cfg.num_hidden_layers, H = cfg.hidden_size, V = cfg.vocab_size, b = o.compute_bytes;
  const int64_t B = o.micro_batch_size, T = o.seq_len, N = B * T;
  const int64_t Q = cfg.num_attention_heads * cfg.head_dim, K = cfg.num_key_value_heads * cfg.head_dim;
  const int64_t I = cfg.intermediate_size;

  // --- weights ---
  int64_t packed = 0, consts = 0, plain = 0, largest_linear = 0;
  for (const LinearShape& l : layer_linears(cfg)) {
    const int64_t n = l.in * l.out;
    e.quantizable_parameters += L * n;
    largest_linear = std::max(largest_linear, n);
    if (l.bias) plain += L * l.out * b;
    if (o.bits == 4) {
      const int64_t p = (n + 1) / 2;  // two 4-bit codes per byte
      packed += L * p;
      consts += L * (kernels::quantized_weight_bytes(n, o.blocksize, o.double_quant) - p);
    } else if (o.bits == 8) {
      packed += L * n;        // int8 codes
      consts += L * l.out * 4;  // LLM.int8 row-wise fp32 absmax (bitsandbytes SCB)
    } else {
      plain += L * n * b;
    }
  }
  plain += V * H * b * (cfg.tie_word_embeddings ? 1 : 2) + (2 * L + 1) * H * b;  // embed, lm_head, norms
  auto add = [&](std::string name, int64_t bytes, std::string note, bool in_total = true) {
    e.components.push_back({std::move(name), bytes, in_total, std::move(note)});
  };
  if (o.bits != 16) {
    add(o.bits == 4 ? "quantized weights (4-bit packed)" : "quantized weights (int8)", packed,
        o.bits == 4 ? "Σ ceil(n/2) over the decoder linears" : "Σ n over the decoder linears");
    add("quantization constants", consts,
        o.bits == 4 ? (o.double_quant ? "nblocks·1 + ceil(nblocks/256)·4 + 1028 per linear"
                                      : "nblocks·4 per linear")
                    : "out·4 per linear (row absmax)");
  }
  add("unquantized modules", plain,
      o.bits == 16 ? "all parameters · b" : "embed_tokens, lm_head, norms, biases · b");

  // --- trainable state ---
  for (const LinearShape& l : layer_linears(cfg))
    if (targeted(o, l.name)) e.lora_parameters += L * o.lora_r * (l.in + l.out);
  if (o.method == M::Lora || o.method == M::QLora) {
    add("LoRA parameters (fp32)", 4 * e.lora_parameters, "r·(in + out)·4 per adapted linear");
    add("LoRA gradients (fp32)", 4 * e.lora_parameters, "same shapes as the parameters");
    add("AdamW states (exp_avg + exp_avg_sq, fp32)", 8 * e.lora_parameters,
        "2·4 per LoRA parameter; the fp32 LoRA parameters are their own master copy");
    if (o.world_size > 1)  // Distributed::sum_gradients: torch::cat of the grads, summed, copied back
      add("gradient allreduce buffer (fp32, flat)", 4 * e.lora_parameters,
          "4 per LoRA parameter, one flat buffer per step (world size " + std::to_string(o.world_size) + ")");
  } else if (o.method == M::Full) {
    const int64_t P = e.num_parameters;
    add("gradients (compute dtype)", P * b, "P·b");
    add("AdamW states (exp_avg + exp_avg_sq, fp32)", 8 * P, "2·4·P");
    add("fp32 master weights", b == 4 ? 0 : 4 * P, "4·P (0 when computing in fp32)");
  }

  // --- activations ---
  const size_t activations_from = e.components.size();
  if (training(o)) {
    for (const MemoryComponent& t : layer_activation_terms(cfg, o)) e.activation_bytes_per_layer += t.bytes;
    e.activation_bytes_per_layer_checkpointed = N * H * b;
    const int64_t rope = 2 * B * T * cfg.head_dim * b;  // cos, sin [B, 1, T, hd], shared by all layers
    const bool ck = o.gradient_checkpointing;
    add("activations saved for backward", L * (ck ? e.activation_bytes_per_layer_checkpointed
                                                   : e.activation_bytes_per_layer) + rope,
        ck ? "L·N·H·b (each layer's input) + RoPE cos/sin" : "L·(per-layer saved set) + RoPE cos/sin");
    add("final hidden + target rows", 2 * N * H * b, "2·N·H·b, held by train_step through backward");
    // Loss phase (end of forward): final norm's fp32 copy, the CE's precomputed d/dhidden, one chunk
    // of logits (16-bit linear output, its fp32 copy, fp32 softmax-minus-onehot) — peak inside a chunk.
    const int64_t c = std::min(o.ce_chunk_tokens, N);
    const int64_t loss_norm = 4 * N * H + 4 * N + N * H * b;
    const int64_t logits = 2 * c * V * 4 + c * V * b;
    // Backward phase (first layer of backward): the recomputed layer's saved set, the largest
    // gradient temporaries, a dequantized weight.
    const int64_t recompute = ck ? e.activation_bytes_per_layer : 0;
    const int64_t transients = 2 * N * H * b + std::max(3 * N * I * b, 3 * N * Q * b + N * Q * 4);
    const int64_t scratch = o.bits != 16 ? largest_linear * b : 0;
    const bool loss_peak = loss_norm + logits >= recompute + transients + scratch;
    add("loss: final norm fp32 + d/dhidden", loss_norm, "4·N·H + 4·N + N·H·b", loss_peak);
    add("loss: logits chunk", logits, "2·c·V·4 + c·V·b, c = min(1024, N)", loss_peak);
    add("backward: recomputed layer", recompute, "one layer's saved set (checkpointing only)", !loss_peak);
    add("backward: gradient temporaries", transients, "2·N·H·b + max(3·N·I·b, 3·N·nh·hd·b + N·nh·hd·4)",
        !loss_peak);
    add("dequantization scratch", scratch, "largest linear (out·in) in the compute dtype", !loss_peak);
  } else {
    // Inference: generation's KV cache over seq_len, one layer's temporaries, prefill logits.
    add("KV cache", 2 * L * N * K * b, "2·L·N·nkv·hd·b");
    add("layer temporaries", N * (2 * H + 3 * Q + 3 * I) * b, "N·(2H + 3·nh·hd + 3I)·b");
    add("logits (prefill)", N * V * b, "N·V·b");
    add("dequantization scratch", o.bits != 16 ? largest_linear * b : 0, "largest linear in the compute dtype");
  }
  if (training(o) && o.attention_mask)
    add("attention mask (dense bool [B,1,T,T])", B * T * T, "B·T², held from build_mask through backward");
  int64_t activations = 0;  // at the peak: the in-total working set of the phase that peaks
  for (size_t i = activations_from; i < e.components.size(); ++i)
    if (e.components[i].in_total) activations += e.components[i].bytes;
  if (o.cuda) {
    const int64_t handles = o.cublas_handles >= 0 ? o.cublas_handles : (training(o) ? 2 : 1);
    add("cuBLAS workspaces (caching allocator)", handles * kCublasWorkspaceBytesPerHandle,
        std::to_string(handles) + " handles × 32 MiB (sm_90)");
  }
  if (o.cuda && o.allocator_rounding) {
    // The persistent tensors in the order they are made: each layer's weights (packed, constants),
    // the unquantized modules, then LoRA parameters, gradients and AdamW states.
    std::vector<int64_t> sizes;
    for (int64_t li = 0; li < L; ++li) {
      for (const LinearShape& l : layer_linears(cfg)) {
        const int64_t n = l.in * l.out, nb = (n + o.blocksize - 1) / o.blocksize;
        if (o.bits == 4) {
          sizes.push_back((n + 1) / 2);
          if (o.double_quant) {
            sizes.push_back(nb);
            sizes.push_back(4 * ((nb + 255) / 256));
            sizes.push_back(256 * 4);
          } else {
            sizes.push_back(4 * nb);
          }
        } else if (o.bits == 8) {
          sizes.push_back(n);
          sizes.push_back(4 * l.out);
        } else {
          sizes.push_back(n * b);
        }
        if (l.bias) sizes.push_back(l.out * b);
      }
      sizes.push_back(H * b);
      sizes.push_back(H * b);
    }
    sizes.push_back(V * H * b);
    if (!cfg.tie_word_embeddings) sizes.push_back(V * H * b);
    sizes.push_back(H * b);
    if (o.method == M::Lora || o.method == M::QLora)
      for (int copy = 0; copy < 4; ++copy)  // parameters, gradients, exp_avg, exp_avg_sq
        for (int64_t li = 0; li < L; ++li)
          for (const LinearShape& l : layer_linears(cfg))
            if (targeted(o, l.name)) {
              sizes.push_back(4 * o.lora_r * l.in);
              sizes.push_back(4 * o.lora_r * l.out);
            }
    const AllocatorFootprint f = caching_allocator_footprint(sizes);
    add("allocator segment rounding (persistent tensors)", f.reserved - f.requested,
        "caching-allocator segments − bytes asked, weights + LoRA state (peak reserved only)");
    if (training(o))
      add("allocator fragmentation (activations)",
          static_cast<int64_t>(std::llround(kActivationFragmentation * static_cast<double>(activations))),
          "0.18 × the activations at the peak: cached blocks they cannot reuse (fitted on an H200; peak reserved only)");
  }
  add("CUDA context + allocator", o.overhead_bytes,
      o.overhead_bytes ? "constant, 767–773 MiB measured on an H200 (torch 2.11)" : "none (CPU)");
  for (const MemoryComponent& c : e.components)
    if (c.in_total) e.total_bytes += c.bytes;
  return e;
}

AllocatorFootprint caching_allocator_footprint(const std::vector<int64_t>& sizes) {
  constexpr int64_t kMinBlockSize = 512, kSmallSize = 1 << 20, kSmallBuffer = 2 << 20, kLargeBuffer = 20 << 20,
                    kMinLargeAlloc = 10 << 20, kRoundLarge = 2 << 20;
  std::multiset<int64_t> small, large;  // free block sizes per pool (addresses do not matter for totals)
  AllocatorFootprint f;
  for (int64_t s : sizes) {
    QLORA_CHECK(s >= 0, "caching_allocator_footprint: negative size ", s);
    f.requested += s;
    const int64_t r = s < kMinBlockSize ? kMinBlockSize : (s + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
    const bool is_small = r <= kSmallSize;
    std::multiset<int64_t>& pool = is_small ? small : large;
    int64_t block;
    auto it = pool.lower_bound(r);
    if (it != pool.end()) {
      block = *it;
      pool.erase(it);
    } else {
      block = is_small ? kSmallBuffer : r < kMinLargeAlloc ? kLargeBuffer : (r + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
      f.reserved += block;
    }
    const int64_t rest = block - r;
    if (is_small ? rest >= kMinBlockSize : rest > kSmallSize) {
      pool.insert(rest);
      f.allocated += r;
    } else {
      f.allocated += block;
    }
  }
  return f;
}

json rule_of_thumb(const MemoryEstimate& e) {
  const double P = static_cast<double>(e.num_parameters);
  const double wb = e.options.bits / 8.0;
  json r = json::array();
  r.push_back({{"rule", "weights = params × 2 bytes (16-bit)"}, {"bytes", static_cast<int64_t>(P * 2)}});
  r.push_back({{"rule", "weights = params × 1 byte (8-bit)"}, {"bytes", static_cast<int64_t>(P)}});
  r.push_back({{"rule", "weights = params × 0.5 byte (4-bit)"}, {"bytes", static_cast<int64_t>(P / 2)}});
  r.push_back({{"rule", "inference = weights × 1.2 (at --bits)"}, {"bytes", static_cast<int64_t>(P * wb * 1.2)}});
  r.push_back({{"rule", "full fine-tune = params × 16 bytes"}, {"bytes", static_cast<int64_t>(P * 16)}});
  return r;
}

json claim_checks(const MemoryEstimate& e) {
  const double P = static_cast<double>(e.num_parameters);
  json r = json::array();
  // The claims are about QLoRA: a LoRA / full / inference config is not evidence either way.
  if (e.options.method != EstimateOptions::Method::QLora) return r;
  if (P > 6e9 && P < 8e9) {
    const GpuCard& card = common_gpu_cards().front();  // the 16 GB class: a T4's 15360 MiB
    r.push_back({{"claim", "a 7B QLoRA fine-tune fits in 16 GB"},
                 {"compared_with", card.name + ": a T4's nvidia-smi memory.total, 15,360 MiB"},
                 {"limit_bytes", card.capacity_bytes},
                 {"total_bytes", e.total_bytes},
                 {"holds", e.total_bytes <= card.capacity_bytes}});
  }
  if (P > 12e9 && P < 14e9)
    r.push_back({{"claim", "a 13B QLoRA fine-tune needs ~28 GB"},
                 {"compared_with", "28 GB = 28e9 bytes"},
                 {"limit_bytes", 28LL * 1000 * 1000 * 1000},
                 {"total_bytes", e.total_bytes},
                 {"holds", e.total_bytes >= 28LL * 1000 * 1000 * 1000}});
  return r;
}

json estimate_to_json(const MemoryEstimate& e) {
  const EstimateOptions& o = e.options;
  json comps = json::array();
  for (const MemoryComponent& c : e.components)
    comps.push_back({{"name", c.name}, {"bytes", c.bytes}, {"in_total", c.in_total}, {"formula", c.note}});
  json per_layer = json::array();
  for (const MemoryComponent& c : layer_activation_terms(e.model, o))
    per_layer.push_back({{"name", c.name}, {"bytes", c.bytes}, {"formula", c.note}});
  json fits = json::array();
  if (o.cuda)
    for (const GpuCard& g : common_gpu_cards()) {
      json models = json::array();
      for (const GpuModel& m : g.models)
        models.push_back({{"model", m.name},
                          {"capacity_bytes", m.capacity_bytes},
                          {"headroom_bytes", m.capacity_bytes - e.total_bytes},
                          {"fits", e.total_bytes <= m.capacity_bytes}});
      fits.push_back({{"card", g.name},
                      {"capacity_bytes", g.capacity_bytes},
                      {"headroom_bytes", g.capacity_bytes - e.total_bytes},
                      {"fits", e.total_bytes <= g.capacity_bytes},
                      {"models", models}});
    }
  json j = {{"model",
           {{"architecture", e.model.architecture}, {"hidden_size", e.model.hidden_size},
            {"intermediate_size", e.model.intermediate_size}, {"num_hidden_layers", e.model.num_hidden_layers},
            {"vocab_size", e.model.vocab_size}, {"num_parameters", e.num_parameters},
            {"quantizable_parameters", e.quantizable_parameters}}},
          {"options",
           {{"method", to_string(o.method)}, {"bits", o.bits}, {"blocksize", o.blocksize},
            {"double_quant", o.double_quant}, {"lora_r", o.lora_r}, {"lora_targets", o.lora_targets},
            {"lora_dropout", o.lora_dropout}, {"micro_batch_size", o.micro_batch_size}, {"seq_len", o.seq_len},
            {"gradient_checkpointing", o.gradient_checkpointing}, {"compute_bytes", o.compute_bytes},
            {"ce_chunk_tokens", o.ce_chunk_tokens}, {"cuda", o.cuda}, {"world_size", o.world_size}}},
          {"lora_parameters", e.lora_parameters},
          {"activation_bytes_per_layer", e.activation_bytes_per_layer},
          {"activation_bytes_per_layer_checkpointed", e.activation_bytes_per_layer_checkpointed},
          {"activation_terms_per_layer", per_layer},
          {"components", comps},
          {"total_bytes", e.total_bytes},
          {"fits", fits},
          {"rule_of_thumb", rule_of_thumb(e)},
          {"claims", claim_checks(e)},
          {"warnings", e.warnings}};
  if (!o.cuda) j["fits_note"] = kCpuFitsNote;
  else j["cuda_note"] = kCudaUnmeasuredNote;
  return j;
}

std::string format_estimate(const MemoryEstimate& e) {
  const EstimateOptions& o = e.options;
  std::ostringstream os;
  for (const std::string& w : e.warnings) os << "warning: " << w << "\n";
  os << "model: " << e.model.architecture << ", " << e.num_parameters << " parameters (" << e.model.num_hidden_layers
     << " layers, hidden " << e.model.hidden_size << ", vocab " << e.model.vocab_size << ")\n"
     << "method " << to_string(o.method) << ", " << o.bits << "-bit base";
  if (o.bits == 4) os << " (blocksize " << o.blocksize << (o.double_quant ? ", double quant" : "") << ")";
  if (o.method == EstimateOptions::Method::Lora || o.method == EstimateOptions::Method::QLora)
    os << ", LoRA r=" << o.lora_r << " on " << [&] {
      std::string s;
      for (const auto& t : o.lora_targets) s += (s.empty() ? "" : ",") + t;
      return s;
    }() << " (" << e.lora_parameters << " trainable)";
  if (o.world_size > 1) os << "\ndata parallel over " << o.world_size << " ranks: the memory below is per rank";
  os << "\nmicro-batch " << o.micro_batch_size << " × " << o.seq_len << " tokens, compute " << o.compute_bytes * 8
     << "-bit, gradient checkpointing " << (o.gradient_checkpointing ? "on" : "off") << "\n\n";
  os << std::left << std::setw(50) << "component" << std::right << std::setw(14) << "bytes" << "  formula\n";
  for (const MemoryComponent& c : e.components)
    os << std::left << std::setw(50) << (c.in_total ? c.name : c.name + " (not at peak)") << std::right
       << std::setw(14) << human_bytes(static_cast<double>(c.bytes)) << "  " << c.note << "\n";
  os << std::left << std::setw(50) << "TOTAL (peak)" << std::right << std::setw(14)
     << human_bytes(static_cast<double>(e.total_bytes)) << "  (" << e.total_bytes << " bytes)\n";
  if (e.activation_bytes_per_layer)
    os << "activations per layer: " << human_bytes(static_cast<double>(e.activation_bytes_per_layer))
       << " without checkpointing, " << human_bytes(static_cast<double>(e.activation_bytes_per_layer_checkpointed))
       << " with\n";
  if (o.cuda) os << "note: " << kCudaUnmeasuredNote << "\n";
  if (!o.cuda) os << "\nfits on: " << kCpuFitsNote << "\n";
  else
    os << "\nfits on (capacity: nvidia-smi memory.total of the class's smallest card; where the class's cards "
          "disagree, each is named with its own):\n";
  for (const GpuCard& g : o.cuda ? common_gpu_cards() : std::vector<GpuCard>{})
    os << "  " << std::left << std::setw(36) << g.name << std::setw(12)
       << human_bytes(static_cast<double>(g.capacity_bytes)) << card_verdict(g, e.total_bytes) << "\n";
  os << "\nrules of thumb (for comparison):\n";
  for (const json& r : rule_of_thumb(e))
    os << "  " << std::left << std::setw(46) << r["rule"].get<std::string>()
       << human_bytes(static_cast<double>(r["bytes"].get<int64_t>())) << "\n";
  for (const json& c : claim_checks(e)) {
    const int64_t limit = c["limit_bytes"].get<int64_t>();
    const bool fits_claim = c["claim"].get<std::string>().find("fits in") != std::string::npos;
    os << "\nclaim \"" << c["claim"].get<std::string>() << "\": this config's total "
       << human_bytes(static_cast<double>(e.total_bytes)) << (fits_claim ? (c["holds"].get<bool>() ? " fits" : " does not fit")
                                                                        : (c["holds"].get<bool>() ? " reaches" : " is below"))
       << " the " << human_bytes(static_cast<double>(limit)) << " it is compared with (" << c["compared_with"].get<std::string>()
       << ")" << (o.cuda ? "" : "; a GPU claim, and this is a --device cpu estimate without the CUDA terms") << "\n";
  }
  return os.str();
}

TrainingFlops training_flops_per_token(const ModelConfig& cfg, const EstimateOptions& o) {
  TrainingFlops f;
  const int64_t L = cfg.num_hidden_layers, T = o.seq_len;
  const double Q = static_cast<double>(cfg.num_attention_heads * cfg.head_dim);
  int64_t base = 0;
  for (const LinearShape& l : layer_linears(cfg)) {
    base += L * l.in * l.out;
    if (targeted(o, l.name)) f.lora_params += L * o.lora_r * (l.in + l.out);
  }
  const int64_t head = cfg.vocab_size * cfg.hidden_size;
  f.matmul_params = base + head;
  // Causal attention forward per token per layer: QKᵀ and A·V over T/2 keys on average, 2 FLOPs
  // per multiply-add: 2·(2·Q·T/2) = 2·Q·T. Backward: 2× forward (dQ, dK, dV, dS).
  const double attn_fwd = 2.0 * Q * static_cast<double>(T) * static_cast<double>(L);
  if (o.method == EstimateOptions::Method::Full) {
    f.model_flops = 6.0 * static_cast<double>(f.matmul_params) + 3 * attn_fwd;
  } else {
    f.model_flops = 4.0 * static_cast<double>(f.matmul_params) + 6.0 * static_cast<double>(f.lora_params) + 3 * attn_fwd;
  }
  f.hardware_flops = f.model_flops;
  if (o.gradient_checkpointing)
    f.hardware_flops += 2.0 * static_cast<double>(base) + 2.0 * static_cast<double>(f.lora_params) + attn_fwd;
  return f;
}

double training_step_seconds(const ModelConfig& cfg, const EstimateOptions& o, const DeviceRates& r) {
  QLORA_CHECK(r.matmul_flops > 0, "bench: no matmul throughput to predict a step from (got ", r.matmul_flops, " FLOP/s)");
  const double tokens = static_cast<double>(o.micro_batch_size * o.seq_len);
  double s = training_flops_per_token(cfg, o).hardware_flops * tokens / r.matmul_flops;
  if (o.bits == 4 && r.dequant_elements > 0) {
    int64_t n = 0;
    for (const LinearShape& l : layer_linears(cfg)) n += cfg.num_hidden_layers * l.in * l.out;
    const double passes = o.gradient_checkpointing ? 3 : 2;  // forward, backward (+ the recompute)
    s += passes * static_cast<double>(n) / r.dequant_elements;
  }
  return s;
}

double random_weights_seconds(const ModelConfig& cfg, bool quantized, const DeviceRates& r) {
  int64_t linear = 0;
  for (const LinearShape& l : layer_linears(cfg)) linear += cfg.num_hidden_layers * l.in * l.out;
  const int64_t q = quantized ? linear : 0, plain = cfg.num_parameters() - q;
  QLORA_CHECK(r.plain_init_elements > 0 && (q == 0 || r.quantized_init_elements > 0),
              "bench: no weight-making rate to predict from");
  return static_cast<double>(plain) / r.plain_init_elements +
         (q > 0 ? static_cast<double>(q) / r.quantized_init_elements : 0.0);
}

double peak_flops_for_device_name(const std::string& name) {
  // Dense bf16 tensor-core peaks from the vendors' data sheets (SXM parts).
  const std::vector<std::pair<std::string, double>> table = {
      {"H200", 989e12}, {"H100", 989e12}, {"A100", 312e12}, {"L40S", 362e12},
      {"A6000", 155e12}, {"A10G", 70e12}, {"L4", 121e12},   {"V100", 125e12}};
  for (const auto& [k, v] : table)
    if (name.find(k) != std::string::npos) return v;
  return 0;
}

CostEstimate estimate_cost(const CostInputs& in) {
  const double tokens = in.tokens, tokens_per_s = in.tokens_per_s, price = in.gpu_hour_price,
               utilization = in.utilization;
  const int64_t devices = in.devices;
  QLORA_CHECK(devices >= 1, "cost: --world-size must be >= 1, got ", devices);
  QLORA_CHECK(tokens >= 0, "cost: --tokens must be >= 0, got ", tokens);
  QLORA_CHECK(tokens_per_s > 0, "cost: --tokens-per-s must be > 0, got ", tokens_per_s);
  QLORA_CHECK(price >= 0, "cost: --gpu-hour-price must be >= 0, got ", price);
  QLORA_CHECK(utilization > 0 && utilization <= 1, "cost: --utilization must be in (0, 1], got ", utilization);
  CostEstimate c;
  c.job_tokens_per_s = tokens_per_s * static_cast<double>(devices);
  c.wall_hours_full = tokens / c.job_tokens_per_s / 3600.0;
  c.gpu_hours_full = c.wall_hours_full * static_cast<double>(devices);
  c.gpu_hours_at_utilization = c.gpu_hours_full / utilization;
  c.cost_full = c.gpu_hours_full * price;
  c.cost_at_utilization = c.gpu_hours_at_utilization * price;
  c.cost_per_million_tokens = 1e6 / c.job_tokens_per_s / 3600.0 * static_cast<double>(devices) * price;
  return c;
}

EstimateOptions estimate_options_for(const Config& cfg, const torch::Device& device) {
  EstimateOptions o;
  const bool quant = cfg.quantization.enabled();
  o.method = quant ? EstimateOptions::Method::QLora : EstimateOptions::Method::Lora;
  o.bits = quant ? 4 : 16;
  o.blocksize = cfg.quantization.blocksize;
  o.double_quant = cfg.quantization.double_quant;
  o.lora_r = cfg.lora.r;
  o.lora_targets = cfg.lora.target_modules;
  o.lora_dropout = cfg.lora.dropout;
  o.micro_batch_size = cfg.training.micro_batch_size;
  o.seq_len = cfg.data.sequence_len;
  o.gradient_checkpointing = cfg.training.gradient_checkpointing;
  o.cuda = device.is_cuda();
  o.compute_bytes = dtype_bytes(resolve_dtype(cfg.model.dtype, o.cuda));
  o.overhead_bytes = o.cuda ? kCudaOverheadBytes : 0;
  // A padded row (rows are padded to the batch's longest) or packing makes build_mask build the
  // dense [B, 1, T, T] mask; one unpacked row per micro-batch never has padding.
  o.attention_mask = cfg.data.sample_packing || o.micro_batch_size > 1;
  return o;
}

ModelConfig model_config_for(const Config& cfg, int64_t vocab_size) {
  ModelConfig m = !cfg.model.path.empty() ? load_model_config(cfg.model.path) : preset_config(cfg.model.preset);
  if (vocab_size > 0 && cfg.model.path.empty()) m.vocab_size = vocab_size;
  return m;
}

// ---------------------------------------------------------------------------------------------

json compare_memory(const MemoryEstimate& e, const json& phases, bool cuda) {
  json rows = json::array();
  auto get = [&](const char* phase, const char* key) -> int64_t {
    if (!phases.contains(phase) || !phases[phase].contains(key)) return -1;
    return phases[phase][key].get<int64_t>();
  };
  auto row = [&](const std::string& name, int64_t est, int64_t meas, const std::string& how) {
    if (meas < 0) return;
    json r = {{"component", name}, {"estimated_bytes", est}, {"measured_bytes", meas}, {"measured_as", how}};
    r["relative_error"] = meas > 0 ? (static_cast<double>(est) - meas) / static_cast<double>(meas) : 0.0;
    rows.push_back(r);
  };
  const int64_t model_bytes = e.component("quantized weights (4-bit packed)") + e.component("quantized weights (int8)") +
                              e.component("quantization constants") + e.component("unquantized modules") +
                              e.component("LoRA parameters (fp32)");
  const int64_t step_state = e.component("LoRA gradients (fp32)") + e.component("AdamW states (exp_avg + exp_avg_sq, fp32)");
  const int64_t tensors = e.total_bytes - e.component("CUDA context + allocator");
  if (cuda) {
    row("weights + LoRA parameters", model_bytes, get("after_load", "cuda_allocated_bytes"), "allocated after load");
    const int64_t a0 = get("after_load", "cuda_allocated_bytes"), a1 = get("after_first_step", "cuda_allocated_bytes");
    if (a0 >= 0 && a1 >= 0) row("LoRA gradients + AdamW states", step_state, a1 - a0, "allocated after step 1 − after load");
    row("peak (tensors)", tensors - e.reserved_only_bytes(),
        get("peak", "cuda_peak_allocated_bytes"), "peak allocated");
    row("peak (tensors)", tensors, get("peak", "cuda_peak_reserved_bytes"), "peak reserved");
  } else {
    const int64_t r0 = get("before_load", "rss_bytes");
    const int64_t r1 = get("after_load", "rss_bytes"), p = get("peak", "peak_rss_bytes");
    if (r0 >= 0 && r1 >= 0) row("weights + LoRA parameters", model_bytes, r1 - r0, "RSS after load − before load");
    if (r0 >= 0 && p >= 0) row("peak (tensors)", tensors, p - r0, "peak RSS − RSS before load");
  }
  return rows;
}

int64_t largest_micro_batch(const ModelConfig& cfg, const std::function<EstimateOptions(int64_t)>& options_for,
                            int64_t capacity_bytes, int64_t limit) {
  if (estimate_memory(cfg, options_for(1)).total_bytes > capacity_bytes) return 0;
  auto fits = [&](int64_t mb) {
    try {
      return estimate_memory(cfg, options_for(mb)).total_bytes <= capacity_bytes;
    } catch (const Error&) {  // out of range (validate's 2^62 bound): far too large
      return false;
    }
  };
  int64_t lo = 1, hi = limit;  // fits(lo); the answer is in [lo, hi]
  if (fits(hi)) return hi;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

std::string format_comparison(const json& rows) {
  std::ostringstream os;
  os << std::left << std::setw(32) << "component" << std::right << std::setw(13) << "estimated" << std::setw(13)
     << "measured" << std::setw(9) << "error" << "  measured as\n";
  for (const json& r : rows)
    os << std::left << std::setw(32) << r["component"].get<std::string>() << std::right << std::setw(13)
       << human_bytes(static_cast<double>(r["estimated_bytes"].get<int64_t>())) << std::setw(13)
       << human_bytes(static_cast<double>(r["measured_bytes"].get<int64_t>())) << std::setw(8) << std::fixed
       << std::setprecision(1) << 100.0 * r["relative_error"].get<double>() << "%  "
       << r["measured_as"].get<std::string>() << "\n";
  os << "(error = (estimated - measured) / measured: below 0, the estimate is under what was measured)\n";
  return os.str();
}

namespace {
// On the CPU the estimate counts tensors, while the process's RSS also holds the allocator's
// retained blocks, libtorch's thread pools and the data (docs/memory.md, "CPU measurement"):
// measured peaks on SmolLM2-135M ran 1.2 to 2.1 times it (user trials, 2026-12-02).
constexpr const char* kCpuEstimateCaveat =
    "; on the CPU that is tensors only: the process's RSS runs higher (allocator, thread pools, data; "
    "docs/memory.md, \"CPU measurement\")";
}  // namespace

void MemoryTracker::begin(const Config& cfg, const ModelConfig& model, const torch::Device& device,
                          int64_t world_size, bool writes) {
  device_ = device;
  output_dir_ = cfg.output_dir;
  writes_ = writes;
  EstimateOptions eo = estimate_options_for(cfg, device);
  eo.world_size = world_size;
  estimate_ = estimate_memory(model, eo);
  active_ = true;
  report_ = {{"device", device.str()}, {"pid", static_cast<int64_t>(::getpid())}, {"estimate", estimate_to_json(estimate_)},
             {"phases", json::object()}};
  log::info("memory estimate: ", human_bytes(static_cast<double>(estimate_.total_bytes)), " peak (",
            to_string(estimate_.options.method), ", micro-batch ", estimate_.options.micro_batch_size, " × ",
            estimate_.options.seq_len, " tokens; `qlora estimate` itemises it)",
            device.is_cuda() ? "" : kCpuEstimateCaveat);
  for (const std::string& w : estimate_.warnings) log::warn("memory estimate: ", w);  // as `qlora estimate` warns
  if (device.is_cuda()) {
    const int64_t total = cuda_total_memory(device);
    if (total > 0 && estimate_.total_bytes > total)
      log::warn("memory: the estimate (", human_bytes(static_cast<double>(estimate_.total_bytes)),
                ") exceeds this GPU's ", human_bytes(static_cast<double>(total)),
                "; expect out-of-memory. Lower training.micro_batch_size or data.sequence_len, or turn on "
                "training.gradient_checkpointing");
  }
  record("before_load");
}

void MemoryTracker::record(const std::string& phase) {
  if (!active_) return;
  report_["phases"][phase] = memory_snapshot(device_);
  write();
}

json MemoryTracker::finish() {
  if (!active_) return json::object();
  report_["phases"]["peak"] = memory_snapshot(device_);
  if (!first_step_done_) {  // the estimate is of training: with no step there is nothing to compare
    report_["comparison"] = json::array();
    report_["note"] = "no optimizer step ran in this invocation: no comparison with the estimate";
    write();
    log::info("memory: no optimizer step ran in this invocation, so no comparison with the estimate");
    return report_;
  }
  report_["comparison"] = compare_memory(estimate_, report_["phases"], device_.is_cuda());
  const int64_t full = estimate_.options.seq_len;
  if (longest_row_ > 0 && longest_row_ < full)
    report_["rows"] = {{"estimated_tokens", full}, {"longest_tokens", longest_row_}};
  write();
  log::info("memory: estimated vs measured\n", format_comparison(report_["comparison"]));
  // On the CPU a large negative error is the RSS's extra pages, not a wrong estimate: said under the
  // table (a trial read -51 % as an alarm).
  if (!device_.is_cuda())
    log::info("memory: on the CPU the measured rows are the process's RSS, which also holds the allocator's "
              "retained blocks, thread pools and the data: a sanity check of the order of magnitude (trials on "
              "SmolLM2-135M read 0.87 to 2.1 times the tensor estimate, under it where rows were shorter than "
              "data.sequence_len, a tiny model 6 times; the RSS grows with each row length not seen before until all "
              "have come; docs/memory.md, \"CPU measurement\")");
  // Said only where it explains the gap: the peak came in under the estimate.
  bool peak_under = false;
  for (const json& r : report_["comparison"])
    if (r["component"] == "peak (tensors)" && r["measured_bytes"].get<int64_t>() < r["estimated_bytes"].get<int64_t>())
      peak_under = true;
  if (report_.contains("rows") && peak_under)
    log::info("memory: the estimate is of rows of ", full, " tokens (data.sequence_len); this run's longest row had ",
              longest_row_, " (rows are padded to their batch's longest), so its activations and logits took less "
              "than estimated: `", estimate_command_.empty() ? std::string("qlora estimate --config CONFIG") : estimate_command_,
              " --seq-len ", longest_row_, "` estimates rows of that length");
  return report_;
}

void MemoryTracker::add_ranks(const std::vector<json>& reports) {
  if (!active_) return;
  json ranks = json::array();
  for (size_t r = 0; r < reports.size(); ++r)
    ranks.push_back({{"rank", r},
                     {"device", reports[r].value("device", "")},
                     {"pid", reports[r].value("pid", int64_t{0})},
                     {"phases", reports[r].value("phases", json::object())},
                     {"comparison", reports[r].value("comparison", json::array())}});
  report_["ranks"] = ranks;
  write();
}

void MemoryTracker::write() const {
  if (!writes_ || output_dir_.empty() || !fs::is_directory(output_dir_)) return;
  atomic_write_string((fs::path(output_dir_) / "memory_report.json").string(), report_.dump(2) + "\n");
}

}  // namespace qlora
