// Spot-safe runs: a run stopped by SIGTERM at step k and resumed ends with an adapter
// byte-identical to the uninterrupted run's and the same loss / lr at every step; the second
// process runs only steps k+1.. and metrics.jsonl holds each step once; corrupt newest
// checkpoints are skipped; changed run-meaning settings are refused. Tiny model, CPU, LoRA dropout
// on and gradient checkpointing on (so RNG restore is exercised).
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <sys/wait.h>

#include "common/error.h"
#include "common/files.h"
#include "test_util.h"
#include "tiny_run.h"
#include "trainer/checkpoint.h"
#include "trainer/train.h"

namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;

using Out = qlora::test::CommandResult;
Out sh(const std::string& cmd) { return qlora::test::run_command(cmd); }

class Resume : public qlora::test::TinyRunSuite<Resume> {
 public:
  static constexpr const char* kTempName = "resume";
  static constexpr int kSaveSteps = 0;

 protected:
  static Out train(const fs::path& out, const std::string& extra = "", const std::string& env = "") {
    return sh(env + " " + ::qlora::test::qlora_bin() + " train " + (root / "run.yaml").string() + " --set output_dir=" + out.string() +
              " " + extra);
  }
  // The raw lines of metrics.jsonl.
  static std::vector<std::string> metric_lines(const fs::path& out) {
    std::vector<std::string> v;
    std::ifstream in(out / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) v.push_back(line);
    return v;
  }
  // step → (loss, lr) from metrics.jsonl; fails the test when a step appears twice or the steps
  // are not 1, 2, ..., n in order.
  static std::map<int64_t, std::pair<double, double>> metrics(const fs::path& out) {
    std::map<int64_t, std::pair<double, double>> m;
    int64_t expect = 1;
    for (const std::string& line : metric_lines(out)) {
      json j = json::parse(line);
      const int64_t step = j["step"].get<int64_t>();
      EXPECT_EQ(step, expect) << out << ": metrics.jsonl steps must be 1, 2, ... each once";
      ++expect;
      EXPECT_TRUE(m.emplace(step, std::make_pair(j["loss"].get<double>(), j["lr"].get<double>())).second)
          << out << ": step " << step << " twice in metrics.jsonl";
    }
    return m;
  }
  // The optimizer steps a run's log reports ("step N/T" lines, logging_steps 1), in order.
  static std::vector<int64_t> logged_steps(const std::string& log) {
    std::vector<int64_t> v;
    static const std::regex re(R"(step (\d+)/\d+ )");
    for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator(); ++it)
      v.push_back(std::stoll((*it)[1]));
    return v;
  }
};

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
    const std::vector<std::string> first_lines = metric_lines(out);
    const std::vector<int64_t> first_steps = logged_steps(o.out);
    o = train(out);
    ASSERT_EQ(o.status, 0) << s.name << ": " << o.out;
    // A resume, not a restart: from the stop step K, the second process runs exactly K+1 .. 18,
    // and the first process's metrics lines for 1 .. K are kept byte for byte (their timings
    // would differ if recomputed); each step is in metrics.jsonl once.
    std::smatch at;
    ASSERT_TRUE(std::regex_search(o.out, at, std::regex(R"(resume: from \S+ at step (\d+))"))) << o.out;
    const int64_t k = std::stoll(at[1]);
    ASSERT_GE(k, 1) << s.name;
    ASSERT_EQ(first_lines.size(), static_cast<size_t>(k)) << s.name << ": the stopped run logged steps past its checkpoint";
    std::vector<int64_t> expect_first, expect_second;
    for (int64_t i = 1; i <= k; ++i) expect_first.push_back(i);
    for (int64_t i = k + 1; i <= 18; ++i) expect_second.push_back(i);
    EXPECT_EQ(first_steps, expect_first) << s.name;
    EXPECT_EQ(logged_steps(o.out), expect_second) << s.name << ": the resumed process must run only the remaining steps\n"
                                                  << o.out;
    const std::vector<std::string> final_lines = metric_lines(out);
    ASSERT_EQ(final_lines.size(), 18u) << s.name;
    for (int64_t i = 0; i < k; ++i) EXPECT_EQ(final_lines[i], first_lines[i]) << s.name << " metrics line " << i + 1;
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

// summary.json covers every invocation of a run (wall time from the checkpoints' train_seconds,
// interruptions counted across resumes); the same command after the run ended changes nothing.
// A baseline `qlora eval` output (eval_base.json, or eval.json as it was named before) does not
// make output_dir "used".
TEST_F(Resume, SummaryCountsEveryInvocationAndAFinishedRunIsLeftAlone) {
  const fs::path out = root / "summary";
  fs::create_directories(out);
  std::ofstream(out / "eval.json") << "{\"loss\": 2.5}\n";
  std::ofstream(out / "eval_base.json") << "{\"loss\": 2.5}\n";
  Out o = train(out, "", "QLORA_FAULT_SIGTERM_AT=3:0");
  ASSERT_EQ(o.status, 75) << o.out;
  o = train(out, "", "QLORA_FAULT_SIGTERM_AT=8:0");
  ASSERT_EQ(o.status, 75) << o.out;
  const auto ckpts = qlora::list_checkpoints((out / "checkpoints").string());
  ASSERT_FALSE(ckpts.empty());
  const json state = json::parse(qlora::read_file((fs::path(ckpts[0]) / "trainer_state.json").string()));
  EXPECT_EQ(state["step"], 8);
  EXPECT_EQ(state["interruptions"], 1);
  EXPECT_GT(state["train_seconds"].get<double>(), 0.0);
  o = train(out);
  ASSERT_EQ(o.status, 0) << o.out;
  const json s = json::parse(qlora::read_file((out / "summary.json").string()));
  EXPECT_EQ(s["preemption"]["interruptions"], 2);
  EXPECT_GT(s["wall_seconds"].get<double>(), state["train_seconds"].get<double>());
  EXPECT_DOUBLE_EQ(s["tokens_per_s"].get<double>(), s["input_tokens"].get<double>() / s["wall_seconds"].get<double>());
  // once more: nothing to do, nothing rewritten
  std::map<std::string, std::string> before;
  for (const char* f : {"summary.json", "memory_report.json", "metrics.jsonl", "adapter_model.safetensors", "eval.json"})
    before[f] = qlora::read_file((out / f).string());
  o = train(out);
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_NE(o.out.find("is already complete (18 of 18 steps)"), std::string::npos) << o.out;
  for (const auto& [f, bytes] : before) EXPECT_EQ(qlora::read_file((out / f).string()), bytes) << f << " was rewritten";
  // Extending the finished run (more steps) continues it without an interruption: its last
  // checkpoint was at its own last step (a trial saw interruptions go up by one here).
  o = train(out, "--set training.max_steps=20");
  ASSERT_EQ(o.status, 0) << o.out;
  const json ext = json::parse(qlora::read_file((out / "summary.json").string()));
  EXPECT_EQ(ext["preemption"]["interruptions"], 2) << ext.dump();
}

// training.eval_steps 0 evaluates at the end of each epoch (transformers' eval_strategy "epoch"),
// and after the last step: eval_loss on steps 6, 12, 18 of the 3 × 6-step run and on no other.
// summary.json: target_tokens (the label tokens trained) = `qlora data preview`'s trainable
// tokens × 3 epochs (preview's counts are tested against transformers in tests/data), and
// input_tokens its total tokens × 3 (no padding counted), both also the sums of the metrics lines;
// train_loss the mean of the 18 step losses (transformers' TrainOutput.training_loss =
// tr_loss / global_step), final_loss step 18's, eval_loss step 18's.
// A run counted in epochs whose warmup covers all its steps is warned of, with the learning rate its
// last step gets (a trial: only a max_steps run was; a 3-step run ran at 0, 2e-4, 4e-4 of 1e-3).
TEST_F(Resume, AnEpochRunThatNeverLeavesWarmupIsWarnedOf) {
  const fs::path out = root / "all_warmup";
  const Out o = train(out, "--set training.warmup_steps=18 --set training.lr_scheduler=linear");
  ASSERT_EQ(o.status, 0) << o.out;
  const auto m = metrics(out);
  ASSERT_EQ(m.size(), 18u) << o.out;
  std::ostringstream last_lr;
  last_lr << m.at(18).second;  // 17/18 of 1e-3, as the log writes a double
  EXPECT_NE(o.out.find("warning: train: training.warmup_steps warmup (18 steps) >= the run's 18 optimizer steps (3 "
                       "epochs): the run never leaves warmup, its last step at " + last_lr.str() + " of "
                       "training.learning_rate 0.001 (set a smaller training.warmup_steps or training.warmup_ratio)"),
            std::string::npos) << o.out;
  EXPECT_NEAR(m.at(18).second, 1e-3 * 17 / 18, 1e-15);
  // the QLoRA paper's warmup_ratio 0.03 on a 1-step run: ceil(0.03) = 1 step of warmup, at lr 0
  const fs::path one = root / "ratio_one_step";
  const Out r = train(one, "--set training.warmup_steps=0 --set training.warmup_ratio=0.03 --set training.max_steps=1");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("warning: train: training.warmup_ratio's warmup (1 step) >= the run's 1 optimizer step "
                       "(training.max_steps): the run never leaves warmup, its last step at 0 of"),
            std::string::npos) << r.out;
}

TEST_F(Resume, EvalStepsZeroEvaluatesAtEachEpochEndAndSummaryCountsTargets) {
  const fs::path out = root / "epoch_eval";
  Out o = train(out, "--set training.eval_steps=0 --set data.eval=" + (root / "data.json").string());
  ASSERT_EQ(o.status, 0) << o.out;
  std::vector<int64_t> evaluated;
  int64_t tokens = 0, targets = 0;
  double loss_sum = 0, last_loss = 0, last_eval = 0;
  for (const std::string& line : metric_lines(out)) {
    const json j = json::parse(line);
    if (j.contains("eval_loss")) evaluated.push_back(j["step"].get<int64_t>()), last_eval = j["eval_loss"].get<double>();
    tokens += j["tokens"].get<int64_t>();
    targets += j["target_tokens"].get<int64_t>();
    loss_sum += j["loss"].get<double>();
    last_loss = j["loss"].get<double>();
  }
  EXPECT_EQ(evaluated, (std::vector<int64_t>{6, 12, 18})) << o.out;
  EXPECT_EQ(o.out.find("never leaves warmup"), std::string::npos) << o.out;  // warmup 2 of 18 steps
  // A CPU run's estimate line says it counts tensors only (RSS runs higher).
  EXPECT_NE(qlora::test::line_with(o.out, "memory estimate: ").find("on the CPU that is tensors only"),
            std::string::npos) << o.out;
  // memory_report.json: the first evaluation pass is a phase of its own, after the first step's.
  const json mem = json::parse(qlora::read_file((out / "memory_report.json").string()));
  ASSERT_TRUE(mem["phases"].contains("after_first_eval")) << mem.dump();
  EXPECT_GE(mem["phases"]["after_first_eval"]["peak_rss_bytes"].get<int64_t>(),
            mem["phases"]["after_first_step"]["peak_rss_bytes"].get<int64_t>());
  o = sh(::qlora::test::qlora_bin() + " data preview " + (root / "run.yaml").string() + " --n 0");
  ASSERT_EQ(o.status, 0) << o.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(o.out, m, std::regex(R"(tokens \(train\): (\d+) total, (\d+) trainable)"))) << o.out;
  const int64_t total = std::stoll(m[1]), trainable = std::stoll(m[2]);
  ASSERT_GT(trainable, 0);
  ASSERT_LT(trainable, total);
  const json s = json::parse(qlora::read_file((out / "summary.json").string()));
  EXPECT_EQ(s["target_tokens"].get<int64_t>(), 3 * trainable);
  EXPECT_EQ(s["target_tokens"].get<int64_t>(), targets);
  EXPECT_EQ(s["input_tokens"].get<int64_t>(), 3 * total);
  EXPECT_EQ(s["input_tokens"].get<int64_t>(), tokens);
  EXPECT_FALSE(s.contains("tokens_trained"));
  EXPECT_NEAR(s["train_loss"].get<double>(), loss_sum / 18, 1e-12);
  EXPECT_EQ(s["final_loss"].get<double>(), last_loss);
  EXPECT_EQ(s["eval_loss"].get<double>(), last_eval);
  EXPECT_EQ(s["steps_this_invocation"], 18);
  // best_eval: the lowest eval_loss of metrics.jsonl, its step, and that step's checkpoint while kept.
  int64_t best_step = -1;
  double best = 0;
  for (const std::string& line : metric_lines(out)) {
    const json j = json::parse(line);
    if (j.contains("eval_loss") && (best_step < 0 || j["eval_loss"].get<double>() < best))
      best = j["eval_loss"].get<double>(), best_step = j["step"].get<int64_t>();
  }
  ASSERT_TRUE(s.contains("best_eval")) << s.dump(2);
  EXPECT_EQ(s["best_eval"]["step"], best_step);
  EXPECT_EQ(s["best_eval"]["eval_loss"].get<double>(), best);
  const fs::path best_ck = out / "checkpoints" / ("checkpoint-" + std::to_string(best_step));
  if (fs::exists(best_ck)) EXPECT_EQ(s["best_eval"]["checkpoint"], best_ck.string());
  else EXPECT_TRUE(s["best_eval"]["checkpoint"].is_null()) << s.dump(2);
}

// A finished run resumed into a NEW output_dir (checkpoint.resume: the run) runs no step: it says
// the run is complete at step 18 and writes the run's adapter (byte-identical), its 18 metrics
// lines and a summary of the run (steps 18, steps_this_invocation 0, its losses, no interruption
// counted), and memory_report.json compares nothing (no step was measured). From an older
// version's checkpoint (no metrics.jsonl) the unknown losses are null, not 0.0.
TEST_F(Resume, AFinishedRunResumedIntoANewDirRunsNoStep) {
  const fs::path done = root / "finished", copy = root / "finished_copy";
  Out o = train(done);
  ASSERT_EQ(o.status, 0) << o.out;
  {
    // The measured run's rows were shorter than data.sequence_len (512): the report says so, with
    // the longest row (rows are padded to their batch's longest; no packing here).
    const json mem = json::parse(qlora::read_file((done / "memory_report.json").string()));
    ASSERT_TRUE(mem.contains("rows")) << mem.dump();
    EXPECT_EQ(mem["rows"]["estimated_tokens"], 512);
    const int64_t longest = mem["rows"]["longest_tokens"].get<int64_t>();
    EXPECT_GT(longest, 8);
    EXPECT_LT(longest, 512);
    // The log explains an under-estimate-peak by the short rows, and only then (a trial saw the note
    // under a peak 19 % above the estimate).
    bool peak_under = false;
    for (const json& r : mem["comparison"])
      if (r["component"] == "peak (tensors)" && r["measured_bytes"] < r["estimated_bytes"]) peak_under = true;
    EXPECT_EQ(o.out.find("this run's longest row had " + std::to_string(longest) + " (rows are padded") !=
                  std::string::npos,
              peak_under) << o.out;
    // ... with the estimate command of this run's config, overrides and device, which pastes as is
    // (trial 19: `qlora estimate --seq-len N` alone exits 2: it needs --config).
    if (peak_under) {
      const std::string note = qlora::test::line_with(o.out, "this run's longest row had");
      EXPECT_NE(note.find("`qlora estimate --config "), std::string::npos) << note;
      EXPECT_NE(note.find(" --device cpu --seq-len " + std::to_string(longest) + "` estimates rows of that length"),
                std::string::npos) << note;
    }
    // A CPU run says under the table what its measured rows are (a trial read -51 % as an alarm).
    EXPECT_NE(o.out.find("memory: on the CPU the measured rows are the process's RSS, which also holds the "
                         "allocator's retained blocks, thread pools and the data: a sanity check"),
              std::string::npos) << o.out;
  }
  o = train(copy, "--set checkpoint.resume=" + done.string());
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_NE(o.out.find("is already complete at step 18 of 18 in "), std::string::npos) << o.out;
  EXPECT_TRUE(logged_steps(o.out).empty()) << o.out;
  EXPECT_EQ(o.out.find("estimated vs measured"), std::string::npos) << o.out;
  EXPECT_EQ(qlora::read_file((copy / "adapter_model.safetensors").string()),
            qlora::read_file((done / "adapter_model.safetensors").string()));
  EXPECT_EQ(metric_lines(copy), metric_lines(done));
  const json a = json::parse(qlora::read_file((done / "summary.json").string()));
  const json b = json::parse(qlora::read_file((copy / "summary.json").string()));
  EXPECT_EQ(b["steps"], 18);
  EXPECT_EQ(b["steps_this_invocation"], 0);
  EXPECT_EQ(b["metrics_lines"], 18);
  EXPECT_EQ(b["preemption"]["interruptions"], 0);
  for (const char* k : {"final_loss", "train_loss", "input_tokens", "target_tokens", "run_id"})
    EXPECT_EQ(b[k], a[k]) << k;
  EXPECT_TRUE(b["final_loss"].is_number());
  const json mem = json::parse(qlora::read_file((copy / "memory_report.json").string()));
  EXPECT_TRUE(mem["comparison"].empty()) << mem.dump();
  EXPECT_NE(mem.value("note", ""), "");

  // The same from a checkpoint of an older version (no metrics.jsonl inside): no step's loss is
  // known, so final_loss and train_loss are null (not 0.0) and the record says it is incomplete.
  const fs::path old_ckpt = root / "old_version" / "checkpoint-18", bare = root / "finished_bare";
  fs::create_directories(old_ckpt.parent_path());
  fs::copy(done / "checkpoints" / "checkpoint-18", old_ckpt);
  fs::remove(old_ckpt / "metrics.jsonl");
  json manifest = json::parse(qlora::read_file((old_ckpt / "manifest.json").string()));
  manifest["files"].erase("metrics.jsonl");
  std::ofstream(old_ckpt / "manifest.json") << manifest.dump(2);
  o = train(bare, "--set checkpoint.resume=" + old_ckpt.string());
  ASSERT_EQ(o.status, 0) << o.out;
  const json c = json::parse(qlora::read_file((bare / "summary.json").string()));
  EXPECT_EQ(c["steps"], 18);
  EXPECT_EQ(c["steps_this_invocation"], 0);
  EXPECT_EQ(c["metrics_complete"], false);
  EXPECT_TRUE(c["final_loss"].is_null()) << c.dump();
  EXPECT_TRUE(c["train_loss"].is_null()) << c.dump();
  EXPECT_TRUE(c["eval_loss"].is_null()) << c.dump();
}

// Ctrl-C twice: the first asks for a checkpoint after the step, the second (test hook: while the
// step sleeps 1.5 s) quits at once with 130 and writes nothing more; the periodic checkpoint stays
// and the rerun resumes from it and ends byte-identical to the uninterrupted run. A repeated
// SIGTERM is not a second Ctrl-C: still one checkpoint and 75.
TEST_F(Resume, SecondCtrlCQuitsAtOnceAndTheRunResumes) {
  const std::string every2 = "--set checkpoint.save_steps=2";
  const fs::path ref = root / "ctrlc_ref", out = root / "ctrlc", termed = root / "term_twice";
  ASSERT_EQ(train(ref, every2).status, 0);
  auto signal_twice = [&](const fs::path& dir, const char* sig) {
    const fs::path log = dir.string() + ".log";
    Out o = sh("QLORA_FAULT_STEP_DELAY_MS=1500 " + ::qlora::test::qlora_bin() + " train " + (root / "run.yaml").string() +
               " --set output_dir=" + dir.string() + " " + every2 + " > " + log.string() + " 2>&1 & L=$!; " +
               "while kill -0 $L 2>/dev/null && [ \"$(cat " + (dir / "metrics.jsonl").string() +
               " 2>/dev/null | wc -l)\" -lt 3 ]; do sleep 0.05; done; kill -" + sig + " $L; sleep 0.3; kill -" + sig +
               " $L; wait $L; echo rc=$?");
    return o.out + (fs::exists(log) ? qlora::read_file(log.string()) : "");
  };
  std::string lg = signal_twice(out, "INT");
  EXPECT_NE(lg.find("rc=130"), std::string::npos) << lg;
  EXPECT_NE(lg.find("qlora: stop requested by SIGINT; finishing this step, then a checkpoint (Ctrl-C again: quit now without one)"),
            std::string::npos) << lg;
  EXPECT_NE(lg.find("qlora: second interrupt: quitting now without a checkpoint"), std::string::npos) << lg;
  EXPECT_EQ(lg.find("interrupted: stopped at step"), std::string::npos) << lg;
  EXPECT_FALSE(fs::exists(out / "adapter_model.safetensors"));
  const auto ckpts = qlora::list_checkpoints((out / "checkpoints").string());
  ASSERT_FALSE(ckpts.empty()) << lg;
  EXPECT_EQ(qlora::verify_checkpoint(ckpts[0]), "") << ckpts[0];
  const int64_t saved = json::parse(qlora::read_file((fs::path(ckpts[0]) / "trainer_state.json").string()))["step"];
  EXPECT_EQ(saved % 2, 0) << "the newest checkpoint is a periodic one (save_steps 2), not a stop checkpoint";
  Out o = train(out, every2);
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_TRUE(std::regex_search(o.out, std::regex("resume: from \\S+ at step " + std::to_string(saved) + " "))) << o.out;
  EXPECT_EQ(qlora::read_file((out / "adapter_model.safetensors").string()),
            qlora::read_file((ref / "adapter_model.safetensors").string()));

  lg = signal_twice(termed, "TERM");
  EXPECT_NE(lg.find("rc=75"), std::string::npos) << lg;
  EXPECT_NE(lg.find("interrupted: stopped at step"), std::string::npos) << lg;
}

// training.max_steps may change on resume (a finished 6-step run extended to 8), but the cosine
// schedule is computed over the total: one warning line names both totals and the step from which
// the schedule changes; the checkpoint records the new total, so the same command again is quiet.
TEST_F(Resume, ChangedMaxStepsWarnsThatTheScheduleChanges) {
  const fs::path out = root / "extend";
  const std::string warning = "resume: total steps changed from 6 to 8 (training.max_steps / num_epochs): the "
                              "learning-rate schedule (cosine, warmup 2) is computed over 8 steps from step 7 on, "
                              "so it differs from the 6-step run's";
  Out o = train(out, "--set training.max_steps=6");
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_EQ(o.out.find("total steps changed"), std::string::npos) << o.out;
  o = train(out, "--set training.max_steps=8");
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_NE(o.out.find(warning), std::string::npos) << o.out;
  EXPECT_EQ(logged_steps(o.out), (std::vector<int64_t>{7, 8})) << o.out;
  EXPECT_EQ(metrics(out).size(), 8u);
  const auto ckpts = qlora::list_checkpoints((out / "checkpoints").string());
  ASSERT_FALSE(ckpts.empty());
  const json state = json::parse(qlora::read_file((fs::path(ckpts[0]) / "trainer_state.json").string()));
  EXPECT_EQ(state["step"], 8);
  EXPECT_EQ(state["total_steps"], 8);
  o = train(out, "--set training.max_steps=8");
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_NE(o.out.find("is already complete (8 of 8 steps)"), std::string::npos) << o.out;
  EXPECT_EQ(o.out.find("total steps changed"), std::string::npos) << o.out;
}

namespace {
// The checkpoint-<N> directories under `dir`, as file names, newest first.
std::vector<std::string> ckpt_names(const fs::path& dir) {
  std::vector<std::string> v;
  for (const std::string& c : qlora::list_checkpoints(dir.string())) v.push_back(fs::path(c).filename().string());
  return v;
}
size_t count_of(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}
}  // namespace

// checkpoint.resume_from_dir holding one checkpoint's files directly (what `rclone copy {dir}
// remote:run` leaves) is that checkpoint: the run resumes from it, not from step 0. Checkpoint files
// at another level (DIR/run/checkpoint-4/...) are a one-line error, never a silent fresh start, and
// nothing is written (output_dir is not created).
TEST_F(Resume, ResumeFromDirThatIsACheckpointResumes) {
  const fs::path first = root / "flat_first", flat = root / "flat_sync", nested = root / "nested_sync";
  Out o = train(first, "", "QLORA_FAULT_SIGTERM_AT=4:0");
  ASSERT_EQ(o.status, 75) << o.out;
  ASSERT_EQ(ckpt_names(first / "checkpoints"), (std::vector<std::string>{"checkpoint-4"}));
  fs::create_directories(flat);
  for (const auto& e : fs::directory_iterator(first / "checkpoints" / "checkpoint-4"))
    fs::copy_file(e.path(), flat / e.path().filename());
  const fs::path out = root / "flat_run";
  o = train(out, "--set checkpoint.resume_from_dir=" + flat.string());
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_NE(o.out.find("resume: from " + flat.string() + " at step 4 "), std::string::npos) << o.out;
  EXPECT_EQ(o.out.find("starting a new run"), std::string::npos) << o.out;
  std::vector<int64_t> rest;
  for (int64_t i = 5; i <= 18; ++i) rest.push_back(i);
  EXPECT_EQ(logged_steps(o.out), rest) << o.out;

  fs::create_directories(nested / "run");
  fs::copy(first / "checkpoints" / "checkpoint-4", nested / "run" / "checkpoint-4", fs::copy_options::recursive);
  const fs::path out2 = root / "nested_run";
  o = train(out2, "--set checkpoint.resume_from_dir=" + nested.string());
  EXPECT_EQ(o.status, 1) << o.out;
  const std::string err = qlora::test::line_with(o.out, "error:");
  EXPECT_NE(err.find("checkpoint.resume_from_dir: " + nested.string() + " holds checkpoint files at another level"),
            std::string::npos) << o.out;
  EXPECT_NE(err.find("set checkpoint.resume_from_dir=" + (nested / "run").string() + " "), std::string::npos) << err;
  EXPECT_EQ(o.out.find("step 1/"), std::string::npos) << o.out;
  EXPECT_FALSE(fs::exists(out2)) << "a refused run must not leave its output_dir behind";
}

// resume: auto with resume_from_dir considers both the synced copy and <output_dir>/checkpoints and
// takes the newer valid checkpoint of the run, saying which; the SIGTERM hint is the same command
// (which finds the local checkpoint), and a hint that sets checkpoint.resume sets each key once.
TEST_F(Resume, ResumeFromDirAndLocalCheckpointsTakeTheNewer) {
  const fs::path sync = root / "lag_sync", out = root / "lag_run";
  const std::string extra = "--set checkpoint.save_steps=2 --set checkpoint.resume_from_dir=" + sync.string();
  Out o = train(out, extra, "QLORA_FAULT_SIGTERM_AT=3:0");
  ASSERT_EQ(o.status, 75) << o.out;
  // a sync target the first run's sync command has not made yet: a new run, the missing path said (trial 29)
  EXPECT_NE(o.out.find("warning: resume: checkpoint.resume_from_dir " + sync.string() + " does not exist; starting a "
                       "new run (check the path if this run was to resume)"),
            std::string::npos) << o.out;
  fs::create_directories(sync);
  ASSERT_EQ(ckpt_names(out / "checkpoints"), (std::vector<std::string>{"checkpoint-3", "checkpoint-2"}));
  const std::string hint = qlora::test::line_with(o.out, "interrupted:");
  EXPECT_NE(hint.find("run the same command again to resume: qlora train "), std::string::npos) << hint;
  EXPECT_EQ(count_of(hint, "checkpoint.resume_from_dir="), 1u) << hint;
  // The sync lags behind: it holds checkpoint-2, the local directory checkpoint-3.
  fs::copy(out / "checkpoints" / "checkpoint-2", sync / "checkpoint-2", fs::copy_options::recursive);
  o = train(out, extra, "QLORA_FAULT_SIGTERM_AT=5:0");
  ASSERT_EQ(o.status, 75) << o.out;
  const std::string local3 = (out / "checkpoints" / "checkpoint-3").string();
  EXPECT_NE(o.out.find("in checkpoint.resume_from_dir " + sync.string() + ": " + (sync / "checkpoint-2").string() +
                       " (step 2); taking " + local3 + " (the newer; the synced copy lags behind)"),
            std::string::npos) << o.out;
  EXPECT_NE(o.out.find("resume: from " + local3 + " at step 3 "), std::string::npos) << o.out;
  ASSERT_EQ(ckpt_names(out / "checkpoints"), (std::vector<std::string>{"checkpoint-5", "checkpoint-4"}));
  // Now the synced copy is the newer one (the local disk lost checkpoint-5).
  fs::copy(out / "checkpoints" / "checkpoint-5", sync / "checkpoint-5", fs::copy_options::recursive);
  qlora::remove_tree(out / "checkpoints" / "checkpoint-5");
  o = train(out, extra);
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_NE(o.out.find("resume: from " + (sync / "checkpoint-5").string() + " at step 5 "), std::string::npos) << o.out;
  EXPECT_EQ(metrics(out).size(), 18u);

  // resume: never: the hint sets checkpoint.resume and clears resume_from_dir, each once.
  const fs::path never = root / "lag_never";
  o = train(never, "--set checkpoint.resume=never --set checkpoint.resume_from_dir=" + sync.string(),
            "QLORA_FAULT_SIGTERM_AT=2:0");
  ASSERT_EQ(o.status, 75) << o.out;
  const std::string h2 = qlora::test::line_with(o.out, "interrupted:");
  EXPECT_EQ(count_of(h2, "checkpoint.resume_from_dir="), 1u) << h2;
  EXPECT_EQ(count_of(h2, "checkpoint.resume="), 1u) << h2;
  EXPECT_NE(h2.find("--set checkpoint.resume=" + (never / "checkpoints" / "checkpoint-2").string() +
                    " --set checkpoint.resume_from_dir="),
            std::string::npos) << h2;
}

// A run owns its output_dir: while one `qlora train` runs, a second one on the same output_dir is
// refused with one line naming the holder's pid, exit 1, and writes nothing (the first run's
// metrics.jsonl holds each step once); the first one's lock goes with it (SIGTERM), and the same
// command then resumes.
TEST_F(Resume, SecondRunOnTheSameOutputDirIsRefused) {
  const fs::path out = root / "locked";
  const std::string cmd = ::qlora::test::qlora_bin() + " train " + (root / "run.yaml").string() + " --set output_dir=" +
                          out.string();
  Out o = sh("QLORA_FAULT_STEP_DELAY_MS=1500 " + cmd + " > " + out.string() + ".log 2>&1 & L=$!; " +
             "while kill -0 $L 2>/dev/null && [ \"$(cat " + (out / "metrics.jsonl").string() +
             " 2>/dev/null | wc -l)\" -lt 1 ]; do sleep 0.05; done; echo pid=$L; " + cmd + " 2>&1; echo rc2=$?; " +
             "kill -TERM $L; wait $L; echo rc1=$?");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(o.out, m, std::regex("pid=(\\d+)"))) << o.out;
  const std::string pid = m[1];
  // 75, retry: the same command runs once the holder has ended (a trial, session 21: 1, as a bad config)
  EXPECT_NE(o.out.find("rc2=75"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("(exit 75: the same command can run once it has ended)"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("rc1=75"), std::string::npos) << o.out << qlora::read_file(out.string() + ".log");
  const std::string err = qlora::test::line_with(o.out, "error:");
  EXPECT_NE(err.find("output_dir " + out.string() + " is in use by another qlora train (pid " + pid + " on host "),
            std::string::npos) << o.out;
  EXPECT_EQ(count_of(o.out, "error:"), 1u) << o.out;
  EXPECT_EQ(o.out.find("step 1/"), std::string::npos) << "the second run trained:\n" << o.out;
  // refused by the probe before its model loads (the lock itself is taken after the load)
  EXPECT_EQ(o.out.find("memory estimate:"), std::string::npos) << "refused only after loading:\n" << o.out;
  const auto first = metrics(out);  // steps 1..k, each once: nothing interleaved
  ASSERT_FALSE(first.empty());
  o = train(out);
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_NE(o.out.find("resume: from "), std::string::npos) << o.out;
  EXPECT_EQ(metrics(out).size(), 18u);
}

// Every stop signal (kStopSignals) stops cleanly: SIGUSR2 and SIGHUP (a trial, session 21: exit 140
// and 129, killed without a checkpoint) as SIGTERM: the step finishes, a checkpoint, exit 75,
// the signal named; a SIGHUP the run started with ignored (nohup) stays ignored.
TEST_F(Resume, EveryStopSignalCheckpointsAndANohupRunIgnoresSigHup) {
  auto stop_with = [&](const std::string& name, const char* sig, const std::string& before = "") {
    const fs::path dir = root / ("sig_" + name), log = dir.string() + ".log";
    Out o = sh(before + "QLORA_FAULT_STEP_DELAY_MS=1000 " + ::qlora::test::qlora_bin() + " train " +
               (root / "run.yaml").string() + " --set output_dir=" + dir.string() + " > " + log.string() +
               " 2>&1 & L=$!; while kill -0 $L 2>/dev/null && [ \"$(cat " + (dir / "metrics.jsonl").string() +
               " 2>/dev/null | wc -l)\" -lt 1 ]; do sleep 0.05; done; kill -" + sig + " $L; " +
               (before.empty() ? "" : "sleep 1.5; kill -TERM $L; ") + "wait $L; echo rc=$?");
    return std::make_pair(dir, o.out + (fs::exists(log) ? qlora::read_file(log.string()) : ""));
  };
  for (const char* sig : {"USR2", "HUP"}) {
    const auto [dir, lg] = stop_with(sig, sig);
    EXPECT_NE(lg.find("rc=75"), std::string::npos) << sig << "\n" << lg;
    EXPECT_NE(lg.find(std::string("qlora: stop requested by SIG") + sig), std::string::npos) << lg;
    EXPECT_FALSE(qlora::list_checkpoints((dir / "checkpoints").string()).empty()) << lg;
  }
  // nohup: SIGHUP ignored from the start; the run goes on through it and stops at the SIGTERM.
  const auto [dir, lg] = stop_with("nohup", "HUP", "trap '' HUP; ");
  EXPECT_NE(lg.find("rc=75"), std::string::npos) << lg;
  EXPECT_EQ(lg.find("stop requested by SIGHUP"), std::string::npos) << lg;
  EXPECT_NE(lg.find("qlora: stop requested by SIGTERM"), std::string::npos) << lg;
  EXPECT_GE(metric_lines(dir).size(), 2u) << "the run went on after the SIGHUP:\n" << lg;
}

// `qlora train ... 2>&1 | tee log`: a signal to the job's process group ends the log reader first;
// the stop message to its closed pipe killed the run by SIGPIPE (exit 141, no checkpoint; a
// trial, session 21). Now it saves and exits 75, its log reader gone.
TEST_F(Resume, ALogPipeWhoseReaderIsGoneDoesNotKillTheRun) {
  const fs::path dir = root / "pipe";
  const std::string pid = dir.string() + ".pid", rc = dir.string() + ".rc";
  Out o = sh("( QLORA_FAULT_STEP_DELAY_MS=1000 " + ::qlora::test::qlora_bin() + " train " + (root / "run.yaml").string() +
             " --set output_dir=" + dir.string() + " 2>&1 & echo $! > " + pid + "; wait $!; echo $? > " + rc +
             " ) | head -c 1 > /dev/null & " +  // head reads one byte and closes the pipe
             "while [ ! -s " + pid + " ]; do sleep 0.05; done; " +
             "while [ ! -s " + rc + " ] && [ \"$(cat " + (dir / "metrics.jsonl").string() +
             " 2>/dev/null | wc -l)\" -lt 1 ]; do sleep 0.05; done; " +  // (before: dead of SIGPIPE by now)
             "kill -TERM $(cat " + pid + ") 2>/dev/null; while [ ! -s " + rc + " ]; do sleep 0.1; done; " +
             "echo rc=$(cat " + rc + ")");
  EXPECT_NE(o.out.find("rc=75"), std::string::npos) << o.out;
  EXPECT_FALSE(qlora::list_checkpoints((dir / "checkpoints").string()).empty()) << o.out;
  Out again = train(dir);
  EXPECT_EQ(again.status, 0) << again.out;
  EXPECT_NE(again.out.find("resume: from "), std::string::npos) << again.out;
}

// A SIGKILL while the adapter was written left adapter_model.safetensors.tmp.PID in output_dir
// for good (a trial, session 21): the run that holds output_dir removes such files of processes
// that are gone, and leaves a live process's.
TEST_F(Resume, InterruptedWritesOfDeadProcessesAreRemoved) {
  const fs::path out = root / "tmpleft";
  fs::create_directories(out);
  const std::string dead = qlora::test::run_command("sh -c 'echo $$'").out;  // a pid that has ended
  const fs::path gone = out / ("adapter_model.safetensors.tmp." + dead.substr(0, dead.find('\n')));
  const fs::path live = out / ("eval_base.json.tmp." + std::to_string(::getpid()));
  std::ofstream(gone) << "partial";
  std::ofstream(live) << "partial";
  Out o = train(out, "--set training.max_steps=1");
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_FALSE(fs::exists(gone)) << o.out;
  EXPECT_NE(o.out.find("output_dir: removed " + gone.filename().string() + ", an interrupted write of a process gone"),
            std::string::npos) << o.out;
  EXPECT_TRUE(fs::exists(live)) << o.out;
}

// A data file that only moved (same content, new path: a new VM) resumes with a note; other
// content under the new path is still refused.
TEST_F(Resume, MovedDataFileWithTheSameContentResumes) {
  const fs::path out = root / "moved", moved = root / "moved_data" / "data.json";
  fs::create_directories(moved.parent_path());
  fs::copy_file(root / "data.json", moved);
  Out o = train(out, "", "QLORA_FAULT_SIGTERM_AT=3:0");
  ASSERT_EQ(o.status, 75) << o.out;
  o = train(out, "--set data.train=" + moved.string(), "QLORA_FAULT_SIGTERM_AT=5:0");
  ASSERT_EQ(o.status, 75) << o.out;
  EXPECT_NE(o.out.find("resume: data.train moved: " + (root / "data.json").string() + " -> " + moved.string() +
                       " (same content, sha256 "),
            std::string::npos) << o.out;
  EXPECT_NE(o.out.find("resume: from " + (out / "checkpoints" / "checkpoint-3").string() + " at step 3 "),
            std::string::npos) << o.out;
  // Other content at another path: refused as before, naming the path change.
  const fs::path other = root / "moved_data" / "other.json";
  json d = json::parse(qlora::read_file(moved.string()));
  d.erase(d.begin());
  std::ofstream(other) << d.dump();
  o = train(out, "--set data.train=" + other.string());
  EXPECT_EQ(o.status, 1) << o.out;
  EXPECT_NE(qlora::test::line_with(o.out, "error:").find("settings that change the run differ: data.train: " +
                                                         moved.string() + " -> " + other.string()),
            std::string::npos) << o.out;
  o = train(out, "--set data.train=" + moved.string());
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_EQ(o.out.find("moved:"), std::string::npos) << "the checkpoint records the new path:\n" << o.out;
}

// Makes `ckpt` look written by an older version: trainer_state.json without `key`, the manifest's
// size and hash of it updated (so the checkpoint still verifies).
void as_older_version(const fs::path& ckpt, const std::string& key) {
  json st = json::parse(qlora::read_file((ckpt / "trainer_state.json").string()));
  ASSERT_TRUE(st.contains(key)) << st.dump();
  st.erase(key);
  const std::string text = st.dump(2);
  std::ofstream(ckpt / "trainer_state.json") << text;
  json manifest = json::parse(qlora::read_file((ckpt / "manifest.json").string()));
  ASSERT_TRUE(manifest["files"].contains("trainer_state.json")) << manifest.dump();
  manifest["files"]["trainer_state.json"] = {{"bytes", text.size()}, {"sha256", qlora::sha256_hex(text)}};
  std::ofstream(ckpt / "manifest.json") << manifest.dump(2);
}

// Sets `key` of `ckpt`/trainer_state.json to `value`, the manifest's size and hash of it updated
// (so the checkpoint still verifies).
void set_state(const fs::path& ckpt, const std::string& key, const json& value) {
  json st = json::parse(qlora::read_file((ckpt / "trainer_state.json").string()));
  st[key] = value;
  const std::string text = st.dump(2);
  std::ofstream(ckpt / "trainer_state.json") << text;
  json manifest = json::parse(qlora::read_file((ckpt / "manifest.json").string()));
  manifest["files"]["trainer_state.json"] = {{"bytes", text.size()}, {"sha256", qlora::sha256_hex(text)}};
  std::ofstream(ckpt / "manifest.json") << manifest.dump(2);
}

// The checkpoint-<N> folder names under `dir`, newest first.
std::vector<std::string> names_of(const fs::path& dir) {
  std::vector<std::string> n;
  for (const std::string& c : qlora::list_checkpoints(dir.string())) n.push_back(fs::path(c).filename().string());
  return n;
}

// A run with val_set_size whose records were partly dropped: an older version's checkpoint (no
// val_set_split) drew its hold-out from the examples left after the drops, so resuming it here
// would train other examples: refused naming data.val_set_size; this version's checkpoint resumes.
TEST_F(Resume, OlderHoldOutRuleWithDroppedRecordsIsRefused) {
  const fs::path data = root / "with_long.json", out = root / "holdout_rule";
  json d = json::parse(qlora::read_file((root / "data.json").string()));
  std::string long_text;
  for (int i = 0; i < 400; ++i) long_text += "printer jam ";
  d.push_back({{"instruction", long_text}, {"output", "hardware, urgent"}});
  d.push_back({{"instruction", long_text + "again"}, {"output", "hardware, low"}});
  std::ofstream(data) << d.dump();
  const std::string extra = "--set data.train=" + data.string() + " --set data.val_set_size=4";
  Out o = train(out, extra, "QLORA_FAULT_SIGTERM_AT=2:0");
  ASSERT_EQ(o.status, 75) << o.out;
  ASSERT_NE(o.out.find("2 longer than sequence_len 512 (dropped)"), std::string::npos) << o.out;
  const fs::path ck = out / "checkpoints" / "checkpoint-2";
  EXPECT_EQ(json::parse(qlora::read_file((ck / "trainer_state.json").string()))["val_set_split"], "records");
  const fs::path copy = root / "holdout_rule_old";
  fs::copy(out, copy, fs::copy_options::recursive);
  as_older_version(copy / "checkpoints" / "checkpoint-2", "val_set_split");
  o = train(copy, extra);
  EXPECT_EQ(o.status, 1) << o.out;
  EXPECT_NE(qlora::test::line_with(o.out, "error:")
                .find("data.val_set_size: the checkpoint's version drew the hold-out from the examples left after 2 "
                      "records were dropped or split"),
            std::string::npos) << o.out;
  o = train(out, extra);
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_NE(o.out.find("resume: from " + ck.string() + " at step 2 "), std::string::npos) << o.out;
}

// A model that only moved (a spot VM's replacement mounts it elsewhere) resumes with a note: the
// checkpoint records the sampled digests of the files a load reads (model_file_digests). Another
// model under the new path, or other weights under the same path, are refused naming the file;
// a checkpoint without digests (an older version's) keeps the plain path difference.
TEST_F(Resume, MovedModelWithTheSameFilesResumes) {
  const fs::path out = root / "moved_model_run", moved = root / "moved_model", other = root / "other_model";
  fs::copy(root / "model", moved, fs::copy_options::recursive);
  Out o = train(out, "", "QLORA_FAULT_SIGTERM_AT=3:0");
  ASSERT_EQ(o.status, 75) << o.out;
  const json st = json::parse(qlora::read_file((out / "checkpoints" / "checkpoint-3" / "trainer_state.json").string()));
  ASSERT_TRUE(st.contains("model_files")) << st.dump();
  EXPECT_TRUE(st["model_files"].contains("model.path/model.safetensors")) << st["model_files"].dump();
  EXPECT_TRUE(st["model_files"].contains("model.path/config.json")) << st["model_files"].dump();
  o = train(out, "--set model.path=" + moved.string(), "QLORA_FAULT_SIGTERM_AT=5:0");
  ASSERT_EQ(o.status, 75) << o.out;
  EXPECT_NE(o.out.find("resume: model.path moved: " + (root / "model").string() + " -> " + moved.string() +
                       " (the same files"),
            std::string::npos) << o.out;
  EXPECT_NE(o.out.find("resume: from " + (out / "checkpoints" / "checkpoint-3").string() + " at step 3 "),
            std::string::npos) << o.out;

  // Another model (same shapes and tokenizer, other weights) under another path: refused.
  Out init = sh(::qlora::test::qlora_bin() + " init-model --preset tiny --out " + other.string() + " --tokenizer " +
                (root / "model" / "tokenizer.model").string() + " --seed 11");
  ASSERT_EQ(init.status, 0) << init.out;
  o = train(out, "--set model.path=" + other.string());
  EXPECT_EQ(o.status, 1) << o.out;
  std::string err = qlora::test::line_with(o.out, "error:");
  EXPECT_NE(err.find("model.path: " + moved.string() + " -> " + other.string() + " (another model: "),
            std::string::npos) << o.out;
  EXPECT_NE(err.find("model.safetensors differs"), std::string::npos) << err;
  // Other weights under the checkpoint's own path: refused too.
  fs::copy_file(other / "model.safetensors", moved / "model.safetensors", fs::copy_options::overwrite_existing);
  o = train(out, "--set model.path=" + moved.string());
  EXPECT_EQ(o.status, 1) << o.out;
  err = qlora::test::line_with(o.out, "error:");
  EXPECT_NE(err.find("the files of model.path " + moved.string() +
                     " changed since the checkpoint was written (model.safetensors differs)"),
            std::string::npos) << o.out;
  EXPECT_EQ(o.out.find("step 6/"), std::string::npos) << o.out;
  // The right weights back: the run completes.
  fs::copy_file(root / "model" / "model.safetensors", moved / "model.safetensors", fs::copy_options::overwrite_existing);
  o = train(out, "--set model.path=" + moved.string());
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_EQ(metrics(out).size(), 18u);

  // An older version's checkpoint (no model_files): a moved model is the plain difference.
  const fs::path old_run = root / "moved_model_old";
  o = train(old_run, "", "QLORA_FAULT_SIGTERM_AT=2:0");
  ASSERT_EQ(o.status, 75) << o.out;
  as_older_version(old_run / "checkpoints" / "checkpoint-2", "model_files");
  o = train(old_run, "--set model.path=" + moved.string());
  EXPECT_EQ(o.status, 1) << o.out;
  EXPECT_NE(qlora::test::line_with(o.out, "error:")
                .find("model.path: " + (root / "model").string() + " -> " + moved.string() +
                      " (the checkpoint records no digest of the model's files: written by an older version)"),
            std::string::npos) << o.out;
}

// A run killed before its first checkpoint leaves run.json and no checkpoint (made here by deleting
// checkpoints/ after a SIGTERM: the state a kill -9 during the first steps leaves). Its rerun is
// the same run only with the same settings and data, compared as a resume compares a checkpoint's
// (MovedModelWithTheSameFilesResumes): run.json records the resolved config, the data files'
// content hashes and the model files' digests, so a model or data file that only moved is the
// same run (before: refused, as the fingerprint hashes the paths); another model, or other content
// under the same path, is refused naming it; an older version's run.json (no config) keeps the
// fingerprint comparison.
TEST_F(Resume, MovedModelOrDataBeforeTheFirstCheckpointIsTheSameRun) {
  const fs::path out = root / "no_ckpt_run", model = root / "no_ckpt_model", other = root / "no_ckpt_other",
                 data = root / "no_ckpt_data" / "data.json";
  fs::copy(root / "model", model, fs::copy_options::recursive);
  fs::create_directories(data.parent_path());
  fs::copy_file(root / "data.json", data);
  Out o = train(out, "", "QLORA_FAULT_SIGTERM_AT=1:0");
  ASSERT_EQ(o.status, 75) << o.out;
  qlora::remove_tree(out / "checkpoints");
  const json rec = json::parse(qlora::read_file((out / "run.json").string()));
  ASSERT_TRUE(rec.contains("config") && rec.contains("model_files")) << rec.dump();
  EXPECT_TRUE(rec["model_files"].contains("model.path/model.safetensors")) << rec.dump();
  const std::string run_id = rec["run_id"];

  const std::string moved = "--set model.path=" + model.string() + " --set data.train=" + data.string();
  o = train(out, moved, "QLORA_FAULT_SIGTERM_AT=2:0");
  ASSERT_EQ(o.status, 75) << o.out;
  EXPECT_NE(o.out.find("resume: model.path moved: " + (root / "model").string() + " -> " + model.string() +
                       " (the same files: their sampled SHA-256 equal run.json's); the same run"),
            std::string::npos) << o.out;
  EXPECT_NE(o.out.find("resume: data.train moved: " + (root / "data.json").string() + " -> " + data.string() +
                       " (same content, sha256 "),
            std::string::npos) << o.out;
  EXPECT_NE(o.out.find("resume: run " + run_id + " has no complete checkpoint yet; starting it again from step 0"),
            std::string::npos) << o.out;
  // run.json now records the paths the run continues under; the run and its start time stay.
  const json rec2 = json::parse(qlora::read_file((out / "run.json").string()));
  EXPECT_EQ(rec2["run_id"], run_id);
  EXPECT_EQ(rec2["started_utc"], rec["started_utc"]);
  EXPECT_NE(rec2["config"].get<std::string>().find(model.string()), std::string::npos) << rec2.dump();
  EXPECT_EQ(rec2["model_files"], rec["model_files"]);
  qlora::remove_tree(out / "checkpoints");

  // Another model (same shapes and tokenizer, other weights) under another path: refused, named.
  Out init = sh(::qlora::test::qlora_bin() + " init-model --preset tiny --out " + other.string() + " --tokenizer " +
                (root / "model" / "tokenizer.model").string() + " --seed 11");
  ASSERT_EQ(init.status, 0) << init.out;
  o = train(out, "--set model.path=" + other.string() + " --set data.train=" + data.string());
  EXPECT_EQ(o.status, 1) << o.out;
  std::string err = qlora::test::line_with(o.out, "error:");
  EXPECT_NE(err.find("already holds run " + run_id + " (0 checkpoints) with other run-meaning settings or data, and "
                     "no checkpoint of it to resume (model.path: " + model.string() + " -> " + other.string() +
                     " (another model: "),
            std::string::npos) << o.out;
  EXPECT_NE(err.find("model.safetensors differs"), std::string::npos) << err;
  EXPECT_NE(err.find("): use another output_dir, or --overwrite-output-dir"), std::string::npos) << err;
  // Other content under the run's own data path: refused, named.
  json d = json::parse(qlora::read_file(data.string()));
  d.erase(d.begin());
  std::ofstream(data) << d.dump();
  o = train(out, moved);
  EXPECT_EQ(o.status, 1) << o.out;
  EXPECT_NE(qlora::test::line_with(o.out, "error:")
                .find("no checkpoint of it to resume (content of " + data.string() +
                      " changed since the run started (sha256 "),
            std::string::npos) << o.out;
  fs::copy_file(root / "data.json", data, fs::copy_options::overwrite_existing);

  // An older version's run.json (no config, no digests): the fingerprint alone, as before.
  json old = rec2;
  old.erase("config");
  old.erase("model_files");
  std::ofstream(out / "run.json") << old.dump(2);
  o = train(out);  // model and data back at their first paths: another fingerprint
  EXPECT_EQ(o.status, 1) << o.out;
  EXPECT_NE(qlora::test::line_with(o.out, "error:")
                .find("with other run-meaning settings or data, and no checkpoint of it to resume: use another "
                      "output_dir"),
            std::string::npos) << o.out;
  o = train(out, moved);  // its own paths: the same fingerprint, the same run; run.json gets the digests
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_EQ(o.out.find("moved:"), std::string::npos) << o.out;
  EXPECT_TRUE(json::parse(qlora::read_file((out / "run.json").string())).contains("model_files"));
}

// checkpoint.keep_best: pruning keeps the checkpoint with the lowest eval_loss besides the newest
// keep_last, across a resume, and summary.json's best_eval.checkpoint names it (HF Trainer's
// _sorted_checkpoints never rotates out best_model_checkpoint either). The eval set asks for
// answers the training data never gives, so eval_loss falls while the template is learnt and then
// rises: the best step is early. Without keep_best (today's default), keep_last 1 deletes it.
TEST_F(Resume, KeepBestKeepsTheLowestEvalLossCheckpointAcrossAResume) {
  const fs::path eval = root / "keep_best_eval.json", ref = root / "keep_best_ref", out = root / "keep_best";
  json e = json::array();
  for (int i = 0; i < 6; ++i)
    e.push_back({{"instruction", "ticket " + std::to_string(i) + " printer jam in room " + std::to_string(i % 5)},
                 {"output", "room ticket jam printer room ticket jam printer in"}});
  std::ofstream(eval) << e.dump();
  const std::string extra = "--set data.eval=" + eval.string() +
                            " --set training.eval_steps=1 --set checkpoint.save_steps=1 --set checkpoint.keep_last=1"
                            " --set training.max_steps=10 --set training.learning_rate=0.01";
  Out o = train(ref, extra);
  ASSERT_EQ(o.status, 0) << o.out;
  // The best evaluation (the first of equals, as summary.json and HF's best_metric).
  int64_t best_step = -1;
  double best = 0;
  std::map<int64_t, double> evals;
  for (const std::string& line : metric_lines(ref)) {
    const json j = json::parse(line);
    evals[j["step"].get<int64_t>()] = j["eval_loss"].get<double>();
    if (best_step < 0 || j["eval_loss"].get<double>() < best) best = j["eval_loss"], best_step = j["step"];
  }
  ASSERT_EQ(evals.size(), 10u);
  ASSERT_LT(best_step, 6) << "the eval set no longer makes an early step the best: " << o.out;
  const std::string best_name = "checkpoint-" + std::to_string(best_step);
  EXPECT_EQ(names_of(ref / "checkpoints"), std::vector<std::string>{"checkpoint-10"}) << "keep_last 1 by age";
  json s = json::parse(qlora::read_file((ref / "summary.json").string()));
  EXPECT_EQ(s["best_eval"]["step"], best_step);
  EXPECT_TRUE(s["best_eval"]["checkpoint"].is_null()) << s.dump(2);

  // keep_best, stopped at step 6 and resumed: the best is kept besides the newest throughout.
  o = train(out, extra + " --set checkpoint.keep_best=true", "QLORA_FAULT_SIGTERM_AT=6:0");
  ASSERT_EQ(o.status, 75) << o.out;
  EXPECT_EQ(names_of(out / "checkpoints"), (std::vector<std::string>{"checkpoint-6", best_name}));
  const fs::path best_ck = out / "checkpoints" / best_name;
  const json st = json::parse(qlora::read_file((best_ck / "trainer_state.json").string()));
  EXPECT_EQ(st["eval_loss"].get<double>(), best) << "trainer_state.json records its step's eval_loss";
  o = train(out, extra + " --set checkpoint.keep_best=true");
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_NE(o.out.find("resume: from " + (out / "checkpoints" / "checkpoint-6").string() + " at step 6 "),
            std::string::npos) << o.out;
  EXPECT_EQ(names_of(out / "checkpoints"), (std::vector<std::string>{"checkpoint-10", best_name}));
  s = json::parse(qlora::read_file((out / "summary.json").string()));
  EXPECT_EQ(s["best_eval"]["step"], best_step);
  EXPECT_EQ(s["best_eval"]["checkpoint"], best_ck.string()) << s.dump(2);
  EXPECT_NE(o.out.find("its checkpoint " + best_ck.string() + " works as --adapter for eval, generate and merge"),
            std::string::npos) << o.out;
  // The same training as without keep_best (checkpoint.* never changes a run).
  EXPECT_EQ(qlora::sha256_file((out / "adapter_model.safetensors").string()),
            qlora::sha256_file((ref / "adapter_model.safetensors").string()));

  // Checkpoints only every 3 steps (3, 6, 9, 6 also the epoch's end, 10 the last): the best
  // evaluation's step wrote none, so summary.json names no checkpoint, and keep_best keeps the best
  // of those written (the log names it).
  const fs::path sparse = root / "keep_best_sparse";
  o = train(sparse, extra + " --set checkpoint.keep_best=true --set checkpoint.save_steps=3");
  ASSERT_EQ(o.status, 0) << o.out;
  int64_t best_saved = 3;
  for (const int64_t step : {6, 9, 10})
    if (evals[step] < evals[best_saved]) best_saved = step;
  ASSERT_NE(best_saved, 10) << "the last checkpoint is the best written one: nothing to keep";
  const fs::path saved_ck = sparse / "checkpoints" / ("checkpoint-" + std::to_string(best_saved));
  EXPECT_EQ(names_of(sparse / "checkpoints"), (std::vector<std::string>{"checkpoint-10", saved_ck.filename().string()}));
  s = json::parse(qlora::read_file((sparse / "summary.json").string()));
  EXPECT_TRUE(s["best_eval"]["checkpoint"].is_null()) << s.dump(2);
  EXPECT_NE(o.out.find("checkpoint.keep_best keeps the best of them: " + saved_ck.string() + ", eval_loss "),
            std::string::npos) << o.out;

  // prune_checkpoints on copies of one checkpoint whose eval_loss is set per step: the best counts
  // among the newest keep_last when it is one of them, else it is kept besides them; the oldest of
  // equals is the best; checkpoints without an eval_loss are never the best.
  const std::string run_id = st["run_id"];
  auto make = [&](const fs::path& dir, const std::vector<std::optional<double>>& losses) {
    qlora::remove_tree(dir);
    fs::create_directories(dir);
    for (size_t i = 0; i < losses.size(); ++i) {
      const fs::path c = dir / ("checkpoint-" + std::to_string(i + 1));
      fs::copy(best_ck, c, fs::copy_options::recursive);
      set_state(c, "eval_loss", losses[i] ? json(*losses[i]) : json(nullptr));
    }
  };
  const fs::path pd = root / "keep_best_prune";
  using L = std::vector<std::optional<double>>;
  using V = std::vector<std::string>;
  make(pd, L{3.0, 1.0, 2.0, 1.0, 4.0});
  EXPECT_EQ(qlora::best_checkpoint(pd.string(), run_id), (pd / "checkpoint-2").string());
  qlora::prune_checkpoints(pd.string(), 2, run_id, {}, /*keep_best=*/true);
  EXPECT_EQ(names_of(pd), (V{"checkpoint-5", "checkpoint-4", "checkpoint-2"}));
  make(pd, L{3.0, 1.0, 2.0, 0.5, 4.0});
  qlora::prune_checkpoints(pd.string(), 2, run_id, {}, true);
  EXPECT_EQ(names_of(pd), (V{"checkpoint-5", "checkpoint-4"})) << "the best is one of the newest 2";
  make(pd, L{3.0, 1.0, std::nullopt, std::nullopt, std::nullopt});
  qlora::prune_checkpoints(pd.string(), 1, run_id, {}, true);
  EXPECT_EQ(names_of(pd), (V{"checkpoint-5", "checkpoint-2"}));
  qlora::prune_checkpoints(pd.string(), 1, run_id, {}, false);
  EXPECT_EQ(names_of(pd), (V{"checkpoint-5"}));
  make(pd, L{std::nullopt, std::nullopt});
  EXPECT_EQ(qlora::best_checkpoint(pd.string(), run_id), "");

  // Pruning deletes a checkpoint's own files only: another file in its directory (a `checkpoints`
  // linked to a shared place; trial 27 lost one) stays with its directory, which is named; a
  // checkpoint-N that is a link loses the link, never what it names.
  make(pd, L{std::nullopt, std::nullopt, std::nullopt});
  std::ofstream(pd / "checkpoint-1" / "MY_PRECIOUS.txt") << "precious\n";
  const fs::path elsewhere = root / "keep_best_elsewhere";
  qlora::remove_tree(elsewhere);
  fs::rename(pd / "checkpoint-2", elsewhere);
  fs::create_directory_symlink(elsewhere, pd / "checkpoint-2");
  std::vector<std::string> kept;
  const std::vector<std::string> removed = qlora::prune_checkpoints(pd.string(), 1, run_id, {}, false, &kept);
  EXPECT_EQ(removed, (V{(pd / "checkpoint-2").string()}));
  EXPECT_EQ(kept, (V{(pd / "checkpoint-1").string() + " (it holds MY_PRECIOUS.txt)"}));
  V left;
  for (const auto& e : fs::directory_iterator(pd / "checkpoint-1")) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, (V{"MY_PRECIOUS.txt"}));
  EXPECT_FALSE(fs::exists(fs::symlink_status(pd / "checkpoint-2")));
  EXPECT_TRUE(fs::exists(elsewhere / "manifest.json")) << "a linked checkpoint's files are not ours to delete";
}

// data.train as a list (Axolotl's `datasets:`): the tiny run's 24 records as an alpaca JSON file
// (the first 12) and a sharegpt JSONL file (the last 12, the same turns). Each file alone gives
// its records' examples and the list their concatenation, so the list run trains exactly the
// one-file run (same adapter, byte for byte). Resuming needs the same list: an interrupted list run
// resumes to that same adapter; another order, another number of files, another entry format or
// file, and other content are refused naming what changed; a file that only moved resumes.
TEST_F(Resume, DataTrainListResumesAndAChangedListIsRefused) {
  const fs::path a = root / "list" / "a.json", b = root / "list" / "b.jsonl";
  fs::create_directories(a.parent_path());
  const json all = json::parse(qlora::read_file((root / "data.json").string()));
  ASSERT_EQ(all.size(), 24u);
  {
    json first = json::array();
    std::ofstream bf(b);
    for (size_t i = 0; i < all.size(); ++i) {
      if (i < 12) {
        first.push_back(all[i]);
        continue;
      }
      bf << json{{"conversations", {{{"from", "human"}, {"value", all[i]["instruction"]}},
                                    {{"from", "gpt"}, {"value", all[i]["output"]}}}}}.dump()
         << "\n";
    }
    std::ofstream(a) << first.dump(2);
  }
  const std::string list = "--set 'data.train=[" + a.string() + ", {path: " + b.string() + ", format: sharegpt}]'";
  auto list_of = [](const std::string& entries) { return "--set 'data.train=[" + entries + "]'"; };
  auto error_line = [](const Out& o) { return qlora::test::line_with(o.out, "error:"); };

  // The list run equals the one-file run.
  const fs::path one = root / "list_one", ref = root / "list_ref";
  Out o = train(one);
  ASSERT_EQ(o.status, 0) << o.out;
  o = train(ref, list);
  ASSERT_EQ(o.status, 0) << o.out;
  const std::string adapter = qlora::read_file((one / "adapter_model.safetensors").string());
  EXPECT_EQ(qlora::read_file((ref / "adapter_model.safetensors").string()), adapter);
  // Its config.resolved.yaml holds the list and loads again (data preview reads it).
  const std::string resolved = qlora::read_file((ref / "config.resolved.yaml").string());
  EXPECT_NE(resolved.find("format: sharegpt"), std::string::npos) << resolved;
  o = sh(::qlora::test::qlora_bin() + " data preview " + (ref / "config.resolved.yaml").string() + " --n 1");
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_NE(o.out.find("format: alpaca, sharegpt\n"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("data.train[1] " + b.string() + " (format sharegpt): 12 examples; 12 records read"),
            std::string::npos) << o.out;

  // Interrupted and resumed with the same list: the same adapter.
  const fs::path out = root / "list_run";
  o = train(out, list, "QLORA_FAULT_SIGTERM_AT=3:0");
  ASSERT_EQ(o.status, 75) << o.out;
  // Refused: another order, another number of files, another entry format, another file.
  o = train(out, list_of("{path: " + b.string() + ", format: sharegpt}, " + a.string()));
  EXPECT_EQ(o.status, 1) << o.out;
  EXPECT_NE(error_line(o).find("settings that change the run differ: data.train: the same files in another order (" +
                               a.string() + ", " + b.string() + " -> " + b.string() + ", " + a.string() + ")"),
            std::string::npos) << o.out;
  o = train(out, list_of(a.string()));
  EXPECT_EQ(o.status, 1) << o.out;
  EXPECT_NE(error_line(o).find("differ: data.train: 2 files -> 1 file (removed " + b.string() + ")"), std::string::npos)
      << o.out;
  o = train(out, list_of(a.string() + ", " + b.string()));
  EXPECT_EQ(o.status, 1) << o.out;
  EXPECT_NE(error_line(o).find("differ: data.train[1].format: sharegpt -> (unset)"), std::string::npos) << o.out;
  const fs::path c = root / "list" / "c.jsonl";
  {
    std::ofstream cf(c);
    cf << qlora::read_file(b.string()) << "\n";  // the same records, other bytes
  }
  o = train(out, list_of(a.string() + ", {path: " + c.string() + ", format: sharegpt}"));
  EXPECT_EQ(o.status, 1) << o.out;
  EXPECT_NE(error_line(o).find("differ: data.train[1]: " + b.string() + " -> " + c.string()), std::string::npos)
      << o.out;
  // Other content under the same path.
  const std::string b_bytes = qlora::read_file(b.string());
  std::ofstream(b, std::ios::app) << "\n";
  o = train(out, list);
  EXPECT_EQ(o.status, 1) << o.out;
  EXPECT_NE(error_line(o).find("content of " + b.string() + " changed since the checkpoint was written"),
            std::string::npos) << o.out;
  std::ofstream(b, std::ios::trunc) << b_bytes;
  // A file that only moved is the same run; the same list resumes to the uninterrupted adapter.
  const fs::path moved = root / "list" / "moved_b.jsonl";
  fs::copy_file(b, moved);
  o = train(out, list_of(a.string() + ", {path: " + moved.string() + ", format: sharegpt}"), "QLORA_FAULT_SIGTERM_AT=5:0");
  ASSERT_EQ(o.status, 75) << o.out;
  EXPECT_NE(o.out.find("resume: data.train[1] moved: " + b.string() + " -> " + moved.string() +
                       " (same content, sha256 "),
            std::string::npos) << o.out;
  o = train(out, list_of(a.string() + ", {path: " + moved.string() + ", format: sharegpt}"));
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_NE(o.out.find("resume: from " + (out / "checkpoints" / "checkpoint-5").string() + " at step 5 "),
            std::string::npos) << o.out;
  EXPECT_EQ(qlora::read_file((out / "adapter_model.safetensors").string()), adapter);

  // One path and a one-entry list are the same run: either resumes the other.
  const fs::path single = root / "list_single";
  o = train(single, list_of((root / "data.json").string()), "QLORA_FAULT_SIGTERM_AT=3:0");
  ASSERT_EQ(o.status, 75) << o.out;
  o = train(single);
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_NE(o.out.find("resume: from " + (single / "checkpoints" / "checkpoint-3").string() + " at step 3 "),
            std::string::npos) << o.out;
  EXPECT_EQ(qlora::read_file((single / "adapter_model.safetensors").string()), adapter);
}

// The resume refusal's wording for each kind of change of a data list (data_source_changes).
TEST(DataSourceChanges, NameWhatChangedPerFile) {
  using qlora::data::DataSource;
  using Map = std::map<std::string, std::string>;
  const Map sha_then = {{"a", "aaaa11112222"}, {"b", "bbbb11112222"}};
  std::vector<std::string> moved;
  auto changes = [&](const std::vector<DataSource>& before, const std::vector<DataSource>& now, const Map& sha_now) {
    moved.clear();
    return qlora::data_source_changes("data.train", before, sha_then, now, sha_now, &moved);
  };
  using V = std::vector<std::string>;
  // One plain path each side: named data.train, as before lists.
  EXPECT_EQ(changes({{"a"}}, {{"c"}}, {{"c", "cccc"}}), V{"data.train: a -> c"});
  EXPECT_EQ(changes({{"a"}}, {{"a2"}}, {{"a2", "aaaa11112222"}}), V{});
  EXPECT_EQ(moved, V{"data.train moved: a -> a2 (same content, sha256 aaaa11112222)"});
  EXPECT_EQ(changes({{"a"}}, {{"a"}, {"b"}, {"c"}}, {}), V{"data.train: 1 file -> 3 files (added b, c)"});
  EXPECT_EQ(changes({{"a"}, {"b"}}, {{"c"}}, {}), V{"data.train: 2 files -> 1 file (added c; removed a, b)"});
  EXPECT_EQ(changes({{"a"}, {"b"}}, {{"b"}, {"a"}}, {}),
            V{"data.train: the same files in another order (a, b -> b, a): the concatenation, and so every batch, differs"});
  EXPECT_EQ(changes({{"a"}, {"b"}}, {{"a"}, {"b2"}}, {{"b2", "bbbb11112222"}}), V{});
  EXPECT_EQ(moved, V{"data.train[1] moved: b -> b2 (same content, sha256 bbbb11112222)"});
  DataSource b_mapped{"b", std::string("sharegpt"), Map{{"instruction", "q"}}, Map{{"bot", "assistant"}}};
  EXPECT_EQ(changes({{"a"}, {"b"}}, {{"a"}, b_mapped}, {}),
            (V{"data.train[1].format: (unset) -> sharegpt", "data.train[1].field_map: (unset) -> {instruction: q}",
               "data.train[1].role_map: (unset) -> {bot: assistant}"}));
  // One path that gained an override is an entry of a list: named data.train[0].
  EXPECT_EQ(changes({{"a"}}, {{"a", std::string("alpaca")}}, {}), V{"data.train[0].format: (unset) -> alpaca"});
}

// data.deduplicate changes which records train and which are held out: a resume with the other
// value is refused like any data setting (config_differences); a checkpoint of a version without
// the key ran without deduplication, so its absent key reads as false.
TEST(ConfigDifferences, DeduplicateIsARunSettingAndAbsentReadsAsFalse) {
  using V = std::vector<std::string>;
  const std::string text = "output_dir: o\nmodel: {path: m}\ndata: {train: t.jsonl}\n";
  const std::string off = qlora::to_yaml(qlora::parse_config_string(text, "t.yaml"));
  const std::string on = qlora::to_yaml(qlora::parse_config_string(text, "t.yaml", {"data.deduplicate=true"}));
  EXPECT_EQ(qlora::config_differences(off, on), V{"data.deduplicate: false -> true"});
  EXPECT_EQ(qlora::config_differences(on, off), V{"data.deduplicate: true -> false"});
  std::string older = off;  // an older version's config.resolved.yaml: no such key
  const size_t at = older.find("  deduplicate: false\n");
  ASSERT_NE(at, std::string::npos) << off;
  older.erase(at, std::string("  deduplicate: false\n").size());
  EXPECT_EQ(qlora::config_differences(older, off), V{});
  EXPECT_EQ(qlora::config_differences(older, on), V{"data.deduplicate: false -> true"});
}

// `qlora data preview` with one path and with it as a one-entry list: the same text (its stdout;
// stderr's log lines carry their time), byte for byte.
TEST_F(Resume, DataPreviewOfOnePathAndAOneEntryListAreIdentical) {
  const std::string base = "(" + ::qlora::test::qlora_bin() + " data preview " + (root / "run.yaml").string() + " --n 2 ";
  const Out path = sh(base + "--set data.train=" + (root / "data.json").string() + " 2>/dev/null)");
  const Out listed = sh(base + "--set 'data.train=[" + (root / "data.json").string() + "]' 2>/dev/null)");
  ASSERT_EQ(path.status, 0) << path.out;
  ASSERT_EQ(listed.status, 0) << listed.out;
  EXPECT_EQ(listed.out, path.out);
  EXPECT_NE(path.out.find("---- example 0:"), std::string::npos) << path.out;
}

// The tiny run's model and data, used by configs written beside them (relative paths, bad values).
class TinyCli : public qlora::test::TinyRunSuite<TinyCli> {
 public:
  static constexpr const char* kTempName = "tinycli";
  static constexpr int kSaveSteps = 0;
};

// Errors of checks that need the files (the model dir, the data size) name the config's file:line
// (or the --set) like parse errors do, and nothing is written.
TEST_F(TinyCli, ConfigKeyErrorsAfterParsingNameFileLine) {
  const fs::path cfg = root / "late_errors.yaml";
  std::ofstream(cfg) << "output_dir: " << (root / "late").string() << "\n"
                     << "model: {path: no/such/model, dtype: fp32}\n"
                     << "data:\n  train: " << (root / "data.json").string() << "\n  template: alpaca\n"
                     << "  val_set_size: 5000\n";
  const std::string train = ::qlora::test::qlora_bin() + " train " + cfg.string();
  Out o = sh(train);
  EXPECT_EQ(o.status, 1) << o.out;
  EXPECT_NE(o.out.find(cfg.string() + ":2: model.path: no/such/model: model directory not found"), std::string::npos)
      << o.out;
  const std::string model = " --set model.path=" + (root / "model").string();
  o = sh(train + model);
  EXPECT_EQ(o.status, 1) << o.out;
  EXPECT_NE(o.out.find(cfg.string() + ":6: data.val_set_size: 5000 leaves no training record out of 24"),
            std::string::npos) << o.out;
  o = sh(train + model + " --set data.val_set_size=24");
  EXPECT_EQ(o.status, 1) << o.out;
  EXPECT_NE(o.out.find("--set data.val_set_size=24: data.val_set_size: 24 leaves no training record out of 24"),
            std::string::npos) << o.out;
  o = sh(::qlora::test::qlora_bin() + " data preview " + cfg.string());
  EXPECT_EQ(o.status, 1) << o.out;
  EXPECT_NE(o.out.find(cfg.string() + ":2: model.path: no/such/model: model directory not found"), std::string::npos)
      << o.out;
  EXPECT_FALSE(fs::exists(root / "late"));
}

// adapter_config.json names a local base model by its absolute, normalised path, though the config
// gives it relative to the cwd ("./model/"): PEFT's AutoPeftModelForCausalLM loads the run's
// adapter from another directory.
TEST_F(TinyCli, AdapterConfigNamesTheBaseByAbsolutePath) {
  std::ofstream(root / "relative.yaml")
      << "output_dir: rel_run\nmodel: {path: ./model/, dtype: fp32}\nquantization: {method: none}\n"
      << "lora: {r: 4, alpha: 8}\ndata: {train: data.json, template: alpaca, sequence_len: 512}\n"
      << "training: {micro_batch_size: 2, gradient_accumulation_steps: 1, max_steps: 1, warmup_steps: 0}\n"
      << "checkpoint: {save_steps: 0, save_minutes: 0}\n";
  Out o = sh("cd " + root.string() + " && " + ::qlora::test::qlora_bin() + " train relative.yaml");
  ASSERT_EQ(o.status, 0) << o.out;
  const fs::path run = root / "rel_run";
  const json ac = json::parse(qlora::read_file((run / "adapter_config.json").string()));
  EXPECT_EQ(ac["base_model_name_or_path"], (fs::canonical(root) / "model").string());
  QLORA_REQUIRE_PYTHON_EXE(python);
  o = sh("cd / && HF_HUB_OFFLINE=1 " + python +
         " -c \"import sys; from peft import AutoPeftModelForCausalLM; "
         "m = AutoPeftModelForCausalLM.from_pretrained(sys.argv[1]); "
         "print('OK', m.peft_config['default'].base_model_name_or_path)\" " + run.string() + " 2>&1");
  EXPECT_EQ(o.status, 0) << o.out;
  EXPECT_NE(o.out.find("OK " + (fs::canonical(root) / "model").string()), std::string::npos) << o.out;
}

TEST(CheckpointFiles, IncompleteTemporaryDirectoriesAreIgnored) {
  const qlora::test::TempDir tmp("ckpt_incomplete");
  const fs::path& d = tmp.path;
  fs::create_directories(d / ".tmp-checkpoint-9-1");
  fs::create_directories(d / "checkpoint-7");
  EXPECT_EQ(qlora::list_checkpoints(d.string()).size(), 1u);
  EXPECT_EQ(qlora::verify_checkpoint((d / "checkpoint-7").string()), "no manifest.json (incomplete)");
  EXPECT_EQ(qlora::newest_valid_checkpoint(d.string(), nullptr), "");
}

// The QLORA_FAULT_* test seam (trainer/fault.h): parsed once, unset = no hook, a bad value is a
// one-line error naming the variable.
TEST(FaultHooks, ParsedFromTheEnvironmentOnce) {
  auto from = [](std::map<std::string, std::string> env) {
    return qlora::FaultHooks::from_env([env](const char* n) -> const char* {
      auto it = env.find(n);
      return it == env.end() ? nullptr : it->second.c_str();
    });
  };
  const qlora::FaultHooks none = from({});
  EXPECT_EQ(none.sigterm_step, -1);
  EXPECT_EQ(none.perturb_step, -1);
  EXPECT_EQ(none.step_delay_ms, 0);
  EXPECT_EQ(none.slow_checkpoint_ms, 0);
  EXPECT_EQ(none.load_delay_ms, 0);
  EXPECT_EQ(none.checkpoint_enospc_step, -1);
  EXPECT_EQ(from({{"QLORA_FAULT_CHECKPOINT_ENOSPC_AT", "6"}}).checkpoint_enospc_step, 6);
  EXPECT_EQ(qlora::test::error_of([&] { from({{"QLORA_FAULT_CHECKPOINT_ENOSPC_AT", "x"}}); }),
            "QLORA_FAULT_CHECKPOINT_ENOSPC_AT: expected a non-negative integer, got 'x'");
  const qlora::FaultHooks f = from({{"QLORA_FAULT_SIGTERM_AT", "4:1"}, {"QLORA_FAULT_PERTURB_AT", "3"},
                                    {"QLORA_FAULT_STEP_DELAY_MS", "500"}, {"QLORA_FAULT_SLOW_CHECKPOINT_MS", "300"},
                                    {"QLORA_FAULT_LOAD_DELAY_MS", "8000"}});
  EXPECT_EQ(f.load_delay_ms, 8000);
  EXPECT_EQ(f.sigterm_step, 4);
  EXPECT_EQ(f.sigterm_micro, 1);
  EXPECT_EQ(f.perturb_step, 3);
  EXPECT_EQ(f.step_delay_ms, 500);
  EXPECT_EQ(f.slow_checkpoint_ms, 300);
  EXPECT_EQ(qlora::test::error_of([&] { from({{"QLORA_FAULT_SIGTERM_AT", "4"}}); }),
            "QLORA_FAULT_SIGTERM_AT: expected STEP:MICRO (non-negative integers), got '4'");
  EXPECT_EQ(qlora::test::error_of([&] { from({{"QLORA_FAULT_SIGTERM_AT", "4:1x"}}); }),
            "QLORA_FAULT_SIGTERM_AT: expected STEP:MICRO (non-negative integers), got '4:1x'");
  EXPECT_EQ(qlora::test::error_of([&] { from({{"QLORA_FAULT_STEP_DELAY_MS", "fast"}}); }),
            "QLORA_FAULT_STEP_DELAY_MS: expected a non-negative integer, got 'fast'");
  EXPECT_EQ(qlora::test::error_of([&] { from({{"QLORA_FAULT_SLOW_CHECKPOINT_MS", "-3"}}); }),
            "QLORA_FAULT_SLOW_CHECKPOINT_MS: expected a non-negative integer, got '-3'");
  EXPECT_EQ(qlora::test::error_of([&] { from({{"QLORA_FAULT_PERTURB_AT", ""}}); }),
            "QLORA_FAULT_PERTURB_AT: expected a non-negative integer, got ''");
}

}  // namespace
