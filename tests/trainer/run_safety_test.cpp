// Run safety (issue 16): every input of ../shared/cases/ as a test of the fixed behaviour, plus the
// named kinds (a resume path that holds no checkpoint; PEFT regex / layers_to_transform /
// layers_pattern / exclude_modules adapters against PEFT). Uses the `qlora` binary of this build,
// the shared Llama 2 tokenizer and fixtures from tests/fixtures/make_safety_refs.py.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <thread>
#include <signal.h>

#include "adapters/peft.h"
#include "common/files.h"
#include "common/safetensors.h"
#include "common/tensor_io.h"
#include "tests/test_util.h"
#include "trainer/checkpoint.h"
#include "cli/commands.h"
#include "model/model.h"
#include "trainer/train.h"

namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;
using Out = qlora::test::CommandResult;

Out sh(const std::string& cmd) { return qlora::test::run_command(cmd); }
using qlora::test::contains;
using qlora::test::line_with;
std::string sha(const fs::path& p) { return qlora::sha256_file(p.string()); }
std::vector<std::string> names(const fs::path& dir) {
  std::vector<std::string> n;
  for (const std::string& c : qlora::list_checkpoints(dir.string())) n.push_back(fs::path(c).filename().string());
  return n;
}

/// The cases' tiny model (`init-model --preset tiny` with the shared Llama 2 tokenizer, seed 1),
/// made once per suite, and helpers to run `qlora` on a case's files.
class Cases : public ::testing::Test {
 protected:
  static fs::path work, tiny;
  static void SetUpTestSuite() {
    work = qlora::test::fresh_temp_dir("run_safety");
    tiny = work / "tiny";
    const fs::path tok = qlora::test::shared_dir() / "tokenizers/llama2/tokenizer.model";
    Out o = sh(::qlora::test::qlora_bin() + " init-model --preset tiny --out " + tiny.string() + " --tokenizer " +
               tok.string() + " --seed 1");
    ASSERT_EQ(o.status, 0) << o.out;
  }
  static void TearDownTestSuite() { qlora::remove_tree(work); }
  void SetUp() override {
    if (!fs::exists(qlora::test::shared_dir() / "cases"))
      FAIL() << "missing " << qlora::test::shared_dir() / "cases" << " (../shared must exist; CI has it)";
    ASSERT_TRUE(fs::exists(tiny / "model.safetensors"));
  }
  static fs::path case_dir(const std::string& name) { return qlora::test::shared_dir() / "cases" / name; }
  /// `qlora train <case>/config.yaml` with output_dir, model.path and data.train set, plus `extra`.
  static Out train(const std::string& cs, const fs::path& out, const fs::path& data, const std::string& extra = "",
                   const std::string& env = "") {
    return sh(env + " " + ::qlora::test::qlora_bin() + " train " + (case_dir(cs) / "config.yaml").string() + " --set output_dir=" +
              out.string() + " --set model.path=" + tiny.string() + " --set data.train=" + data.string() + " " + extra);
  }
};
fs::path Cases::work, Cases::tiny;

// ---- stale-checkpoints-mix-runs ---------------------------------------------------------------

TEST_F(Cases, StaleCheckpointsNeverMixRuns) {
  const std::string cs = "stale-checkpoints-mix-runs";
  const fs::path w = work / "stale", data = w / "data.json", out = w / "run";
  fs::create_directories(w);
  fs::copy_file(case_dir(cs) / "data_v1.json", data);
  Out o = train(cs, out, data);  // run A on data v1
  ASSERT_EQ(o.status, 0) << o.out;
  ASSERT_EQ(names(out / "checkpoints"), (std::vector<std::string>{"checkpoint-4", "checkpoint-2"}));
  const std::string adapter_a = sha(out / "adapter_model.safetensors");
  fs::copy_file(case_dir(cs) / "data_v2.json", data, fs::copy_options::overwrite_existing);  // same path, new data

  // A fresh run (resume: never) in the used output_dir is refused with the reason; nothing changes.
  o = train(cs, out, data, "--set checkpoint.resume=never", "QLORA_FAULT_SIGTERM_AT=3:0");
  EXPECT_EQ(o.status, 1) << o.out;
  std::string err = line_with(o.out, "error:");
  EXPECT_TRUE(contains(err, "output_dir " + out.string() + " already holds run") && contains(err, "--overwrite-output-dir"))
      << o.out;
  EXPECT_EQ(names(out / "checkpoints"), (std::vector<std::string>{"checkpoint-4", "checkpoint-2"}));
  EXPECT_EQ(sha(out / "adapter_model.safetensors"), adapter_a);

  // resume: auto continues run A only if its data is unchanged: the content changed, so refused.
  o = train(cs, out, data);
  EXPECT_EQ(o.status, 1) << o.out;
  err = line_with(o.out, "error:");
  EXPECT_TRUE(contains(err, "refused") && contains(err, "content of " + data.string() + " changed")) << o.out;
  EXPECT_EQ(sha(out / "adapter_model.safetensors"), adapter_a);

  // --overwrite-output-dir moves run A aside (a sibling) and starts run B; interrupted at step 3.
  o = train(cs, out, data, "--overwrite-output-dir", "QLORA_FAULT_SIGTERM_AT=3:0");
  ASSERT_EQ(o.status, 75) << o.out;
  EXPECT_TRUE(contains(o.out, "moved the previous contents of " + out.string() + " to " + out.string() + ".old-"))
      << o.out;
  EXPECT_TRUE(contains(line_with(o.out, "interrupted:"), "without --overwrite-output-dir")) << o.out;
  EXPECT_FALSE(contains(o.out, "of these same settings and data")) << "run A's data differs: " << o.out;
  // status.json: stopped, 75, the interrupt line (its resume command), the checkpoint of step 3
  json st = json::parse(qlora::read_file((out / "status.json").string()));
  EXPECT_EQ(st["state"], "stopped") << st.dump(1);
  EXPECT_EQ(st["exit_code"], 75) << st.dump(1);
  EXPECT_EQ("interrupted: " + st["message"].get<std::string>(), line_with(o.out, "interrupted:")) << st.dump(1);
  EXPECT_EQ(st["step"], 3) << st.dump(1);
  EXPECT_EQ(st["last_checkpoint"], (out / "checkpoints" / "checkpoint-3").string()) << st.dump(1);
  fs::path aside;
  for (const auto& e : fs::directory_iterator(w))
    if (contains(e.path().filename().string(), "run.old-")) aside = e.path();
  ASSERT_FALSE(aside.empty()) << "run A was not moved aside";
  EXPECT_EQ(sha(aside / "adapter_model.safetensors"), adapter_a);
  ASSERT_EQ(names(out / "checkpoints"), (std::vector<std::string>{"checkpoint-3", "checkpoint-2"}));

  // A checkpoint of another run placed among run B's (e.g. copied in by hand): never resumed, never pruned.
  fs::copy(aside / "checkpoints" / "checkpoint-4", out / "checkpoints" / "checkpoint-50", fs::copy_options::recursive);
  o = train(cs, out, data);
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_TRUE(contains(o.out, "checkpoint-50: written by run ")) << o.out;
  st = json::parse(qlora::read_file((out / "status.json").string()));
  EXPECT_EQ(st["state"], "completed") << st.dump(1);
  EXPECT_EQ(st["exit_code"], 0) << st.dump(1);
  EXPECT_TRUE(st["message"].is_null()) << st.dump(1);
  EXPECT_EQ(st["step"], st["total_steps"]) << st.dump(1);
  EXPECT_EQ(st["run_id"], json::parse(qlora::read_file((out / "run.json").string()))["run_id"]) << st.dump(1);
  EXPECT_TRUE(contains(o.out, "resume: from " + (out / "checkpoints" / "checkpoint-3").string() + " at step 3")) << o.out;
  EXPECT_EQ(names(out / "checkpoints"), (std::vector<std::string>{"checkpoint-50", "checkpoint-4", "checkpoint-3"}));

  // Run B's adapter equals a clean, uninterrupted run B on data v2 (and not run A's).
  o = train(cs, w / "clean_b", data, "--set checkpoint.resume=never");
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_EQ(sha(out / "adapter_model.safetensors"), sha(w / "clean_b" / "adapter_model.safetensors"));
  EXPECT_NE(sha(out / "adapter_model.safetensors"), adapter_a);
  const json run = json::parse(qlora::read_file((out / "run.json").string()));
  EXPECT_EQ(json::parse(qlora::read_file((out / "summary.json").string()))["run_id"], run["run_id"]);
  EXPECT_EQ(run["data_sha256"][data.string()], sha(data));

  // The flag again on run B (same settings and data, checkpoints to resume): a retried job script
  // that passes it starts over each time, which the warning says.
  o = train(cs, out, data, "--overwrite-output-dir");
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_TRUE(contains(line_with(o.out, "moves aside run"),
                       "warning: output_dir: --overwrite-output-dir moves aside run " + run["run_id"].get<std::string>() +
                           " of these same settings and data with 2 checkpoints (newest checkpoint-4); this run starts "
                           "from step 0. Without the flag this command resumes it"))
      << o.out;
}

// Which run owns output_dir is decided before the model loads (a 7B load takes minutes): a fresh
// run into a used output_dir is refused even when the model would not load. The decision must
// still hold once the lock is taken after the load: another process writing there meanwhile stops
// the run, with nothing of it written and the other process's file kept.
TEST_F(Cases, OutputDirDecidedBeforeTheModelLoadsAndCheckedAfter) {
  const std::string cs = "stale-checkpoints-mix-runs";
  const fs::path w = work / "decided", data = case_dir(cs) / "data_v1.json", out = w / "run";
  fs::create_directories(w);
  Out o = train(cs, out, data, "--set training.max_steps=1");
  ASSERT_EQ(o.status, 0) << o.out;
  const fs::path broken = w / "broken";  // tiny's files with model.safetensors cut to 100 bytes
  fs::copy(tiny, broken, fs::copy_options::recursive);
  fs::resize_file(broken / "model.safetensors", 100);
  o = train(cs, out, data, "--set training.max_steps=1 --set checkpoint.resume=never --set model.path=" + broken.string());
  EXPECT_EQ(o.status, 1) << o.out;
  EXPECT_TRUE(contains(line_with(o.out, "error:"), "output_dir " + out.string() + " already holds run")) << o.out;
  EXPECT_FALSE(contains(o.out, "model.safetensors")) << o.out;  // the model was never opened

  // A run sleeps (test hook) between its decision (output_dir absent: a new run) and the load;
  // meanwhile a file appears in output_dir.
  const fs::path out2 = w / "run2", log = w / "run2.log", rc = w / "run2.rc";
  sh("(QLORA_FAULT_LOAD_DELAY_MS=8000 " + ::qlora::test::qlora_bin() + " train " +
     (case_dir(cs) / "config.yaml").string() + " --set output_dir=" + out2.string() + " --set model.path=" +
     tiny.string() + " --set data.train=" + data.string() + " --set training.max_steps=1 > " + log.string() +
     " 2>&1; echo $? > " + rc.string() + ".tmp; mv " + rc.string() + ".tmp " + rc.string() + ") > /dev/null 2>&1 &");
  auto read = [](const fs::path& p) { return fs::exists(p) ? qlora::read_file(p.string()) : std::string(); };
  for (int i = 0; i < 3000 && !contains(read(log), "QLORA_FAULT_LOAD_DELAY_MS") && !fs::exists(rc); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_TRUE(contains(read(log), "QLORA_FAULT_LOAD_DELAY_MS")) << read(log);
  fs::create_directories(out2);
  qlora::atomic_write_string((out2 / "notes.txt").string(), "another process's file\n");
  for (int i = 0; i < 6000 && !fs::exists(rc); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_TRUE(fs::exists(rc)) << read(log);
  EXPECT_EQ(read(rc), "1\n") << read(log);
  EXPECT_TRUE(contains(line_with(read(log), "error:"), "output_dir " + out2.string() +
                                                          " changed while the model loaded (another process wrote to it)"))
      << read(log);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(out2)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  // no run.json or memory_report.json; run.lock stays (it never makes a directory used)
  EXPECT_EQ(left, (std::vector<std::string>{"notes.txt", "run.lock"}));
}

// SIGTERM while the run sets up (here: held before the model load by the test hook) exits 75 with
// a line saying so, as a stop during training does (trial 9: a silent 143, which a supervisor that
// reruns on 75 takes for a failure); the same command then runs the whole run.
TEST_F(Cases, SigtermDuringSetupExits75AndTheRerunRuns) {
  const std::string cs = "resume-never-says-resume";
  const fs::path w = work / "setupterm", data = case_dir(cs) / "data.json", out = w / "run";
  const fs::path log = w / "run.log", rc = w / "run.rc", pid = w / "run.pid";
  fs::create_directories(w);
  sh("(QLORA_FAULT_LOAD_DELAY_MS=600000 " + ::qlora::test::qlora_bin() + " train " +
     (case_dir(cs) / "config.yaml").string() + " --set output_dir=" + out.string() + " --set model.path=" +
     tiny.string() + " --set data.train=" + data.string() + " > " + log.string() + " 2>&1 & echo $! > " +
     pid.string() + "; wait $!; echo $? > " + rc.string() + ".tmp; mv " + rc.string() + ".tmp " + rc.string() +
     ") > /dev/null 2>&1 &");
  auto read = [](const fs::path& p) { return fs::exists(p) ? qlora::read_file(p.string()) : std::string(); };
  for (int i = 0; i < 3000 && !contains(read(log), "QLORA_FAULT_LOAD_DELAY_MS") && !fs::exists(rc); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_TRUE(contains(read(log), "QLORA_FAULT_LOAD_DELAY_MS")) << read(log);
  ASSERT_EQ(::kill(std::stoi(read(pid)), SIGTERM), 0);
  for (int i = 0; i < 600 && !fs::exists(rc); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_TRUE(fs::exists(rc)) << read(log);
  EXPECT_EQ(read(rc), "75\n") << read(log);
  EXPECT_TRUE(contains(read(log), "qlora: stop requested during setup (loading the model and data, before the first "
                                  "step): nothing to save; exit 75: rerun the same command to start (or resume from "
                                  "the last checkpoint)")) << read(log);
  Out o = train(cs, out, data);
  EXPECT_EQ(o.status, 0) << o.out;
  EXPECT_TRUE(fs::exists(out / "adapter_model.safetensors")) << o.out;
}

// ---- resume-never-says-resume -----------------------------------------------------------------

/// The command after "to resume, run: " (or "...again to resume: ") in the interrupt line, with
/// `qlora` replaced by this build's binary.
std::string resume_command(const std::string& out) {
  const std::string line = line_with(out, "interrupted:");
  std::smatch m;
  if (!std::regex_search(line, m, std::regex("(run: |to resume: )qlora (.*)$"))) return "";
  return ::qlora::test::qlora_bin() + " " + m[2].str();
}

TEST_F(Cases, InterruptMessageGivesTheCommandThatResumes) {
  const std::string cs = "resume-never-says-resume";
  const fs::path w = work / "never", data = case_dir(cs) / "data.json", out = w / "run";
  Out ref = train(cs, w / "ref", data);
  ASSERT_EQ(ref.status, 0) << ref.out;
  Out o = train(cs, out, data, "", "QLORA_FAULT_SIGTERM_AT=4:0");
  ASSERT_EQ(o.status, 75) << o.out;
  const std::string msg = line_with(o.out, "interrupted:");
  const std::string ckpt = (out / "checkpoints" / "checkpoint-4").string();
  EXPECT_TRUE(contains(msg, "checkpoint.resume is never, so the same command will NOT resume")) << msg;
  EXPECT_TRUE(contains(msg, "--set checkpoint.resume=" + ckpt)) << msg;
  // The same command again refuses (it would have restarted at step 1 and pruned the checkpoint).
  Out again = train(cs, out, data);
  EXPECT_EQ(again.status, 1) << again.out;
  EXPECT_TRUE(contains(line_with(again.out, "error:"), "a fresh run (checkpoint.resume: never) would mix")) << again.out;
  EXPECT_TRUE(fs::exists(ckpt));
  // The stated command resumes at step 4 and ends where the uninterrupted run ends.
  const std::string cmd = resume_command(o.out);
  ASSERT_FALSE(cmd.empty()) << msg;
  Out r = sh(cmd);
  ASSERT_EQ(r.status, 0) << cmd << "\n" << r.out;
  EXPECT_TRUE(contains(r.out, "resume: from " + ckpt + " at step 4")) << r.out;
  EXPECT_EQ(sha(out / "adapter_model.safetensors"), sha(w / "ref" / "adapter_model.safetensors"));

  // resume: auto: "run the same command again", and that command resumes.
  const fs::path out2 = w / "auto";
  o = train(cs, out2, data, "--set checkpoint.resume=auto", "QLORA_FAULT_SIGTERM_AT=4:0");
  ASSERT_EQ(o.status, 75) << o.out;
  EXPECT_TRUE(contains(line_with(o.out, "interrupted:"), "run the same command again to resume: qlora train ")) << o.out;
  r = sh(resume_command(o.out));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "at step 4")) << r.out;
  EXPECT_EQ(sha(out2 / "adapter_model.safetensors"), sha(w / "ref" / "adapter_model.safetensors"));
}

// ---- a resume path that holds no checkpoint ------------------------------------------------------

TEST_F(Cases, ResumePathWithoutCheckpointIsAnError) {
  const std::string cs = "resume-never-says-resume";
  const fs::path w = work / "respath", data = case_dir(cs) / "data.json";
  fs::create_directories(w / "empty");
  struct Bad {
    std::string path, error;
  };
  fs::create_directories(w / "broken" / "checkpoints" / "checkpoint-7");  // no manifest: incomplete
  for (const Bad& b : {Bad{(w / "missing").string(), "does not exist"}, Bad{(w / "empty").string(), "holds no checkpoint"},
                       Bad{(w / "broken").string(), "holds no valid checkpoint"}}) {
    const fs::path out = w / "out";
    Out o = train(cs, out, data, "--set checkpoint.resume=" + b.path);
    EXPECT_EQ(o.status, 1) << o.out;
    const std::string err = line_with(o.out, "error:");
    EXPECT_TRUE(contains(err, "checkpoint.resume: " + b.path) && contains(err, b.error)) << o.out;
    EXPECT_FALSE(fs::exists(out)) << "nothing may be written on a refused resume";
    EXPECT_FALSE(contains(o.out, "step 1/")) << "never a silent fresh start";
  }
  // A run's output_dir, its checkpoints/ dir, or a file inside a checkpoint: the newest valid one.
  Out o = train(cs, w / "src", data, "--set checkpoint.save_steps=2 --set checkpoint.keep_last=3 --set checkpoint.resume=auto",
                "QLORA_FAULT_SIGTERM_AT=5:0");
  ASSERT_EQ(o.status, 75) << o.out;
  const std::string c4 = (w / "src" / "checkpoints" / "checkpoint-4").string();
  const std::string c5 = (w / "src" / "checkpoints" / "checkpoint-5").string();  // the signal's checkpoint
  ASSERT_EQ(names(w / "src" / "checkpoints"), (std::vector<std::string>{"checkpoint-5", "checkpoint-4", "checkpoint-2"}));
  int i = 0;
  for (const auto& [p, want] : std::vector<std::pair<fs::path, std::string>>{
           {w / "src", c5 + " at step 5"}, {w / "src" / "checkpoints", c5 + " at step 5"},
           {fs::path(c4) / "trainer_state.json", c4 + " at step 4"}}) {
    const fs::path out = w / ("from" + std::to_string(i++));
    o = train(cs, out, data, "--set checkpoint.resume=" + p.string());
    EXPECT_EQ(o.status, 0) << o.out;
    EXPECT_TRUE(contains(o.out, "resume: from " + want)) << p << "\n" << o.out;
  }
}

// ---- force-resume-rank-change-raw-error -----------------------------------------------------------

TEST_F(Cases, ForcedResumeWithOtherRankNamesKeyAndShapes) {
  const std::string cs = "force-resume-rank-change-raw-error";
  const fs::path out = work / "rank" / "run", data = case_dir(cs) / "data.json";
  Out o = train(cs, out, data, "", "QLORA_FAULT_SIGTERM_AT=3:0");
  ASSERT_EQ(o.status, 75) << o.out;
  // The refusal names the key, one tensor's shapes and that --force cannot help, with --force or
  // without, before the model loads (trial 9: it offered --force, which then failed after the load).
  const std::string want = "lora.r: 8 -> 4 (lora.r changes the adapter's tensor shapes: " +
                           (out / "checkpoints" / "checkpoint-3" / "adapter_model.safetensors").string() +
                           ": 'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight' has shape [8, 64], "
                           "this run's is [4, 64]; no resume continues other adapter tensors, not even with --force: use "
                           "--overwrite-output-dir to start a new run, or another output_dir)";
  for (const std::string force : {"", " --force"}) {
    o = train(cs, out, data, "--set lora.r=4" + force);
    EXPECT_EQ(o.status, 1) << o.out;
    const std::string err = line_with(o.out, "error:");
    EXPECT_TRUE(contains(err, want)) << o.out;
    EXPECT_FALSE(contains(err, "use --force")) << err;
    EXPECT_FALSE(contains(o.out, "--force: continuing")) << o.out;
    EXPECT_FALSE(contains(err, "The size of tensor")) << err;
  }
  EXPECT_TRUE(qlora::verify_checkpoint((out / "checkpoints" / "checkpoint-3").string()).empty());
}

// ---- no-trainable-token-wrong-reason / empty-eval-set-silent ---------------------------------------

TEST_F(Cases, NoTrainableTokenStatesTheReasonThatApplied) {
  const fs::path data = case_dir("no-trainable-token-wrong-reason") / "data.json";
  Out o = sh(::qlora::test::qlora_bin() + " eval --model " + tiny.string() + " --data " + data.string() +
             " --set data.template=alpaca --set data.sequence_len=32 --set data.truncation=truncate");
  EXPECT_EQ(o.status, 1) << o.out;
  const std::string err = line_with(o.out, "error:");
  EXPECT_TRUE(contains(err, data.string() + ": no example has a trainable token (6 records read, 0 longer than "
                                            "sequence_len 32 (dropped), 6 whose trainable tokens were all past "
                                            "sequence_len 32 (truncated away), 0 without an assistant turn)"))
      << err;
  EXPECT_TRUE(contains(err, "raise data.sequence_len or use data.truncation: drop")) << err;
}

TEST_F(Cases, EmptyEvalSetIsAnErrorWithCountsPerReason) {
  const std::string cs = "empty-eval-set-silent";
  const fs::path ev = case_dir(cs) / "eval_longprompts.json";
  const fs::path out = work / "emptyeval";
  Out o = train(cs, out, case_dir(cs) / "train.jsonl", "--set data.eval=" + ev.string());
  EXPECT_EQ(o.status, 1) << o.out;
  const std::string err = line_with(o.out, "error:");
  EXPECT_TRUE(contains(err, ev.string() + ": data.eval: no eval example is left (6 records read, 0 longer than "
                                          "sequence_len 32 (dropped), 6 whose trainable tokens were all past "
                                          "sequence_len 32 (truncated away), 0 without an assistant turn)"))
      << err;
  EXPECT_FALSE(fs::exists(out)) << "refused before anything is written";
  // With a usable eval file the same run logs eval_loss at every step (eval_steps: 1). The rate
  // is the optimizer step's own: tokens / train_seconds, the eval time only in step_seconds.
  // Each metrics line's wall_time (Unix seconds) and each log line's UTC date-time fall within the
  // run, as the system clock says (trial 17: a clock without date or zone).
  const auto unix_now = [] {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  };
  const double t0 = unix_now();
  o = train(cs, out, case_dir(cs) / "train.jsonl", "--set data.eval=" + (case_dir(cs) / "train.jsonl").string());
  const double t1 = unix_now();
  ASSERT_EQ(o.status, 0) << o.out;
  std::smatch when;
  ASSERT_TRUE(std::regex_search(o.out, when, std::regex(R"((^|\n)\[(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)Z\] )")))
      << o.out;
  std::tm tm{};
  tm.tm_year = std::stoi(when[2]) - 1900;
  tm.tm_mon = std::stoi(when[3]) - 1;
  tm.tm_mday = std::stoi(when[4]);
  tm.tm_hour = std::stoi(when[5]);
  tm.tm_min = std::stoi(when[6]);
  tm.tm_sec = std::stoi(when[7]);
  const double logged = static_cast<double>(timegm(&tm));
  // the banner names the CPU threads (OMP_NUM_THREADS when set)
  std::smatch threads;
  ASSERT_TRUE(std::regex_search(o.out, threads, std::regex(R"(, device cpu \((\d+) threads: OMP_NUM_THREADS\))"))) << o.out;
  if (const char* omp = std::getenv("OMP_NUM_THREADS")) {
    EXPECT_EQ(threads[1].str(), omp) << o.out;
  }
  EXPECT_GE(logged, std::floor(t0)) << when[0];
  EXPECT_LE(logged, t1) << when[0];
  std::ifstream m(out / "metrics.jsonl");
  int evals = 0;
  double last_wall = t0;
  for (std::string l; std::getline(m, l);) {
    const json j = json::parse(l);
    const double wall = j.at("wall_time").get<double>();
    EXPECT_GE(wall, last_wall) << l;
    EXPECT_LE(wall, t1) << l;
    last_wall = wall;
    evals += j.contains("eval_loss");
    const double train_s = j.at("train_seconds").get<double>();
    EXPECT_GT(train_s, 0.0) << l;
    EXPECT_LT(train_s, j.at("step_seconds").get<double>()) << l;
    EXPECT_DOUBLE_EQ(j.at("tokens_per_s").get<double>(), j.at("tokens").get<double>() / train_s) << l;
  }
  EXPECT_EQ(evals, 3);
}

// ---- bnb4-stored-format-overrides-config ---------------------------------------------------------

double eval_loss_of(const Out& o, const fs::path& out_json) {
  if (o.status != 0 || !fs::exists(out_json)) return std::nan("");
  return json::parse(qlora::read_file(out_json.string()))["loss"].get<double>();
}

TEST_F(Cases, StoredBnb4FormatHonoursTheRequest) {
  const std::string cs = "bnb4-stored-format-overrides-config";
  QLORA_REQUIRE_FIXTURE(bnb4, "safety/tiny_bnb4");
  QLORA_REQUIRE_FIXTURE(f16, "safety/tiny");
  const fs::path w = work / "bnb4", data = case_dir(cs) / "data.json";
  auto eval = [&](const fs::path& model, const std::string& set, const std::string& tag) {
    const fs::path j = w / (tag + ".json");
    Out o = sh(::qlora::test::qlora_bin() + " eval --model " + model.string() + " --data " + data.string() +
               " --set data.template=alpaca --set model.dtype=fp32 " + set + " --out " + j.string());
    return std::make_pair(o, eval_loss_of(o, j));
  };
  const auto [o64, l64] = eval(bnb4, "--set quantization.blocksize=64", "bs64");
  ASSERT_EQ(o64.status, 0) << o64.out;
  EXPECT_FALSE(contains(o64.out, "quantization:")) << "the stored format is the requested one: " << o64.out;
  const auto [o128, l128] = eval(bnb4, "--set quantization.blocksize=128", "bs128");
  const auto [o4096, l4096] = eval(bnb4, "--set quantization.blocksize=4096", "bs4096");
  const auto [onodq, lnodq] = eval(bnb4, "--set quantization.double_quant=false", "nodq");
  const auto [onone, lnone] = eval(bnb4, "--set quantization.method=none", "none");
  for (const Out* o : {&o128, &o4096, &onodq, &onone}) ASSERT_EQ(o->status, 0) << o->out;
  EXPECT_TRUE(contains(o128.out, "stored as bitsandbytes nf4 blocksize 64 double_quant true; requantized 14 linears "
                                 "to blocksize 128 double_quant true"))
      << o128.out;
  EXPECT_TRUE(contains(onodq.out, "requantized 14 linears to blocksize 64 double_quant false")) << onodq.out;
  EXPECT_TRUE(contains(onone.out, "dequantized 14 linears to fp32 as configured (quantization.method: none")) << onone.out;
  // Each request changes what runs (the stored weights no longer override it) ...
  EXPECT_NE(l128, l64);
  EXPECT_NE(l4096, l64);
  EXPECT_NE(l4096, l128);
  // ... and method none computes with exactly the stored 4-bit values, dequantized once.
  EXPECT_NEAR(lnone, l64, 1e-5);
  std::cout << "bnb4 stored nf4/64/dq; requested 64: " << l64 << ", 128: " << l128 << ", 4096: " << l4096
            << ", no double quant: " << lnodq << ", none: " << lnone << "\n";
  // train: the log says what was done and config.resolved.yaml records what was used (blocksize 128).
  Out t = train(cs, w / "run", data, "--set model.path=" + bnb4.string());
  ASSERT_EQ(t.status, 0) << t.out;
  EXPECT_TRUE(contains(t.out, "requantized 14 linears to blocksize 128")) << t.out;
  const std::string resolved = qlora::read_file((w / "run" / "config.resolved.yaml").string());
  EXPECT_TRUE(contains(resolved, "blocksize: 128")) << resolved;
}

// Another quant type than the stored one is refused in one line that names quantization.method and
// where it was set (a --set, or the config file's line), as other config errors do.
TEST_F(Cases, StoredBnb4OtherMethodNamesTheKeyAndItsSource) {
  const std::string cs = "bnb4-stored-format-overrides-config";
  QLORA_REQUIRE_FIXTURE(bnb4, "safety/tiny_bnb4");
  const fs::path w = work / "bnb4_method", data = case_dir(cs) / "data.json";
  fs::create_directories(w);
  const std::string tail = "quantization.method: fp4 was requested, but " + (bnb4 / "config.json").string() +
                           ": the checkpoint is stored as bitsandbytes nf4 (method nf4 uses it as stored; none "
                           "dequantizes it)\n";
  Out e = sh(::qlora::test::qlora_bin() + " eval --model " + bnb4.string() + " --data " + data.string() +
             " --set data.template=alpaca --set quantization.method=fp4 --out " + (w / "e.json").string());
  EXPECT_EQ(e.status, 1) << e.out;
  EXPECT_TRUE(contains(e.out, "error: --set quantization.method=fp4: " + tail)) << e.out;
  const fs::path cfg = w / "fp4.yaml";
  std::ofstream(cfg) << "model:\n  path: " << bnb4.string() << "\nquantization:\n  method: fp4\ndata:\n  train: "
                     << data.string() << "\n  template: alpaca\noutput_dir: " << (w / "run").string() << "\n";
  Out t = sh(::qlora::test::qlora_bin() + " train " + cfg.string());
  EXPECT_EQ(t.status, 1) << t.out;
  EXPECT_TRUE(contains(t.out, "error: " + cfg.string() + ":4: " + tail)) << t.out;
  // inspect / generate take the type from --quant, and say so
  Out i = sh(::qlora::test::qlora_bin() + " inspect " + bnb4.string() + " --quant fp4");
  EXPECT_EQ(i.status, 1) << i.out;
  EXPECT_EQ(i.out, "error: --quant fp4 was requested, but " + tail.substr(tail.find(", but ") + 6));
}

// ---- peft-regex-or-layers-adapter-rejected -------------------------------------------------------

TEST(PeftTargets, MatchesPeftCheckTargetModuleExists) {
  qlora::PeftConfig c;
  const std::string v1 = "model.layers.1.self_attn.v_proj", d0 = "model.layers.0.mlp.down_proj";
  c.target_regex = R"(.*layers\.1\.(self_attn\.v_proj|mlp\.down_proj))";
  EXPECT_TRUE(qlora::peft_targets_module(c, v1));
  EXPECT_FALSE(qlora::peft_targets_module(c, d0));
  EXPECT_FALSE(qlora::peft_targets_module(c, v1 + ".x")) << "re.fullmatch, not re.search";
  c = {};
  c.target_modules = {"v_proj", "down_proj"};
  c.layers_to_transform = {1};
  EXPECT_TRUE(qlora::peft_targets_module(c, v1));
  EXPECT_FALSE(qlora::peft_targets_module(c, d0));
  c.target_modules = {"v_proj", d0};  // an exact full path ignores layers_to_transform (as PEFT)
  EXPECT_TRUE(qlora::peft_targets_module(c, d0));
  c.target_modules = {"q_proj"};
  c.layers_pattern = {"blocks"};  // no "blocks.<n>." component: no layer index, no match
  EXPECT_FALSE(qlora::peft_targets_module(c, "model.layers.1.self_attn.q_proj"));
  c.layers_pattern = {"blocks", "layers"};
  EXPECT_TRUE(qlora::peft_targets_module(c, "model.layers.1.self_attn.q_proj"));
  c = {};
  c.target_modules = {"all-linear"};
  c.exclude_modules = {"k_proj"};
  EXPECT_TRUE(qlora::peft_targets_module(c, "model.layers.0.self_attn.o_proj"));
  EXPECT_FALSE(qlora::peft_targets_module(c, "model.layers.0.self_attn.k_proj"));
  c.target_regex = "(";
  EXPECT_THROW(qlora::peft_targets_module(c, v1), qlora::Error);
}

TEST(PeftTargets, AdaptersLoadAndMergeAsPeft) {
  QLORA_REQUIRE_FIXTURE(dir, "safety");
  const json refs = json::parse(qlora::read_file((dir / "refs.json").string()));
  qlora::st::SafetensorsFile rf((dir / "refs.safetensors").string());
  const torch::Tensor ids = qlora::load_tensor(rf, rf.info("input_ids")).to(torch::kLong);
  const fs::path w = qlora::test::fresh_temp_dir("peft_targets");
  const fs::path data = qlora::test::shared_dir() / "cases/peft-regex-or-layers-adapter-rejected/data.json";
  if (!fs::exists(data)) FAIL() << "missing " << data;
  for (const std::string name : {"regex", "layers_to_transform", "layers_pattern", "exclude", "list"}) {
    const fs::path ad = dir / "adapters" / name;
    // The modules PEFT adapted, and the logits of the PEFT model.
    qlora::LlamaModel m = qlora::LlamaModel::load((dir / "tiny").string(), torch::kFloat32, torch::kCPU);
    const qlora::PeftConfig pc = qlora::attach_peft_adapter(m, ad.string());
    std::vector<std::string> adapted;
    for (const auto& [mod, shape] : qlora::peft_module_shapes(m, pc)) adapted.push_back(mod);
    EXPECT_EQ(json(adapted), refs[name]["modules"]) << name;
    torch::NoGradGuard ng;
    qlora::ForwardInputs in;
    in.input_ids = ids;
    const torch::Tensor logits = m.forward(in);
    const torch::Tensor want = qlora::load_tensor(rf, rf.info(name + ".logits"));
    EXPECT_LT((logits - want).abs().max().item<double>(), 1e-4) << name;
    // qlora eval on the case's data: PEFT's loss.
    const fs::path ej = w / (name + ".json");
    Out o = sh(::qlora::test::qlora_bin() + " eval --model " + (dir / "tiny").string() + " --data " + data.string() +
               " --adapter " + ad.string() + " --set data.template=alpaca --set model.dtype=fp32 " +
               "--set quantization.method=none --out " + ej.string());
    ASSERT_EQ(o.status, 0) << name << ": " << o.out;
    const double loss = json::parse(qlora::read_file(ej.string()))["loss"].get<double>();
    EXPECT_NEAR(loss, refs[name]["eval_loss"].get<double>(), 1e-4) << name;
    // qlora merge: PEFT's merge_and_unload weights.
    const fs::path md = w / ("merged_" + name);
    o = sh(::qlora::test::qlora_bin() + " merge --base " + (dir / "tiny").string() + " --adapter " + ad.string() +
           " --out " + md.string() + " --dtype fp32");
    ASSERT_EQ(o.status, 0) << name << ": " << o.out;
    qlora::st::SafetensorsFile mf((md / "model.safetensors").string());
    for (const auto& mod : refs[name]["modules"]) {
      const std::string k = mod.get<std::string>();
      const torch::Tensor got = qlora::load_tensor(mf, mf.info(k + ".weight"));
      const torch::Tensor ref = qlora::load_tensor(rf, rf.info(name + ".merged." + k));
      EXPECT_LT((got - ref).abs().max().item<double>(), 1e-6) << name << " " << k;
    }
    std::cout << "PEFT adapter " << name << ": " << adapted.size() << " modules, eval loss " << loss << " (PEFT "
              << refs[name]["eval_loss"].get<double>() << ")\n";
  }
  qlora::remove_tree(w);
}

// ---- metrics-lost-on-enospc: a real small filesystem filled during the run ----------------------

/// A tmpfs of `kib` KiB mounted at `dir` for the test's lifetime. Mounting needs root (CI runs as
/// root); when it is not permitted the test FAILS (never skips): the behaviour must be checked.
struct Tmpfs {
  fs::path dir;
  bool ok = false;
  std::string why;
  Tmpfs(const fs::path& d, int kib) : dir(d) {
    fs::create_directories(dir);
    const std::string opts = "size=" + std::to_string(kib) + "k";
    ok = ::mount("tmpfs", dir.c_str(), "tmpfs", 0, opts.c_str()) == 0;
    if (!ok) why = std::strerror(errno);
  }
  ~Tmpfs() {
    if (ok) ::umount2(dir.c_str(), MNT_DETACH);
  }
  /// Fills the filesystem completely (a file written until ENOSPC).
  void fill() const {
    std::FILE* f = std::fopen((dir / "filler").c_str(), "wb");
    if (!f) return;
    std::vector<char> buf(4096, 'x');
    while (std::fwrite(buf.data(), 1, buf.size(), f) == buf.size() && std::fflush(f) == 0) {}
    std::fclose(f);
  }
  void free_space() const { fs::remove(dir / "filler"); }
};

/// Starts `cmd` (stdout+stderr to `log`) in the background; returns its pid.
pid_t start(const std::string& cmd, const fs::path& log) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", (cmd + " > " + log.string() + " 2>&1").c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}
bool wait_for_line(const fs::path& log, const std::string& needle, pid_t pid) {
  for (int i = 0; i < 6000; ++i) {
    if (fs::exists(log) && contains(qlora::read_file(log.string()), needle)) return true;
    int st;
    if (::waitpid(pid, &st, WNOHANG) == pid) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}
int wait_exit(pid_t pid) {
  int st = 0;
  ::waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
std::vector<int64_t> metric_steps(const fs::path& out) {
  std::vector<int64_t> s;
  std::ifstream in(out / "metrics.jsonl");
  for (std::string l; std::getline(in, l);) s.push_back(json::parse(l)["step"].get<int64_t>());
  return s;
}

TEST_F(Cases, DiskFullDuringTheRunIsAnErrorAndNoLineIsLost) {
  const std::string cs = "metrics-lost-on-enospc";
  const fs::path w = work / "enospc", data = case_dir(cs) / "data.json";
  Tmpfs mnt(w / "mnt", 4096);
  ASSERT_TRUE(mnt.ok) << "cannot mount a tmpfs at " << mnt.dir << " (" << mnt.why
                      << "): this test needs root (CI runs as root) and must not be skipped";
  const fs::path out = mnt.dir / "run";
  const std::string slow = "QLORA_FAULT_STEP_DELAY_MS=100";
  auto cmd = [&](const std::string& extra) {
    return slow + " " + ::qlora::test::qlora_bin() + " train " + (case_dir(cs) / "config.yaml").string() + " --set output_dir=" +
           out.string() + " --set model.path=" + tiny.string() + " --set data.train=" + data.string() + " " + extra;
  };
  // 1. The case as given (save_steps 0; the only checkpoint is the end of epoch 0 at step 10): the
  // disk fills after step 3; the run stops at the first failing write (a metrics line, or that
  // checkpoint) naming the file, keeps every line before it, and writes no summary.
  fs::path log = w / "1.log";
  pid_t pid = start(cmd(""), log);
  ASSERT_TRUE(wait_for_line(log, "step 3/", pid)) << qlora::read_file(log.string());
  mnt.fill();
  int rc = wait_exit(pid);
  std::string text = qlora::read_file(log.string());
  EXPECT_EQ(rc, 1) << text;
  std::string err = line_with(text, "error:");
  EXPECT_TRUE(contains(err, "cannot write " + out.string() + "/") && contains(err, ": No space left on device")) << text;
  EXPECT_FALSE(fs::exists(out / "summary.json")) << "no summary may claim a complete run";
  const auto partial = metric_steps(out);
  for (size_t i = 0; i < partial.size(); ++i) EXPECT_EQ(partial[i], int64_t(i + 1)) << "no line lost before the error";
  std::cout << "disk full, no checkpoints: " << err << " (" << partial.size() << " lines kept)\n";
  mnt.free_space();

  // 2. With checkpoints (every 2 steps, resume: auto): the disk fills after step 7; the run stops
  // naming the file, the last complete checkpoint stays valid, and after space comes back the
  // same command resumes and ends with one metrics line per step and an honest summary.
  const std::string ck = "--set checkpoint.save_steps=2 --set checkpoint.resume=auto";
  log = w / "2.log";
  pid = start(cmd(ck + " --overwrite-output-dir"), log);
  ASSERT_TRUE(wait_for_line(log, "step 7/", pid)) << qlora::read_file(log.string());
  mnt.fill();
  rc = wait_exit(pid);
  text = qlora::read_file(log.string());
  EXPECT_EQ(rc, 1) << text;
  err = line_with(text, "error:");
  EXPECT_TRUE(contains(err, "cannot write " + out.string()) && contains(err, "No space left on device")) << text;
  std::vector<std::string> skipped;
  const std::string last = qlora::newest_valid_checkpoint((out / "checkpoints").string(), &skipped);
  ASSERT_FALSE(last.empty()) << "the last good checkpoint must survive";
  EXPECT_TRUE(skipped.empty()) << skipped[0];
  std::cout << "disk full with checkpoints: " << err << "; newest valid " << last << "\n";
  mnt.free_space();
  Out o = sh(cmd(ck));
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_TRUE(contains(o.out, "resume: from " + last)) << o.out;
  std::vector<int64_t> want(30);
  for (int i = 0; i < 30; ++i) want[size_t(i)] = i + 1;
  EXPECT_EQ(metric_steps(out), want);
  const json s = json::parse(qlora::read_file((out / "summary.json").string()));
  EXPECT_EQ(s["steps"], 30);
  EXPECT_EQ(s["metrics_lines"], 30);
  EXPECT_EQ(s["metrics_complete"], true);
}

// ---- decided before the model loads (a 7B load takes minutes) -----------------------------------

/// A copy of the cases' tiny model with model.safetensors cut to 100 bytes: a run that opens it
/// fails naming model.safetensors, so an error without that name came before the load.
fs::path broken_model(const fs::path& tiny, const fs::path& w) {
  const fs::path broken = w / "broken_model";
  if (!fs::exists(broken)) {
    fs::copy(tiny, broken, fs::copy_options::recursive);
    fs::resize_file(broken / "model.safetensors", 100);
  }
  return broken;
}

// Resuming with changed batch settings is refused from the checkpoint's trainer_state.json before
// the model loads (the model here would not even load); when micro_batch_size x
// gradient_accumulation_steps x WORLD_SIZE stays the same the refusal says so and that --force
// resumes, and --force does.
TEST_F(Cases, ResumeWithChangedSettingsIsRefusedBeforeTheModelLoads) {
  const std::string cs = "stale-checkpoints-mix-runs";
  const fs::path w = work / "refused_early", data = case_dir(cs) / "data_v1.json", out = w / "run";
  fs::create_directories(w);
  Out o = train(cs, out, data, "", "QLORA_FAULT_SIGTERM_AT=3:0");  // micro 2 x accumulation 1; checkpoint-3
  ASSERT_EQ(o.status, 75) << o.out;
  const std::string broken = " --set model.path=" + broken_model(tiny, w).string();
  const std::string ckpt = (out / "checkpoints" / "checkpoint-3").string();

  // Accumulation 1 -> 2: another global batch (2 -> 4 rows).
  o = train(cs, out, data, "--set training.gradient_accumulation_steps=2" + broken);
  EXPECT_EQ(o.status, 1) << o.out;
  std::string err = line_with(o.out, "error:");
  // (model.path differs too: the broken copy, a run-meaning key)
  EXPECT_TRUE(contains(err, "resume from " + ckpt + " refused: settings that change the run differ: ") &&
              contains(err, "; training.gradient_accumulation_steps: 1 -> 2 (use --force"))
      << o.out;
  // (the broken copy differs in its weights, which the refusal names: model_file_digests)
  EXPECT_TRUE(contains(err, "model.path: " + tiny.string() + " -> " + broken_model(tiny, w).string() +
                            " (another model: model.safetensors differs)"))
      << o.out;
  EXPECT_FALSE(contains(o.out, "memory estimate:")) << "refused only after the model load:\n" << o.out;

  // Micro-batch 2 -> 1 and accumulation 1 -> 2: the same 2 rows per optimizer step.
  const std::string same = "--set training.micro_batch_size=1 --set training.gradient_accumulation_steps=2";
  o = train(cs, out, data, same + broken);
  EXPECT_EQ(o.status, 1) << o.out;
  err = line_with(o.out, "error:");
  EXPECT_TRUE(contains(err, "training.gradient_accumulation_steps: 1 -> 2") &&
              contains(err, "training.micro_batch_size: 2 -> 1"))
      << o.out;
  EXPECT_TRUE(contains(err, "; the global batch (micro_batch_size x gradient_accumulation_steps x WORLD_SIZE) is "
                            "unchanged at 2 rows, so --force resumes it: the data continues at the same global sample "
                            "(use --force to resume anyway"))
      << o.out;
  EXPECT_FALSE(contains(o.out, "memory estimate:")) << o.out;

  o = train(cs, out, data, same + " --force");
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_TRUE(contains(o.out, "resume: --force: continuing although settings differ: ")) << o.out;
  EXPECT_TRUE(contains(o.out, "resume: from " + ckpt + " at step 3")) << o.out;
}

// An output_dir that cannot be created or written is refused before the model loads: its parent a
// regular file (ENOTDIR, root included), or on a read-only file system (EROFS, root included).
TEST_F(Cases, AnUnwritableOutputDirIsRefusedBeforeTheModelLoads) {
  const std::string cs = "stale-checkpoints-mix-runs";
  const fs::path w = work / "unwritable", data = case_dir(cs) / "data_v1.json";
  fs::create_directories(w);
  const std::string broken = " --set model.path=" + broken_model(tiny, w).string();
  qlora::atomic_write_string((w / "a_file").string(), "not a directory\n");
  fs::path out = w / "a_file" / "run";
  Out o = train(cs, out, data, broken);
  EXPECT_EQ(o.status, 1) << o.out;
  EXPECT_TRUE(contains(line_with(o.out, "error:"), "output_dir: cannot create " + out.string() + ": " +
                                                       (w / "a_file").string() + " is not a directory"))
      << o.out;
  EXPECT_FALSE(contains(o.out, "model.safetensors")) << o.out;

  const fs::path ro = w / "ro";
  fs::create_directories(ro);
  ASSERT_EQ(::mount("tmpfs", ro.c_str(), "tmpfs", MS_RDONLY, "size=64k"), 0)
      << "cannot mount a read-only tmpfs at " << ro << " (" << std::strerror(errno)
      << "): this test needs root (CI runs as root) and must not be skipped";
  out = ro / "x" / "run";
  o = train(cs, out, data, broken);
  ::umount2(ro.c_str(), MNT_DETACH);
  EXPECT_EQ(o.status, 1) << o.out;
  EXPECT_TRUE(contains(line_with(o.out, "error:"), "output_dir: cannot create " + out.string() + ": " + ro.string() +
                                                       ": Read-only file system"))
      << o.out;
  EXPECT_FALSE(contains(o.out, "model.safetensors")) << o.out;

  // --overwrite-output-dir renames a used output_dir aside: a writable output_dir in a read-only
  // folder (a writable mount inside a read-only one) is refused before the load too.
  const fs::path rop = w / "ro_parent", used = rop / "run";
  fs::create_directories(rop);
  ASSERT_EQ(::mount("tmpfs", rop.c_str(), "tmpfs", 0, "size=64k"), 0) << std::strerror(errno);
  fs::create_directories(used);
  const bool remounted = ::mount("tmpfs", rop.c_str(), "tmpfs", MS_REMOUNT | MS_RDONLY, "size=64k") == 0 &&
                         ::mount("tmpfs", used.c_str(), "tmpfs", 0, "size=64k") == 0;
  if (remounted) qlora::atomic_write_string((used / "notes.txt").string(), "an earlier run's notes\n");
  o = train(cs, used, data, broken + " --overwrite-output-dir");
  ::umount2(used.c_str(), MNT_DETACH);
  ::umount2(rop.c_str(), MNT_DETACH);
  ASSERT_TRUE(remounted) << std::strerror(errno);
  EXPECT_EQ(o.status, 1) << o.out;
  const std::string err = line_with(o.out, "error:");
  EXPECT_TRUE(contains(err, "output_dir: cannot move " + used.string() + " aside to " + used.string() + ".old-") &&
              contains(err, " (--overwrite-output-dir): " + rop.string() + ": Read-only file system"))
      << o.out;
  EXPECT_FALSE(contains(o.out, "model.safetensors")) << o.out;
}

// A checkpoint that cannot be written (a full disk; test hook) stops the run naming the file, and
// says which checkpoint survives and which steps a resume redoes; the resume does.
TEST_F(Cases, AFailedCheckpointWriteNamesTheCheckpointThatSurvives) {
  const std::string cs = "stale-checkpoints-mix-runs";
  const fs::path w = work / "ckpt_enospc", data = case_dir(cs) / "data_v1.json", out = w / "run";
  fs::create_directories(w);
  Out o = train(cs, out, data, "", "QLORA_FAULT_CHECKPOINT_ENOSPC_AT=4");  // checkpoint-2 written, checkpoint-4 fails
  EXPECT_EQ(o.status, 1) << o.out;
  const std::string err = line_with(o.out, "error:");
  EXPECT_TRUE(contains(err, "cannot write " + (out / "checkpoints").string() + "/.tmp-checkpoint-4-") &&
              contains(err, "/optimizer.safetensors: No space left on device"))
      << o.out;
  EXPECT_TRUE(contains(err, "; checkpoint-4 was not written: checkpoint-2 stays the newest, and a resume redoes "
                            "steps 3..4"))
      << o.out;
  EXPECT_EQ(names(out / "checkpoints"), (std::vector<std::string>{"checkpoint-2"}));
  o = train(cs, out, data);
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_TRUE(contains(o.out, "resume: from " + (out / "checkpoints" / "checkpoint-2").string() + " at step 2")) << o.out;

  // No checkpoint before the failing one: a resume starts again from step 0.
  o = train(cs, w / "run0", data, "", "QLORA_FAULT_CHECKPOINT_ENOSPC_AT=2");
  EXPECT_EQ(o.status, 1) << o.out;
  EXPECT_TRUE(contains(line_with(o.out, "error:"), "; checkpoint-2 was not written: no earlier checkpoint of this run, "
                                                   "so a resume starts again from step 0"))
      << o.out;
  // status.json says so for a job wrapper: failed, exit code 1, the error line, no checkpoint
  const json st = json::parse(qlora::read_file((w / "run0" / "status.json").string()));
  EXPECT_EQ(st["state"], "failed") << st.dump(1);
  EXPECT_EQ(st["exit_code"], 1) << st.dump(1);
  EXPECT_EQ("error: " + st["message"].get<std::string>(), line_with(o.out, "error:")) << st.dump(1);
  EXPECT_TRUE(st["last_checkpoint"].is_null()) << st.dump(1);
  EXPECT_EQ(st["pid"].get<int64_t>() > 0 && !st["host"].get<std::string>().empty(), true) << st.dump(1);
}

TEST(Eta, DurationsAreUnambiguousBesideAClock) {
  // "08:00" beside "[07:14:37]" read as a time of day; units make it a duration.
  EXPECT_EQ(qlora::format_duration(0), "0s");
  EXPECT_EQ(qlora::format_duration(44.6), "45s");
  EXPECT_EQ(qlora::format_duration(480), "8m00s");
  EXPECT_EQ(qlora::format_duration(3599.4), "59m59s");
  EXPECT_EQ(qlora::format_duration(3720), "1h02m");
  EXPECT_EQ(qlora::format_duration(96000), "26h40m");
  EXPECT_EQ(qlora::format_duration(-5), "0s");
}

}  // namespace
