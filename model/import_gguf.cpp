#include "model/import_gguf.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <vector>

#include "common/error.h"
#include "common/files.h"
#include "common/gguf.h"
#include "common/safetensors_stream.h"
#include "data/llama_tokenizer.h"
#include "data/tokenizer.h"
#include "kernels/gguf_dequant.h"
#include "kernels/quant4.h"  // float_to_bf16
#include "model/model_config.h"
#include "model/options.h"

namespace qlora {
namespace fs = std::filesystem;
using json = nlohmann::json;
using gguf::GgufFile;

namespace {

// ---- model hyper-parameters from `<arch>.*` ------------------------------------------------------
struct Hparams {
  std::string arch;  // "llama" | "qwen2" | "qwen3"
  int64_t hidden = 0, layers = 0, ffn = 0, heads = 0, kv_heads = 0, head_dim = 0, ctx = 0, vocab = 0;
  double rope_theta = 10000.0, rms_eps = 1e-6;
  bool has_head_dim_key = false;
  bool tied = false;
  // RoPE scaling recognised from llama 3's rope_freqs.weight (read_llama3_rope): "default" or "llama3".
  std::string rope_type = "default";
  double rope_factor = 1.0;
};

int64_t positive_uint(const GgufFile& f, const std::string& key) {
  const uint64_t v = f.get_uint(key);
  QLORA_CHECK(v > 0 && v < (uint64_t{1} << 31), f.path(), ": metadata key '", key, "': value ", v,
              " is out of range");
  return static_cast<int64_t>(v);
}

/// Refuses a GGUF that is not a model, before any model key is read: `general.type` (llama.cpp's
/// gguf.GGUFType: "model", "adapter", "imatrix", "mmproj"; absent in older files = a model) other than
/// "model"; LoRA tensors (`*.lora_a` / `*.lora_b`, convert_lora_to_gguf.py's names) without it; and a
/// file with no tensors (a vocab-only GGUF, convert_hf_to_gguf.py --vocab-only). Throws qlora::Error
/// naming the file and the key, with what to give instead.
void check_is_model(const GgufFile& f) {
  // one part of a split GGUF (llama-gguf-split; gguf-py's LLM_KV_SPLIT_COUNT / LLM_KV_SPLIT_NO):
  // the first holds the metadata and some tensors, the others only tensors
  if (f.has("split.count") && f.get_uint("split.count") > 1) {
    const uint64_t n = f.get_uint("split.count"), no = f.has("split.no") ? f.get_uint("split.no") : 0;
    fail(f.path(), ": metadata key 'split.count': ", n, ": this is part ", no + 1, " of ", n,
         " of a split GGUF; merge the parts into one file first (llama-gguf-split --merge FIRST_PART OUT.gguf, "
         "FIRST_PART the one named ...-00001-of-", n < 10 ? "0000" : n < 100 ? "000" : "00", n, ".gguf) and import that");
  }
  const bool typed = f.has("general.type");
  const std::string type = typed ? f.get_string("general.type") : "model";
  bool lora_tensors = false;
  for (const auto& t : f.tensors()) {
    const std::string& n = t.name;
    const std::string tail = n.size() >= 7 ? n.substr(n.size() - 7) : "";
    lora_tensors |= tail == ".lora_a" || tail == ".lora_b";
  }
  if (type == "adapter" || lora_tensors) {
    const bool kinded = f.has("adapter.type");
    const std::string kind = kinded ? f.get_string("adapter.type") : "lora";
    fail(f.path(), ": metadata key 'general.type': ", typed ? "'" + type + "'" : std::string("absent"),
         type == "adapter" ? "" : ", but the tensors are named *.lora_a / *.lora_b", ": this is a ",
         kind == "lora" ? "LoRA" : kind, " adapter GGUF", kinded ? " (adapter.type '" + kind + "')" : std::string(),
         ", not a model; import-gguf needs the base model's GGUF (converting adapter GGUFs is not supported)");
  }
  QLORA_CHECK(type == "model", f.path(), ": metadata key 'general.type': '", type,
              "' is not a model GGUF (import-gguf imports general.type 'model')");
  QLORA_CHECK(!f.tensors().empty(), f.path(),
              ": the file has no tensors (a vocab-only GGUF?); import-gguf needs a model GGUF with its weights");
}

Hparams read_hparams(const GgufFile& f) {
  check_is_model(f);
  Hparams h;
  h.arch = f.get_string("general.architecture");
  QLORA_CHECK(h.arch == "llama" || h.arch == "qwen2" || h.arch == "qwen3", f.path(),
              ": metadata key 'general.architecture': architecture '", h.arch,
              "' is not supported (supported: llama, qwen2, qwen3)");
  const std::string a = h.arch + ".";
  h.hidden = positive_uint(f, a + "embedding_length");
  h.layers = positive_uint(f, a + "block_count");
  QLORA_CHECK(static_cast<uint64_t>(h.layers) <= f.tensors().size() / 9, f.path(), ": metadata key '", a,
              "block_count': ", h.layers, " layers need at least ", 9 * h.layers, " tensors, the file has ",
              f.tensors().size());
  h.ffn = positive_uint(f, a + "feed_forward_length");
  h.heads = positive_uint(f, a + "attention.head_count");
  h.kv_heads = f.has(a + "attention.head_count_kv") ? positive_uint(f, a + "attention.head_count_kv") : h.heads;
  QLORA_CHECK(h.heads % h.kv_heads == 0, f.path(), ": metadata key '", a,
              "attention.head_count_kv': ", h.kv_heads, " does not divide the head count ", h.heads);
  const std::string key_len = a + "attention.key_length", value_len = a + "attention.value_length";
  if (h.arch == "qwen3" && f.has(key_len)) {
    // Qwen3's head_dim is its own hyper-parameter (128 for 0.6B..32B, whatever hidden/heads is);
    // llama.cpp's converter writes it as key_length and value_length (llama-model.cpp: n_embd_head_k
    // from key_length, else n_embd / n_head).
    h.head_dim = positive_uint(f, key_len);
  } else {
    QLORA_CHECK(h.hidden % h.heads == 0, f.path(), ": metadata key '", a, "attention.head_count': ",
                h.heads, " does not divide the embedding length ", h.hidden);
    h.head_dim = h.hidden / h.heads;
  }
  if (h.arch == "llama" && f.has(a + "rope.dimension_count")) {  // transformers maps it to head_dim
    h.head_dim = positive_uint(f, a + "rope.dimension_count");
    h.has_head_dim_key = true;
  }
  if (h.arch == "qwen3") {
    // The decoder's value heads are as wide as its query/key heads, and RoPE rotates all of them.
    const int64_t v = f.has(value_len) ? positive_uint(f, value_len) : h.hidden / h.heads;
    QLORA_CHECK(v == h.head_dim, f.path(), ": metadata key '", value_len, "': ",
                f.has(value_len) ? "" : "absent, so embedding_length / head_count = ", v,
                " differs from the key head size ", h.head_dim, " (qwen3 needs equal key and value head sizes)");
    const std::string rot = a + "rope.dimension_count";
    QLORA_CHECK(!f.has(rot) || positive_uint(f, rot) == h.head_dim, f.path(), ": metadata key '", rot,
                "': ", f.has(rot) ? f.get_uint(rot) : 0, " differs from the head size ", h.head_dim,
                " (partial RoPE is not supported for qwen3)");
  }
  const std::string head_from = h.arch == "qwen3" && f.has(key_len) ? key_len
                                : h.has_head_dim_key              ? a + "rope.dimension_count"
                                                                  : a + "embedding_length' / '" + a + "attention.head_count";
  QLORA_CHECK(h.head_dim % 2 == 0, f.path(), ": metadata key '", head_from, "': head dimension ", h.head_dim,
              " is odd (RoPE rotates pairs)");
  h.ctx = f.has(a + "context_length") ? positive_uint(f, a + "context_length") : 2048;
  if (f.has(a + "rope.freq_base")) h.rope_theta = f.get_float(a + "rope.freq_base");
  QLORA_CHECK(std::isfinite(h.rope_theta) && h.rope_theta > 0, f.path(), ": metadata key '", a,
              "rope.freq_base': ", h.rope_theta, " is not a positive number");
  h.rms_eps = f.get_float(a + "attention.layer_norm_rms_epsilon");
  QLORA_CHECK(std::isfinite(h.rms_eps) && h.rms_eps > 0, f.path(), ": metadata key '", a,
              "attention.layer_norm_rms_epsilon': ", h.rms_eps, " is not a positive number");
  h.vocab = f.has(a + "vocab_size") ? positive_uint(f, a + "vocab_size")
                                    : static_cast<int64_t>(f.get_string_array("tokenizer.ggml.tokens").size());
  h.tied = f.find_tensor("output.weight") == nullptr;
  return h;
}

// "4096, 32000": a shape as the errors below print it.
std::string dims_text(const std::vector<int64_t>& shape) {
  std::string s;
  for (int64_t d : shape) s += (s.empty() ? "" : ", ") + std::to_string(d);
  return s;
}

// ---- llama 3 RoPE scaling: rope_freqs.weight -> rope_parameters ------------------------------------
constexpr const char* kRopeFreqs = "rope_freqs.weight";
// The values of every Meta Llama 3.1 / 3.2 / 3.3 release's rope_scaling (only `factor` differs).
constexpr float kLlama3LowFreqFactor = 1.0f, kLlama3HighFreqFactor = 4.0f;
constexpr int64_t kLlama3OriginalContext = 8192;

/// The per-dimension RoPE factors llama.cpp's convert_hf_to_gguf.py (LlamaModel.generate_extra_tensors)
/// stores as rope_freqs.weight for rope_scaling {rope_type llama3, factor, low_freq_factor 1,
/// high_freq_factor 4, original_max_position_embeddings 8192}, in its float32 order of operations:
/// freq_i = 1 / theta^((2i)/dim); wavelen = 2π / freq; wavelen < 8192/4 -> 1, > 8192/1 -> factor,
/// else 1 / ((1 - smooth)/factor + smooth) with smooth = (8192/wavelen - 1)/(4 - 1). [dim/2] values.
std::vector<float> llama3_rope_factors(float factor, double theta, int64_t dim) {
  const float low = kLlama3LowFreqFactor, high = kLlama3HighFreqFactor;
  const auto old_ctx = static_cast<float>(kLlama3OriginalContext);
  const float low_wavelen = old_ctx / low, high_wavelen = old_ctx / high;
  std::vector<float> out(static_cast<size_t>(dim / 2));
  for (int64_t i = 0; i < dim / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    const float freq = 1.0f / std::pow(static_cast<float>(theta), exponent);
    const float wavelen = static_cast<float>(2 * M_PI) / freq;
    if (wavelen < high_wavelen) {
      out[size_t(i)] = 1.0f;
    } else if (wavelen > low_wavelen) {
      out[size_t(i)] = factor;
    } else {
      const float smooth = (old_ctx / wavelen - low) / (high - low);
      out[size_t(i)] = 1.0f / ((1.0f - smooth) / factor + smooth);
    }
  }
  return out;
}

/// Sets h->rope_type / rope_factor from the llama file's rope_freqs.weight, if it has one (llama.cpp
/// writes it for Llama 3.1 / 3.2 / 3.3 instead of a rope_scaling key). The tensor must be F32, F16 or
/// BF16, shape [head_dim/2], finite. All ones: no scaling ("default"). Otherwise factor = its last
/// element, and the whole vector must equal llama3_rope_factors(factor, rope_theta, head_dim) within
/// a relative 1e-5 (plus the rounding of F16 / BF16 storage): then "llama3". Throws qlora::Error
/// naming the file and the tensor for anything else, as no config.json rope_parameters describes it.
void read_llama3_rope(const GgufFile& f, Hparams* h) {
  const gguf::TensorInfo* t = f.find_tensor(kRopeFreqs);
  if (h->arch != "llama" || t == nullptr) return;
  const int64_t n = h->head_dim / 2;
  const std::vector<int64_t> shape = t->shape();
  QLORA_CHECK(shape == std::vector<int64_t>{n}, f.path(), ": tensor '", kRopeFreqs, "': shape [", dims_text(shape),
              "] does not match the metadata ([", n, "] = head_dim / 2)");
  const bool f16 = t->type == gguf::GgmlType::F16, bf16 = t->type == gguf::GgmlType::BF16;
  QLORA_CHECK(t->type == gguf::GgmlType::F32 || f16 || bf16, f.path(), ": tensor '", kRopeFreqs,
              "': ggml type ", gguf::ggml_type_info(t->type).name, " is not supported here (F32, F16, BF16)");
  std::vector<float> got(static_cast<size_t>(n));
  kernels::dequantize_gguf_cpu(t->type, f.data(*t), n, got.data());
  f.release(*t);
  bool ones = true;
  for (int64_t i = 0; i < n; ++i) {
    QLORA_CHECK(std::isfinite(got[size_t(i)]), f.path(), ": tensor '", kRopeFreqs, "': element ", i, " is ",
                got[size_t(i)], " (not finite)");
    ones = ones && got[size_t(i)] == 1.0f;
  }
  if (ones) return;  // factors of 1: RoPE as without scaling
  const float factor = got.back();
  QLORA_CHECK(factor > 0, f.path(), ": tensor '", kRopeFreqs, "': last element (the llama3 factor) is ", factor,
              ", not > 0");
  const std::vector<float> want = llama3_rope_factors(factor, h->rope_theta, h->head_dim);
  // F16 / BF16 storage rounds each value to within 2^-11 / 2^-8 of it, relatively.
  const double tol = 1e-5 + (f16 ? std::ldexp(1.0, -11) : bf16 ? std::ldexp(1.0, -8) : 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const double g = got[size_t(i)], w = want[size_t(i)];
    QLORA_CHECK(std::abs(g - w) <= tol * std::abs(w), f.path(), ": tensor '", kRopeFreqs, "': element ", i, " is ",
                g, " where llama 3 RoPE scaling (rope_type llama3, factor ", factor,
                " = the last element, low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 8192,"
                " rope_theta ", h->rope_theta, ", head_dim ", h->head_dim, ") gives ", w,
                "; this file's RoPE cannot be written as a config.json");
  }
  h->rope_type = "llama3";
  h->rope_factor = factor;
}

// ---- tensor plan: GGUF tensor -> HF name, shape, permutation --------------------------------------
struct Planned {
  const gguf::TensorInfo* src;
  std::string hf_name;
  std::vector<int64_t> shape;  // HF (row-major) shape
  int64_t permute_heads = 0;   // > 0: undo llama.cpp's Q/K row permutation with this many heads
};

std::vector<Planned> plan_tensors(const GgufFile& f, const Hparams& h) {
  const int64_t q_out = h.heads * h.head_dim, kv_out = h.kv_heads * h.head_dim;
  struct Want {
    std::string hf;
    std::vector<int64_t> shape;
    int64_t permute = 0;
    bool required = true;
  };
  std::map<std::string, Want> want;
  want["token_embd.weight"] = {"model.embed_tokens.weight", {h.vocab, h.hidden}};
  want["output_norm.weight"] = {"model.norm.weight", {h.hidden}};
  want["output.weight"] = {"lm_head.weight", {h.vocab, h.hidden}, 0, false};
  const bool llama = h.arch == "llama";
  for (int64_t l = 0; l < h.layers; ++l) {
    const std::string g = "blk." + std::to_string(l) + ".";
    const std::string m = "model.layers." + std::to_string(l) + ".";
    want[g + "attn_norm.weight"] = {m + "input_layernorm.weight", {h.hidden}};
    want[g + "ffn_norm.weight"] = {m + "post_attention_layernorm.weight", {h.hidden}};
    want[g + "attn_q.weight"] = {m + "self_attn.q_proj.weight", {q_out, h.hidden}, llama ? h.heads : 0};
    want[g + "attn_k.weight"] = {m + "self_attn.k_proj.weight", {kv_out, h.hidden}, llama ? h.kv_heads : 0};
    want[g + "attn_v.weight"] = {m + "self_attn.v_proj.weight", {kv_out, h.hidden}};
    want[g + "attn_output.weight"] = {m + "self_attn.o_proj.weight", {h.hidden, q_out}};
    want[g + "ffn_gate.weight"] = {m + "mlp.gate_proj.weight", {h.ffn, h.hidden}};
    want[g + "ffn_up.weight"] = {m + "mlp.up_proj.weight", {h.ffn, h.hidden}};
    want[g + "ffn_down.weight"] = {m + "mlp.down_proj.weight", {h.hidden, h.ffn}};
    if (h.arch == "qwen2") {  // q/k/v biases
      want[g + "attn_q.bias"] = {m + "self_attn.q_proj.bias", {q_out}};
      want[g + "attn_k.bias"] = {m + "self_attn.k_proj.bias", {kv_out}};
      want[g + "attn_v.bias"] = {m + "self_attn.v_proj.bias", {kv_out}};
    } else if (h.arch == "qwen3") {  // RMSNorm of each query / key head, before RoPE
      want[g + "attn_q_norm.weight"] = {m + "self_attn.q_norm.weight", {h.head_dim}};
      want[g + "attn_k_norm.weight"] = {m + "self_attn.k_norm.weight", {h.head_dim}};
    }
  }
  std::vector<Planned> plan;
  std::set<std::string> seen;
  for (const gguf::TensorInfo& t : f.tensors()) {
    auto it = want.find(t.name);
    if (it == want.end()) {
      // llama 3's RoPE scaling as a tensor: read by read_llama3_rope, not written as a weight.
      if (llama && t.name == kRopeFreqs) continue;
      fail(f.path(), ": tensor '", t.name, "': not expected in a ", h.arch, " model with ", h.layers,
           " layers (no Hugging Face name for it)");
    }
    const Want& w = it->second;
    const std::vector<int64_t> shape = t.shape();
    if (shape != w.shape) {
      fail(f.path(), ": tensor '", t.name, "': shape [", dims_text(shape), "] does not match the metadata ([",
           dims_text(w.shape), "])");
    }
    const gguf::GgmlTypeInfo& ti = gguf::ggml_type_info(t.type);
    QLORA_CHECK(ti.dequantize, f.path(), ": tensor '", t.name, "': ggml type ", ti.name,
                " is not supported (supported: F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K Q4_K Q5_K Q6_K); "
                "import a file of the same model in one of those (its F16 / BF16 or Q8_0 GGUF is best: NF4 "
                "quantizes the imported weights again)");
    plan.push_back({&t, w.hf, shape, w.permute});
    seen.insert(t.name);
  }
  for (const auto& [name, w] : want)
    QLORA_CHECK(!w.required || seen.count(name), f.path(), ": tensor '", name, "': missing");
  return plan;
}

// ---- tokenizer ------------------------------------------------------------------------------------
// GPT-2 bytes_to_unicode: the printable bytes map to themselves, the other 68 to U+0100.. in order.
std::vector<uint32_t> byte_to_codepoint() {
  std::vector<uint32_t> m(256);
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    m[b] = printable ? b : next++;
  }
  return m;
}

void append_utf8(uint32_t cp, std::string* s) {
  if (cp < 0x80) {
    s->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    s->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    s->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    s->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    s->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// True when `s` is valid UTF-8 whose every code point is in the byte-level alphabet
// (33..126, 161..172, 174..323).
bool in_byte_alphabet(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    uint32_t cp;
    if (c < 0x80) {
      cp = c;
      i += 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < s.size() && (static_cast<unsigned char>(s[i + 1]) & 0xC0) == 0x80) {
      cp = ((c & 0x1Fu) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3Fu);
      i += 2;
    } else {
      return false;  // 3- and 4-byte sequences are all above U+0143
    }
    if (!((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 323))) return false;
  }
  return true;
}

struct TokenizerFiles {
  json tokenizer, tokenizer_config, special_ids;
};

// The pre-tokenizer regexes transformers picks by tokenizer.ggml.pre
// (integrations/gguf/gguf_tokenizer_mapping.py GGUF_PRE_TOKENIZER_SPLITS).
const char* split_regex(const std::string& pre) {
  static const char* kLlama3 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  static const char* kQwen2 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  static const char* kTekken =
      R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  static const char* kGpt4o =
      R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  static const std::map<std::string, const char*> kMap = {
      {"llama3", kLlama3}, {"llama-v3", kLlama3}, {"llama-bpe", kLlama3}, {"falcon3", kLlama3},
      {"falcon-h1", kLlama3}, {"pixtral", kLlama3}, {"midm-2.0", kLlama3}, {"lfm2", kLlama3},
      {"jina-v5-nano", kLlama3}, {"dbrx", kLlama3}, {"smaug-bpe", kLlama3}, {"tekken", kTekken},
      {"qwen2", kQwen2}, {"deepseek-r1-qwen", kQwen2}, {"kormo", kQwen2}, {"f2llmv2", kQwen2},
      {"megrez", kQwen2}, {"gpt-4o", kGpt4o}, {"llama4", kGpt4o}, {"kanana2", kGpt4o},
      {"talkie", kGpt4o}, {"minimax-m2", kGpt4o}};
  auto it = kMap.find(pre);
  return it == kMap.end() ? nullptr : it->second;
}

// llama.cpp's pre-tokenizer types that isolate every digit before the GPT-2 regex (llama-vocab.cpp:
// regex_exprs {"\\p{N}", the GPT-2 regex} for SMOLLM, STARCODER, REFACT, COMMAND_R, CODESHELL, EXAONE,
// MINERVA), which is the `tokenizers` pipeline Sequence[Digits(individual_digits), ByteLevel] that
// these models' own tokenizer.json files carry (SmolLM2's among them). transformers' GGUF loader has
// no entry for them and falls back to plain ByteLevel, which tokenizes "2024" as one or two tokens
// where the model was trained on four (trial 28: 248 of 999 alpaca records differed from llama.cpp's
// ids); we follow llama.cpp and the models' own files (docs/gguf.md).
bool isolates_digits(const std::string& pre) {
  static const std::set<std::string> kPre = {"smollm", "starcoder", "refact", "command-r",
                                             "codeshell", "exaone", "minerva"};
  return kPre.count(pre) > 0;
}

json added_token(int64_t id, const std::string& content, bool special) {
  return {{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", special}};
}

constexpr size_t kMaxSpmTokenBytes = 4096;

TokenizerFiles build_tokenizer(const GgufFile& f) {
  // transformers' builders by tokenizer.ggml.model (gguf_tokenizer_mapping.py GGUF_TOKENIZER_TYPES):
  // "gpt2" -> GPT2Tokenizer (byte-level BPE), "llama" -> LlamaTokenizer (sentencepiece BPE with byte
  // fallback: Llama 2, Mistral, TinyLlama files).
  const std::string model = f.get_string("tokenizer.ggml.model");
  QLORA_CHECK(model == "gpt2" || model == "llama", f.path(), ": metadata key 'tokenizer.ggml.model': tokenizer '",
              model, "' is not supported (\"gpt2\": byte-level BPE; \"llama\": sentencepiece BPE)");
  const bool spm = model == "llama";
  const std::vector<std::string>& tokens = f.get_string_array("tokenizer.ggml.tokens");
  QLORA_CHECK(!tokens.empty(), f.path(), ": metadata key 'tokenizer.ggml.tokens': empty");
  const std::vector<std::string> no_merges;
  const std::vector<std::string>& merges =
      spm && !f.has("tokenizer.ggml.merges") ? no_merges : f.get_string_array("tokenizer.ggml.merges");
  std::vector<int64_t> types;
  if (f.has("tokenizer.ggml.token_type")) {
    types = f.get_int_array("tokenizer.ggml.token_type");
    QLORA_CHECK(types.size() == tokens.size(), f.path(), ": metadata key 'tokenizer.ggml.token_type': ",
                types.size(), " entries for ", tokens.size(), " tokens");
  }
  const std::vector<uint32_t> b2u = byte_to_codepoint();
  json vocab = json::object();
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string& t = tokens[i];
    if (spm || in_byte_alphabet(t)) {  // sentencepiece tokens are stored as they are spelled
      vocab[t] = i;
    } else {
      std::string s;
      for (unsigned char c : t) append_utf8(b2u[c], &s);
      vocab[s] = i;
    }
  }
  json jmerges = json::array();
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string& m = merges[i];
    const size_t sp = m.find(' ');
    QLORA_CHECK(sp != std::string::npos && m.find(' ', sp + 1) == std::string::npos, f.path(),
                ": metadata key 'tokenizer.ggml.merges': entry ", i, " is not two tokens separated by one space");
    jmerges.push_back({m.substr(0, sp), m.substr(sp + 1)});
  }
  if (spm && merges.empty()) {
    // Every split of every token is looked up: quadratic in a token's length, so an absurd token in
    // an untrusted file is refused (real vocabularies stay under ~100 bytes a token).
    for (size_t i = 0; i < tokens.size(); ++i)
      QLORA_CHECK(tokens[i].size() <= kMaxSpmTokenBytes, f.path(), ": metadata key 'tokenizer.ggml.tokens': token ", i,
                  " is ", tokens[i].size(), " bytes; a sentencepiece vocabulary's tokens are refused above ",
                  kMaxSpmTokenBytes, " bytes");
    const std::vector<double>& scores = f.get_float_array("tokenizer.ggml.scores");
    QLORA_CHECK(scores.size() == tokens.size(), f.path(), ": metadata key 'tokenizer.ggml.scores': ", scores.size(),
                " entries for ", tokens.size(), " tokens");
    // transformers' generate_merges with the scores, over every token (data/llama_tokenizer.h)
    for (const data::MergeRule& m : data::generate_merges(tokens, &scores, nullptr))
      jmerges.push_back({tokens[size_t(m.left)], tokens[size_t(m.right)]});
  }
  // Added tokens (add_gguf_special_tokens): CONTROL (3) ones special (byte-level: only those spelled
  // in the byte alphabet), USER_DEFINED (4) ones not; LlamaTokenizer also registers its named
  // special tokens (bos/eos/unk/pad below) as special added tokens. Written in id order.
  std::map<int64_t, bool> added_ids;  // id -> special
  for (size_t i = 0; i < types.size(); ++i) {
    if (types[i] == 3 && (spm || in_byte_alphabet(tokens[i]))) added_ids[int64_t(i)] = true;
    else if (types[i] == 4 && vocab.contains(tokens[i])) added_ids.emplace(int64_t(i), false);
  }

  // Special tokens (names as in tokenizer_config.json).
  auto token_of = [&](const std::string& key, std::string* out, int64_t* id) {
    if (!f.has(key)) return false;
    const uint64_t v = f.get_uint(key);
    QLORA_CHECK(v < tokens.size(), f.path(), ": metadata key '", key, "': token id ", v,
                " is outside the vocabulary (", tokens.size(), " tokens)");
    *out = tokens[v];
    *id = static_cast<int64_t>(v);
    return true;
  };
  TokenizerFiles r;
  r.special_ids = json::object();
  json tc = json::object();
  // add_bos_token absent: true for a sentencepiece vocabulary (get_gguf_tokenizer: llama.cpp's default)
  const bool add_bos = f.has("tokenizer.ggml.add_bos_token") ? f.get_bool("tokenizer.ggml.add_bos_token") : spm;
  const bool add_eos = f.has("tokenizer.ggml.add_eos_token") && f.get_bool("tokenizer.ggml.add_eos_token");
  tc["add_bos_token"] = add_bos;
  tc["add_eos_token"] = add_eos;
  std::string bos;
  int64_t bos_id = -1;
  for (const auto& [name, key] : std::vector<std::pair<std::string, std::string>>{
           {"bos", "bos_token_id"}, {"eos", "eos_token_id"}, {"unk", "unknown_token_id"}, {"pad", "padding_token_id"}}) {
    std::string tok;
    int64_t id;
    if (token_of("tokenizer.ggml." + key, &tok, &id)) {
      tc[name + "_token"] = tok;
      r.special_ids[name == "unk" ? "unk_token_id" : name == "pad" ? "pad_token_id" : name + "_token_id"] = id;
      if (name == "bos") bos = tok, bos_id = id;
      if (spm) added_ids[id] = true;
    } else {
      tc[name + "_token"] = nullptr;
    }
  }
  QLORA_CHECK(!add_bos || bos_id >= 0, f.path(),
              ": metadata key 'tokenizer.ggml.bos_token_id': missing, but add_bos_token is true");
  if (f.has("tokenizer.chat_template")) tc["chat_template"] = f.get_string("tokenizer.chat_template");
  tc["clean_up_tokenization_spaces"] = false;
  tc["tokenizer_class"] = spm ? "LlamaTokenizer" : "PreTrainedTokenizerFast";
  if (spm) tc["legacy"] = false;  // what transformers built: Metaspace prepend_scheme "first"
  r.tokenizer_config = tc;
  json added = json::array();
  for (const auto& [id, special] : added_ids) added.push_back(added_token(id, tokens[size_t(id)], special));

  const json llama = spm ? data::llama_pipeline(data::PrependScheme::kFirst) : json();
  json pre;
  const std::string pre_name = f.has("tokenizer.ggml.pre") ? f.get_string("tokenizer.ggml.pre") : "";
  if (const char* rx = split_regex(pre_name)) {
    pre = {{"type", "Sequence"},
           {"pretokenizers",
            {{{"type", "Split"}, {"pattern", {{"Regex", rx}}}, {"behavior", "Isolated"}, {"invert", false}},
             {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}};
  } else if (!spm && isolates_digits(pre_name)) {
    pre = {{"type", "Sequence"},
           {"pretokenizers",
            {{{"type", "Digits"}, {"individual_digits", true}},
             {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}}}};
  } else if (spm) {  // LlamaTokenizer's own (legacy=False, add_prefix_space=True)
    pre = llama["pre_tokenizer"];
  } else {  // GPT2Tokenizer's own: byte-level with the GPT-2 regex
    pre = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  }
  auto seq = [](const char* id, int type_id) { return json{{"Sequence", {{"id", id}, {"type_id", type_id}}}}; };
  auto spec = [](const std::string& id, int type_id) { return json{{"SpecialToken", {{"id", id}, {"type_id", type_id}}}}; };
  json single = json::array(), pair = json::array(), specials = json::object();
  if (add_bos) {
    single.push_back(spec(bos, 0));
    specials[bos] = {{"id", bos}, {"ids", {bos_id}}, {"tokens", {bos}}};
  }
  single.push_back(seq("A", 0));
  pair = single;
  if (add_bos) pair.push_back(spec(bos, 1));
  pair.push_back(seq("B", 1));
  r.tokenizer = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", pre},
      {"post_processor", {{"type", "TemplateProcessing"}, {"single", single}, {"pair", pair}, {"special_tokens", specials}}},
      {"decoder", spm ? llama["decoder"]
                      : json{{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
        {"continuing_subword_prefix", spm ? json() : json("")}, {"end_of_word_suffix", spm ? json() : json("")},
        {"fuse_unk", spm}, {"byte_fallback", spm}, {"ignore_merges", false},
        {"vocab", std::move(vocab)}, {"merges", std::move(jmerges)}}}};
  return r;
}

json config_json(const Hparams& h, const json& special_ids, const std::string& dtype) {
  json c;
  c["architectures"] = {h.arch == "llama"   ? "LlamaForCausalLM"
                        : h.arch == "qwen2" ? "Qwen2ForCausalLM"
                                            : "Qwen3ForCausalLM"};
  c["model_type"] = h.arch;
  c["vocab_size"] = h.vocab;
  c["hidden_size"] = h.hidden;
  c["intermediate_size"] = h.ffn;
  c["num_hidden_layers"] = h.layers;
  c["num_attention_heads"] = h.heads;
  c["num_key_value_heads"] = h.kv_heads;
  c["hidden_act"] = "silu";
  c["max_position_embeddings"] = h.ctx;
  c["rms_norm_eps"] = h.rms_eps;
  c["rope_parameters"] = {{"rope_theta", h.rope_theta}, {"rope_type", h.rope_type}};
  if (h.rope_type == "llama3")  // transformers 5 LlamaConfig.rope_parameters, as the HF model's config.json has it
    c["rope_parameters"].update({{"factor", h.rope_factor},
                                 {"low_freq_factor", kLlama3LowFreqFactor},
                                 {"high_freq_factor", kLlama3HighFreqFactor},
                                 {"original_max_position_embeddings", kLlama3OriginalContext}});
  add_legacy_rope_keys(&c);  // rope_theta / rope_scaling too, for converters back to GGUF (trial 15)
  c["tie_word_embeddings"] = h.tied;
  c["initializer_range"] = 0.02;
  c["attention_dropout"] = 0.0;
  c["use_cache"] = true;
  if (h.arch == "llama") {
    if (h.has_head_dim_key) c["head_dim"] = h.head_dim;
    c["attention_bias"] = false;
    c["mlp_bias"] = false;
    c["pretraining_tp"] = 1;
  } else {
    c["use_sliding_window"] = false;
    if (h.arch == "qwen3") {
      c["head_dim"] = h.head_dim;  // always: Qwen3Config's default is 128, not hidden / heads
      c["attention_bias"] = false;
    }
  }
  for (auto it = special_ids.begin(); it != special_ids.end(); ++it) c[it.key()] = it.value();
  c["dtype"] = hf_dtype_name(parse_dtype(dtype));
  return c;
}

}  // namespace

namespace {
/// The staged config.json and tokenizer files load as every other command loads them: a GGUF
/// whose metadata the readers take but whose model would not load (a merge naming an unknown
/// token, two tokens with one text; trial 27: import exited 0, every later command refused the
/// dir) is refused here, naming the GGUF and the loader's reason (its file under --out).
void check_loads(const std::filesystem::path& tmp, const std::filesystem::path& out, const std::string& gguf_path) {
  try {
    load_model_config(tmp.string());
    (void)data::Tokenizer::from_pretrained(tmp.string());
  } catch (const Error& e) {
    std::string m = e.what();
    for (size_t at; (at = m.find(tmp.string())) != std::string::npos;) m.replace(at, tmp.string().size(), out.string());
    fail(gguf_path, ": its metadata gives a model directory that would not load: ", m);
  }
}
}  // namespace

ImportGgufResult import_gguf(const ImportGgufOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  QLORA_CHECK(o.dtype == "bf16" || o.dtype == "fp32", "import-gguf: --dtype must be bf16 or fp32, got '",
              o.dtype, "'");
  QLORA_CHECK(!o.out_dir.empty(), "import-gguf: --out is required");
  QLORA_CHECK(!fs::exists(o.out_dir) || (fs::is_directory(o.out_dir) && fs::is_empty(o.out_dir)), o.out_dir,
              ": exists and is not an empty directory; refusing to overwrite it");
  GgufFile f(o.gguf_path);
  Hparams h = read_hparams(f);
  const std::vector<Planned> plan = plan_tensors(f, h);
  read_llama3_rope(f, &h);

  ImportGgufResult res;
  res.architecture = h.arch;
  res.tied_embeddings = h.tied;
  const bool bf16 = o.dtype == "bf16";
  const fs::path out = fs::path(o.out_dir);
  const fs::path tmp = out.string() + ".tmp-" + std::to_string(::getpid());
  std::error_code ec;
  qlora::remove_tree(tmp, ec);
  fs::create_directories(tmp);
  try {
    {  // tokenizer first: its JSON is freed before the tensors stream
      TokenizerFiles tok = build_tokenizer(f);
      std::string tok_json, tok_config;
      try {
        tok_json = tok.tokenizer.dump(2) + "\n";
        tok_config = tok.tokenizer_config.dump(2) + "\n";
      } catch (const json::exception& e) {  // a string that is not UTF-8
        fail(f.path(), ": tokenizer metadata: ", e.what());
      }
      atomic_write_string((tmp / "tokenizer.json").string(), tok_json);
      atomic_write_string((tmp / "tokenizer_config.json").string(), tok_config);
      atomic_write_string((tmp / "config.json").string(), config_json(h, tok.special_ids, o.dtype).dump(2) + "\n");
      check_loads(tmp, out, f.path());
      json gc = json::object();
      for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id"})
        if (tok.special_ids.contains(k)) gc[k] = tok.special_ids[k];
      atomic_write_string((tmp / "generation_config.json").string(), gc.dump(2) + "\n");
    }

    std::vector<st::TensorToWrite> heads;
    for (const Planned& p : plan) {
      st::TensorToWrite w;
      w.name = p.hf_name;
      w.dtype = bf16 ? st::DType::BF16 : st::DType::F32;
      w.shape = p.shape;
      w.nbytes = static_cast<size_t>(p.src->numel()) * (bf16 ? 2 : 4);
      heads.push_back(std::move(w));
      res.parameters += p.src->numel();
      res.safetensors_bytes += heads.back().nbytes;
      ++res.tensor_types[gguf::ggml_type_info(p.src->type).name];
    }
    std::vector<float> deq, perm;  // one tensor at a time (the largest sets the peak)
    st::write_safetensors_streaming(
        (tmp / "model.safetensors").string(), heads,
        [&](size_t i) -> const void* {
          const Planned& p = plan[i];
          const int64_t n = p.src->numel();
          deq.resize(static_cast<size_t>(n));
          kernels::dequantize_gguf_cpu(p.src->type, f.data(*p.src), n, deq.data());
          f.release(*p.src);
          float* v = deq.data();
          if (p.permute_heads > 0) {
            // rows [heads, 2, d] (HF) from [heads, d, 2] (GGUF); each row has `cols` elements.
            const int64_t rows = p.shape[0], cols = p.shape[1];
            QLORA_CHECK(rows % (2 * p.permute_heads) == 0, f.path(), ": tensor '", p.src->name, "': ",
                        rows, " rows do not split into ", p.permute_heads, " heads of row pairs");
            const int64_t d = rows / p.permute_heads / 2;
            perm.resize(static_cast<size_t>(n));
            for (int64_t hd = 0; hd < p.permute_heads; ++hd)
              for (int64_t s = 0; s < 2; ++s)
                for (int64_t j = 0; j < d; ++j)
                  std::copy_n(deq.data() + ((hd * d + j) * 2 + s) * cols, cols,
                              perm.data() + ((hd * 2 + s) * d + j) * cols);
            v = perm.data();
          }
          if (!bf16) return v;
          // bf16 in place: element k's two bytes go to byte 2k, inside float k/2, already read.
          auto* out = reinterpret_cast<unsigned char*>(v);
          for (int64_t k = 0; k < n; ++k) {
            float x;
            std::memcpy(&x, out + 4 * k, 4);
            const uint16_t b = kernels::float_to_bf16(x);
            std::memcpy(out + 2 * k, &b, 2);
          }
          return v;
        },
        {{"format", "pt"}});
    res.tensors = static_cast<int64_t>(plan.size());
    if (fs::exists(out)) fs::remove(out);  // empty, checked above
    fs::rename(tmp, out);
  } catch (...) {
    qlora::remove_tree(tmp, ec);
    throw;
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

std::string cmd_import_gguf(const ImportGgufOptions& o) {
  const ImportGgufResult r = import_gguf(o);
  std::ostringstream os;
  os << "imported " << o.gguf_path << " (" << r.architecture << ", " << r.tensors << " tensors, "
     << r.parameters << " parameters" << (r.tied_embeddings ? ", tied embeddings" : "") << "; stored as";
  for (const auto& [type, n] : r.tensor_types) os << " " << type << " x" << n;
  os << ") into " << o.out_dir << " as " << o.dtype << " in " << r.seconds << " s\n";
  return os.str();
}

}  // namespace qlora
