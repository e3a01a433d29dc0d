#include "trainer/checkpoint.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <cstring>
#include <map>
#include <random>
#include <thread>

#include "common/error.h"
#include "common/files.h"
#include "common/format.h"
#include "common/tensor_io.h"
#include "common/yaml.h"

namespace qlora {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
const char* kPrefix = "checkpoint-";

/// `ckpt_dir`/trainer_state.json parsed; a discarded value when missing or not JSON.
json read_state_json(const std::string& ckpt_dir) {
  const fs::path p = fs::path(ckpt_dir) / "trainer_state.json";
  std::error_code ec;
  if (!fs::is_regular_file(p, ec)) return json(json::value_t::discarded);
  return json::parse(read_file(p.string()), nullptr, /*allow_exceptions=*/false);
}

void fsync_file(const fs::path& p) {
  std::FILE* f = std::fopen(p.c_str(), "rb");
  QLORA_CHECK(f, "cannot open ", p.string(), " to fsync");
  const int rc = ::fsync(fileno(f));
  std::fclose(f);
  QLORA_CHECK(rc == 0, "cannot fsync ", p.string());
}

json state_to_json(const TrainerState& s, const OptimizerTensors& o) {
  json sampler;
  data::to_json(sampler, s.sampler);
  return {{"format", "qlora-cpp checkpoint v1"},
          {"step", s.step},
          {"sampler", sampler},
          {"skipped_steps", s.skipped_steps},
          {"nonfinite_in_a_row", s.nonfinite_in_a_row},
          {"tokens_trained", s.tokens_trained},
          {"target_tokens", s.target_tokens},
          {"train_seconds", s.train_seconds},
          {"interruptions", s.interruptions},
          {"time_lost_s", s.time_lost_s},
          {"optimizer_steps", o.steps},
          {"config", s.config_yaml},
          {"run_id", s.run_id},
          {"fingerprint", s.fingerprint},
          {"data_sha256", s.data_sha256},
          {"model_files", s.model_files},
          {"val_set_split", s.val_set_split},
          {"world_size", s.world_size},
          {"total_steps", s.total_steps},
          {"setup_seconds", s.setup_seconds},
          {"data_format", s.data_format},
          {"data_system_records", s.data_system_records},
          {"eval_loss", std::isfinite(s.eval_loss) ? json(s.eval_loss) : json(nullptr)}};
}

/// Dotted key -> value text of every leaf of a config tree (lists and maps below a key: flow text).
void flatten(const yaml::Node& n, const std::string& prefix, std::map<std::string, std::string>* out) {
  if (n.is_map()) {
    for (const auto& [k, v] : n.entries) {
      const std::string name = k.is_scalar() ? k.value : yaml::to_flow(k);
      flatten(v, prefix.empty() ? name : prefix + "." + name, out);
    }
  } else if (n.is_scalar()) {
    (*out)[prefix] = n.value;
  } else {
    (*out)[prefix] = yaml::to_flow(n);
  }
}

/// The first document of a stored or current config's YAML text (`what` names it in errors).
yaml::Node parse_config_tree(const std::string& text, const std::string& what) {
  auto docs = yaml::parse_all(text, what);
  return docs.empty() ? yaml::Node() : std::move(docs[0]);
}

bool ignored_key(const std::string& k) {
  static const char* keys[] = {"training.max_steps", "training.num_epochs", "training.logging_steps",
                               "training.eval_steps", "output_dir"};
  for (const char* x : keys)
    if (k == x) return true;
  return k.rfind("checkpoint.", 0) == 0 || k.rfind("cost.", 0) == 0;
}
}  // namespace

OptimizerTensors capture_adamw_state(const torch::optim::AdamW& opt, const std::vector<torch::Tensor>& params) {
  OptimizerTensors ot;
  for (const torch::Tensor& p : params) {
    auto it = opt.state().find(p.unsafeGetTensorImpl());
    if (it == opt.state().end()) {  // no update applied yet
      ot.exp_avg.push_back(torch::zeros_like(p, torch::kCPU));
      ot.exp_avg_sq.push_back(torch::zeros_like(p, torch::kCPU));
      ot.steps.push_back(0);
      continue;
    }
    const auto& s = static_cast<const torch::optim::AdamWParamState&>(*it->second);
    ot.exp_avg.push_back(s.exp_avg().to(torch::kCPU));
    ot.exp_avg_sq.push_back(s.exp_avg_sq().to(torch::kCPU));
    ot.steps.push_back(s.step());
  }
  return ot;
}

void restore_adamw_state(torch::optim::AdamW& opt, const std::vector<torch::Tensor>& params,
                         const OptimizerTensors& ot, const torch::Device& device, const std::string& ckpt) {
  QLORA_CHECK(ot.steps.size() == params.size(), ckpt, ": optimizer state has ", ot.steps.size(),
              " tensors, the model has ", params.size(), " LoRA tensors");
  for (size_t i = 0; i < params.size(); ++i) {
    if (ot.steps[i] == 0) continue;
    QLORA_CHECK(ot.exp_avg[i].sizes() == params[i].sizes(), ckpt, "/optimizer.safetensors: 'exp_avg.", i,
                "' has shape ", ot.exp_avg[i].sizes(), ", expected ", params[i].sizes());
    auto st = std::make_unique<torch::optim::AdamWParamState>();
    st->step(ot.steps[i]);
    st->exp_avg(ot.exp_avg[i].to(device));
    st->exp_avg_sq(ot.exp_avg_sq[i].to(device));
    opt.state()[params[i].unsafeGetTensorImpl()] = std::move(st);
  }
}

std::string write_checkpoint(const std::string& dir, const TrainerState& state, const PeftConfig& peft,
                             const LoraWeights& adapter, const OptimizerTensors& opt, const std::vector<RngState>& rng,
                             const FaultHooks& faults) {
  QLORA_CHECK(!rng.empty() && rng[0].cpu.defined(), "write_checkpoint: no random-number state of rank 0");
  fs::create_directories(dir);
  // Leftovers of a process killed mid-write (never loaded: no manifest, or not renamed) go first;
  // one trainer owns a checkpoint directory at a time.
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(".tmp-", 0) == 0 || n.rfind(".old-", 0) == 0) qlora::remove_tree(e.path());
  }
  const fs::path final_dir = fs::path(dir) / (kPrefix + std::to_string(state.step));
  const fs::path tmp = fs::path(dir) / (".tmp-" + std::string(kPrefix) + std::to_string(state.step) + "-" +
                                        std::to_string(::getpid()));
  qlora::remove_tree(tmp);
  fs::create_directories(tmp);
  try {
    save_peft_adapter(tmp.string(), peft, adapter);
    std::vector<std::pair<std::string, torch::Tensor>> ot;
    for (size_t i = 0; i < opt.exp_avg.size(); ++i) {
      ot.emplace_back("exp_avg." + std::to_string(i), opt.exp_avg[i]);
      ot.emplace_back("exp_avg_sq." + std::to_string(i), opt.exp_avg_sq[i]);
    }
    // Test hook (trainer/fault.h): the disk is full when this step's optimizer state is written.
    if (faults.checkpoint_enospc_step >= 0 && faults.checkpoint_enospc_step == state.step)
      fail("cannot write ", (tmp / "optimizer.safetensors").string(), ": ", std::strerror(ENOSPC),
           " (QLORA_FAULT_CHECKPOINT_ENOSPC_AT)");
    if (!ot.empty()) save_tensors((tmp / "optimizer.safetensors").string(), ot);
    std::vector<std::pair<std::string, torch::Tensor>> rt;
    for (size_t r = 0; r < rng.size(); ++r) {
      const std::string suffix = r == 0 ? "" : ".rank" + std::to_string(r);
      if (rng[r].cpu.defined()) rt.emplace_back("cpu" + suffix, rng[r].cpu);
      if (rng[r].cuda.defined()) rt.emplace_back("cuda" + suffix, rng[r].cuda);
    }
    save_tensors((tmp / "rng.safetensors").string(), rt);
    atomic_write_string((tmp / "trainer_state.json").string(), state_to_json(state, opt).dump(2) + "\n");
    if (!state.metrics_jsonl.empty()) atomic_write_string((tmp / "metrics.jsonl").string(), state.metrics_jsonl);
    json manifest = json::object();
    for (const auto& e : fs::directory_iterator(tmp)) {
      fsync_file(e.path());
      manifest[e.path().filename().string()] = {{"bytes", fs::file_size(e.path())},
                                                {"sha256", sha256_file(e.path().string())}};
    }
    atomic_write_string((tmp / "manifest.json").string(), json({{"files", manifest}}).dump(2) + "\n");
    fsync_dir(tmp.string());
    // Test hook (trainer/fault.h): a test's SIGKILL can land while the checkpoint is half-done.
    if (faults.slow_checkpoint_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(faults.slow_checkpoint_ms));
    if (fs::exists(final_dir)) {  // same step written again: swap only once the new one is complete
      const fs::path old = fs::path(dir) / (".old-" + final_dir.filename().string());
      qlora::remove_tree(old);
      fs::rename(final_dir, old);
      fs::rename(tmp, final_dir);
      qlora::remove_tree(old);
    } else {
      fs::rename(tmp, final_dir);
    }
    fsync_dir(dir);
  } catch (...) {
    std::error_code ec;
    qlora::remove_tree(tmp, ec);
    throw;
  }
  return final_dir.string();
}

std::string verify_checkpoint(const std::string& ckpt_dir) {
  const fs::path m = fs::path(ckpt_dir) / "manifest.json";
  if (!fs::exists(m)) return "no manifest.json (incomplete)";
  json j;
  try {
    j = json::parse(read_file(m.string()));
  } catch (const std::exception& e) {
    return std::string("manifest.json unreadable: ") + e.what();
  }
  if (!j.contains("files") || !j["files"].is_object() || j["files"].empty()) return "manifest.json lists no files";
  for (auto it = j["files"].begin(); it != j["files"].end(); ++it) {
    const fs::path f = fs::path(ckpt_dir) / it.key();
    if (!fs::exists(f)) return it.key() + " is missing";
    if (!it.value().contains("bytes") || !it.value().contains("sha256")) return "manifest entry for " + it.key() + " is malformed";
    if (fs::file_size(f) != it.value()["bytes"].get<uint64_t>())
      return it.key() + " has " + std::to_string(fs::file_size(f)) + " bytes, manifest says " +
             std::to_string(it.value()["bytes"].get<uint64_t>());
    if (sha256_file(f.string()) != it.value()["sha256"].get<std::string>()) return it.key() + " fails its SHA-256";
  }
  return "";
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  if (fs::is_directory(dir))
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_directory() && checkpoint_name_step(e.path().string()) >= 0) found.emplace_back(checkpoint_name_step(e.path().string()), e.path().string());
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

std::string newest_valid_checkpoint(const std::string& dir, std::vector<std::string>* skipped,
                                    const std::string& run_id) {
  for (const std::string& c : list_checkpoints(dir)) {
    // Integrity first: a damaged checkpoint is reported by the file that fails (its run id may be
    // unreadable because of that damage), then ownership.
    const std::string why = verify_checkpoint(c);
    if (!why.empty()) {
      if (skipped) skipped->push_back(c + ": " + why);
      continue;
    }
    if (!run_id.empty()) {
      const std::string other = checkpoint_run_id(c);
      if (other != run_id) {
        if (skipped) skipped->push_back(c + ": written by run " + (other.empty() ? "(no run id)" : other) + ", not this run " + run_id);
        continue;
      }
    }
    return c;
  }
  return "";
}

std::string best_checkpoint(const std::string& dir, const std::string& run_id) {
  std::vector<std::pair<double, int64_t>> ranked;  // (eval_loss, step): the lowest loss, then the oldest
  std::map<int64_t, std::string> by_step;
  for (const std::string& c : list_checkpoints(dir)) {
    if (!run_id.empty() && checkpoint_run_id(c) != run_id) continue;
    const json j = read_state_json(c);
    if (!j.is_object() || !j.contains("eval_loss") || !j["eval_loss"].is_number()) continue;
    const double loss = j["eval_loss"].get<double>();
    if (!std::isfinite(loss)) continue;
    ranked.emplace_back(loss, checkpoint_name_step(c));
    by_step[checkpoint_name_step(c)] = c;
  }
  std::sort(ranked.begin(), ranked.end());
  for (const auto& [loss, step] : ranked)  // hashes the files of the best one only, unless it is damaged
    if (verify_checkpoint(by_step[step]).empty()) return by_step[step];
  return "";
}

namespace {
/// Deletes checkpoint directory `c` file by file: the files a checkpoint writes (write_checkpoint)
/// and those its manifest.json lists (plain names only), then the directory when nothing else is
/// left in it. A file no checkpoint writes (someone's own, where `checkpoints` links to a shared
/// place; trial 27: pruning deleted it) is never deleted: its name is returned and the directory
/// kept. Symbolic links are removed as links, never followed.
std::vector<std::string> remove_checkpoint_dir(const fs::path& c) {
  std::set<std::string> ours = {"adapter_model.safetensors", "adapter_config.json", "optimizer.safetensors",
                                "rng.safetensors",           "trainer_state.json",  "metrics.jsonl",
                                "manifest.json"};
  if (fs::is_symlink(c)) {  // a link to a checkpoint elsewhere: the link goes, what it names stays
    fs::remove(c);
    return {};
  }
  std::string manifest;
  try {
    manifest = read_file((c / "manifest.json").string());
  } catch (const Error&) {  // none, or unreadable: the fixed names only
  }
  const json m = json::parse(manifest, nullptr, /*allow_exceptions=*/false);
  if (m.is_object() && m.contains("files") && m["files"].is_object())
    for (const auto& [name, v] : m["files"].items())
      if (!name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos) ours.insert(name);
  std::vector<std::string> foreign;
  for (const auto& e : fs::directory_iterator(c)) {
    const std::string n = e.path().filename().string();
    if (ours.count(n) && !e.is_directory()) fs::remove(e.path());
    else foreign.push_back(n);
  }
  if (foreign.empty()) fs::remove(c);
  std::sort(foreign.begin(), foreign.end());
  return foreign;
}
}  // namespace

std::vector<std::string> prune_checkpoints(const std::string& dir, int64_t keep_last, const std::string& run_id,
                                           const std::set<std::string>& busy, bool keep_best,
                                           std::vector<std::string>* kept_dirs) {
  std::vector<std::string> removed;
  int64_t kept = 0;
  const std::string best = keep_best ? best_checkpoint(dir, run_id) : "";
  for (const std::string& c : list_checkpoints(dir)) {
    if (!run_id.empty() && checkpoint_run_id(c) != run_id) continue;  // another run's: never ours to delete
    if (c == best && kept >= keep_last) continue;  // kept besides the newest keep_last
    if (kept < keep_last && verify_checkpoint(c).empty()) {
      ++kept;
      continue;
    }
    if (kept < keep_last) continue;  // never delete an unverified newer one before enough are kept
    if (busy.count(c)) continue;     // its sync_command still reads it: pruned after the sync ends
    const std::vector<std::string> foreign = remove_checkpoint_dir(c);
    if (foreign.empty()) {
      removed.push_back(c);
    } else if (kept_dirs) {
      std::string names;
      for (const std::string& n : foreign) names += (names.empty() ? "" : ", ") + n;
      kept_dirs->push_back(c + " (it holds " + names + ")");
    }
  }
  return removed;
}

TrainerState read_trainer_state(const std::string& ckpt_dir, std::vector<int64_t>* optimizer_steps) {
  TrainerState s;
  const std::string sp = (fs::path(ckpt_dir) / "trainer_state.json").string();
  json j;
  try {
    j = json::parse(read_file(sp));
    s.step = j.at("step").get<int64_t>();
    data::from_json(j.at("sampler"), s.sampler);
    s.skipped_steps = j.at("skipped_steps").get<int64_t>();
    s.nonfinite_in_a_row = j.at("nonfinite_in_a_row").get<int64_t>();
    s.tokens_trained = j.at("tokens_trained").get<int64_t>();
    s.target_tokens = j.value("target_tokens", int64_t{0});
    s.train_seconds = j.at("train_seconds").get<double>();
    s.interruptions = j.value("interruptions", int64_t{0});
    s.time_lost_s = j.value("time_lost_s", 0.0);
    s.config_yaml = j.at("config").get<std::string>();
    if (optimizer_steps) *optimizer_steps = j.at("optimizer_steps").get<std::vector<int64_t>>();
    s.run_id = j.value("run_id", std::string());
    s.fingerprint = j.value("fingerprint", std::string());
    if (j.contains("data_sha256")) s.data_sha256 = j["data_sha256"].get<std::map<std::string, std::string>>();
    if (j.contains("model_files")) s.model_files = j["model_files"].get<std::map<std::string, std::string>>();
    s.val_set_split = j.value("val_set_split", std::string());
    s.world_size = j.value("world_size", int64_t{1});
    QLORA_CHECK(s.world_size >= 1, sp, ": world_size must be >= 1, got ", s.world_size);
    s.total_steps = j.value("total_steps", int64_t{0});
    QLORA_CHECK(s.total_steps >= 0, sp, ": total_steps must be >= 0, got ", s.total_steps);
    s.setup_seconds = j.value("setup_seconds", 0.0);
    s.data_format = j.value("data_format", std::string());
    s.data_system_records = j.value("data_system_records", int64_t{-1});
    if (j.contains("eval_loss") && j["eval_loss"].is_number()) s.eval_loss = j["eval_loss"].get<double>();
  } catch (const json::exception& e) {
    fail(sp, ": ", e.what());
  }
  return s;
}

LoadedCheckpoint read_checkpoint(const std::string& ckpt_dir, const ModuleShapes& shapes) {
  const std::string why = verify_checkpoint(ckpt_dir);
  QLORA_CHECK(why.empty(), ckpt_dir, ": checkpoint does not verify: ", why);
  LoadedCheckpoint c;
  c.peft = read_peft_config(ckpt_dir);
  c.adapter = load_peft_adapter(ckpt_dir, c.peft, shapes, "lora.target_modules");
  c.state = read_trainer_state(ckpt_dir, &c.opt.steps);
  const fs::path op = fs::path(ckpt_dir) / "optimizer.safetensors";
  if (!c.opt.steps.empty()) {
    st::SafetensorsFile f(op.string());
    for (size_t i = 0; i < c.opt.steps.size(); ++i) {
      c.opt.exp_avg.push_back(load_tensor(f, f.info("exp_avg." + std::to_string(i))).clone());
      c.opt.exp_avg_sq.push_back(load_tensor(f, f.info("exp_avg_sq." + std::to_string(i))).clone());
    }
  }
  const fs::path mp = fs::path(ckpt_dir) / "metrics.jsonl";  // verified above when the manifest lists it
  if (fs::exists(mp)) c.state.metrics_jsonl = read_file(mp.string());
  st::SafetensorsFile r((fs::path(ckpt_dir) / "rng.safetensors").string());
  for (int64_t rank = 0; rank == 0 || r.contains("cpu.rank" + std::to_string(rank)); ++rank) {
    const std::string suffix = rank == 0 ? "" : ".rank" + std::to_string(rank);
    RngState st;
    st.cpu = load_tensor(r, r.info("cpu" + suffix)).clone();
    if (r.contains("cuda" + suffix)) st.cuda = load_tensor(r, r.info("cuda" + suffix)).clone();
    c.rng.push_back(std::move(st));
  }
  return c;
}

int64_t checkpoint_name_step(const std::string& path) {
  const std::string n = fs::path(path).filename().string();
  if (n.rfind(kPrefix, 0) != 0) return -1;
  const std::string digits = n.substr(std::char_traits<char>::length(kPrefix));
  if (digits.empty() || digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), ::isdigit)) return -1;
  return std::stoll(digits);
}

std::string checkpoint_run_id(const std::string& ckpt_dir) {
  const json j = read_state_json(ckpt_dir);
  return j.is_object() && j.contains("run_id") && j["run_id"].is_string() ? j["run_id"].get<std::string>() : "";
}

int64_t checkpoint_step(const std::string& ckpt_dir) {
  const json j = read_state_json(ckpt_dir);
  return j.is_object() && j.contains("step") && j["step"].is_number_integer() ? j["step"].get<int64_t>() : -1;
}

std::string checkpoint_config_yaml(const std::string& ckpt_dir) {
  const std::string path = (fs::path(ckpt_dir) / "trainer_state.json").string();
  try {
    return json::parse(read_file(path)).at("config").get<std::string>();
  } catch (const json::exception& e) {
    fail(path, ": no resolved config (", e.what(), ")");
  }
}

std::string new_run_id() {
  std::random_device rd;
  char tail[16];
  std::snprintf(tail, sizeof tail, "-%08x", static_cast<unsigned>(rd()));
  return utc_time("%Y%m%dT%H%M%SZ") + tail;
}

std::string run_fingerprint(const std::string& config_yaml, const std::map<std::string, std::string>& data_sha256) {
  std::map<std::string, std::string> flat;
  flatten(parse_config_tree(config_yaml, "the resolved config"), "", &flat);
  std::string text;
  for (const auto& [k, v] : flat)
    if (!ignored_key(k)) text += k + "=" + v + "\n";
  for (const auto& [path, sha] : data_sha256) text += "data " + path + " " + sha + "\n";
  return sha256_hex(text);
}

RunRecord read_run_record(const std::string& output_dir) {
  RunRecord r;
  const fs::path p = fs::path(output_dir) / "run.json";
  if (!fs::exists(p)) return r;
  try {
    const json j = json::parse(read_file(p.string()));
    r.run_id = j.at("run_id").get<std::string>();
    r.fingerprint = j.value("fingerprint", std::string());
    if (j.contains("data_sha256")) r.data_sha256 = j["data_sha256"].get<std::map<std::string, std::string>>();
    r.started_utc = j.value("started_utc", std::string());
    r.config_yaml = j.value("config", std::string());
    r.has_model_files = j.contains("model_files");
    if (r.has_model_files) r.model_files = j["model_files"].get<std::map<std::string, std::string>>();
  } catch (const json::exception& e) {
    fail(p.string(), ": not a run record (", e.what(), "); move it away or use --overwrite-output-dir");
  }
  QLORA_CHECK(!r.run_id.empty(), p.string(), ": run_id is empty");
  return r;
}

void write_run_record(const std::string& output_dir, const RunRecord& r) {
  const json j = {{"run_id", r.run_id},
                  {"fingerprint", r.fingerprint},
                  {"data_sha256", r.data_sha256},
                  {"started_utc", r.started_utc},
                  {"config", r.config_yaml},
                  {"model_files", r.model_files}};
  atomic_write_string((fs::path(output_dir) / "run.json").string(), j.dump(2) + "\n");
}

std::vector<std::string> config_differences(const std::string& saved_yaml, const std::string& current_yaml) {
  std::map<std::string, std::string> a, b;
  flatten(parse_config_tree(saved_yaml, "the checkpoint's config"), "", &a);
  flatten(parse_config_tree(current_yaml, "the current config"), "", &b);
  // Keys newer than the checkpoint format: an older version's config has none and ran as the
  // default (data.deduplicate: false), so absent reads as it; another value still differs.
  static const std::pair<const char*, const char*> kAddedKeys[] = {{"data.deduplicate", "false"}};
  for (const auto& [key, dflt] : kAddedKeys)
    if (!a.empty() && !b.empty()) {
      a.emplace(key, dflt);
      b.emplace(key, dflt);
    }
  std::vector<std::string> out;
  for (const auto& [k, v] : a) {
    if (ignored_key(k)) continue;
    auto it = b.find(k);
    const std::string now = it == b.end() ? "(absent)" : it->second;
    if (now != v) out.push_back(k + ": " + v + " -> " + now);
  }
  for (const auto& [k, v] : b)
    if (!ignored_key(k) && !a.count(k)) out.push_back(k + ": (absent) -> " + v);
  return out;
}

namespace {
// The refusal of a run on a locked output_dir, naming the holder run.lock records ("pid P on host
// H since T").
std::string lock_held_message(const std::string& output_dir, const std::string& path) {
  std::string holder = read_file(path);
  while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\r')) holder.pop_back();
  return "output_dir " + output_dir + " is in use by another qlora train (" +
         (holder.empty() ? std::string("holder unknown") : holder) + "; lock " + path +
         "): a run owns its output_dir; wait for that process to end (or stop it), or use another output_dir (exit "
         "75: the same command can run once it has ended)";
}
}  // namespace

void OutputDirLock::check_free(const std::string& output_dir) {
  const std::string path = (fs::path(output_dir) / kFile).string();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);  // no O_CREAT: absent means free
  if (fd < 0) return;
  const bool held = ::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);  // releases the probe's lock, if it got one
  if (!held) return;
  throw TryLater(lock_held_message(output_dir, path));
}

OutputDirLock::OutputDirLock(const std::string& output_dir) : dir_(output_dir) {
  std::error_code ec;
  QLORA_CHECK(!fs::exists(output_dir) || fs::is_directory(output_dir), "output_dir: ", output_dir,
              " exists and is not a directory");
  created_dir_ = fs::create_directories(output_dir, ec);
  QLORA_CHECK(!ec, "output_dir: cannot create ", output_dir, ": ", ec.message());
  const std::string path = (fs::path(output_dir) / kFile).string();
  for (;;) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    QLORA_CHECK(fd_ >= 0, "cannot open ", path, ": ", std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      const std::string held = err == EWOULDBLOCK ? lock_held_message(output_dir, path) : std::string();
      ::close(fd_);
      fd_ = -1;
      if (err == EWOULDBLOCK) throw TryLater(held);
      fail("cannot lock ", path, ": ", std::strerror(err));
    }
    // The file may have been removed (by a holder that created output_dir and failed) between our
    // open and our lock: then the lock is on an orphan inode; take it again on the file in place.
    struct stat a {}, b {};
    if (::fstat(fd_, &a) == 0 && ::stat(path.c_str(), &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev) break;
    ::close(fd_);
    fd_ = -1;
  }
  char host[256] = {0};
  if (::gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "?");
  const std::string id = new_run_id();  // UTC time + random bits: the time part says since when
  const std::string rec = "pid " + std::to_string(::getpid()) + " on host " + host + " since " + id.substr(0, id.find('-'));
  const bool ok = ::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, rec.data(), rec.size(), 0) == static_cast<ssize_t>(rec.size());
  if (!ok) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    fail("cannot write ", path, ": ", std::strerror(err));
  }
}

OutputDirLock::~OutputDirLock() {
  if (fd_ < 0) return;
  if (created_dir_) {
    std::error_code ec;
    bool only_lock = true;
    for (const auto& e : fs::directory_iterator(dir_, ec))
      if (e.path().filename() != kFile) only_lock = false;
    if (!ec && only_lock) {
      fs::remove(fs::path(dir_) / kFile, ec);
      fs::remove(dir_, ec);
    }
  }
  ::close(fd_);
}

}  // namespace qlora
