// `qlora inspect`, `qlora generate`, `qlora init-model`.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <typeinfo>

#include "common/error.h"
#include "common/files.h"
#include "common/format.h"
#include "common/log.h"
#include "common/proc_status.h"
#include "common/safetensors.h"
#include "common/tensor_io.h"
#include "common/utf8.h"
#include "data/reader.h"
#include "data/template.h"
#include "data/tokenizer.h"
#include "cli/adapter_run.h"
#include "cli/commands.h"
#include "model/generate.h"
#include "model/model.h"

namespace qlora {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

/// LlamaModel::load(dir, dtype, device, q) for the commands whose quant type comes from --quant
/// (inspect, generate): load names a request that disagrees with a stored bitsandbytes type as the
/// config key ("quantization.method: fp4 was requested, but ..."); here it is "--quant fp4 was
/// requested, but ...". Throws qlora::Error as load.
LlamaModel load_with_quant_flag(const std::string& dir, torch::Dtype dtype, torch::Device device, const QuantOptions& q) {
  try {
    return LlamaModel::load(dir, dtype, device, q);
  } catch (const Error& e) {
    const std::string msg = e.what(), key = "quantization.method: ";
    if (typeid(e) != typeid(Error) || msg.rfind(key, 0) != 0) throw;
    throw Error("--quant " + msg.substr(key.size()));
  }
}

/// Component of an HF weight name: embed_tokens | attention | mlp | norms | lm_head | other.
std::string component_of(const std::string& name) {
  if (name.find("embed_tokens") != std::string::npos) return "embed_tokens";
  if (name.find(".self_attn.") != std::string::npos) return "attention";
  if (name.find(".mlp.") != std::string::npos) return "mlp";
  if (name.find("norm") != std::string::npos) return "norms";
  if (name.rfind("lm_head", 0) == 0) return "lm_head";
  return "other";
}

/// `inspect --quant`: loads (quantizing while streaming) and accounts bytes per component.
std::string inspect_quantized(const InspectOptions& o) {
  QuantOptions q;
  q.quant_type = parse_quant_method(o.quant);
  QLORA_CHECK(q.enabled(), "inspect: --quant must be nf4 or fp4, got '", o.quant, "'");
  q.blocksize = o.blocksize;
  q.double_quant = o.double_quant;
  const ModelConfig cfg = load_model_config(o.model_dir);
  const torch::Dtype dtype = torch_dtype(stored_dtype(cfg.torch_dtype), torch::kCPU);
  const auto t0 = std::chrono::steady_clock::now();
  const LlamaModel m = load_with_quant_flag(o.model_dir, dtype, torch::kCPU, q);
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  int64_t q_params = 0, q_packed = 0, q_consts = 0, f_params = 0, f_bytes = 0, n_quantized = 0;
  std::set<std::string> qtypes;
  auto add_plain = [&](const torch::Tensor& t) {
    if (!t.defined()) return;
    f_params += t.numel();
    f_bytes += t.numel() * static_cast<int64_t>(t.element_size());
  };
  for (const FrozenLinear* l : m.linears()) {
    add_plain(l->bias);
    if (!l->quantized()) {
      add_plain(l->weight);
      continue;
    }
    const QuantizedWeight& w = *l->qweight;
    q_params += w.numel();
    q_packed += w.packed.numel();
    q_consts += w.bytes() - w.packed.numel();
    ++n_quantized;
    qtypes.insert(std::string(kernels::quant_type_name(w.type)) + " bs" + std::to_string(w.blocksize) +
                  (w.double_quant ? " dq" : ""));
  }
  add_plain(m.embed_tokens);
  add_plain(m.norm);
  if (!cfg.tie_word_embeddings) add_plain(m.lm_head);
  for (const DecoderLayer& l : m.layers) {
    add_plain(l.input_layernorm);
    add_plain(l.post_attention_layernorm);
  }
  const int64_t params = q_params + f_params, total = q_packed + q_consts + f_bytes;
  const double bits_q = q_params ? 8.0 * static_cast<double>(q_packed + q_consts) / q_params : 0.0;
  const double bits_all = params ? 8.0 * static_cast<double>(total) / params : 0.0;
  const double rule = 0.5 * static_cast<double>(params);
  const int64_t rss = peak_rss_bytes();

  json j;
  j["model_dir"] = o.model_dir;
  j["quant"] = {{"method", o.quant}, {"blocksize", o.blocksize}, {"double_quant", o.double_quant},
                {"stored", std::vector<std::string>(qtypes.begin(), qtypes.end())}};
  j["unquantized_dtype"] = cfg.torch_dtype;
  j["parameters"] = params;
  j["components"]["quantized_weights"] = {{"parameters", q_params}, {"bytes", q_packed}, {"tensors", n_quantized}};
  j["components"]["quantization_constants"] = {{"bytes", q_consts}};
  j["components"]["unquantized_modules"] = {{"parameters", f_params}, {"bytes", f_bytes}};
  j["bytes"] = total;
  j["bits_per_param"] = bits_all;
  j["bits_per_quantized_param"] = bits_q;
  j["rule_of_thumb_bytes"] = static_cast<int64_t>(rule);
  j["ratio_to_rule_of_thumb"] = rule > 0 ? static_cast<double>(total) / rule : 0.0;
  j["peak_rss_bytes"] = rss;
  j["load_seconds"] = load_s;
  std::ostringstream os;
  if (o.json) {
    os << j.dump(2) << "\n";
    return os.str();
  }
  std::string stored;
  for (const auto& s : qtypes) stored += (stored.empty() ? "" : ", ") + s;
  os << o.model_dir << ": " << n_quantized << " linear weights in 4 bits (" << stored
     << "), the rest " << cfg.torch_dtype << "; loaded in " << std::fixed << std::setprecision(1)
     << load_s << " s\n";
  os << std::left << std::setw(26) << "component" << std::right << std::setw(16) << "parameters"
     << std::setw(14) << "bytes" << "\n";
  auto row = [&](const std::string& name, const std::string& p, int64_t b) {
    os << std::left << std::setw(26) << name << std::right << std::setw(16) << p << std::setw(14)
       << human_bytes(static_cast<double>(b)) << "\n";
  };
  row("quantized weights", std::to_string(q_params), q_packed);
  row("quantization constants", "", q_consts);
  row("unquantized modules", std::to_string(f_params), f_bytes);
  row("total", std::to_string(params), total);
  os << std::setprecision(3) << "bits/param: " << bits_all << " overall, " << bits_q
     << " for the quantized weights\n";
  os << "rule of thumb (params x 0.5 byte): " << human_bytes(rule) << "; actual is "
     << std::setprecision(3) << (rule > 0 ? total / rule : 0.0) << "x\n";
  os << "peak RSS of this process: " << human_bytes(static_cast<double>(rss)) << "\n";
  return os.str();
}

}  // namespace

std::string cmd_inspect(const InspectOptions& o) {
  if (!o.quant.empty()) return inspect_quantized(o);
  const ModelConfig cfg = load_model_config(o.model_dir);
  st::SafetensorsCheckpoint ckpt(o.model_dir);
  check_tied_lm_head(ckpt, cfg, o.model_dir);
  // what train / eval / generate would refuse (inspect showed an untied config without lm_head.weight
  // as if it loaded, session 22)
  const std::vector<std::string> missing = missing_weights(ckpt, cfg);
  const std::vector<MisshapenWeight> misshapen = misshapen_weights(ckpt, cfg);
  struct Comp {
    int64_t params = 0, bytes = 0, tensors = 0;
    std::set<std::string> dtypes;
  };
  std::map<std::string, Comp> comps;
  Comp total;
  // A bitsandbytes 4-bit linear is stored as packed bytes plus absmax / quant_map / [nested_*] /
  // quant_state entries: it counts as one tensor of its quant_state's shape, with all its entries'
  // bytes as stored.
  std::map<std::string, Bnb4StoredWeight> bnb;
  std::set<std::string> bnb_parts, bnb_kinds;
  int64_t bnb_params = 0, bnb_bytes = 0;
  for (const std::string& name : ckpt.names())
    if (std::optional<Bnb4StoredWeight> w = bnb4_stored_weight(ckpt, name)) {
      bnb_parts.insert(w->tensors.begin() + 1, w->tensors.end());
      const QuantizedWeight& h = w->header;
      bnb_kinds.insert(std::string(kernels::quant_type_name(h.type)) + " blocksize " + std::to_string(h.blocksize) +
                       (h.double_quant ? ", double quant" : ""));
      bnb_params += h.numel();
      bnb_bytes += w->stored_bytes;
      bnb.emplace(name, std::move(*w));
    }
  for (const std::string& name : ckpt.names()) {
    if (bnb_parts.count(name)) continue;  // counted with its weight
    const st::TensorInfo& t = ckpt.info(name);
    const auto q = bnb.find(name);
    const int64_t params = q != bnb.end() ? q->second.header.numel() : t.numel();
    const int64_t bytes = q != bnb.end() ? q->second.stored_bytes : static_cast<int64_t>(t.nbytes());
    std::string dtype = st::dtype_name(t.dtype);
    if (q != bnb.end()) {
      dtype = kernels::quant_type_name(q->second.header.type);
      std::transform(dtype.begin(), dtype.end(), dtype.begin(), [](unsigned char ch) { return std::toupper(ch); });
    }
    Comp& c = comps[component_of(name)];
    for (Comp* x : {&c, &total}) {
      x->params += params;
      x->bytes += bytes;
      x->tensors += 1;
      x->dtypes.insert(dtype);
    }
  }
  std::string bnb_kind;
  for (const std::string& k : bnb_kinds) bnb_kind += (bnb_kind.empty() ? "" : "; ") + k;
  json j;
  j["model_dir"] = o.model_dir;
  j["architecture"] = cfg.architecture;
  j["config"] = cfg.to_hf_json();
  j["shards"] = ckpt.num_shards();
  j["parameters"] = total.params;
  j["parameters_expected"] = cfg.num_parameters();
  j["bytes"] = total.bytes;
  if (!bnb.empty())
    j["bnb_4bit"] = {{"weights", bnb.size()}, {"format", bnb_kind}, {"parameters", bnb_params}, {"stored_bytes", bnb_bytes}};
  for (const auto& [name, c] : comps)
    j["components"][name] = {{"parameters", c.params}, {"bytes", c.bytes}, {"tensors", c.tensors},
                             {"dtypes", std::vector<std::string>(c.dtypes.begin(), c.dtypes.end())}};
  j["missing_tensors"] = missing;
  j["misshapen_tensors"] = json::array();
  for (const MisshapenWeight& w : misshapen)
    j["misshapen_tensors"].push_back({{"name", w.name}, {"expected_shape", w.expected}, {"shape", w.stored}});
  std::ostringstream os;
  if (o.json) {
    os << j.dump(2) << "\n";
  } else {
    os << o.model_dir << ": " << cfg.architecture << ", " << cfg.num_hidden_layers << " layers, hidden "
       << cfg.hidden_size << ", intermediate " << cfg.intermediate_size << ", heads "
       << cfg.num_attention_heads << " (kv " << cfg.num_key_value_heads << ", head_dim " << cfg.head_dim
       << "), vocab " << cfg.vocab_size << ", rope " << cfg.rope.type << " theta " << cfg.rope.theta
       << (cfg.tie_word_embeddings ? ", tied embeddings" : "")
       << (cfg.sliding_window > 0 ? ", sliding window " + std::to_string(cfg.sliding_window) : "") << ", " << ckpt.num_shards()
       << " shard(s)\n";
    if (!bnb.empty())
      os << bnb.size() << " linear weights stored by bitsandbytes in 4 bits (" << bnb_kind << "): "
         << bnb_params << " parameters (their quant_state shapes), " << human_bytes(static_cast<double>(bnb_bytes))
         << " stored (packed weights + absmax, quant_map, quant_state)\n";
    os << std::left << std::setw(14) << "component" << std::right << std::setw(16) << "parameters"
       << std::setw(14) << "stored bytes" << "  dtypes\n";
    auto row = [&](const std::string& name, const Comp& c) {
      std::string d;
      for (const auto& x : c.dtypes) d += (d.empty() ? "" : ",") + x;
      os << std::left << std::setw(14) << name << std::right << std::setw(16) << c.params << std::setw(14)
         << human_bytes(static_cast<double>(c.bytes)) << "  " << d << "\n";
    };
    for (const auto& [name, c] : comps) row(name, c);
    row("total", total);
    std::vector<std::string> problems;  // in load's order of checks: presence, then shapes
    for (const std::string& name : missing) problems.push_back(missing_weight_message(name));
    for (const MisshapenWeight& w : misshapen) problems.push_back(w.message());
    if (!problems.empty()) {
      os << "not loadable (train, eval and generate refuse this directory): " << problems[0];
      if (problems.size() > 1) os << ", and " << problems.size() - 1 << " more (--json lists them all)";
      os << "\n";
    }
  }
  return os.str();
}

void cmd_generate(const GenerateCliOptions& o, std::ostream& out) {
  GenerationConfig flags = o.flags;
  if (o.greedy) flags.do_sample = false;
  if (o.do_sample) flags.do_sample = true;
  check_generate_options(o.gen);  // a bad flag is named before anything loads (--stop here; the rest:)
  resolve_generate_options(flags, GenerationConfig{}, "generation_config.json");
  QLORA_CHECK(o.prompts_file.empty() || !o.print_ids,
              "generate: --ids prints one prompt's ids; --prompts writes them in each JSON line's \"ids\"");
  // --prompt / --system / --stop: UTF-8, as tokenize --text and --prompts lines are (the text was
  // silently decoded with U+FFFD before, trial 21)
  require_utf8(o.prompt, "generate: --prompt");
  require_utf8(o.system, "generate: --system");
  for (const std::string& stop : o.gen.stop_strings) require_utf8(stop, "generate: --stop");
  // --prompts: every line checked before the model loads; --prompt: one prompt
  const std::vector<data::PromptLine> prompts =
      o.prompts_file.empty() ? std::vector<data::PromptLine>{data::PromptLine{o.prompt, std::nullopt, 0}}
                             : data::read_prompts_jsonl(o.prompts_file);
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  const ModelConfig model_cfg = load_model_config(o.model_dir);  // a missing dir / config.json is named before the tokenizer's files
  data::Tokenizer tok = data::Tokenizer::from_pretrained(o.model_dir);
  check_tokenizer_fits(model_cfg, tok.vocab_size());  // as train and eval (an id past it crashed in torch, trial 24)
  // Decoding as transformers' model.generate(input_ids) with this model dir: each flag given, else
  // generation_config.json's value, else transformers' default (model/generation_config.h).
  const std::string gc_path = (fs::path(o.model_dir) / "generation_config.json").string();
  const ResolvedGenerate decoding = resolve_generate_options(flags, read_generation_config(o.model_dir), gc_path);
  GenerateOptions g = decoding.opts;
  g.seed = o.gen.seed;
  g.stop_strings = o.gen.stop_strings;
  g.eos_token_ids = o.gen.eos_token_ids;
  // The settings used: the flags, else (an adapter trained here) its run's template, system message
  // and quantization (adapter_run_keys() with for_prompt, as eval takes them), else raw / none.
  Config used;
  used.data.template_name = "raw";
  used.data.default_system_message.clear();
  used.quantization.quant_type = std::nullopt;
  used.model.dtype = parse_dtype(o.dtype);
  std::optional<AdapterRun> run;
  if (!o.adapter.empty()) {
    QLORA_CHECK(fs::is_directory(o.adapter), o.adapter, ": adapter directory not found", relative_path_note(o.adapter));
    run = read_adapter_run(o.adapter, "generate");
  }
  if (run) {
    apply_adapter_run(run->config, used, /*prompt_only=*/true);
    // A raw-text run (format completion, set or detected from its files, or truncation split, which
    // only raw text takes) was trained on plain text: its prompt is plain text too, whatever
    // data.template says.
    const data::DataOptions& rd = run->config.data;
    if (rd.format == "completion" || rd.truncation == "split" || run->data_format == "completion")
      used.data.template_name = "raw";
  }
  if (!o.template_name.empty()) {  // named before any line that would name it (trial 21)
    data::check_template_name(o.template_name, "generate: --template", {"auto", "raw"});
    used.data.template_name = o.template_name;
  }
  if (o.has_system) used.data.default_system_message = o.system;
  if (!o.quant.empty()) {
    used.quantization = QuantOptions{};
    used.quantization.quant_type = parse_quant_method(o.quant);
  }
  if (o.dtype != "auto") used.model.dtype = parse_dtype(o.dtype);  // --dtype auto is the default: the run's wins
  if (run) {
    const auto flag = [&](const std::string& k) -> std::string {
      if (k == "data.template" && !o.template_name.empty()) return "--template";
      if (k == "data.template" && used.data.template_name != run->config.data.template_name)
        return "the run's data (raw text)";
      if (k == "data.default_system_message" && o.has_system) return "--system";
      if (k == "quantization" && !o.quant.empty()) return "--quant";
      if (k == "model.dtype" && o.dtype != "auto") return "--dtype";
      return "";
    };
    for (const std::string& line : adapter_run_log(*run, used, /*prompt_only=*/true, flag))
      log::info("generate: ", line);
  }
  const bool raw = used.data.template_name == "raw";
  QLORA_CHECK(!raw || !o.has_system || o.system.empty(), "generate: --system needs --template NAME (or auto)");
  // The system text the prompt really renders: data.default_system_message "" means the template's
  // own default where it has one (smollm2, qwen2.5), not "no system message" (issue: a README-only
  // trial read `data.default_system_message ""` while SmolLM2's default was rendered).
  if (!raw) {
    const std::string tpl = data::resolve_template(used.data.template_name, o.model_dir);
    const std::string& sys = used.data.default_system_message;
    const std::string own = data::template_default_system(tpl);
    const auto quote = [](const std::string& t) { return nlohmann::json(t).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); };
    const std::string what =
        o.has_system && sys.empty() ? "\"\" from --system (an empty system turn, as transformers renders "
                                      "{\"role\": \"system\", \"content\": \"\"})"
        : !sys.empty() ? quote(sys) + (o.has_system ? " from --system" : " from the run's data.default_system_message")
        : !own.empty() ? "the template's default " + quote(own) + " (" + tpl +
                             " writes it when a conversation has none; --system TEXT replaces it)"
                       : "none (template " + tpl + ")";
    // --prompts: which lines this is, and that the others render their own (a trial read it as all lines')
    const auto own_system = std::count_if(prompts.begin(), prompts.end(), [](const data::PromptLine& p) { return p.system.has_value(); });
    log::info("generate: system message: ", what,
              o.prompts_file.empty() ? std::string()
                                     : " (for the " + std::to_string(prompts.size() - own_system) + " of " +
                                           std::to_string(prompts.size()) + " lines without \"system\"; the other " +
                                           std::to_string(own_system) + " render their own)");
    // transformers' apply_chat_template(add_generation_prompt=True) on Qwen3 opens a thinking turn by
    // default; our prompt is its enable_thinking=False one, which a comparison must pass (trial 22)
    if (tpl == "qwen3")
      log::info("generate: prompt: qwen3's non-thinking generation prompt (transformers' apply_chat_template(..., "
                "add_generation_prompt=True, enable_thinking=False); docs/data.md, \"Chat prompts\")");
  }
  std::vector<std::vector<int64_t>> prompt_ids;
  bool warned_positions = false;  // once per invocation
  std::vector<int64_t> max_new;  // per prompt: max_length - its length when the file's max_length rules
  for (const data::PromptLine& p : prompts) {
    QLORA_CHECK(!raw || !p.system || p.system->empty(), o.prompts_file, ":", p.line,
                ": system: needs --template NAME (or auto); the prompt is raw text");
    // a line's "system" or --system, even "" (an empty system turn, as transformers renders
    // {"role": "system", "content": ""}; trial 21), else the run's default_system_message when set,
    // else none (the template's own default, where it has one)
    const std::optional<std::string> system =
        p.system ? p.system
        : o.has_system ? std::optional<std::string>(o.system)
        : !used.data.default_system_message.empty() ? std::optional<std::string>(used.data.default_system_message)
                                                    : std::nullopt;
    const data::TokenIds ids_in =
        raw ? tok.encode_with_special_tokens(p.prompt)  // = transformers' tokenizer(prompt): BOS as the tokenizer adds it
            : data::chat_prompt(tok, data::resolve_template(used.data.template_name, o.model_dir), system, p.prompt);
    // an empty text under a tokenizer that adds no BOS: nothing to condition on (named before loading)
    QLORA_CHECK(!ids_in.empty(), o.prompts_file.empty() ? "generate: --prompt" : o.prompts_file + ":" +
                std::to_string(p.line) + ": prompt", ": no tokens to continue (the text is empty and the tokenizer adds no BOS)");
    // generation_config.json's max_length counts the prompt: one that fills it is named before loading
    const int64_t len = static_cast<int64_t>(ids_in.size());
    QLORA_CHECK(!decoding.max_length || len < *decoding.max_length, o.prompts_file.empty() ? "generate: --prompt" :
                o.prompts_file + ":" + std::to_string(p.line) + ": prompt", ": ", len, " tokens leave no new token under ",
                gc_path, "'s max_length ", decoding.max_length.value_or(0),
                " (transformers counts the prompt in max_length; pass --max-new-tokens)");
    max_new.push_back(decoding.new_tokens_for(len));
    // past the positions the model was trained on: decoded all the same, as transformers does, with
    // its warning (trial 21: nothing was said)
    if (len + max_new.back() > model_cfg.max_position_embeddings && !warned_positions) {
      warned_positions = true;
      log::warn("generate: ", o.prompts_file.empty() ? "--prompt" : o.prompts_file + ":" + std::to_string(p.line),
                ": ", len, " prompt tokens + up to ", max_new.back(), " new ones pass the model's max_position_embeddings ",
                model_cfg.max_position_embeddings, " (config.json); decoding goes on, but the model was not trained on "
                "those positions (transformers warns the same)");
    }
    prompt_ids.emplace_back(ids_in.begin(), ids_in.end());
  }
  log::info("generate: ", decoding.summary);  // after the prompts' errors, which stand alone
  const QuantOptions& q = used.quantization;
  // The compute dtype, said with where it came from: transformers 5's from_pretrained keeps the
  // stored dtype, so `auto` (fp32 on a CPU) decodes otherwise than its default load of a bf16 dir
  // (trial 21: 4 of 10 prompts differed, and nothing said which dtype ran).
  const torch::Dtype dtype = torch_dtype(used.model.dtype, device);
  const DType compute = resolve_dtype(used.model.dtype, device.is_cuda());
  const DType stored = stored_dtype(model_cfg.torch_dtype);
  const std::string auto_rule = device.is_cuda() ? "auto: bf16 on CUDA" : "auto: fp32 on a CPU";
  const std::string from = o.dtype != "auto" ? "--dtype"
                           : run ? (used.model.dtype == DType::kAuto ? auto_rule + ", " : std::string()) +
                                       "the adapter's training run"
                                 : auto_rule;
  log::info("generate: compute dtype ", dtype_name(compute), " (", from, ")",
            stored != compute ? std::string("; ") + o.model_dir + " stores " + dtype_name(stored) +
                                    ", which transformers' from_pretrained keeps by default (--dtype " + dtype_name(stored) +
                                    " decodes as it does)"
                              : std::string(),
            "; quantization ", quant_method_name(q.quant_type));
  LlamaModel model = load_with_quant_flag(o.model_dir, dtype, device, q);
  if (!o.adapter.empty()) attach_peft_adapter(model, o.adapter);  // dropout off
  // Dequantize the 4-bit linears once rather than at every decode step (same values: eval does the
  // same, RealModelParity.SmolLM2Nf4GreedyDecodeCachedDequantMatchesTransformers), within 2 GiB.
  if (q.enabled()) model.cache_dequantized(int64_t{2} << 30);
  if (g.eos_token_ids.empty()) g.eos_token_ids.assign(tok.eos_ids().begin(), tok.eos_ids().end());
  // The text of ids (the new ids; for stop strings the prompt's tail too): EOS ids left out (they
  // end generation and are not text)
  const auto text_of = [&](const std::vector<int64_t>& ids) {
    data::TokenIds t;
    for (int64_t id : ids)
      if (std::find(g.eos_token_ids.begin(), g.eos_token_ids.end(), id) == g.eos_token_ids.end())
        t.push_back(static_cast<int32_t>(id));
    return tok.decode(t);
  };
  // The --system hint of an empty answer: only where the adapter's run trained on records with a
  // system message of their own, or where that is not known (a base model, a plain PEFT adapter,
  // an older run); a run whose records had none is not sent after a system message.
  const int64_t system_records = run ? run->data_system_records : -1;
  const std::string system_hint =
      system_records > 0 ? "; the adapter's run trained on " + std::to_string(system_records) +
                               " records with a system message of their own: pass --system TEXT (theirs)"
      : system_records < 0 ? std::string("; a model trained on records with their own system message may need it: "
                                         "pass --system TEXT")
                           : std::string();
  for (size_t i = 0; i < prompts.size(); ++i) {
    g.max_new_tokens = max_new[i];
    const Generation r = generate(model, prompt_ids[i], g, text_of);
    // EOS as the first new token: an empty answer with exit 0 looks like a silent failure; say so
    if (r.finish_reason == FinishReason::eos && r.ids.size() <= 1)
      log::warn("generate: ", o.prompts_file.empty() ? std::string("--prompt") : o.prompts_file + ":" +
                std::to_string(prompts[i].line), ": no text: the model's first new token was EOS (id ",
                r.ids.empty() ? -1 : r.ids[0], "; finish_reason eos after 0 tokens)",
                raw || o.has_system || prompts[i].system ? std::string() : system_hint);
    if (o.prompts_file.empty()) {
      if (o.print_ids) {
        for (size_t k = 0; k < r.ids.size(); ++k) out << (k ? " " : "") << r.ids[k];
        out << "\n";
      } else {
        out << text_of(r.ids) << "\n";
      }
      log::debug("generate: finish_reason ", finish_reason_name(r.finish_reason));
    } else {
      // ordered: the keys in this order; invalid UTF-8 (a byte-fallback character cut by the
      // length limit) written as U+FFFD rather than failing the line
      const nlohmann::ordered_json line = {{"prompt", prompts[i].prompt}, {"output", text_of(r.ids)},
                                           {"ids", r.ids}, {"finish_reason", finish_reason_name(r.finish_reason)}};
      out << line.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n" << std::flush;
    }
  }
}

void cmd_init_model(const InitModelOptions& o) {
  QLORA_CHECK(!o.out_dir.empty(), "init-model: --out is required");
  QLORA_CHECK(o.tokenizer.empty() || o.train_tokenizer.empty(),
              "init-model: give --tokenizer or --train-tokenizer, not both");
  QLORA_CHECK(!fs::exists(o.out_dir) || fs::is_empty(o.out_dir), o.out_dir,
              ": exists and is not empty; refusing to overwrite it");
  ModelConfig cfg = preset_config(o.preset);
  const fs::path tmp = o.out_dir + ".tmp-" + std::to_string(::getpid());
  qlora::remove_tree(tmp);
  fs::create_directories(tmp);
  try {
    std::string tok_model;
    if (!o.tokenizer.empty()) {
      check_regular_file(o.tokenizer);
      QLORA_CHECK(fs::is_regular_file(o.tokenizer), o.tokenizer, ": tokenizer model not found");
      fs::copy_file(o.tokenizer, tmp / "tokenizer.model");
    } else if (!o.train_tokenizer.empty()) {
      check_regular_file(o.train_tokenizer);
      QLORA_CHECK(fs::is_regular_file(o.train_tokenizer), o.train_tokenizer, ": corpus not found");
      const std::string prefix = (tmp / "tokenizer").string();
      data::Tokenizer::train({o.train_tokenizer}, o.vocab_size > 0 ? o.vocab_size : 2000, prefix);
      fs::remove(prefix + ".vocab");
    }
    if (fs::exists(tmp / "tokenizer.model")) {
      data::Tokenizer tok((tmp / "tokenizer.model").string());
      cfg.vocab_size = tok.vocab_size();
      cfg.bos_token_id = tok.bos_id();
      cfg.eos_token_id = tok.eos_id();
      json tc = {{"tokenizer_class", "LlamaTokenizer"}, {"bos_token", tok.id_to_piece(tok.bos_id())},
                 {"eos_token", tok.id_to_piece(tok.eos_id())}, {"unk_token", tok.id_to_piece(tok.unk_id())},
                 {"add_bos_token", true}, {"add_eos_token", false}, {"legacy", true}};
      atomic_write_string((tmp / "tokenizer_config.json").string(), tc.dump(2) + "\n");
    }
    if (!o.dtype.empty()) {
      QLORA_CHECK(o.dtype == "fp32" || o.dtype == "bf16" || o.dtype == "fp16",
                  "init-model: --dtype must be fp32, bf16 or fp16, got '", o.dtype, "'");
      cfg.torch_dtype = hf_dtype_name(parse_dtype(o.dtype));
    }
    const torch::Dtype dtype = torch_dtype(stored_dtype(cfg.torch_dtype), torch::kCPU);
    log::info("init-model: preset ", o.preset, " (", cfg.num_parameters(), " parameters), ",
              cfg.torch_dtype, ", seed ", o.seed);
    LlamaModel m = LlamaModel::random_init(cfg, o.seed, dtype, torch::kCPU);
    save_tensors((tmp / "model.safetensors").string(), m.named_tensors(), {{"format", "pt"}});
    atomic_write_string((tmp / "config.json").string(), cfg.to_hf_json().dump(2) + "\n");
    json gc = {{"bos_token_id", cfg.bos_token_id}, {"eos_token_id", cfg.eos_token_id}};
    atomic_write_string((tmp / "generation_config.json").string(), gc.dump(2) + "\n");
    if (fs::exists(o.out_dir)) fs::remove(o.out_dir);  // empty, checked above
    fs::rename(tmp, o.out_dir);
  } catch (...) {
    std::error_code ec;
    qlora::remove_tree(tmp, ec);
    throw;
  }
  log::info("init-model: wrote ", o.out_dir);
}

}  // namespace qlora
