#include "trainer/train.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "adapters/peft.h"
#include "common/error.h"
#include "common/files.h"
#include "common/format.h"
#include "common/log.h"
#include "common/safetensors.h"
#include "trainer/batch_tensors.h"
#include "trainer/loss.h"
#include "trainer/memory.h"
#include "trainer/checkpoint.h"
#include "trainer/distributed.h"
#include "trainer/fault.h"
#include "trainer/launch.h"
#include "trainer/sync.h"

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <unistd.h>
#include <cstring>
#include <sstream>
#include <thread>
#include <typeinfo>
#include <atomic>
#include <optional>
#include <set>
#include <algorithm>

namespace qlora {
namespace fs = std::filesystem;
using json = nlohmann::json;

std::unique_ptr<torch::optim::AdamW> make_adamw(const std::vector<torch::Tensor>& params, const TrainingConfig& t) {
  QLORA_CHECK(!params.empty(), "training: no trainable parameters (no LoRA adapter attached)");
  return std::make_unique<torch::optim::AdamW>(
      params, torch::optim::AdamWOptions(t.learning_rate)
                  .betas({t.adam_beta1, t.adam_beta2})
                  .eps(t.adam_epsilon)
                  .weight_decay(t.weight_decay));
}

StepResult train_step(LlamaModel& model, torch::optim::Optimizer& opt, const std::vector<data::Batch>& micro_batches,
                      const StepOptions& o) {
  const double lr = o.lr, max_grad_norm = o.max_grad_norm;
  const int64_t ce_chunk_tokens = o.ce_chunk_tokens;
  Distributed* dist = o.dist;
  StepResult r;
  for (const data::Batch& b : micro_batches) r.targets += count_targets(b);
  if (dist && dist->active()) {  // the normaliser is the target count of the global group
    std::vector<double> n{static_cast<double>(r.targets)};
    dist->sum(n);
    r.targets = static_cast<int64_t>(n[0]);
  }
  QLORA_CHECK(r.targets > 0, "training: an accumulated batch has no label tokens");
  opt.zero_grad();
  double loss_sum = 0;
  for (const data::Batch& b : micro_batches) {
    for (int32_t m : b.attention_mask) r.tokens += m;  // the non-padding positions
    ForwardInputs in = batch_inputs(b, model.device());
    torch::Tensor hidden = model.hidden_states(in);
    auto [rows, targets] = next_token_rows(hidden, batch_labels(b, model.device()), in.segment_ids);
    if (targets.numel() == 0) continue;
    torch::Tensor loss = chunked_cross_entropy_sum(rows, model.lm_head, targets, ce_chunk_tokens);
    (loss / static_cast<double>(r.targets)).backward();
    loss_sum += loss.item<double>();
  }
  std::vector<torch::Tensor> params = model.lora_parameters();
  if (dist && dist->active()) {  // global gradient, loss sum and token count
    dist->sum_gradients(params);
    std::vector<double> sums{loss_sum, static_cast<double>(r.tokens)};
    dist->sum(sums);
    loss_sum = sums[0];
    r.tokens = static_cast<int64_t>(sums[1]);
  }
  r.loss = loss_sum / static_cast<double>(r.targets);
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

uint64_t parameter_checksum(const std::vector<torch::Tensor>& params) {
  size_t total = 0;
  for (const torch::Tensor& p : params) total += static_cast<size_t>(p.numel()) * p.element_size();
  std::string bytes;
  bytes.reserve(total);
  for (const torch::Tensor& p : params) {
    const torch::Tensor c = p.detach().to(torch::kCPU).contiguous();
    bytes.append(static_cast<const char*>(c.data_ptr()), static_cast<size_t>(c.numel()) * c.element_size());
  }
  return std::stoull(sha256_hex(bytes).substr(0, 16), nullptr, 16);  // the digest's first 8 bytes, big-endian
}

std::string format_duration(double seconds) {
  const int64_t t = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  char buf[40];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(t / 3600), static_cast<long long>(t / 60 % 60));
  else if (t >= 60)
    std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(t / 60), static_cast<long long>(t % 60));
  else
    std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(t));
  return buf;
}

void set_deterministic_algorithms() {
  at::Context& ctx = at::globalContext();
  ctx.setDeterministicAlgorithms(true, /*warn_only=*/true);
  ctx.setSDPUseFlash(false);
  ctx.setSDPUseMemEfficient(false);
  ctx.setSDPUseCuDNN(false);
  ctx.setSDPUseMath(true);
}

std::vector<double> evaluate_batch_sums(const LlamaModel& model, const std::vector<data::Example>& examples,
                                        int64_t batch_size, const data::DataOptions& opts, int32_t pad_id, int rank,
                                        int world) {
  QLORA_CHECK(batch_size > 0 && world > 0 && rank >= 0 && rank < world, "evaluate_batch_sums: batch size ", batch_size,
              ", rank ", rank, " of ", world);
  const size_t batches = (examples.size() + static_cast<size_t>(batch_size) - 1) / static_cast<size_t>(batch_size);
  std::vector<double> sums(2 * batches, 0.0);
  torch::NoGradGuard ng;
  for (size_t k = static_cast<size_t>(rank); k < batches; k += static_cast<size_t>(world)) {
    const size_t i = k * static_cast<size_t>(batch_size);
    std::vector<std::vector<const data::Example*>> rows;
    for (size_t j = i; j < std::min(examples.size(), i + batch_size); ++j) rows.push_back({&examples[j]});
    data::Batch b = data::collate(rows, pad_id, opts.padding_side == data::PaddingSide::kLeft);
    ForwardInputs in = batch_inputs(b, model.device());
    auto [rws, targets] = next_token_rows(model.hidden_states(in), batch_labels(b, model.device()), in.segment_ids);
    if (targets.numel() == 0) continue;
    sums[2 * k] = chunked_cross_entropy_sum(rws, model.lm_head, targets).item<double>();
    sums[2 * k + 1] = static_cast<double>(targets.numel());
  }
  return sums;
}

std::pair<double, int64_t> eval_mean(const std::vector<double>& batch_sums) {
  double sum = 0;
  int64_t count = 0;
  for (size_t k = 0; k + 1 < batch_sums.size(); k += 2) {
    if (batch_sums[k + 1] == 0) continue;
    sum += batch_sums[k];
    count += static_cast<int64_t>(batch_sums[k + 1]);
  }
  return {count ? sum / static_cast<double>(count) : std::nan(""), count};
}

std::pair<double, int64_t> evaluate_loss(const LlamaModel& model, const std::vector<data::Example>& examples,
                                         int64_t batch_size, const data::DataOptions& opts, int32_t pad_id) {
  if (examples.empty()) return {std::nan(""), 0};
  return eval_mean(evaluate_batch_sums(model, examples, batch_size, opts, pad_id));
}

// ---------------------------------------------------------------------------------------------

ModuleShapes peft_module_shapes(const LlamaModel& model, const PeftConfig& pc) {
  ModuleShapes out;
  for (const FrozenLinear* f : model.linears())
    if (peft_targets_module(pc, f->name)) out[f->name] = {f->in_features(), f->out_features()};
  return out;
}

std::string check_config_inputs(const Config& cfg, bool need_weights) {
  std::vector<std::string> errors;
  const auto collect = [&](auto&& check) {
    try {
      with_key_sources(cfg, check);
    } catch (const ErrorList& e) {
      errors.insert(errors.end(), e.lines().begin(), e.lines().end());
    } catch (const Error& e) {
      if (typeid(e) != typeid(Error)) throw;
      errors.emplace_back(e.what());
    }
  };
  std::string tok_src;
  collect([&] {
    tok_src = tokenizer_source(cfg.model);
    if (need_weights) check_model_weights(cfg.model);  // after: a missing dir is named once, as not found
  });
  collect([&] { data::check_files_exist(cfg.data); });
  if (errors.size() == 1) throw Error(errors[0]);
  if (errors.size() > 1) throw ErrorList(errors);
  return tok_src;
}

LlamaModel load_base_model(const Config& cfg, int64_t tokenizer_vocab, torch::Dtype dtype, torch::Device device) {
  const QuantOptions& q = cfg.quantization;
  if (!cfg.model.random_init) {
    // (a quant type other than the stored one names quantization.method's file:line / --set)
    LlamaModel m = with_key_sources(cfg, [&] { return LlamaModel::load(cfg.model.path, dtype, device, q); });
    const std::string honoured = honour_quant_request(m, q);
    if (!honoured.empty()) log::warn(honoured);
    return m;
  }
  // init: random draws the weights; model.path gives the shape only (docs/config.md, model.init).
  ModelConfig mc;
  if (cfg.model.path.empty()) {
    mc = preset_config(cfg.model.preset);
    mc.vocab_size = tokenizer_vocab;
  } else {
    mc = with_key_sources(cfg, [&] { return load_model_config(cfg.model.path); });
  }
  log::info("model: init: random, the shape of ", cfg.model.path.empty() ? "preset " + cfg.model.preset
                                                                          : cfg.model.path + "/config.json",
            " (no weights are read)");
  return LlamaModel::random_init(mc, cfg.training.seed, dtype, device, q);
}

std::string honour_quant_request(LlamaModel& model, const QuantOptions& q) {
  int64_t requantized = 0, dequantized = 0;
  std::string stored;
  for (FrozenLinear* f : model.linears()) {
    if (!f->quantized()) continue;
    const QuantizedWeight& w = *f->qweight;
    if (stored.empty())
      stored = std::string(kernels::quant_type_name(w.type)) + " blocksize " + std::to_string(w.blocksize) + " double_quant " +
               (w.double_quant ? "true" : "false");
    if (!q.enabled() || !q.quantizes(f->name)) {
      f->weight = w.dequantize(model.dtype());
      f->qweight = nullptr;
      ++dequantized;
    } else if (w.blocksize != q.blocksize || w.double_quant != q.double_quant) {
      f->qweight = std::make_shared<const QuantizedWeight>(
          quantize(w.dequantize(torch::kFloat32), q.type(), q.blocksize, q.double_quant));
      ++requantized;
    }
  }
  if (requantized + dequantized == 0) return "";
  std::string msg = "quantization: the base is stored as bitsandbytes " + stored + ";";
  if (requantized)
    msg += " requantized " + std::to_string(requantized) + " linears to blocksize " + std::to_string(q.blocksize) +
           " double_quant " + (q.double_quant ? "true" : "false") + " as configured (dequantize, then quantize)";
  if (dequantized)
    msg += std::string(requantized ? ";" : "") + " dequantized " + std::to_string(dequantized) + " linears to " +
           dtype_name(dtype_of(model.dtype())) +
           " as configured (" +
           (q.enabled() ? "quantization.keep_16bit" : "quantization.method: none") +
           "; their values are the stored 4-bit ones)";
  return msg;
}

Trainer::Trainer(Config cfg, RunOptions run) : cfg_(std::move(cfg)), run_(run) { progress_.tty = ::isatty(2) != 0; }

namespace {
/// True for the leftovers of an interrupted atomic write ("<name>.tmp.<pid>"), which do not make
/// an output_dir "used".
bool is_temp_leftover(const std::string& name) {
  const size_t at = name.rfind(".tmp.");
  return at != std::string::npos && at + 5 < name.size() &&
         std::all_of(name.begin() + static_cast<std::ptrdiff_t>(at + 5), name.end(), ::isdigit);
}

// Removes output_dir's interrupted atomic writes (NAME.tmp.PID, common/files.h) whose process is
// gone (kill(PID, 0): ESRCH), e.g. adapter_model.safetensors.tmp.5158 of a run killed by SIGKILL
// while writing it (a trial, session 21: left there for good). Called by the run that holds
// output_dir's lock; a live writer's file (qlora eval writing eval_base.json) is left. Never throws.
void remove_dead_temp_files(const fs::path& out) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(out, ec)) {
    const std::string name = e.path().filename().string();
    if (!is_temp_leftover(name)) continue;
    const long pid = std::strtol(name.c_str() + name.rfind(".tmp.") + 5, nullptr, 10);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      std::error_code rm;
      if (fs::remove(e.path(), rm)) log::info("output_dir: removed ", name, ", an interrupted write of a process gone");
    }
  }
}

// What makes output_dir used: anything but memory_report.json (what a run that failed while
// loading, before it owned the directory, leaves behind), eval_base.json (what `qlora eval CONFIG`
// writes there by default: a baseline before training; eval.json from before it had that name),
// the lock file and interrupted atomic writes. Sorted.
std::vector<std::string> used_entries(const fs::path& out) {
  std::vector<std::string> entries;
  std::error_code ec;
  if (fs::is_directory(out, ec))
    for (const auto& e : fs::directory_iterator(out, ec)) {
      const std::string name = e.path().filename().string();
      if (!is_temp_leftover(name) && name != "memory_report.json" && name != "eval.json" && name != "eval_base.json" &&
          name != OutputDirLock::kFile)
        entries.push_back(name);
    }
  std::sort(entries.begin(), entries.end());
  return entries;
}

// output_dir can be created and written, checked read-only before the model loads: its nearest
// existing ancestor (output_dir itself when it exists) is a directory this process may write into
// (access(W_OK | X_OK), which fails on a read-only file system, EROFS, for root too). Throws
// qlora::Error "output_dir: cannot create|write PATH: ..." otherwise.
void check_output_dir_writable(const std::string& output_dir) {
  const fs::path out(output_dir);
  std::error_code ec;
  fs::path at = out;
  while (!fs::exists(at, ec) && at.has_parent_path() && at.parent_path() != at) at = at.parent_path();
  if (at.empty() || !fs::exists(at, ec)) at = ".";  // a relative output_dir with no existing part: the cwd
  const std::string verb = at == out ? "write" : "create";
  QLORA_CHECK(fs::is_directory(at, ec), "output_dir: cannot ", verb, " ", output_dir, ": ", at.string(),
              " is not a directory");
  if (::access(at.c_str(), W_OK | X_OK) != 0)
    fail("output_dir: cannot ", verb, " ", output_dir, ": ", at == out ? "" : at.string() + ": ", std::strerror(errno));
}

// --overwrite-output-dir renames output_dir to `aside` after the model load: the folder holding
// both must be writable (a rename changes it), checked before the load.
void check_can_move_aside(const std::string& output_dir, const std::string& aside) {
  fs::path parent = fs::path(output_dir).parent_path();
  if (parent.empty()) parent = ".";
  if (::access(parent.c_str(), W_OK | X_OK) != 0)
    fail("output_dir: cannot move ", output_dir, " aside to ", aside, " (--overwrite-output-dir): ", parent.string(),
         ": ", std::strerror(errno));
}

// The files under `prefix` ("model.path/") whose digests differ between a checkpoint's record
// (`before`, model_file_digests) and now: "<file> differs" / "<file> is gone" / "<file> is new",
// ", "-joined; "" when they are the same files.
std::string digest_changes(const std::map<std::string, std::string>& before,
                           const std::map<std::string, std::string>& now, const std::string& prefix) {
  std::string list;
  auto add = [&](const std::string& k, const char* what) {
    list += (list.empty() ? "" : ", ") + k.substr(prefix.size()) + what;
  };
  for (const auto& [k, v] : before) {
    if (k.rfind(prefix, 0) != 0) continue;
    const auto it = now.find(k);
    if (it == now.end()) add(k, " is gone");
    else if (it->second != v) add(k, " differs");
  }
  for (const auto& [k, v] : now)
    if (k.rfind(prefix, 0) == 0 && !before.count(k)) add(k, " is new");
  return list;
}

// Whether `digests` (model_file_digests) holds a file under `prefix` ("lora.model_dir/").
bool has_files_under(const std::map<std::string, std::string>& digests, const std::string& prefix) {
  const auto it = digests.lower_bound(prefix);
  return it != digests.end() && it->first.rfind(prefix, 0) == 0;
}

// `now` (model_file_digests of this invocation) without lora.model_dir's files, the adapter being
// gone: given `recorded`'s (the checkpoint's record of the adapter the run started from).
void keep_recorded_adapter_digests(std::map<std::string, std::string>& now,
                                   const std::map<std::string, std::string>& recorded) {
  const std::string prefix = "lora.model_dir/";
  if (has_files_under(now, prefix)) return;
  for (auto it = recorded.lower_bound(prefix); it != recorded.end() && it->first.rfind(prefix, 0) == 0; ++it)
    now.insert(*it);
}

// The entry of a config_differences() list about `key` ("lora.r: 16 -> 8" for "lora.r"); end() when
// the key does not differ.
std::vector<std::string>::iterator find_difference(std::vector<std::string>& diffs, const std::string& key) {
  return std::find_if(diffs.begin(), diffs.end(), [&](const std::string& d) { return d.rfind(key + ": ", 0) == 0; });
}

// What claim_output_dir's decision reads: the used entries, run.json's run id and the checkpoints.
std::string output_dir_state(const std::string& output_dir, const std::string& checkpoint_dir) {
  std::string s;
  for (const std::string& e : used_entries(output_dir)) s += e + "\n";
  s += "run " + read_run_record(output_dir).run_id + "\n";
  for (const std::string& c : list_checkpoints(checkpoint_dir)) s += c + "\n";
  return s;
}
}  // namespace

namespace {
std::atomic<bool> g_announce_setup_stop{false};  // rank 0 says why it exits
/// A stop signal (kStopSignals) during setup (model load, quantization, data: before the first step,
/// with nothing of this invocation to save): exit 75 at once, as a stop during training does after
/// its checkpoint, so a supervisor that reruns on 75 reruns (before: the default action, a silent
/// exit 143). What setup writes (run.json, the lock) is written atomically or is harmless to leave.
/// Only write(2) and _exit(2) here: both are async-signal-safe.
extern "C" void on_setup_signal(int) {
  static const char kSay[] =
      "\nqlora: stop requested during setup (loading the model and data, before the first step): nothing to "
      "save; exit 75: rerun the same command to start (or resume from the last checkpoint)\n";
  if (g_announce_setup_stop.load()) {
    [[maybe_unused]] const ssize_t n = ::write(2, kSay, sizeof kSay - 1);
  }
  ::_exit(75);
}

}  // namespace

namespace {
/// `lora.model_dir`'s adapter_config.json, checked against this config's lora section before the
/// base model loads: read_peft_config's errors (a missing directory or file, a field PEFT would use
/// that we do not support), and r / lora_alpha / use_rslora other than lora.r / lora.alpha /
/// lora.use_rslora, each thrown as one qlora::Error line starting "lora.model_dir: " (placed at the
/// key's file:line by with_key_sources). lora_dropout and target_modules are not compared here:
/// dropout stays the config's; the modules are checked with the tensors (load_initial_adapter).
PeftConfig check_initial_adapter(const LoraConfig& l) {
  PeftConfig pc;
  try {
    pc = read_peft_config(l.model_dir);
  } catch (const ErrorList&) {
    throw;
  } catch (const Error& e) {
    fail("lora.model_dir: ", e.what());
  }
  const std::string file = (fs::path(l.model_dir) / "adapter_config.json").string();
  auto num = [](double v) {
    std::ostringstream o;
    o << v;
    return o.str();
  };
  auto tf = [](bool b) { return std::string(b ? "true" : "false"); };
  auto refuse = [&](const char* field, const std::string& theirs, const char* key, const std::string& ours) {
    fail("lora.model_dir: ", file, " has ", field, " ", theirs, ", this config's lora.", key, " is ", ours,
         " (set lora.", key, ": ", theirs, " to continue it)");
  };
  if (pc.r != l.r) refuse("r", std::to_string(pc.r), "r", std::to_string(l.r));
  if (pc.lora_alpha != l.alpha) refuse("lora_alpha", num(pc.lora_alpha), "alpha", num(l.alpha));
  if (pc.use_rslora != l.use_rslora) refuse("use_rslora", tf(pc.use_rslora), "use_rslora", tf(l.use_rslora));
  return pc;
}

/// Copies the PEFT adapter in `dir` (its adapter_config.json read into `pc` by
/// check_initial_adapter) into `model`'s LoRA tensors in place (the optimizer, made after, holds
/// these very tensors; as Trainer::resume_from). The adapter must hold exactly the modules this
/// config's lora.target_modules adapts, in their shapes: load_peft_adapter lists the missing /
/// unexpected keys and wrong shapes (nothing is copied then). Returns the modules loaded. Throws
/// qlora::Error starting "lora.model_dir: ".
int64_t load_initial_adapter(LlamaModel& model, const std::string& dir, const PeftConfig& pc) {
  LoraWeights w;
  try {
    w = load_peft_adapter(dir, pc, model.adapted_shapes(), "lora.target_modules");
  } catch (const Error& e) {
    fail("lora.model_dir: ", e.what(), " (lora.target_modules must adapt exactly the modules the adapter holds)");
  }
  torch::NoGradGuard ng;
  for (FrozenLinear* f : model.linears()) {
    if (!f->lora) continue;
    const auto& ab = w.at(f->name);
    f->lora->A.copy_(ab.first);
    f->lora->B.copy_(ab.second);
  }
  return static_cast<int64_t>(w.size());
}
}  // namespace

void Trainer::setup() {
  g_announce_setup_stop.store(run_.dist.rank == 0);
  const StopSignalHandlers setup_signals(on_setup_signal);
  setup_start_ = std::chrono::steady_clock::now();
  const TrainingConfig& t = cfg_.training;
  device_ = training_device(run_.dist);  // CPU, or CUDA (cuda:LOCAL_RANK in a launched job)
  torch::manual_seed(t.seed);
  dist_ = std::make_unique<Distributed>(run_.dist, device_);  // WORLD_SIZE > 1: rendezvous (docs/distributed.md)

  // Everything that can fail on bad input happens before output_dir is touched.
  // Errors naming a config key (model.path, data.val_set_size, ...) name its file:line too.
  const std::string tok_src = check_config_inputs(cfg_, /*need_weights=*/true);
  tok_ = std::make_unique<data::Tokenizer>(data::Tokenizer::from_pretrained(tok_src));
  if (run_.dist.rank == 0) log::info("tokenizer: ", tok_->describe());
  with_key_sources(cfg_, [&] {
    cfg_.data.template_name = data::resolve_template(cfg_.data.template_name, tok_src);  // "auto" -> a name
    data_ = data::load_datasets(cfg_.data, *tok_);
  });
  if (data_.stats.read.format != "completion" && run_.dist.rank == 0)  // raw text: no template
    for (const std::string& note : data::template_warnings(cfg_.data.template_name, tok_src, *tok_, cfg_.data.add_eos)) log::warn(note);
  if (data_.stats.held_out_records > 0 && data_.stats.held_out_records != data_.stats.eval_examples)
    log::info("data: data.val_set_size held out ", data_.stats.held_out_records, " records (drawn before the drops); ",
              data_.stats.eval_examples, " of them give eval examples");
  log::info("data: ", data_.stats.train_examples, " train / ", data_.stats.eval_examples, " eval examples, ",
            data_.stats.tokens_trainable, " trainable tokens");
  // Records that repeat another (deduplicate off): a hold-out sharing records with train measures memorisation.
  if (const std::string note = data::duplicates_note(data_); !note.empty() && run_.dist.rank == 0)
    log::warn("data: ", note);
  // each file of data.train / data.eval: its own drops, named by its key (the same file can be both)
  std::vector<std::pair<std::string, const data::SourceStats*>> data_files;
  for (const bool is_eval : {false, true}) {
    const std::vector<data::SourceStats>& v = is_eval ? data_.eval_sources : data_.train_sources;
    for (size_t i = 0; i < v.size(); ++i)
      data_files.emplace_back(data::source_key(is_eval, v.size(), i) + " " + v[i].source.path, &v[i]);
  }
  for (const auto& [file, f] : data_files) {
    if (run_.dist.rank != 0) continue;  // every rank reads the same data: rank 0 says it once
    const data::DataStats* st = &f->stats;
    for (const std::string& note : data::file_notes(*st, cfg_.data.template_name)) log::warn("data: ", file, ": ", note);
    if (st->split_documents > 0)
      log::info("data: ", file, ": ", st->split_documents, " documents longer than sequence_len ", st->sequence_len,
                " split into ", st->split_pieces, " pieces (data.truncation: split; ", st->split_tails_dropped,
                " single-token tails dropped)");
  }

  // sample_packing that packs (almost) nothing: every example longer than half a row. Silent, it
  // looks like packing at work; data preview's "(1.00 a row)" is the same count (batching_stats).
  if (cfg_.data.sample_packing && run_.dist.rank == 0 && !data_.train.empty()) {
    const data::BatchingStats b =
        data::batching_stats(data_.train, cfg_.training.micro_batch_size, cfg_.data, tok_->batch_pad_id());
    const double per_row = static_cast<double>(b.examples) / static_cast<double>(std::max<int64_t>(1, b.rows));
    if (per_row <= 1.05) {
      size_t shortest = data_.train.front().input_ids.size(), longest = shortest;
      for (const data::Example& ex : data_.train) {
        shortest = std::min(shortest, ex.input_ids.size());
        longest = std::max(longest, ex.input_ids.size());
      }
      const int64_t len = cfg_.data.sequence_len;
      char ratio[32];
      std::snprintf(ratio, sizeof ratio, "%.2f", per_row);
      log::warn("data: sample_packing packs ", b.examples == b.rows ? "nothing" : "almost nothing", ": ", ratio,
                " examples a row in epoch 1 (", b.examples, " examples in ", b.rows, " rows); the examples are ",
                shortest, "..", longest, " tokens, so ",
                2 * static_cast<int64_t>(shortest) > len ? "no two" : "few pairs", " fit in one sequence_len ", len,
                " row: set data.sample_packing: false, or raise data.sequence_len");
    }
  }

  // The run's identity: its run-meaning settings and the content (not only the paths) of its data;
  // which run owns output_dir and what to resume is decided before anything is written.
  for (const auto& [key, f] : data_files) data_sha_[f->source.path] = sha256_file(f->source.path);
  model_files_ = model_file_digests(cfg_.model.path, cfg_.model.tokenizer, cfg_.lora.model_dir);
  fingerprint_ = run_fingerprint(to_yaml(cfg_), data_sha_);
  // Data parallel: every rank runs rank 0's config on the same data; rank 0 alone decides (and
  // later writes) output_dir, the others take its run id and checkpoint.
  check_same_run_as_main();
  // Which run owns output_dir and what to resume are decided now, read-only, before the model
  // loads: a second run on a locked output_dir, or a fresh run into a used one, stops here in
  // seconds, creating nothing. The lock itself is taken after the load (below), so bad input (a
  // truncated model.safetensors) leaves no output_dir, run.lock or memory_report.json behind.
  // (from_main: the other ranks stop with rank 0's error instead of loading and then waiting)
  fault_ = FaultHooks::from_env();  // the QLORA_FAULT_* test hooks (trainer/fault.h); unset: none
  std::string claimed_state;        // output_dir as the decision saw it (rank 0)
  const std::string claim = dist_->from_main("claim", [&] {
    OutputDirLock::check_free(cfg_.output_dir);
    const std::string c = claim_output_dir();
    check_output_dir_writable(cfg_.output_dir);  // a read-only file system: refused now, not after the load
    if (!aside_.empty()) check_can_move_aside(cfg_.output_dir, aside_);  // --overwrite-output-dir's rename
    if (!c.empty()) {
      const TrainerState saved = read_trainer_state(c);
      check_resume_settings(c, saved);  // changed settings, data or WORLD_SIZE: refused now, not after the load
      // a lora.model_dir gone since (a resume does not read it): the new checkpoints keep the
      // digests of the adapter the run started from, so a later move is still recognised
      if (!cfg_.lora.model_dir.empty()) keep_recorded_adapter_digests(model_files_, saved.model_files);
    }
    claimed_state = output_dir_state(cfg_.output_dir, checkpoint_dir());
    return run_id_ + "\n" + c;
  });
  run_id_ = claim.substr(0, claim.find('\n'));
  const std::string ckpt = claim.substr(claim.find('\n') + 1);
  // Every rank reads the checkpoint rank 0 resumes from: one it cannot see is an output_dir that
  // is not shared (trial 18: reported as "no manifest.json (incomplete)", of a complete checkpoint).
  QLORA_CHECK(ckpt.empty() || dist_->is_main() || fs::exists(fs::path(ckpt) / "manifest.json"), "distributed: rank ",
              dist_->rank(), " cannot see ", ckpt, ", the checkpoint rank 0 resumes from: output_dir (and "
              "checkpoint.resume_from_dir) must be on a filesystem every rank shares (one node, or a shared mount; "
              "docs/distributed.md)");
  // lora.model_dir: its adapter_config.json must fit this lora section; refused in seconds, before
  // the model loads, nothing written. A resume takes the checkpoint's weights: the adapter is not
  // read then (it may be gone; a changed lora.model_dir was refused by check_resume_settings).
  std::optional<PeftConfig> initial_adapter;
  if (!cfg_.lora.model_dir.empty() && ckpt.empty())
    initial_adapter = with_key_sources(cfg_, [&] { return check_initial_adapter(cfg_.lora); });
  if (fault_.load_delay_ms > 0) {
    log::info("fault: QLORA_FAULT_LOAD_DELAY_MS: sleeping ", fault_.load_delay_ms, " ms before the model loads");
    std::this_thread::sleep_for(std::chrono::milliseconds(fault_.load_delay_ms));
  }

  // memory_report.json: every rank measures; rank 0 alone writes, with the others' reports
  // gathered at the end ("ranks"). Warns if it will not fit. Nothing is written before the run
  // owns output_dir (below); a resume writes it only once it is known not to be a finished run's
  // (whose report stays).
  memory_.begin(cfg_, model_config_for(cfg_, tok_->vocab_size()), device_, dist_->world_size(), /*writes=*/false);
  if (!run_.estimate_command.empty())
    memory_.set_estimate_command(run_.estimate_command + (device_.is_cuda() ? "" : " --device cpu") +
                                 (dist_->world_size() > 1 ? " --world-size " + std::to_string(dist_->world_size()) : ""));
  const torch::Dtype dtype = torch_dtype(cfg_.model.dtype, device_);
  model_ = std::make_unique<LlamaModel>(load_base_model(cfg_, tok_->vocab_size(), dtype, device_));
  check_tokenizer_fits(model_->config(), tok_->vocab_size());
  if (const double p = model_->config().attention_dropout; p > 0 && run_.dist.rank == 0)
    log::warn("model: config.json has attention_dropout ", p, ", which qlora does not apply: this run trains "
              "without attention dropout (transformers + PEFT would drop attention probabilities in training; "
              "released Llama / Mistral / Qwen configs have 0.0)");
  const LoraConfig& l = cfg_.lora;
  LoraOptions lo = lora_options(peft_config());  // r, alpha, dropout, use_rslora
  lo.target_modules = l.target_modules;
  lo.seed = t.seed;
  auto counts = model_->add_lora(lo);
  std::string matched;
  int64_t n_params = 0;
  for (const auto& [name, n] : counts) matched += (matched.empty() ? "" : ", ") + name + " ×" + std::to_string(n);
  for (const torch::Tensor& p : model_->lora_parameters()) n_params += p.numel();
  log::info("lora: r=", l.r, " alpha=", l.alpha, " on ", matched, " (", n_params, " trainable parameters)");
  // lora.model_dir: the run starts from that adapter (Axolotl's lora_model_dir, PEFT's
  // PeftModel.from_pretrained(..., is_trainable=True)), before output_dir is locked; a resume's
  // checkpoint weights win (resume_from), so a resumed run does not read the tensors again.
  if (initial_adapter) {
    const int64_t n = with_key_sources(cfg_, [&] { return load_initial_adapter(*model_, l.model_dir, *initial_adapter); });
    log::info("lora: initialised from ", l.model_dir, " (", n, " modules)");
  } else if (!l.model_dir.empty()) {
    log::info("lora: lora.model_dir ", l.model_dir, " not read: the run resumes from ", ckpt, ", whose adapter continues it");
  }
  model_->gradient_checkpointing = t.gradient_checkpointing;
  memory_.record("after_load");  // memory_report.json (trainer/estimate.h)

  // Only now, with the model loaded, does the run take output_dir: rank 0 locks it (creating it).
  // What the decision above read must still be there: a run that took and left output_dir while
  // this one loaded would otherwise be mixed with (or resumed past) by a stale decision.
  dist_->from_main("lock", [&] {
    lock_ = std::make_unique<OutputDirLock>(cfg_.output_dir);  // a second run that started meanwhile stops here
    QLORA_CHECK(output_dir_state(cfg_.output_dir, checkpoint_dir()) == claimed_state, "output_dir ", cfg_.output_dir,
                " changed while the model loaded (another process wrote to it); nothing of this run was written: "
                "run the command again to decide anew which run owns it");
    remove_dead_temp_files(cfg_.output_dir);
    return std::string();
  });
  if (ckpt.empty()) memory_.set_writes(dist_->is_main());  // before_load and after_load, written now

  pad_id_ = tok_->batch_pad_id();
  loader_ = std::make_unique<data::DataLoader>(&data_.train, t.micro_batch_size, cfg_.data, pad_id_, data::SamplerState{0, 0, cfg_.data.seed});
  plan_steps();
  opt_ = make_adamw(model_->lora_parameters(), t);

  preemption_ = {{"interruptions", 0}, {"time_lost_s", 0.0}, {"checkpoints", json::array()}};
  if (!ckpt.empty()) resume_from(ckpt);         // may refuse (changed settings, data, shapes)
  already_complete_ = !ckpt.empty() && step_ >= total_steps_ && outputs_written();
  if (!ckpt.empty() && step_ >= total_steps_ && !already_complete_ && dist_->is_main())
    log::info("train: run ", run_id_, " is already complete at step ", step_, " of ", total_steps_, " in ", ckpt,
              ": no step runs; writing its adapter, metrics.jsonl and summary.json into ", cfg_.output_dir);
  if (!ckpt.empty()) memory_.set_writes(dist_->is_main() && !already_complete_);
  dist_->barrier();  // every rank has read the checkpoint before rank 0 writes into output_dir
  if (already_complete_) {  // the same command again after the run ended: nothing to do, nothing rewritten
    log::info("train: run ", run_id_, " in ", cfg_.output_dir, " is already complete (", step_, " of ", total_steps_,
              " steps); its adapter and summary.json are left as they are (--overwrite-output-dir starts a new run)");
    return;
  }
  if (!dist_->is_main()) {
    log::info("train: rank ", dist_->rank(), " ready; rank 0 writes ", cfg_.output_dir);
    return;
  }
  if (!aside_.empty()) {
    // A retried job script that passes the flag starts over at every retry (trial 17): say so when
    // what it moves aside is this same run (settings and data) with checkpoints to resume.
    RunRecord old;
    try {
      old = read_run_record(cfg_.output_dir);
    } catch (const Error&) {  // not a run record: nothing to compare
    }
    std::vector<std::string> old_ckpts;  // the run's own, newest first
    if (!old.run_id.empty() && old.fingerprint == fingerprint_)
      for (const std::string& ck : list_checkpoints(checkpoint_dir()))
        if (checkpoint_run_id(ck) == old.run_id) old_ckpts.push_back(ck);
    if (!old_ckpts.empty())
      log::warn("output_dir: --overwrite-output-dir moves aside run ", old.run_id, " of these same settings and data with ",
                old_ckpts.size(), " checkpoint", old_ckpts.size() == 1 ? "" : "s", " (newest ",
                fs::path(old_ckpts[0]).filename().string(),
                "); this run starts from step 0. Without the flag this command resumes it: a job script that is "
                "retried after a preemption must not pass it (each retry would start over)");
    std::error_code ec;
    fs::rename(cfg_.output_dir, aside_, ec);
    QLORA_CHECK(!ec, "--overwrite-output-dir: cannot move ", cfg_.output_dir, " to ", aside_, ": ", ec.message());
    log::warn("output_dir: --overwrite-output-dir: moved the previous contents of ", cfg_.output_dir, " to ", aside_);
  }
  fs::create_directories(cfg_.output_dir);
  if (!aside_.empty()) lock_ = std::make_unique<OutputDirLock>(cfg_.output_dir);  // the old lock moved aside with it
  {
    // run.json: this run's identity; rewritten (keeping started_utc) when the run continues under
    // other paths (a moved model or data file), with --force, or from an older version's record.
    const RunRecord had = read_run_record(cfg_.output_dir);
    RunRecord rr;
    rr.run_id = run_id_;
    rr.fingerprint = fingerprint_;
    rr.data_sha256 = data_sha_;
    rr.started_utc = had.run_id == run_id_ && !had.started_utc.empty() ? had.started_utc
                                                                        : run_id_.substr(0, run_id_.find('-'));
    rr.config_yaml = to_yaml(cfg_);
    rr.model_files = model_files_;
    rr.has_model_files = true;
    if (had.run_id != rr.run_id || had.fingerprint != rr.fingerprint || had.data_sha256 != rr.data_sha256 ||
        had.config_yaml != rr.config_yaml || had.model_files != rr.model_files || !had.has_model_files)
      write_run_record(cfg_.output_dir, rr);
  }
  atomic_write_string((fs::path(cfg_.output_dir) / "config.resolved.yaml").string(), to_yaml(cfg_));
  atomic_write_string((fs::path(cfg_.output_dir) / "metrics.jsonl").string(), step_ == 0 ? std::string() : metrics_history_);
  log::info("run: ", run_id_, step_ == 0 ? " (from step 0)" : " (resumed)", " in ", cfg_.output_dir);
  log::info("train: ", total_steps_, total_steps_ == 1 ? " step" : " steps", " of up to ", t.micro_batch_size,
            " x ", t.gradient_accumulation_steps,
            " rows (micro_batch_size x gradient_accumulation_steps; an epoch's last step takes the rows left), warmup ",
            warmup_steps_, ", device ", device_.str(),
            device_.is_cpu() ? " (" + std::to_string(at::get_num_threads()) + " threads: OMP_NUM_THREADS)" : std::string());
  // (a max_steps run with warmup_steps was warned of with the config: config_warnings)
  if (warmup_steps_ >= total_steps_ && (t.max_steps <= 0 || t.warmup_ratio > 0))
    log::warn("train: ", t.warmup_ratio > 0 ? "training.warmup_ratio's" : "training.warmup_steps", " warmup (",
              warmup_steps_, warmup_steps_ == 1 ? " step" : " steps", ") >= the run's ", total_steps_, " optimizer step",
              total_steps_ == 1 ? "" : "s", " (",
              t.max_steps > 0 ? "training.max_steps"
                              : std::to_string(t.num_epochs) + " epoch" + (t.num_epochs == 1 ? "" : "s"),
              "): the run never leaves warmup, its last step at ",
              lr_at(t.lr_scheduler, t.learning_rate, total_steps_ - 1, warmup_steps_, total_steps_),
              " of training.learning_rate ", t.learning_rate,
              " (set a smaller training.warmup_steps or training.warmup_ratio)");
  if (dist_->active())
    log::info("train: data parallel over ", dist_->world_size(), " ranks: global batch ", t.micro_batch_size, " x ",
              t.gradient_accumulation_steps, " x ", dist_->world_size(), " = ", t.micro_batch_size * global_group_size(),
              " rows per optimizer step (micro-batch x accumulation x world size)");
}

void Trainer::plan_steps() {
  const TrainingConfig& t = cfg_.training;
  int64_t per_epoch = 0;
  const int64_t group = global_group_size();
  for (int64_t e = 0; e < std::max<int64_t>(1, t.num_epochs); ++e)
    per_epoch += (loader_->batches_in_epoch(e) + group - 1) / group;
  total_steps_ = t.max_steps > 0 ? t.max_steps : per_epoch;
  warmup_steps_ = warmup_steps_for(t, total_steps_);
}

int64_t Trainer::global_group_size() const {
  return cfg_.training.gradient_accumulation_steps * dist_->world_size();
}

namespace {
/// `p` absolute and normal (symlinks resolved where the path exists), "" as is: the same file
/// written relative on one rank and absolute on another is one path.
std::string comparable_path(const std::string& p) {
  if (p.empty()) return p;
  std::error_code ec;
  const fs::path c = fs::weakly_canonical(fs::absolute(p), ec);
  return ec ? fs::absolute(p).lexically_normal().string() : c.string();
}
}  // namespace

void Trainer::check_same_run_as_main() {
  if (!dist_->active()) return;
  // What this rank runs, comparable across ranks (trial 18): paths absolute, and the data files by
  // their content (the same file at another mount point is the same data).
  Config same = cfg_;
  for (std::string* p : {&same.output_dir, &same.model.path, &same.model.tokenizer, &same.lora.model_dir,
                         &same.checkpoint.resume_path, &same.checkpoint.resume_from_dir})
    *p = comparable_path(*p);
  for (std::vector<data::DataSource>* v : {&same.data.train, &same.data.eval})
    for (data::DataSource& d : *v)
      d.path = data_sha_.count(d.path) ? "sha256:" + data_sha_.at(d.path) : comparable_path(d.path);
  const std::string mine = to_yaml(same);
  const std::string main_yaml = dist_->from_main("config", [&] { return mine; });
  // Rank 0 names what differs too: each rank sends its verdict ("" = the same run).
  auto verdicts = [&](const std::string& mine_verdict) {
    const std::vector<std::string> all = dist_->gather_to_main("same_run", mine_verdict);
    if (!dist_->is_main()) return;
    for (size_t r = 1; r < all.size(); ++r)
      QLORA_CHECK(all[r].empty(), "distributed: rank ", r, "'s config differs from rank 0's (every rank must run the "
                  "same config on the same data): ", all[r]);
  };
  if (main_yaml == mine) return verdicts("");
  // Name the differing keys: "section.key: rank 0's -> this rank's", from the resolved YAML lines.
  auto keyed = [](const std::string& yaml) {
    std::map<std::string, std::string> m;
    std::istringstream in(yaml);
    std::string section;
    for (std::string line; std::getline(in, line);) {
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      const bool top = !line.empty() && line[0] != ' ';
      std::string key = line.substr(0, colon);
      key.erase(0, key.find_first_not_of(' '));
      if (top) section = key;
      m[top ? key : section + "." + key] = line.substr(colon + 1);
    }
    return m;
  };
  const auto a = keyed(main_yaml), b = keyed(mine);
  std::string diffs;
  for (const auto& [k, v] : b) {
    auto it = a.find(k);
    if (it == a.end() || it->second != v)
      diffs += (diffs.empty() ? "" : "; ") + k + ":" + (it == a.end() ? " (unset)" : it->second) + " ->" + v;
  }
  for (const auto& [k, v] : a)
    if (!b.count(k)) diffs += (diffs.empty() ? "" : "; ") + k + ":" + v + " -> (unset)";
  if (diffs.empty()) diffs = "the data files' content differs (sha256)";
  verdicts(diffs);
  fail("distributed: rank ", dist_->rank(), "'s config differs from rank 0's (every rank must run the same config ",
       "on the same data): ", diffs);
}

namespace {
/// Appends `line` + "\n" to `path` and flushes it to the kernel; a failed open, write, flush or
/// close (ENOSPC, EIO, EACCES, EFBIG, ...) throws qlora::Error naming the file and the errno text.
void append_line(const std::string& path, const std::string& line) {
  std::FILE* f = std::fopen(path.c_str(), "ab");
  if (!f) fail("cannot write ", path, ": ", std::strerror(errno));
  std::error_code ec;
  const auto before = fs::file_size(path, ec);
  const std::string text = line + "\n";
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0;
  int err = errno;
  if (std::fclose(f) != 0 && ok) ok = false, err = errno;
  if (!ok) {
    if (!ec) fs::resize_file(path, before, ec);  // no partial line stays behind
    fail("cannot write ", path, ": ", std::strerror(err));
  }
}

std::atomic<int> g_stop_signal{0};
std::atomic<bool> g_announce_stop{false};  // rank 0: say at once that the signal was taken
/// Where train() is, for the signal handler's message: in an optimizer step (or between steps: the
/// stop check comes after the next one), after the step (eval, log, checkpoint write: the
/// checkpoint is of this step), or waiting for the sync commands after the last checkpoint.
enum Phase : int { kInStep = 0, kStepDone = 1, kWaitingSync = 2 };
std::atomic<int> g_phase{kInStep};
/// Writes `m` (a string literal) to stderr with write(2): async-signal-safe (strlen is too).
void signal_say(const char* m) { [[maybe_unused]] const ssize_t n = ::write(2, m, std::strlen(m)); }

/// The name of a stop signal as a literal (for the handler, which cannot build strings).
const char* stop_signal_name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
    case SIGHUP: return "SIGHUP";
    default: return "a signal";
  }
}
/// The first stop signal (kStopSignals) asks for a checkpoint at the end of the step. A SIGINT
/// after any of them (a second Ctrl-C) quits at once with 130 (128 + SIGINT), as a shell's
/// interrupted job does: checkpoints are written atomically, so what the next run resumes from is
/// the last complete one. Another SIGTERM / SIGUSR1 / ... (schedulers resend them) changes nothing.
/// While the run waits for checkpoint.sync_command after its last checkpoint, any SIGINT quits at
/// once with 130 (the sync commands keep running in their own process group).
/// Only write(2) and _exit(2) here: both are async-signal-safe, the log is not.
extern "C" void on_stop_signal(int sig) {
  const int phase = g_phase.load();
  if (phase == kWaitingSync && sig == SIGINT) {
    if (g_announce_stop.load())
      signal_say("\nqlora: interrupt: quitting now without waiting for checkpoint.sync_command (it keeps "
                 "running on its own)\n");
    ::_exit(128 + SIGINT);
  }
  int none = 0;
  const bool first = g_stop_signal.compare_exchange_strong(none, sig);
  if (first && g_announce_stop.load()) {
    if (phase == kWaitingSync)
      signal_say("\nqlora: stop requested; the last checkpoint is written, still waiting for "
                 "checkpoint.sync_command (checkpoint.sync_timeout_seconds; Ctrl-C: quit without waiting)\n");
    else if (sig == SIGINT && phase == kInStep)
      signal_say("\nqlora: stop requested by SIGINT; finishing this step, then a checkpoint (Ctrl-C again: quit now "
                 "without one)\n");
    else if (sig == SIGINT)
      signal_say("\nqlora: stop requested by SIGINT; this step is done: a checkpoint of it, then stop (Ctrl-C again: "
                 "quit now without one)\n");
    else {
      signal_say("\nqlora: stop requested by ");
      signal_say(stop_signal_name(sig));
      signal_say(phase == kInStep ? "; finishing this step, then a checkpoint and exit 75 (repeating the signal "
                                    "changes nothing)\n"
                                  : "; this step is done: a checkpoint of it, then exit 75 (repeating the signal "
                                    "changes nothing)\n");
    }
  }
  if (!first && sig == SIGINT) {
    if (g_announce_stop.load())
      signal_say("\nqlora: second interrupt: quitting now without a checkpoint; the next run resumes from the "
                 "last saved one\n");
    ::_exit(128 + SIGINT);
  }
}

}  // namespace

// summary.json of this run at step_ and the adapter beside it: what save_outputs() writes last.
bool Trainer::outputs_written() const {
  const fs::path out(cfg_.output_dir), summary = out / "summary.json";
  if (!fs::exists(summary) || !fs::exists(out / "adapter_model.safetensors")) return false;
  const json s = json::parse(read_file(summary.string()), nullptr, /*allow_exceptions=*/false);
  return s.is_object() && s.value("run_id", std::string()) == run_id_ && s.value("steps", int64_t{-1}) == step_;
}

namespace {
/// The current UTC time as "2026-12-03T15:20:00Z".
std::string utc_now_iso() { return utc_time("%Y-%m-%dT%H:%M:%SZ"); }
}  // namespace

void Trainer::write_status(const std::string& state, int exit_code, const std::string& message) {
  if (!dist_->is_main() || !lock_) return;
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  const json s = {{"state", state},
                  {"exit_code", exit_code >= 0 ? json(exit_code) : json(nullptr)},
                  {"message", message.empty() ? json(nullptr) : json(message)},
                  {"run_id", run_id_},
                  {"pid", static_cast<int64_t>(::getpid())},
                  {"host", std::string(host)},
                  {"step", step_},
                  {"total_steps", total_steps_},
                  {"last_checkpoint", last_checkpoint_.empty() ? json(nullptr) : json(last_checkpoint_)},
                  {"started_utc", invocation_started_utc_},
                  {"updated_utc", utc_now_iso()}};
  try {
    atomic_write_string((fs::path(cfg_.output_dir) / "status.json").string(), s.dump(2) + "\n");
  } catch (const std::exception& e) {
    log::warn("status.json not written (", first_line(e.what()), ")");
  }
}

void Trainer::train() {
  if (already_complete_) return;
  setup_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - setup_start_).count();
  invocation_started_utc_ = utc_now_iso();
  write_status("running");
  try {
    train_steps();
  } catch (const Interrupted& e) {
    write_status("stopped", kExitInterrupted, first_line(e.what()));
    throw;  // a stop: it waited for its checkpoint's sync itself
  } catch (...) {
    // what main() prints for it (c10::Error's what() holds a backtrace: its first line)
    std::string message = "unknown error";
    try {
      throw;
    } catch (const std::exception& e) {
      message = first_line(e.what());
    } catch (...) {
    }
    write_status("failed", 1, message);
    // An error after a checkpoint (a full disk, non-finite steps, a lost rank): the last checkpoint
    // still reaches its off-machine copy before the error ends the process.
    if (dist_->is_main() && sync_ && !sync_->running().empty()) {
      log::warn("stopping on an error; the last checkpoint's sync_command still runs");
      try {
        wait_for_syncs();
      } catch (...) {  // the error that stopped the run is the one to report
      }
    }
    throw;
  }
}

void Trainer::train_steps() {
  const TrainingConfig& t = cfg_.training;
  const CheckpointConfig& c = cfg_.checkpoint;
  g_stop_signal.store(0);
  g_phase.store(kInStep);
  const StopSignalHandlers signals(on_stop_signal);
  g_announce_stop.store(dist_->is_main());
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  double last_save = 0, slowest_step = 0;
  model_->training = true;
  while (step_ < total_steps_) {
    const auto ts = std::chrono::steady_clock::now();
    const uint64_t epoch_before = loader_->state().epoch;
    // The global group: accumulation x world_size micro-batches, drawn by every rank in the same
    // order; rank r trains those with index i % world_size == r (docs/distributed.md).
    std::vector<data::Batch> group;
    for (int64_t i = 0; i < global_group_size(); ++i) {
      if (fault_.sigterm_step == step_ + 1 && fault_.sigterm_micro == i) std::raise(SIGTERM);  // test hook
      const uint64_t epoch = loader_->state().epoch;
      data::Batch b = loader_->next();
      if (i % dist_->world_size() == dist_->rank()) group.push_back(std::move(b));
      if (loader_->state().epoch != epoch) break;  // an accumulation group never spans two epochs
    }
    const double lr = lr_at(t.lr_scheduler, t.learning_rate, step_, warmup_steps_, total_steps_);
    StepOptions so;
    so.lr = lr;
    so.max_grad_norm = t.max_grad_norm;
    so.dist = dist_.get();
    StepResult r = train_step(*model_, *opt_, group, so);
    g_phase.store(kStepDone);  // a signal from here on: the checkpoint is of this step
    int64_t longest_row = 0;
    for (const data::Batch& b : group) longest_row = std::max(longest_row, b.seq_len);
    memory_.after_step(longest_row);
    ++step_;
    if (fault_.perturb_step == step_) {  // test hook (trainer/fault.h)
      torch::NoGradGuard ng;
      model_->lora_parameters().front().view({-1})[0].add_(1e-3);
    }
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
    input_tokens_ += r.tokens;
    target_tokens_ += r.targets;
    ++steps_this_invocation_;
    double eval_loss = std::nan("");
    const bool last = step_ == total_steps_;
    // This step drew the last micro-batch of an epoch (the loader moved on to the next one).
    const bool epoch_ended = loader_->state().epoch != epoch_before;
    const double train_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - ts).count();
    // eval_steps N > 0: every N steps; 0: at the end of each epoch (HF eval_strategy "epoch"); and
    // always after the last step.
    const bool eval_now = t.eval_steps > 0 ? step_ % t.eval_steps == 0 : epoch_ended;
    if ((eval_now || last) && !data_.eval.empty()) {
      // Data parallel: every rank evaluates its share of the batches (none waits on rank 0's
      // whole pass; trial 18: a pass longer than QLORA_DIST_TIMEOUT_S failed the job), and the
      // per-batch sums meet in one allreduce: the same eval_loss as one process, bit for bit.
      model_->training = false;
      std::vector<double> sums =
          evaluate_batch_sums(*model_, data_.eval, t.micro_batch_size, cfg_.data, pad_id_, dist_->rank(), dist_->world_size());
      model_->training = true;
      dist_->sum(sums);
      eval_loss = eval_mean(sums).first;
      memory_.after_eval();  // memory_report.json phase after_first_eval
      if (!std::isnan(eval_loss)) last_eval_loss_ = eval_loss;
    }
    const double step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - ts).count();
    slowest_step = std::max(slowest_step, step_s);
    if (dist_->is_main()) {
      StepLog sl;
      sl.step = step_;
      sl.result = r;
      sl.lr = lr;
      sl.seconds = step_s;
      sl.train_seconds = train_s;
      sl.eval_loss = eval_loss;
      log_step(sl);
    }

    // Checkpoint triggers: signal, time budget, steps, minutes, end of epoch, end of run. A signal
    // or the time budget on any rank stops all of them at this step, and rank 0's clock decides
    // save_minutes for all (one small allreduce): every rank knows when a checkpoint is written.
    std::vector<double> stop{static_cast<double>(g_stop_signal.load()),
                             run_.max_time_s > 0 && elapsed() + 2 * slowest_step > run_.max_time_s ? 1.0 : 0.0,
                             dist_->is_main() && c.save_minutes > 0 && elapsed() - last_save >= 60 * c.save_minutes
                                 ? 1.0
                                 : 0.0};
    dist_->max(stop);
    int sig = static_cast<int>(stop[0]);
    const bool out_of_time = stop[1] > 0;
    std::string why;
    if (sig) why = std::string("signal ") + strsignal(sig);
    else if (out_of_time) why = "--max-time budget";
    else if (last) why = "end of run";
    else if (c.save_steps > 0 && step_ % c.save_steps == 0) why = "save_steps";
    else if (stop[2] > 0) why = "save_minutes";
    else if (epoch_ended) why = "end of epoch";
    // The replicas must still be equal before a checkpoint is written from rank 0's copy.
    if (dist_->active() && (step_ % kParamChecksumEverySteps == 0 || !why.empty())) check_replicas_agree();
    if (!why.empty()) {
      const std::vector<RngState> rng = gather_rng_states();  // every rank's dropout generators
      if (dist_->is_main()) save_checkpoint(why, train_seconds_before_ + elapsed(), eval_loss, rng);
      last_save = elapsed();
    }
    // A signal that came while the checkpoint was written stops right after it (not one step and
    // one checkpoint later); every rank knows a checkpoint was written, so the check is collective.
    if (!sig && !out_of_time && !last && !why.empty()) {
      // The other ranks wait for rank 0's write first: a signal that reaches only them during it
      // counts too (trial 18: their flags, sent at once, missed it, and the run did one more step).
      dist_->barrier();
      std::vector<double> again{static_cast<double>(g_stop_signal.load())};
      dist_->max(again);
      if (again[0] > 0) {
        sig = static_cast<int>(again[0]);
        why = std::string("signal ") + strsignal(sig) + " (during the checkpoint write)";
      }
    }
    g_phase.store(kInStep);
    if (dist_->is_main()) prune_after_syncs();
    if (sig || (out_of_time && !last)) {
      model_->training = false;
      dist_->barrier();  // rank 0's checkpoint is complete before any rank exits
      if (!dist_->is_main())
        throw Interrupted("stopped at step " + std::to_string(step_) + " by " + why + " (on some rank); rank 0 " +
                          (run_.launched ? std::string("wrote the checkpoint")
                                         : "wrote the checkpoint; run the same command on every rank again to resume"));
      wait_for_syncs();
      throw Interrupted("stopped at step " + std::to_string(step_) + " by " + why + " after writing " +
                        last_checkpoint_ + "; " + resume_advice(last_checkpoint_));
    }
    if (fault_.step_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(fault_.step_delay_ms));
  }
  model_->training = false;
  const json report = memory_.finish();  // peak; estimated vs measured into memory_report.json and the log
  if (dist_->active()) {  // every rank's measurement into rank 0's memory_report.json
    std::vector<json> reports;
    for (const std::string& r : dist_->gather_to_main("memory_report", report.dump())) reports.push_back(json::parse(r));
    if (dist_->is_main()) memory_.add_ranks(reports);
  }
  if (dist_->is_main()) save_outputs(train_seconds_before_ + elapsed());
  dist_->barrier();  // the other ranks end once rank 0 has written the adapter
  if (dist_->is_main()) {
    wait_for_syncs();
    record_sync_outcomes();
  }
  write_status("completed", 0);
}

namespace {
/// summary.json's `checkpoint_sync`: the command, how many ran and ended ok, and each one that
/// failed ({checkpoint, error, seconds}) or still runs (its checkpoint).
json sync_summary(const CheckpointSync& sync, const std::string& command) {
  json failed = json::array(), running = json::array();
  int64_t ok = 0, started = 0;
  for (const SyncOutcome& o : sync.outcomes()) {
    ++started;
    if (o.state == "ok") ++ok;
    else if (o.state == "running") running.push_back(o.dir);
    else failed.push_back({{"checkpoint", o.dir}, {"error", o.error}, {"seconds", o.seconds}});
  }
  return {{"command", command}, {"started", started}, {"ok", ok}, {"failed", failed}, {"running", running}};
}
}  // namespace

void Trainer::record_sync_outcomes() {
  if (!sync_ || summary_.is_null()) return;
  const json now = sync_summary(*sync_, cfg_.checkpoint.sync_command);
  if (now != summary_["checkpoint_sync"]) {
    summary_["checkpoint_sync"] = now;
    atomic_write_string((fs::path(cfg_.output_dir) / "summary.json").string(), summary_.dump(2) + "\n");
  }
  const size_t failed = now["failed"].size(), running = now["running"].size();
  if (failed + running > 0)
    log::warn("checkpoint.sync_command: ", failed, " of ", now["started"].get<int64_t>(), " failed",
              running > 0 ? ", " + std::to_string(running) + " left running" : std::string(),
              " (summary.json: checkpoint_sync); the off-machine copies of those checkpoints are missing or incomplete");
}

namespace {
/// Pruned checkpoints whose directory held files of someone else's: kept, and said.
void warn_kept_checkpoint_dirs(const std::vector<std::string>& kept) {
  for (const std::string& k : kept)
    log::warn("checkpoint: pruned the checkpoint files of ", k,
              ", which no checkpoint writes: the directory and those files are kept");
}
}  // namespace

void Trainer::prune_after_syncs() {
  if (!sync_ || !prune_held_back_ || !sync_->ended_since_last_call()) return;
  const CheckpointConfig& c = cfg_.checkpoint;
  std::vector<std::string> kept;
  const auto removed = prune_checkpoints(checkpoint_dir(), c.keep_last, run_id_, sync_->running(), c.keep_best, &kept);
  warn_kept_checkpoint_dirs(kept);
  for (const auto& r : removed) log::info("checkpoint ", r, " pruned (keep_last ", cfg_.checkpoint.keep_last,
                                          "; its sync_command has ended)");
  note_held_back();
}

void Trainer::note_held_back() {
  prune_held_back_ = static_cast<int64_t>(list_checkpoints(checkpoint_dir()).size()) > cfg_.checkpoint.keep_last;
}

void Trainer::wait_for_syncs() {
  if (!sync_) return;
  const auto running = sync_->running();
  if (!running.empty()) {
    const double timeout = cfg_.checkpoint.sync_timeout_seconds;
    g_phase.store(kWaitingSync);  // before the line a Ctrl-C answers
    log::info("waiting up to ", timeout, " s (checkpoint.sync_timeout_seconds) for checkpoint.sync_command of ",
              running.size(), " checkpoint", running.size() == 1 ? "" : "s", " (Ctrl-C: quit without waiting)");
    sync_->wait(timeout);
    g_phase.store(kInStep);
  }
  prune_after_syncs();
}

void Trainer::check_replicas_agree() {
  const std::vector<uint64_t> sums = dist_->all_gather(parameter_checksum(model_->lora_parameters()));
  std::string bad;
  for (size_t r = 1; r < sums.size(); ++r)
    if (sums[r] != sums[0]) bad += (bad.empty() ? "" : ", ") + std::to_string(r);
  if (bad.empty()) {
    log::debug("distributed: replica check after step ", step_, ": all ", sums.size(), " ranks agree");
    return;
  }
  char hex[2][20];
  std::snprintf(hex[0], sizeof hex[0], "%016llx", static_cast<unsigned long long>(sums[0]));
  std::snprintf(hex[1], sizeof hex[1], "%016llx", static_cast<unsigned long long>(sums[std::stoul(bad)]));
  fail("distributed: the LoRA parameters of rank", bad.find(',') == std::string::npos ? " " : "s ", bad,
       " differ from rank 0's after step ", step_, " (checksum ", hex[1], " vs ", hex[0],
       "): the replicas diverged (non-deterministic kernels or memory corruption); stopping without writing "
       "this step; the checkpoints already in ", checkpoint_dir(), " are kept");
}

double Trainer::Progress::record(int64_t step, double step_seconds, int64_t total_steps) {
  if (step <= last_step) *this = Progress{};  // a step that goes back: start again
  last_step = step;
  ++steps;
  seconds += step_seconds;
  return seconds / steps * static_cast<double>(std::max<int64_t>(0, total_steps - step));
}

namespace {
/// Seconds since the Unix epoch (UTC), as TensorBoard's event wall_time.
double unix_seconds_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
}  // namespace

void Trainer::log_step(const StepLog& s) {
  const int64_t step = s.step;
  const StepResult& r = s.result;
  const double lr = s.lr, seconds = s.seconds, eval_loss = s.eval_loss;
  // The rate is the optimizer step's own (the tokens trained over the time training them); the
  // evaluation that may follow it is step_seconds - train_seconds.
  const double train_s = s.train_seconds;
  json j = {{"step", step},
            {"step_seconds", seconds},
            {"train_seconds", train_s},
            {"epoch", loader_->state().epoch + static_cast<double>(loader_->state().cursor) /
                                                    std::max<size_t>(1, data_.train.size())},
            {"loss", r.loss},
            {"lr", lr},
            {"grad_norm", r.grad_norm},
            {"tokens", r.tokens},
            {"target_tokens", r.targets},
            {"tokens_per_s", train_s > 0 ? r.tokens / train_s : 0.0},
            {"skipped", r.skipped},
            {"memory", memory_snapshot(device_)},
            {"wall_time", unix_seconds_now()}};
  if (!std::isnan(eval_loss)) j["eval_loss"] = eval_loss;
  append_line((fs::path(cfg_.output_dir) / "metrics.jsonl").string(), j.dump());
  metrics_history_ += j.dump() + "\n";
  const double eta_s = progress_.record(step, seconds, total_steps_);
  if (!std::isnan(eval_loss)) progress_.last_eval = eval_loss;
  const int64_t tok_s = static_cast<int64_t>(train_s > 0 ? r.tokens / train_s : 0);
  if (progress_.tty) {
    const int width = 24;
    const double frac = total_steps_ > 0 ? std::min(1.0, static_cast<double>(step) / total_steps_) : 1.0;
    const int filled = static_cast<int>(frac * width);
    char nums[160];
    std::snprintf(nums, sizeof nums, " %lld/%lld  loss %.4f  lr %.3g  %lld tok/s  ETA %s",
                  static_cast<long long>(step), static_cast<long long>(total_steps_), r.loss, lr,
                  static_cast<long long>(tok_s), format_duration(eta_s).c_str());
    std::string line = "\r[" + std::string(filled, '#') + std::string(width - filled, '.') + "]" + nums;
    if (!std::isnan(progress_.last_eval)) line += "  eval " + std::to_string(progress_.last_eval).substr(0, 6);
    line += "\033[K";  // clear what a longer previous line left
    if (step >= total_steps_) line += "\n";
    std::cerr << line << std::flush;
  } else {
    progress_.loss_sum += r.loss;
    ++progress_.loss_n;
    if (step % cfg_.training.logging_steps == 0 || !std::isnan(eval_loss) || step >= total_steps_) {
      // the mean loss of the steps since the last line (HF Trainer's logged "loss"); every step's
      // own loss is in metrics.jsonl
      const double loss = progress_.loss_sum / static_cast<double>(progress_.loss_n);
      log::info("step ", step, "/", total_steps_, "  loss ", loss,
                progress_.loss_n > 1 ? " (mean of " + std::to_string(progress_.loss_n) + ")" : std::string(), "  lr ",
                lr, "  grad_norm ", r.grad_norm, "  ", tok_s, " tok/s  ETA ", format_duration(eta_s),
                std::isnan(eval_loss) ? std::string() : "  eval_loss " + std::to_string(eval_loss));
      progress_.loss_sum = 0;
      progress_.loss_n = 0;
    }
  }
}

void Trainer::save_outputs(double seconds) {
  save_peft_adapter(cfg_.output_dir, peft_config(), model_->lora_weights());
  // The record in metrics.jsonl must be complete: one line per step 1..step_.
  std::set<int64_t> logged;
  int64_t best_step = -1;  // the step of the lowest eval_loss (the first of equals), as HF's best_model_checkpoint
  double best_eval = 0;
  {
    std::istringstream in(read_file((fs::path(cfg_.output_dir) / "metrics.jsonl").string()));
    for (std::string line; std::getline(in, line);) {
      const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.contains("step") || !j["step"].is_number_integer()) continue;
      logged.insert(j["step"].get<int64_t>());
      if (j.contains("eval_loss") && j["eval_loss"].is_number() && std::isfinite(j["eval_loss"].get<double>()) &&
          (best_step < 0 || j["eval_loss"].get<double>() < best_eval)) {
        best_eval = j["eval_loss"].get<double>();
        best_step = j["step"].get<int64_t>();
      }
    }
  }
  const bool complete = static_cast<int64_t>(logged.size()) == step_ && (logged.empty() || *logged.rbegin() == step_);
  if (!complete)
    log::warn("metrics.jsonl holds ", logged.size(), " of ", step_, " steps (summary.json: metrics_complete false)");
  // train_loss: the mean per-step loss of the run, as transformers' TrainOutput.training_loss
  // (tr_loss / global_step), over the steps metrics.jsonl records with a finite loss.
  double loss_sum = 0;
  int64_t loss_n = 0;
  for (const double l : losses_)
    if (std::isfinite(l)) loss_sum += l, ++loss_n;
  auto number_or_null = [](double v) { return std::isfinite(v) ? json(v) : json(nullptr); };
  json s = {{"steps", step_},
            {"steps_this_invocation", steps_this_invocation_},
            {"run_id", run_id_},
            {"metrics_lines", static_cast<int64_t>(logged.size())},
            {"metrics_complete", complete},
            {"skipped_steps", skipped_steps_},
            {"input_tokens", input_tokens_},
            {"target_tokens", target_tokens_},
            {"wall_seconds", seconds},
            {"setup_seconds", setup_seconds_before_ + setup_seconds_},
            {"data_format", data_.stats.read.format},
            {"data_system_records", data_.stats.system_records},
            {"tokens_per_s", seconds > 0 ? input_tokens_ / seconds : 0.0},
            {"train_loss", loss_n > 0 ? json(loss_sum / static_cast<double>(loss_n)) : json(nullptr)},
            {"final_loss", losses_.empty() ? json(nullptr) : number_or_null(losses_.back())},
            {"eval_loss", number_or_null(last_eval_loss_)},
            {"peak_memory", memory_snapshot(device_)},
            {"preemption", preemption_}};
  // The best evaluation (lowest eval_loss) and its checkpoint when one of that step is kept: what
  // HF's trainer_state.json best_metric / best_model_checkpoint record (it is not loaded at the
  // end: the adapter is the last step's; pass the checkpoint to eval / generate / merge).
  if (best_step >= 0) {
    const fs::path ck = fs::path(checkpoint_dir()) / ("checkpoint-" + std::to_string(best_step));
    const bool kept = fs::exists(ck / "manifest.json");
    s["best_eval"] = {{"step", best_step}, {"eval_loss", best_eval}, {"checkpoint", kept ? json(ck.string()) : json(nullptr)}};
    if (best_step != step_) {
      std::string where = "its checkpoint " + ck.string() + " works as --adapter for eval, generate and merge";
      if (!kept) {
        where = "no checkpoint of that step is kept (one is written at every evaluation when training.eval_steps is a "
                "multiple of checkpoint.save_steps, or 0: at each epoch's end; ";
        // With keep_best, the best of the checkpoints written at an evaluation is kept.
        const std::string best_kept = cfg_.checkpoint.keep_best ? best_checkpoint(checkpoint_dir(), run_id_) : "";
        if (!cfg_.checkpoint.keep_best) where += "checkpoint.keep_best: true keeps the best of them from pruning)";
        else if (best_kept.empty()) where += "checkpoint.keep_best keeps the best of them: none was written)";
        else
          where += "checkpoint.keep_best keeps the best of them: " + best_kept + ", eval_loss " +
                   std::to_string(read_trainer_state(best_kept).eval_loss) + ")";
      }
      log::info("best eval_loss ", best_eval, " at step ", best_step, " (the adapter is step ", step_, "'s): ", where);
    }
  }
  if (cfg_.cost.gpu_hour_price > 0) {
    // cost.gpu_hour_price is currency-free: the same unit comes back. The billed time: training
    // (wall_seconds), every invocation's setup (model load, quantization, data) and the step time
    // that resumes redid; the gaps between invocations (a machine being replaced) are not known.
    // Data parallel: every rank's device is billed for the run's wall time.
    const double billed = seconds + setup_seconds_before_ + setup_seconds_ + preemption_["time_lost_s"].get<double>();
    const double run_cost = cfg_.cost.gpu_hour_price * billed / 3600.0 * dist_->world_size();
    s["cost"] = {{"gpu_hour_price", cfg_.cost.gpu_hour_price},
                 {"devices", dist_->world_size()},
                 {"billed_seconds", billed},
                 {"run", run_cost},
                 {"per_million_tokens", input_tokens_ > 0 ? run_cost / input_tokens_ * 1e6 : 0.0}};
    log::info("cost: ", run_cost, " for this run, ", s["cost"]["per_million_tokens"].get<double>(),
              " per 1M input tokens (", billed, " s: training, model loading and redone steps, at ",
              cfg_.cost.gpu_hour_price, " per GPU-hour",
              dist_->active() ? " x " + std::to_string(dist_->world_size()) + " devices" : std::string(), ")");
  }
  if (sync_) s["checkpoint_sync"] = sync_summary(*sync_, cfg_.checkpoint.sync_command);
  summary_ = s;
  atomic_write_string((fs::path(cfg_.output_dir) / "summary.json").string(), s.dump(2) + "\n");
  log::info("done: ", step_, step_ == 1 ? " step, " : " steps, ", input_tokens_, " input tokens (", target_tokens_, " trained) in ", seconds, " s; adapter in ",
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
  pc.target_modules = expand_target_modules(cfg_.lora.target_modules);
  pc.use_rslora = cfg_.lora.use_rslora;
  // A local model dir as an absolute, normalised path, so PEFT's AutoPeftModelForCausalLM finds the
  // base from any working directory (a relative model.path is relative to the cwd of `qlora train`).
  pc.base_model_name_or_path = cfg_.model.path.empty() ? cfg_.model.preset : cfg_.model.path;
  std::error_code ec;
  if (!cfg_.model.path.empty() && fs::is_directory(cfg_.model.path, ec)) {
    fs::path abs = fs::absolute(cfg_.model.path, ec).lexically_normal();
    if (!ec && abs.has_parent_path() && abs.filename().empty()) abs = abs.parent_path();  // "dir/" -> "dir"
    if (!ec) pc.base_model_name_or_path = abs.string();
  }
  return pc;
}

std::string Trainer::checkpoint_dir() const {
  return (fs::path(cfg_.output_dir) / "checkpoints").string();
}

std::vector<RngState> Trainer::gather_rng_states() {
  RngState mine;
  mine.cpu = at::detail::getDefaultCPUGenerator().get_state();
  if (device_.is_cuda()) mine.cuda = at::globalContext().defaultGenerator(c10::DeviceType::CUDA).get_state();
  if (!dist_->active()) return {mine};
  // Through the store as bytes: the CPU state's length (decimal, then ':'), the CPU state, then
  // on CUDA the CUDA state.
  auto bytes = [](const torch::Tensor& t) {
    const torch::Tensor c = t.contiguous();
    return std::string(reinterpret_cast<const char*>(c.data_ptr<uint8_t>()), static_cast<size_t>(c.numel()));
  };
  const std::string cpu = bytes(mine.cpu);
  const std::string packed = std::to_string(cpu.size()) + ":" + cpu + (mine.cuda.defined() ? bytes(mine.cuda) : "");
  std::vector<RngState> out;
  for (const std::string& p : dist_->gather_to_main("rng/" + std::to_string(step_), packed)) {
    const size_t colon = p.find(':');
    const size_t n = std::stoull(p.substr(0, colon));
    auto tensor = [](const std::string& b) {
      torch::Tensor t = torch::empty({static_cast<int64_t>(b.size())}, torch::kUInt8);
      std::memcpy(t.data_ptr<uint8_t>(), b.data(), b.size());
      return t;
    };
    RngState st;
    st.cpu = tensor(p.substr(colon + 1, n));
    if (p.size() > colon + 1 + n) st.cuda = tensor(p.substr(colon + 1 + n));
    out.push_back(std::move(st));
  }
  return out;  // {} on the other ranks
}

void Trainer::save_checkpoint(const std::string& why, double train_seconds, double eval_loss,
                              const std::vector<RngState>& rng) {
  const auto t0 = std::chrono::steady_clock::now();
  TrainerState st;
  st.step = step_;
  st.sampler = loader_->state();
  st.skipped_steps = skipped_steps_;
  st.nonfinite_in_a_row = nonfinite_in_a_row_;
  st.tokens_trained = input_tokens_;
  st.target_tokens = target_tokens_;
  st.train_seconds = train_seconds;
  st.interruptions = preemption_["interruptions"].get<int64_t>();
  st.time_lost_s = preemption_["time_lost_s"].get<double>();
  st.config_yaml = to_yaml(cfg_);
  st.run_id = run_id_;
  st.fingerprint = fingerprint_;
  st.data_sha256 = data_sha_;
  st.model_files = model_files_;
  st.val_set_split = "records";
  st.world_size = dist_->world_size();
  st.total_steps = total_steps_;
  st.setup_seconds = setup_seconds_before_ + setup_seconds_;
  st.data_format = data_.stats.read.format;
  st.data_system_records = data_.stats.system_records;
  st.metrics_jsonl = metrics_history_;
  st.eval_loss = eval_loss;
  const OptimizerTensors ot = capture_adamw_state(*opt_, model_->lora_parameters());
  std::string path;
  try {
    path = write_checkpoint(checkpoint_dir(), st, peft_config(), model_->lora_weights(), ot, rng, fault_);
  } catch (const Error& e) {
    // The half-written one is gone (write_checkpoint); say which checkpoint a resume takes instead.
    const std::string prev = newest_valid_checkpoint(checkpoint_dir(), nullptr, run_id_);
    const int64_t prev_step = prev.empty() ? 0 : checkpoint_step(prev);
    fail(e.what(), "; checkpoint-", step_, " was not written: ",
         prev.empty() ? std::string("no earlier checkpoint of this run, so a resume starts again from step 0")
                      : fs::path(prev).filename().string() + " stays the newest, and a resume redoes " +
                            (prev_step + 1 == step_ ? "step " + std::to_string(step_)
                                                    : "steps " + std::to_string(prev_step + 1) + ".." +
                                                          std::to_string(step_)));
  }
  last_checkpoint_ = path;
  // The sync starts before the pruning, which holds back every checkpoint whose sync still runs.
  if (!cfg_.checkpoint.sync_command.empty()) {
    if (!sync_) sync_ = std::make_unique<CheckpointSync>(cfg_.checkpoint.sync_command);
    sync_->start(path);
  }
  std::vector<std::string> kept;
  const auto removed = prune_checkpoints(checkpoint_dir(), cfg_.checkpoint.keep_last, run_id_,
                                         sync_ ? sync_->running() : std::set<std::string>{}, cfg_.checkpoint.keep_best,
                                         &kept);
  warn_kept_checkpoint_dirs(kept);
  if (sync_) note_held_back();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int64_t bytes = 0;
  for (const auto& e : fs::directory_iterator(path)) bytes += static_cast<int64_t>(fs::file_size(e.path()));
  preemption_["checkpoints"].push_back({{"step", step_}, {"reason", why}, {"seconds", secs}, {"bytes", bytes}});
  const std::string pruned = removed.empty() ? "" : ", pruned " + std::to_string(removed.size()) + " old";
  log::info("checkpoint ", path, " (", why, ", ", bytes, " bytes, ", secs, " s", pruned, ")");
  write_status("running");
}

std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./=:,+-") ==
                        std::string::npos)
    return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

namespace {

/// A map as "{a: b, c: d}"; an unset override as "(unset)".
std::string describe_override(const std::optional<std::map<std::string, std::string>>& m) {
  if (!m) return "(unset)";
  std::string out;
  for (const auto& [k, v] : *m) out += (out.empty() ? "" : ", ") + k + ": " + v;
  return "{" + out + "}";
}

}  // namespace

std::vector<std::string> data_source_changes(const std::string& key, const std::vector<data::DataSource>& before,
                                             const std::map<std::string, std::string>& before_sha,
                                             const std::vector<data::DataSource>& now,
                                             const std::map<std::string, std::string>& now_sha,
                                             std::vector<std::string>* moved) {
  std::vector<std::string> out;
  auto paths = [](const std::vector<data::DataSource>& v) {
    std::vector<std::string> p;
    for (const data::DataSource& s : v) p.push_back(s.path);
    return p;
  };
  const std::vector<std::string> pb = paths(before), pn = paths(now);
  if (before.size() != now.size()) {
    // Which files came and went (as many times as listed), in list order.
    std::vector<std::string> removed = pb, added;
    for (const std::string& p : pn) {
      const auto it = std::find(removed.begin(), removed.end(), p);
      if (it != removed.end()) removed.erase(it);
      else added.push_back(p);
    }
    std::string what;
    for (const std::string& p : added) what += (what.empty() ? "added " : ", ") + p;
    std::string gone;
    for (const std::string& p : removed) gone += (gone.empty() ? "removed " : ", ") + p;
    if (!gone.empty()) what += (what.empty() ? "" : "; ") + gone;
    out.push_back(key + ": " + std::to_string(before.size()) + " file" + (before.size() == 1 ? "" : "s") + " -> " +
                  std::to_string(now.size()) + " file" + (now.size() == 1 ? "" : "s") +
                  (what.empty() ? std::string() : " (" + what + ")"));
    return out;
  }
  if (before != now && std::is_permutation(before.begin(), before.end(), now.begin())) {
    out.push_back(key + ": the same files in another order (" + data::source_paths(before) + " -> " +
                  data::source_paths(now) + "): the concatenation, and so every batch, differs");
    return out;
  }
  // One path, as before lists: named "data.train", as then.
  const bool single = before.size() == 1 && before[0].path_only() && now[0].path_only();
  for (size_t i = 0; i < now.size(); ++i) {
    const data::DataSource &b = before[i], &n = now[i];
    const std::string k = single ? key : key + "[" + std::to_string(i) + "]";
    if (b.path != n.path) {
      const auto bs = before_sha.find(b.path);
      const auto ns = now_sha.find(n.path);
      if (bs != before_sha.end() && ns != now_sha.end() && bs->second == ns->second)
        moved->push_back(k + " moved: " + b.path + " -> " + n.path + " (same content, sha256 " +
                         bs->second.substr(0, 12) + ")");
      else
        out.push_back(k + ": " + b.path + " -> " + n.path);
    }
    if (b.format != n.format)
      out.push_back(k + ".format: " + b.format.value_or("(unset)") + " -> " + n.format.value_or("(unset)"));
    if (b.field_map != n.field_map)
      out.push_back(k + ".field_map: " + describe_override(b.field_map) + " -> " + describe_override(n.field_map));
    if (b.role_map != n.role_map)
      out.push_back(k + ".role_map: " + describe_override(b.role_map) + " -> " + describe_override(n.role_map));
  }
  return out;
}

namespace {
/// The checkpoint that `checkpoint.resume: PATH` names: PATH itself (a checkpoint-<N> directory, or
/// a file inside one), or the newest valid checkpoint of a checkpoints/ directory or of a run's
/// output_dir. Throws qlora::Error when PATH does not exist or holds no valid checkpoint.
std::string resolve_resume_path(const std::string& path) {
  fs::path p(path);
  QLORA_CHECK(fs::exists(p), "checkpoint.resume: ", path, " does not exist (expected a checkpoint-<N> directory)",
              relative_path_note(path));
  if (fs::is_regular_file(p)) p = p.parent_path();
  if (fs::exists(p / "manifest.json") || fs::exists(p / "trainer_state.json")) return p.string();
  for (const fs::path& dir : {p, p / "checkpoints"}) {
    if (list_checkpoints(dir.string()).empty()) continue;
    std::vector<std::string> skipped;
    const std::string c = newest_valid_checkpoint(dir.string(), &skipped);
    std::string why;
    for (const auto& s : skipped) why += (why.empty() ? "" : "; ") + s;
    QLORA_CHECK(!c.empty(), "checkpoint.resume: ", path, " holds no valid checkpoint (", why, ")");
    return c;
  }
  fail("checkpoint.resume: ", path, " holds no checkpoint (expected a checkpoint-<N> directory with manifest.json, ",
       "a checkpoints/ directory, or a run's output_dir)");
}

/// True when `dir` holds a checkpoint's own files (what `resume: PATH` accepts as a checkpoint).
bool is_checkpoint_dir(const fs::path& dir) {
  return fs::exists(dir / "manifest.json") || fs::exists(dir / "trainer_state.json");
}

/// The newest valid checkpoint that `checkpoint.resume_from_dir` DIR holds, in any layout a sync
/// command produces: DIR/checkpoint-<N> (a copy of checkpoints/), DIR itself (a copy of one
/// checkpoint's files: `rclone copy {dir} remote:run`), or DIR/checkpoints/checkpoint-<N> (a copy
/// of an output_dir). "" when none verifies (each listed in `skipped`) or DIR holds no checkpoint
/// files at all. With a non-empty `run_id`, only that run's checkpoints count. Throws qlora::Error
/// (one line) when DIR holds checkpoint files at another level (e.g. DIR/x/checkpoint-6), which a
/// fresh start would silently ignore.
std::string newest_in_resume_from_dir(const std::string& dir, std::vector<std::string>* skipped,
                                      const std::string& run_id) {
  const fs::path d(dir);
  if (!fs::is_directory(d)) return "";
  if (is_checkpoint_dir(d)) {
    std::string why = verify_checkpoint(dir);
    if (why.empty() && !run_id.empty() && checkpoint_run_id(dir) != run_id)
      why = "written by run " + checkpoint_run_id(dir) + ", not this run " + run_id;
    if (why.empty()) return dir;
    skipped->push_back(dir + ": " + why);
    return "";
  }
  for (const fs::path& p : {d, d / "checkpoints"})
    if (!list_checkpoints(p.string()).empty()) return newest_valid_checkpoint(p.string(), skipped, run_id);
  // No checkpoint where resume looks: checkpoint files anywhere below (3 levels) are an error.
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(d, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (it.depth() >= 3 || name.rfind(".tmp-", 0) == 0) it.disable_recursion_pending();  // an interrupted write
    if (it->path().parent_path().filename().string().rfind(".tmp-", 0) == 0) continue;
    if (name != "manifest.json" && name != "trainer_state.json" && name != "optimizer.safetensors" &&
        name != "adapter_model.safetensors")
      continue;
    const fs::path holder = it->path().parent_path();
    fail("checkpoint.resume_from_dir: ", dir, " holds checkpoint files at another level (", it->path().string(),
         ") but no checkpoint where resume looks (", dir, "/checkpoint-<N>/manifest.json, ", dir,
         "/manifest.json or ", dir, "/checkpoints/checkpoint-<N>); not starting a new run: set checkpoint.resume_from_dir=",
         checkpoint_name_step(holder.string()) >= 0 ? holder.parent_path().string() : holder.string(), " (or move the files)");
  }
  return "";
}
}  // namespace

std::string Trainer::claim_output_dir() {
  const CheckpointConfig& c = cfg_.checkpoint;
  const fs::path out(cfg_.output_dir);
  QLORA_CHECK(!fs::exists(out) || fs::is_directory(out), "output_dir: ", out.string(), " exists and is not a directory");
  const std::vector<std::string> entries = used_entries(out);
  const bool used = !entries.empty();
  if (used && run_.overwrite_output_dir) {
    const std::string stamp = new_run_id().substr(0, 16);
    aside_ = out.string() + ".old-" + stamp;
    for (int i = 2; fs::exists(aside_); ++i) aside_ = out.string() + ".old-" + stamp + "-" + std::to_string(i);
  }
  const bool owned = used && !run_.overwrite_output_dir;  // the old state stays in place
  const RunRecord owner = owned ? read_run_record(out.string()) : RunRecord{};
  auto describe = [&] {
    std::string d = "output_dir " + out.string();
    if (!owner.run_id.empty()) {
      const auto ck = list_checkpoints(checkpoint_dir());
      d += " already holds run " + owner.run_id + " (" + std::to_string(ck.size()) + " checkpoint" +
           (ck.size() == 1 ? "" : "s") + (ck.empty() ? "" : ", newest " + fs::path(ck[0]).filename().string()) + ")";
    } else {
      d += " is not empty and holds no run.json (" + std::to_string(entries.size()) + " entries, e.g. " + entries[0] +
           "): not a run of this version";
    }
    return d;
  };
  const std::string fix = "use another output_dir, or --overwrite-output-dir to move the old contents aside to " +
                          out.string() + ".old-<time>";
  switch (c.resume) {
    case ResumeMode::kNever:
      QLORA_CHECK(!owned, describe(), "; a fresh run (checkpoint.resume: never) would mix with it: ", fix,
                  owner.run_id.empty() ? "" : ", or checkpoint.resume: auto to continue that run");
      run_id_ = new_run_id();
      return "";
    case ResumeMode::kPath: {
      const std::string ckpt = resolve_resume_path(c.resume_path);
      const std::string rid = checkpoint_run_id(ckpt);
      QLORA_CHECK(!owned || (!owner.run_id.empty() && owner.run_id == rid), describe(), "; checkpoint.resume ", ckpt,
                  " belongs to run ", rid.empty() ? std::string("(none)") : rid, ": ", fix);
      run_id_ = rid.empty() ? new_run_id() : rid;
      return ckpt;
    }
    case ResumeMode::kAuto: {
      // Both places: the local checkpoints (only of the run that owns output_dir) and
      // resume_from_dir (a sync command's copy, which may lag behind): the newer valid one wins.
      std::vector<std::string> skipped;
      if (owned) QLORA_CHECK(!owner.run_id.empty(), describe(), ": ", fix);
      const std::string rid = owned ? owner.run_id : "";
      const std::string local = owned ? newest_valid_checkpoint(checkpoint_dir(), &skipped, rid) : "";
      const std::string synced =
          c.resume_from_dir.empty() ? "" : newest_in_resume_from_dir(c.resume_from_dir, &skipped, rid);
      for (const std::string& s : skipped) log::warn("resume: skipping ", s);
      const int64_t local_step = local.empty() ? -1 : checkpoint_step(local);
      const int64_t synced_step = synced.empty() ? -1 : checkpoint_step(synced);
      const std::string ckpt = synced_step > local_step ? synced : local;
      if (!c.resume_from_dir.empty()) {
        auto where = [](const std::string& p, int64_t step) {
          return p.empty() ? std::string("none") : p + " (step " + std::to_string(step) + ")";
        };
        log::info("resume: newest valid checkpoint", owned ? " of run " + rid : std::string(), ": in ", checkpoint_dir(),
                  ": ", where(local, local_step), "; in checkpoint.resume_from_dir ", c.resume_from_dir, ": ",
                  where(synced, synced_step),
                  ckpt.empty() ? std::string()
                               : "; taking " + ckpt + (local.empty() || synced.empty() ? std::string()
                                                       : ckpt == local ? " (the newer; the synced copy lags behind)"
                                                                       : " (the newer)"));
      }
      if (owned) {
        run_id_ = owner.run_id;
        if (!ckpt.empty()) return ckpt;
        // No checkpoint yet (killed before the first): the same run again only with the same
        // settings and data, compared as a resume compares a checkpoint's (run_differences): a
        // model or data file that only moved is the same run. run.json of an older version holds
        // no config: its fingerprint alone decides.
        if (owner.fingerprint != fingerprint_) {
          const std::string refused =
              describe() + " with other run-meaning settings or data, and no checkpoint of it to resume";
          QLORA_CHECK(!owner.config_yaml.empty(), refused, ": ", fix);
          std::vector<std::string> moved;
          const std::vector<std::string> diffs = run_differences(RecordedRun::of_run_json(out.string(), owner), &moved);
          std::string list;
          for (const std::string& d : diffs) list += (list.empty() ? "" : "; ") + d;
          QLORA_CHECK(diffs.empty(), refused, " (", list, "): ", fix);
          for (const std::string& m : moved) log::info("resume: ", m, "; the same run");
        }
        log::info("resume: run ", run_id_, " has no complete checkpoint yet; starting it again from step 0");
        return "";
      }
      if (!ckpt.empty()) {
        const std::string id = checkpoint_run_id(ckpt);
        run_id_ = id.empty() ? new_run_id() : id;
        return ckpt;
      }
      if (!c.resume_from_dir.empty()) {
        std::error_code ec;
        if (!fs::exists(c.resume_from_dir, ec))  // a first run's sync target may not exist yet; a typo neither
          log::warn("resume: checkpoint.resume_from_dir ", c.resume_from_dir, " does not exist", relative_path_note(c.resume_from_dir),
                    "; starting a new run (check the path if this run was to resume)");
        else
          log::warn("resume: no complete checkpoint in ", c.resume_from_dir, "; starting a new run");
      }
      run_id_ = new_run_id();
      return "";
    }
  }
  return "";
}

std::string Trainer::resume_advice(const std::string& ckpt) const {
  const CheckpointConfig& c = cfg_.checkpoint;
  const std::string cmd = run_.command.empty() ? "qlora train CONFIG" : run_.command;
  // Ranks started by another launcher (by hand, torchrun, srun) each rerun their own command;
  // --nproc-per-node's command starts them all.
  const std::string every = dist_->world_size() > 1 && !run_.launched ? " on every rank" : "";
  // resume: auto considers <output_dir>/checkpoints beside resume_from_dir, so it finds this one.
  if (c.resume == ResumeMode::kAuto)
    return run_.overwrite_output_dir ? "to resume, run the same command" + every + " without --overwrite-output-dir: " + cmd
                                     : "run the same command" + every + " again to resume: " + cmd;
  // The invocation's own checkpoint.resume / resume_from_dir overrides give way to these (each key once).
  std::string how = (run_.command_without_resume.empty() ? cmd : run_.command_without_resume) +
                    " --set checkpoint.resume=" + shell_quote(ckpt);
  if (!c.resume_from_dir.empty()) how += " --set checkpoint.resume_from_dir=";
  if (c.resume == ResumeMode::kNever)
    return "checkpoint.resume is never, so the same command will NOT resume (it refuses the used output_dir); "
           "to resume, run" + every + ": " + how;
  if (c.resume == ResumeMode::kPath)
    return "checkpoint.resume names " + c.resume_path + ", so the same command would go back to it; to resume from " +
           "this checkpoint, run" + every + ": " + how;
  return "to resume, run" + every + ": " + how;
}

Trainer::RecordedRun Trainer::RecordedRun::of_checkpoint(const std::string& ckpt, const TrainerState& s) {
  return {s.config_yaml,
          s.data_sha256,
          s.model_files,
          /*has_model_files=*/!s.model_files.empty(),
          (fs::path(ckpt) / "trainer_state.json").string(),
          "the checkpoint",
          "the checkpoint was written"};
}

Trainer::RecordedRun Trainer::RecordedRun::of_run_json(const std::string& output_dir, const RunRecord& r) {
  return {r.config_yaml,  r.data_sha256, r.model_files, r.has_model_files, (fs::path(output_dir) / "run.json").string(),
          "run.json", "the run started"};
}

std::vector<std::string> Trainer::run_differences(const RecordedRun& saved, std::vector<std::string>* moved) const {
  std::vector<std::string> diffs = config_differences(saved.config_yaml, to_yaml(cfg_));
  // data.train / data.eval differ as a whole in the flattened configs ("data.train: [a, b] ->
  // [a, c]"): said per file instead, and a file that only moved (a new VM, another mount point) is
  // the same run: the path differs, the content hash recorded equals the new file's.
  for (const char* key : {"train", "eval"}) {
    const std::string dotted = std::string("data.") + key;
    const auto it = find_difference(diffs, dotted);
    if (it == diffs.end()) continue;
    std::vector<data::DataSource> before;
    try {
      before = data_sources_in(saved.config_yaml, key, saved.where + " config");
    } catch (const Error&) {
      continue;  // not readable as today's schema: the plain difference stands
    }
    std::vector<std::string> data_moved;
    const std::vector<std::string> changes =
        data_source_changes(dotted, before, saved.data_sha256, std::string(key) == "train" ? cfg_.data.train : cfg_.data.eval,
                            data_sha_, &data_moved);
    diffs.insert(diffs.erase(it), changes.begin(), changes.end());
    moved->insert(moved->end(), data_moved.begin(), data_moved.end());
  }
  // model.path / model.tokenizer: a model that only moved (a new VM, another mount point) is the
  // same run when the files a load reads have the digests recorded (model_file_digests); the same
  // path holding other files is another run.
  // lora.model_dir likewise: an adapter that only moved is the same run. Once the run has a
  // checkpoint the adapter is not read again, so a lora.model_dir that is gone is no difference.
  for (const std::string key : {"model.path", "model.tokenizer", "lora.model_dir"}) {
    const auto it = find_difference(diffs, key);
    const bool adapter = key == "lora.model_dir";
    const std::string prefix = key + "/";
    // an older version's record (none at all, or none of the adapter before session 18): the
    // plain difference stands
    if (!saved.has_model_files || (adapter && !has_files_under(saved.model_files, prefix))) {
      if (it != diffs.end())
        *it += " (" + saved.what + " records no digest of the " + (adapter ? "adapter" : "model") +
               "'s files: written by an older version)";
      continue;
    }
    if (adapter && it == diffs.end() && !has_files_under(model_files_, prefix)) continue;  // gone: not read
    const std::string list = digest_changes(saved.model_files, model_files_, prefix);
    if (it != diffs.end()) {
      if (list.empty()) {
        moved->push_back(key + " moved: " + it->substr(key.size() + 2) +
                         " (the same files: their sampled SHA-256 equal " + saved.what + "'s)");
        diffs.erase(it);
      } else {
        *it += std::string(adapter ? " (another adapter: " : " (another model: ") + list + ")";
      }
    } else if (!list.empty()) {
      const std::string where = key == "model.path" ? cfg_.model.path
                                : adapter           ? cfg_.lora.model_dir
                                                    : cfg_.model.tokenizer;
      diffs.push_back("the files of " + key + " " + where + " changed since " + saved.since + " (" + list + ")");
    }
  }
  // The same data path with other content is a different run too.
  for (const auto& [path, sha] : data_sha_) {
    auto it = saved.data_sha256.find(path);
    if (it != saved.data_sha256.end() && it->second != sha)
      diffs.push_back("content of " + path + " changed since " + saved.since + " (sha256 " + it->second.substr(0, 12) +
                      " -> " + sha.substr(0, 12) + ")");
  }
  return diffs;
}

void Trainer::check_resume_settings(const std::string& ckpt, const TrainerState& saved) const {
  std::vector<std::string> moved;
  std::vector<std::string> diffs = run_differences(RecordedRun::of_checkpoint(ckpt, saved), &moved);
  for (const std::string& m : moved) log::info("resume: ", m, "; the same run");
  // An older version drew the val_set_size hold-out from the examples left after the drops; this
  // one draws records before them. Where nothing was dropped or split the two are the same split.
  const data::DataStats& ds = data_.stats;
  const int64_t reshaped = ds.dropped_too_long + ds.dropped_truncated_away + ds.dropped_no_trainable + ds.split_documents;
  if (ds.held_out_records > 0 && saved.val_set_split.empty() && reshaped > 0)
    diffs.push_back("data.val_set_size: the checkpoint's version drew the hold-out from the examples left after " +
                    std::to_string(reshaped) + " records were dropped or split, this one draws records before that, "
                    "so the train and eval sets differ (finish the run with the version that wrote it)");
  // Another world size changes the global batch. The sampler state is global (docs/distributed.md),
  // so with --force the data continues at the same global sample.
  const int64_t ws = dist_->world_size();
  const bool ws_changed = saved.world_size != ws;
  const int64_t rows = cfg_.training.micro_batch_size * cfg_.training.gradient_accumulation_steps;
  if (diffs.empty() && ws_changed) {
    QLORA_CHECK(run_.force, "resume from ", ckpt, " refused: it was written by a job of WORLD_SIZE=", saved.world_size,
                ", this one has WORLD_SIZE=", ws, " (global batch ", rows * saved.world_size, " -> ", rows * ws,
                " rows; use --force to resume anyway: the data continues at the same global sample)");
  } else if (!diffs.empty()) {
    std::string list;
    for (const auto& d : diffs) list += (list.empty() ? "" : "; ") + d;
    // lora.r and lora.target_modules make other adapter tensors (shapes, names): the checkpoint's
    // weights and AdamW moments cannot continue them, so --force is not offered (it would fail
    // after the model load, at the adapter's shapes).
    const auto differs = [&](const std::string& key) { return find_difference(diffs, key) != diffs.end(); };
    if (differs("lora.r") || differs("lora.target_modules")) {
      std::string why = differs("lora.target_modules") ? "lora.target_modules changes which modules have adapters" : "";
      if (differs("lora.r")) {  // one tensor's shapes as the checkpoint has it and as this run makes it
        std::string example;
        try {
          const std::string file = (fs::path(ckpt) / "adapter_model.safetensors").string();
          const st::SafetensorsFile f(file);
          std::string name;
          for (const st::TensorInfo& t : f.tensors())
            if (t.name.find(".lora_A.") != std::string::npos && (name.empty() || t.name < name)) name = t.name;
          if (!name.empty() && f.info(name).shape.size() == 2) {
            const std::vector<int64_t>& s = f.info(name).shape;
            example = ": " + file + ": '" + name + "' has shape [" + std::to_string(s[0]) + ", " + std::to_string(s[1]) +
                      "], this run's is [" + std::to_string(cfg_.lora.r) + ", " + std::to_string(s[1]) + "]";
          }
        } catch (const Error&) {  // unreadable: the checkpoint's verification says so; the key alone here
        }
        why = "lora.r changes the adapter's tensor shapes" + example + (why.empty() ? "" : "; " + why);
      }
      fail("resume from ", ckpt, " refused: settings that change the run differ: ", list, " (", why,
           "; no resume continues other adapter tensors, not even with --force: use --overwrite-output-dir to start "
           "a new run, or another output_dir)");
    }
    if (ws_changed)
      list += "; WORLD_SIZE: " + std::to_string(saved.world_size) + " -> " + std::to_string(ws) +
              " (ranks of the job that wrote it -> this one's)";
    // The global batch (micro_batch_size x gradient_accumulation_steps x WORLD_SIZE) of the
    // checkpoint's run, when its config still parses: when only its split changed, --force
    // continues the same batches.
    std::string batch;
    try {
      const Config before = parse_config_string(saved.config_yaml, ckpt + "/trainer_state.json config");
      const int64_t was = before.training.micro_batch_size * before.training.gradient_accumulation_steps * saved.world_size;
      const bool batch_changed = ws_changed || before.training.micro_batch_size != cfg_.training.micro_batch_size ||
                                 before.training.gradient_accumulation_steps != cfg_.training.gradient_accumulation_steps;
      if (batch_changed && was == rows * ws)  // the batch split changed, the global batch did not
        batch = "; the global batch (micro_batch_size x gradient_accumulation_steps x WORLD_SIZE) is unchanged at " +
                std::to_string(was) + " rows, so --force resumes it: the data continues at the same global sample";
    } catch (const Error&) {
      // an older schema: no global-batch note
    }
    QLORA_CHECK(run_.force, "resume from ", ckpt, " refused: settings that change the run differ: ", list, batch,
                " (use --force to resume anyway, or --overwrite-output-dir to start a new run)");
    log::warn("resume: --force: continuing although settings differ: ", list);
  }
  if (ws_changed)
    log::warn("resume: --force: WORLD_SIZE ", saved.world_size, " -> ", ws,
              "; the data continues at the same global sample");
}

void Trainer::resume_from(const std::string& ckpt) {
  last_checkpoint_ = ckpt;
  LoadedCheckpoint lc = read_checkpoint(ckpt, model_->adapted_shapes());
  // Changed settings, data and world size were refused (or --force'd) before the model loaded
  // (check_resume_settings).
  // LoRA shapes must match exactly, --force or not (the optimizer state is per element).
  {
    const std::string file = (fs::path(ckpt) / "adapter_model.safetensors").string();
    for (const FrozenLinear* f : const_cast<const LlamaModel&>(*model_).linears()) {
      if (!f->lora) continue;
      const auto& ab = lc.adapter.at(f->name);
      for (const bool is_a : {true, false}) {
        const torch::Tensor& have = is_a ? ab.first : ab.second;
        const torch::Tensor& want = is_a ? f->lora->A : f->lora->B;
        QLORA_CHECK(have.sizes() == want.sizes(), file, ": '", peft_key(f->name, is_a), "' has shape ", have.sizes(),
                    ", expected ", want.sizes(), " (lora.r cannot change on resume, even with --force)");
      }
    }
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
  restore_adamw_state(*opt_, model_->lora_parameters(), lc.opt, device_, ckpt);
  loader_ = std::make_unique<data::DataLoader>(&data_.train, cfg_.training.micro_batch_size, cfg_.data, pad_id_,
                                               lc.state.sampler);
  if (lc.state.sampler.packer != data::SamplerState{}.packer && cfg_.data.sample_packing) {
    plan_steps();  // the checkpoint's run packs as it did (next-fit before session 24): its epochs' steps
    log::info("resume: ", ckpt, " was written by a version that packed rows next-fit; its run continues so");
  }
  {
    // This rank's own generator states; a checkpoint without them (another WORLD_SIZE under
    // --force, or one of an older version that kept rank 0's alone) gives rank 0's.
    const int rank = dist_->rank();
    const bool own = rank < static_cast<int>(lc.rng.size());
    if (!own && lc.state.world_size == dist_->world_size())
      log::warn("resume: ", ckpt, " holds no random-number state of rank ", rank,
                " (written by an older version): this rank continues from rank 0's, so its LoRA dropout masks "
                "differ from the uninterrupted run's");
    const RngState& st = lc.rng[own ? rank : 0];
    at::Generator g = at::detail::getDefaultCPUGenerator();
    g.set_state(st.cpu);
    if (st.cuda.defined() && device_.is_cuda()) {
      at::Generator gc = at::globalContext().defaultGenerator(c10::DeviceType::CUDA);
      gc.set_state(st.cuda);
    }
  }
  step_ = lc.state.step;
  skipped_steps_ = lc.state.skipped_steps;
  nonfinite_in_a_row_ = lc.state.nonfinite_in_a_row;
  input_tokens_ = lc.state.tokens_trained;
  target_tokens_ = lc.state.target_tokens;
  train_seconds_before_ = lc.state.train_seconds;
  // metrics.jsonl (rewritten in setup()): the lines of steps 1..step_, from output_dir's own file
  // (whose lines past the checkpoint were lost work and are redone) and, for the steps it lacks (a
  // new machine resuming a synced copy, a checkpoint from another output_dir, a run moved aside),
  // from the copy inside the checkpoint.
  double lost = 0;
  std::map<int64_t, std::string> kept;  // step -> line; the first line of a step wins
  auto take = [&](const std::string& text, bool local) {
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) continue;
      const int64_t s = j["step"].get<int64_t>();
      if (s >= 1 && s <= step_) kept.emplace(s, line);
      else if (local && s > step_ && j.contains("step_seconds") && j["step_seconds"].is_number())
        lost += j["step_seconds"].get<double>();
    }
  };
  const fs::path mp = fs::path(cfg_.output_dir) / "metrics.jsonl";
  if (aside_.empty() && fs::exists(mp)) take(read_file(mp.string()), /*local=*/true);
  const size_t local_lines = kept.size();
  take(lc.state.metrics_jsonl, /*local=*/false);
  for (const auto& [s, line] : kept) {
    metrics_history_ += line + "\n";
    const json j = json::parse(line);
    losses_.push_back(j.contains("loss") && j["loss"].is_number() ? j["loss"].get<double>() : std::nan(""));
    if (j.contains("eval_loss") && j["eval_loss"].is_number()) last_eval_loss_ = j["eval_loss"].get<double>();
  }
  if (kept.size() > local_lines)
    log::info("resume: metrics of ", kept.size() - local_lines, kept.size() - local_lines == 1 ? " step" : " steps",
              " restored from ", ckpt, "/metrics.jsonl");
  if (static_cast<int64_t>(kept.size()) < step_)
    log::warn("resume: metrics.jsonl has lines for ", kept.size(), " of the ", step_,
              " steps before the checkpoint; summary.json records the gap (metrics_complete: false)");
  setup_seconds_before_ = lc.state.setup_seconds;
  // A resume with steps left continues the run: one more interruption, when the checkpoint is from
  // before its run's own last step. At the last step (a finished run copied into a new output_dir,
  // or one stopped after its last checkpoint) nothing is continued; a finished run given more
  // steps (training.max_steps raised) continues but was not interrupted.
  const bool cut_short = lc.state.total_steps <= 0 || step_ < lc.state.total_steps;
  preemption_["interruptions"] = lc.state.interruptions + (step_ < total_steps_ && cut_short ? 1 : 0);
  preemption_["time_lost_s"] = lc.state.time_lost_s + lost;
  log::info("resume: from ", ckpt, " at step ", step_, " (epoch ", lc.state.sampler.epoch, ", cursor ",
            lc.state.sampler.cursor, "); ", lost, " s of work past it redone");
  // training.max_steps / num_epochs may change on resume (they are not run-meaning keys), but the
  // LR schedule (decay, warmup_ratio) is computed over the total: say that it changes from here.
  if (lc.state.total_steps > 0 && lc.state.total_steps != total_steps_ && step_ < total_steps_)
    log::warn("resume: total steps changed from ", lc.state.total_steps, " to ", total_steps_,
              " (training.max_steps / num_epochs): the learning-rate schedule (", to_string(cfg_.training.lr_scheduler),
              ", warmup ", warmup_steps_, ") is computed over ", total_steps_, " steps from step ", step_ + 1,
              " on, so it differs from the ", lc.state.total_steps, "-step run's");
}

}  // namespace qlora
