// qlora-cpp: next-token cross-entropy over the vocabulary in chunks of tokens, so the fp32 logits
// of a whole batch ([tokens, vocab], 4 bytes each) never exist at once: each chunk's logits live
// only inside forward, which also computes that chunk's gradient wrt the hidden states
// (the lm_head is frozen), the approach of fused linear-cross-entropy kernels (Liger Kernel's
// FusedLinearCrossEntropy). Peak extra memory: one chunk of logits + the [tokens, hidden] gradient.
#pragma once
#include <torch/torch.h>

namespace qlora {

/// Sum over rows of CE(hidden[i] · lm_headᵀ, targets[i]), logits formed in hidden's dtype and
/// upcast to fp32 for the softmax (as transformers' ForCausalLMLoss). hidden [N, H] (float, may
/// require grad); lm_head [V, H] same dtype, frozen; targets long [N] in [0, V). chunk_tokens > 0.
/// Returns a fp32 scalar (fp64 for fp64 inputs); backward gives d/d hidden only. Throws c10::Error on shape mismatch.
torch::Tensor chunked_cross_entropy_sum(const torch::Tensor& hidden, const torch::Tensor& lm_head,
                                        const torch::Tensor& targets, int64_t chunk_tokens = 1024);

/// The next-token target rule, the one place it is written (HF's shifted causal-LM loss,
/// transformers ForCausalLMLoss): position t of a row predicts labels[t+1], and counts unless that
/// label is data::kIgnoreIndex (-100) or t and t+1 lie in different packed segments
/// (segment_ids[t] ≠ segment_ids[t+1]; no segment check when segment_ids is undefined).
/// labels long [B, T], segment_ids [B, T] or undefined, any device. Returns {targets long
/// [B, T−1] = labels[:, 1:], counted bool [B, T−1]}. Used by next_token_rows, token_losses and
/// count_targets.
std::pair<torch::Tensor, torch::Tensor> next_token_targets(const torch::Tensor& labels,
                                                           const torch::Tensor& segment_ids);

/// Selects the rows that carry a next-token target (next_token_targets): from hidden [B, T, H],
/// labels long [B, T] and segment_ids [B, T] or undefined returns {hidden rows [N, H], targets
/// [N]}, N = number of counted targets.
std::pair<torch::Tensor, torch::Tensor> next_token_rows(const torch::Tensor& hidden, const torch::Tensor& labels,
                                                        const torch::Tensor& segment_ids);

}  // namespace qlora
