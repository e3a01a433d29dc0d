#include "adapters/merge.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "adapters/lora.h"
#include "cli/adapter_run.h"
#include "common/error.h"
#include "common/files.h"
#include "common/log.h"
#include "common/safetensors.h"
#include "common/tensor_io.h"
#include "cli/commands.h"
#include "config/config.h"
#include "model/model.h"
#include "model/model_config.h"
#include "trainer/train.h"

namespace qlora {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

/// The merged model's dtype: --dtype, where auto is the base's stored dtype (not the compute rule).
DType merge_dtype(const std::string& d, const ModelConfig& base) {
  const std::optional<DType> t = dtype_from_name(d);
  QLORA_CHECK(t.has_value(), "merge: --dtype must be bf16, fp16, fp32 or auto, got '", d, "'");
  return *t == DType::kAuto ? stored_dtype(base.torch_dtype) : *t;
}

/// Refuses a LoRA on lm_head, by the adapter's config `pc` (read_peft_config of `dir`, which has
/// already refused what no command reads: DoRA, per-module ranks, a bias, modules_to_save, ...) or
/// by a tensor of its adapter_model.safetensors: tied to embed_tokens it would change the input
/// embeddings too; untied we never train one.
void check_adapter_mergeable(const std::string& dir, const PeftConfig& pc, const ModelConfig& base) {
  bool lm_head = std::find(pc.target_modules.begin(), pc.target_modules.end(), "lm_head") != pc.target_modules.end();
  const fs::path st_path = fs::path(dir) / "adapter_model.safetensors";
  if (fs::exists(st_path)) {
    st::SafetensorsFile f(st_path.string());
    for (const st::TensorInfo& t : f.tensors())
      lm_head = lm_head || t.name.find("lm_head.lora_") != std::string::npos;
  }
  QLORA_CHECK(!lm_head || !base.tie_word_embeddings, dir,
              ": the adapter has a LoRA on lm_head but the base ties lm_head to embed_tokens "
              "(tie_word_embeddings); merging would change the input embeddings too — refusing");
  QLORA_CHECK(!lm_head, dir, ": the adapter has a LoRA on lm_head; only the decoder linears can be merged");
}

/// Warnings about what the merged model will be, from what the adapter dir says of its training:
/// adapter_config.json's base_model_name_or_path (when it is a local dir) other than --base, and a
/// run trained on a 4-bit base (its config.resolved.yaml) merged into unquantized weights.
void warn_about_merge_base(const MergeOptions& o, const PeftConfig& pc, bool base_is_4bit) {
  std::error_code ec;
  const std::string& named = pc.base_model_name_or_path;
  if (!named.empty() && fs::is_directory(named, ec) && !fs::equivalent(named, o.base_dir, ec))
    log::warn("merge: ", o.adapter_dir, "/adapter_config.json names the base ", named, ", not --base ", o.base_dir,
              "; merging into another model (an already merged one merges the adapter twice)");
  if (base_is_4bit) return;
  // a run dir or one of its checkpoints: the run's own config (read_adapter_run, as eval and generate read it)
  const std::optional<AdapterRun> run = read_adapter_run(o.adapter_dir, "merge");
  if (!run || !run->config.quantization.enabled()) return;
  log::warn("merge: the adapter was trained on the ", quant_method_name(run->config.quantization.quant_type),
            "-quantized base (", run->source, "); merged into --base's unquantized weights the model is not the one "
            "training and `qlora eval` measured (PEFT's merge_and_unload after QLoRA does the same): evaluate the "
            "merged model (docs/training.md, \"Merging\")");
}

}  // namespace

void cmd_merge(const MergeOptions& o) {
  QLORA_CHECK(!o.base_dir.empty() && !o.adapter_dir.empty() && !o.out_dir.empty(),
              "merge: --base, --adapter and --out are required");
  QLORA_CHECK(!fs::exists(o.out_dir) || (fs::is_directory(o.out_dir) && fs::is_empty(o.out_dir)), o.out_dir,
              ": exists and is not empty; refusing to overwrite it");
  QLORA_CHECK(o.max_shard_bytes > 0, "merge: --max-shard-bytes must be > 0, got ", o.max_shard_bytes);
  const ModelConfig base_cfg = load_model_config(o.base_dir);
  const DType out_type = merge_dtype(o.dtype, base_cfg);
  const torch::Dtype out_dtype = torch_dtype(out_type, torch::kCPU);
  const PeftConfig pc = read_peft_config(o.adapter_dir);
  check_adapter_mergeable(o.adapter_dir, pc, base_cfg);

  // fp32 holds bf16/fp16/fp32 stored values exactly; a 4-bit base is read as stored (never
  // re-quantized) and dequantized below.
  LlamaModel model = LlamaModel::load(o.base_dir, torch::kFloat32, torch::kCPU);
  bool base_is_4bit = false;
  for (const FrozenLinear* f : model.linears()) base_is_4bit |= f->quantized();
  warn_about_merge_base(o, pc, base_is_4bit);
  const LoraWeights lw = load_peft_adapter(o.adapter_dir, pc, peft_module_shapes(model, pc), kSelectedByAdapterConfig);
  const double s = lora_scale(pc.r, pc.lora_alpha, pc.use_rslora);

  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (auto& [name, t] : model.named_tensors()) tensors.push_back({name, t.to(out_dtype)});
  int64_t merged = 0, dequantized = 0;
  for (const FrozenLinear* f : model.linears()) {
    torch::Tensor w = f->quantized() ? f->qweight->dequantize(torch::kFloat32) : f->weight;
    dequantized += f->quantized();
    auto it = lw.find(f->name);
    if (it != lw.end()) {
      w = merge_lora_weight(w, it->second.first, it->second.second, s, out_dtype, f->name);
      ++merged;
    } else {
      w = w.to(out_dtype);
    }
    const std::string key = f->name + ".weight";
    bool found = false;
    for (auto& [name, t] : tensors)
      if (name == key) t = w, found = true;
    if (!found) tensors.push_back({key, w});
  }
  QLORA_CHECK(merged == static_cast<int64_t>(lw.size()), o.adapter_dir, ": merged ", merged, " of ", lw.size(),
              " adapted modules");

  json cfg = json::parse(read_file((fs::path(o.base_dir) / "config.json").string()));
  cfg.erase("quantization_config");
  cfg["torch_dtype"] = hf_dtype_name(out_type);
  if (cfg.contains("dtype")) cfg["dtype"] = hf_dtype_name(out_type);
  add_legacy_rope_keys(&cfg);  // for GGUF converters that read only rope_theta / rope_scaling (trial 15)

  const fs::path out(o.out_dir);
  const fs::path tmp = o.out_dir + ".tmp-" + std::to_string(::getpid());
  qlora::remove_tree(tmp);
  fs::create_directories(tmp);
  try {
    const auto shards = plan_shards(tensors, o.max_shard_bytes);
    const std::map<std::string, std::string> meta = {{"format", "pt"}};
    if (shards.size() == 1) {
      save_tensors((tmp / "model.safetensors").string(), tensors, meta);
    } else {
      json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", json::object()}};
      int64_t total = 0;
      for (size_t k = 0; k < shards.size(); ++k) {
        char name[64];
        std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k + 1, shards.size());
        std::vector<std::pair<std::string, torch::Tensor>> part(tensors.begin() + shards[k].first,
                                                                tensors.begin() + shards[k].second);
        for (const auto& [n, t] : part) {
          index["weight_map"][n] = name;
          total += t.nbytes();
        }
        save_tensors((tmp / name).string(), part, meta);
      }
      index["metadata"]["total_size"] = total;
      atomic_write_string((tmp / "model.safetensors.index.json").string(), index.dump(2) + "\n");
    }
    atomic_write_string((tmp / "config.json").string(), cfg.dump(2) + "\n");
    for (const char* f : {"generation_config.json", "tokenizer.model", "tokenizer.json", "tokenizer_config.json",
                          "special_tokens_map.json", "added_tokens.json", "chat_template.jinja"}) {
      const fs::path src = fs::path(o.base_dir) / f;
      if (fs::exists(src)) fs::copy_file(src, tmp / f);
    }
    fsync_dir(tmp.string());
    if (fs::exists(out)) fs::remove(out);  // empty (checked above)
    fs::rename(tmp, out);
    fsync_dir(out.parent_path().empty() ? "." : out.parent_path().string());
  } catch (...) {
    std::error_code ec;
    qlora::remove_tree(tmp, ec);
    throw;
  }
  log::info("merge: ", merged, " LoRA modules (r=", pc.r, ", scale ", s, ") merged into ", o.base_dir,
            dequantized ? " (4-bit base dequantized)" : "", " -> ", o.out_dir, " (", hf_dtype_name(out_type), ")");
  if (out_type != DType::kFP32)
    log::warn("merge: W + s·B·A is rounded to ", hf_dtype_name(out_type), " (as PEFT's merge_and_unload on a ",
              hf_dtype_name(out_type), " model), so the merged model only approximates base + adapter; "
              "--dtype fp32 keeps the sum exact (docs/training.md, \"Merging\")");
}

}  // namespace qlora
