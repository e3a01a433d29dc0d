#include "trainer/batch_tensors.h"

#include "trainer/loss.h"

namespace qlora {
namespace {
torch::Tensor as_tensor(const std::vector<int32_t>& v, const data::Batch& b, const torch::Device& d) {
  return torch::from_blob(const_cast<int32_t*>(v.data()), {b.batch_size, b.seq_len}, torch::kInt)
      .to(d, torch::kLong, /*non_blocking=*/false, /*copy=*/true);
}
}  // namespace

ForwardInputs batch_inputs(const data::Batch& b, const torch::Device& device) {
  ForwardInputs in;
  in.input_ids = as_tensor(b.input_ids, b, device);
  in.attention_mask = as_tensor(b.attention_mask, b, device);
  in.position_ids = as_tensor(b.position_ids, b, device);
  torch::Tensor seg = as_tensor(b.segment_ids, b, device);
  if (seg.max().item<int64_t>() > 1) in.segment_ids = seg;
  return in;
}

torch::Tensor batch_labels(const data::Batch& b, const torch::Device& device) {
  return as_tensor(b.labels, b, device);
}

int64_t count_targets(const data::Batch& b) {
  // Every row's segment ids (not only packed batches' as in batch_inputs), as it always counted.
  return next_token_targets(batch_labels(b, torch::kCPU), as_tensor(b.segment_ids, b, torch::kCPU))
      .second.sum()
      .item<int64_t>();
}

std::pair<torch::Tensor, torch::Tensor> token_losses(const torch::Tensor& logits, const torch::Tensor& labels,
                                                     const torch::Tensor& segment_ids) {
  TORCH_CHECK(logits.dim() == 3 && labels.dim() == 2 && logits.size(0) == labels.size(0) &&
                  logits.size(1) == labels.size(1),
              "token_losses: expected logits [B, T, V] and labels [B, T], got ", logits.sizes(), " and ",
              labels.sizes());
  using torch::indexing::Slice;
  torch::Tensor lg = logits.index({Slice(), Slice(0, -1)}).to(torch::kFloat32);
  auto [tgt, counted] = next_token_targets(labels, segment_ids);
  torch::Tensor safe = tgt.masked_fill(counted.logical_not(), 0);
  torch::Tensor nll = -torch::log_softmax(lg, -1).gather(-1, safe.unsqueeze(-1)).squeeze(-1);
  return {nll.masked_fill(counted.logical_not(), 0), counted};
}

}  // namespace qlora
