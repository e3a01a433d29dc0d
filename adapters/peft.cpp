#include "adapters/peft.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "common/error.h"
#include "common/json_file.h"
#include "common/files.h"
#include "common/tensor_io.h"
#include "adapters/lora.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace qlora {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
const std::string kPrefix = "base_model.model.";
const std::string kSuffixA = ".lora_A.weight";
const std::string kSuffixB = ".lora_B.weight";

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}
/// PCRE2 match of `pattern` against `subject`: anchored at the start (Python re.match), and at the
/// end too when `full` (re.fullmatch). Returns the text of group `group` ("" = whole match) when
/// it matched, std::nullopt otherwise.
std::optional<std::string> re_match(const std::string& pattern, const std::string& subject, bool full,
                                    const char* group = nullptr) {
  int err = 0;
  PCRE2_SIZE off = 0;
  std::unique_ptr<pcre2_code, void (*)(pcre2_code*)> code(
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), 0, &err, &off, nullptr),
      &pcre2_code_free);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    fail("adapter_config.json: regular expression '", pattern, "' does not compile at offset ", off, ": ",
         reinterpret_cast<const char*>(msg));
  }
  std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> md(
      pcre2_match_data_create_from_pattern(code.get(), nullptr), &pcre2_match_data_free);
  const uint32_t opts = PCRE2_ANCHORED | (full ? PCRE2_ENDANCHORED : 0);
  const int rc = pcre2_match(code.get(), reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(), 0, opts,
                             md.get(), nullptr);
  if (rc < 0) return std::nullopt;
  PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
  int n = 0;
  if (group) {
    n = pcre2_substring_number_from_name(code.get(), reinterpret_cast<PCRE2_SPTR>(group));
    if (n < 0 || n >= rc || ov[2 * n] == PCRE2_UNSET) return std::nullopt;
  }
  return subject.substr(ov[2 * n], ov[2 * n + 1] - ov[2 * n]);
}

bool name_or_suffix(const std::string& module, const std::vector<std::string>& names) {
  for (const std::string& t : names)
    if (module == t || (module.size() > t.size() && ends_with(module, "." + t))) return true;
  return false;
}
}  // namespace

LoraOptions lora_options(const PeftConfig& c) {
  LoraOptions o;
  o.r = c.r;
  o.alpha = c.lora_alpha;
  o.dropout = c.lora_dropout;
  o.target_modules = c.target_modules;
  o.use_rslora = c.use_rslora;
  return o;
}

bool peft_targets_module(const PeftConfig& c, const std::string& module) {
  if (!c.exclude_regex.empty() && re_match(c.exclude_regex, module, true)) return false;
  if (name_or_suffix(module, c.exclude_modules)) return false;
  if (!c.target_regex.empty()) return re_match(c.target_regex, module, true).has_value();
  for (const std::string& t : c.target_modules)
    if (module == t) return true;  // an exact full path: no layer filter (as PEFT)
  bool found = false;
  for (const std::string& t : expand_target_modules(c.target_modules)) found = found || ends_with(module, "." + t);
  if (!found || c.layers_to_transform.empty()) return found;
  std::optional<std::string> idx;
  if (c.layers_pattern.empty()) {
    idx = re_match(R"(.*?\.[^.]*\.(?P<idx>\d+)\.)", module, false, "idx");
  } else {
    for (const std::string& p : c.layers_pattern)
      if ((idx = re_match("(?:^|.*?\\.)" + p + R"(\.(?P<idx>\d+)\.)", module, false, "idx"))) break;
  }
  if (!idx) return false;
  const int64_t layer = std::stoll(*idx);
  return std::find(c.layers_to_transform.begin(), c.layers_to_transform.end(), layer) != c.layers_to_transform.end();
}

std::string peft_key(const std::string& module, bool is_a) {
  return kPrefix + module + (is_a ? kSuffixA : kSuffixB);
}

void save_peft_adapter(const std::string& dir, const PeftConfig& cfg, const LoraWeights& weights) {
  QLORA_CHECK(!weights.empty(), dir, ": refusing to save an adapter with no tensors");
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& [module, ab] : weights) {
    const auto& [A, B] = ab;
    QLORA_CHECK(A.dim() == 2 && B.dim() == 2 && A.size(0) == cfg.r && B.size(1) == cfg.r, dir,
                ": module '", module, "': expected lora_A [", cfg.r, ", in] and lora_B [out, ", cfg.r,
                "], got ", A.sizes(), " and ", B.sizes());
    tensors.emplace_back(peft_key(module, true), A.detach());
    tensors.emplace_back(peft_key(module, false), B.detach());
  }
  fs::create_directories(dir);
  json j = {{"peft_type", "LORA"},
            {"task_type", "CAUSAL_LM"},
            {"r", cfg.r},
            // an integral alpha as an integer, as PEFT writes its `lora_alpha: int` (Ollama's
            // converter decodes it into a uint32 and refuses 32.0; trial 15)
            {"lora_alpha", cfg.lora_alpha == std::floor(cfg.lora_alpha) && std::fabs(cfg.lora_alpha) < 1e15
                               ? json(static_cast<int64_t>(cfg.lora_alpha))
                               : json(cfg.lora_alpha)},
            {"lora_dropout", cfg.lora_dropout},
            {"target_modules", cfg.target_modules},
            {"use_rslora", cfg.use_rslora},
            {"bias", "none"},
            {"base_model_name_or_path", cfg.base_model_name_or_path},
            {"fan_in_fan_out", false},
            {"init_lora_weights", true},
            {"inference_mode", true},
            {"modules_to_save", nullptr}};
  save_tensors((fs::path(dir) / "adapter_model.safetensors").string(), tensors, {{"format", "pt"}});
  atomic_write_string((fs::path(dir) / "adapter_config.json").string(), j.dump(2) + "\n");
}

PeftConfig read_peft_config(const std::string& dir) {
  const std::string path = (fs::path(dir) / "adapter_config.json").string();
  QLORA_CHECK(fs::is_directory(dir), dir, ": adapter directory not found", relative_path_note(dir));
  QLORA_CHECK(fs::exists(path), path, ": not found (a PEFT adapter directory needs adapter_config.json)");
  const json j = read_json_object_file(path);
  auto str = [&](const char* k, const std::string& d) {
    auto it = j.find(k);
    if (it == j.end() || it->is_null()) return d;
    QLORA_CHECK(it->is_string(), path, ": field '", k, "': expected a string, got ", it->dump());
    return it->get<std::string>();
  };
  auto num = [&](const char* k, double d) {
    auto it = j.find(k);
    if (it == j.end() || it->is_null()) return d;
    QLORA_CHECK(it->is_number(), path, ": field '", k, "': expected a number, got ", it->dump());
    return it->get<double>();
  };
  const std::string type = str("peft_type", "");
  QLORA_CHECK(type == "LORA", path, ": field 'peft_type': expected \"LORA\", got \"", type, "\"");
  const std::string bias = str("bias", "none");
  QLORA_CHECK(bias == "none", path, ": field 'bias': only \"none\" is supported, got \"", bias, "\"");
  PeftConfig c;
  auto r = j.find("r");
  QLORA_CHECK(r != j.end() && r->is_number_integer() && r->get<int64_t>() > 0, path,
              ": field 'r': expected a positive integer");
  c.r = r->get<int64_t>();
  c.lora_alpha = num("lora_alpha", 8);
  c.lora_dropout = num("lora_dropout", 0);
  c.base_model_name_or_path = str("base_model_name_or_path", "");
  auto rs = j.find("use_rslora");
  if (rs != j.end() && !rs->is_null()) {
    QLORA_CHECK(rs->is_boolean(), path, ": field 'use_rslora': expected true/false");
    c.use_rslora = rs->get<bool>();
  }
  auto tm = j.find("target_modules");
  if (tm != j.end() && tm->is_string()) {
    if (tm->get<std::string>() == kAllLinear) c.target_modules = {kAllLinear};
    else c.target_regex = tm->get<std::string>();
  } else if (tm != j.end() && tm->is_array()) {
    for (const json& t : *tm) {
      QLORA_CHECK(t.is_string(), path, ": field 'target_modules': expected strings");
      c.target_modules.push_back(t.get<std::string>());
    }
  }
  auto em = j.find("exclude_modules");
  if (em != j.end() && em->is_string()) c.exclude_regex = em->get<std::string>();
  else if (em != j.end() && em->is_array())
    for (const json& t : *em) {
      QLORA_CHECK(t.is_string(), path, ": field 'exclude_modules': expected strings");
      c.exclude_modules.push_back(t.get<std::string>());
    }
  auto lt = j.find("layers_to_transform");
  if (lt != j.end() && lt->is_number_integer()) c.layers_to_transform = {lt->get<int64_t>()};
  else if (lt != j.end() && lt->is_array())
    for (const json& t : *lt) {
      QLORA_CHECK(t.is_number_integer(), path, ": field 'layers_to_transform': expected integers, got ", t.dump());
      c.layers_to_transform.push_back(t.get<int64_t>());
    }
  else QLORA_CHECK(lt == j.end() || lt->is_null(), path, ": field 'layers_to_transform': expected an integer or a list");
  auto lp = j.find("layers_pattern");
  if (lp != j.end() && lp->is_string()) {
    if (!lp->get<std::string>().empty()) c.layers_pattern = {lp->get<std::string>()};
  } else if (lp != j.end() && lp->is_array()) {
    for (const json& t : *lp) {
      QLORA_CHECK(t.is_string(), path, ": field 'layers_pattern': expected strings");
      c.layers_pattern.push_back(t.get<std::string>());
    }
  }
  // Fields that would change the result and are not implemented: refused, never ignored.
  for (const char* k : {"rank_pattern", "alpha_pattern"}) {
    auto it = j.find(k);
    QLORA_CHECK(it == j.end() || it->is_null() || it->empty(), path, ": field '", k,
                "' is not empty: per-module ranks / alphas are not supported");
  }
  // PEFT's modules_to_save (Axolotl's lora_modules_to_save): whole trained copies of modules
  // (lm_head, embed_tokens) saved beside the LoRA tensors; without this check they surfaced as an
  // "unexpected key" of adapter_model.safetensors.
  if (auto ms = j.find("modules_to_save"); ms != j.end() && !ms->is_null() && !(ms->is_array() && ms->empty()))
    fail(path, ": field 'modules_to_save' is ", ms->dump(), ": not supported (whole trained copies of modules, as PEFT's "
         "modules_to_save and Axolotl's lora_modules_to_save save them beside the LoRA tensors; only lora_A / lora_B "
         "are read)");
  for (const char* k : {"use_dora", "fan_in_fan_out"}) {
    auto it = j.find(k);
    QLORA_CHECK(it == j.end() || it->is_null() || (it->is_boolean() && !it->get<bool>()), path, ": field '", k,
                "' is ", it == j.end() ? "" : it->dump(), ": not supported");
  }
  return c;
}

LoraWeights load_peft_adapter(const std::string& dir, const PeftConfig& c, const ModuleShapes& expected,
                              const std::string& selected_by) {
  const std::string path = (fs::path(dir) / "adapter_model.safetensors").string();
  // PEFT's save_pretrained(safe_serialization=False) writes adapter_model.bin, a pickle: never read.
  QLORA_CHECK(fs::exists(path), path, ": not found",
              fs::exists(fs::path(dir) / "adapter_model.bin")
                  ? " (adapter_model.bin is there: a pickle, which is not read; save the adapter with PEFT's default "
                    "safe_serialization=True, or convert it with safetensors.torch.save_file)"
                  : "");
  st::SafetensorsFile f(path);
  QLORA_CHECK(!f.tensors().empty(), path, ": the adapter has no tensors");
  std::vector<std::string> problems;
  std::set<std::string> seen_modules;
  LoraWeights out;
  for (const st::TensorInfo& t : f.tensors()) {
    const bool a = ends_with(t.name, kSuffixA), b = ends_with(t.name, kSuffixB);
    if (t.name.rfind(kPrefix, 0) != 0 || !(a || b)) {
      problems.push_back("unexpected key '" + t.name + "'");
      continue;
    }
    const std::string module = t.name.substr(kPrefix.size(), t.name.size() - kPrefix.size() - kSuffixA.size());
    auto it = expected.find(module);
    if (it == expected.end()) {
      problems.push_back("unexpected key '" + t.name + "' (not a module of this model that " + selected_by +
                         " selects)");
      continue;
    }
    const auto [in, out_f] = it->second;
    const std::vector<int64_t> want = a ? std::vector<int64_t>{c.r, in} : std::vector<int64_t>{out_f, c.r};
    if (t.shape != want) {
      problems.push_back("'" + t.name + "' has shape " + c10::str(c10::IntArrayRef(t.shape)) + ", expected " +
                         c10::str(c10::IntArrayRef(want)));
      continue;
    }
    torch::Tensor v = load_tensor(f, t).to(torch::kFloat32).clone();
    (a ? out[module].first : out[module].second) = v;
    seen_modules.insert(module);
  }
  for (const auto& [module, ab] : out)
    if (!ab.first.defined() || !ab.second.defined())
      problems.push_back("module '" + module + "' lacks lora_" + (ab.first.defined() ? "B" : "A"));
  for (const auto& [module, shape] : expected)
    if (!seen_modules.count(module)) problems.push_back("missing key '" + peft_key(module, true) + "'");
  if (!problems.empty()) {
    std::string msg;
    const size_t show = std::min<size_t>(problems.size(), 5);
    for (size_t i = 0; i < show; ++i) msg += (i ? "; " : "") + problems[i];
    if (problems.size() > show) msg += "; and " + std::to_string(problems.size() - show) + " more";
    fail(path, ": adapter does not fit the model: ", msg);
  }
  return out;
}

}  // namespace qlora
