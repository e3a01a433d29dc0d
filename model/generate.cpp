#include "model/generate.h"

#include <algorithm>
#include <limits>

#include "common/error.h"

namespace qlora {

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

namespace {

// transformers' StopStringCriteria on text: does a stop string end in the text of seq's last id?
// The last `window` ids are decoded with and without that id; a stop string must occur in the
// first text ending past the part it shares with the second (the new id's text). Every ordinary
// token yields at least one byte, so `window` ids (the longest string's bytes + 8) reach back past
// any occurrence that ends in the new id's text; the decode of a window's first id (a dropped
// leading space, a cut UTF-8 sequence) lies further back than any such occurrence begins.
bool completes_stop_string(const std::vector<int64_t>& seq, const std::vector<std::string>& stops, size_t window,
                           const DecodeFn& decode) {
  const size_t n = std::min(window, seq.size());
  const std::vector<int64_t> tail(seq.end() - static_cast<std::ptrdiff_t>(n), seq.end());
  const std::string text = decode(tail);
  const std::string before = decode(std::vector<int64_t>(tail.begin(), tail.end() - 1));
  size_t shared = 0;
  while (shared < text.size() && shared < before.size() && text[shared] == before[shared]) ++shared;
  for (const std::string& s : stops) {
    // the first occurrence that ends past `shared`, i.e. starts at or after shared - |s| + 1
    const size_t from = shared >= s.size() ? shared - s.size() + 1 : 0;
    if (text.find(s, from) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

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
  std::vector<int64_t> seen = prompt;  // what the repetition penalty and stop strings read: prompt + new ids
  size_t stop_window = 0;              // ids decoded for stop strings: the longest one's bytes + 8
  for (const std::string& s : opts.stop_strings) stop_window = std::max(stop_window, s.size() + 8);
  Generation g;
  for (int64_t step = 0; step < opts.max_new_tokens; ++step) {
    torch::Tensor scores = model.forward(in, &cache).select(1, -1).to(torch::kCPU, torch::kFloat32);  // [1, vocab]
    scores = apply_repetition_penalty(scores, seen, opts.repetition_penalty);
    int64_t next;
    if (!opts.do_sample) {
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
    if (!opts.stop_strings.empty() && completes_stop_string(seen, opts.stop_strings, stop_window, decode)) {
      g.finish_reason = FinishReason::stop;
      return g;
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

}  // namespace qlora
