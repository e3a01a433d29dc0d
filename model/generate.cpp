#include "model/generate.h"

#include <algorithm>

#include "common/error.h"

namespace qlora {

void check_generate_options(const GenerateOptions& opts) {
  QLORA_CHECK(opts.max_new_tokens >= 1, "generate: --max-new-tokens must be >= 1, got ", opts.max_new_tokens);
  QLORA_CHECK(opts.temperature >= 0, "generate: --temperature must be >= 0, got ", opts.temperature);
  QLORA_CHECK(opts.top_p > 0 && opts.top_p <= 1, "generate: --top-p must be in (0, 1], got ", opts.top_p);
}

std::vector<int64_t> generate_tokens(const LlamaModel& model, const std::vector<int64_t>& prompt,
                                     const GenerateOptions& opts) {
  QLORA_CHECK(!prompt.empty(), "generate: the prompt has no tokens");
  check_generate_options(opts);
  torch::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(opts.seed);
  KVCache cache;
  ForwardInputs in;
  in.input_ids = torch::tensor(prompt, torch::kLong).unsqueeze(0);
  std::vector<int64_t> out;
  for (int64_t step = 0; step < opts.max_new_tokens; ++step) {
    torch::Tensor logits = model.forward(in, &cache).index({0, -1}).to(torch::kCPU, torch::kFloat32);
    int64_t next;
    if (opts.temperature == 0) {
      next = logits.argmax().item<int64_t>();
    } else {
      torch::Tensor probs = torch::softmax(logits / opts.temperature, -1);
      if (opts.top_p < 1) {
        auto [sorted, idx] = probs.sort(/*dim=*/-1, /*descending=*/true);
        torch::Tensor cum = sorted.cumsum(-1);
        // keep the smallest prefix whose mass reaches top_p (the first token always stays)
        torch::Tensor drop = (cum - sorted) >= opts.top_p;
        sorted.masked_fill_(drop, 0);
        probs = torch::zeros_like(probs).scatter(-1, idx, sorted);
      }
      next = at::multinomial(probs, 1, false, gen).item<int64_t>();
    }
    out.push_back(next);
    if (std::find(opts.eos_token_ids.begin(), opts.eos_token_ids.end(), next) != opts.eos_token_ids.end()) break;
    in.input_ids = torch::tensor({next}, torch::kLong).view({1, 1});
  }
  return out;
}

}  // namespace qlora
