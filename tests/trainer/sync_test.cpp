// checkpoint.sync_command and the stop signals (docs/checkpoints.md, "Off-machine copies" and
// "Signals"): a Ctrl-C while a sync runs still stops the run (the command is not run through
// std::system, which ignores SIGINT in the caller) and does not reach the sync (its own process
// group, nothing blocked or ignored); the run waits (bounded) for the last checkpoint's sync after
// SIGTERM and at the end, one log line per sync; keep_last never prunes a checkpoint whose sync
// runs; {dir} / {name} are shell-quoted and {name} keeps the checkpoint-N folder a resume needs;
// a SIGTERM during a checkpoint write stops right after that checkpoint. Tiny run of tiny_run.h
// driven as a subprocess; the reference is the checkpoint format itself (verify_checkpoint on
// the synced copies) and the resumed run's log.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "common/files.h"
#include "test_util.h"
#include "tiny_run.h"
#include "trainer/checkpoint.h"
#include "trainer/sync.h"

namespace {
namespace fs = std::filesystem;
using Out = qlora::test::CommandResult;
Out sh(const std::string& cmd) { return qlora::test::run_command(cmd); }

/// `s` in single quotes for the test's own shell lines.
std::string q(const std::string& s) {
  std::string r = "'";
  for (char c : s) r += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return r + "'";
}

class Sync : public qlora::test::TinyRunSuite<Sync> {
 public:
  static constexpr const char* kTempName = "sync";
  static constexpr int kSaveSteps = 0;

 protected:
  /// `qlora train` of the tiny run into `out` with `--set` overrides `sets` (each one argument),
  /// environment prefix `env`; returns status and output.
  static Out train(const fs::path& out, const std::vector<std::string>& sets, const std::string& env = "") {
    std::string cmd = env + " " + ::qlora::test::qlora_bin() + " train " + q((root / "run.yaml").string()) + " --set " +
                      q("output_dir=" + out.string());
    for (const std::string& s : sets) cmd += " --set " + q(s);
    return sh(cmd);
  }
  /// The same in the background in its own process group (as a terminal's foreground job), its
  /// output to LOG; `then` runs in the test's shell with $L = its pid, then the shell waits for it
  /// and prints "rc=<status>". Returns the shell's output followed by the run's log.
  static std::string train_and(const fs::path& out, const std::vector<std::string>& sets, const std::string& env,
                               const std::string& then) {
    const fs::path log = out.string() + ".log";
    std::string cmd = env + " setsid " + ::qlora::test::qlora_bin() + " train " + q((root / "run.yaml").string()) + " --set " +
                      q("output_dir=" + out.string());
    for (const std::string& s : sets) cmd += " --set " + q(s);
    const Out o = sh(cmd + " > " + q(log.string()) + " 2>&1 & L=$!; " + then + "; wait $L; echo rc=$?");
    return o.out + (fs::exists(log) ? qlora::read_file(log.string()) : "");
  }
  static bool has(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }
};

// A Ctrl-C (SIGINT to the whole process group, as a terminal sends it) while a sync command runs
// stops the run with a checkpoint (75); the sync commands are not killed by it and finish before
// qlora exits; each runs in its own process group, and what it runs starts with no signal blocked
// and neither SIGINT nor SIGTERM ignored (grep reads its own /proc/self/status: the shell itself
// blocks signals while it waits for a child).
TEST_F(Sync, CtrlCWhileASyncRunsStopsTheRunAndSparesTheSync) {
  const fs::path out = root / "ctrlc", marks = root / "ctrlc_marks";
  fs::create_directories(marks);
  const std::string m = marks.string();
  const std::string sync = "echo \"$$ $(cut -d' ' -f5 /proc/$$/stat)\" > " + m + "/{name}.pg; grep -E '^Sig(Blk|Ign)' "
                           "/proc/self/status >> " + m + "/{name}.pg; sleep 3; touch " + m + "/{name}.done";
  const std::string lg =
      train_and(out, {"checkpoint.save_steps=1", "training.max_steps=12", "checkpoint.sync_command=" + sync},
                "QLORA_FAULT_STEP_DELAY_MS=400",
                "while kill -0 $L 2>/dev/null && [ ! -s " + q(m + "/checkpoint-1.pg") + " ]; do sleep 0.05; done; "
                "sleep 0.5; env kill -s INT -- -$L");
  EXPECT_TRUE(has(lg, "rc=75")) << lg;
  EXPECT_TRUE(has(lg, "interrupted: stopped at step")) << lg;
  EXPECT_FALSE(has(lg, "step 12/12")) << "the Ctrl-C was ignored while the sync ran\n" << lg;
  EXPECT_TRUE(has(lg, "waiting up to 600 s (checkpoint.sync_timeout_seconds)")) << lg;
  const auto ckpts = qlora::list_checkpoints((out / "checkpoints").string());
  ASSERT_FALSE(ckpts.empty()) << lg;
  const std::string newest = fs::path(ckpts[0]).filename().string();
  // The sync of the stop checkpoint ran to its end before qlora exited, untouched by the Ctrl-C.
  EXPECT_TRUE(fs::exists(marks / (newest + ".done"))) << lg;
  EXPECT_TRUE(has(lg, "checkpoint.sync_command for " + ckpts[0] + ": ok (")) << lg;
  std::ifstream pg(marks / "checkpoint-1.pg");
  std::string pid, pgid, line;
  pg >> pid >> pgid;
  EXPECT_EQ(pid, pgid) << "the sync command leads its own process group";
  int lines = 0;
  while (std::getline(pg, line)) {
    std::smatch mm;
    if (!std::regex_search(line, mm, std::regex(R"(^(SigBlk|SigIgn):\s*([0-9a-f]+))"))) continue;
    ++lines;
    const unsigned long long bits = std::stoull(mm[2], nullptr, 16);
    if (mm[1] == "SigBlk") EXPECT_EQ(bits, 0u) << line;
    else EXPECT_EQ(bits & ((1ull << (SIGINT - 1)) | (1ull << (SIGTERM - 1))), 0u) << "SIGINT/SIGTERM ignored: " << line;
  }
  EXPECT_EQ(lines, 2);
}

// SIGTERM (exit 75) and the normal end both wait for the last checkpoint's sync: its copy is there
// and verifies as soon as qlora has exited, and the log says "ok (S s)" for it.
TEST_F(Sync, SigtermAndTheEndWaitForTheLastSync) {
  const fs::path out = root / "wait", copies = root / "wait_copies";
  fs::create_directories(copies);
  const std::string sync = "checkpoint.sync_command=sleep 1.5; cp -r {dir} " + copies.string() + "/";
  Out o = train(out, {sync}, "QLORA_FAULT_SIGTERM_AT=3:0");
  EXPECT_EQ(o.status, 75) << o.out;
  EXPECT_EQ(qlora::verify_checkpoint((copies / "checkpoint-3").string()), "") << o.out;
  EXPECT_TRUE(has(o.out, "checkpoint.sync_command for " + (out / "checkpoints" / "checkpoint-3").string() + ": ok ("))
      << o.out;
  o = train(out, {sync, "training.max_steps=5"});
  EXPECT_EQ(o.status, 0) << o.out;
  EXPECT_EQ(qlora::verify_checkpoint((copies / "checkpoint-5").string()), "") << o.out;
  EXPECT_TRUE(std::regex_search(o.out, std::regex("checkpoint\\.sync_command for \\S+checkpoint-5: ok \\(1\\.[5-9]\\d s\\)")))
      << o.out;
  const nlohmann::json cs = nlohmann::json::parse(qlora::read_file((out / "summary.json").string()))["checkpoint_sync"];
  EXPECT_EQ(cs["ok"], cs["started"]) << cs.dump();
  EXPECT_TRUE(cs["failed"].empty() && cs["running"].empty()) << cs.dump();
  EXPECT_FALSE(has(o.out, "warning: checkpoint.sync_command:")) << o.out;
}

// A failing sync is logged with its exit code (not the wait status), never fatal; one that outlasts
// checkpoint.sync_timeout_seconds is logged as timed out and the run exits; a Ctrl-C during the
// wait quits at once with 130.
TEST_F(Sync, FailureTimeoutAndCtrlCDuringTheWait) {
  Out o = train(root / "fail", {"training.max_steps=2", "checkpoint.sync_command=exit 3"});
  EXPECT_EQ(o.status, 0) << o.out;
  EXPECT_TRUE(std::regex_search(o.out, std::regex("checkpoint\\.sync_command for \\S+checkpoint-2: failed \\(exit code "
                                                  "3, [0-9.]+ s\\): exit 3"))) << o.out;
  // recorded in summary.json and counted in the run's last warning: the exit code says nothing
  nlohmann::json sum = nlohmann::json::parse(qlora::read_file((root / "fail" / "summary.json").string()));
  ASSERT_TRUE(sum.contains("checkpoint_sync")) << sum.dump(2);
  const nlohmann::json& cs = sum["checkpoint_sync"];
  EXPECT_EQ(cs["command"], "exit 3");
  EXPECT_EQ(cs["ok"], 0) << cs.dump();
  ASSERT_GE(cs["started"].get<int>(), 1) << cs.dump();
  ASSERT_EQ(cs["failed"].size(), cs["started"].get<size_t>()) << cs.dump();
  EXPECT_EQ(cs["failed"].back()["checkpoint"], (root / "fail" / "checkpoints" / "checkpoint-2").string()) << cs.dump();
  EXPECT_EQ(cs["failed"].back()["error"], "exit code 3") << cs.dump();
  EXPECT_TRUE(cs["running"].empty()) << cs.dump();
  EXPECT_TRUE(has(o.out, "warning: checkpoint.sync_command: " + std::to_string(cs["started"].get<int>()) + " of " +
                             std::to_string(cs["started"].get<int>()) + " failed (summary.json: checkpoint_sync)"))
      << o.out;

  const auto t0 = std::chrono::steady_clock::now();
  // (the command lets go of qlora's stdout, which run_command reads to its end)
  o = train(root / "slow", {"training.max_steps=2", "checkpoint.sync_command=exec sleep 8 > /dev/null 2>&1",
                            "checkpoint.sync_timeout_seconds=1"});
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(o.status, 0) << o.out;
  EXPECT_LT(took, 7.5) << o.out;
  EXPECT_TRUE(std::regex_search(o.out, std::regex("checkpoint\\.sync_command for \\S+checkpoint-2: timed out after 1 s "
                                                  "\\(checkpoint\\.sync_timeout_seconds\\); left running as process group "
                                                  "\\d+: exec sleep 8"))) << o.out;
  sum = nlohmann::json::parse(qlora::read_file((root / "slow" / "summary.json").string()));
  EXPECT_EQ(sum["checkpoint_sync"]["running"].back(), (root / "slow" / "checkpoints" / "checkpoint-2").string())
      << sum.dump(2);
  EXPECT_TRUE(has(o.out, " left running (summary.json: checkpoint_sync)")) << o.out;

  const fs::path waiting = root / "ctrlc_wait";
  const auto t1 = std::chrono::steady_clock::now();
  const std::string lg = train_and(waiting, {"training.max_steps=2", "checkpoint.sync_command=sleep 8"}, "",
                                   "while kill -0 $L 2>/dev/null && ! grep -q 'waiting up to' " +
                                       q(waiting.string() + ".log") + "; do sleep 0.05; done; env kill -s INT -- -$L");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count(), 7.5) << lg;
  EXPECT_TRUE(has(lg, "rc=130")) << lg;
  EXPECT_TRUE(has(lg, "qlora: interrupt: quitting now without waiting for checkpoint.sync_command")) << lg;
  EXPECT_TRUE(fs::exists(waiting / "adapter_model.safetensors")) << "the run itself had ended";
}

// keep_last 1 with syncs slower than the steps: every checkpoint reaches the copy complete (none
// is pruned under its sync), and once the syncs have ended the local ones are pruned to keep_last.
TEST_F(Sync, KeepLastNeverPrunesACheckpointWhileItsSyncRuns) {
  const fs::path out = root / "prune", copies = root / "prune_copies";
  fs::create_directories(copies);
  const Out o = train(out, {"training.max_steps=4", "checkpoint.save_steps=1", "checkpoint.keep_last=1",
                            "checkpoint.sync_command=sleep 1.5; cp -r {dir} " + copies.string() + "/"});
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_FALSE(has(o.out, "failed")) << o.out;
  for (int s = 1; s <= 4; ++s)
    EXPECT_EQ(qlora::verify_checkpoint((copies / ("checkpoint-" + std::to_string(s))).string()), "") << s << "\n" << o.out;
  const auto local = qlora::list_checkpoints((out / "checkpoints").string());
  ASSERT_EQ(local.size(), 1u) << o.out;
  EXPECT_EQ(fs::path(local[0]).filename(), "checkpoint-4");
  EXPECT_TRUE(has(o.out, "pruned (keep_last 1; its sync_command has ended)")) << o.out;
}

// {dir} and {name} are substituted shell-quoted (an output_dir with a space and a quote), and
// {name} keeps the checkpoint-N folder when the command copies a folder's contents (as
// `rclone copy {dir} remote:run/{name}` does): a new machine resumes from the copy with
// checkpoint.resume_from_dir.
TEST_F(Sync, PlaceholdersAreQuotedAndTheCopyResumes) {
  const fs::path out = root / "it's a run", copies = root / "bucket run";
  fs::create_directories(copies);
  const std::string dest = q(copies.string());
  Out o = train(out, {"checkpoint.sync_command=mkdir -p " + dest + "/{name} && cp -r {dir}/. " + dest + "/{name}/"},
                "QLORA_FAULT_SIGTERM_AT=3:0");
  ASSERT_EQ(o.status, 75) << o.out;
  EXPECT_FALSE(has(o.out, "failed")) << o.out;
  ASSERT_EQ(qlora::verify_checkpoint((copies / "checkpoint-3").string()), "") << o.out;
  const std::string history = qlora::read_file((out / "metrics.jsonl").string());
  qlora::remove_tree(out);  // the machine is gone
  const fs::path fresh = root / "new machine";
  o = train(fresh, {"checkpoint.resume_from_dir=" + copies.string(), "training.max_steps=4", "cost.gpu_hour_price=3.6"});
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_TRUE(has(o.out, "resume: from " + (copies / "checkpoint-3").string() + " at step 3")) << o.out;
  // The run's history came with the checkpoint (as HF's log_history in trainer_state.json): the
  // new machine's metrics.jsonl starts with the lost machine's 3 lines, byte for byte, then step 4.
  EXPECT_TRUE(has(o.out, "resume: metrics of 3 steps restored from " + (copies / "checkpoint-3").string())) << o.out;
  const std::string now = qlora::read_file((fresh / "metrics.jsonl").string());
  ASSERT_EQ(std::count(history.begin(), history.end(), '\n'), 3) << history;
  EXPECT_EQ(now.substr(0, history.size()), history);
  EXPECT_EQ(std::count(now.begin(), now.end(), '\n'), 4) << now;
  EXPECT_EQ(nlohmann::json::parse(now.substr(history.size()))["step"], 4) << now;
  // summary.json: complete metrics; setup_seconds counts both invocations' model loads (the
  // checkpoint's record plus this one's); the cost bills training + setup + redone steps.
  const auto sum = nlohmann::json::parse(qlora::read_file((fresh / "summary.json").string()));
  EXPECT_TRUE(sum["metrics_complete"].get<bool>()) << sum.dump();
  const auto state = nlohmann::json::parse(qlora::read_file((copies / "checkpoint-3" / "trainer_state.json").string()));
  const double setup_before = state["setup_seconds"].get<double>();
  EXPECT_GT(setup_before, 0.0) << state.dump();
  EXPECT_GT(sum["setup_seconds"].get<double>(), setup_before) << sum.dump();
  const double billed = sum["wall_seconds"].get<double>() + sum["setup_seconds"].get<double>() +
                        sum["preemption"]["time_lost_s"].get<double>();
  EXPECT_NEAR(sum["cost"]["billed_seconds"].get<double>(), billed, 1e-9) << sum.dump();
  EXPECT_NEAR(sum["cost"]["run"].get<double>(), billed * 3.6 / 3600, 1e-12) << sum.dump();
}

// An error that ends the run after a checkpoint (here: metrics.jsonl became a directory, so the
// next step's line cannot be written) still lets that checkpoint's sync finish before qlora exits
// with the error: the off-machine copy is complete the moment the process is gone.
TEST_F(Sync, AnErrorAfterACheckpointStillWaitsForItsSync) {
  const fs::path out = root / "error_exit", copies = root / "error_copies";
  fs::create_directories(copies);
  const std::string m = q((out / "metrics.jsonl").string());
  const Out o = train(out, {"checkpoint.save_steps=1", "training.max_steps=6",
                            "checkpoint.sync_command=rm -f " + m + " && mkdir " + m + "; sleep 1.5; cp -r {dir} " +
                                q(copies.string()) + "/"},
                      "QLORA_FAULT_STEP_DELAY_MS=300");
  EXPECT_NE(o.status, 0) << o.out;
  EXPECT_NE(o.status, 75) << o.out;
  EXPECT_TRUE(has(o.out, "cannot write " + (out / "metrics.jsonl").string() + ": Is a directory")) << o.out;
  EXPECT_TRUE(has(o.out, "stopping on an error; the last checkpoint's sync_command still runs")) << o.out;
  EXPECT_EQ(qlora::verify_checkpoint((copies / "checkpoint-1").string()), "") << o.out;
  EXPECT_TRUE(has(o.out, "checkpoint.sync_command for " + (out / "checkpoints" / "checkpoint-1").string() + ": ok ("))
      << o.out;
}

// A SIGTERM while a checkpoint is being written (test hook: the write sleeps 1.5 s before its
// rename) stops right after that checkpoint: no further step, no second checkpoint; the message
// says what applies to SIGTERM (no Ctrl-C advice, no "finishing this step").
TEST_F(Sync, SigtermDuringACheckpointWriteStopsAfterIt) {
  const fs::path out = root / "during_write";
  const std::string lg =
      train_and(out, {"checkpoint.save_steps=2", "training.max_steps=8"}, "QLORA_FAULT_SLOW_CHECKPOINT_MS=1500",
                "while kill -0 $L 2>/dev/null && ! ls -a " + q((out / "checkpoints").string()) +
                    " 2>/dev/null | grep -q '^.tmp-checkpoint-2-'; do sleep 0.05; done; sleep 0.2; kill -TERM $L");
  EXPECT_TRUE(has(lg, "rc=75")) << lg;
  EXPECT_TRUE(has(lg, "stopped at step 2 by signal Terminated (during the checkpoint write)")) << lg;
  EXPECT_TRUE(has(lg, "qlora: stop requested by SIGTERM; this step is done: a checkpoint of it, then exit 75"))
      << lg;
  EXPECT_FALSE(has(lg, "Ctrl-C again")) << lg;
  const auto ckpts = qlora::list_checkpoints((out / "checkpoints").string());
  ASSERT_EQ(ckpts.size(), 1u) << lg;
  EXPECT_EQ(fs::path(ckpts[0]).filename(), "checkpoint-2");
  std::ifstream metrics(out / "metrics.jsonl");
  int lines = 0;
  for (std::string l; std::getline(metrics, l);) ++lines;
  EXPECT_EQ(lines, 2) << lg;
}

// The substitution itself: {dir} and {name} single-quoted where needed (' as '\''), every
// occurrence, other braces untouched; what /bin/sh makes of it is PlaceholdersAreQuotedAndTheCopyResumes.
TEST(SyncCommand, PlaceholdersAreShellQuoted) {
  EXPECT_EQ(qlora::expand_sync_command("cp -r {dir} x/{name} && echo {dir} {other}", "/a/it's b/checkpoint-4"),
            "cp -r '/a/it'\\''s b/checkpoint-4' x/checkpoint-4 && echo '/a/it'\\''s b/checkpoint-4' {other}");
  EXPECT_EQ(qlora::expand_sync_command("rclone copy {dir} r:run/{name}", "/runs/a/checkpoints/checkpoint-40"),
            "rclone copy /runs/a/checkpoints/checkpoint-40 r:run/checkpoint-40");
}

}  // namespace
