// qlora-cpp: spot-safe checkpoints. A checkpoint directory `checkpoint-<step>` holds
//   adapter_model.safetensors + adapter_config.json   the LoRA weights (PEFT layout: usable as an adapter)
//   optimizer.safetensors                            AdamW exp_avg / exp_avg_sq per LoRA tensor
//   rng.safetensors                                  CPU (and CUDA) generator states of every rank, uint8
//   trainer_state.json                               step, sampler state, optimizer step counts,
//                                                    counters, the run's resolved config
//   metrics.jsonl                                    the run's metrics lines of steps 1..step (as
//                                                    HF's trainer_state.json log_history)
//   manifest.json                                    every other file's size and SHA-256
// It is written into a temporary sibling directory, every file and the directory fsync'd, then
// renamed into place and the parent fsync'd: on disk a checkpoint is complete and verifiable, or
// it is ignored. Nothing here is pickle; all of it is safetensors + JSON.
#pragma once
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "adapters/peft.h"
#include "data/batch.h"
#include "trainer/fault.h"

namespace qlora {

/// Everything besides tensors that decides how a resumed run continues.
struct TrainerState {
  int64_t step = 0;                 ///< optimizer steps completed
  data::SamplerState sampler;       ///< position of the data loader after `step`
  int64_t skipped_steps = 0;        ///< non-finite steps skipped so far
  int64_t nonfinite_in_a_row = 0;
  /// Non-padding input tokens of the steps so far (prompt and answer; summary.json `input_tokens`;
  /// the file's key is `tokens_trained`, its name before the target count existed).
  int64_t tokens_trained = 0;
  /// Next-token targets (labels ≠ -100 the loss counted) of the steps so far (summary.json
  /// `target_tokens`; absent in older files: 0).
  int64_t target_tokens = 0;
  double train_seconds = 0;         ///< wall time spent training up to this checkpoint, all invocations
  int64_t interruptions = 0;        ///< resumes before this checkpoint (absent in older files: 0)
  double time_lost_s = 0;           ///< step time those resumes redid (absent: 0)
  std::string config_yaml;          ///< the resolved config of the run that wrote it
  std::string run_id;               ///< the run that wrote it (output_dir/run.json); "" = older format
  std::string fingerprint;          ///< run_fingerprint() of that run's config and data
  std::map<std::string, std::string> data_sha256;  ///< data file path → SHA-256 of its content
  /// model_file_digests() of the run's model.path / model.tokenizer / lora.model_dir (absent in
  /// older files: empty): a resume whose model or adapter only moved is the same run.
  std::map<std::string, std::string> model_files;
  /// How data.val_set_size drew the hold-out: "records" (before the drops, since session 15); ""
  /// in older files, which drew from the examples left after the drops.
  std::string val_set_split;
  int64_t world_size = 1;           ///< ranks of the data-parallel job that wrote it (absent: 1)
  /// The run's total optimizer steps when it was written (training.max_steps, or num_epochs'
  /// steps); the LR schedule is computed over it. Absent in older files: 0 = unknown.
  int64_t total_steps = 0;
  /// Model load + data preparation (setup) seconds of the invocations up to this checkpoint, this
  /// one's included (absent in older files: 0).
  double setup_seconds = 0;
  /// The train data's formats as the run detected them, in list order ("alpaca", "completion" for
  /// raw text, "alpaca, completion"): what `generate --adapter` prompts in (absent in older files: "").
  std::string data_format;
  /// The train records with a system turn of their own (DataStats::system_records): whether
  /// `generate --adapter` hints at --system (absent in older files: -1 = unknown).
  int64_t data_system_records = -1;
  /// The eval_loss of the evaluation at this checkpoint's step (key `eval_loss`); NaN (the key
  /// absent) when the step did not evaluate, and in older files. What checkpoint.keep_best ranks.
  double eval_loss = std::nan("");
  /// output_dir/metrics.jsonl's lines of steps 1..step, in order, each ending in "\n" (the file
  /// metrics.jsonl in the checkpoint; "" = none written: older checkpoints have none).
  std::string metrics_jsonl;
};

/// One process's random-number generator states (torch's default generators' get_state(), uint8
/// on the CPU): the CPU one always, the CUDA one (of the current device) on a GPU run, else
/// undefined. LoRA dropout draws its masks from them.
struct RngState {
  torch::Tensor cpu, cuda;
};

/// The tensors of a checkpoint besides the adapter.
struct OptimizerTensors {
  /// Per LoRA tensor in lora_parameters() order: exp_avg, exp_avg_sq (fp32), and the step count.
  std::vector<torch::Tensor> exp_avg, exp_avg_sq;
  std::vector<int64_t> steps;
};

/// Saving and resuming the optimizer, the two directions side by side. AdamW's per-parameter
/// state (torch::optim::AdamWParamState: step, exp_avg, exp_avg_sq) of `params`, in order, as
/// checkpoint tensors on the CPU; a parameter with no update applied yet gives zeros and step 0.
OptimizerTensors capture_adamw_state(const torch::optim::AdamW& opt, const std::vector<torch::Tensor>& params);
/// The inverse of capture_adamw_state: sets `opt`'s state for each of `params` from `ot` (step 0:
/// left without state, as before its first update), moving exp_avg / exp_avg_sq to `device`.
/// Throws qlora::Error naming `ckpt` when the tensor count or an exp_avg shape differs.
void restore_adamw_state(torch::optim::AdamW& opt, const std::vector<torch::Tensor>& params,
                         const OptimizerTensors& ot, const torch::Device& device, const std::string& ckpt);

/// Writes `<dir>/checkpoint-<state.step>` atomically (see the file comment) and returns its path.
/// `rng`: every rank's generator states, indexed by rank (at least rank 0's); rng.safetensors
/// holds rank 0's as "cpu" / "cuda" and rank r's as "cpu.rank<r>" / "cuda.rank<r>".
/// An existing checkpoint of the same step is replaced only after the new one is complete.
/// `faults.slow_checkpoint_ms` (test hook, trainer/fault.h) sleeps before that final rename;
/// `faults.checkpoint_enospc_step` == state.step fails the write as ENOSPC would.
/// Throws qlora::Error on an I/O error; a half-written temporary directory is removed.
std::string write_checkpoint(const std::string& dir, const TrainerState& state, const PeftConfig& peft,
                             const LoraWeights& adapter, const OptimizerTensors& opt, const std::vector<RngState>& rng,
                             const FaultHooks& faults = {});

/// Why a checkpoint directory does not verify, or "" when every file in its manifest exists with
/// the recorded size and SHA-256.
std::string verify_checkpoint(const std::string& ckpt_dir);

/// `checkpoint-<N>` directories under `dir`, newest (largest N) first. Temporary ones are ignored.
std::vector<std::string> list_checkpoints(const std::string& dir);

/// The newest checkpoint under `dir` that verifies, or "" when none does; `skipped` receives
/// "path: reason" for each newer one passed over. With a non-empty `run_id`, only checkpoints
/// written by that run (trainer_state.json "run_id") are considered; the others are listed in
/// `skipped` as "path: written by run <id>, not this run".
std::string newest_valid_checkpoint(const std::string& dir, std::vector<std::string>* skipped,
                                    const std::string& run_id = "");

/// Deletes all but the newest `keep_last` complete checkpoints under `dir` (call only after a new
/// one is complete). With a non-empty `run_id` only that run's checkpoints are counted or deleted:
/// another run's checkpoint is never pruned. A checkpoint in `busy` (one whose
/// checkpoint.sync_command still runs) is counted like the others but never deleted: prune again
/// once its sync has ended. `keep_best` (checkpoint.keep_best): best_checkpoint(dir, run_id) is
/// never deleted either; it counts among the newest keep_last when it is one of them, else it is
/// kept besides them. A pruned checkpoint's files are deleted one by one (those a checkpoint writes
/// or its manifest lists, never through a link); a directory left holding any other file is kept
/// and listed in `kept_dirs` as "path (it holds NAME, ...)". Returns the deleted paths.
std::vector<std::string> prune_checkpoints(const std::string& dir, int64_t keep_last, const std::string& run_id = "",
                                           const std::set<std::string>& busy = {}, bool keep_best = false,
                                           std::vector<std::string>* kept_dirs = nullptr);

/// The complete checkpoint under `dir` (of run `run_id` when non-empty) with the lowest
/// trainer_state.json `eval_loss`, the oldest of equals (the first of the run's evaluations with
/// that loss, as summary.json best_eval and HF's best_model_checkpoint); "" when none records one
/// (no checkpoint at an eval step, or only older versions' checkpoints).
std::string best_checkpoint(const std::string& dir, const std::string& run_id = "");

/// The step N of a checkpoint folder named `checkpoint-<N>` (the last component of `path`), or -1
/// for any other name.
int64_t checkpoint_name_step(const std::string& path);

/// The run id stored in `ckpt_dir`/trainer_state.json, or "" when absent or unreadable.
std::string checkpoint_run_id(const std::string& ckpt_dir);

/// The step stored in `ckpt_dir`/trainer_state.json, or -1 when absent or unreadable (callers
/// verify the checkpoint first).
int64_t checkpoint_step(const std::string& ckpt_dir);

/// The resolved config (YAML text) the run that wrote `ckpt_dir` recorded in its
/// trainer_state.json "config". Throws qlora::Error naming the file when it cannot be read or has
/// no such string.
std::string checkpoint_config_yaml(const std::string& ckpt_dir);

/// A new run id: UTC time + 32 random bits, e.g. "20261130T170512Z-3fa9c2d1".
std::string new_run_id();

/// SHA-256 (hex) over the run-meaning keys of a resolved config (the keys config_differences
/// compares) and the data files' content hashes: two runs with the same fingerprint train the same
/// adapter from the same starting point.
std::string run_fingerprint(const std::string& config_yaml, const std::map<std::string, std::string>& data_sha256);

/// `output_dir`/run.json: which run owns the directory (docs/checkpoints.md, "Run safety").
struct RunRecord {
  std::string run_id;       ///< "" when there is no run.json
  std::string fingerprint;  ///< run_fingerprint() of the run's config and data
  std::map<std::string, std::string> data_sha256;
  std::string started_utc;
  /// The run's resolved config (YAML text, key `config`): what a rerun before the first checkpoint
  /// compares its settings with, as a resume compares trainer_state.json's. "" in run.json files
  /// of older versions (then only `fingerprint` is compared).
  std::string config_yaml;
  /// model_file_digests() of the run's model.path / model.tokenizer (key `model_files`): a model
  /// that only moved is the same run. Absent in older files (has_model_files false).
  std::map<std::string, std::string> model_files;
  bool has_model_files = false;
};
/// Reads `output_dir`/run.json; an absent file gives a record with an empty run_id. Throws
/// qlora::Error naming the file when it exists but is not a valid run record.
RunRecord read_run_record(const std::string& output_dir);
/// Writes `output_dir`/run.json atomically. Throws qlora::Error naming the file on an I/O error.
void write_run_record(const std::string& output_dir, const RunRecord& r);

/// An exclusive lock on a run's output_dir (docs/checkpoints.md, "A run owns its output_dir"):
/// flock(LOCK_EX | LOCK_NB) on `<output_dir>/run.lock`, which then records the holder's
/// "pid <PID> host <HOST> since <UTC>". The kernel releases it when the process ends in any way
/// (kill -9 included), so a lock is never stale; the descriptor is close-on-exec (a sync command's
/// shell does not inherit it). The file itself stays; it does not make output_dir "used".
class OutputDirLock {
 public:
  static constexpr const char* kFile = "run.lock";
  /// Creates output_dir when absent and takes the lock. Throws qlora::Error (one line, naming the
  /// holder's pid and host and the lock file) when another process holds it, or on an I/O error.
  explicit OutputDirLock(const std::string& output_dir);
  /// Throws the same qlora::Error as the constructor when another process holds the lock on
  /// `output_dir`; otherwise returns, creating nothing (no directory, no run.lock) and holding
  /// nothing. For failing early, before the model loads; the constructor still decides.
  static void check_free(const std::string& output_dir);
  /// Releases the lock; when this lock created output_dir and it holds nothing but run.lock (the
  /// run failed before writing anything), removes both.
  ~OutputDirLock();
  OutputDirLock(const OutputDirLock&) = delete;
  OutputDirLock& operator=(const OutputDirLock&) = delete;

 private:
  std::string dir_;
  int fd_ = -1;
  bool created_dir_ = false;
};

/// Loaded checkpoint contents.
struct LoadedCheckpoint {
  TrainerState state;
  PeftConfig peft;
  LoraWeights adapter;
  OptimizerTensors opt;
  /// Generator states by rank: rng[0] always; ranks 1.. when the writing job was data parallel
  /// (checkpoints of older versions hold rank 0's alone).
  std::vector<RngState> rng;
};

/// Reads a checkpoint (verifying its manifest first). `shapes`: the LoRA modules of this run
/// (lora.target_modules) → {in, out}, as load_peft_adapter's `expected`. Throws qlora::Error naming
/// the file and the problem.
LoadedCheckpoint read_checkpoint(const std::string& ckpt_dir, const ModuleShapes& shapes);

/// `ckpt_dir`/trainer_state.json alone (no tensors, no manifest check; metrics_jsonl left ""):
/// what a resume decides on before the model loads. `optimizer_steps`, when given, receives the
/// per-tensor AdamW step counts. Throws qlora::Error naming the file when it cannot be read or a
/// required key is missing or mistyped.
TrainerState read_trainer_state(const std::string& ckpt_dir, std::vector<int64_t>* optimizer_steps = nullptr);

/// Settings whose change alters the run's meaning: "section.key: saved -> now" for each key of
/// the resolved configs that differs, ignoring keys that only extend or observe a run
/// (training.max_steps, training.num_epochs, training.logging_steps, training.eval_steps,
/// checkpoint.*, output_dir, cost.*). A key added since checkpoints were first written
/// (data.deduplicate) that one config lacks reads as its default there (an older version's run).
std::vector<std::string> config_differences(const std::string& saved_yaml, const std::string& current_yaml);

}  // namespace qlora
