// Spot-safe runs under hostile conditions: SIGKILL at pseudo-random moments (including while a
// checkpoint is being written), corrupted checkpoint files, a full disk while saving, changed data,
// and checkpoints that are not JSON or belong to another model. Tiny model on CPU, as in
// checkpoint_test.cpp. The hook QLORA_FAULT_SLOW_CHECKPOINT_MS (test only) widens the window
// between writing a checkpoint's files and renaming its directory into place.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <thread>

#include "common/error.h"
#include "common/files.h"
#include "test_util.h"
#include "tiny_run.h"
#include "trainer/checkpoint.h"

extern char** environ;

namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;
using Out = qlora::test::CommandResult;
Out sh(const std::string& cmd) { return qlora::test::run_command(cmd); }

using qlora::test::contains;
using qlora::test::line_with;

class CheckpointRobust : public qlora::test::TinyRunSuite<CheckpointRobust> {
 public:
  static constexpr const char* kTempName = "ckpt_robust";
  static constexpr int kSaveSteps = 1;
  /// The same examples in another file with other bytes (a changed data.train).
  static void prepare(const fs::path& dir) {
    // Other bytes (one more newline) at another path: a changed data.train (a path-only move with
    // the same content is the same run: Resume.MovedDataFileWithTheSameContentResumes).
    std::ofstream(dir / "data2.json") << qlora::read_file((dir / "data.json").string()) << "\n";
  }

 protected:
  static std::string train_cmd(const fs::path& out, const std::string& extra = "") {
    return ::qlora::test::qlora_bin() + " train " + (root / "run.yaml").string() + " --set output_dir=" + out.string() +
           " " + extra;
  }
  static Out train(const fs::path& out, const std::string& extra = "", const std::string& env = "") {
    return sh(env + " " + train_cmd(out, extra));
  }
  // A run stopped by SIGTERM after step `step` (save_steps 1, keep_last 2: checkpoints step-1 and step).
  static void stopped_run(const fs::path& out, int step) {
    Out o = train(out, "", "QLORA_FAULT_SIGTERM_AT=" + std::to_string(step) + ":0");
    ASSERT_EQ(o.status, 75) << o.out;
  }
};

// Starts `argv` with stdout and stderr into `log` and `env_extra` added to the environment.
pid_t spawn(const std::vector<std::string>& argv, const fs::path& log, const std::vector<std::string>& env_extra) {
  std::vector<char*> a;
  for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
  a.push_back(nullptr);
  std::vector<std::string> env_s(env_extra);
  for (char** e = environ; *e; ++e) env_s.emplace_back(*e);
  std::vector<char*> env;
  for (auto& s : env_s) env.push_back(s.data());
  env.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, a[0], &fa, nullptr, a.data(), env.data());
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

TEST_F(CheckpointRobust, KillNineAtRandomMomentsEndsByteIdentical) {
  constexpr int kKills = 20;
  const std::string epochs = "--set training.num_epochs=3";  // 18 steps: work for >= 20 kills
  const fs::path ref = root / "kill_ref";
  auto t0 = std::chrono::steady_clock::now();
  Out o = train(ref, epochs);
  ASSERT_EQ(o.status, 0) << o.out;
  const double ref_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string ref_adapter = qlora::read_file((ref / "adapter_model.safetensors").string());

  const fs::path out = root / "kill";
  const fs::path ck = out / "checkpoints";
  fs::create_directories(out);
  std::mt19937 gen(20261129);
  std::uniform_int_distribution<int> delay_ms(50, 1500);
  const std::vector<std::string> argv = {::qlora::test::qlora_bin(), "train", (root / "run.yaml").string(), "--set",
                                         "output_dir=" + out.string(), "--set", "training.num_epochs=3"};
  std::cout << "kill-9 harness (reference run " << std::fixed << std::setprecision(1) << ref_s << " s)\n"
            << " run  from   delay_ms  outcome     resumed_from  newest_after  mid_write\n";
  int kills = 0, mid_write = 0, runs = 0, resumes = 0;
  bool done = false;
  t0 = std::chrono::steady_clock::now();
  while (!done) {
    ASSERT_LT(runs, 6 * kKills) << "the run never completed";
    std::vector<std::string> skipped;
    const std::string expected = qlora::newest_valid_checkpoint(ck.string(), &skipped);
    const fs::path log = root / ("kill_" + std::to_string(runs) + ".log");
    const pid_t pid = spawn(argv, log, {"QLORA_FAULT_SLOW_CHECKPOINT_MS=300"});
    ASSERT_GT(pid, 0);
    // Odd kills count from the start (startup, loading, resume); even ones from this run's first
    // "step N/" line, i.e. from the start of a checkpoint write (slowed to >= 300 ms by the hook).
    int delay = 0, st = 0;
    bool reaped = false;
    std::string anchor = "-";
    const bool kill_it = kills < kKills;
    if (kill_it) {
      delay = delay_ms(gen);
      if (kills % 2 == 0) {
        anchor = "step";
        for (int i = 0; i < 12000 && !(reaped = ::waitpid(pid, &st, WNOHANG) == pid); ++i) {
          if (std::regex_search(qlora::read_file(log.string()), std::regex("step [0-9]+/"))) break;
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
      } else {
        anchor = "start";
      }
      if (!reaped) {
        std::this_thread::sleep_for(std::chrono::milliseconds(delay));
        ::kill(pid, SIGKILL);
      }
    }
    if (!reaped) {
      ASSERT_EQ(::waitpid(pid, &st, 0), pid);
    }
    std::string outcome;
    if (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) {
      outcome = "SIGKILL";
      ++kills;
    } else {
      ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << qlora::read_file(log.string());
      outcome = "completed";
      // Every completed round must equal the reference; on a fast (idle) machine a round can end
      // before enough kills landed, so the harness starts another round from scratch.
      EXPECT_EQ(qlora::read_file((out / "adapter_model.safetensors").string()), ref_adapter) << "run " << runs;
      done = kills >= kKills;
      if (!done) outcome = "completed+";
    }
    const std::string text = qlora::read_file(log.string());
    // "resume: from X" names exactly the newest checkpoint that verified before the run started.
    std::smatch m;
    std::string resumed = "-";
    if (std::regex_search(text, m, std::regex("resume: from (\\S+) at step"))) {
      ++resumes;
      resumed = fs::path(m[1].str()).filename().string();
      EXPECT_EQ(m[1].str(), expected) << "run " << runs << " resumed from a checkpoint that is not the newest valid";
    } else if (contains(text, "train: ")) {  // got far enough to have chosen (or not) a checkpoint
      EXPECT_EQ(expected, "") << "run " << runs << " did not resume although " << expected << " verified";
    }
    // A killed checkpoint write leaves only a temporary directory, never an unverifiable checkpoint-N
    // that would be newer than every valid one.
    bool mid = false;
    if (fs::is_directory(ck))
      for (const auto& e : fs::directory_iterator(ck))
        if (contains(e.path().filename().string(), "-" + std::to_string(pid))) mid = true;
    mid_write += mid;
    const auto all = qlora::list_checkpoints(ck.string());
    if (!all.empty()) {
      EXPECT_EQ(qlora::verify_checkpoint(all[0]), "") << "run " << runs << ": newest " << all[0];
    }
    const std::string after = qlora::newest_valid_checkpoint(ck.string(), nullptr);
    if (outcome == "completed+") {  // next round
      qlora::remove_tree(out);
      fs::create_directories(out);
    }
    std::cout << std::setw(4) << runs << "  " << std::left << std::setw(5) << anchor << std::right << std::setw(10) << (kill_it ? std::to_string(delay) : "-") << "  "
              << std::left << std::setw(12) << outcome << std::setw(14) << resumed << std::setw(14)
              << (after.empty() ? "-" : fs::path(after).filename().string()) << (mid ? "yes" : "") << std::right
              << "\n";
    ++runs;
  }
  const double kill_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << kills << " kills (" << mid_write << " during a checkpoint write), " << resumes << " resumes, " << runs
            << " runs in " << kill_s << " s\n";
  EXPECT_GE(kills, 20);
  EXPECT_GE(mid_write, 1) << "no kill landed while a checkpoint was being written";
  EXPECT_EQ(qlora::read_file((out / "adapter_model.safetensors").string()), ref_adapter);
}

TEST_F(CheckpointRobust, CorruptFileInNewestCheckpointFallsBackToPrevious) {
  const fs::path base = root / "corrupt_base";
  stopped_run(base, 5);  // checkpoint-4 and checkpoint-5
  const std::vector<std::string> files = {"adapter_model.safetensors", "optimizer.safetensors", "trainer_state.json",
                                          "rng.safetensors", "metrics.jsonl", "manifest.json"};
  const std::vector<std::string> modes = {"truncate", "delete", "flip"};
  std::cout << "corruption of checkpoint-5 → resume from checkpoint-4\n";
  for (const std::string& file : files) {
    for (const std::string& mode : modes) {
      const std::string name = file + "/" + mode;
      const fs::path out = root / ("corrupt_" + std::to_string(std::hash<std::string>{}(name)));
      qlora::remove_tree(out);
      fs::copy(base, out, fs::copy_options::recursive);
      const fs::path newest = out / "checkpoints" / "checkpoint-5";
      const fs::path f = newest / file;
      const auto size = fs::file_size(f);
      if (mode == "truncate") {
        fs::resize_file(f, size / 2);
      } else if (mode == "delete") {
        fs::remove(f);
      } else {
        std::string bytes = qlora::read_file(f.string());
        bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 0xFF);
        std::ofstream(f, std::ios::binary | std::ios::trunc) << bytes;
      }
      const std::string why = qlora::verify_checkpoint(newest.string());
      EXPECT_TRUE(contains(why, file)) << name << ": reason '" << why << "' does not name the file";
      // Resume, run one step, stop (SIGTERM at step 5 again).
      Out o = train(out, "", "QLORA_FAULT_SIGTERM_AT=5:0");
      EXPECT_EQ(o.status, 75) << name << ": " << o.out;
      const std::string warn = line_with(o.out, "resume: skipping");
      EXPECT_TRUE(contains(warn, newest.string()) && contains(warn, file)) << name << ": " << o.out;
      EXPECT_TRUE(contains(o.out, "resume: from " + (out / "checkpoints" / "checkpoint-4").string() + " at step 4"))
          << name << ": " << o.out;
      std::cout << "  " << std::left << std::setw(36) << name << std::right << why.substr(0, 90) << "\n";
      qlora::remove_tree(out);
    }
  }
}

TEST_F(CheckpointRobust, DiskFullWhileSavingFailsCleanlyAndKeepsThePrevious) {
  const fs::path out = root / "diskfull";
  stopped_run(out, 3);  // checkpoint-2 and checkpoint-3
  const fs::path prev = out / "checkpoints" / "checkpoint-3";
  ASSERT_EQ(qlora::verify_checkpoint(prev.string()), "");
  const auto adapter = fs::file_size(prev / "adapter_model.safetensors");
  const auto optimizer = fs::file_size(prev / "optimizer.safetensors");
  ASSERT_LT(adapter, optimizer);
  // RLIMIT_FSIZE between the two sizes: the adapter fits, the optimizer state does not (EFBIG).
  const uint64_t limit_kb = (adapter + optimizer) / 2 / 1024;
  Out o = sh("bash -c 'ulimit -f " + std::to_string(limit_kb) + "; exec " + train_cmd(out) + "' ");
  std::cout << "disk full (ulimit -f " << limit_kb << " KiB; adapter " << adapter << " B, optimizer " << optimizer
            << " B): exit " << o.status << ": " << line_with(o.out, "error:") << "\n";
  EXPECT_EQ(o.status, 1) << o.out;
  const std::string err = line_with(o.out, "error:");
  EXPECT_TRUE(contains(err, "optimizer.safetensors") && contains(err, "File too large")) << o.out;
  EXPECT_TRUE(contains(o.out, "resume: from " + prev.string())) << o.out;
  // The previous checkpoint is intact; nothing half-written is left.
  EXPECT_EQ(qlora::verify_checkpoint(prev.string()), "");
  EXPECT_FALSE(fs::exists(out / "checkpoints" / "checkpoint-4"));
  for (const auto& e : fs::directory_iterator(out / "checkpoints"))
    EXPECT_EQ(e.path().filename().string().rfind(".tmp-", 0), std::string::npos) << e.path();
  o = train(out, "", "QLORA_FAULT_SIGTERM_AT=4:0");
  EXPECT_EQ(o.status, 75) << o.out;
  EXPECT_TRUE(contains(o.out, "resume: from " + prev.string() + " at step 3")) << o.out;
}

TEST_F(CheckpointRobust, ResumeWithOtherTrainFileIsRefused) {
  const fs::path out = root / "drift";
  stopped_run(out, 2);
  Out o = train(out, "--set data.train=" + (root / "data2.json").string());
  EXPECT_EQ(o.status, 1) << o.out;
  const std::string err = line_with(o.out, "error:");
  EXPECT_TRUE(contains(err, "refused") && contains(err, "data.train: " + (root / "data.json").string() + " -> " +
                                                              (root / "data2.json").string()))
      << o.out;
  std::cout << "config drift: " << err << "\n";
  EXPECT_FALSE(fs::exists(out / "adapter_model.safetensors"));
  EXPECT_EQ(qlora::list_checkpoints((out / "checkpoints").string()).size(), 2u);
}

TEST_F(CheckpointRobust, BadCheckpointGivenAsResumePathIsRejectedWithoutPartialLoad) {
  // 1. manifest.json that is not JSON.
  const fs::path src = root / "bad_src";
  stopped_run(src, 2);
  const fs::path notjson = root / "notjson_ckpt";
  fs::copy(src / "checkpoints" / "checkpoint-2", notjson, fs::copy_options::recursive);
  std::ofstream(notjson / "manifest.json", std::ios::trunc) << "this is not json\n";
  const fs::path out1 = root / "bad_out1";
  Out o = train(out1, "--set checkpoint.resume=" + notjson.string());
  EXPECT_EQ(o.status, 1) << o.out;
  std::string err = line_with(o.out, "error:");
  EXPECT_TRUE(contains(err, "manifest.json") && contains(err, notjson.string())) << o.out;
  std::cout << "not-JSON manifest: " << err.substr(0, 200) << "\n";
  EXPECT_FALSE(fs::exists(out1 / "adapter_model.safetensors"));
  EXPECT_FALSE(fs::exists(out1 / "checkpoints"));

  // 2. A checkpoint of an adapter with other LoRA targets (keys and shapes do not match).
  const fs::path other = root / "other_targets";
  o = train(other, "'--set' 'lora.target_modules=[q_proj,v_proj]'", "QLORA_FAULT_SIGTERM_AT=1:0");
  ASSERT_EQ(o.status, 75) << o.out;
  const fs::path out2 = root / "bad_out2";
  // refused before the model loads, naming the setting (trainer_state.json's config)
  o = train(out2, "--set checkpoint.resume=" + (other / "checkpoints" / "checkpoint-1").string());
  EXPECT_EQ(o.status, 1) << o.out;
  err = line_with(o.out, "error:");
  EXPECT_TRUE(contains(err, "refused: settings that change the run differ: lora.target_modules")) << o.out;
  EXPECT_FALSE(fs::exists(out2 / "checkpoints"));
  // with --force too: other targets make other adapter tensors, which no resume continues (said
  // before the load, not offered as --force's)
  EXPECT_FALSE(contains(err, "use --force")) << err;
  o = train(out2, "--force --set checkpoint.resume=" + (other / "checkpoints" / "checkpoint-1").string());
  EXPECT_EQ(o.status, 1) << o.out;
  err = line_with(o.out, "error:");
  EXPECT_TRUE(contains(err, "lora.target_modules changes which modules have adapters; no resume continues other "
                            "adapter tensors, not even with --force")) << o.out;
  std::cout << "other LoRA targets: " << err.substr(0, 200) << "\n";
  EXPECT_FALSE(fs::exists(out2 / "adapter_model.safetensors"));
  EXPECT_FALSE(fs::exists(out2 / "checkpoints"));

  // 3. A checkpoint of another model (hidden size 256 instead of 64).
  Out m = sh(::qlora::test::qlora_bin() + " init-model --preset small --out " + (root / "small").string() +
             " --train-tokenizer " + (root / "corpus.txt").string() + " --vocab-size 400 --seed 3");
  ASSERT_EQ(m.status, 0) << m.out;
  const fs::path small = root / "small_run";
  o = train(small, "--set model.path=" + (root / "small").string(), "QLORA_FAULT_SIGTERM_AT=1:0");
  ASSERT_EQ(o.status, 75) << o.out;
  const fs::path out3 = root / "bad_out3";
  o = train(out3, "--set checkpoint.resume=" + (small / "checkpoints" / "checkpoint-1").string());
  EXPECT_EQ(o.status, 1) << o.out;
  err = line_with(o.out, "error:");
  EXPECT_TRUE(contains(err, "refused: settings that change the run differ: model.path")) << o.out;
  EXPECT_FALSE(fs::exists(out3 / "checkpoints"));
  o = train(out3, "--force --set checkpoint.resume=" + (small / "checkpoints" / "checkpoint-1").string());
  EXPECT_EQ(o.status, 1) << o.out;
  err = line_with(o.out, "error:");
  EXPECT_TRUE(contains(err, "adapter does not fit the model") && contains(err, "has shape")) << o.out;
  std::cout << "other model (hidden 256): " << err.substr(0, 200) << "\n";
  EXPECT_FALSE(fs::exists(out3 / "adapter_model.safetensors"));
  EXPECT_FALSE(fs::exists(out3 / "checkpoints"));
}

}  // namespace
