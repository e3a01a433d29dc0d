// qlora-cpp: LoRA adapters (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models")
// with PEFT's conventions (peft/tuners/lora/layer.py), so weights move between PEFT and us as is.
//
//   y = W0·x + s·B·A·dropout(x),   A: [r, in], B: [out, r],   s = alpha / r   (use_rslora: alpha / √r)
//   init: A ~ kaiming_uniform(a = √5) = U(−1/√in, 1/√in), B = 0   (PEFT init_lora_weights=True)
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

namespace qlora {

/// One LoRA pair. Parameters are fp32 leaf tensors with requires_grad (master weights); forward
/// casts them to the input's dtype.
struct LoraAdapter {
  torch::Tensor A;  ///< [r, in_features] fp32
  torch::Tensor B;  ///< [out_features, r] fp32
  double scale = 1.0;
  double dropout = 0.0;

  /// PEFT's initialisation, deterministic for `gen`. Throws qlora::Error when r <= 0,
  /// alpha <= 0 or dropout outside [0, 1).
  static LoraAdapter create(int64_t in_features, int64_t out_features, int64_t r, double alpha,
                            double dropout, bool use_rslora, at::Generator gen, torch::Device device);

  int64_t r() const { return A.size(0); }
  /// s·B·A·dropout(x): x [..., in] → [..., out] in x's dtype. Dropout only when `train`.
  torch::Tensor delta(const torch::Tensor& x, bool train) const;
};

/// LoRA scaling s: alpha / r, or alpha / √r with use_rslora (Kalajdzievski 2023, rsLoRA).
double lora_scale(int64_t r, double alpha, bool use_rslora);

/// The seven Llama-family projection names, which `all-linear` expands to (lm_head excluded).
const std::vector<std::string>& llama_linear_names();

/// Whether the HF module path `module` (e.g. "model.layers.3.self_attn.q_proj") is targeted by
/// `targets` (PEFT semantics: a target matches the last path component, or the whole path, or a
/// path suffix after a '.'), or by "all-linear" (the seven projections).
bool lora_targets_module(const std::string& module, const std::vector<std::string>& targets);

}  // namespace qlora
