// model/options.h — the base model's two option types, torch-free so the training config embeds
// them (config/config.h, as it embeds data::DataOptions): the compute dtype and the 4-bit
// quantization of the frozen weights. The YAML is read into them once, at the edge
// (config/config.cpp); LlamaModel, the trainer and the CLI take these types as they are.
//
// One spelling each: dtype names here (ours and Hugging Face's), resolve_dtype() here (the only
// place `auto` is resolved; model/model.h's torch_dtype() maps the result to torch), the quant type
// is kernels::Quant4Type.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/quant4.h"

namespace qlora {

/// Floating-point type the base model computes in (`model.dtype`, the CLI's `--dtype`). kAuto: bf16
/// on CUDA, fp32 on CPU (resolve_dtype, below; the checkpoint's `torch_dtype` is not used).
enum class DType { kBF16, kFP16, kFP32, kAuto };

/// The dtype `d` computes in on a CUDA (`cuda`) or CPU device: the one place kAuto is resolved,
/// to bf16 on CUDA and fp32 on CPU (docs/config.md, `model.dtype`); any other d is returned as is.
/// model/model.h's torch_dtype() gives the torch type.
DType resolve_dtype(DType d, bool cuda);
/// Bytes per element of a resolved dtype: 2 (bf16, fp16) or 4 (fp32). Throws qlora::Error for kAuto.
int64_t dtype_bytes(DType d);
/// "bf16" / "fp16" / "fp32" / "auto" (the config's and the CLI's spelling).
const char* dtype_name(DType d);
/// Our spelling ("bf16", "fp16", "fp32", "auto") or a Hugging Face / torch name ("bfloat16",
/// "float16", "float32") → DType (exact, lower case); nullopt for anything else.
std::optional<DType> dtype_from_name(const std::string& s);
/// As dtype_from_name; throws qlora::Error "dtype '<s>' is not one of bf16, fp16, fp32, auto"
/// instead of returning nullopt.
DType parse_dtype(const std::string& s);
/// A Hugging Face `torch_dtype` ("bfloat16", "float16", "float32"; config.json, bitsandbytes'
/// quant_state JSON) → DType; nullopt for any other string (our short names included).
std::optional<DType> dtype_from_hf_name(const std::string& s);
/// The Hugging Face name ("bfloat16", "float16", "float32") written to config.json. Throws
/// qlora::Error for kAuto, which has none.
const char* hf_dtype_name(DType d);
/// The dtype a checkpoint is stored in, from config.json's `torch_dtype`: its DType, or bf16 when
/// it names none of the three (how `inspect --quant`, `merge --dtype auto` and `init-model` read it).
DType stored_dtype(const std::string& torch_dtype);

/// Which weights are stored in 4 bits and how (the config's `quantization:` section; bitsandbytes'
/// BitsAndBytesConfig names: bnb_4bit_quant_type, blocksize, bnb_4bit_use_double_quant,
/// llm_int8_skip_modules). The library default is no quantization; Config's default is NF4.
struct QuantOptions {
  /// The 4-bit code book, or nullopt: no quantization (`method: none`, 16-bit LoRA).
  std::optional<kernels::Quant4Type> quant_type;
  int64_t blocksize = 64;    ///< weights per absmax block: kernels::quant4_valid_blocksize (32..4096, 2^k)
  bool double_quant = true;  ///< quantize the per-block absmax too (QLoRA "double quantization")
  /// Modules that stay in the compute dtype, matched against the dotted components of the HF module
  /// path ("norm" matches "model.norm"; "down_proj" keeps every layer's mlp.down_proj 16-bit).
  /// embed_tokens, norm and lm_head must stay listed: only the decoder linears are quantizable.
  std::vector<std::string> keep_16bit = {"embed_tokens", "norm", "lm_head"};

  bool enabled() const { return quant_type.has_value(); }
  /// The 4-bit type; throws qlora::Error when quantization is off.
  kernels::Quant4Type type() const;
  /// True when the linear module `module` (HF path, no ".weight") is quantized under these options.
  bool quantizes(const std::string& module) const;
};

/// "nf4" | "fp4" | "none" (`quantization.method`, `inspect --quant`) → QuantOptions::quant_type.
/// Throws qlora::Error naming the value for anything else.
std::optional<kernels::Quant4Type> parse_quant_method(const std::string& s);
/// "nf4" / "fp4" / "none".
const char* quant_method_name(const std::optional<kernels::Quant4Type>& t);
/// Throws qlora::Error when `q` (enabled) cannot be applied: a blocksize outside bitsandbytes' set,
/// or a keep_16bit list without embed_tokens, norm or lm_head. LlamaModel::load / random_init call
/// it for callers that build QuantOptions in code; the config checks the blocksize when it reads it.
void check_quant_options(const QuantOptions& q);

}  // namespace qlora
