// qlora-cpp: the training recipe. `Trainer` reads top to bottom: setup() loads the model (4-bit
// base, LoRA), tokenizer, data and optimizer; train() runs the loop; each optimizer step is
// train_step(): forward (checkpointed layers) → chunked CE → backward over the accumulated
// micro-batches → clip → AdamW → schedule.
#pragma once
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "data/batch.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "config/config.h"
#include "trainer/distributed.h"
#include "trainer/checkpoint.h"
#include "trainer/estimate.h"
#include "trainer/fault.h"
#include "model/model.h"
#include "trainer/schedule.h"
#include "trainer/sync.h"
#include "common/error.h"
#include "adapters/peft.h"

namespace qlora {

/// Result of one optimizer step.
struct StepResult {
  double loss = 0;        ///< token-weighted mean CE over the accumulated batch (nats)
  double grad_norm = 0;   ///< total L2 norm of the LoRA gradients before clipping
  /// Input tokens of the micro-batches (attention_mask 1: prompt and answer, BOS/EOS included,
  /// padding not: transformers' num_input_tokens_seen with include_num_input_tokens_seen "non_padding").
  int64_t tokens = 0;
  /// Next-token targets the loss counted: labels ≠ -100 at positions 1.. of each example (the
  /// first position is never predicted), i.e. transformers' (labels[..., 1:] != -100).sum().
  int64_t targets = 0;
  bool skipped = false;   ///< non-finite loss or gradient: no update was applied
};

/// AdamW over `params` (fp32 LoRA master weights) with the config's betas, eps and weight decay
/// (torch::optim::AdamW, decoupled weight decay as Loshchilov & Hutter 2019 / torch.optim.AdamW).
std::unique_ptr<torch::optim::AdamW> make_adamw(const std::vector<torch::Tensor>& params, const TrainingConfig& t);

/// How train_step updates (set fields by name: o.lr = 1e-3; ...).
struct StepOptions {
  double lr = 0;                    ///< learning rate of this step (the optimizer's lr is set to it first)
  double max_grad_norm = 0;         ///< clip the total LoRA gradient norm to this; ≤ 0: no clipping
  int64_t ce_chunk_tokens = 1024;   ///< tokens per chunk of the fused CE (chunked_cross_entropy_sum)
  Distributed* dist = nullptr;      ///< data parallel process group, or none
};

/// One optimizer step over `micro_batches` (the gradient-accumulation group). The loss of each
/// micro-batch is its CE sum divided by the target count of the WHOLE group, so micro_batch 4 ×
/// accumulation 1 and micro_batch 1 × accumulation 4 give the same update. Gradients are clipped to
/// o.max_grad_norm (≤ 0: no clipping); the optimizer's lr is set to o.lr first. A non-finite loss
/// or gradient skips the update (gradients zeroed) and sets `skipped`.
/// Data parallel (`o.dist` active, docs/distributed.md): `micro_batches` are this rank's share of
/// the global group; the target count, the gradients (one flat allreduce), the loss sum and the
/// token count are summed over ranks, so every rank clips on the global norm and applies the same
/// update, and the result (loss, grad_norm, tokens, targets) is the global one.
StepResult train_step(LlamaModel& model, torch::optim::Optimizer& opt, const std::vector<data::Batch>& micro_batches,
                      const StepOptions& o);

/// Data parallel: the replicas' LoRA parameters are compared (parameter_checksum, all ranks) every
/// this many optimizer steps, at the last step, and before every checkpoint whose trigger all ranks
/// share (signal, --max-time, save_steps, end of epoch); docs/distributed.md, "Replica check".
constexpr int64_t kParamChecksumEverySteps = 50;

/// A 64-bit hash of the raw bytes of `params` in order: the first 64 bits (the digest's first 8
/// bytes read big-endian, i.e. its first 16 hex digits) of the SHA-256 (sha256_hex,
/// common/files.h) of the tensors' bytes concatenated in memory order (CUDA tensors are copied to
/// the host first; the concatenation is one host buffer of all the bytes). Equal parameters give
/// equal checksums on every rank whatever its thread count; any differing bit changes it with
/// probability 1 - 2^-64 for random damage.
uint64_t parameter_checksum(const std::vector<torch::Tensor>& params);

/// What QLORA_DETERMINISTIC=1 turns on (cli/main.cpp; the CUDA byte-identity tests of tests/gpu run
/// `qlora train` with it and CUBLAS_WORKSPACE_CONFIG=:4096:8): torch.use_deterministic_algorithms(True,
/// warn_only=True), and scaled-dot-product attention limited to its math backend (flash, memory-
/// efficient and cuDNN attention off, on every device). With warn_only, CUDA's memory-efficient
/// attention keeps its split-key backward, whose gradient of q is summed with atomic adds in an
/// order that varies from run to run (keys split in blocks of 64 when few batch × head blocks run:
/// the tiny run's 135 keys make 3), and flash attention its non-deterministic backward (ATen
/// transformers/cuda/attention_backward.cu); the math backend is matmuls and a softmax. warn_only
/// stays: an op without a deterministic CUDA kernel warns instead of stopping the run.
void set_deterministic_algorithms();

/// A duration for the progress line's ETA, unambiguous beside a clock time ("[07:14:37]"):
/// `seconds` rounded to whole seconds, negative as 0: "45s", "8m00s", "1h02m" (minutes, not
/// seconds, from an hour on), "26h40m".
std::string format_duration(double seconds);

/// One rank's share of an evaluation: `examples` in batches of `batch_size` (in order, each batch
/// padded as the trainer pads), of which this rank computes the batches k with k % world == rank.
/// Returns 2 × batches doubles: [CE sum of batch k (nats), its targets] at 2k, 2k + 1, zeros for
/// the batches of other ranks, so an element-wise sum over ranks (Distributed::sum: x + 0 = x
/// exactly) holds every batch's own numbers and eval_mean() of it equals one process's. No grad,
/// dropout as the model's `training` flag (the trainer turns it off).
std::vector<double> evaluate_batch_sums(const LlamaModel& model, const std::vector<data::Example>& examples,
                                        int64_t batch_size, const data::DataOptions& opts, int32_t pad_id,
                                        int rank = 0, int world = 1);
/// {mean next-token CE, targets} of evaluate_batch_sums' vector (summed over ranks), the sums
/// taken in batch order; {NaN, 0} without targets.
std::pair<double, int64_t> eval_mean(const std::vector<double>& batch_sums);
/// Mean next-token CE (nats) over `examples` in batches of `batch_size`, no grad, dropout off:
/// eval_mean(evaluate_batch_sums(...)) of one process. Returns {mean loss, targets counted}.
std::pair<double, int64_t> evaluate_loss(const LlamaModel& model, const std::vector<data::Example>& examples,
                                         int64_t batch_size, const data::DataOptions& opts, int32_t pad_id);

/// Module path → {in_features, out_features} of the decoder linears of `model` that the PEFT
/// config `pc` adapts (peft_targets_module: list, regex, layers_to_transform, layers_pattern,
/// exclude_modules): the `expected` argument of load_peft_adapter.
ModuleShapes peft_module_shapes(const LlamaModel& model, const PeftConfig& pc);

/// A bitsandbytes 4-bit checkpoint is read as stored (LlamaModel::load). Where a linear's stored
/// format differs from what `q` asks for, the request is honoured: a different blocksize or
/// double_quant is dequantized (fp32) and quantized again as asked; a linear that `q` keeps in 16
/// bit (method none, keep_16bit) is dequantized to the model's dtype. The values are then the
/// stored 4-bit values, not the original 16-bit weights (a second rounding for requantization).
/// Returns one line saying what was stored and what was done, or "" when nothing differed.
std::string honour_quant_request(LlamaModel& model, const QuantOptions& q);

/// Every input file `cfg` names, checked before any is read, so that a config with several wrong
/// paths (a template whose model.path and data.train both need setting) names them all in one run:
/// tokenizer_source(cfg.model), check_model_weights(cfg.model) when `need_weights`, and
/// data::check_files_exist(cfg.data). Returns tokenizer_source's path. Throws qlora::Error (one
/// problem) or qlora::ErrorList (several), each line placed at its key's file:line (with_key_sources).
std::string check_config_inputs(const Config& cfg, bool need_weights);

/// The base model a config names, on `device` in `dtype`, quantized as `cfg.quantization` says.
/// `model.init: pretrained`: LlamaModel::load(model.path) (config.json and the safetensors
/// weights), with honour_quant_request's line logged as a warning. `model.init: random`: weights
/// drawn by LlamaModel::random_init from `cfg.training.seed`, in the shape of model.path's
/// config.json (only that file is read: no weights need exist; its vocab_size is kept) or of
/// model.preset (vocab_size = `tokenizer_vocab`). Errors naming model.path / quantization.method
/// carry their key's file:line (with_key_sources). Throws qlora::Error.
LlamaModel load_base_model(const Config& cfg, int64_t tokenizer_vocab, torch::Dtype dtype, torch::Device device);

/// `s` quoted for a POSIX shell (single quotes, ' as '\'') unless it holds only
/// [A-Za-z0-9_./=:,+-]; for the resume commands printed to the user.
std::string shell_quote(const std::string& s);

/// What changed between a checkpoint's data files (`before`, with the SHA-256 of each path's
/// content then, `before_sha`) and this run's (`now`, `now_sha`) under `key` ("data.train" /
/// "data.eval"), one line each, for the resume refusal: another number of files ("data.train: 2
/// files -> 3 files (added c.jsonl)"), the same entries in another order ("data.train: the same
/// files in another order (a, b -> b, a): ..."), or per entry "data.train[1]: a -> b",
/// "data.train[1].format: (unset) -> sharegpt", ".field_map", ".role_map" (a single plain path is
/// named "data.train", as before lists). An entry whose path changed but whose content hash did
/// not is a moved file, the same run: said in `moved` ("data.train[1] moved: a -> b (same content,
/// sha256 0123456789ab)"), not returned. Content changes at the same path are not compared here.
std::vector<std::string> data_source_changes(const std::string& key, const std::vector<data::DataSource>& before,
                                             const std::map<std::string, std::string>& before_sha,
                                             const std::vector<data::DataSource>& now,
                                             const std::map<std::string, std::string>& now_sha,
                                             std::vector<std::string>* moved);

/// Options of one invocation that are not part of the run's config.
struct RunOptions {
  bool force = false;       ///< resume even when run-meaning settings changed (stated in the log)
  double max_time_s = 0;    ///< wall-clock budget in seconds; 0 = none. Stops cleanly with a checkpoint
                            ///< when the next step would likely not finish inside it.
  /// A fresh run in a non-empty output_dir moves the old contents aside to the sibling
  /// "<output_dir>.old-<UTC time>" instead of refusing (HF's --overwrite_output_dir).
  bool overwrite_output_dir = false;
  /// The command line that started this run (shell-quoted), for the interrupt message's resume
  /// command; "" = "qlora train CONFIG".
  std::string command;
  /// `command` without its `--set checkpoint.resume=...` / `--set checkpoint.resume_from_dir=...`
  /// overrides: the base of a printed command that sets those keys itself (each once).
  std::string command_without_resume;
  /// `qlora estimate --config CONFIG --set ...` of this run's config and overrides, for the memory
  /// report's hint (a command that pastes); "" = "qlora estimate --config CONFIG".
  std::string estimate_command;
  /// A rank that `qlora train --nproc-per-node N` started (`command` then ends with that option):
  /// the other ranks' interrupt message leaves the resume hint to rank 0.
  bool launched = false;
  /// Where this process sits in a data-parallel job (read_dist_env); world_size 1 = alone.
  DistEnv dist;
};

/// The `qlora train` recipe.
class Trainer {
 public:
  explicit Trainer(Config cfg, RunOptions run = {});
  /// Validates paths, creates output_dir, loads tokenizer, data, model (quantized on load) and LoRA,
  /// builds the optimizer; prints which modules LoRA matched. Throws qlora::Error on any bad input
  /// before anything is written to output_dir.
  void setup();
  /// Runs to max_steps / num_epochs; writes metrics.jsonl as it goes, then the PEFT adapter,
  /// config.resolved.yaml and summary.json into output_dir. summary.json's wall_seconds and
  /// tokens_per_s cover every invocation of the run (interrupted ones included, from the
  /// checkpoint's train_seconds); setup_seconds their model loads. A run resumed at its last step
  /// whose summary.json is written already does nothing (setup() says so). When it throws (any
  /// error but Interrupted, which waits itself), rank 0 first waits for the running
  /// checkpoint.sync_command (bounded by checkpoint.sync_timeout_seconds), so the last checkpoint
  /// still reaches its off-machine copy.
  void train();

  const LlamaModel& model() const { return *model_; }
  /// Loss of each completed step, in order (for tests and the summary).
  const std::vector<double>& losses() const { return losses_; }
  int64_t total_steps() const { return total_steps_; }

 private:
  /// What log_step writes of one optimizer step.
  struct StepLog {
    int64_t step = 0;                  ///< optimizer steps completed
    StepResult result;
    double lr = 0;                     ///< learning rate the step used
    double seconds = 0;                ///< wall time of the step (with its eval, if any)
    double train_seconds = 0;          ///< the optimizer step alone (its rate's denominator)
    double eval_loss = std::nan("");   ///< eval loss after the step; NaN = not evaluated
  };
  /// Appends the step's line to metrics.jsonl and draws the progress line (or logs it).
  void log_step(const StepLog& s);
  /// Rank 0, once it owns output_dir: output_dir/status.json, atomically: `state` ("running",
  /// "completed", "stopped", "failed"), `exit_code` (null while running), `message` (the stop's
  /// resume line or the error; null otherwise), run_id, pid, host, step, total_steps,
  /// last_checkpoint, started_utc (this invocation), updated_utc (docs/checkpoints.md, "Run
  /// status"). A write that fails is logged, never thrown (the state it reports matters more).
  void write_status(const std::string& state, int exit_code = -1, const std::string& message = "");
  std::string invocation_started_utc_;  ///< when this invocation began training (status.json)
  /// Rank 0: writes the adapter, config.resolved.yaml and summary.json (kept in summary_).
  void save_outputs(double seconds);
  /// Rank 0, after the wait for the last syncs: summary.json's `checkpoint_sync` with the commands'
  /// final outcomes (rewritten), and one warning line when any failed or was left running.
  void record_sync_outcomes();
  nlohmann::json summary_;  ///< what save_outputs wrote to summary.json
  /// train()'s loop: the optimizer steps, checkpoints and the final outputs.
  void train_steps();
  /// Decides which run this invocation is and which checkpoint (if any) it continues, from
  /// output_dir/run.json, checkpoint.resume and --overwrite-output-dir (docs/checkpoints.md, "Run
  /// safety"). Sets run_id_; returns the checkpoint to resume or "". Throws qlora::Error (nothing
  /// written) for a fresh run in a used output_dir, a resume path with no valid checkpoint, or an
  /// output_dir owned by another run.
  std::string claim_output_dir();
  /// Restores adapter, AdamW state, sampler, RNG, counters, metrics from `ckpt`. Refuses changed
  /// LoRA shapes (always); changed settings were refused before the load (check_resume_settings).
  void resume_from(const std::string& ckpt);
  /// Before the model loads (rank 0, in the output_dir decision): compares `ckpt`'s
  /// trainer_state.json, read into `saved` (config, data hashes, world_size), with this run's. Throws qlora::Error
  /// "resume from CKPT refused: ..." naming every difference (a changed WORLD_SIZE among them, and
  /// whether the global batch micro_batch_size x gradient_accumulation_steps x WORLD_SIZE is
  /// unchanged) unless --force, which logs them as warnings instead. LoRA shapes are checked later,
  /// by resume_from.
  void check_resume_settings(const std::string& ckpt, const TrainerState& saved) const;
  /// A run as recorded before this invocation: in a checkpoint's trainer_state.json, or in
  /// output_dir/run.json (a run killed before its first checkpoint).
  struct RecordedRun {
    std::string config_yaml;                          ///< its resolved config (YAML text)
    std::map<std::string, std::string> data_sha256;   ///< data file path → SHA-256 of its content
    std::map<std::string, std::string> model_files;   ///< model_file_digests() of its model
    bool has_model_files = false;                     ///< false: an older version's record, no digests
    std::string where;  ///< the file that holds it, naming it in errors ("<ckpt>/trainer_state.json")
    std::string what;   ///< the record in messages: "the checkpoint", "run.json"
    std::string since;  ///< when it was recorded: "the checkpoint was written", "the run started"
    /// What checkpoint `ckpt`'s trainer_state.json (read into `s`) records.
    static RecordedRun of_checkpoint(const std::string& ckpt, const TrainerState& s);
    /// What `output_dir`/run.json (read into `r`) records: a run killed before its first checkpoint.
    static RecordedRun of_run_json(const std::string& output_dir, const RunRecord& r);
  };
  /// Run-meaning differences between `saved` and this run, one line each (docs/checkpoints.md,
  /// "Resume"): config_differences, with data.train / data.eval said per file
  /// (data_source_changes), model.path / model.tokenizer compared by their files' digests
  /// (model_file_digests), and a data file's content changed under the same path ("content of P
  /// changed since <since> (sha256 a -> b)"). A data file or model that only moved (another path,
  /// the recorded content) is the same run: said in `moved` ("model.path moved: A -> B (the same
  /// files: their sampled SHA-256 equal <what>'s)"), not returned. Throws qlora::Error only when
  /// `saved.config_yaml` is not YAML.
  std::vector<std::string> run_differences(const RecordedRun& saved, std::vector<std::string>* moved) const;
  /// The message of the Interrupted thrown after the checkpoint `ckpt`: how to resume.
  std::string resume_advice(const std::string& ckpt) const;
  /// Writes checkpoint-<step_> under checkpoint_dir(), starts its checkpoint.sync_command, prunes
  /// (never a checkpoint whose sync still runs, nor with checkpoint.keep_best the best one).
  /// `train_seconds`: training wall time of all invocations so far (TrainerState::train_seconds);
  /// `eval_loss`: this step's evaluation (NaN: none), recorded for checkpoint.keep_best;
  /// `rng`: every rank's generator states (gather_rng_states). Rank 0 only.
  void save_checkpoint(const std::string& why, double train_seconds, double eval_loss, const std::vector<RngState>& rng);
  /// Every rank's random-number generator states (CPU, and CUDA on a GPU run), indexed by rank, on
  /// rank 0 ({} on the others): a collective, called by every rank when a checkpoint is written,
  /// so a resumed rank continues its own LoRA dropout stream. One process: its own states.
  std::vector<RngState> gather_rng_states();
  std::string checkpoint_dir() const;
  /// Prunes the checkpoints held back for their sync once one has ended (rank 0; cheap otherwise).
  void prune_after_syncs();
  /// Rank 0: waits up to checkpoint.sync_timeout_seconds for the sync commands still running
  /// (after the last checkpoint of this invocation), logging one line per command, then prunes.
  void wait_for_syncs();
  /// Micro-batches per optimizer step over all ranks: gradient_accumulation_steps × world size.
  int64_t global_group_size() const;
  /// total_steps_ and warmup_steps_: training.max_steps, else the epochs' micro-batches as loader_
  /// lays them out (its packer), in global groups of gradient_accumulation_steps x world size.
  void plan_steps();
  /// Data parallel: throws qlora::Error naming the differing keys when this rank's resolved config
  /// or data content differs from rank 0's. Nothing with world_size 1.
  void check_same_run_as_main();
  PeftConfig peft_config() const;

  /// The progress line's state (log_step): this invocation's step times for the ETA, the newest
  /// eval loss; one per Trainer, so a new Trainer (or a resumed run) starts its mean afresh.
  struct Progress {
    int64_t last_step = 0;                       ///< the step logged last
    int64_t steps = 0;                           ///< steps logged since the (re)start
    double seconds = 0;                          ///< their total time
    double last_eval = std::nan("");             ///< the newest eval loss, shown until the next
    double loss_sum = 0;                         ///< losses of the steps since the last log line
    int64_t loss_n = 0;                          ///< how many (the line shows their mean, as HF's Trainer)
    bool tty = false;  ///< stderr is a terminal (set by the Trainer constructor): a redrawn bar, else log lines
    /// Records step `step` (taking `step_seconds`) and returns the ETA in seconds: mean step time
    /// since the (re)start × (total_steps − step), ≥ 0. A step not after the last one restarts
    /// (the mean and last_eval).
    double record(int64_t step, double step_seconds, int64_t total_steps);
  };

  Config cfg_;
  RunOptions run_;
  Progress progress_;
  MemoryTracker memory_;  ///< estimate + measured memory → memory_report.json
  int64_t step_ = 0;  ///< optimizer steps completed
  int64_t nonfinite_in_a_row_ = 0;
  double train_seconds_before_ = 0;  ///< training time of earlier (interrupted) invocations
  bool already_complete_ = false;    ///< resumed at the last step with summary.json written: train() is a no-op
  bool outputs_written() const;
  nlohmann::json preemption_;        ///< interruptions, time lost, checkpoint writes
  /// Data parallel: throws qlora::Error naming the step and the ranks when any rank's
  /// parameter_checksum differs from rank 0's (every rank throws; nothing more is written).
  void check_replicas_agree();
  std::unique_ptr<CheckpointSync> sync_;  ///< checkpoint.sync_command's running commands (rank 0)
  bool prune_held_back_ = false;          ///< a prune kept a checkpoint back for its sync
  /// Sets prune_held_back_ after a prune: more checkpoints remain than checkpoint.keep_last.
  void note_held_back();
  FaultHooks fault_;  ///< the QLORA_FAULT_* test hooks (trainer/fault.h), read in setup()
  torch::Device device_ = torch::kCPU;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<data::Tokenizer> tok_;
  data::Datasets data_;
  std::unique_ptr<data::DataLoader> loader_;
  std::unique_ptr<torch::optim::AdamW> opt_;
  int64_t total_steps_ = 0, warmup_steps_ = 0;
  int32_t pad_id_ = 0;
  std::vector<double> losses_;
  int64_t input_tokens_ = 0;   ///< StepResult::tokens summed over the run (summary.json input_tokens)
  int64_t target_tokens_ = 0;  ///< StepResult::targets summed over the run (summary.json target_tokens)
  int64_t skipped_steps_ = 0;
  int64_t steps_this_invocation_ = 0;      ///< optimizer steps this invocation ran
  double last_eval_loss_ = std::nan("");  ///< the run's newest eval loss (NaN: none yet)
  std::string run_id_;                           ///< this run (output_dir/run.json)
  std::map<std::string, std::string> data_sha_;  ///< data file → SHA-256 of its content
  std::map<std::string, std::string> model_files_;  ///< model_file_digests(model.path, model.tokenizer)
  std::string fingerprint_;                      ///< run_fingerprint(config, data_sha_)
  std::string aside_;                            ///< where --overwrite-output-dir moves the old state
  std::unique_ptr<OutputDirLock> lock_;          ///< rank 0's lock on output_dir, held for the whole run
  std::string last_checkpoint_;                  ///< path of the newest checkpoint written (or resumed from)
  /// metrics.jsonl's lines of steps 1..step_ (rank 0), in order: written into each checkpoint
  /// (TrainerState::metrics_jsonl), so a resume on a new machine brings the run's history back.
  std::string metrics_history_;
  std::chrono::steady_clock::time_point setup_start_;  ///< when setup() began (its duration: setup_seconds_)
  double setup_seconds_ = 0;         ///< this invocation's setup (model load, quantization, data)
  double setup_seconds_before_ = 0;  ///< setup of the earlier invocations (from the checkpoint)
  std::unique_ptr<Distributed> dist_;            ///< the process group; identity when world_size is 1
};

}  // namespace qlora
