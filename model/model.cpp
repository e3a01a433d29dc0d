#include "model/model.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <nlohmann/json.hpp>
#include "common/error.h"
#include "common/json_file.h"
#include "common/log.h"
#include "common/tensor_io.h"
#include "kernels/quant4.h"

namespace qlora {
namespace F = torch::nn::functional;
using torch::indexing::Slice;
using json = nlohmann::json;

namespace {

/// Carries the quantized weight through autograd's saved_data (an IValue capsule).
struct QuantWeightHolder : torch::CustomClassHolder {
  std::shared_ptr<const QuantizedWeight> q;
};

/// y = x·dequant(W)ᵀ (+ b) with a frozen 4-bit W: forward and backward each dequantize into a
/// temporary in x's dtype; only the 4-bit weight is kept for backward. grad wrt x only.
struct Dequant4Linear : torch::autograd::Function<Dequant4Linear> {
  // The (frozen) bias is added outside: an undefined tensor cannot be a Function input.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x,
                               c10::intrusive_ptr<QuantWeightHolder> h) {
    ctx->saved_data["q"] = c10::IValue::make_capsule(h);
    const torch::Tensor w = h->q->dequantize(x.scalar_type());  // [out, in], scratch
    return F::linear(x, w);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    auto h = c10::static_intrusive_pointer_cast<QuantWeightHolder>(ctx->saved_data["q"].toCapsule());
    const torch::Tensor w = h->q->dequantize(grad[0].scalar_type());
    return {grad[0].matmul(w), torch::Tensor()};  // [..., out]·[out, in]
  }
};

int64_t nbytes(const torch::Tensor& t) { return t.defined() ? t.numel() * t.element_size() : 0; }

}  // namespace

torch::Tensor FrozenLinear::forward(const torch::Tensor& x, bool train) const {
  torch::Tensor y = base_forward(x);
  if (!lora) return y;
  // Inference on a 16-bit model (eval, generate, a run's eval pass): the LoRA branch in float32 and
  // one rounding of the sum, as PEFT's lora.Linear computes it with its adapter weights in float32
  // (PeftModel.from_pretrained's default autocast_adapter_dtype=True: x cast to lora_A's dtype,
  // the bf16 result + the fp32 branch promoted, then cast back). Training keeps the branch in the
  // compute dtype, as it runs under the HF Trainer's bf16 autocast (trial 21: a bf16 adapter's
  // greedy text differed from PeftModel's on 5 of 5 prompts).
  if (!train && y.scalar_type() != torch::kFloat32)
    return (y.to(torch::kFloat32) + lora->delta(x.to(torch::kFloat32), false)).to(y.scalar_type());
  return y + lora->delta(x, train);
}

int64_t FrozenLinear::in_features() const { return qweight ? qweight->shape.at(1) : weight.size(1); }
int64_t FrozenLinear::out_features() const { return qweight ? qweight->shape.at(0) : weight.size(0); }

torch::Tensor FrozenLinear::base_forward(const torch::Tensor& x) const {
  if (qweight) {
    if (torch::GradMode::is_enabled() && x.requires_grad()) {
      auto h = c10::make_intrusive<QuantWeightHolder>();
      h->q = qweight;
      torch::Tensor y = Dequant4Linear::apply(x, h);
      return bias.defined() ? y + bias : y;
    }
    if (dequantized.defined() && dequantized.scalar_type() == x.scalar_type())  // inference cache
      return bias.defined() ? F::linear(x, dequantized, bias) : F::linear(x, dequantized);
    const torch::Tensor w = qweight->dequantize(x.scalar_type());  // freed on return
    return bias.defined() ? F::linear(x, w, bias) : F::linear(x, w);
  }
  return bias.defined() ? torch::nn::functional::linear(x, weight, bias)
                        : torch::nn::functional::linear(x, weight);
}

int64_t FrozenLinear::bytes() const {
  return nbytes(weight) + nbytes(bias) + (qweight ? qweight->bytes() : 0);
}

torch::Dtype torch_dtype(DType d, const torch::Device& device) {
  switch (resolve_dtype(d, device.is_cuda())) {
    case DType::kBF16: return torch::kBFloat16;
    case DType::kFP16: return torch::kFloat16;
    case DType::kFP32: return torch::kFloat32;
    case DType::kAuto: break;
  }
  fail("internal: dtype auto left unresolved");
}

DType dtype_of(torch::Dtype d) {
  if (d == torch::kBFloat16) return DType::kBF16;
  if (d == torch::kFloat16) return DType::kFP16;
  if (d == torch::kFloat32) return DType::kFP32;
  fail("dtype ", d, " is not a floating-point compute dtype (bf16, fp16, fp32)");
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
  FrozenLinear* linear = nullptr;  ///< set for a decoder linear's ".weight"
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
    if (c.qk_norm) {
      out.push_back({p + "self_attn.q_norm.weight", {c.head_dim}, &l.q_norm});
      out.push_back({p + "self_attn.k_norm.weight", {c.head_dim}, &l.k_norm});
    }
    for (const auto& [suffix, shape] : lin) {
      FrozenLinear* f = linear_by_suffix(l, suffix);
      f->name = p + suffix;
      out.push_back({f->name + ".weight", shape, &f->weight, f});
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

namespace {

/// Drops this process's pages of tensor `t` in its mapping (madvise DONTNEED, rounded out to whole
/// pages). The mapping is private and never written during load, so a dropped page is simply read
/// from the file again if touched; this keeps the file's pages out of RSS once a tensor is done.
void release_pages(const st::SafetensorsFile& f, const st::TensorInfo& t) {
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t lo = reinterpret_cast<uintptr_t>(f.mapping()->data());
  const uintptr_t hi = (lo + f.mapping()->size() + page - 1) & ~(page - 1);
  uintptr_t b = reinterpret_cast<uintptr_t>(f.data(t)) & ~(page - 1);
  uintptr_t e = (reinterpret_cast<uintptr_t>(f.data(t)) + t.nbytes() + page - 1) & ~(page - 1);
  b = std::max(b, lo);
  e = std::min(e, hi);
  if (e > b) ::madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED);
}

void release_pages(const st::SafetensorsCheckpoint& ck, const std::string& name) {
  release_pages(ck.file_of(name), ck.info(name));
}

/// config.json's quantization_config, when it is bitsandbytes'.
struct BnbConfig {
  bool present = false;
  bool load_in_8bit = false;
  std::string quant_type;  ///< bnb_4bit_quant_type
  bool double_quant = false;
};

BnbConfig read_bnb_config(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  const json j = read_json_object_file(path);
  BnbConfig c;
  if (!j.contains("quantization_config")) return c;
  const json& qc = j["quantization_config"];
  QLORA_CHECK(qc.is_object(), path, ": quantization_config: expected an object");
  const std::string method = qc.value("quant_method", std::string("bitsandbytes"));
  QLORA_CHECK(method == "bitsandbytes", path, ": quantization_config.quant_method '", method,
              "' is not supported (only bitsandbytes 4-bit checkpoints are)");
  c.present = true;
  c.load_in_8bit = qc.value("load_in_8bit", false) || qc.value("_load_in_8bit", false);
  c.quant_type = qc.value("bnb_4bit_quant_type", std::string("fp4"));  // transformers' default
  c.double_quant = qc.value("bnb_4bit_use_double_quant", false);
  QLORA_CHECK(c.load_in_8bit || qc.value("load_in_4bit", false) || qc.value("_load_in_4bit", false),
              path, ": quantization_config asks for neither load_in_4bit nor load_in_8bit");
  return c;
}

/// A small tensor of the checkpoint, copied out of the mapping (and its pages released); checks
/// dtype and element count, naming the tensor.
torch::Tensor read_small(const st::SafetensorsCheckpoint& ck, const std::string& name, st::DType dtype,
                         int64_t numel, const std::string& why) {
  QLORA_CHECK(ck.contains(name), "tensor '", name, "' is missing from the checkpoint (", why, ")");
  const st::TensorInfo& t = ck.info(name);
  QLORA_CHECK(t.dtype == dtype && t.numel() == numel, ck.file_of(name).path(), ": tensor '", name,
              "': expected ", st::dtype_name(dtype), " with ", numel, " elements (", why, "), got ",
              st::dtype_name(t.dtype), " ", c10::IntArrayRef(t.shape));
  torch::Tensor out = load_tensor(ck, name).reshape({numel}).clone();
  release_pages(ck, name);
  return out;
}

/// The quant_state key of a bnb 4-bit weight ("<w>.quant_state.bitsandbytes__nf4" / "__fp4"),
/// or "" when there is none.
std::string bnb_state_key(const st::SafetensorsCheckpoint& ck, const std::string& wname) {
  std::string found;
  for (const char* t : {"nf4", "fp4"}) {
    const std::string k = wname + ".quant_state.bitsandbytes__" + t;
    if (!ck.contains(k)) continue;
    QLORA_CHECK(found.empty(), ck.file_of(k).path(), ": tensor '", wname,
                "' has both an nf4 and an fp4 quant_state");
    found = k;
  }
  return found;
}

/// The header of a bitsandbytes 4-bit weight from its quant_state tensor `state_key` (U8, UTF-8
/// JSON): type, blocksize, shape, dtype, double_quant and the nested offset; no tensor data.
/// Throws qlora::Error naming the tensor for a malformed or unsupported quant_state.
QuantizedWeight read_bnb_state(const st::SafetensorsCheckpoint& ck, const std::string& state_key) {
  const std::string where = ck.file_of(state_key).path() + ": tensor '" + state_key + "'";
  const st::TensorInfo& si = ck.info(state_key);
  QLORA_CHECK(si.dtype == st::DType::U8, where, ": expected U8 (packed JSON), got ", st::dtype_name(si.dtype));
  const std::string text(reinterpret_cast<const char*>(ck.file_of(state_key).data(si)), si.nbytes());
  release_pages(ck, state_key);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail(where, ": malformed quant_state JSON: ", e.what());
  }
  QuantizedWeight q;
  try {
    QLORA_CHECK(j.is_object(), where, ": malformed quant_state JSON: expected an object");
    const std::string qt = j.at("quant_type").get<std::string>();
    const std::string key_type = state_key.substr(state_key.size() - 3);
    QLORA_CHECK(qt == key_type, where, ": quant_state says quant_type '", qt, "' but the key says '",
                key_type, "'");
    q.type = kernels::parse_quant_type(qt);
    q.blocksize = j.at("blocksize").get<int64_t>();
    q.shape = j.at("shape").get<std::vector<int64_t>>();
    const std::string dt = j.at("dtype").get<std::string>();
    const std::optional<DType> d = dtype_from_hf_name(dt);
    QLORA_CHECK(d.has_value(), where, ": quant_state dtype '", dt, "' is not float32/bfloat16/float16");
    q.dtype = torch_dtype(*d, torch::kCPU);
    q.double_quant = j.contains("nested_offset") || j.contains("nested_blocksize");
    if (q.double_quant) {
      QLORA_CHECK(j.at("nested_blocksize").get<int64_t>() == kernels::kNestedBlocksize, where,
                  ": nested_blocksize must be 256, got ", j.at("nested_blocksize"));
      QLORA_CHECK(j.value("nested_dtype", std::string("float32")) == "float32", where,
                  ": nested_dtype must be float32, got ", j.at("nested_dtype"));
      q.offset = static_cast<float>(j.at("nested_offset").get<double>());
    }
  } catch (const json::exception& e) {
    fail(where, ": malformed quant_state JSON: ", e.what());
  }
  QLORA_CHECK(kernels::quant4_valid_blocksize(q.blocksize), where, ": blocksize ", q.blocksize,
              " is not a power of two in 32..4096");
  return q;
}

/// Reads one bitsandbytes 4-bit weight as stored by Linear4bit._save_to_state_dict
/// (bnb functional.QuantState.as_dict(packed=True)): "<w>" packed bytes (U8 [ceil(n/2), 1], or any
/// storage dtype of that many bytes), "<w>.absmax" (F32 [nblocks], or U8 with double quant),
/// "<w>.quant_map" F32 [16], double quant: "<w>.nested_absmax" F32 [ceil(nblocks/256)],
/// "<w>.nested_quant_map" F32 [256]; "<state_key>" U8 = UTF-8 JSON {quant_type, blocksize, dtype,
/// shape[, nested_blocksize, nested_dtype, nested_offset]}.
QuantizedWeight read_bnb_weight(const st::SafetensorsCheckpoint& ck, const std::string& wname,
                                const std::string& state_key, const std::vector<int64_t>& shape) {
  const std::string where = ck.file_of(state_key).path() + ": tensor '" + state_key + "'";
  QuantizedWeight q = read_bnb_state(ck, state_key);
  QLORA_CHECK(q.shape == shape, where, ": quant_state shape ", c10::IntArrayRef(q.shape),
              " differs from the expected ", c10::IntArrayRef(shape));
  const int64_t n = q.numel(), nblocks = kernels::quant4_num_blocks(n, q.blocksize);

  const st::TensorInfo& wi = ck.info(wname);
  QLORA_CHECK(static_cast<int64_t>(wi.nbytes()) == kernels::quant4_packed_bytes(n), ck.file_of(wname).path(),
              ": tensor '", wname, "': expected ", kernels::quant4_packed_bytes(n),
              " bytes of packed 4-bit data for shape ", c10::IntArrayRef(shape), ", got ", wi.nbytes(), " (",
              st::dtype_name(wi.dtype), " ", c10::IntArrayRef(wi.shape), ")");
  q.packed = torch::empty({static_cast<int64_t>(wi.nbytes())}, torch::kUInt8);
  std::memcpy(q.packed.data_ptr<uint8_t>(), ck.file_of(wname).data(wi), wi.nbytes());
  release_pages(ck, wname);

  const torch::Tensor code = read_small(ck, wname + ".quant_map", st::DType::F32, 16, "4-bit code map");
  const float* ours = kernels::quant4_code(q.type);
  bool same_code = true;  // by value: bnb stores FP4 code 8 as +0.0, our table has −0.0 (same decode)
  for (int i = 0; i < 16; ++i) same_code = same_code && code.data_ptr<float>()[i] == ours[i];
  QLORA_CHECK(same_code,
              ck.file_of(wname + ".quant_map").path(), ": tensor '", wname,
              ".quant_map' is not bitsandbytes' ", kernels::quant_type_name(q.type), " code (custom maps are unsupported)");
  if (q.double_quant) {
    q.absmax_q = read_small(ck, wname + ".absmax", st::DType::U8, nblocks, "double-quantized absmax");
    q.nested_absmax = read_small(ck, wname + ".nested_absmax", st::DType::F32,
                                 kernels::quant4_num_blocks(nblocks, kernels::kNestedBlocksize),
                                 "the quant_state says double quant");
    q.nested_code = read_small(ck, wname + ".nested_quant_map", st::DType::F32, 256,
                               "the quant_state says double quant");
  } else {
    QLORA_CHECK(!ck.contains(wname + ".nested_absmax"), ck.file_of(wname + ".nested_absmax").path(),
                ": tensor '", wname, ".nested_absmax' present but quant_state '", state_key,
                "' has no nested_offset / nested_blocksize");
    q.absmax = read_small(ck, wname + ".absmax", st::DType::F32, nblocks, "absmax");
  }
  return q;
}

}  // namespace

void check_tied_lm_head(const st::SafetensorsCheckpoint& ckpt, const ModelConfig& cfg, const std::string& dir) {
  const std::string head = "lm_head.weight", embed = "model.embed_tokens.weight";
  if (!cfg.tie_word_embeddings || !ckpt.contains(head) || !ckpt.contains(embed)) return;
  const std::string cfg_path = (std::filesystem::path(dir) / "config.json").string();
  const std::string why = cfg_path + ": tie_word_embeddings is true, but " + ckpt.file_of(head).path() +
                          " stores an lm_head.weight that differs from model.embed_tokens.weight";
  const std::string fix = " (transformers then unties them and uses the stored lm_head): set "
                          "tie_word_embeddings: false in config.json, or remove lm_head.weight to tie them";
  const st::TensorInfo& h = ckpt.info(head);
  const st::TensorInfo& e = ckpt.info(embed);
  if (h.shape != e.shape) fail(why, ": its shape ", c10::IntArrayRef(h.shape), " vs ", c10::IntArrayRef(e.shape), fix);
  if (h.dtype == st::DType::U8 || e.dtype == st::DType::U8) return;  // a 4-bit lm_head: never tied storage
  const torch::Tensor a = load_tensor(ckpt, head), b = load_tensor(ckpt, embed);
  constexpr int64_t kRows = 4096;
  for (int64_t r = 0; r < a.size(0); r += kRows) {
    const int64_t n = std::min(kRows, a.size(0) - r);
    if (!a.narrow(0, r, n).to(torch::kFloat).equal(b.narrow(0, r, n).to(torch::kFloat)))
      fail(why, " (first in rows ", r, "..", r + n - 1, ")", fix);
  }
}

std::string MisshapenWeight::message() const {
  std::ostringstream o;
  o << "tensor '" << name << "': expected shape " << c10::IntArrayRef(expected) << ", got " << c10::IntArrayRef(stored);
  return o.str();
}

std::vector<MisshapenWeight> misshapen_weights(const st::SafetensorsCheckpoint& ckpt, const ModelConfig& cfg) {
  LlamaModel names(cfg, torch::kFloat32, torch::kCPU);  // no weight is allocated: names and shapes only
  std::vector<MisshapenWeight> out;
  for (const Shape& w : expected_weights(names))
    if (ckpt.contains(w.name) && (!w.linear || bnb_state_key(ckpt, w.name).empty()) && ckpt.info(w.name).shape != w.shape)
      out.push_back({w.name, w.shape, ckpt.info(w.name).shape});
  return out;
}

std::vector<std::string> missing_weights(const st::SafetensorsCheckpoint& ckpt, const ModelConfig& cfg) {
  LlamaModel names(cfg, torch::kFloat32, torch::kCPU);  // no weight is allocated: the names only
  std::vector<std::string> out;
  for (const Shape& w : expected_weights(names))
    if (!ckpt.contains(w.name)) out.push_back(w.name);
  return out;
}

std::string missing_weight_message(const std::string& name) {
  return "tensor '" + name + "' is missing from the checkpoint" +
         (name == "lm_head.weight" ? " (config.json has tie_word_embeddings: false)" : "");
}

LlamaModel LlamaModel::load(const std::string& dir, torch::Dtype dtype, torch::Device device) {
  return load(dir, dtype, device, QuantOptions{});
}

LlamaModel LlamaModel::load(const std::string& dir, torch::Dtype dtype, torch::Device device,
                            const QuantOptions& q) {
  check_quant_options(q);
  LlamaModel m(load_model_config(dir), dtype, device);
  const BnbConfig bnb = read_bnb_config(dir);
  const std::string cfg_path = (std::filesystem::path(dir) / "config.json").string();
  QLORA_CHECK(!bnb.load_in_8bit, cfg_path, ": quantization_config asks for 8-bit bitsandbytes weights "
              "(load_in_8bit); only 4-bit (nf4/fp4) checkpoints are supported");
  if (bnb.present && q.enabled())
    QLORA_CHECK(bnb.quant_type == kernels::quant_type_name(q.type()), "quantization.method: ",
                kernels::quant_type_name(q.type()), " was requested, but ", cfg_path,
                ": the checkpoint is stored as bitsandbytes ", bnb.quant_type, " (method ", bnb.quant_type,
                " uses it as stored; none dequantizes it)");
  st::SafetensorsCheckpoint ckpt(dir);
  check_tied_lm_head(ckpt, m.cfg_, dir);
  int64_t n_quantized = 0, n_prequantized = 0;
  for (const Shape& w : expected_weights(m)) {
    QLORA_CHECK(ckpt.contains(w.name), dir, ": ", missing_weight_message(w.name));
    const st::TensorInfo& info = ckpt.info(w.name);
    const std::string& path = ckpt.file_of(w.name).path();
    if (w.linear) {
      const std::string state_key = bnb_state_key(ckpt, w.name);
      if (!state_key.empty()) {
        QuantizedWeight qw = read_bnb_weight(ckpt, w.name, state_key, w.shape);
        const char* stored = kernels::quant_type_name(qw.type);
        QLORA_CHECK(!bnb.present || bnb.quant_type == stored, path, ": tensor '", w.name,
                    "' is stored as ", stored, " but config.json's quantization_config asks for ",
                    bnb.quant_type);
        QLORA_CHECK(!q.enabled() || q.type() == qw.type, "quantization.method: ", kernels::quant_type_name(q.type()),
                    " was requested, but ", path, ": tensor '", w.name, "' is stored as ", stored, " (method ",
                    stored, " uses it as stored; none dequantizes it)");
        w.linear->qweight = std::make_shared<const QuantizedWeight>(device.is_cpu() ? std::move(qw) : qw.to(device));
        ++n_prequantized;
        continue;
      }
      QLORA_CHECK(!ckpt.contains(w.name + ".SCB") && info.dtype != st::DType::I8, path, ": tensor '",
                  w.name, "' is stored as 8-bit bitsandbytes (int8 + SCB) but ",
                  bnb.present ? "config.json asks for 4-bit " + bnb.quant_type
                              : std::string("config.json has no quantization_config"),
                  "; 8-bit weights are not supported");
      QLORA_CHECK(!(bnb.present && info.dtype == st::DType::U8), path, ": tensor '", w.name,
                  "' is U8 (4-bit packed?) but its quant_state tensor '", w.name,
                  ".quant_state.bitsandbytes__", bnb.quant_type, "' is missing");
    }
    QLORA_CHECK(info.shape == w.shape, path, ": ", MisshapenWeight{w.name, w.shape, info.shape}.message());
    QLORA_CHECK(info.dtype == st::DType::F32 || info.dtype == st::DType::F16 || info.dtype == st::DType::BF16,
                path, ": tensor '", w.name, "': expected a float dtype, got ", st::dtype_name(info.dtype));
    torch::Tensor src = load_tensor(ckpt, w.name);  // zero-copy view of the mapping (when aligned)
    if (w.linear && !bnb.present && q.quantizes(w.linear->name)) {
      // Quantize the stored values (no rounding to `dtype` first) where the model will live.
      w.linear->qweight = std::make_shared<const QuantizedWeight>(
          quantize(device.is_cpu() ? src : src.to(device), q.type(), q.blocksize, q.double_quant));
      ++n_quantized;
    } else {
      *w.slot = src.to(device, dtype, /*non_blocking=*/false, /*copy=*/true);
    }
    src = torch::Tensor();
    release_pages(ckpt, w.name);
  }
  if (m.cfg_.tie_word_embeddings) m.lm_head = m.embed_tokens;
  if (n_quantized) log::debug(dir, ": quantized ", n_quantized, " linear weights to ", kernels::quant_type_name(q.type()));
  if (n_prequantized) log::debug(dir, ": read ", n_prequantized, " bitsandbytes 4-bit linear weights");
  return m;
}

std::optional<Bnb4StoredWeight> bnb4_stored_weight(const st::SafetensorsCheckpoint& ck, const std::string& wname) {
  const std::string state_key = bnb_state_key(ck, wname);
  if (state_key.empty() || !ck.contains(wname)) return std::nullopt;
  Bnb4StoredWeight w;
  w.header = read_bnb_state(ck, state_key);
  for (const std::string& n : {wname, wname + ".absmax", wname + ".quant_map", wname + ".nested_absmax",
                               wname + ".nested_quant_map", state_key})
    if (ck.contains(n)) {
      w.tensors.push_back(n);
      w.stored_bytes += static_cast<int64_t>(ck.info(n).nbytes());
    }
  return w;
}

LlamaModel LlamaModel::random_init(const ModelConfig& cfg, uint64_t seed, torch::Dtype dtype,
                                   torch::Device device, double std) {
  return random_init(cfg, seed, dtype, device, QuantOptions{}, std);
}

LlamaModel LlamaModel::random_init(const ModelConfig& cfg, uint64_t seed, torch::Dtype dtype,
                                   torch::Device device, const QuantOptions& q, double std,
                                   bool draw_on_device,
                                   const std::function<void(int64_t done, int64_t total)>& progress) {
  check_quant_options(q);
  LlamaModel m(cfg, dtype, device);
  const bool on_device = draw_on_device && !device.is_cpu();
  at::Generator gen;
  if (on_device) {  // a private copy of the device's default generator, reseeded
    gen = at::globalContext().defaultGenerator(device).clone();
    gen.set_current_seed(seed);
  } else {
    gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  }
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(on_device ? device : torch::Device(torch::kCPU));
  const std::vector<Shape> weights = expected_weights(m);
  int64_t total = 0, done = 0;
  for (const Shape& w : weights) total += c10::multiply_integers(w.shape);
  for (const Shape& w : weights) {
    const bool is_norm = w.name.find("norm") != std::string::npos;
    const bool is_bias = w.name.size() > 5 && w.name.compare(w.name.size() - 5, 5, ".bias") == 0;
    torch::Tensor t;
    if (is_norm) t = torch::ones(w.shape, f32);
    else if (is_bias) t = torch::zeros(w.shape, f32);
    else t = at::normal(0.0, std, w.shape, gen, f32);
    if (w.linear && q.quantizes(w.linear->name))
      w.linear->qweight = std::make_shared<const QuantizedWeight>(
          quantize(t.to(device, dtype), q.type(), q.blocksize, q.double_quant));
    else
      *w.slot = t.to(device, dtype);
    done += c10::multiply_integers(w.shape);
    if (progress) progress(done, total);
  }
  if (cfg.tie_word_embeddings) m.lm_head = m.embed_tokens;
  return m;
}

std::vector<std::pair<std::string, torch::Tensor>> LlamaModel::named_tensors() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const Shape& w : expected_weights(const_cast<LlamaModel&>(*this)))
    if (w.slot->defined()) out.emplace_back(w.name, *w.slot);
  return out;
}

std::vector<const FrozenLinear*> LlamaModel::linears() const {
  std::vector<const FrozenLinear*> out;
  for (const DecoderLayer& l : layers)
    for (const FrozenLinear* f : {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj, &l.up_proj, &l.down_proj})
      out.push_back(f);
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

namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// RNG states that LoRA dropout draws from (the default CPU generator, and CUDA's when used).
struct RngState {
  torch::Tensor cpu, cuda;
  static RngState capture(bool with_cuda) {
    RngState r;
    r.cpu = at::detail::getDefaultCPUGenerator().get_state();
    if (with_cuda) r.cuda = at::globalContext().defaultGenerator(c10::DeviceType::CUDA).get_state();
    return r;
  }
  void restore() const {
    at::Generator g = at::detail::getDefaultCPUGenerator();
    g.set_state(cpu);
    if (cuda.defined()) {
      at::Generator gc = at::globalContext().defaultGenerator(c10::DeviceType::CUDA);
      gc.set_state(cuda);
    }
  }
};

// Kept in saved_data as a capsule (an opaque IValue; no class registration needed). The mask may
// be undefined (plain causal), which an autograd Function cannot take as an input, so it lives here.
struct ModelHolder : torch::CustomClassHolder {
  const LlamaModel* model = nullptr;
  size_t layer = 0;
  torch::Tensor mask;
  RngState rng;
};

/// Gradient checkpointing of one decoder layer (the reentrant scheme of
/// torch.utils.checkpoint): forward runs without a graph and keeps only the layer input (plus the
/// shared rope/mask tensors); backward restores the RNG state (so dropout masks match), reruns the
/// layer with grad and backpropagates through it, which accumulates the LoRA gradients.
struct LayerCheckpoint : public torch::autograd::Function<LayerCheckpoint> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& h, const torch::Tensor& cos,
                               const torch::Tensor& sin, c10::intrusive_ptr<ModelHolder> m) {
    m->rng = RngState::capture(h.is_cuda());
    ctx->saved_data["m"] = c10::IValue::make_capsule(m);
    ctx->save_for_backward({h, cos, sin});
    torch::NoGradGuard ng;
    return m->model->layer_forward(m->layer, h, cos, sin, m->mask, nullptr);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    auto m = c10::static_intrusive_pointer_cast<ModelHolder>(ctx->saved_data["m"].toCapsule());
    auto saved = ctx->get_saved_variables();
    torch::Tensor h = saved[0].detach().requires_grad_(true);
    const RngState now = RngState::capture(h.is_cuda());
    m->rng.restore();
    torch::Tensor out;
    {
      torch::AutoGradMode on(true);
      out = m->model->layer_forward(m->layer, h, saved[1], saved[2], m->mask, nullptr);
    }
    now.restore();
    torch::autograd::backward({out}, {grad_out[0]});
    return {h.grad(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

torch::Tensor checkpointed_layer(const LlamaModel& model, size_t li, const torch::Tensor& h, const torch::Tensor& cos,
                                 const torch::Tensor& sin, const torch::Tensor& mask) {
  auto m = c10::make_intrusive<ModelHolder>();
  m->model = &model;
  m->layer = li;
  m->mask = mask;
  return LayerCheckpoint::apply(h, cos, sin, m);
}
}  // namespace

std::vector<FrozenLinear*> LlamaModel::linears() {
  std::vector<FrozenLinear*> out;
  for (DecoderLayer& l : layers)
    for (FrozenLinear* f : {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj, &l.up_proj, &l.down_proj})
      out.push_back(f);
  return out;
}

int64_t LlamaModel::cache_dequantized(int64_t max_bytes) {
  int64_t bytes = 0;
  const int64_t elem = static_cast<int64_t>(c10::elementSize(dtype_));
  for (const FrozenLinear* f : const_cast<const LlamaModel*>(this)->linears())
    if (f->quantized()) bytes += f->in_features() * f->out_features() * elem;
  if (bytes == 0 || bytes > max_bytes) return 0;
  for (FrozenLinear* f : linears())
    if (f->quantized()) f->dequantized = f->qweight->dequantize(dtype_);
  return bytes;
}

void LlamaModel::drop_dequantized() {
  for (FrozenLinear* f : linears()) f->dequantized = torch::Tensor();
}

namespace {
/// Refuses a LoRA target naming lm_head or embed_tokens, with the reason. Both stay frozen in the
/// compute dtype (bitsandbytes and PEFT's QLoRA recipe keep them unquantized); a tied lm_head is
/// the embedding matrix itself, so an adapter on either would change both (PEFT warns about this
/// case, "tied_target_modules"; we refuse it rather than train something merge cannot write back).
void check_lora_targets(const ModelConfig& c, const std::vector<std::string>& targets) {
  for (const std::string& t : targets) {
    const std::string last = t.substr(t.rfind('.') + 1);
    if (last != "lm_head" && last != "embed_tokens") continue;
    fail("lora.target_modules: '", t, "' cannot carry a LoRA adapter: lm_head and embed_tokens stay frozen and ",
         "unquantized (as in bitsandbytes/PEFT QLoRA)",
         c.tie_word_embeddings ? ", and this model ties lm_head to embed_tokens (tie_word_embeddings: true), so an "
                                 "adapter on one would change the other"
                               : "",
         "; adapt the decoder linears instead (all-linear, or q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
         "down_proj)");
  }
}
}  // namespace

std::map<std::string, int64_t> LlamaModel::add_lora(const LoraOptions& o) {
  const std::vector<std::string>& targets = o.target_modules;
  QLORA_CHECK(!targets.empty(), "lora.target_modules: no target given");
  check_lora_targets(cfg_, targets);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  std::map<std::string, int64_t> counts;
  for (FrozenLinear* f : linears()) {
    if (!lora_targets_module(f->name, targets)) continue;
    f->lora = std::make_shared<LoraAdapter>(
        LoraAdapter::create(f->in_features(), f->out_features(), o, gen, device_));
    counts[f->name.substr(f->name.rfind('.') + 1)] += 1;
  }
  for (const std::string& t : targets) {
    bool hit = false;
    for (const FrozenLinear* f : const_cast<const LlamaModel*>(this)->linears())
      hit = hit || lora_targets_module(f->name, {t});
    QLORA_CHECK(hit, "lora.target_modules: '", t, "' matches no module of this model (linear modules: ",
                "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj; or all-linear)");
  }
  return counts;
}

ModuleShapes LlamaModel::lora_shapes(const std::vector<std::string>& targets) const {
  check_lora_targets(cfg_, targets);
  ModuleShapes out;
  for (const FrozenLinear* f : linears())
    if (lora_targets_module(f->name, targets)) out[f->name] = {f->in_features(), f->out_features()};
  return out;
}

ModuleShapes LlamaModel::adapted_shapes() const {
  ModuleShapes out;
  for (const FrozenLinear* f : linears())
    if (f->lora) out[f->name] = {f->in_features(), f->out_features()};
  return out;
}

void LlamaModel::set_lora(const LoraWeights& w, const LoraOptions& o) {
  std::map<std::string, FrozenLinear*> by_name;
  for (FrozenLinear* f : linears()) by_name[f->name] = f;
  for (const auto& [module, ab] : w) {
    auto it = by_name.find(module);
    QLORA_CHECK(it != by_name.end(), "adapter module '", module, "' is not a decoder linear of this model");
    auto a = std::make_shared<LoraAdapter>();
    a->A = ab.first.to(device_, torch::kFloat32).detach().clone().requires_grad_(true);
    a->B = ab.second.to(device_, torch::kFloat32).detach().clone().requires_grad_(true);
    a->scale = o.scale();
    a->dropout = o.dropout;
    it->second->lora = a;
  }
}

std::vector<torch::Tensor> LlamaModel::lora_parameters() const {
  std::vector<torch::Tensor> out;
  for (const FrozenLinear* f : linears())
    if (f->lora) {
      out.push_back(f->lora->A);
      out.push_back(f->lora->B);
    }
  return out;
}

LoraWeights LlamaModel::lora_weights() const {
  LoraWeights out;
  for (const FrozenLinear* f : linears())
    if (f->lora) out[f->name] = {f->lora->A.detach().to(torch::kCPU), f->lora->B.detach().to(torch::kCPU)};
  return out;
}

torch::Tensor LlamaModel::layer_forward(size_t li, const torch::Tensor& h_in, const torch::Tensor& cos,
                                        const torch::Tensor& sin, const torch::Tensor& mask, KVCache* cache) const {
  const int64_t B = h_in.size(0), T = h_in.size(1);
  const int64_t nh = cfg_.num_attention_heads, nkv = cfg_.num_key_value_heads, hd = cfg_.head_dim;
  const DecoderLayer& L = layers[li];
  const bool tr = training;
  torch::Tensor h = h_in;
  torch::Tensor x = rms_norm(h, L.input_layernorm, cfg_.rms_norm_eps);
  torch::Tensor q = L.q_proj.forward(x, tr).view({B, T, nh, hd});
  torch::Tensor k = L.k_proj.forward(x, tr).view({B, T, nkv, hd});
  if (cfg_.qk_norm) {  // Qwen3: RMSNorm over each head's head_dim values, before RoPE
    q = rms_norm(q, L.q_norm, cfg_.rms_norm_eps);
    k = rms_norm(k, L.k_norm, cfg_.rms_norm_eps);
  }
  q = q.transpose(1, 2);
  k = k.transpose(1, 2);
  torch::Tensor v = L.v_proj.forward(x, tr).view({B, T, nkv, hd}).transpose(1, 2);
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
      q, repeat_kv(k, nh / nkv), repeat_kv(v, nh / nkv),
      mask.defined() ? c10::optional<at::Tensor>(mask) : c10::nullopt, 0.0, /*is_causal=*/!mask.defined(), scale);
  a = a.transpose(1, 2).reshape({B, T, nh * hd});
  h = h + L.o_proj.forward(a, tr);
  x = rms_norm(h, L.post_attention_layernorm, cfg_.rms_norm_eps);
  return h + L.down_proj.forward(torch::silu(L.gate_proj.forward(x, tr)) * L.up_proj.forward(x, tr), tr);
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

  if (cache && cache->k.empty()) {
    cache->k.resize(layers.size());
    cache->v.resize(layers.size());
  }
  torch::Tensor h = F::embedding(ids, embed_tokens);
  const bool checkpoint = gradient_checkpointing && !cache && torch::GradMode::is_enabled();
  if (checkpoint && !h.requires_grad()) h = h.detach().requires_grad_(true);  // frozen embeddings
  for (size_t li = 0; li < layers.size(); ++li)
    h = checkpoint ? checkpointed_layer(*this, li, h, cos, sin, mask) : layer_forward(li, h, cos, sin, mask, cache);
  return rms_norm(h, norm, cfg_.rms_norm_eps);
}

torch::Tensor LlamaModel::lm_head_forward(const torch::Tensor& hidden) const {
  return F::linear(hidden, lm_head);
}

}  // namespace qlora
