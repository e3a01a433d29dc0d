// Spot-safe runs: a run stopped by SIGTERM at step k and resumed ends with an adapter
// byte-identical to the uninterrupted run's and the same loss / lr at every step; corrupt newest
// checkpoints are skipped; changed run-meaning settings are refused. Tiny model, CPU, LoRA dropout
// on and gradient checkpointing on (so RNG restore is exercised).
#include <gtest/gtest.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sys/wait.h>

#include "common/error.h"
#include "common/files.h"
#include "test_util.h"
#include "tiny_run.h"
#include "trainer/checkpoint.h"

namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;

using Out = qlora::test::CommandResult;
Out sh(const std::string& cmd) { return qlora::test::run_command(cmd); }

class Resume : public ::testing::Test {
 protected:
  static fs::path root;
  static qlora::test::SuiteSetup setup;
  static void SetUpTestSuite() {
    root = qlora::test::fresh_temp_dir("resume");
    Out o = qlora::test::make_tiny_run(root, 0);
    setup.expect(o.status == 0, "qlora init-model for the tiny run failed", o.out);
  }
  void SetUp() override { QLORA_CHECK_SUITE_SETUP(setup); }
  static void TearDownTestSuite() { fs::remove_all(root); }

  static Out train(const fs::path& out, const std::string& extra = "", const std::string& env = "") {
    return sh(env + " " + QLORA_BIN + " train " + (root / "run.yaml").string() + " --set output_dir=" + out.string() +
              " " + extra);
  }
  // step → (loss, lr) from metrics.jsonl
  static std::map<int64_t, std::pair<double, double>> metrics(const fs::path& out) {
    std::map<int64_t, std::pair<double, double>> m;
    std::ifstream in(out / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      json j = json::parse(line);
      m[j["step"].get<int64_t>()] = {j["loss"].get<double>(), j["lr"].get<double>()};
    }
    return m;
  }
};
fs::path Resume::root;
qlora::test::SuiteSetup Resume::setup;

struct Stop {
  const char* name;
  const char* fault;  // STEP:MICRO
};

TEST_F(Resume, InterruptedRunsEqualTheUninterruptedRun) {
  const fs::path ref = root / "ref";
  Out o = train(ref);
  ASSERT_EQ(o.status, 0) << o.out;
  const std::string ref_adapter = qlora::read_file((ref / "adapter_model.safetensors").string());
  const auto ref_metrics = metrics(ref);
  ASSERT_EQ(ref_metrics.size(), 18u);
  for (const Stop& s : {Stop{"epoch0", "2:0"}, Stop{"epoch1", "9:0"}, Stop{"epoch_boundary", "6:1"},
                        Stop{"mid_accumulation", "4:1"}}) {
    const fs::path out = root / s.name;
    o = train(out, "", std::string("QLORA_FAULT_SIGTERM_AT=") + s.fault);
    ASSERT_EQ(o.status, 75) << s.name << ": " << o.out;
    EXPECT_NE(o.out.find("interrupted: stopped at step"), std::string::npos) << o.out;
    o = train(out);
    ASSERT_EQ(o.status, 0) << s.name << ": " << o.out;
    EXPECT_NE(o.out.find("resume: from"), std::string::npos) << o.out;
    EXPECT_EQ(qlora::read_file((out / "adapter_model.safetensors").string()), ref_adapter) << s.name;
    const auto m = metrics(out);
    ASSERT_EQ(m.size(), ref_metrics.size()) << s.name;
    for (const auto& [step, v] : ref_metrics) {
      EXPECT_EQ(m.at(step).first, v.first) << s.name << " loss at step " << step;
      EXPECT_EQ(m.at(step).second, v.second) << s.name << " lr at step " << step;
    }
  }
}

TEST_F(Resume, CorruptNewestIsSkippedAndChangedSettingsRefused) {
  const fs::path out = root / "corrupt";
  ASSERT_EQ(train(out, "", "QLORA_FAULT_SIGTERM_AT=3:0").status, 75);
  ASSERT_EQ(train(out, "--set checkpoint.save_steps=1", "QLORA_FAULT_SIGTERM_AT=5:0").status, 75);
  auto ckpts = qlora::list_checkpoints((out / "checkpoints").string());
  ASSERT_EQ(ckpts.size(), 2u);  // keep_last: 2
  EXPECT_EQ(fs::path(ckpts[0]).filename(), "checkpoint-5");
  // corrupt the newest: its manifest no longer verifies
  fs::resize_file(fs::path(ckpts[0]) / "optimizer.safetensors", 10);
  EXPECT_NE(qlora::verify_checkpoint(ckpts[0]), "");
  // a changed LoRA shape is refused with the differences listed, and nothing is overwritten
  Out o = train(out, "--set lora.r=8");
  EXPECT_EQ(o.status, 1) << o.out;
  EXPECT_NE(o.out.find("lora.r: 4 -> 8"), std::string::npos) << o.out;
  o = train(out);
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_NE(o.out.find("skipping " + ckpts[0]), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("at step 4"), std::string::npos) << o.out;
}

TEST(CheckpointFiles, IncompleteTemporaryDirectoriesAreIgnored) {
  fs::path d = fs::temp_directory_path() / ("qlora_ckpt_" + std::to_string(::getpid()));
  fs::create_directories(d / ".tmp-checkpoint-9-1");
  fs::create_directories(d / "checkpoint-7");
  EXPECT_EQ(qlora::list_checkpoints(d.string()).size(), 1u);
  EXPECT_EQ(qlora::verify_checkpoint((d / "checkpoint-7").string()), "no manifest.json (incomplete)");
  EXPECT_EQ(qlora::newest_valid_checkpoint(d.string(), nullptr), "");
  fs::remove_all(d);
}

}  // namespace
