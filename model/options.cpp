// model/options.cpp — dtype names and the quantization options (model/options.h).
#include "model/options.h"

#include <algorithm>

#include "common/error.h"

namespace qlora {

const char* dtype_name(DType d) {
  switch (d) {
    case DType::kBF16: return "bf16";
    case DType::kFP16: return "fp16";
    case DType::kFP32: return "fp32";
    case DType::kAuto: return "auto";
  }
  fail("internal: DType ", static_cast<int>(d));
}

DType resolve_dtype(DType d, bool cuda) {
  if (d != DType::kAuto) return d;
  return cuda ? DType::kBF16 : DType::kFP32;
}

int64_t dtype_bytes(DType d) {
  QLORA_CHECK(d != DType::kAuto, "dtype auto has no size (resolve it first)");
  return d == DType::kFP32 ? 4 : 2;
}

std::optional<DType> dtype_from_hf_name(const std::string& s) {
  if (s == "bfloat16") return DType::kBF16;
  if (s == "float16") return DType::kFP16;
  if (s == "float32") return DType::kFP32;
  return std::nullopt;
}

std::optional<DType> dtype_from_name(const std::string& s) {
  for (DType d : {DType::kBF16, DType::kFP16, DType::kFP32, DType::kAuto})
    if (s == dtype_name(d)) return d;
  return dtype_from_hf_name(s);
}

DType parse_dtype(const std::string& s) {
  const std::optional<DType> d = dtype_from_name(s);
  QLORA_CHECK(d.has_value(), "dtype '", s, "' is not one of bf16, fp16, fp32, auto");
  return *d;
}

const char* hf_dtype_name(DType d) {
  switch (d) {
    case DType::kBF16: return "bfloat16";
    case DType::kFP16: return "float16";
    case DType::kFP32: return "float32";
    case DType::kAuto: break;
  }
  fail("dtype auto has no Hugging Face name (resolve it first)");
}

DType stored_dtype(const std::string& torch_dtype) {
  return dtype_from_hf_name(torch_dtype).value_or(DType::kBF16);
}

kernels::Quant4Type QuantOptions::type() const {
  QLORA_CHECK(quant_type.has_value(), "QuantOptions: no quant type when method is none");
  return *quant_type;
}

bool QuantOptions::quantizes(const std::string& module) const {
  if (!enabled()) return false;
  const std::string m = "." + module + ".";
  for (const std::string& k : keep_16bit)
    if (m.find("." + k + ".") != std::string::npos) return false;
  return true;
}

std::optional<kernels::Quant4Type> parse_quant_method(const std::string& s) {
  if (s == "none") return std::nullopt;
  if (s == "nf4" || s == "fp4") return kernels::parse_quant_type(s);
  fail("quant method '", s, "' is not one of none, nf4, fp4");
}

const char* quant_method_name(const std::optional<kernels::Quant4Type>& t) {
  return t ? kernels::quant_type_name(*t) : "none";
}

void check_quant_options(const QuantOptions& q) {
  if (!q.enabled()) return;
  QLORA_CHECK(kernels::quant4_valid_blocksize(q.blocksize),
              "quantization blocksize must be a power of two in 32..4096 (bitsandbytes), got ",
              q.blocksize);
  for (const char* m : {"embed_tokens", "norm", "lm_head"})
    QLORA_CHECK(std::find(q.keep_16bit.begin(), q.keep_16bit.end(), m) != q.keep_16bit.end(),
                "quantization: '", m, "' must stay in keep_16bit (only the decoder linears "
                "q/k/v/o/gate/up/down_proj can be quantized)");
}

}  // namespace qlora
