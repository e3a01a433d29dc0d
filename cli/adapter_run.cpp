// The settings an adapter's training run brings to eval / generate (adapter_run.h).
#include "cli/adapter_run.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/files.h"
#include "common/log.h"
#include "trainer/checkpoint.h"

namespace qlora {
namespace fs = std::filesystem;

namespace {

std::string show_bool(bool b) { return b ? "true" : "false"; }

std::string show_quant(const QuantOptions& q) {
  std::string s = quant_method_name(q.quant_type);
  if (!q.enabled()) return s;
  s += " (blocksize " + std::to_string(q.blocksize) + ", double_quant " + show_bool(q.double_quant);
  if (q.keep_16bit != QuantOptions{}.keep_16bit) s += ", keep_16bit " + nlohmann::json(q.keep_16bit).dump();
  return s + ")";
}

}  // namespace

const std::vector<AdapterRunKey>& adapter_run_keys() {
  using C = const Config&;
  static const std::vector<AdapterRunKey> keys = {
      {"data.template", true, [](C f, Config& t) { t.data.template_name = f.data.template_name; },
       [](C c) { return c.data.template_name; }},
      {"data.sequence_len", false, [](C f, Config& t) { t.data.sequence_len = f.data.sequence_len; },
       [](C c) { return std::to_string(c.data.sequence_len); }},
      {"data.truncation", false, [](C f, Config& t) { t.data.truncation = f.data.truncation; },
       [](C c) { return c.data.truncation; }},
      {"data.train_on_inputs", false, [](C f, Config& t) { t.data.train_on_inputs = f.data.train_on_inputs; },
       [](C c) { return show_bool(c.data.train_on_inputs); }},
      {"data.add_eos", false, [](C f, Config& t) { t.data.add_eos = f.data.add_eos; },
       [](C c) { return show_bool(c.data.add_eos); }},
      {"data.default_system_message", true,
       [](C f, Config& t) { t.data.default_system_message = f.data.default_system_message; },
       [](C c) { return nlohmann::json(c.data.default_system_message).dump(); }},
      {"quantization", true, [](C f, Config& t) { t.quantization = f.quantization; },
       [](C c) { return show_quant(c.quantization); }},
      // the compute dtype (generate too: a bf16 run decodes in bf16, as it evaluated) and the eval
      // batch (bf16 rounding depends on the padded batch's shape): with them the loss is the run's
      // eval_loss of the file, not within bf16 noise of it
      {"model.dtype", true, [](C f, Config& t) { t.model.dtype = f.model.dtype; },
       [](C c) { return std::string(dtype_name(c.model.dtype)); }},
      {"training.micro_batch_size", false,
       [](C f, Config& t) { t.training.micro_batch_size = f.training.micro_batch_size; },
       [](C c) { return std::to_string(c.training.micro_batch_size); }},
  };
  return keys;
}

namespace {

/// `data_format` and `data_system_records` of the checkpoint `dir` (trainer_state.json,
/// read_trainer_state), else of the run dir's summary.json; "" and -1 when neither has them.
void read_run_data(const fs::path& dir, AdapterRun* run) {
  if (fs::exists(dir / "trainer_state.json")) {
    try {
      const TrainerState st = read_trainer_state(dir.string());
      if (!st.data_format.empty()) {
        run->data_format = st.data_format;
        run->data_system_records = st.data_system_records;
        return;
      }
    } catch (const Error&) {  // not a checkpoint this version reads: says nothing of the data
    }
  }
  try {
    const nlohmann::json j = nlohmann::json::parse(read_file((dir / "summary.json").string()));
    if (!j.is_object()) return;
    if (j.contains("data_format") && j["data_format"].is_string()) run->data_format = j["data_format"].get<std::string>();
    if (j.contains("data_system_records") && j["data_system_records"].is_number_integer())
      run->data_system_records = j["data_system_records"].get<int64_t>();
  } catch (const std::exception&) {  // missing or not JSON: says nothing of the data
  }
}

/// The run config part of read_adapter_run (data_format and data_system_records not filled).
std::optional<AdapterRun> read_run_config(const std::string& adapter_dir, const std::string& who) {
  const fs::path dir(adapter_dir);
  const fs::path resolved = dir / "config.resolved.yaml", state = dir / "trainer_state.json";
  // <run>/checkpoints/checkpoint-N whose trainer_state.json has no config: the run dir's
  const fs::path run_resolved = dir.parent_path().parent_path() / "config.resolved.yaml";
  const bool in_run = checkpoint_name_step(dir.string()) >= 0 && dir.parent_path().filename() == "checkpoints";
  std::string src;
  try {
    if (fs::exists(resolved)) {
      src = resolved.string();
      return AdapterRun{src, load_config(src), "", -1};
    }
    if (fs::exists(state)) {
      src = state.string();
      try {
        return AdapterRun{src, parse_config_string(checkpoint_config_yaml(dir.string()), src + " config"), "", -1};
      } catch (const Error&) {
        if (!in_run || !fs::exists(run_resolved)) throw;
      }
    }
    if (in_run && fs::exists(run_resolved)) {
      src = run_resolved.string();
      return AdapterRun{src, load_config(src), "", -1};
    }
  } catch (const std::exception& e) {
    log::warn(who, ": ", src, " not used (", e.what(), "); the adapter's training settings are not known");
  }
  return std::nullopt;
}

}  // namespace

std::optional<AdapterRun> read_adapter_run(const std::string& adapter_dir, const std::string& who) {
  std::optional<AdapterRun> run = read_run_config(adapter_dir, who);
  if (run) read_run_data(adapter_dir, &*run);
  return run;
}

void apply_adapter_run(const Config& run, Config& to, bool prompt_only) {
  for (const AdapterRunKey& k : adapter_run_keys())
    if (!prompt_only || k.for_prompt) k.copy(run, to);
}

std::vector<std::string> adapter_run_log(const AdapterRun& run, const Config& used, bool prompt_only,
                                         const std::function<std::string(const std::string& key)>& given_by) {
  std::vector<std::string> lines;
  std::string taken;
  for (const AdapterRunKey& k : adapter_run_keys()) {
    if (prompt_only && !k.for_prompt) continue;
    const std::string flag = given_by(k.key);
    if (flag.empty()) {
      taken += (taken.empty() ? "" : ", ") + k.key + " " + k.show(used);
    } else {
      lines.push_back(k.key + " " + k.show(used) + " from " + flag + " (the run's: " + k.show(run.config) + ")");
    }
  }
  if (!taken.empty()) lines.insert(lines.begin(), taken + " from " + run.source + " (the adapter's training run)");
  return lines;
}

std::string set_override_for(const std::vector<std::string>& overrides, const std::string& key) {
  for (const std::string& o : overrides) {
    std::string k = o.substr(0, o.find('='));
    while (!k.empty() && (k.back() == ' ' || k.back() == '\t')) k.pop_back();
    while (!k.empty() && (k.front() == ' ' || k.front() == '\t')) k.erase(0, 1);
    const bool same = k == key, above = key.rfind(k + ".", 0) == 0, inside = k.rfind(key + ".", 0) == 0;
    if (same || above || inside) return "--set " + k;
  }
  return "";
}

}  // namespace qlora
