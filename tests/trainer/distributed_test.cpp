// Data-parallel training (issue 14, docs/distributed.md) on CPU: two `qlora train` processes
// with torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT = a free port)
// meet through c10d's TCPStore and allreduce over Gloo. Checked against the single-process run
// with the same global batches (1 rank × accumulation 2 == 2 ranks × accumulation 1): per-step
// loss, grad_norm and token count, and the final adapter, within 1e-6 relative (fp32; observed
// bit-identical, since two-term float sums commute). Also: SIGTERM on one rank stops both at the
// same step with one checkpoint and exit 75, and the resumed run ends byte-identical; SIGKILL of
// rank 1 makes rank 0 fail naming rank 1; bad environments and differing configs are one-line
// errors naming the variable or key, exit 1, nothing written; QLORA_DIST_FORCE_PG=1 at world size 1
// (the process group over one rank) equals the plain single process to the byte. The tiny model of
// tiny_run.h, LoRA dropout off (its masks come from each process's generator: see
// docs/distributed.md) except in the resume case, which checks each rank resumes its own.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/files.h"
#include "common/safetensors.h"
#include "test_util.h"
#include "tiny_run.h"

namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;
using Out = qlora::test::CommandResult;

using qlora::test::free_tcp_port;

struct Step {
  double loss, grad_norm;
  int64_t tokens;
};

class DataParallel : public qlora::test::TinyRunSuite<DataParallel> {
 public:
  static constexpr const char* kTempName = "distributed";
  static constexpr int kSaveSteps = 0;

 protected:
  /// `qlora train` of the tiny run with LoRA dropout off, one intra-op thread, and `extra` flags.
  static std::string train_cmd(const fs::path& out, const std::string& extra) {
    return ::qlora::test::qlora_bin() + " train " + (root / "run.yaml").string() + " --set output_dir=" + out.string() +
           " --set lora.dropout=0 " + extra;
  }
  static Out single(const fs::path& out, const std::string& extra) {
    return qlora::test::run_command("OMP_NUM_THREADS=1 " + train_cmd(out, extra));
  }
  /// Both ranks of a 2-rank job; rank r runs with env `env[r]` and flags `extra[r]`. Returns the
  /// two results (status, output).
  static std::vector<Out> two_ranks(const fs::path& out, const std::array<std::string, 2>& extra,
                                    const std::array<std::string, 2>& env = {"", ""}) {
    const int port = free_tcp_port();
    EXPECT_GT(port, 0);
    const std::string common = "OMP_NUM_THREADS=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
                               std::to_string(port) + " QLORA_DIST_TIMEOUT_S=60 ";
    const fs::path log1 = out.string() + ".rank1.log";
    const std::string cmd = "exec 2>&1; (" + common + "RANK=1 " + env[1] + " " + train_cmd(out, extra[1]) + " > " +
                            log1.string() + " 2>&1; echo $? > " + log1.string() + ".rc) & " + common + "RANK=0 " +
                            env[0] + " " + train_cmd(out, extra[0]) + "; rc=$?; wait; exit $rc";
    Out r0 = qlora::test::run_command(cmd);
    Out r1{-1, ""};
    if (fs::exists(log1)) r1.out = qlora::read_file(log1.string());
    if (fs::exists(log1.string() + ".rc")) r1.status = std::stoi(qlora::read_file(log1.string() + ".rc"));
    return {r0, r1};
  }
  /// The same global batches two ways, flags `common` on both: one process with accumulation 2
  /// into `one`, two ranks with accumulation 1 into `two`. True when all three exited 0.
  static bool one_and_two_ranks(const fs::path& one, const fs::path& two, const std::string& common) {
    const Out s = single(one, common + "--set training.gradient_accumulation_steps=2");
    EXPECT_EQ(s.status, 0) << s.out;
    const std::string ex = common + "--set training.gradient_accumulation_steps=1";
    const auto r = two_ranks(two, {ex, ex});
    EXPECT_EQ(r[0].status, 0) << r[0].out;
    EXPECT_EQ(r[1].status, 0) << r[1].out;
    return s.status == 0 && r[0].status == 0 && r[1].status == 0;
  }
  static std::vector<Step> steps(const fs::path& out) {
    std::vector<Step> v;
    std::ifstream in(out / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      const json j = json::parse(line);
      EXPECT_EQ(j["step"].get<int64_t>(), static_cast<int64_t>(v.size()) + 1) << out;
      v.push_back({j["loss"].get<double>(), j["grad_norm"].get<double>(), j["tokens"].get<int64_t>()});
    }
    return v;
  }
  /// Largest |a - b| / max|a| over the F32 tensors of two adapter files (same names and shapes).
  static double adapter_rel_diff(const fs::path& a, const fs::path& b) {
    qlora::st::SafetensorsFile fa((a / "adapter_model.safetensors").string());
    qlora::st::SafetensorsFile fb((b / "adapter_model.safetensors").string());
    EXPECT_EQ(fa.tensors().size(), fb.tensors().size());
    double worst = 0;
    for (const qlora::st::TensorInfo& ta : fa.tensors()) {
      const qlora::st::TensorInfo& tb = fb.info(ta.name);
      EXPECT_EQ(ta.shape, tb.shape) << ta.name;
      EXPECT_EQ(ta.dtype, qlora::st::DType::F32) << ta.name;
      if (ta.shape != tb.shape || ta.dtype != qlora::st::DType::F32) return INFINITY;
      const float* x = reinterpret_cast<const float*>(fa.data(ta));
      const float* y = reinterpret_cast<const float*>(fb.data(tb));
      double scale = 0, diff = 0;
      for (int64_t i = 0; i < ta.numel(); ++i) {
        scale = std::max(scale, std::fabs(double(x[i])));
        diff = std::max(diff, std::fabs(double(x[i]) - double(y[i])));
      }
      worst = std::max(worst, scale > 0 ? diff / scale : diff);
    }
    return worst;
  }
  /// The parity check: per-step loss / grad_norm / tokens and the adapter of `one` and `two`.
  static void expect_same_run(const fs::path& one, const fs::path& two, size_t n_steps) {
    const auto a = steps(one), b = steps(two);
    ASSERT_EQ(a.size(), n_steps);
    ASSERT_EQ(b.size(), n_steps);
    for (size_t i = 0; i < n_steps; ++i) {
      EXPECT_NEAR(b[i].loss, a[i].loss, 1e-6 * std::fabs(a[i].loss)) << "step " << i + 1;
      EXPECT_NEAR(b[i].grad_norm, a[i].grad_norm, 1e-6 * std::fabs(a[i].grad_norm)) << "step " << i + 1;
      EXPECT_EQ(b[i].tokens, a[i].tokens) << "step " << i + 1 << ": tokens count all ranks";
    }
    EXPECT_LE(adapter_rel_diff(one, two), 1e-6);
    // Stronger, for two ranks: every cross-rank sum then has two terms, and a two-term fp32 sum
    // commutes exactly, so the allreduce gives autograd's accumulation bit for bit.
    EXPECT_EQ(qlora::read_file((one / "adapter_model.safetensors").string()),
              qlora::read_file((two / "adapter_model.safetensors").string()))
        << "2 ranks: expected byte-identical adapters";
    // The update did something: the adapter is not the initial one (B starts at zero).
    EXPECT_GT(a.front().loss - a.back().loss, 0.0);
  }
};

// micro-batch 2: 24 examples = 12 micro-batches per epoch, 6 steps of 4 rows; rank r trains the
// micro-batches i % 2 == r of each global group.
TEST_F(DataParallel, TwoRanksEqualOneRankWithAccumulation) {
  const fs::path one = root / "acc2", two = root / "ws2";
  Out s = single(one, "--set training.num_epochs=1 --set training.gradient_accumulation_steps=2");
  ASSERT_EQ(s.status, 0) << s.out;
  const std::string ex = "--set training.num_epochs=1 --set training.gradient_accumulation_steps=1 "
                         "--set cost.gpu_hour_price=3.6";
  auto r = two_ranks(two, {ex, ex});
  ASSERT_EQ(r[0].status, 0) << r[0].out;
  ASSERT_EQ(r[1].status, 0) << r[1].out;
  EXPECT_NE(r[0].out.find("global batch 2 x 1 x 2 = 4 rows per optimizer step"), std::string::npos) << r[0].out;
  expect_same_run(one, two, 6);
  // memory_report.json (rank 0 writes it) holds every rank's measurement, and its per-rank estimate
  // has the flat fp32 gradient buffer: 4 bytes per LoRA parameter.
  const json mem = json::parse(qlora::read_file((two / "memory_report.json").string()));
  ASSERT_EQ(mem["ranks"].size(), 2u) << mem.dump(1);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(mem["ranks"][k]["rank"], k);
    EXPECT_GT(mem["ranks"][k]["phases"]["peak"]["peak_rss_bytes"].get<int64_t>(), 0) << k;
    EXPECT_GE(mem["ranks"][k]["phases"]["peak"]["peak_rss_bytes"].get<int64_t>(),
              mem["ranks"][k]["phases"]["after_load"]["rss_bytes"].get<int64_t>()) << k;
  }
  EXPECT_NE(mem["ranks"][0]["pid"], mem["ranks"][1]["pid"]) << "two processes, two measurements";
  EXPECT_EQ(mem["estimate"]["options"]["world_size"], 2);
  int64_t buffer = -1;
  for (const json& c : mem["estimate"]["components"])
    if (c["name"] == "gradient allreduce buffer (fp32, flat)") buffer = c["bytes"].get<int64_t>();
  EXPECT_EQ(buffer, 4 * mem["estimate"]["lora_parameters"].get<int64_t>());
  EXPECT_GT(buffer, 0);
  // summary.json: tokens count both ranks; the cost bills both devices for the wall time.
  const json sum = json::parse(qlora::read_file((two / "summary.json").string()));
  EXPECT_EQ(sum["cost"]["devices"], 2);
  EXPECT_NEAR(sum["cost"]["run"].get<double>(), 3.6 * sum["cost"]["billed_seconds"].get<double>() / 3600.0 * 2, 1e-12);
  EXPECT_NEAR(sum["cost"]["billed_seconds"].get<double>(),
              sum["wall_seconds"].get<double>() + sum["setup_seconds"].get<double>(), 1e-9);  // no resume: no redone steps
  int64_t tokens = 0;
  for (const Step& st : steps(two)) tokens += st.tokens;
  EXPECT_EQ(sum["input_tokens"].get<int64_t>(), tokens);
  // Rank 0 alone writes: one metrics line per step, one adapter, one run.json.
  EXPECT_TRUE(fs::exists(two / "adapter_model.safetensors"));
  EXPECT_TRUE(fs::exists(two / "summary.json"));
  EXPECT_EQ(r[1].out.find("step 1/"), std::string::npos) << "rank 1 logs no steps:\n" << r[1].out;
}

// lora.model_dir at WORLD_SIZE 2: each rank reads the adapter and starts from it, so two ranks equal
// one rank with accumulation 2 byte for byte, as without the key (a rank that started from fresh
// weights would leave the replicas apart: another adapter, and the replica check's error).
TEST_F(DataParallel, TwoRanksStartFromTheInitialAdapterAsOneRankDoes) {
  const fs::path init = root / "init_adapter", one = root / "init_acc2", two = root / "init_ws2";
  Out s = single(init, "--set training.max_steps=2");
  ASSERT_EQ(s.status, 0) << s.out;
  const std::string from = "--set lora.model_dir=" + init.string() + " --set training.num_epochs=1 ";
  s = single(one, from + "--set training.gradient_accumulation_steps=2");
  ASSERT_EQ(s.status, 0) << s.out;
  EXPECT_NE(s.out.find("lora: initialised from " + init.string()), std::string::npos) << s.out;
  const std::string ex = from + "--set training.gradient_accumulation_steps=1";
  auto r = two_ranks(two, {ex, ex});
  ASSERT_EQ(r[0].status, 0) << r[0].out;
  ASSERT_EQ(r[1].status, 0) << r[1].out;
  expect_same_run(one, two, 6);
}

// micro-batch 5: 5 micro-batches per epoch (the last of 4 rows), so each epoch's last global group
// holds ONE micro-batch and rank 1 contributes zero gradient and zero targets to that step.
TEST_F(DataParallel, ShortGroupAtEpochEndLeavesARankIdle) {
  const fs::path one = root / "mb5_acc2", two = root / "mb5_ws2";
  ASSERT_TRUE(one_and_two_ranks(one, two, "--set training.micro_batch_size=5 --set training.num_epochs=2 "));
  expect_same_run(one, two, 6);
}

// SIGTERM to rank 1 alone while rank 0 writes checkpoint-2 (slowed by the fault hook) stops both
// ranks right after that checkpoint, as a signal to one process does (docs/checkpoints.md): the
// other ranks wait for the write before they share their stop flags (trial 18: rank 1's flag went
// out at once, before the signal, and the job did step 3 and wrote checkpoint-4).
TEST_F(DataParallel, SigtermToAnotherRankDuringTheCheckpointWriteStopsAfterIt) {
  const fs::path out = root / "term_during_write";
  const int port = free_tcp_port();
  ASSERT_GT(port, 0);
  const std::string common = "OMP_NUM_THREADS=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) +
                             " QLORA_DIST_TIMEOUT_S=60 ";
  const std::string flags = "--set checkpoint.save_steps=2 --set training.max_steps=8";
  const fs::path log0 = out.string() + ".rank0.log", log1 = out.string() + ".rank1.log";
  const Out o = qlora::test::run_command(
      "(" + common + "RANK=0 QLORA_FAULT_SLOW_CHECKPOINT_MS=3000 " + train_cmd(out, flags) + " > " + log0.string() +
      " 2>&1; echo rc0=$? >> " + log0.string() + ") & A=$!; " + common + "RANK=1 " + train_cmd(out, flags) + " > " +
      log1.string() + " 2>&1 & B=$!; while kill -0 $A 2>/dev/null && ! ls -a " + (out / "checkpoints").string() +
      " 2>/dev/null | grep -q '^.tmp-checkpoint-2-'; do sleep 0.05; done; sleep 0.5; kill -TERM $B; wait $B; echo rc1=$?; "
      "wait $A");
  const std::string l0 = qlora::read_file(log0.string()), l1 = qlora::read_file(log1.string());
  EXPECT_TRUE(qlora::test::contains(l0, "rc0=75")) << l0;
  EXPECT_TRUE(qlora::test::contains(o.out, "rc1=75")) << o.out << l1;
  EXPECT_TRUE(qlora::test::contains(l0, "(during the checkpoint write)")) << l0;
  std::vector<std::string> ckpts;
  for (const auto& e : fs::directory_iterator(out / "checkpoints")) ckpts.push_back(e.path().filename().string());
  EXPECT_EQ(ckpts, std::vector<std::string>{"checkpoint-2"}) << l0;
  EXPECT_EQ(steps(out).size(), 2u) << l0;
}

// Evaluation is sharded: each rank computes its share of the eval batches (batch k on rank
// k % 2) and one allreduce of the per-batch sums gives the eval_loss of one process bit for bit
// (trial 18: rank 0 evaluated alone while the other rank's wait ran into QLORA_DIST_TIMEOUT_S).
// Rank 1's memory report has the after_first_eval phase only because it evaluated.
TEST_F(DataParallel, EvaluationIsShardedAndEqualsOneProcess) {
  const fs::path one = root / "eval_acc2", two = root / "eval_ws2";
  ASSERT_TRUE(one_and_two_ranks(
      one, two, "--set data.val_set_size=5 --set training.eval_steps=2 --set training.num_epochs=1 "));
  auto evals = [](const fs::path& out) {
    std::vector<std::pair<int64_t, double>> v;
    std::ifstream in(out / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      const json j = json::parse(line);
      if (j.contains("eval_loss")) v.emplace_back(j["step"].get<int64_t>(), j["eval_loss"].get<double>());
    }
    return v;
  };
  const auto a = evals(one), b = evals(two);
  ASSERT_GE(a.size(), 2u) << "eval_steps 2 and the last step";
  ASSERT_EQ(b.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(b[i].first, a[i].first);
    EXPECT_EQ(b[i].second, a[i].second) << "step " << a[i].first << ": the same eval_loss bit for bit";
  }
  const json mem = json::parse(qlora::read_file((two / "memory_report.json").string()));
  ASSERT_EQ(mem["ranks"].size(), 2u) << mem.dump(1);
  EXPECT_TRUE(mem["ranks"][1]["phases"].contains("after_first_eval")) << mem["ranks"][1].dump(1);
}

// SIGTERM to rank 1 alone (test hook: while step 4 draws global micro-batch 1) stops BOTH ranks
// after step 4: one checkpoint-4 by rank 0, exit 75 on both; the rerun resumes and ends
// byte-identical to the uninterrupted 2-rank run. With LoRA dropout on: each rank resumes its own
// generator (rng.safetensors "cpu.rank1"); with rank 0's restored on both, rank 1's masks after
// the resume differ and so does the adapter. The interrupted run also saves by save_minutes
// (rank 0's clock, shared with the other rank: every rank takes part in each checkpoint).
TEST_F(DataParallel, SigtermOnOneRankStopsAllAtTheSameStepAndResumesExactly) {
  const fs::path ref = root / "sig_ref", out = root / "sig";
  const std::string ex = "--set training.micro_batch_size=5 --set training.num_epochs=2 "
                         "--set training.gradient_accumulation_steps=1 --set lora.dropout=0.1";
  const std::string minutes = ex + " --set checkpoint.save_minutes=0.0001";
  auto r = two_ranks(ref, {ex, ex});
  ASSERT_EQ(r[0].status, 0) << r[0].out;
  r = two_ranks(out, {minutes, minutes}, {"", "QLORA_FAULT_SIGTERM_AT=4:1"});
  EXPECT_NE(r[0].out.find("save_minutes"), std::string::npos) << r[0].out;
  {
    qlora::st::SafetensorsFile rng((out / "checkpoints" / "checkpoint-4" / "rng.safetensors").string());
    EXPECT_TRUE(rng.contains("cpu") && rng.contains("cpu.rank1") && !rng.contains("cpu.rank2"));
  }
  EXPECT_EQ(r[0].status, 75) << r[0].out;
  EXPECT_EQ(r[1].status, 75) << r[1].out;
  EXPECT_NE(r[0].out.find("stopped at step 4 by signal"), std::string::npos) << r[0].out;
  EXPECT_NE(r[1].out.find("stopped at step 4 by signal"), std::string::npos) << r[1].out;
  // Ranks started by hand: each reruns its own command (rank 0's line says so, as rank 1's does).
  EXPECT_NE(r[0].out.find("; run the same command on every rank again to resume: "), std::string::npos) << r[0].out;
  EXPECT_NE(r[1].out.find("; run the same command on every rank again to resume"), std::string::npos) << r[1].out;
  EXPECT_TRUE(fs::exists(out / "checkpoints" / "checkpoint-4" / "manifest.json"));
  EXPECT_FALSE(fs::exists(out / "adapter_model.safetensors"));
  r = two_ranks(out, {ex, ex});
  ASSERT_EQ(r[0].status, 0) << r[0].out;
  ASSERT_EQ(r[1].status, 0) << r[1].out;
  EXPECT_NE(r[0].out.find("resume: from"), std::string::npos) << r[0].out;
  EXPECT_EQ(qlora::read_file((out / "adapter_model.safetensors").string()),
            qlora::read_file((ref / "adapter_model.safetensors").string()));
  const auto a = steps(ref), b = steps(out);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].loss, b[i].loss) << "step " << i + 1;
}

// Checkpoints record the world size: a 2-rank checkpoint resumed by 1 rank is refused naming
// WORLD_SIZE; with --force and accumulation 2 (the same global batches) the run continues at the
// same global sample and ends with the uninterrupted 2-rank run's adapter (within 1e-6).
TEST_F(DataParallel, WorldSizeChangeOnResumeIsRefusedUnlessForced) {
  const fs::path ref = root / "ws_ref", out = root / "ws_change";
  const std::string ex = "--set training.micro_batch_size=5 --set training.num_epochs=2 ";
  auto r = two_ranks(ref, {ex + "--set training.gradient_accumulation_steps=1",
                           ex + "--set training.gradient_accumulation_steps=1"});
  ASSERT_EQ(r[0].status, 0) << r[0].out;
  r = two_ranks(out, {ex + "--set training.gradient_accumulation_steps=1",
                      ex + "--set training.gradient_accumulation_steps=1"},
                {"QLORA_FAULT_SIGTERM_AT=4:0", ""});
  ASSERT_EQ(r[0].status, 75) << r[0].out;
  Out o = single(out, ex + "--set training.gradient_accumulation_steps=1");
  EXPECT_EQ(o.status, 1) << o.out;
  EXPECT_NE(o.out.find("refused: it was written by a job of WORLD_SIZE=2, this one has WORLD_SIZE=1 "
                       "(global batch 10 -> 5 rows; use --force"),
            std::string::npos)
      << o.out;
  // Accumulation 1 -> 2 with WORLD_SIZE 2 -> 1: both named in one refusal, with the unchanged
  // global batch (5 x 1 x 2 = 5 x 2 x 1 = 10 rows) and what --force does.
  o = single(out, ex + "--set training.gradient_accumulation_steps=2");
  EXPECT_EQ(o.status, 1) << o.out;
  EXPECT_NE(o.out.find("refused: settings that change the run differ: training.gradient_accumulation_steps: 1 -> 2; "
                       "WORLD_SIZE: 2 -> 1 (ranks of the job that wrote it -> this one's); the global batch "
                       "(micro_batch_size x gradient_accumulation_steps x WORLD_SIZE) is unchanged at 10 rows, so "
                       "--force resumes it: the data continues at the same global sample (use --force"),
            std::string::npos)
      << o.out;
  EXPECT_EQ(o.out.find("lora: r="), std::string::npos) << "refused only after the model load:\n" << o.out;
  o = single(out, ex + "--set training.gradient_accumulation_steps=2 --force");
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_NE(o.out.find("resume: --force: WORLD_SIZE 2 -> 1"), std::string::npos) << o.out;
  expect_same_run(ref, out, 6);
}

// SIGKILL of rank 1 mid-run (as soon as rank 0 has written checkpoint-2): rank 0 fails well
// within 60 s with one line naming rank 1; checkpoint-2 stays valid and the rerun resumes from it
// and finishes.
TEST_F(DataParallel, SigkilledRankMakesTheOtherFailNamingItAndTheRerunResumes) {
  const fs::path out = root / "kill";
  const std::string ex = "--set training.micro_batch_size=5 --set training.num_epochs=2 "
                         "--set training.gradient_accumulation_steps=1 --set checkpoint.save_steps=1";
  const std::string ck2 = (out / "checkpoints" / "checkpoint-2").string();
  const auto t0 = std::chrono::steady_clock::now();
  // Rank 1 runs under a watcher shell that SIGKILLs it once checkpoint-2 exists; the step delay
  // (test hook) keeps the run going meanwhile.
  auto r = two_ranks(out, {ex, ex},
                     {"QLORA_FAULT_STEP_DELAY_MS=500",
                      "QLORA_FAULT_STEP_DELAY_MS=500 sh -c '\"$0\" \"$@\" & p=$!; while kill -0 $p 2>/dev/null && "
                      "[ ! -e " + ck2 + " ]; do sleep 0.05; done; kill -9 $p; wait $p' "});
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(r[0].status, 0) << r[0].out;
  EXPECT_EQ(r[1].status, 137) << r[1].out;
  EXPECT_LT(secs, 60.0);
  EXPECT_NE(r[0].out.find("error: distributed:"), std::string::npos) << r[0].out;
  EXPECT_NE(r[0].out.find("lost rank 1"), std::string::npos) << r[0].out;
  EXPECT_FALSE(fs::exists(out / "adapter_model.safetensors"));
  EXPECT_TRUE(fs::exists(fs::path(ck2) / "manifest.json"));
  r = two_ranks(out, {ex, ex});
  ASSERT_EQ(r[0].status, 0) << r[0].out;
  ASSERT_EQ(r[1].status, 0) << r[1].out;
  EXPECT_NE(r[0].out.find("resume: from"), std::string::npos) << r[0].out;
  EXPECT_EQ(steps(out).size(), 6u);
}

// Rank 0 killed while rank 1 waits for a value from it outside a collective (here the 'lock' after
// the model load: rank 0 is held before its load by the load-delay hook and killed 3 s into it, when
// rank 1, which has no delay, has loaded the tiny model):
// rank 1 says that rank 0's connection closed (not a timeout), exits 1 at once, nothing of the run
// is written, and the rerun runs.
TEST_F(DataParallel, RankZeroKilledWhileAnotherWaitsForItIsNamedAndTheRerunRuns) {
  const fs::path out = root / "kill0";
  const std::string ex = "--set training.num_epochs=1 --set training.gradient_accumulation_steps=1";
  const std::string log0 = out.string() + ".rank0.log";  // rank 1 is quiet until its error: rank 0's says when
  const auto t0 = std::chrono::steady_clock::now();
  auto r = two_ranks(out, {ex, ex},
                     {"QLORA_FAULT_LOAD_DELAY_MS=30000 sh -c '\"$0\" \"$@\" > " + log0 + " 2>&1 & p=$!; until grep -q "
                          "QLORA_FAULT_LOAD_DELAY_MS " + log0 + "; do kill -0 $p 2>/dev/null || exit 3; sleep 0.05; "
                          "done; sleep 3; kill -9 $p; wait $p' ",
                      ""});
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r[0].status, 137) << r[0].out;
  EXPECT_EQ(r[1].status, 1) << r[1].out;
  EXPECT_LT(secs, 50.0) << "rank 1 must not wait for QLORA_DIST_TIMEOUT_S (60 s)";
  EXPECT_NE(r[1].out.find("error: distributed: rank 1 got no 'lock' from rank 0: rank 0's connection closed after "),
            std::string::npos)
      << r[1].out;
  EXPECT_NE(r[1].out.find("before this rank got 'lock': rank 0 exited or was killed (its log says why)"),
            std::string::npos)
      << r[1].out;
  EXPECT_EQ(r[1].out.find("nothing within"), std::string::npos) << r[1].out;
  EXPECT_FALSE(fs::exists(out / "run.lock"));
  EXPECT_FALSE(fs::exists(out / "adapter_model.safetensors"));
  r = two_ranks(out, {ex, ex});
  ASSERT_EQ(r[0].status, 0) << r[0].out;
  ASSERT_EQ(r[1].status, 0) << r[1].out;
  EXPECT_EQ(steps(out).size(), 6u);
}

// `qlora train --nproc-per-node 2` starts both ranks itself (torchrun's environment, a free port):
// the adapter is byte-identical to the hand-launched 2-rank run's. SIGTERM to the launcher alone is
// forwarded: both ranks stop at the same step with one checkpoint and exit 75, the launcher exits
// 75, and the rerun (the same command) resumes and ends byte-identical again.
TEST_F(DataParallel, NprocPerNodeLaunchesTheRanksAndForwardsSigterm) {
  const fs::path ref = root / "np_ref", out = root / "np", stopped = root / "np_sig";
  const std::string ex = "--set training.micro_batch_size=5 --set training.num_epochs=2 "
                         "--set training.gradient_accumulation_steps=1";
  auto r = two_ranks(ref, {ex, ex});
  ASSERT_EQ(r[0].status, 0) << r[0].out;
  const std::string launch = "env -u RANK -u WORLD_SIZE -u MASTER_PORT -u OMP_NUM_THREADS QLORA_DIST_TIMEOUT_S=60 ";
  Out o = qlora::test::run_command(launch + train_cmd(out, ex + " --nproc-per-node 2"));
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_NE(o.out.find("launch: starting 2 local ranks (WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="),
            std::string::npos) << o.out;
  EXPECT_NE(o.out.find("OMP_NUM_THREADS=1)"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("distributed: rank 0 of 2 (local rank 0, from qlora --nproc-per-node), Gloo on CPU"),
            std::string::npos) << o.out;
  EXPECT_NE(o.out.find("global batch 5 x 1 x 2 = 10 rows"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("launch: rank 0 exited with status 0"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("launch: rank 1 exited with status 0"), std::string::npos) << o.out;
  EXPECT_EQ(qlora::read_file((out / "adapter_model.safetensors").string()),
            qlora::read_file((ref / "adapter_model.safetensors").string()));

  // SIGTERM to the launcher once step 2 is logged; the step delay (test hook, inherited by the
  // ranks) keeps the run from ending first.
  const fs::path log = stopped.string() + ".log", metrics = stopped / "metrics.jsonl";
  o = qlora::test::run_command(launch + "QLORA_FAULT_STEP_DELAY_MS=400 " + train_cmd(stopped, ex + " --nproc-per-node 2") +
                               " > " + log.string() + " 2>&1 & L=$!; while kill -0 $L 2>/dev/null && " +
                               "[ \"$(cat " + metrics.string() + " 2>/dev/null | wc -l)\" -lt 2 ]; do sleep 0.05; done; " +
                               "kill -TERM $L; wait $L; echo rc=$?");
  const std::string lg = fs::exists(log) ? qlora::read_file(log.string()) : "";
  EXPECT_NE(o.out.find("rc=75"), std::string::npos) << o.out << lg;
  EXPECT_NE(lg.find("launch: forwarding signal 15"), std::string::npos) << lg;
  EXPECT_NE(lg.find("launch: rank 0 exited with status 75"), std::string::npos) << lg;
  EXPECT_NE(lg.find("launch: rank 1 exited with status 75"), std::string::npos) << lg;
  EXPECT_FALSE(fs::exists(stopped / "adapter_model.safetensors"));
  EXPECT_TRUE(fs::is_directory(stopped / "checkpoints") && !fs::is_empty(stopped / "checkpoints")) << lg;
  // A resume with another accumulation is refused by rank 0 before any rank loads the model, and
  // said once: rank 1 (which only relays rank 0's error) exits 1 quietly.
  const std::string ex2 = "--set training.micro_batch_size=5 --set training.num_epochs=2 "
                          "--set training.gradient_accumulation_steps=2";
  o = qlora::test::run_command(launch + train_cmd(stopped, ex2 + " --nproc-per-node=2"));
  EXPECT_EQ(o.status, 1) << o.out;
  size_t n_refused = 0;
  for (size_t at = o.out.find("refused: settings that change the run differ"); at != std::string::npos;
       at = o.out.find("refused: settings that change the run differ", at + 1))
    ++n_refused;
  EXPECT_EQ(n_refused, 1u) << o.out;
  EXPECT_NE(o.out.find("error: resume from "), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("training.gradient_accumulation_steps: 1 -> 2 (use --force"), std::string::npos) << o.out;
  EXPECT_EQ(o.out.find("lora: r="), std::string::npos) << "refused only after the model load:\n" << o.out;
  EXPECT_NE(o.out.find("launch: rank 1 exited with status 1"), std::string::npos) << o.out;
  EXPECT_EQ(o.out.find(" within "), std::string::npos) << o.out;
  o = qlora::test::run_command(launch + train_cmd(stopped, ex + " --nproc-per-node=2"));
  ASSERT_EQ(o.status, 0) << o.out;
  EXPECT_NE(o.out.find("resume: from"), std::string::npos) << o.out;
  EXPECT_EQ(qlora::read_file((stopped / "adapter_model.safetensors").string()),
            qlora::read_file((ref / "adapter_model.safetensors").string()));
}

// A run owns its output_dir with --nproc-per-node too: rank 0 holds the lock (the ranks do not
// wait on each other for it), so a second launch on the same output_dir while the first job runs
// fails at once, naming the holder, and the first job is untouched (it stops at SIGTERM with 75).
TEST_F(DataParallel, NprocPerNodeSecondLaunchOnTheSameOutputDirIsRefused) {
  const fs::path out = root / "np_lock";
  const std::string ex = "--set training.micro_batch_size=5 --set training.num_epochs=2 "
                         "--set training.gradient_accumulation_steps=1 --nproc-per-node 2";
  const std::string launch = "env -u RANK -u WORLD_SIZE -u MASTER_PORT -u OMP_NUM_THREADS QLORA_DIST_TIMEOUT_S=60 ";
  const fs::path log = out.string() + ".log", metrics = out / "metrics.jsonl";
  Out o = qlora::test::run_command(launch + "QLORA_FAULT_STEP_DELAY_MS=1500 " + train_cmd(out, ex) + " > " +
                                   log.string() + " 2>&1 & L=$!; while kill -0 $L 2>/dev/null && " + "[ \"$(cat " +
                                   metrics.string() + " 2>/dev/null | wc -l)\" -lt 1 ]; do sleep 0.05; done; " +
                                   launch + train_cmd(out, ex) + " 2>&1; echo rc2=$?; kill -TERM $L; wait $L; echo rc=$?");
  const std::string lg = fs::exists(log) ? qlora::read_file(log.string()) : "";
  EXPECT_NE(o.out.find("rc=75"), std::string::npos) << o.out << lg;
  EXPECT_EQ(o.out.find("rc2=0"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("output_dir " + out.string() + " is in use by another qlora train (pid "), std::string::npos)
      << o.out;
  EXPECT_EQ(o.out.find("step 1/"), std::string::npos) << "the second launch trained:\n" << o.out;
  EXPECT_NE(lg.find("launch: rank 0 exited with status 75"), std::string::npos) << lg;
  EXPECT_NE(lg.find("launch: rank 1 exited with status 75"), std::string::npos) << lg;
}

// Ctrl-C in a terminal signals the whole foreground process group (here: the launcher started in a
// session of its own, and `kill -INT -PGID`). The ranks run in sessions of their own, so each
// gets the launcher's one forwarded SIGINT per Ctrl-C: once = one checkpoint, every rank 75, the
// launcher 75; twice (the rerun resumes, then two Ctrl-C while a step sleeps, test hook) = every
// rank quits at once, the launcher exits 130, and the first stop's checkpoint is still the newest.
TEST_F(DataParallel, NprocPerNodeCtrlCOnceCheckpointsTwiceQuits) {
  const fs::path out = root / "np_ctrlc";
  // 24 examples, 12 per rank in micro-batches of 2: 6 steps an epoch, 12 in all.
  const std::string ex = "--set training.micro_batch_size=2 --set training.num_epochs=2 "
                         "--set training.gradient_accumulation_steps=1 --set checkpoint.save_steps=100";
  auto ctrl_c = [&](int times, int after_lines) {
    const fs::path log = out.string() + "." + std::to_string(times) + ".log", metrics = out / "metrics.jsonl";
    std::string kills = "kill -INT -$L";
    for (int i = 1; i < times; ++i) kills += "; sleep 0.3; kill -INT -$L";
    Out o = qlora::test::run_command(
        "env -u RANK -u WORLD_SIZE -u MASTER_PORT -u OMP_NUM_THREADS QLORA_DIST_TIMEOUT_S=60 "
        "QLORA_FAULT_STEP_DELAY_MS=1500 setsid " + train_cmd(out, ex + " --nproc-per-node 2") + " > " + log.string() +
        " 2>&1 & L=$!; while kill -0 $L 2>/dev/null && [ \"$(cat " + metrics.string() + " 2>/dev/null | wc -l)\" -lt " +
        std::to_string(after_lines) + " ]; do sleep 0.05; done; " + kills + "; wait $L; echo rc=$?");
    return o.out + (fs::exists(log) ? qlora::read_file(log.string()) : "");
  };
  std::string lg = ctrl_c(1, 2);
  EXPECT_NE(lg.find("rc=75"), std::string::npos) << lg;
  EXPECT_NE(lg.find("launch: forwarding signal 2"), std::string::npos) << lg;
  // the resume hint is the launcher's command; rank 1 leaves it to rank 0
  EXPECT_NE(lg.find("run the same command again to resume: qlora train "), std::string::npos) << lg;
  EXPECT_NE(lg.find(" --nproc-per-node 2\n"), std::string::npos) << lg;
  EXPECT_EQ(lg.find("on every rank"), std::string::npos) << lg;
  EXPECT_NE(lg.find("launch: rank 0 exited with status 75"), std::string::npos) << lg;
  EXPECT_NE(lg.find("launch: rank 1 exited with status 75"), std::string::npos) << lg;
  auto checkpoints = [&] {  // checkpoint-N directories (this binary does not link the trainer)
    std::vector<std::string> v;
    for (const auto& e : fs::directory_iterator(out / "checkpoints"))
      if (e.path().filename().string().rfind("checkpoint-", 0) == 0) v.push_back(e.path().filename().string());
    return v;
  };
  const std::vector<std::string> first = checkpoints();
  ASSERT_EQ(first.size(), 1u) << lg;
  const int64_t k = static_cast<int64_t>(steps(out).size());
  ASSERT_GE(k, 2) << lg;
  ASSERT_LE(k, 4) << lg;

  lg = ctrl_c(2, static_cast<int>(k) + 1);  // the resumed run is in its first step's sleep
  EXPECT_NE(lg.find("resume: from"), std::string::npos) << lg;
  EXPECT_NE(lg.find("rc=130"), std::string::npos) << lg;
  EXPECT_NE(lg.find("qlora: second interrupt: quitting now without a checkpoint"), std::string::npos) << lg;
  EXPECT_NE(lg.find("launch: rank 0 exited with status 130"), std::string::npos) << lg;
  EXPECT_NE(lg.find("launch: rank 1 exited with status 130"), std::string::npos) << lg;
  EXPECT_EQ(checkpoints(), first) << lg;
  EXPECT_TRUE(fs::exists(out / "checkpoints" / first[0] / "manifest.json"));
  EXPECT_FALSE(fs::exists(out / "adapter_model.safetensors"));
}

// A rank that dies while the other cannot notice (both sleep 60 s between steps, test hook): the
// launcher does not wait for the sleeper: after kLaunchGraceSeconds (10) + kLaunchKillSeconds (5)
// it is gone, and the launcher exits with the dead rank's status (137 = SIGKILL).
TEST_F(DataParallel, NprocPerNodeStopsTheOtherRanksWhenOneDies) {
  const fs::path out = root / "np_kill", log = root / "np_kill.log";
  const std::string ex = "--set training.micro_batch_size=5 --set training.gradient_accumulation_steps=1";
  const auto t0 = std::chrono::steady_clock::now();
  Out o = qlora::test::run_command(
      "env -u RANK -u WORLD_SIZE -u MASTER_PORT QLORA_DIST_TIMEOUT_S=120 QLORA_FAULT_STEP_DELAY_MS=60000 " +
      train_cmd(out, ex + " --nproc-per-node 2") + " > " + log.string() + " 2>&1 & L=$!; " +
      "while kill -0 $L 2>/dev/null && [ ! -s " + (out / "metrics.jsonl").string() + " ]; do sleep 0.05; done; " +
      "kill -9 $(sed -n 's/.*launch: started rank 1 (pid \\([0-9]*\\)).*/\\1/p' " + log.string() + "); " +
      "wait $L; echo rc=$?");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string lg = fs::exists(log) ? qlora::read_file(log.string()) : "";
  EXPECT_NE(o.out.find("rc=137"), std::string::npos) << o.out << lg;
  EXPECT_NE(lg.find("launch: rank 1 was killed by signal 9"), std::string::npos) << lg;
  EXPECT_NE(lg.find("sending SIGTERM"), std::string::npos) << lg;
  EXPECT_NE(lg.find("warning: launch: a rank was killed by signal 9; the checkpoints already written are kept: run "
                    "the same command again to resume from the newest complete one"),
            std::string::npos) << lg;
  EXPECT_LT(secs, 45.0) << lg;
}

// --nproc-per-node inside a launched job (RANK / WORLD_SIZE set) or with a bad MASTER_PORT: one
// line naming it, exit 1, no rank started, nothing written.
TEST_F(DataParallel, NprocPerNodeRefusesAnEnvironmentThatIsAlreadyARank) {
  const fs::path out = root / "np_bad";
  Out o = qlora::test::run_command("RANK=0 WORLD_SIZE=2 " + train_cmd(out, "--nproc-per-node 2"));
  EXPECT_EQ(o.status, 1) << o.out;
  EXPECT_EQ(o.out.rfind("error: --nproc-per-node 2: RANK=0 and WORLD_SIZE=2 are already set", 0), 0u) << o.out;
  EXPECT_EQ(std::count(o.out.begin(), o.out.end(), '\n'), 1) << o.out;
  o = qlora::test::run_command("env -u RANK -u WORLD_SIZE MASTER_PORT=70000 " + train_cmd(out, "--nproc-per-node 2"));
  EXPECT_EQ(o.status, 1) << o.out;
  EXPECT_EQ(o.out.rfind("error: MASTER_PORT=70000: must be in 1..65535", 0), 0u) << o.out;
  EXPECT_EQ(o.out.find("launch: started"), std::string::npos) << o.out;
  EXPECT_FALSE(fs::exists(out));
}

// The replica check: rank 1's parameters perturbed after step 3 (test hook QLORA_FAULT_PERTURB_AT,
// 1e-3 on one element) are caught at step 3 (end of epoch 1, before its checkpoint): both ranks
// exit 1 naming step 3 and rank 1; checkpoint-2 (save_steps 2) stays, nothing of step 3 is written.
TEST_F(DataParallel, DivergedReplicaIsAnErrorNamingTheStepAndTheRank) {
  const fs::path out = root / "diverged";
  const std::string ex = "--set training.micro_batch_size=5 --set training.num_epochs=2 "
                         "--set training.gradient_accumulation_steps=1 --set checkpoint.save_steps=2";
  auto r = two_ranks(out, {ex, ex}, {"", "QLORA_FAULT_PERTURB_AT=3"});
  EXPECT_EQ(r[0].status, 1) << r[0].out;
  EXPECT_EQ(r[1].status, 1) << r[1].out;
  const std::string msg = "error: distributed: the LoRA parameters of rank 1 differ from rank 0's after step 3 (checksum ";
  EXPECT_NE(r[0].out.find(msg), std::string::npos) << r[0].out;
  EXPECT_NE(r[1].out.find(msg), std::string::npos) << r[1].out;
  EXPECT_TRUE(fs::exists(out / "checkpoints" / "checkpoint-2" / "manifest.json"));
  EXPECT_FALSE(fs::exists(out / "checkpoints" / "checkpoint-3"));
  EXPECT_FALSE(fs::exists(out / "adapter_model.safetensors"));
  EXPECT_EQ(steps(out).size(), 3u);  // step 3 was logged before the check
}

// Rank 1 with another lora.r: it fails naming the key, and rank 0 fails too (nothing trained).
TEST_F(DataParallel, ConfigDifferingBetweenRanksIsRefusedNamingTheKey) {
  const fs::path out = root / "differ";
  auto r = two_ranks(out, {"", "--set lora.r=8"}, {"env -u OMP_NUM_THREADS", ""});
  EXPECT_EQ(r[1].status, 1) << r[1].out;
  // rank 0 without OMP_NUM_THREADS (a launcher that does not set it): said; rank 1 has it: nothing.
  EXPECT_NE(r[0].out.find("warning: distributed: OMP_NUM_THREADS is not set, so each rank computes with all "),
            std::string::npos) << r[0].out;
  EXPECT_EQ(r[1].out.find("OMP_NUM_THREADS is not set"), std::string::npos) << r[1].out;
  EXPECT_NE(r[1].out.find("error: distributed: rank 1's config differs from rank 0's"), std::string::npos) << r[1].out;
  EXPECT_NE(r[1].out.find("lora.r: 4 -> 8"), std::string::npos) << r[1].out;
  EXPECT_NE(r[0].status, 0) << r[0].out;
  // rank 0 names it too (trial 18: it said only "lost rank 1")
  EXPECT_NE(r[0].out.find("error: distributed: rank 1's config differs from rank 0's (every rank must run the same "
                          "config on the same data): lora.r: 4 -> 8"),
            std::string::npos) << r[0].out;
  EXPECT_FALSE(fs::exists(out / "metrics.jsonl"));

  // The same files at other paths are the same run: the model written relative on rank 1, the
  // data a byte-identical copy elsewhere (trial 18: both refused as a config difference).
  const fs::path same = root / "same_files", copy = root / "data_copy.json";
  fs::copy_file(root / "data.json", copy, fs::copy_options::overwrite_existing);
  const std::string relative_model = fs::relative(root / "model", fs::current_path()).string();
  ASSERT_FALSE(fs::path(relative_model).is_absolute());
  const std::string ex = "--set training.max_steps=2 ";
  r = two_ranks(same, {ex, ex + "--set model.path=" + relative_model + " --set data.train=" + copy.string()});
  EXPECT_EQ(r[0].status, 0) << r[0].out;
  EXPECT_EQ(r[1].status, 0) << r[1].out;
}

// QLORA_DIST_FORCE_PG=1 at world size 1 (the GPU check's NCCL smoke, here over Gloo): the process
// group is made and every collective runs through c10d, and the run equals the plain single
// process to the byte (a one-rank sum is a copy). Once as rank 0 of 1 by torchrun's variables,
// once with neither RANK nor WORLD_SIZE set.
TEST_F(DataParallel, ForcedProcessGroupAtWorldSizeOneEqualsTheSingleProcess) {
  const fs::path plain = root / "ws1_plain", forced = root / "ws1_forced", bare = root / "ws1_bare";
  const std::string ex = "--set training.max_steps=3";
  Out s = single(plain, ex);
  ASSERT_EQ(s.status, 0) << s.out;
  const std::string env = "OMP_NUM_THREADS=1 QLORA_DIST_FORCE_PG=1 MASTER_ADDR=127.0.0.1 QLORA_DIST_TIMEOUT_S=60 ";
  Out f = qlora::test::run_command(env + "RANK=0 WORLD_SIZE=1 MASTER_PORT=" + std::to_string(free_tcp_port()) + " " +
                                   train_cmd(forced, ex));
  ASSERT_EQ(f.status, 0) << f.out;
  EXPECT_NE(f.out.find("distributed: rank 0 of 1 (local rank 0, from RANK/WORLD_SIZE), Gloo on CPU"), std::string::npos)
      << f.out;
  Out b = qlora::test::run_command("env -u RANK -u WORLD_SIZE " + env + "MASTER_PORT=" + std::to_string(free_tcp_port()) +
                                   " " + train_cmd(bare, ex));
  ASSERT_EQ(b.status, 0) << b.out;
  EXPECT_NE(b.out.find("distributed: rank 0 of 1 (local rank 0, from QLORA_DIST_FORCE_PG), Gloo on CPU"),
            std::string::npos)
      << b.out;
  EXPECT_EQ(s.out.find("distributed:"), std::string::npos) << "no process group without the variable:\n" << s.out;
  for (const fs::path& o : {forced, bare}) {
    const auto a = steps(plain), c = steps(o);
    ASSERT_EQ(a.size(), 3u);
    ASSERT_EQ(c.size(), 3u) << o;
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(c[i].loss, a[i].loss) << o << " step " << i + 1;
      EXPECT_EQ(c[i].grad_norm, a[i].grad_norm) << o << " step " << i + 1;
      EXPECT_EQ(c[i].tokens, a[i].tokens) << o << " step " << i + 1;
    }
    EXPECT_EQ(qlora::read_file((o / "adapter_model.safetensors").string()),
              qlora::read_file((plain / "adapter_model.safetensors").string()))
        << o;
  }
}

// Inconsistent environments: exit 1 with one line naming the variable, before anything is read
// or written (output_dir is not created).
TEST_F(DataParallel, BadEnvironmentIsOneLineNamingTheVariable) {
  const fs::path out = root / "badenv";
  struct Case {
    std::string env, expect;
  } cases[] = {
      {"RANK=2 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1", "error: RANK=2 must be < WORLD_SIZE=2"},
      {"RANK=0 WORLD_SIZE=2", "error: MASTER_ADDR: not set while WORLD_SIZE=2"},
      {"RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=70000", "error: MASTER_PORT=70000: must be in 1..65535"},
      {"RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=x1", "error: MASTER_PORT: expected a non-negative"},
      {"WORLD_SIZE=2", "error: RANK: not set while WORLD_SIZE=2"},
      {"RANK=0 WORLD_SIZE=0", "error: WORLD_SIZE=0: must be in 1.."},
      {"SLURM_PROCID=2 SLURM_NTASKS=2 MASTER_ADDR=h", "error: SLURM_PROCID=2 must be < SLURM_NTASKS=2"},
      {"QLORA_DIST_FORCE_PG=2", "error: QLORA_DIST_FORCE_PG=2: must be in 0..1"},
      {"QLORA_DIST_FORCE_PG=1", "error: MASTER_ADDR: not set while QLORA_DIST_FORCE_PG=1"},
      {"RANK=0 WORLD_SIZE=1 QLORA_DIST_FORCE_PG=1", "error: MASTER_ADDR: not set while QLORA_DIST_FORCE_PG=1"},
  };
  for (const Case& c : cases) {
    Out o = qlora::test::run_command("env -u RANK -u WORLD_SIZE -u SLURM_PROCID -u SLURM_NTASKS -u MASTER_ADDR " + c.env + " " +
                                     train_cmd(out, ""));
    EXPECT_EQ(o.status, 1) << c.env << "\n" << o.out;
    EXPECT_EQ(o.out.rfind(c.expect, 0), 0u) << c.env << "\n" << o.out;
    EXPECT_EQ(std::count(o.out.begin(), o.out.end(), '\n'), 1) << c.env << "\n" << o.out;
    EXPECT_FALSE(fs::exists(out)) << c.env;
  }
}

// MASTER_PORT already taken on rank 0's host: one line naming MASTER_PORT, exit 1.
TEST_F(DataParallel, PortInUseIsOneLineNamingMasterPort) {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ASSERT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(s, 1), 0);
  ASSERT_EQ(::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const int port = ntohs(a.sin_port);
  const fs::path out = root / "busy";
  Out o = qlora::test::run_command("RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 QLORA_DIST_TIMEOUT_S=20 MASTER_PORT=" +
                                   std::to_string(port) + " " + train_cmd(out, ""));
  ::close(s);
  EXPECT_EQ(o.status, 1) << o.out;
  EXPECT_NE(o.out.find("error: MASTER_PORT=" + std::to_string(port) + ": rank 0 cannot host the rendezvous"),
            std::string::npos)
      << o.out;
  EXPECT_FALSE(fs::exists(out / "metrics.jsonl"));
}

// Ranks whose peers never come. Rank 0 says whom it waits for (10 s in, then every 60 s) and,
// when QLORA_DIST_TIMEOUT_S runs out, fails in one line saying how many joined; a lone rank 1
// fails in one line naming MASTER_ADDR. Neither prints c10d's own lines (a retry warning and a
// backtrace per connection attempt), nor writes output_dir.
TEST_F(DataParallel, LoneRankSaysWhomItWaitsForAndFailsInOneLine) {
  const fs::path out = root / "lone";
  // one rank of a job whose other ranks are never started, on a port nobody else uses
  auto lone = [&](int rank, int world_size, int timeout_s, const std::string& port) {
    return qlora::test::run_command("OMP_NUM_THREADS=1 RANK=" + std::to_string(rank) + " WORLD_SIZE=" +
                                    std::to_string(world_size) + " MASTER_ADDR=127.0.0.1 QLORA_DIST_TIMEOUT_S=" +
                                    std::to_string(timeout_s) + " MASTER_PORT=" + port + " " + train_cmd(out, ""));
  };
  const std::string p0 = std::to_string(free_tcp_port()), p1 = std::to_string(free_tcp_port());
  const Out o = lone(0, 3, 12, p0);
  EXPECT_EQ(o.status, 1) << o.out;
  EXPECT_TRUE(qlora::test::contains(o.out, "distributed: rank 0 waiting for 2 more ranks to join the rendezvous at "
                                           "127.0.0.1:" + p0 + " (1 of 3 joined, 10 s; gives up after 12 s, "
                                           "QLORA_DIST_TIMEOUT_S)"))
      << o.out;
  EXPECT_TRUE(qlora::test::contains(o.out, "\nerror: distributed: not all 3 ranks joined the rendezvous at 127.0.0.1:" +
                                               p0 + " within 12 s (QLORA_DIST_TIMEOUT_S): 1 did, 2 did not (were they "
                                               "started, with this MASTER_ADDR, MASTER_PORT and WORLD_SIZE?)\n"))
      << o.out;
  const Out r1 = lone(1, 2, 2, p1);
  EXPECT_EQ(r1.status, 1) << r1.out;
  EXPECT_TRUE(qlora::test::contains(r1.out, "error: MASTER_ADDR=127.0.0.1: rank 1 cannot reach rank 0's rendezvous at "
                                            "127.0.0.1:" + p1 + " (gave up after "))
      << r1.out;
  for (const Out* x : {&o, &r1}) {
    EXPECT_EQ(x->out.find("frame #"), std::string::npos) << x->out;
    EXPECT_EQ(x->out.find("TCPStore.cpp"), std::string::npos) << x->out;
    EXPECT_EQ(x->out.find("socket.cpp"), std::string::npos) << x->out;
  }
  EXPECT_FALSE(fs::exists(out));
}

// A job whose ranks disagree about who they are fails at the rendezvous, at once and naming it
// (trial 18: each waited out QLORA_DIST_TIMEOUT_S, then blamed a "lost rank"): rank 1 with another
// WORLD_SIZE than rank 0's (both fail, saying both values); a RANK given to two processes (the
// second is refused, and rank 0 with it). A rank 1 whose job misses a third rank fails in one line
// at the timeout, without Gloo's backtrace.
TEST_F(DataParallel, RanksThatDisagreeAboutTheJobFailAtTheRendezvousNamingIt) {
  const fs::path out = root / "disagree";
  // rank r of world size w on `port`, in the background, its output to LOG.r, status to LOG.r.rc
  auto start = [&](int rank, int w, const std::string& port, const std::string& tag) {
    const std::string log = (root / ("disagree." + tag)).string();
    return "(OMP_NUM_THREADS=1 RANK=" + std::to_string(rank) + " WORLD_SIZE=" + std::to_string(w) +
           " MASTER_ADDR=127.0.0.1 QLORA_DIST_TIMEOUT_S=60 MASTER_PORT=" + port + " " + train_cmd(out, "") + " > " + log +
           " 2>&1; echo $? > " + log + ".rc) & ";
  };
  auto result = [&](const std::string& tag) {
    const std::string log = (root / ("disagree." + tag)).string();
    return Out{std::stoi(qlora::read_file(log + ".rc")), qlora::read_file(log)};
  };
  const std::string p = std::to_string(free_tcp_port());
  const auto t0 = std::chrono::steady_clock::now();
  qlora::test::run_command(start(0, 2, p, "ws0") + "sleep 1; " + start(1, 3, p, "ws1") + "wait");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 45.0) << "not the timeout";
  const std::string why = "rank 1 has WORLD_SIZE=3 but rank 0 has WORLD_SIZE=2: every rank of a job needs the same "
                          "WORLD_SIZE (rendezvous 127.0.0.1:" + p + ")";
  for (const char* tag : {"ws0", "ws1"}) {
    const Out o = result(tag);
    EXPECT_EQ(o.status, 1) << tag << "\n" << o.out;
    EXPECT_TRUE(qlora::test::contains(o.out, "error: distributed: " + why)) << tag << "\n" << o.out;
  }

  const std::string q = std::to_string(free_tcp_port());
  qlora::test::run_command(start(0, 3, q, "dup0") + "sleep 1; " + start(1, 3, q, "dup1") + "sleep 3; " +
                           start(1, 3, q, "dup2") + "wait");
  const Out second = result("dup2"), zero = result("dup0"), first = result("dup1");
  const std::string twice = "RANK=1 joined twice: another process of this rendezvous already is rank 1 (a RANK given to "
                            "two processes, or MASTER_PORT=" + q + " is another running job's) (rendezvous 127.0.0.1:" + q + ")";
  EXPECT_EQ(second.status, 1) << second.out;
  EXPECT_TRUE(qlora::test::contains(second.out, "error: distributed: " + twice)) << second.out;
  EXPECT_EQ(zero.status, 1) << zero.out;
  EXPECT_TRUE(qlora::test::contains(zero.out, "error: distributed: " + twice)) << zero.out;
  // the first rank 1 had joined and waited for rank 2: it loses rank 0's rendezvous, in one line
  EXPECT_EQ(first.status, 1) << first.out;
  EXPECT_TRUE(qlora::test::contains(first.out, "error: distributed: ")) << first.out;
  for (const Out* x : {&second, &zero, &first}) EXPECT_EQ(x->out.find("frame #"), std::string::npos) << x->out;
  EXPECT_FALSE(fs::exists(out / "metrics.jsonl"));
}

}  // namespace
