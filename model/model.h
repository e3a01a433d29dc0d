// qlora-cpp: the Llama-family decoder (Llama 2/3, Mistral, Qwen2, Qwen3) in LibTorch.
//
// Mirrors transformers' modeling_llama.py / modeling_qwen2.py / modeling_qwen3.py /
// modeling_mistral.py: embedding,
// RMSNorm (fp32 statistics), RoPE in the rotate-half convention (so q/k LoRA weights stay
// PEFT-compatible with no permutation), Qwen3's per-head q/k RMSNorm before RoPE, grouped-query
// attention through
// at::scaled_dot_product_attention, SwiGLU MLP, tied or untied lm_head. Weights are plain tensors
// named exactly as in the HF checkpoint ("model.layers.3.self_attn.q_proj.weight").
//
// The seven decoder linears may hold a 4-bit (NF4/FP4, bitsandbytes layout) weight instead of a
// 16-bit one: quantized on load (QuantOptions), or read as stored by a bitsandbytes checkpoint
// (config.json "quantization_config"). docs/quantization.md, "In the model".
#pragma once
#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "adapters/lora.h"
#include "adapters/peft.h"
#include "common/safetensors.h"
#include "kernels/quant_tensor.h"
#include "model/model_config.h"
#include "model/options.h"

namespace qlora {

/// A frozen linear layer y = x·Wᵀ + b, addressed by its HF module path. Holds either `weight`
/// (compute dtype) or `qweight` (4-bit), never both.
struct FrozenLinear {
  std::string name;       ///< HF module path, e.g. "model.layers.0.self_attn.q_proj"
  torch::Tensor weight;   ///< [out_features, in_features], compute dtype; undefined when quantized
  std::shared_ptr<const QuantizedWeight> qweight;  ///< 4-bit weight of shape [out, in], or null
  torch::Tensor bias;     ///< [out_features] or undefined (always compute dtype)
  /// x: [..., in_features] → [..., out_features], same dtype as x. A quantized weight is
  /// dequantized into a temporary of x's dtype for the matmul and dropped after it; backward
  /// (grad wrt x only, the weight is frozen) dequantizes again instead of keeping the copy.
  /// With a LoRA adapter attached, adds s·B·A·dropout(x) (dropout only when `train`): when
  /// training, in x's dtype; otherwise, for a 16-bit x, in float32 with the sum rounded once to
  /// x's dtype, as PEFT's lora.Linear with float32 adapter weights (its default).
  torch::Tensor forward(const torch::Tensor& x, bool train = false) const;
  bool quantized() const { return qweight != nullptr; }
  std::shared_ptr<LoraAdapter> lora;  ///< trainable low-rank update, or null
  /// Inference cache (LlamaModel::cache_dequantized): qweight dequantized once, [out, in] in the
  /// compute dtype, or undefined. base_forward uses it instead of dequantizing again when it is
  /// defined, of x's dtype, and no gradient is wanted; the same values, so bit-identical output.
  torch::Tensor dequantized;
  /// x·Wᵀ + b without the adapter.
  torch::Tensor base_forward(const torch::Tensor& x) const;
  int64_t in_features() const;
  int64_t out_features() const;
  /// Bytes held: weight (or the quantized weight's packed data + constants) + bias.
  int64_t bytes() const;
};

struct DecoderLayer {
  torch::Tensor input_layernorm;           ///< [hidden]
  torch::Tensor post_attention_layernorm;  ///< [hidden]
  FrozenLinear q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj;
  torch::Tensor q_norm, k_norm;  ///< [head_dim], Qwen3 only (undefined otherwise); frozen
};

/// Per-layer key/value cache for incremental decoding. k[l], v[l]: [B, n_kv_heads, S, head_dim]
/// after RoPE; `mask` [B, S] long holds 1 for real tokens seen so far.
struct KVCache {
  std::vector<torch::Tensor> k, v;
  torch::Tensor mask;
  int64_t length() const { return k.empty() || !k[0].defined() ? 0 : k[0].size(2); }
};

/// One forward's inputs. Shapes [B, T]; only input_ids is required.
struct ForwardInputs {
  torch::Tensor input_ids;       ///< long [B, T]
  torch::Tensor attention_mask;  ///< long/bool [B, T], 1 = real token, 0 = padding (undefined: all real)
  torch::Tensor position_ids;    ///< long [B, T] (undefined: cumsum(attention_mask) − 1, or 0..T−1)
  torch::Tensor segment_ids;     ///< long [B, T], packing: tokens attend only within equal ids (0 = pad)
};

/// The torch dtype `d` computes in on `device`: resolve_dtype(d, device.is_cuda()) (model/options.h;
/// auto is bf16 on CUDA, fp32 on CPU).
torch::Dtype torch_dtype(DType d, const torch::Device& device);
/// The DType of a floating-point torch dtype (float32, bfloat16, float16). Throws qlora::Error for
/// any other.
DType dtype_of(torch::Dtype d);

/// A linear weight stored by bitsandbytes in 4 bits (Linear4bit's save layout): the logical
/// weight, not its storage. `tensors` are the checkpoint entries that hold it: "<w>" (packed U8),
/// "<w>.absmax", "<w>.quant_map", with double quant "<w>.nested_absmax" and
/// "<w>.nested_quant_map", and the quant_state "<w>.quant_state.bitsandbytes__<type>".
struct Bnb4StoredWeight {
  QuantizedWeight header;             ///< type, blocksize, shape, dtype, double_quant (no data)
  std::vector<std::string> tensors;   ///< the entries present in the checkpoint, "<w>" first
  int64_t stored_bytes = 0;           ///< Σ their bytes in the files
};
/// The bitsandbytes 4-bit weight named `wname` ("model.layers.0.self_attn.q_proj.weight"), or
/// nullopt when the checkpoint has no quant_state for it. Reads only the quant_state JSON.
/// Throws qlora::Error naming the tensor for a malformed quant_state, or both an nf4 and an fp4 one.
std::optional<Bnb4StoredWeight> bnb4_stored_weight(const st::SafetensorsCheckpoint& ck, const std::string& wname);

/// A config with tie_word_embeddings: true whose checkpoint also stores an lm_head.weight is read
/// as tied only when that tensor equals model.embed_tokens.weight (a duplicate save): transformers
/// 5 otherwise ignores the flag ("both are present in the checkpoints with different values, so we
/// will NOT tie them") and uses the stored lm_head, so reading it as tied would silently give
/// another model. Throws qlora::Error naming `dir`'s config.json and both tensors in that case
/// (fix: tie_word_embeddings: false, or drop lm_head.weight). Compares in float32, 4096 rows at a
/// time, from load_tensor's views of the mapped files (a copy only where a tensor is unaligned).
/// Does nothing for an untied config.
void check_tied_lm_head(const st::SafetensorsCheckpoint& ckpt, const ModelConfig& cfg, const std::string& dir);

/// The HF names of the weights `cfg` implies (embeddings, every layer's norms, projections and
/// biases, the final norm, and lm_head.weight when untied) that `ckpt` does not store, in load order;
/// empty when none is missing. Names only: shapes and dtypes are LlamaModel::load's checks, which
/// refuses the first missing one with missing_weight_message; `qlora inspect` lists them all.
std::vector<std::string> missing_weights(const st::SafetensorsCheckpoint& ckpt, const ModelConfig& cfg);

/// A stored float weight whose shape is not the one config.json implies (a vocab_size above the
/// embedding's rows, a hidden_size edited by hand): LlamaModel::load refuses the first.
struct MisshapenWeight {
  std::string name;
  std::vector<int64_t> expected;  ///< what the config implies
  std::vector<int64_t> stored;    ///< what the checkpoint holds
  /// "tensor 'NAME': expected shape [a, b], got [c, d]": load's wording (inspect prints it too).
  std::string message() const;
};

/// The weights `cfg` implies that `ckpt` stores with another shape, in load order (bitsandbytes
/// 4-bit weights are not included: their quant_state shape is load's check). Empty when none.
std::vector<MisshapenWeight> misshapen_weights(const st::SafetensorsCheckpoint& ckpt, const ModelConfig& cfg);

/// "tensor 'NAME' is missing from the checkpoint", plus "(config.json has tie_word_embeddings:
/// false)" for lm_head.weight: the one wording of a missing weight (load, inspect).
std::string missing_weight_message(const std::string& name);

class LlamaModel {
 public:
  /// Empty (all tensors undefined) model of the given shape; use load() or random_init().
  LlamaModel(ModelConfig cfg, torch::Dtype dtype, torch::Device device);

  /// Loads an HF model directory (config.json + safetensors, single or sharded). Weights are cast
  /// to `dtype` on `device`. Throws qlora::Error naming the directory / tensor for a missing tensor,
  /// a shape mismatch, or any config / safetensors error.
  static LlamaModel load(const std::string& dir, torch::Dtype dtype, torch::Device device);

  /// As load(dir, dtype, device), quantizing the decoder linears that `q` selects. Streaming:
  /// tensors are read one at a time from the mmap'd safetensors (zero-copy), quantized (on `device`)
  /// and their mapped pages released (madvise DONTNEED) before the next, so peak host memory is
  /// about the loaded model + the largest single tensor. A bitsandbytes 4-bit checkpoint
  /// (config.json quantization_config, quant_method "bitsandbytes") is read as stored, with no
  /// re-quantization; `q` (when enabled) must then ask for the stored quant type.
  /// Throws qlora::Error naming the file / tensor: a missing tensor, a shape mismatch, an 8-bit
  /// bitsandbytes checkpoint, a stored quant type that differs from the config's or `q`'s (both
  /// named; against `q` the message starts "quantization.method: ", so with_key_sources can put
  /// that key's file:line / --set in front), malformed quant_state JSON, a missing absmax / quant_map / nested tensor, or a
  /// module in q that cannot be quantized.
  static LlamaModel load(const std::string& dir, torch::Dtype dtype, torch::Device device,
                         const QuantOptions& q);

  /// Random weights as transformers initialises them: N(0, 0.02) for linear and embedding
  /// weights, ones for norms, zeros for biases; deterministic for a seed.
  static LlamaModel random_init(const ModelConfig& cfg, uint64_t seed, torch::Dtype dtype,
                                torch::Device device, double std = 0.02);
  /// As above, quantizing the selected linears layer by layer as they are drawn (the same random
  /// values as the unquantized model, rounded to `dtype`, then quantized), so a 7B random model
  /// never exists in 16 bits. `draw_on_device`: draw with `device`'s own generator (seeded with
  /// `seed`) instead of the CPU one; for a CUDA device the values then differ from the CPU draw
  /// (still deterministic per seed and device type) but a 7B model is made in seconds, not the
  /// ~70 s one CPU thread needs (`qlora bench`, issue 15). Ignored for a CPU device.
  /// `progress` (optional) is called after each tensor with (elements made, elements in all); an
  /// exception it throws stops the build and propagates (`qlora bench --max-time-s`).
  static LlamaModel random_init(const ModelConfig& cfg, uint64_t seed, torch::Dtype dtype,
                                torch::Device device, const QuantOptions& q, double std = 0.02,
                                bool draw_on_device = false,
                                const std::function<void(int64_t done, int64_t total)>& progress = nullptr);

  /// Final hidden states [B, T, hidden] (after the last RMSNorm). With `cache`, appends this
  /// chunk's keys/values and attends to everything cached before it.
  torch::Tensor hidden_states(const ForwardInputs& in, KVCache* cache = nullptr) const;
  /// lm_head: [B, T, hidden] → [B, T, vocab] in the compute dtype.
  torch::Tensor lm_head_forward(const torch::Tensor& hidden) const;
  /// Logits [B, T, vocab].
  torch::Tensor forward(const ForwardInputs& in, KVCache* cache = nullptr) const {
    return lm_head_forward(hidden_states(in, cache));
  }

  /// Every weight under its HF name (lm_head omitted when tied), in checkpoint order. Quantized
  /// linears' weights are omitted (see linears()).
  std::vector<std::pair<std::string, torch::Tensor>> named_tensors() const;
  /// Every decoder linear, layer by layer in checkpoint order.
  std::vector<const FrozenLinear*> linears() const;
  std::vector<FrozenLinear*> linears();

  /// Attaches fresh LoRA adapters (PEFT init with `o`'s r, alpha, dropout, use_rslora, drawn from
  /// `o.seed`) to every decoder linear that `o.target_modules` selects (lora_targets_module).
  /// Returns matched-module counts per target name
  /// (e.g. {"q_proj": 32}). Throws qlora::Error when a target matches nothing or the LoRA
  /// arguments are invalid, and when a target names lm_head or embed_tokens (they stay frozen and
  /// unquantized; tied, an adapter on one would change the other): the error gives that reason.
  std::map<std::string, int64_t> add_lora(const LoraOptions& o);
  /// Attaches adapters with the given weights (e.g. loaded from PEFT), scaled by o.scale() and
  /// with o.dropout (o.target_modules and o.seed are not used: `w` names the modules); every
  /// module in `w` must be a decoder linear of matching shape (checked by load_peft_adapter
  /// against lora_shapes()).
  void set_lora(const LoraWeights& w, const LoraOptions& o);
  /// Module path → {in, out} for the linears a PEFT config with these targets would adapt. Throws
  /// qlora::Error, with the reason, when a target names lm_head or embed_tokens (as add_lora).
  ModuleShapes lora_shapes(const std::vector<std::string>& targets) const;
  /// Module path → {in, out} for the linears that carry a LoRA now (add_lora / set_lora): what a
  /// checkpoint or an initial adapter of this run must hold.
  ModuleShapes adapted_shapes() const;
  /// Dequantizes every 4-bit decoder linear once into FrozenLinear::dequantized (compute dtype)
  /// so that inference (generate, exact-match eval) stops dequantizing all weights again at every
  /// decode step: the same values, so the same logits bit for bit. Does nothing, and returns 0,
  /// when there is no 4-bit linear or the copies would take more than `max_bytes` (then every
  /// forward keeps dequantizing into a temporary, QLoRA's memory bound). Returns the bytes cached.
  /// Training never uses the copies (the grad path dequantizes as before); drop them with
  /// drop_dequantized() before training to free the memory.
  int64_t cache_dequantized(int64_t max_bytes);
  /// Frees the copies made by cache_dequantized().
  void drop_dequantized();

  /// Trainable parameters: every adapter's A then B, in module order.
  std::vector<torch::Tensor> lora_parameters() const;
  /// Current adapter weights (fp32, detached) by module path.
  LoraWeights lora_weights() const;

  /// Training mode: LoRA dropout active.
  bool training = false;
  /// Recompute each decoder layer in backward, keeping only its input (when grad mode is on).
  bool gradient_checkpointing = false;

  const ModelConfig& config() const { return cfg_; }
  torch::Dtype dtype() const { return dtype_; }
  torch::Device device() const { return device_; }

  torch::Tensor embed_tokens;  ///< [vocab, hidden]
  torch::Tensor norm;          ///< [hidden]
  torch::Tensor lm_head;       ///< [vocab, hidden]; the same tensor as embed_tokens when tied
  std::vector<DecoderLayer> layers;

 private:
  /// Boolean attention mask [B, 1, T, S] (true = attend) or undefined when plain causal suffices.
  torch::Tensor build_mask(const ForwardInputs& in, const torch::Tensor& key_mask, int64_t past) const;
  /// cos, sin: [B, T, head_dim] in the compute dtype, for position_ids [B, T].
  std::pair<torch::Tensor, torch::Tensor> rope(const torch::Tensor& position_ids) const;

 public:
  /// One decoder layer: h [B, T, hidden] → [B, T, hidden]. cos/sin [B, 1, T, D]; mask [B, 1, T, S]
  /// or undefined (causal). Used directly and by the checkpointing Function's recompute.
  torch::Tensor layer_forward(size_t li, const torch::Tensor& h, const torch::Tensor& cos, const torch::Tensor& sin,
                              const torch::Tensor& mask, KVCache* cache) const;

 private:

  ModelConfig cfg_;
  torch::Dtype dtype_;
  torch::Device device_;
  torch::Tensor inv_freq_;  ///< float32 [head_dim / 2]
};

/// RoPE inverse frequencies (float32 [head_dim/2]) with the config's scaling, as transformers'
/// ROPE_INIT_FUNCTIONS ("default", "linear", "llama3") compute them.
torch::Tensor rope_inv_freq(const ModelConfig& cfg);

/// RMSNorm as HF: x in fp32, x·rsqrt(mean(x²) + eps), cast back, times weight.
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

}  // namespace qlora
