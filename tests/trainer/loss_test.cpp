// Chunked cross-entropy: value and gradient equal the unchunked autograd reference; schedules
// equal transformers' formulas at hand-computed points and its get_scheduler at every step
// (fixture trainer/schedule_refs.json from tests/fixtures/make_trainer_refs.py).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "common/files.h"
#include "test_util.h"

#include "trainer/loss.h"
#include "trainer/schedule.h"

namespace qlora {
namespace {

// Reference: full logits, fp32 CE summed, gradient by autograd.
std::pair<torch::Tensor, torch::Tensor> reference(const torch::Tensor& h, const torch::Tensor& w, const torch::Tensor& t) {
  torch::Tensor x = h.detach().clone().requires_grad_(true);
  torch::Tensor loss = torch::nn::functional::cross_entropy(
      torch::nn::functional::linear(x, w).to(torch::kFloat32), t,
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
  loss.backward();
  return {loss.detach(), x.grad()};
}

class ChunkedCE : public ::testing::TestWithParam<int64_t> {};

// fp32: the chunked loop sums per-chunk partial sums in another order than one full reduction,
// and softmax − onehot is formed explicitly; both differ from autograd's by float rounding only
// (≈1e-7 relative per element), so 1e-5 relative on the sum and 1e-6 absolute on gradients.
TEST_P(ChunkedCE, MatchesFullCrossEntropyAndItsGradient) {
  torch::manual_seed(0);
  const int64_t N = 37, H = 16, V = 101;
  torch::Tensor h = torch::randn({N, H}), w = torch::randn({V, H}) * 0.3, t = torch::randint(0, V, {N});
  auto [ref_loss, ref_grad] = reference(h, w, t);
  torch::Tensor x = h.clone().requires_grad_(true);
  torch::Tensor loss = chunked_cross_entropy_sum(x, w, t, GetParam());
  EXPECT_NEAR(loss.item<double>(), ref_loss.item<double>(), 1e-5 * std::abs(ref_loss.item<double>()));
  (loss * 0.5).backward();  // upstream gradient is applied
  EXPECT_LE((x.grad() - 0.5 * ref_grad).abs().max().item<double>(), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Chunks, ChunkedCE, ::testing::Values(1, 7, 37, 1000));

TEST(ChunkedCE, GradcheckInDouble) {
  torch::manual_seed(1);
  torch::Tensor h = torch::randn({5, 4}, torch::kDouble).requires_grad_(true);
  torch::Tensor w = torch::randn({9, 4}, torch::kDouble), t = torch::randint(0, 9, {5});
  // central finite differences on the fp64 loss (fp64 stays fp64 inside): error O(eps²) ≈ 1e-12
  torch::Tensor loss = chunked_cross_entropy_sum(h, w, t, 2);
  loss.backward();
  torch::Tensor g = h.grad().clone();
  const double eps = 1e-6;
  for (int64_t i = 0; i < 5; ++i)
    for (int64_t j = 0; j < 4; ++j) {
      torch::NoGradGuard ng;
      torch::Tensor hp = h.detach().clone(), hm = h.detach().clone();
      hp[i][j] += eps;
      hm[i][j] -= eps;
      const double fd = (chunked_cross_entropy_sum(hp, w, t, 2).item<double>() -
                         chunked_cross_entropy_sum(hm, w, t, 2).item<double>()) / (2 * eps);
      EXPECT_NEAR(g[i][j].item<double>(), fd, 1e-7) << i << "," << j;
    }
}

TEST(NextTokenRows, ShiftsMasksAndRespectsSegments) {
  torch::Tensor hidden = torch::arange(2 * 4).to(torch::kFloat).view({2, 4, 1});
  torch::Tensor labels = torch::tensor({{-100, 5, 6, 7}, {-100, -100, 9, -100}});
  torch::Tensor seg = torch::tensor({{1, 1, 2, 2}, {1, 1, 1, 0}});
  auto [h, t] = next_token_rows(hidden, labels, seg);
  // row 0: pos 0→5 (same seg), pos 1→6 crosses 1→2 (dropped), pos 2→7; row 1: pos 1→9
  EXPECT_TRUE(torch::equal(t, torch::tensor({5, 7, 9})));
  EXPECT_TRUE(torch::equal(h.squeeze(-1), torch::tensor({0.f, 2.f, 5.f})));
}

TEST(Schedule, MatchesTransformersFormulas) {
  EXPECT_DOUBLE_EQ(lr_at(LrScheduler::kCosine, 1.0, 0, 10, 110), 0.0);
  EXPECT_DOUBLE_EQ(lr_at(LrScheduler::kCosine, 1.0, 5, 10, 110), 0.5);
  EXPECT_DOUBLE_EQ(lr_at(LrScheduler::kCosine, 1.0, 10, 10, 110), 1.0);
  EXPECT_NEAR(lr_at(LrScheduler::kCosine, 1.0, 60, 10, 110), 0.5, 1e-12);
  EXPECT_NEAR(lr_at(LrScheduler::kCosine, 1.0, 110, 10, 110), 0.0, 1e-12);
  EXPECT_DOUBLE_EQ(lr_at(LrScheduler::kLinear, 2.0, 60, 10, 110), 1.0);
  EXPECT_DOUBLE_EQ(lr_at(LrScheduler::kLinear, 2.0, 200, 10, 110), 0.0);
  EXPECT_DOUBLE_EQ(lr_at(LrScheduler::kConstant, 2.0, 3, 0, 110), 2.0);
}

// Every schedule at every step 0..total+1 of 7 (total, warmup, lr) cases equals the learning rate
// of transformers' get_scheduler(name, ...) with its defaults, `constant` too: it ignores the warmup,
// as HF's get_constant_schedule (a trial: ours warmed up, as constant_with_warmup).
TEST(Schedule, EqualsTransformersGetScheduler) {
  QLORA_REQUIRE_FIXTURE(refs, "trainer/schedule_refs.json");
  const nlohmann::json j = nlohmann::json::parse(read_file(refs.string()));
  const std::map<std::string, LrScheduler> ours = {{"constant_with_warmup", LrScheduler::kConstantWithWarmup},
                                                   {"linear", LrScheduler::kLinear},
                                                   {"cosine", LrScheduler::kCosine},
                                                   {"cosine_with_restarts", LrScheduler::kCosineWithRestarts},
                                                   {"polynomial", LrScheduler::kPolynomial}};
  std::set<std::string> seen;
  int compared = 0;
  for (const nlohmann::json& c : j.at("cases")) {
    const std::string name = c.at("scheduler");
    const int64_t total = c.at("total"), warmup = c.at("warmup");
    const double base = c.at("base_lr");
    std::vector<LrScheduler> mine;
    if (name == "constant") mine.push_back(LrScheduler::kConstant);
    if (ours.count(name)) mine.push_back(ours.at(name));
    for (const LrScheduler s : mine) {
      seen.insert(to_string(s));
      const auto& lrs = c.at("lr");
      for (size_t step = 0; step < lrs.size(); ++step) {
        const double want = lrs[step].get<double>();
        EXPECT_NEAR(lr_at(s, base, static_cast<int64_t>(step), warmup, total), want, 1e-14 * base)
            << to_string(s) << " vs transformers " << name << ", total " << total << ", warmup " << warmup
            << ", step " << step;
        ++compared;
      }
    }
  }
  EXPECT_EQ(seen.size(), 6u) << "every lr_scheduler compared";
  EXPECT_GT(compared, 300);
}

// The warmup of a run is transformers' get_warmup_steps: ceil(ratio x steps) in the same double
// product (0.07 x 100 gives 8, as HF), warmup_steps as set, none for `constant` (HF's constant).
TEST(Schedule, WarmupStepsAreTransformersGetWarmupSteps) {
  QLORA_REQUIRE_FIXTURE(refs, "trainer/schedule_refs.json");
  const nlohmann::json j = nlohmann::json::parse(read_file(refs.string()));
  ASSERT_GE(j.at("warmup").size(), 50u);
  for (const nlohmann::json& c : j.at("warmup")) {
    TrainingConfig t;
    t.lr_scheduler = LrScheduler::kCosine;
    t.warmup_steps = 0;
    t.warmup_ratio = c.at("ratio").get<double>();
    const int64_t total = c.at("total");
    EXPECT_EQ(warmup_steps_for(t, total), c.at("warmup").get<int64_t>())
        << "warmup_ratio " << t.warmup_ratio << ", " << total << " steps";
    t.lr_scheduler = LrScheduler::kConstant;
    EXPECT_EQ(warmup_steps_for(t, total), 0) << "constant takes no warmup";
  }
  TrainingConfig t;
  t.lr_scheduler = LrScheduler::kLinear;
  t.warmup_steps = 7;
  EXPECT_EQ(warmup_steps_for(t, 3), 7) << "warmup_steps as set, even past the run (warned of)";
  t.lr_scheduler = LrScheduler::kConstant;
  EXPECT_EQ(warmup_steps_for(t, 3), 0);
}

}  // namespace
}  // namespace qlora
