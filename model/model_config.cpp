#include "model/model_config.h"

#include <filesystem>
#include <set>

#include "common/error.h"
#include "common/json_file.h"
#include "common/gguf.h"
#include "common/files.h"

namespace qlora {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Typed field access with errors that name the file and the field.
struct Reader {
  const json& j;
  const std::string& src;

  const json* find(const char* key) const {
    auto it = j.find(key);
    return (it == j.end() || it->is_null()) ? nullptr : &*it;
  }
  int64_t integer(const char* key) const {
    const json* v = find(key);
    QLORA_CHECK(v, src, ": missing required field '", key, "'");
    QLORA_CHECK(v->is_number_integer(), src, ": field '", key, "': expected an integer, got ", v->dump());
    return v->get<int64_t>();
  }
  int64_t integer(const char* key, int64_t dflt) const { return find(key) ? integer(key) : dflt; }
  double number(const char* key, double dflt) const {
    const json* v = find(key);
    if (!v) return dflt;
    QLORA_CHECK(v->is_number(), src, ": field '", key, "': expected a number, got ", v->dump());
    return v->get<double>();
  }
  bool boolean(const char* key, bool dflt) const {
    const json* v = find(key);
    if (!v) return dflt;
    QLORA_CHECK(v->is_boolean(), src, ": field '", key, "': expected true/false, got ", v->dump());
    return v->get<bool>();
  }
  std::string string(const char* key, const std::string& dflt) const {
    const json* v = find(key);
    if (!v) return dflt;
    QLORA_CHECK(v->is_string(), src, ": field '", key, "': expected a string, got ", v->dump());
    return v->get<std::string>();
  }
  // Token ids may be an int or a list of ints (eos in Llama 3); the first is used.
  int64_t token_id(const char* key, int64_t dflt) const {
    const json* v = find(key);
    if (!v) return dflt;
    if (v->is_array() && !v->empty() && (*v)[0].is_number_integer()) return (*v)[0].get<int64_t>();
    QLORA_CHECK(v->is_number_integer(), src, ": field '", key, "': expected a token id, got ", v->dump());
    return v->get<int64_t>();
  }
};

RopeConfig parse_rope(const Reader& r) {
  RopeConfig rope;
  // transformers 5.x: rope_parameters {rope_theta, rope_type, ...}; 4.x: rope_theta + rope_scaling.
  const json* params = r.find("rope_parameters");
  if (!params) params = r.find("rope_scaling");
  rope.theta = r.number("rope_theta", 10000.0);
  // transformers reads it at the top level or in the rope section; both are refused the same way
  const auto full_rotary = [&](const Reader& from, const std::string& prefix) {
    const double partial = from.number("partial_rotary_factor", 1.0);
    QLORA_CHECK(partial == 1.0, r.src, ": field '", prefix, "partial_rotary_factor': ", partial,
                " is not supported (only 1.0: rotary embedding over the whole head_dim)");
  };
  full_rotary(r, "");
  if (!params) return rope;
  const char* field = r.find("rope_parameters") ? "rope_parameters" : "rope_scaling";
  QLORA_CHECK(params->is_object(), r.src, ": field '", field, "': expected an object, got ", params->dump());
  const std::string key = std::string(field);
  Reader p{*params, r.src};
  rope.theta = p.number("rope_theta", rope.theta);
  full_rotary(p, key + ".");
  rope.type = p.string("rope_type", p.string("type", "default"));
  if (rope.type == "default") return rope;
  if (rope.type == "linear") {
    rope.factor = p.number("factor", 1.0);
  } else if (rope.type == "llama3") {
    rope.factor = p.number("factor", 8.0);
    rope.low_freq_factor = p.number("low_freq_factor", 1.0);
    rope.high_freq_factor = p.number("high_freq_factor", 4.0);
    rope.original_max_position_embeddings = p.integer("original_max_position_embeddings", 8192);
    QLORA_CHECK(rope.high_freq_factor > rope.low_freq_factor, r.src, ": field '", key,
                ".high_freq_factor' must exceed low_freq_factor");
  } else {
    fail(r.src, ": field '", key, ".rope_type': '", rope.type,
         "' is not supported (supported: default, linear, llama3)");
  }
  QLORA_CHECK(rope.factor > 0, r.src, ": field '", key, ".factor' must be > 0");
  return rope;
}

}  // namespace

ModelConfig parse_model_config(const json& j, const std::string& src) {
  QLORA_CHECK(j.is_object(), src, ": expected a JSON object");
  Reader r{j, src};
  ModelConfig c;
  const json* arch = r.find("architectures");
  QLORA_CHECK(arch && arch->is_array() && !arch->empty() && (*arch)[0].is_string(), src,
              ": missing required field 'architectures' (e.g. [\"LlamaForCausalLM\"])");
  c.architecture = (*arch)[0].get<std::string>();
  if (c.architecture == "LlamaForCausalLM") c.model_type = "llama";
  else if (c.architecture == "MistralForCausalLM") c.model_type = "mistral";
  else if (c.architecture == "Qwen2ForCausalLM") c.model_type = "qwen2";
  else if (c.architecture == "Qwen3ForCausalLM") c.model_type = "qwen3";
  else
    fail(src, ": field 'architectures': '", c.architecture,
         "' is not supported (supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, "
         "Qwen3ForCausalLM)");
  const bool qwen = c.model_type == "qwen2" || c.model_type == "qwen3";

  c.vocab_size = r.integer("vocab_size");
  c.hidden_size = r.integer("hidden_size");
  c.intermediate_size = r.integer("intermediate_size");
  c.num_hidden_layers = r.integer("num_hidden_layers");
  c.num_attention_heads = r.integer("num_attention_heads");
  c.num_key_value_heads = r.integer("num_key_value_heads", c.num_attention_heads);
  QLORA_CHECK(c.num_attention_heads > 0, src, ": field 'num_attention_heads' must be > 0");
  // Qwen3Config's head_dim defaults to 128; the others derive it (transformers: getattr(config,
  // "head_dim", hidden_size // num_attention_heads)).
  c.head_dim = r.integer("head_dim", c.model_type == "qwen3" ? 128 : c.hidden_size / c.num_attention_heads);
  c.rms_norm_eps = r.number("rms_norm_eps", 1e-6);
  c.max_position_embeddings = r.integer("max_position_embeddings", 2048);
  c.rope = parse_rope(r);
  c.tie_word_embeddings = r.boolean("tie_word_embeddings", false);
  if (qwen) {
    // Qwen2: bias on q/k/v always, none on o_proj; Qwen3: attention_bias (default false) on all
    // four, plus q_norm / k_norm. Neither has an MLP bias.
    if (c.model_type == "qwen2") c.qkv_bias = true;
    else c.attention_bias = r.boolean("attention_bias", false);
    c.qk_norm = c.model_type == "qwen3";
    QLORA_CHECK(!r.boolean("use_sliding_window", false), src,
                ": field 'use_sliding_window': true is not supported for ", c.model_type);
    if (const json* lt = r.find("layer_types")) {
      QLORA_CHECK(lt->is_array(), src, ": field 'layer_types': expected a list, got ", lt->dump());
      for (const json& t : *lt)
        QLORA_CHECK(t == "full_attention", src, ": field 'layer_types': ", t.dump(),
                    " is not supported (only full_attention)");
    }
  } else {
    c.attention_bias = r.boolean("attention_bias", false);
    c.mlp_bias = r.boolean("mlp_bias", false);
  }
  if (c.model_type == "mistral") c.sliding_window = r.integer("sliding_window", 0);
  // transformers' ACT2FN maps "swish" to the same SiLU
  const std::string act = r.string("hidden_act", "silu");
  QLORA_CHECK(act == "silu" || act == "swish", src, ": field 'hidden_act': '", act,
              "' is not supported (only silu, or its alias swish)");
  c.attention_dropout = r.number("attention_dropout", 0.0);
  QLORA_CHECK(c.attention_dropout >= 0 && c.attention_dropout < 1, src, ": field 'attention_dropout' must be in [0, 1), got ",
              c.attention_dropout);
  c.torch_dtype = r.string("dtype", r.string("torch_dtype", "float32"));
  c.bos_token_id = r.token_id("bos_token_id", 1);
  c.eos_token_id = r.token_id("eos_token_id", 2);
  c.pad_token_id = r.token_id("pad_token_id", -1);
  c.validate(src);
  return c;
}

void ModelConfig::validate(const std::string& src) const {
  auto positive = [&](int64_t v, const char* name) {
    QLORA_CHECK(v > 0, src, ": field '", name, "' must be > 0, got ", v);
  };
  // Upper bounds far above every open model (Llama 3.1 405B: 126 layers, hidden 16384, 128 heads,
  // intermediate 53248; vocabularies to 262144; contexts to 10M), so that a corrupt or hostile
  // config.json is refused by name at once instead of allocating until bad_alloc (trial 27: 3,000,000
  // layers ran 33 s into std::bad_alloc) or overflowing the parameter count.
  auto at_most = [&](int64_t v, int64_t limit, const char* name) {
    QLORA_CHECK(v <= limit, src, ": field '", name, "' is ", v, ", above the ", limit,
                " this program accepts (no model has so many; a corrupt config.json?)");
  };
  at_most(vocab_size, int64_t{1} << 24, "vocab_size");
  at_most(hidden_size, int64_t{1} << 20, "hidden_size");
  at_most(intermediate_size, int64_t{1} << 22, "intermediate_size");
  at_most(num_hidden_layers, 10000, "num_hidden_layers");
  at_most(num_attention_heads, 16384, "num_attention_heads");
  at_most(num_key_value_heads, 16384, "num_key_value_heads");
  at_most(head_dim, 16384, "head_dim");
  at_most(max_position_embeddings, int64_t{1} << 28, "max_position_embeddings");
  positive(vocab_size, "vocab_size");
  positive(hidden_size, "hidden_size");
  positive(intermediate_size, "intermediate_size");
  positive(num_hidden_layers, "num_hidden_layers");
  positive(num_attention_heads, "num_attention_heads");
  positive(num_key_value_heads, "num_key_value_heads");
  positive(head_dim, "head_dim");
  positive(max_position_embeddings, "max_position_embeddings");
  QLORA_CHECK(num_attention_heads % num_key_value_heads == 0, src,
              ": field 'num_key_value_heads' (", num_key_value_heads,
              ") must divide num_attention_heads (", num_attention_heads, ")");
  QLORA_CHECK(head_dim % 2 == 0, src, ": field 'head_dim' must be even for RoPE, got ", head_dim);
  QLORA_CHECK(rms_norm_eps > 0, src, ": field 'rms_norm_eps' must be > 0");
  QLORA_CHECK(rope.theta > 0, src, ": field 'rope_theta' must be > 0");
}

int64_t ModelConfig::num_parameters() const {
  const int64_t q = num_attention_heads * head_dim, kv = num_key_value_heads * head_dim;
  int64_t attn = hidden_size * q + 2 * hidden_size * kv + q * hidden_size;
  if (attention_bias) attn += q + 2 * kv + hidden_size;
  if (qkv_bias) attn += q + 2 * kv;
  if (qk_norm) attn += 2 * head_dim;
  int64_t mlp = 3 * hidden_size * intermediate_size;
  if (mlp_bias) mlp += 2 * intermediate_size + hidden_size;
  const int64_t layer = attn + mlp + 2 * hidden_size;
  int64_t n = vocab_size * hidden_size + num_hidden_layers * layer + hidden_size;
  if (!tie_word_embeddings) n += vocab_size * hidden_size;
  return n;
}

json ModelConfig::to_hf_json() const {
  json j;
  j["architectures"] = {architecture};
  j["model_type"] = model_type;
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["rms_norm_eps"] = rms_norm_eps;
  j["max_position_embeddings"] = max_position_embeddings;
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["rope_theta"] = rope.theta;
  if (rope.type == "linear") {
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", rope.factor}};
  } else if (rope.type == "llama3") {
    j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", rope.factor},
                         {"low_freq_factor", rope.low_freq_factor},
                         {"high_freq_factor", rope.high_freq_factor},
                         {"original_max_position_embeddings", rope.original_max_position_embeddings}};
  }
  if (model_type == "qwen2" || model_type == "qwen3") {
    j["use_sliding_window"] = false;
    if (model_type == "qwen3") j["attention_bias"] = attention_bias;
  } else {
    j["attention_bias"] = attention_bias;
    j["mlp_bias"] = mlp_bias;
  }
  if (model_type == "mistral") j["sliding_window"] = sliding_window > 0 ? json(sliding_window) : json(nullptr);
  j["torch_dtype"] = torch_dtype;
  j["bos_token_id"] = bos_token_id;
  j["eos_token_id"] = eos_token_id;
  if (pad_token_id >= 0) j["pad_token_id"] = pad_token_id;
  return j;
}

namespace {
/// Why `dir` (which has no config.json) is not a model, when it is recognisably something else: a
/// PEFT adapter (adapter_config.json; a `qlora train` output_dir holds one beside run.json) or a
/// training run's output_dir before its adapter was written (run.json only). "" otherwise.
std::string not_a_model_hint(const fs::path& dir) {
  if (fs::exists(dir / "adapter_config.json")) {
    std::string base;
    try {
      const json a = json::parse(read_file((dir / "adapter_config.json").string()));
      if (a.contains("base_model_name_or_path") && a["base_model_name_or_path"].is_string())
        base = a["base_model_name_or_path"].get<std::string>();
    } catch (const std::exception&) {  // the hint is best effort; the error stands without it
    }
    return std::string("; it holds adapter_config.json: a LoRA adapter") +
           (fs::exists(dir / "run.json") ? " (a training run's output_dir)" : "") +
           ", not a model. Pass the base model directory" + (base.empty() ? "" : " (its base: " + base + ")") +
           " and this directory as --adapter " + dir.string() + " (generate, eval), or make one model directory "
           "with `qlora merge --base BASE --adapter " + dir.string() + " --out DIR`";
  }
  if (fs::exists(dir / "run.json"))
    return "; it holds run.json: a training run's output_dir (no adapter written yet), not a model. Pass the "
           "run config's model.path";
  return "";
}
}  // namespace

ModelConfig load_model_config(const std::string& dir) {
  if (!fs::is_directory(dir)) {
    const std::string gguf = gguf::gguf_instead_of_model_dir(dir);
    QLORA_CHECK(gguf.empty(), gguf);
    fail(dir, fs::exists(dir) ? ": a file, not a model directory (config.json, *.safetensors, tokenizer)"
                              : ": model directory not found" + relative_path_note(dir));
  }
  const std::string path = (fs::path(dir) / "config.json").string();
  QLORA_CHECK(fs::exists(path), path, ": not found (an HF model directory needs config.json)", not_a_model_hint(dir),
              gguf::gguf_instead_of_model_dir(dir));
  return parse_model_config(read_json_object_file(path), path);
}

namespace {
ModelConfig llama(int64_t vocab, int64_t hidden, int64_t inter, int64_t layers, int64_t heads,
                  int64_t kv_heads, int64_t max_pos, double theta) {
  ModelConfig c;
  c.vocab_size = vocab;
  c.hidden_size = hidden;
  c.intermediate_size = inter;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = hidden / heads;
  c.max_position_embeddings = max_pos;
  c.rope.theta = theta;
  c.torch_dtype = "bfloat16";
  return c;
}
}  // namespace

std::vector<std::string> preset_names() {
  return {"tiny",       "small",    "llama2-7b",     "llama2-13b", "mistral-7b",
          "llama3-8b",  "qwen2.5-7b", "qwen3-8b",    "codellama-34b", "llama2-70b"};
}

ModelConfig preset_config(const std::string& name) {
  ModelConfig c;
  if (name == "tiny") {
    c = llama(32000, 64, 176, 2, 4, 2, 2048, 10000.0);
    c.torch_dtype = "float32";
  } else if (name == "small") {
    c = llama(32000, 256, 688, 4, 8, 4, 2048, 10000.0);
    c.torch_dtype = "float32";
  } else if (name == "llama2-7b") {
    c = llama(32000, 4096, 11008, 32, 32, 32, 4096, 10000.0);
  } else if (name == "llama2-13b") {
    c = llama(32000, 5120, 13824, 40, 40, 40, 4096, 10000.0);
  } else if (name == "mistral-7b") {
    c = llama(32000, 4096, 14336, 32, 32, 8, 32768, 10000.0);
    c.architecture = "MistralForCausalLM";
    c.model_type = "mistral";
    c.sliding_window = 4096;
  } else if (name == "llama3-8b") {
    c = llama(128256, 4096, 14336, 32, 32, 8, 8192, 500000.0);
    c.bos_token_id = 128000;
    c.eos_token_id = 128001;
  } else if (name == "qwen2.5-7b") {
    // Qwen/Qwen2.5-7B config.json: bias on q/k/v (Qwen2Attention), untied lm_head.
    c = llama(152064, 3584, 18944, 28, 28, 4, 131072, 1000000.0);
    c.architecture = "Qwen2ForCausalLM";
    c.model_type = "qwen2";
    c.qkv_bias = true;
    c.rms_norm_eps = 1e-6;
    c.bos_token_id = 151643;
    c.eos_token_id = 151643;
  } else if (name == "qwen3-8b") {
    // Qwen/Qwen3-8B config.json: head_dim 128, RMSNorm on each q and k head, untied lm_head.
    c = llama(151936, 4096, 12288, 36, 32, 8, 40960, 1000000.0);
    c.architecture = "Qwen3ForCausalLM";
    c.model_type = "qwen3";
    c.head_dim = 128;
    c.qk_norm = true;
    c.rms_norm_eps = 1e-6;
    c.bos_token_id = 151643;
    c.eos_token_id = 151645;
  } else if (name == "codellama-34b") {
    c = llama(32000, 8192, 22016, 48, 64, 8, 16384, 1000000.0);
  } else if (name == "llama2-70b") {
    c = llama(32000, 8192, 28672, 80, 64, 8, 4096, 10000.0);
  } else {
    std::string names;
    for (const auto& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
    fail("unknown preset '", name, "' (known: ", names, ")");
  }
  c.validate("preset " + name);
  return c;
}

std::map<std::string, std::string> model_file_digests(const std::string& model_dir, const std::string& tokenizer,
                                                      const std::string& adapter_dir) {
  static const std::set<std::string> kTokenizerFiles = {"tokenizer.json", "tokenizer.model", "tokenizer_config.json",
                                                       "special_tokens_map.json", "generation_config.json"};
  auto ends_with = [](const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  };
  std::map<std::string, std::string> out;
  auto add_dir = [&](const std::string& dir, const std::string& key, bool weights) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      if (!e.is_regular_file(ec)) continue;
      const std::string name = e.path().filename().string();
      const bool wanted = kTokenizerFiles.count(name) > 0 ||
                          (weights && (name == "config.json" || ends_with(name, ".safetensors") ||
                                       ends_with(name, ".safetensors.index.json")));
      if (wanted) out[key + "/" + name] = sampled_file_digest(e.path().string());
    }
  };
  if (!model_dir.empty() && std::filesystem::is_directory(model_dir)) add_dir(model_dir, "model.path", true);
  if (!tokenizer.empty()) {
    if (std::filesystem::is_directory(tokenizer))
      add_dir(tokenizer, "model.tokenizer", false);
    else if (std::filesystem::exists(tokenizer))
      out["model.tokenizer/" + std::filesystem::path(tokenizer).filename().string()] = sampled_file_digest(tokenizer);
  }
  if (!adapter_dir.empty())
    for (const char* name : {"adapter_config.json", "adapter_model.safetensors"})
      if (const auto f = std::filesystem::path(adapter_dir) / name; std::filesystem::is_regular_file(f))
        out[std::string("lora.model_dir/") + name] = sampled_file_digest(f.string());
  return out;
}

void add_legacy_rope_keys(nlohmann::json* config) {
  const auto p = config->find("rope_parameters");
  if (p == config->end() || !p->is_object()) return;
  if (const auto t = p->find("rope_theta"); t != p->end() && !config->contains("rope_theta")) (*config)["rope_theta"] = *t;
  const auto type = p->find("rope_type");
  if (type == p->end() || *type == "default" || config->contains("rope_scaling")) return;
  nlohmann::json scaling = *p;
  scaling.erase("rope_theta");
  (*config)["rope_scaling"] = std::move(scaling);
}

std::string positions_note(int64_t seq_len, const ModelConfig& cfg) {
  if (cfg.max_position_embeddings <= 0 || seq_len <= cfg.max_position_embeddings) return "";
  return "sequence length " + std::to_string(seq_len) + " exceeds the model's max_position_embeddings " +
         std::to_string(cfg.max_position_embeddings) +
         " (config.json): positions past it were never trained (RoPE extrapolation)";
}

void check_tokenizer_fits(const ModelConfig& cfg, int64_t tokenizer_pieces) {
  QLORA_CHECK(cfg.vocab_size >= tokenizer_pieces, "model.tokenizer: the tokenizer has ", tokenizer_pieces,
              " pieces but the model's vocab_size is ", cfg.vocab_size);
}

}  // namespace qlora
