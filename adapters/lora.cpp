#include "adapters/lora.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace qlora {

double lora_scale(int64_t r, double alpha, bool use_rslora) {
  return use_rslora ? alpha / std::sqrt(static_cast<double>(r)) : alpha / static_cast<double>(r);
}

LoraAdapter LoraAdapter::create(int64_t in_features, int64_t out_features, const LoraOptions& o, at::Generator gen,
                                torch::Device device) {
  const int64_t r = o.r;
  const double alpha = o.alpha, dropout = o.dropout;
  QLORA_CHECK(r > 0, "lora.r must be > 0, got ", r);
  QLORA_CHECK(alpha > 0, "lora.alpha must be > 0, got ", alpha);
  QLORA_CHECK(dropout >= 0 && dropout < 1, "lora.dropout must be in [0, 1), got ", dropout);
  LoraAdapter a;
  // kaiming_uniform_(a=√5): gain = √(2 / (1 + 5)), bound = gain · √(3 / fan_in) = 1 / √fan_in.
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
  a.A = at::empty({r, in_features}, torch::kFloat32).uniform_(-bound, bound, gen).to(device).requires_grad_(true);
  a.B = torch::zeros({out_features, r}, torch::TensorOptions().dtype(torch::kFloat32).device(device))
            .requires_grad_(true);
  a.scale = o.scale();
  a.dropout = dropout;
  return a;
}

torch::Tensor LoraAdapter::delta(const torch::Tensor& x, bool train) const {
  torch::Tensor h = (train && dropout > 0) ? torch::dropout(x, dropout, /*train=*/true) : x;
  h = torch::nn::functional::linear(h, A.to(x.scalar_type()));
  return torch::nn::functional::linear(h, B.to(x.scalar_type())) * scale;
}

bool lora_targets_module(const std::string& module, const std::vector<std::string>& targets) {
  const std::string last = module.substr(module.rfind('.') + 1);
  for (const std::string& t : expand_target_modules(targets)) {
    if (t == module || t == last) return true;
    if (module.size() > t.size() && module.compare(module.size() - t.size(), t.size(), t) == 0 &&
        module[module.size() - t.size() - 1] == '.')
      return true;
  }
  return false;
}

}  // namespace qlora
