// qlora-cpp: a data::Batch (torch-free, int32 arrays) as model inputs, and the per-token loss.
#pragma once
#include <torch/torch.h>

#include "data/batch.h"
#include "model/model.h"

namespace qlora {

/// Model inputs for `b` on `device`: input_ids/position_ids long [B, T]; attention_mask long
/// [B, T]; segment_ids only when some row packs more than one example (block-diagonal mask).
ForwardInputs batch_inputs(const data::Batch& b, const torch::Device& device);

/// Labels of `b` as long [B, T] (data::kIgnoreIndex = ignored), not shifted.
torch::Tensor batch_labels(const data::Batch& b, const torch::Device& device);

/// Counts the next-token targets of a batch (next_token_targets in trainer/loss.h, with the
/// batch's segment_ids always applied): the normaliser of the loss over an accumulated batch.
int64_t count_targets(const data::Batch& b);

/// Next-token cross-entropy per position, in fp32: loss[b, t] = CE(logits[b, t], labels[b, t+1])
/// for t < T−1, 0 where next_token_targets (trainer/loss.h) does not count the target. logits [B, T, V] any float dtype; labels long [B, T];
/// segment_ids long [B, T] or undefined. Returns {loss [B, T−1] fp32, counted [B, T−1] bool}.
std::pair<torch::Tensor, torch::Tensor> token_losses(const torch::Tensor& logits, const torch::Tensor& labels,
                                                     const torch::Tensor& segment_ids);

}  // namespace qlora
