#include "trainer/train.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "adapters/peft.h"
#include "common/error.h"
#include "common/files.h"
#include "common/log.h"
#include "trainer/batch_tensors.h"
#include "trainer/loss.h"
#include "trainer/memory.h"
#include "trainer/checkpoint.h"

#include <csignal>
#include <cstdio>
#include <iostream>
#include <unistd.h>
#include <cstring>
#include <sstream>
#include <thread>
#include <atomic>

namespace qlora {
namespace fs = std::filesystem;
using json = nlohmann::json;

int64_t count_targets(const data::Batch& b) {
  int64_t n = 0;
  for (int64_t r = 0; r < b.batch_size; ++r)
    for (int64_t t = 0; t + 1 < b.seq_len; ++t)
      n += b.labels[b.at(r, t + 1)] != -100 && b.segment_ids[b.at(r, t)] == b.segment_ids[b.at(r, t + 1)];
  return n;
}

std::unique_ptr<torch::optim::AdamW> make_adamw(const std::vector<torch::Tensor>& params, const TrainingConfig& t) {
  QLORA_CHECK(!params.empty(), "training: no trainable parameters (no LoRA adapter attached)");
  return std::make_unique<torch::optim::AdamW>(
      params, torch::optim::AdamWOptions(t.learning_rate)
                  .betas({t.adam_beta1, t.adam_beta2})
                  .eps(t.adam_epsilon)
                  .weight_decay(t.weight_decay));
}

StepResult train_step(LlamaModel& model, torch::optim::Optimizer& opt, const std::vector<data::Batch>& micro_batches,
                      double lr, double max_grad_norm, int64_t ce_chunk_tokens) {
  StepResult r;
  for (const data::Batch& b : micro_batches) r.targets += count_targets(b);
  QLORA_CHECK(r.targets > 0, "training: an accumulated batch has no label tokens");
  opt.zero_grad();
  double loss_sum = 0;
  for (const data::Batch& b : micro_batches) {
    ForwardInputs in = batch_inputs(b, model.device());
    torch::Tensor hidden = model.hidden_states(in);
    auto [rows, targets] = next_token_rows(hidden, batch_labels(b, model.device()), in.segment_ids);
    if (targets.numel() == 0) continue;
    torch::Tensor loss = chunked_cross_entropy_sum(rows, model.lm_head, targets, ce_chunk_tokens);
    (loss / static_cast<double>(r.targets)).backward();
    loss_sum += loss.item<double>();
    for (int32_t m : b.attention_mask) r.tokens += m;
  }
  r.loss = loss_sum / static_cast<double>(r.targets);
  std::vector<torch::Tensor> params = model.lora_parameters();
  r.grad_norm = max_grad_norm > 0 ? torch::nn::utils::clip_grad_norm_(params, max_grad_norm)
                                  : torch::nn::utils::clip_grad_norm_(params, std::numeric_limits<double>::infinity());
  if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm)) {
    opt.zero_grad();
    r.skipped = true;
    return r;
  }
  for (auto& g : opt.param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
  opt.step();
  return r;
}

std::pair<double, int64_t> evaluate_loss(const LlamaModel& model, const std::vector<data::Example>& examples,
                                         int64_t batch_size, const data::DataOptions& opts, int32_t pad_id) {
  if (examples.empty()) return {std::nan(""), 0};
  torch::NoGradGuard ng;
  double sum = 0;
  int64_t count = 0;
  for (size_t i = 0; i < examples.size(); i += batch_size) {
    std::vector<std::vector<const data::Example*>> rows;
    for (size_t j = i; j < std::min(examples.size(), i + batch_size); ++j) rows.push_back({&examples[j]});
    data::Batch b = data::collate(rows, pad_id, opts.padding_side == "left");
    ForwardInputs in = batch_inputs(b, model.device());
    auto [rws, targets] = next_token_rows(model.hidden_states(in), batch_labels(b, model.device()), in.segment_ids);
    if (targets.numel() == 0) continue;
    sum += chunked_cross_entropy_sum(rws, model.lm_head, targets).item<double>();
    count += targets.numel();
  }
  return {count ? sum / count : std::nan(""), count};
}

// ---------------------------------------------------------------------------------------------
torch::Dtype compute_dtype(DType d, const torch::Device& dev) {
  switch (d) {
    case DType::kFP32: return torch::kFloat32;
    case DType::kBF16: return torch::kBFloat16;
    case DType::kFP16: return torch::kFloat16;
    case DType::kAuto: return dev.is_cuda() ? torch::kBFloat16 : torch::kFloat32;
  }
  return torch::kFloat32;
}

QuantOptions quant_options(const QuantConfig& q) {
  QuantOptions o;
  o.method = q.method == QuantMethod::kNF4   ? QuantOptions::Method::NF4
             : q.method == QuantMethod::kFP4 ? QuantOptions::Method::FP4
                                             : QuantOptions::Method::None;
  o.blocksize = q.blocksize;
  o.double_quant = q.double_quant;
  o.keep_16bit = q.keep_16bit;
  return o;
}

namespace {
Schedule schedule_of(LrScheduler s) {
  switch (s) {
    case LrScheduler::kConstant: return Schedule::constant;
    case LrScheduler::kLinear: return Schedule::linear;
    case LrScheduler::kCosine: return Schedule::cosine;
  }
  return Schedule::cosine;
}
}  // namespace

Trainer::Trainer(Config cfg, RunOptions run) : cfg_(std::move(cfg)), run_(run) {}

void Trainer::setup() {
  const TrainingConfig& t = cfg_.training;
  device_ = torch::cuda::is_available() ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
  torch::manual_seed(t.seed);

  // Everything that can fail on bad input happens before output_dir is touched.
  const std::string tok_src = !cfg_.model.tokenizer.empty() ? cfg_.model.tokenizer : cfg_.model.path;
  QLORA_CHECK(!tok_src.empty(), "model.tokenizer: a preset model needs a tokenizer (tokenizer.model or a model dir)");
  tok_ = std::make_unique<data::Tokenizer>(data::Tokenizer::from_pretrained(tok_src));
  cfg_.data.template_name = data::resolve_template(cfg_.data.template_name, tok_src);  // "auto" -> a name
  data_ = data::load_datasets(cfg_.data, *tok_);
  log::info("data: ", data_.stats.train_examples, " train / ", data_.stats.eval_examples, " eval examples, ",
            data_.stats.tokens_trainable, " trainable tokens");

  memory_.begin(cfg_, model_config_for(cfg_, tok_->vocab_size()), device_);  // warns if it will not fit
  const torch::Dtype dtype = compute_dtype(cfg_.model.dtype, device_);
  const QuantOptions q = quant_options(cfg_.quantization);
  if (!cfg_.model.path.empty()) {
    model_ = std::make_unique<LlamaModel>(LlamaModel::load(cfg_.model.path, dtype, device_, q));
  } else {
    ModelConfig mc = preset_config(cfg_.model.preset);
    mc.vocab_size = tok_->vocab_size();
    model_ = std::make_unique<LlamaModel>(LlamaModel::random_init(mc, t.seed, dtype, device_, q));
  }
  QLORA_CHECK(model_->config().vocab_size >= tok_->vocab_size(), "model.tokenizer: the tokenizer has ",
              tok_->vocab_size(), " pieces but the model's vocab_size is ", model_->config().vocab_size);
  const LoraConfig& l = cfg_.lora;
  const std::vector<std::string> targets = l.all_linear ? std::vector<std::string>{"all-linear"} : l.target_modules;
  auto counts = model_->add_lora(l.r, l.alpha, l.dropout, targets, l.use_rslora, t.seed);
  std::string matched;
  int64_t n_params = 0;
  for (const auto& [name, n] : counts) matched += (matched.empty() ? "" : ", ") + name + " ×" + std::to_string(n);
  for (const torch::Tensor& p : model_->lora_parameters()) n_params += p.numel();
  log::info("lora: r=", l.r, " alpha=", l.alpha, " on ", matched, " (", n_params, " trainable parameters)");
  model_->gradient_checkpointing = t.gradient_checkpointing;
  memory_.record("after_load");  // memory_report.json (trainer/estimate.h)

  pad_id_ = tok_->pad_id() >= 0 ? tok_->pad_id() : tok_->eos_id();
  loader_ = std::make_unique<data::DataLoader>(&data_.train, t.micro_batch_size, cfg_.data, pad_id_, data::SamplerState{0, 0, cfg_.data.seed});
  int64_t per_epoch = 0;
  for (int64_t e = 0; e < std::max<int64_t>(1, t.num_epochs); ++e)
    per_epoch += (loader_->batches_in_epoch(e) + t.gradient_accumulation_steps - 1) / t.gradient_accumulation_steps;
  total_steps_ = t.max_steps > 0 ? t.max_steps : per_epoch;
  warmup_steps_ = t.warmup_ratio > 0 ? static_cast<int64_t>(std::ceil(t.warmup_ratio * total_steps_)) : t.warmup_steps;
  schedule_ = schedule_of(t.lr_scheduler);
  opt_ = make_adamw(model_->lora_parameters(), t);

  // Test hook: QLORA_FAULT_SIGTERM_AT="STEP:MICRO" sends this process SIGTERM while step STEP
  // (1-based) loads micro-batch MICRO (0-based), to test interruption at exact points.
  if (const char* f = std::getenv("QLORA_FAULT_SIGTERM_AT"))
    QLORA_CHECK(std::sscanf(f, "%ld:%ld", &fault_.step, &fault_.micro) == 2,
                "QLORA_FAULT_SIGTERM_AT: expected STEP:MICRO, got '", f, "'");
  preemption_ = {{"interruptions", 0}, {"time_lost_s", 0.0}, {"checkpoints", json::array()}};
  maybe_resume();  // may refuse (changed settings) before anything is written
  fs::create_directories(cfg_.output_dir);
  atomic_write_string((fs::path(cfg_.output_dir) / "config.resolved.yaml").string(), to_yaml(cfg_));
  if (step_ == 0) std::ofstream(fs::path(cfg_.output_dir) / "metrics.jsonl", std::ios::trunc);
  log::info("train: ", total_steps_, " steps of ", t.micro_batch_size, " x ", t.gradient_accumulation_steps,
            " rows, warmup ", warmup_steps_, ", device ", device_.str());
}

namespace {
std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int sig) { g_stop_signal.store(sig); }

/// Installs the stop handlers for SIGTERM, SIGINT and SIGUSR1 for its lifetime.
struct StopSignals {
  struct sigaction old_[3];
  static constexpr int kSignals[3] = {SIGTERM, SIGINT, SIGUSR1};
  StopSignals() {
    g_stop_signal.store(0);
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &sa, &old_[i]);
  }
  ~StopSignals() {
    for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &old_[i], nullptr);
  }
};
}  // namespace

void Trainer::train() {
  const TrainingConfig& t = cfg_.training;
  const CheckpointConfig& c = cfg_.checkpoint;
  StopSignals signals;
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  double last_save = 0, slowest_step = 0;
  model_->training = true;
  while (step_ < total_steps_) {
    const auto ts = std::chrono::steady_clock::now();
    const uint64_t epoch_before = loader_->state().epoch;
    std::vector<data::Batch> group;
    for (int64_t i = 0; i < t.gradient_accumulation_steps; ++i) {
      if (fault_.step == step_ + 1 && fault_.micro == i) std::raise(SIGTERM);  // test hook, see setup()
      const uint64_t epoch = loader_->state().epoch;
      group.push_back(loader_->next());
      if (loader_->state().epoch != epoch) break;  // an accumulation group never spans two epochs
    }
    const double lr = lr_at(schedule_, t.learning_rate, step_, warmup_steps_, total_steps_);
    StepResult r = train_step(*model_, *opt_, group, lr, t.max_grad_norm);
    memory_.after_step();
    ++step_;
    if (r.skipped) {
      ++skipped_steps_;
      log::warn("step ", step_, ": non-finite loss or gradient (loss ", r.loss, ", grad_norm ", r.grad_norm,
                "); update skipped");
      QLORA_CHECK(++nonfinite_in_a_row_ < t.max_nonfinite_steps, "training stopped: ", nonfinite_in_a_row_,
                  " consecutive steps had a non-finite loss or gradient (training.max_nonfinite_steps); "
                  "lower training.learning_rate or check the data");
    } else {
      nonfinite_in_a_row_ = 0;
    }
    losses_.push_back(r.loss);
    tokens_trained_ += r.tokens;
    double eval_loss = std::nan("");
    const bool last = step_ == total_steps_;
    if ((t.eval_steps > 0 && step_ % t.eval_steps == 0) || last) {
      model_->training = false;
      eval_loss = evaluate_loss(*model_, data_.eval, t.micro_batch_size, cfg_.data, pad_id_).first;
      model_->training = true;
    }
    const double step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - ts).count();
    slowest_step = std::max(slowest_step, step_s);
    log_step(step_, r, lr, step_s, eval_loss);

    // Checkpoint triggers: signal, time budget, steps, minutes, end of epoch, end of run.
    const int sig = g_stop_signal.load();
    const bool out_of_time = run_.max_time_s > 0 && elapsed() + 2 * slowest_step > run_.max_time_s;
    std::string why;
    if (sig) why = std::string("signal ") + strsignal(sig);
    else if (out_of_time) why = "--max-time budget";
    else if (last) why = "end of run";
    else if (c.save_steps > 0 && step_ % c.save_steps == 0) why = "save_steps";
    else if (c.save_minutes > 0 && elapsed() - last_save >= 60 * c.save_minutes) why = "save_minutes";
    else if (loader_->state().epoch != epoch_before) why = "end of epoch";
    if (!why.empty()) {
      save_checkpoint(why);
      last_save = elapsed();
    }
    if (sig || (out_of_time && !last)) {
      model_->training = false;
      throw Interrupted("stopped at step " + std::to_string(step_) + " by " + why +
                        " after writing a checkpoint; run the same command again to resume");
    }
  }
  model_->training = false;
  memory_.finish();  // peak; estimated vs measured into memory_report.json and the log
  save_outputs(train_seconds_before_ + elapsed());
}

void Trainer::log_step(int64_t step, const StepResult& r, double lr, double seconds, double eval_loss) {
  json j = {{"step", step},
            {"step_seconds", seconds},
            {"epoch", loader_->state().epoch + static_cast<double>(loader_->state().cursor) /
                                                    std::max<size_t>(1, data_.train.size())},
            {"loss", r.loss},
            {"lr", lr},
            {"grad_norm", r.grad_norm},
            {"tokens", r.tokens},
            {"tokens_per_s", seconds > 0 ? r.tokens / seconds : 0.0},
            {"skipped", r.skipped},
            {"memory", memory_snapshot(device_)}};
  if (!std::isnan(eval_loss)) j["eval_loss"] = eval_loss;
  std::ofstream(fs::path(cfg_.output_dir) / "metrics.jsonl", std::ios::app) << j.dump() << "\n";
  // ETA = mean step time of this invocation × remaining steps. The running sum lives in statics
  // (log_step's body is all this needs to own); it restarts for a new Trainer or a step that goes back.
  static const Trainer* eta_owner = nullptr;
  static int64_t eta_last_step = 0, eta_steps = 0;
  static double eta_seconds = 0, eta_last_eval = std::nan("");
  if (eta_owner != this || step <= eta_last_step) {
    eta_owner = this;
    eta_steps = 0;
    eta_seconds = 0;
    eta_last_eval = std::nan("");
  }
  eta_last_step = step;
  ++eta_steps;
  eta_seconds += seconds;
  if (!std::isnan(eval_loss)) eta_last_eval = eval_loss;
  const double eta_s = eta_seconds / eta_steps * static_cast<double>(std::max<int64_t>(0, total_steps_ - step));
  auto hms = [](double s) {
    const int64_t t = static_cast<int64_t>(std::llround(std::max(0.0, s)));
    char buf[32];
    if (t >= 3600)
      std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(t / 3600),
                    static_cast<long long>(t / 60 % 60), static_cast<long long>(t % 60));
    else
      std::snprintf(buf, sizeof buf, "%02lld:%02lld", static_cast<long long>(t / 60), static_cast<long long>(t % 60));
    return std::string(buf);
  };
  const int64_t tok_s = static_cast<int64_t>(seconds > 0 ? r.tokens / seconds : 0);
  static const bool tty = ::isatty(2) != 0;
  if (tty) {
    const int width = 24;
    const double frac = total_steps_ > 0 ? std::min(1.0, static_cast<double>(step) / total_steps_) : 1.0;
    const int filled = static_cast<int>(frac * width);
    char nums[160];
    std::snprintf(nums, sizeof nums, " %lld/%lld  loss %.4f  lr %.3g  %lld tok/s  ETA %s",
                  static_cast<long long>(step), static_cast<long long>(total_steps_), r.loss, lr,
                  static_cast<long long>(tok_s), hms(eta_s).c_str());
    std::string line = "\r[" + std::string(filled, '#') + std::string(width - filled, '.') + "]" + nums;
    if (!std::isnan(eta_last_eval)) line += "  eval " + std::to_string(eta_last_eval).substr(0, 6);
    line += "\033[K";  // clear what a longer previous line left
    if (step >= total_steps_) line += "\n";
    std::cerr << line << std::flush;
  } else if (step % cfg_.training.logging_steps == 0 || !std::isnan(eval_loss)) {
    log::info("step ", step, "/", total_steps_, "  loss ", r.loss, "  lr ", lr, "  grad_norm ", r.grad_norm, "  ",
              tok_s, " tok/s  ETA ", hms(eta_s),
              std::isnan(eval_loss) ? std::string() : "  eval_loss " + std::to_string(eval_loss));
  }
}

void Trainer::save_outputs(double seconds) {
  save_peft_adapter(cfg_.output_dir, peft_config(), model_->lora_weights());
  json s = {{"steps", step_},
            {"skipped_steps", skipped_steps_},
            {"tokens_trained", tokens_trained_},
            {"wall_seconds", seconds},
            {"tokens_per_s", seconds > 0 ? tokens_trained_ / seconds : 0.0},
            {"final_loss", losses_.empty() ? 0.0 : losses_.back()},
            {"peak_memory", memory_snapshot(device_)},
            {"preemption", preemption_}};
  if (cfg_.cost.gpu_hour_price > 0) {
    // cost.gpu_hour_price is currency-free: the same unit comes back.
    const double run_cost = cfg_.cost.gpu_hour_price * seconds / 3600.0;
    s["cost"] = {{"gpu_hour_price", cfg_.cost.gpu_hour_price},
                 {"run", run_cost},
                 {"per_million_tokens", tokens_trained_ > 0 ? run_cost / tokens_trained_ * 1e6 : 0.0}};
    log::info("cost: ", run_cost, " for this run, ", s["cost"]["per_million_tokens"].get<double>(),
              " per 1M training tokens (at ", cfg_.cost.gpu_hour_price, " per GPU-hour)");
  }
  atomic_write_string((fs::path(cfg_.output_dir) / "summary.json").string(), s.dump(2) + "\n");
  log::info("done: ", step_, " steps, ", tokens_trained_, " tokens in ", seconds, " s; adapter in ",
            cfg_.output_dir);
}

}  // namespace qlora

namespace qlora {

PeftConfig Trainer::peft_config() const {
  PeftConfig pc;
  pc.r = cfg_.lora.r;
  pc.lora_alpha = cfg_.lora.alpha;
  pc.lora_dropout = cfg_.lora.dropout;
  // PEFT expands the string "all-linear" only in its string form; write the names explicitly.
  pc.target_modules = cfg_.lora.all_linear ? llama_linear_names() : cfg_.lora.target_modules;
  pc.use_rslora = cfg_.lora.use_rslora;
  pc.base_model_name_or_path = cfg_.model.path.empty() ? cfg_.model.preset : cfg_.model.path;
  return pc;
}

std::string Trainer::checkpoint_dir() const {
  return (fs::path(cfg_.output_dir) / "checkpoints").string();
}

void Trainer::save_checkpoint(const std::string& why) {
  const auto t0 = std::chrono::steady_clock::now();
  TrainerState st;
  st.step = step_;
  st.sampler = loader_->state();
  st.skipped_steps = skipped_steps_;
  st.nonfinite_in_a_row = nonfinite_in_a_row_;
  st.tokens_trained = tokens_trained_;
  st.config_yaml = to_yaml(cfg_);
  OptimizerTensors ot;
  for (const torch::Tensor& p : model_->lora_parameters()) {
    auto it = opt_->state().find(p.unsafeGetTensorImpl());
    if (it == opt_->state().end()) {  // no update applied yet
      ot.exp_avg.push_back(torch::zeros_like(p, torch::kCPU));
      ot.exp_avg_sq.push_back(torch::zeros_like(p, torch::kCPU));
      ot.steps.push_back(0);
      continue;
    }
    auto& s = static_cast<torch::optim::AdamWParamState&>(*it->second);
    ot.exp_avg.push_back(s.exp_avg().to(torch::kCPU));
    ot.exp_avg_sq.push_back(s.exp_avg_sq().to(torch::kCPU));
    ot.steps.push_back(s.step());
  }
  torch::Tensor rng_cuda;
  if (device_.is_cuda()) rng_cuda = at::globalContext().defaultGenerator(c10::DeviceType::CUDA).get_state();
  const std::string path = write_checkpoint(checkpoint_dir(), st, peft_config(), model_->lora_weights(), ot,
                                            at::detail::getDefaultCPUGenerator().get_state(), rng_cuda);
  const auto removed = prune_checkpoints(checkpoint_dir(), cfg_.checkpoint.keep_last);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int64_t bytes = 0;
  for (const auto& e : fs::directory_iterator(path)) bytes += static_cast<int64_t>(fs::file_size(e.path()));
  preemption_["checkpoints"].push_back({{"step", step_}, {"reason", why}, {"seconds", secs}, {"bytes", bytes}});
  const std::string pruned = removed.empty() ? "" : ", pruned " + std::to_string(removed.size()) + " old";
  log::info("checkpoint ", path, " (", why, ", ", bytes, " bytes, ", secs, " s", pruned, ")");
  if (!cfg_.checkpoint.sync_command.empty()) {
    std::string cmd = cfg_.checkpoint.sync_command;
    for (size_t at; (at = cmd.find("{dir}")) != std::string::npos;) cmd.replace(at, 5, path);
    std::thread([cmd] {
      const int rc = std::system(cmd.c_str());
      if (rc != 0) log::warn("checkpoint.sync_command failed (status ", rc, "): ", cmd);
    }).detach();
  }
}

void Trainer::maybe_resume() {
  const CheckpointConfig& c = cfg_.checkpoint;
  if (c.resume == ResumeMode::kNever) return;
  std::string ckpt;
  if (c.resume == ResumeMode::kPath) {
    ckpt = c.resume_path;
    QLORA_CHECK(fs::is_directory(ckpt), "checkpoint.resume: ", ckpt, " is not a directory");
  } else {
    const std::string dir = c.resume_from_dir.empty() ? checkpoint_dir() : c.resume_from_dir;
    std::vector<std::string> skipped;
    ckpt = newest_valid_checkpoint(dir, &skipped);
    for (const std::string& s : skipped) log::warn("resume: skipping ", s);
    if (ckpt.empty()) {
      if (!skipped.empty()) log::warn("resume: no complete checkpoint in ", dir, "; starting from scratch");
      return;
    }
  }
  std::map<std::string, std::pair<int64_t, int64_t>> shapes;
  for (const FrozenLinear* f : const_cast<const LlamaModel&>(*model_).linears())
    if (f->lora) shapes[f->name] = {f->in_features(), f->out_features()};
  LoadedCheckpoint lc = read_checkpoint(ckpt, shapes);
  const std::vector<std::string> diffs = config_differences(lc.state.config_yaml, to_yaml(cfg_));
  if (!diffs.empty()) {
    std::string list;
    for (const auto& d : diffs) list += (list.empty() ? "" : "; ") + d;
    QLORA_CHECK(run_.force, "resume from ", ckpt, " refused: settings that change the run differ: ", list,
                " (use --force to resume anyway)");
    log::warn("resume: --force: continuing although settings differ: ", list);
  }
  // Adapter weights in place (the optimizer holds these very tensors).
  {
    torch::NoGradGuard ng;
    for (FrozenLinear* f : model_->linears()) {
      if (!f->lora) continue;
      const auto& ab = lc.adapter.at(f->name);
      f->lora->A.copy_(ab.first);
      f->lora->B.copy_(ab.second);
    }
  }
  const std::vector<torch::Tensor> params = model_->lora_parameters();
  QLORA_CHECK(lc.opt.steps.size() == params.size(), ckpt, ": optimizer state has ", lc.opt.steps.size(),
              " tensors, the model has ", params.size(), " LoRA tensors");
  for (size_t i = 0; i < params.size(); ++i) {
    if (lc.opt.steps[i] == 0) continue;
    auto st = std::make_unique<torch::optim::AdamWParamState>();
    st->step(lc.opt.steps[i]);
    st->exp_avg(lc.opt.exp_avg[i].to(device_));
    st->exp_avg_sq(lc.opt.exp_avg_sq[i].to(device_));
    opt_->state()[params[i].unsafeGetTensorImpl()] = std::move(st);
  }
  loader_ = std::make_unique<data::DataLoader>(&data_.train, cfg_.training.micro_batch_size, cfg_.data, pad_id_,
                                               lc.state.sampler);
  {
    at::Generator g = at::detail::getDefaultCPUGenerator();
    g.set_state(lc.rng_cpu);
    if (lc.rng_cuda.defined() && device_.is_cuda()) {
      at::Generator gc = at::globalContext().defaultGenerator(c10::DeviceType::CUDA);
      gc.set_state(lc.rng_cuda);
    }
  }
  step_ = lc.state.step;
  skipped_steps_ = lc.state.skipped_steps;
  nonfinite_in_a_row_ = lc.state.nonfinite_in_a_row;
  tokens_trained_ = lc.state.tokens_trained;
  train_seconds_before_ = lc.state.train_seconds;
  // metrics.jsonl: keep the lines up to the checkpoint; steps past it were lost and are redone.
  const fs::path mp = fs::path(cfg_.output_dir) / "metrics.jsonl";
  std::string kept;
  double lost = 0;
  if (fs::exists(mp)) {
    std::istringstream in(read_file(mp.string()));
    for (std::string line; std::getline(in, line);) {
      if (line.empty()) continue;
      const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.contains("step")) continue;
      if (j["step"].get<int64_t>() <= step_) {
        kept += line + "\n";
        losses_.push_back(j.value("loss", 0.0));
      } else {
        lost += j.value("step_seconds", 0.0);
      }
    }
  }
  fs::create_directories(cfg_.output_dir);
  atomic_write_string(mp.string(), kept);
  preemption_["interruptions"] = 1;
  preemption_["time_lost_s"] = lost;
  log::info("resume: from ", ckpt, " at step ", step_, " (epoch ", lc.state.sampler.epoch, ", cursor ",
            lc.state.sampler.cursor, "); ", lost, " s of work past it redone");
}

}  // namespace qlora
