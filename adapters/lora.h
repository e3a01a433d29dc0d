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

#include "adapters/target_modules.h"

namespace qlora {

/// LoRA scaling s: alpha / r, or alpha / √r with use_rslora (Kalajdzievski 2023, rsLoRA).
double lora_scale(int64_t r, double alpha, bool use_rslora);

/// How LoRA adapters are made: PEFT LoraConfig's r, lora_alpha, lora_dropout, target_modules and
/// use_rslora, and the seed of the initial draw. Set fields by name (o.r = 16; o.alpha = 32; ...).
struct LoraOptions {
  int64_t r = 8;                            ///< rank, > 0
  double alpha = 16;                        ///< lora_alpha, > 0
  double dropout = 0.0;                     ///< lora_dropout on the adapter's input, in [0, 1)
  std::vector<std::string> target_modules;  ///< names, path suffixes, or "all-linear" (lora_targets_module)
  bool use_rslora = false;                  ///< scale alpha / √r instead of alpha / r
  uint64_t seed = 0;                        ///< seed of the PEFT init draw (LlamaModel::add_lora)
  /// The adapter's scale s (lora_scale).
  double scale() const { return lora_scale(r, alpha, use_rslora); }
};

/// One LoRA pair. Parameters are fp32 leaf tensors with requires_grad (master weights); forward
/// casts them to the input's dtype.
struct LoraAdapter {
  torch::Tensor A;  ///< [r, in_features] fp32
  torch::Tensor B;  ///< [out_features, r] fp32
  double scale = 1.0;
  double dropout = 0.0;

  /// PEFT's initialisation of an [in_features → out_features] pair with `o`'s r, alpha, dropout
  /// and use_rslora (target_modules and seed are the caller's: `gen` draws A), deterministic for
  /// `gen`. Throws qlora::Error when r <= 0, alpha <= 0 or dropout outside [0, 1).
  static LoraAdapter create(int64_t in_features, int64_t out_features, const LoraOptions& o, at::Generator gen,
                            torch::Device device);

  int64_t r() const { return A.size(0); }
  /// s·B·A·dropout(x): x [..., in] → [..., out] in x's dtype. Dropout only when `train`.
  torch::Tensor delta(const torch::Tensor& x, bool train) const;
};

/// Whether the HF module path `module` (e.g. "model.layers.3.self_attn.q_proj") is targeted by
/// `targets` (PEFT semantics: a target matches the last path component, or the whole path, or a
/// path suffix after a '.'), or by "all-linear" (the seven projections).
bool lora_targets_module(const std::string& module, const std::vector<std::string>& targets);

}  // namespace qlora
