// The tiny training run shared by the checkpoint tests: 24 alpaca examples (micro_batch 2 → 12
// batches/epoch, accumulation 2 → 6 steps/epoch, 3 epochs = 18 steps), a `tiny` NF4 model with a
// tokenizer trained on them, LoRA dropout 0.1 and gradient checkpointing on, resume: auto.
#pragma once
#include <gtest/gtest.h>

#include <exception>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "common/files.h"
#include "test_util.h"

namespace qlora::test {

/// Writes ROOT/{corpus.txt, data.json, model/, run.yaml}; `save_steps` goes into the checkpoint
/// section. Returns the result of `qlora init-model` (status 0 on success).
inline CommandResult make_tiny_run(const std::filesystem::path& root, int save_steps) {
  nlohmann::json data = nlohmann::json::array();
  std::ofstream corpus(root / "corpus.txt");
  for (int i = 0; i < 24; ++i) {
    const std::string q = "ticket " + std::to_string(i) + " printer jam in room " + std::to_string(i % 5);
    const std::string a = i % 2 ? "hardware, urgent" : "hardware, low";
    data.push_back({{"instruction", q}, {"output", a}});
    corpus << q << "\n" << a << "\n";
  }
  corpus.close();
  std::ofstream(root / "data.json") << data.dump();
  CommandResult o = run_command(::qlora::test::qlora_bin() + " init-model --preset tiny --out " + (root / "model").string() +
                                " --train-tokenizer " + (root / "corpus.txt").string() + " --vocab-size 400 --seed 3");
  std::ofstream(root / "run.yaml") << "output_dir: " << (root / "unused").string() << "\n"
                                   << "model: {path: " << (root / "model").string() << ", dtype: fp32}\n"
                                   << "quantization: {method: nf4, blocksize: 64}\n"
                                   << "lora: {r: 4, alpha: 8, dropout: 0.1, target_modules: all-linear}\n"
                                   << "data: {train: " << (root / "data.json").string()
                                   << ", template: alpaca, sequence_len: 512, val_set_size: 0}\n"
                                   << "training: {micro_batch_size: 2, gradient_accumulation_steps: 2, num_epochs: 3,"
                                   << " learning_rate: 1.0e-3, warmup_steps: 2, lr_scheduler: cosine,"
                                   << " gradient_checkpointing: true, seed: 5}\n"
                                   << "checkpoint: {save_steps: " << save_steps
                                   << ", save_minutes: 0, keep_last: 2, resume: auto}\n";
  return o;
}

/// A GoogleTest fixture (CRTP) whose suite shares one tiny run: made once by SetUpTestSuite in a
/// fresh temp dir named `Derived::kTempName` with `save_steps = Derived::kSaveSteps`, then
/// `Derived::prepare(root)` (optional; may throw) adds what the suite needs; removed after the
/// suite. A failed setup fails every test of the suite (SuiteSetup), never skips it.
template <typename Derived>
class TinyRunSuite : public ::testing::Test {
 protected:
  static inline std::filesystem::path root;
  static inline SuiteSetup setup;
  static void prepare(const std::filesystem::path&) {}
  static void SetUpTestSuite() {
    try {
      root = fresh_temp_dir(Derived::kTempName);
      const CommandResult o = make_tiny_run(root, Derived::kSaveSteps);
      if (!setup.expect(o.status == 0, "qlora init-model for the tiny run failed", o.out)) return;
      Derived::prepare(root);
    } catch (const std::exception& e) {
      setup.expect(false, std::string("exception: ") + e.what());
    }
  }
  static void TearDownTestSuite() { qlora::remove_tree(root); }
  void SetUp() override { QLORA_CHECK_SUITE_SETUP(setup); }
};

}  // namespace qlora::test
