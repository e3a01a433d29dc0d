#include "trainer/model.h"

#include <cmath>
#include <filesystem>

#include "common/error.h"
#include "common/tensor_io.h"

namespace qlora {
namespace F = torch::nn::functional;
using torch::indexing::Slice;

torch::Tensor FrozenLinear::forward(const torch::Tensor& x) const {
  return bias.defined() ? torch::nn::functional::linear(x, weight, bias)
                        : torch::nn::functional::linear(x, weight);
}

torch::Dtype parse_compute_dtype(const std::string& s, const torch::Device& device) {
  if (s == "fp32" || s == "float32") return torch::kFloat32;
  if (s == "bf16" || s == "bfloat16") return torch::kBFloat16;
  if (s == "fp16" || s == "float16") return torch::kFloat16;
  if (s == "auto") return device.is_cuda() ? torch::kBFloat16 : torch::kFloat32;
  fail("dtype '", s, "' is not one of fp32, bf16, fp16, auto");
}

torch::Tensor rope_inv_freq(const ModelConfig& cfg) {
  const int64_t dim = cfg.head_dim;
  // transformers: 1 / base^(arange(0, dim, 2, int64).float() / dim)
  torch::Tensor exponent = torch::arange(0, dim, 2, torch::kLong).to(torch::kFloat) / static_cast<double>(dim);
  torch::Tensor inv = 1.0 / torch::pow(torch::tensor(cfg.rope.theta, torch::kFloat), exponent);
  const RopeConfig& r = cfg.rope;
  if (r.type == "linear") return inv / r.factor;
  if (r.type == "llama3") {
    const double old_len = static_cast<double>(r.original_max_position_embeddings);
    const double low_wavelen = old_len / r.low_freq_factor;
    const double high_wavelen = old_len / r.high_freq_factor;
    torch::Tensor wavelen = 2 * M_PI / inv;
    torch::Tensor scaled = torch::where(wavelen > low_wavelen, inv / r.factor, inv);
    torch::Tensor smooth = (old_len / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
    torch::Tensor smoothed = (1 - smooth) * scaled / r.factor + smooth * scaled;
    torch::Tensor medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
    return torch::where(medium, smoothed, scaled);
  }
  return inv;
}

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  torch::Tensor h = x.to(torch::kFloat32);
  torch::Tensor var = h.pow(2).mean(-1, /*keepdim=*/true);
  h = h * torch::rsqrt(var + eps);
  return weight * h.to(x.scalar_type());
}

namespace {
torch::Tensor rotate_half(const torch::Tensor& x) {
  const int64_t h = x.size(-1) / 2;
  return torch::cat({-x.index({"...", Slice(h, torch::indexing::None)}), x.index({"...", Slice(0, h)})}, -1);
}

// [B, n_kv, S, D] → [B, n_kv * rep, S, D] (transformers' repeat_kv).
torch::Tensor repeat_kv(const torch::Tensor& x, int64_t rep) {
  if (rep == 1) return x;
  const auto s = x.sizes();
  return x.unsqueeze(2).expand({s[0], s[1], rep, s[2], s[3]}).reshape({s[0], s[1] * rep, s[2], s[3]});
}

std::vector<std::string> linear_names() {
  return {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
          "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
}

FrozenLinear* linear_by_suffix(DecoderLayer& l, const std::string& s) {
  if (s == "self_attn.q_proj") return &l.q_proj;
  if (s == "self_attn.k_proj") return &l.k_proj;
  if (s == "self_attn.v_proj") return &l.v_proj;
  if (s == "self_attn.o_proj") return &l.o_proj;
  if (s == "mlp.gate_proj") return &l.gate_proj;
  if (s == "mlp.up_proj") return &l.up_proj;
  return &l.down_proj;
}

struct Shape {
  std::string name;
  std::vector<int64_t> shape;
  torch::Tensor* slot;
};

// Every weight the config implies, with its HF name, expected shape, and where it lives.
std::vector<Shape> expected_weights(LlamaModel& m) {
  const ModelConfig& c = m.config();
  const int64_t q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  std::vector<Shape> out;
  out.push_back({"model.embed_tokens.weight", {c.vocab_size, H}, &m.embed_tokens});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    DecoderLayer& l = m.layers[i];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    out.push_back({p + "input_layernorm.weight", {H}, &l.input_layernorm});
    const std::vector<std::pair<std::string, std::vector<int64_t>>> lin = {
        {"self_attn.q_proj", {q, H}}, {"self_attn.k_proj", {kv, H}}, {"self_attn.v_proj", {kv, H}},
        {"self_attn.o_proj", {H, q}}, {"mlp.gate_proj", {I, H}},     {"mlp.up_proj", {I, H}},
        {"mlp.down_proj", {H, I}}};
    for (const auto& [suffix, shape] : lin) {
      FrozenLinear* f = linear_by_suffix(l, suffix);
      f->name = p + suffix;
      out.push_back({f->name + ".weight", shape, &f->weight});
      const bool is_qkv = suffix != "self_attn.o_proj" && suffix.rfind("self_attn", 0) == 0;
      const bool is_attn = suffix.rfind("self_attn", 0) == 0;
      const bool has_bias = (is_attn && c.attention_bias) || (is_qkv && c.qkv_bias) || (!is_attn && c.mlp_bias);
      if (has_bias) out.push_back({f->name + ".bias", {shape[0]}, &f->bias});
    }
    out.push_back({p + "post_attention_layernorm.weight", {H}, &l.post_attention_layernorm});
  }
  out.push_back({"model.norm.weight", {H}, &m.norm});
  if (!c.tie_word_embeddings) out.push_back({"lm_head.weight", {c.vocab_size, H}, &m.lm_head});
  return out;
}
}  // namespace

LlamaModel::LlamaModel(ModelConfig cfg, torch::Dtype dtype, torch::Device device)
    : cfg_(std::move(cfg)), dtype_(dtype), device_(device) {
  layers.resize(cfg_.num_hidden_layers);
  inv_freq_ = rope_inv_freq(cfg_).to(device_);
  expected_weights(*this);  // assigns module names
}

LlamaModel LlamaModel::load(const std::string& dir, torch::Dtype dtype, torch::Device device) {
  LlamaModel m(load_model_config(dir), dtype, device);
  st::SafetensorsCheckpoint ckpt(dir);
  for (const Shape& w : expected_weights(m)) {
    QLORA_CHECK(ckpt.contains(w.name), dir, ": tensor '", w.name, "' is missing from the checkpoint");
    const st::TensorInfo& info = ckpt.info(w.name);
    QLORA_CHECK(info.shape == w.shape, ckpt.file_of(w.name).path(), ": tensor '", w.name,
                "': expected shape ", c10::IntArrayRef(w.shape), ", got ", c10::IntArrayRef(info.shape));
    QLORA_CHECK(info.dtype == st::DType::F32 || info.dtype == st::DType::F16 || info.dtype == st::DType::BF16,
                ckpt.file_of(w.name).path(), ": tensor '", w.name, "': expected a float dtype, got ",
                st::dtype_name(info.dtype));
    *w.slot = load_tensor(ckpt, w.name).to(device, dtype, /*non_blocking=*/false, /*copy=*/true);
  }
  if (m.cfg_.tie_word_embeddings) m.lm_head = m.embed_tokens;
  return m;
}

LlamaModel LlamaModel::random_init(const ModelConfig& cfg, uint64_t seed, torch::Dtype dtype,
                                   torch::Device device, double std) {
  LlamaModel m(cfg, dtype, device);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (const Shape& w : expected_weights(m)) {
    const bool is_norm = w.name.find("norm") != std::string::npos;
    const bool is_bias = w.name.size() > 5 && w.name.compare(w.name.size() - 5, 5, ".bias") == 0;
    torch::Tensor t;
    if (is_norm) t = torch::ones(w.shape);
    else if (is_bias) t = torch::zeros(w.shape);
    else t = at::normal(0.0, std, w.shape, gen);
    *w.slot = t.to(device, dtype);
  }
  if (cfg.tie_word_embeddings) m.lm_head = m.embed_tokens;
  return m;
}

std::vector<std::pair<std::string, torch::Tensor>> LlamaModel::named_tensors() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const Shape& w : expected_weights(const_cast<LlamaModel&>(*this))) out.emplace_back(w.name, *w.slot);
  return out;
}

std::pair<torch::Tensor, torch::Tensor> LlamaModel::rope(const torch::Tensor& position_ids) const {
  // freqs[b, t, i] = pos[b, t] * inv_freq[i] in fp32; emb = cat(freqs, freqs).
  torch::Tensor freqs = position_ids.to(torch::kFloat32).unsqueeze(-1) * inv_freq_.view({1, 1, -1});
  torch::Tensor emb = torch::cat({freqs, freqs}, -1);
  return {emb.cos().to(dtype_), emb.sin().to(dtype_)};
}

torch::Tensor LlamaModel::build_mask(const ForwardInputs& in, const torch::Tensor& key_mask,
                                     int64_t past) const {
  const int64_t B = in.input_ids.size(0), T = in.input_ids.size(1), S = past + T;
  const bool window = cfg_.sliding_window > 0 && S > cfg_.sliding_window;
  if (!key_mask.defined() && !in.segment_ids.defined() && past == 0 && !window) return {};
  auto opts = torch::TensorOptions().device(device_);
  torch::Tensor qpos = torch::arange(past, S, opts.dtype(torch::kLong)).view({T, 1});
  torch::Tensor kpos = torch::arange(0, S, opts.dtype(torch::kLong)).view({1, S});
  torch::Tensor allowed = (kpos <= qpos).view({1, 1, T, S}).expand({B, 1, T, S});
  if (window) allowed = allowed.logical_and((qpos - kpos < cfg_.sliding_window).view({1, 1, T, S}));
  if (key_mask.defined()) allowed = allowed.logical_and(key_mask.to(torch::kBool).view({B, 1, 1, S}));
  if (in.segment_ids.defined()) {
    QLORA_CHECK(past == 0, "segment_ids (packing) cannot be combined with a KV cache");
    torch::Tensor seg = in.segment_ids.to(device_);
    allowed = allowed.logical_and((seg.unsqueeze(2) == seg.unsqueeze(1)).unsqueeze(1));
  }
  // A query that may attend nothing (a padding position) attends to itself, so SDPA stays finite;
  // real tokens never attend to padding, so their outputs are unaffected.
  torch::Tensor self = (kpos == qpos).view({1, 1, T, S});
  return allowed.logical_or(self);
}

torch::Tensor LlamaModel::hidden_states(const ForwardInputs& in, KVCache* cache) const {
  TORCH_CHECK(in.input_ids.dim() == 2, "input_ids: expected [B, T], got ", in.input_ids.sizes());
  const int64_t B = in.input_ids.size(0), T = in.input_ids.size(1);
  const int64_t past = cache ? cache->length() : 0;
  torch::Tensor ids = in.input_ids.to(device_, torch::kLong);

  // Key mask over [0, past + T): cached tokens' mask, then this chunk's.
  torch::Tensor key_mask;
  torch::Tensor chunk_mask = in.attention_mask.defined()
                                 ? in.attention_mask.to(device_, torch::kLong)
                                 : torch::Tensor();
  if (cache) {
    torch::Tensor cm = chunk_mask.defined() ? chunk_mask : torch::ones({B, T}, ids.options());
    cache->mask = cache->mask.defined() ? torch::cat({cache->mask, cm}, 1) : cm;
    if (cache->mask.eq(0).any().item<bool>()) key_mask = cache->mask;
  } else if (chunk_mask.defined() && chunk_mask.eq(0).any().item<bool>()) {
    key_mask = chunk_mask;
  }
  torch::Tensor pos;
  if (in.position_ids.defined()) {
    pos = in.position_ids.to(device_, torch::kLong);
  } else if (cache && cache->mask.defined()) {
    pos = (cache->mask.cumsum(1) - 1).clamp_min(0).index({Slice(), Slice(past, torch::indexing::None)});
  } else if (chunk_mask.defined()) {
    pos = (chunk_mask.cumsum(1) - 1).clamp_min(0);
  } else {
    pos = torch::arange(0, T, ids.options()).unsqueeze(0).expand({B, T});
  }
  torch::Tensor mask = build_mask(in, key_mask, past);
  auto [cos, sin] = rope(pos);
  cos = cos.unsqueeze(1);  // [B, 1, T, D]
  sin = sin.unsqueeze(1);

  const int64_t nh = cfg_.num_attention_heads, nkv = cfg_.num_key_value_heads, hd = cfg_.head_dim;
  if (cache && cache->k.empty()) {
    cache->k.resize(layers.size());
    cache->v.resize(layers.size());
  }
  torch::Tensor h = F::embedding(ids, embed_tokens);
  for (size_t li = 0; li < layers.size(); ++li) {
    const DecoderLayer& L = layers[li];
    torch::Tensor x = rms_norm(h, L.input_layernorm, cfg_.rms_norm_eps);
    torch::Tensor q = L.q_proj.forward(x).view({B, T, nh, hd}).transpose(1, 2);
    torch::Tensor k = L.k_proj.forward(x).view({B, T, nkv, hd}).transpose(1, 2);
    torch::Tensor v = L.v_proj.forward(x).view({B, T, nkv, hd}).transpose(1, 2);
    q = q * cos + rotate_half(q) * sin;
    k = k * cos + rotate_half(k) * sin;
    if (cache) {
      if (cache->k[li].defined()) {
        k = torch::cat({cache->k[li], k}, 2);
        v = torch::cat({cache->v[li], v}, 2);
      }
      cache->k[li] = k;
      cache->v[li] = v;
    }
    const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
    torch::Tensor a = at::scaled_dot_product_attention(
        q, repeat_kv(k, nh / nkv), repeat_kv(v, nh / nkv), mask.defined() ? c10::optional<at::Tensor>(mask) : c10::nullopt,
        0.0, /*is_causal=*/!mask.defined(), scale);
    a = a.transpose(1, 2).reshape({B, T, nh * hd});
    h = h + L.o_proj.forward(a);
    x = rms_norm(h, L.post_attention_layernorm, cfg_.rms_norm_eps);
    h = h + L.down_proj.forward(torch::silu(L.gate_proj.forward(x)) * L.up_proj.forward(x));
  }
  return rms_norm(h, norm, cfg_.rms_norm_eps);
}

torch::Tensor LlamaModel::lm_head_forward(const torch::Tensor& hidden) const {
  return F::linear(hidden, lm_head);
}

}  // namespace qlora
