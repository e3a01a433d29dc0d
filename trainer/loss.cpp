#include "trainer/loss.h"

#include "data/template.h"

namespace qlora {
namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using torch::indexing::Slice;

struct ChunkedCE : public torch::autograd::Function<ChunkedCE> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& hidden, const torch::Tensor& lm_head,
                               const torch::Tensor& targets, int64_t chunk) {
    torch::NoGradGuard ng;
    const int64_t N = hidden.size(0);
    // fp32 softmax for 16/32-bit inputs (as transformers); double stays double (gradient checks).
    const auto acc = hidden.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat32;
    torch::Tensor total = torch::zeros({}, hidden.options().dtype(acc));
    torch::Tensor grad = hidden.requires_grad() ? torch::empty_like(hidden) : torch::Tensor();
    for (int64_t s = 0; s < N; s += chunk) {
      const int64_t e = std::min(N, s + chunk);
      torch::Tensor h = hidden.index({Slice(s, e)});
      torch::Tensor t = targets.index({Slice(s, e)});
      torch::Tensor logits = torch::nn::functional::linear(h, lm_head).to(acc);  // [c, V]
      torch::Tensor lse = torch::logsumexp(logits, -1);
      total += (lse - logits.gather(-1, t.unsqueeze(-1)).squeeze(-1)).sum();
      if (grad.defined()) {
        // d CE / d logits = softmax − onehot; d / d h = that · lm_head
        torch::Tensor g = (logits - lse.unsqueeze(-1)).exp_();
        g.scatter_add_(-1, t.unsqueeze(-1), torch::full({e - s, 1}, -1.0, g.options()));
        grad.index_put_({Slice(s, e)}, g.to(hidden.scalar_type()).matmul(lm_head));
      }
    }
    ctx->save_for_backward({grad});
    return total;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    torch::Tensor grad = ctx->get_saved_variables()[0];
    torch::Tensor gh = grad.defined() ? grad * grad_out[0].to(grad.scalar_type()) : torch::Tensor();
    return {gh, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};
}  // namespace

torch::Tensor chunked_cross_entropy_sum(const torch::Tensor& hidden, const torch::Tensor& lm_head,
                                        const torch::Tensor& targets, int64_t chunk_tokens) {
  TORCH_CHECK(hidden.dim() == 2 && lm_head.dim() == 2 && hidden.size(1) == lm_head.size(1),
              "chunked_cross_entropy_sum: expected hidden [N, H] and lm_head [V, H], got ", hidden.sizes(),
              " and ", lm_head.sizes());
  TORCH_CHECK(targets.dim() == 1 && targets.size(0) == hidden.size(0),
              "chunked_cross_entropy_sum: expected targets [", hidden.size(0), "], got ", targets.sizes());
  TORCH_CHECK(chunk_tokens > 0, "chunked_cross_entropy_sum: expected chunk_tokens > 0, got ", chunk_tokens);
  return ChunkedCE::apply(hidden, lm_head.detach(), targets.to(torch::kLong), chunk_tokens);
}

std::pair<torch::Tensor, torch::Tensor> next_token_targets(const torch::Tensor& labels,
                                                           const torch::Tensor& segment_ids) {
  torch::Tensor tgt = labels.index({Slice(), Slice(1, torch::indexing::None)});
  torch::Tensor counted = tgt != data::kIgnoreIndex;
  if (segment_ids.defined())
    counted = counted.logical_and(segment_ids.index({Slice(), Slice(0, -1)}) ==
                                  segment_ids.index({Slice(), Slice(1, torch::indexing::None)}));
  return {tgt, counted};
}

std::pair<torch::Tensor, torch::Tensor> next_token_rows(const torch::Tensor& hidden, const torch::Tensor& labels,
                                                        const torch::Tensor& segment_ids) {
  auto [tgt, counted] = next_token_targets(labels, segment_ids);
  torch::Tensor idx = counted.flatten().nonzero().squeeze(-1);
  torch::Tensor h = hidden.index({Slice(), Slice(0, -1)}).reshape({-1, hidden.size(-1)}).index_select(0, idx);
  return {h, tgt.flatten().index_select(0, idx)};
}

}  // namespace qlora
