// qlora-cpp: the Llama-family decoder (Llama 2/3, Mistral, Qwen2) in LibTorch.
//
// Mirrors transformers' modeling_llama.py / modeling_qwen2.py / modeling_mistral.py: embedding,
// RMSNorm (fp32 statistics), RoPE in the rotate-half convention (so q/k LoRA weights stay
// PEFT-compatible with no permutation), grouped-query attention through
// at::scaled_dot_product_attention, SwiGLU MLP, tied or untied lm_head. Weights are plain tensors
// named exactly as in the HF checkpoint ("model.layers.3.self_attn.q_proj.weight").
#pragma once
#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "trainer/model_config.h"

namespace qlora {

/// A frozen linear layer y = x·Wᵀ + b, addressed by its HF module path.
struct FrozenLinear {
  std::string name;       ///< HF module path, e.g. "model.layers.0.self_attn.q_proj"
  torch::Tensor weight;   ///< [out_features, in_features], compute dtype
  torch::Tensor bias;     ///< [out_features] or undefined
  /// x: [..., in_features] → [..., out_features], same dtype as x.
  torch::Tensor forward(const torch::Tensor& x) const;
};

struct DecoderLayer {
  torch::Tensor input_layernorm;           ///< [hidden]
  torch::Tensor post_attention_layernorm;  ///< [hidden]
  FrozenLinear q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj;
};

/// Per-layer key/value cache for incremental decoding. k[l], v[l]: [B, n_kv_heads, S, head_dim]
/// after RoPE; `mask` [B, S] long holds 1 for real tokens seen so far.
struct KVCache {
  std::vector<torch::Tensor> k, v;
  torch::Tensor mask;
  int64_t length() const { return k.empty() || !k[0].defined() ? 0 : k[0].size(2); }
};

/// One forward's inputs. Shapes [B, T]; only input_ids is required.
struct ForwardInputs {
  torch::Tensor input_ids;       ///< long [B, T]
  torch::Tensor attention_mask;  ///< long/bool [B, T], 1 = real token, 0 = padding (undefined: all real)
  torch::Tensor position_ids;    ///< long [B, T] (undefined: cumsum(attention_mask) − 1, or 0..T−1)
  torch::Tensor segment_ids;     ///< long [B, T], packing: tokens attend only within equal ids (0 = pad)
};

/// Compute dtype from "fp32" | "bf16" | "fp16" | "auto" (auto: fp32 on CPU, bf16 on CUDA).
/// Throws qlora::Error for another spelling.
torch::Dtype parse_compute_dtype(const std::string& s, const torch::Device& device);

class LlamaModel {
 public:
  /// Empty (all tensors undefined) model of the given shape; use load() or random_init().
  LlamaModel(ModelConfig cfg, torch::Dtype dtype, torch::Device device);

  /// Loads an HF model directory (config.json + safetensors, single or sharded). Weights are cast
  /// to `dtype` on `device`. Throws qlora::Error naming the directory / tensor for a missing tensor,
  /// a shape mismatch, or any config / safetensors error.
  static LlamaModel load(const std::string& dir, torch::Dtype dtype, torch::Device device);

  /// Random weights as transformers initialises them: N(0, 0.02) for linear and embedding
  /// weights, ones for norms, zeros for biases; deterministic for a seed.
  static LlamaModel random_init(const ModelConfig& cfg, uint64_t seed, torch::Dtype dtype,
                                torch::Device device, double std = 0.02);

  /// Final hidden states [B, T, hidden] (after the last RMSNorm). With `cache`, appends this
  /// chunk's keys/values and attends to everything cached before it.
  torch::Tensor hidden_states(const ForwardInputs& in, KVCache* cache = nullptr) const;
  /// lm_head: [B, T, hidden] → [B, T, vocab] in the compute dtype.
  torch::Tensor lm_head_forward(const torch::Tensor& hidden) const;
  /// Logits [B, T, vocab].
  torch::Tensor forward(const ForwardInputs& in, KVCache* cache = nullptr) const {
    return lm_head_forward(hidden_states(in, cache));
  }

  /// Every weight under its HF name (lm_head omitted when tied), in checkpoint order.
  std::vector<std::pair<std::string, torch::Tensor>> named_tensors() const;

  const ModelConfig& config() const { return cfg_; }
  torch::Dtype dtype() const { return dtype_; }
  torch::Device device() const { return device_; }

  torch::Tensor embed_tokens;  ///< [vocab, hidden]
  torch::Tensor norm;          ///< [hidden]
  torch::Tensor lm_head;       ///< [vocab, hidden]; the same tensor as embed_tokens when tied
  std::vector<DecoderLayer> layers;

 private:
  /// Boolean attention mask [B, 1, T, S] (true = attend) or undefined when plain causal suffices.
  torch::Tensor build_mask(const ForwardInputs& in, const torch::Tensor& key_mask, int64_t past) const;
  /// cos, sin: [B, T, head_dim] in the compute dtype, for position_ids [B, T].
  std::pair<torch::Tensor, torch::Tensor> rope(const torch::Tensor& position_ids) const;

  ModelConfig cfg_;
  torch::Dtype dtype_;
  torch::Device device_;
  torch::Tensor inv_freq_;  ///< float32 [head_dim / 2]
};

/// RoPE inverse frequencies (float32 [head_dim/2]) with the config's scaling, as transformers'
/// ROPE_INIT_FUNCTIONS ("default", "linear", "llama3") compute them.
torch::Tensor rope_inv_freq(const ModelConfig& cfg);

/// RMSNorm as HF: x in fp32, x·rsqrt(mean(x²) + eps), cast back, times weight.
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

}  // namespace qlora
