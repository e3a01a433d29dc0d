// Test helper: builds GGUF v3 files byte by byte (little-endian), so tests can make valid tiny
// models and precisely malformed ones. Not a product writer: no checks beyond what tests need.
#pragma once
#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <vector>

namespace qlora::test {

class GgufBuilder {
 public:
  struct Tensor {
    std::string name;
    std::vector<uint64_t> ne;  // ggml order: ne[0] = row length
    uint32_t type;
    std::string data;          // raw bytes
    int64_t offset = -1;       // -1: next aligned offset
  };

  uint32_t version = 3;
  std::set<std::string> omit;  ///< keys and tensor names that kv()/tensor() silently drop
  uint64_t alignment = 32;
  std::string magic = "GGUF";

  void u16(const std::string& k, uint16_t v) { kv(k, 2, pod(v)); }
  void u32(const std::string& k, uint32_t v) { kv(k, 4, pod(v)); }
  void i32(const std::string& k, int32_t v) { kv(k, 5, pod(v)); }
  void f32(const std::string& k, float v) { kv(k, 6, pod(v)); }
  void boolean(const std::string& k, bool v) { kv(k, 7, std::string(1, v ? 1 : 0)); }
  void str(const std::string& k, const std::string& v) { kv(k, 8, s(v)); }
  void str_array(const std::string& k, const std::vector<std::string>& v) {
    std::string b = pod<uint32_t>(8) + pod<uint64_t>(v.size());
    for (const auto& x : v) b += s(x);
    kv(k, 9, b);
  }
  void i32_array(const std::string& k, const std::vector<int32_t>& v) {
    std::string b = pod<uint32_t>(5) + pod<uint64_t>(v.size());
    for (int32_t x : v) b += pod(x);
    kv(k, 9, b);
  }
  void f32_array(const std::string& k, const std::vector<float>& v) {
    std::string b = pod<uint32_t>(6) + pod<uint64_t>(v.size());
    for (float x : v) b += pod(x);
    kv(k, 9, b);
  }
  /// A raw key/value with any type id and payload (for malformed cases).
  void kv(const std::string& k, uint32_t type, const std::string& payload) {
    if (omit.count(k)) return;
    kvs_ += s(k) + pod(type) + payload;
    ++n_kv_;
  }
  void tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type, std::string data,
              int64_t offset = -1) {
    if (omit.count(name)) return;
    tensors_.push_back({name, std::move(ne), type, std::move(data), offset});
  }
  /// F32 tensor from values.
  void tensor_f32(const std::string& name, std::vector<uint64_t> ne, const std::vector<float>& v) {
    std::string d(v.size() * 4, '\0');
    std::memcpy(d.data(), v.data(), d.size());
    tensor(name, std::move(ne), 0, std::move(d));
  }

  /// Drops every tensor added so far (a vocab-only file: metadata, no weights).
  void drop_tensors() { tensors_.clear(); }

  std::string bytes() const {
    std::string out = magic + pod(version) + pod<uint64_t>(tensors_.size()) + pod<uint64_t>(n_kv_) + kvs_;
    uint64_t off = 0;
    std::vector<uint64_t> offs;
    for (const Tensor& t : tensors_) {
      off = (off + alignment - 1) / alignment * alignment;
      const uint64_t o = t.offset >= 0 ? static_cast<uint64_t>(t.offset) : off;
      offs.push_back(o);
      out += s(t.name) + pod<uint32_t>(t.ne.size());
      for (uint64_t d : t.ne) out += pod(d);
      out += pod(t.type) + pod(o);
      off = std::max(off, o + t.data.size());
    }
    out.resize((out.size() + alignment - 1) / alignment * alignment, '\0');
    const size_t base = out.size();
    for (size_t i = 0; i < tensors_.size(); ++i) {
      if (out.size() < base + offs[i] + tensors_[i].data.size())
        out.resize(base + offs[i] + tensors_[i].data.size(), '\0');
      std::memcpy(out.data() + base + offs[i], tensors_[i].data.data(), tensors_[i].data.size());
    }
    return out;
  }

  template <typename T>
  static std::string pod(T v) {
    std::string b(sizeof(T), '\0');
    std::memcpy(b.data(), &v, sizeof(T));
    return b;
  }
  static std::string s(const std::string& v) { return pod<uint64_t>(v.size()) + v; }

 private:
  std::string kvs_;
  uint64_t n_kv_ = 0;
  std::vector<Tensor> tensors_;
};

/// A complete tiny llama GGUF (2 layers, hidden 8, 2 heads / 1 kv head, ffn 16, vocab 12, F32/F16/
/// Q8_0 tensors, gpt2 tokenizer with merges and a control token). `tied`: no output.weight. `arch`
/// "qwen2" adds q/k/v biases; "qwen3" adds attention.key_length / value_length (4) and the q/k norms.
/// Names in `omit` (keys or tensors) are left out, so a test can drop or replace them.
inline GgufBuilder tiny_llama_gguf(bool tied = true, const std::string& arch = "llama",
                                   std::set<std::string> omit = {}) {
  GgufBuilder b;
  b.omit = std::move(omit);
  b.str("general.architecture", arch);
  b.u32(arch + ".embedding_length", 8);
  b.u32(arch + ".block_count", 2);
  b.u32(arch + ".feed_forward_length", 16);
  b.u32(arch + ".attention.head_count", 2);
  b.u32(arch + ".attention.head_count_kv", 1);
  b.u32(arch + ".context_length", 64);
  b.f32(arch + ".rope.freq_base", 10000.f);
  b.f32(arch + ".attention.layer_norm_rms_epsilon", 1e-5f);
  b.u32(arch + ".vocab_size", 12);
  if (arch == "qwen3") {  // llama.cpp writes Qwen3's head_dim (here 8 / 2 heads = 4)
    b.u32(arch + ".attention.key_length", 4);
    b.u32(arch + ".attention.value_length", 4);
  }
  b.str("tokenizer.ggml.model", "gpt2");
  b.str("tokenizer.ggml.pre", "qwen2");
  b.str_array("tokenizer.ggml.tokens", {"<|endoftext|>", "a", "b", "c", "Ġ", "ab", "Ġa", "abc", "d", "e", "<|im_end|>", "f"});
  b.i32_array("tokenizer.ggml.token_type", {3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 3, 1});
  b.str_array("tokenizer.ggml.merges", {"a b", "Ġ a", "ab c"});
  b.u32("tokenizer.ggml.bos_token_id", 0);
  b.u32("tokenizer.ggml.eos_token_id", 10);
  b.boolean("tokenizer.ggml.add_bos_token", false);
  b.str("tokenizer.chat_template", "{% for m in messages %}{{ m['content'] }}{% endfor %}");
  uint32_t seed = 1;
  auto vals = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) {
      seed = seed * 1664525u + 1013904223u;
      x = static_cast<float>(static_cast<int32_t>(seed >> 8) % 2001 - 1000) / 1000.f;
    }
    return v;
  };
  b.tensor_f32("token_embd.weight", {8, 12}, vals(96));
  b.tensor_f32("output_norm.weight", {8}, vals(8));
  if (!tied) b.tensor_f32("output.weight", {8, 12}, vals(96));
  for (int l = 0; l < 2; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    b.tensor_f32(p + "attn_norm.weight", {8}, vals(8));
    b.tensor_f32(p + "ffn_norm.weight", {8}, vals(8));
    b.tensor_f32(p + "attn_q.weight", {8, 8}, vals(64));
    b.tensor_f32(p + "attn_k.weight", {8, 4}, vals(32));
    b.tensor_f32(p + "attn_v.weight", {8, 4}, vals(32));
    b.tensor_f32(p + "attn_output.weight", {8, 8}, vals(64));
    b.tensor_f32(p + "ffn_gate.weight", {8, 16}, vals(128));
    b.tensor_f32(p + "ffn_up.weight", {8, 16}, vals(128));
    b.tensor_f32(p + "ffn_down.weight", {16, 8}, vals(128));
    if (arch == "qwen2") {
      b.tensor_f32(p + "attn_q.bias", {8}, vals(8));
      b.tensor_f32(p + "attn_k.bias", {4}, vals(4));
      b.tensor_f32(p + "attn_v.bias", {4}, vals(4));
    } else if (arch == "qwen3") {
      b.tensor_f32(p + "attn_q_norm.weight", {4}, vals(4));
      b.tensor_f32(p + "attn_k_norm.weight", {4}, vals(4));
    }
  }
  b.omit.clear();
  return b;
}

}  // namespace qlora::test
