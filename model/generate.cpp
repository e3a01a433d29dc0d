#include "model/generate.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/files.h"

namespace qlora {

void check_generate_options(const GenerateOptions& opts) {
  QLORA_CHECK(opts.max_new_tokens >= 1, "generate: --max-new-tokens must be >= 1, got ", opts.max_new_tokens);
  QLORA_CHECK(opts.temperature >= 0, "generate: --temperature must be >= 0, got ", opts.temperature);
  QLORA_CHECK(opts.top_k >= 0, "generate: --top-k must be >= 0 (0 = off), got ", opts.top_k);
  QLORA_CHECK(opts.top_p > 0 && opts.top_p <= 1, "generate: --top-p must be in (0, 1], got ", opts.top_p);
  QLORA_CHECK(opts.repetition_penalty > 0, "generate: --repetition-penalty must be > 0 (1 = off), got ",
              opts.repetition_penalty);
  for (const std::string& s : opts.stop_strings) QLORA_CHECK(!s.empty(), "generate: --stop must not be empty");
}

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::eos: return "eos";
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
  }
  return "length";
}

// The ops below are transformers' own, on the same [1, vocab] fp32 shapes, so that equal logits
// give bit-equal scores and probabilities, and at::multinomial (its one-sample path: argmax of
// probs / Exponential(1) draws from the generator) the same id as transformers' torch.multinomial.
torch::Tensor apply_repetition_penalty(const torch::Tensor& scores, const std::vector<int64_t>& seen, double penalty) {
  if (penalty == 1.0 || seen.empty()) return scores;
  const int64_t vocab = scores.size(-1);
  // ids past the vocab go to a padding column that is dropped afterwards (as transformers does)
  torch::Tensor ids = torch::tensor(seen, torch::kLong).unsqueeze(0).clamp_max(vocab);
  torch::Tensor padded = torch::nn::functional::pad(scores, torch::nn::functional::PadFuncOptions({0, 1}));
  torch::Tensor s = padded.gather(1, ids);
  s = torch::where(s < 0, s * penalty, s / penalty);
  return padded.scatter(1, ids, s).slice(-1, 0, vocab);
}

torch::Tensor sample_warpers(torch::Tensor scores, double temperature, int64_t top_k, double top_p) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  if (temperature != 1.0) scores = scores / temperature;  // TemperatureLogitsWarper
  if (top_k > 0) {                                         // TopKLogitsWarper
    const int64_t k = std::min(top_k, scores.size(-1));
    torch::Tensor kth = std::get<0>(torch::topk(scores, k)).select(-1, k - 1).unsqueeze(-1);
    scores = scores.masked_fill(scores < kth, neg_inf);
  }
  if (top_p < 1.0) {  // TopPLogitsWarper (min_tokens_to_keep 1)
    auto [sorted, idx] = torch::sort(scores, /*dim=*/-1, /*descending=*/false);
    torch::Tensor cum = sorted.softmax(-1).cumsum(-1);
    torch::Tensor remove = cum <= (1 - top_p);
    remove.index_put_({torch::indexing::Ellipsis, torch::indexing::Slice(-1, torch::indexing::None)}, false);
    scores = scores.masked_fill(remove.scatter(1, idx, remove), neg_inf);
  }
  return scores;
}

Generation generate(const LlamaModel& model, const std::vector<int64_t>& prompt, const GenerateOptions& opts,
                    const DecodeFn& decode) {
  QLORA_CHECK(!prompt.empty(), "generate: the prompt has no tokens");
  check_generate_options(opts);
  QLORA_CHECK(opts.stop_strings.empty() || decode, "generate: stop strings need a decoder");
  torch::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(opts.seed);  // = torch.manual_seed(seed)'s state
  KVCache cache;
  ForwardInputs in;
  in.input_ids = torch::tensor(prompt, torch::kLong).unsqueeze(0);
  std::vector<int64_t> seen = prompt;  // what the repetition penalty reads: prompt + new ids
  Generation g;
  for (int64_t step = 0; step < opts.max_new_tokens; ++step) {
    torch::Tensor scores = model.forward(in, &cache).select(1, -1).to(torch::kCPU, torch::kFloat32);  // [1, vocab]
    scores = apply_repetition_penalty(scores, seen, opts.repetition_penalty);
    int64_t next;
    if (opts.temperature == 0) {
      next = scores.argmax(-1).item<int64_t>();
    } else {
      torch::Tensor probs = sample_warpers(scores, opts.temperature, opts.top_k, opts.top_p).softmax(-1);
      next = at::multinomial(probs, 1, /*replacement=*/false, gen).item<int64_t>();
    }
    g.ids.push_back(next);
    seen.push_back(next);
    if (std::find(opts.eos_token_ids.begin(), opts.eos_token_ids.end(), next) != opts.eos_token_ids.end()) {
      g.finish_reason = FinishReason::eos;
      return g;
    }
    if (!opts.stop_strings.empty()) {
      const std::string text = decode(g.ids);
      for (const std::string& s : opts.stop_strings)
        if (text.find(s) != std::string::npos) {
          g.finish_reason = FinishReason::stop;
          return g;
        }
    }
    in.input_ids = torch::tensor({next}, torch::kLong).view({1, 1});
  }
  g.finish_reason = FinishReason::length;
  return g;
}

std::vector<int64_t> generate_tokens(const LlamaModel& model, const std::vector<int64_t>& prompt,
                                     const GenerateOptions& opts) {
  return generate(model, prompt, opts).ids;
}

std::optional<int64_t> generation_config_top_k(const std::string& model_dir) {
  const std::string path = (std::filesystem::path(model_dir) / "generation_config.json").string();
  if (!std::filesystem::exists(path)) return std::nullopt;
  const nlohmann::json j = nlohmann::json::parse(read_file(path), nullptr, /*allow_exceptions=*/false);
  QLORA_CHECK(!j.is_discarded() && j.is_object(), path, ":1: not a JSON object");
  if (!j.contains("top_k") || j["top_k"].is_null()) return std::nullopt;
  const nlohmann::json& v = j["top_k"];
  QLORA_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0, path, ": top_k: expected an integer >= 0, got ", v.dump());
  return v.get<int64_t>();
}

}  // namespace qlora
