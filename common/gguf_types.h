// qlora-cpp: GGML tensor types as stored in GGUF files (header-only, torch-free, no dependencies).
//
// Numbers, block sizes and block byte sizes from ggml (ggml/include/ggml.h `enum ggml_type`,
// ggml/src/ggml.c `type_traits`) as mirrored by gguf-py 0.19.0 (gguf/constants.py
// GGMLQuantizationType, GGML_QUANT_SIZES). A tensor of a block type stores its rows (ne[0]
// elements each, a multiple of the block size) as consecutive blocks of `type_size` bytes.
#pragma once
#include <cstdint>

namespace qlora::gguf {

/// ggml_type numbers. Only the ones with `dequantize = true` in ggml_type_info are imported.
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22,
  IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
  TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39, NVFP4 = 40, Q1_0 = 41,
};

/// Static facts about one ggml type.
struct GgmlTypeInfo {
  GgmlType type;
  const char* name;   ///< ggml spelling ("Q4_K")
  int64_t block;      ///< elements per block (1 for plain types)
  int64_t type_size;  ///< bytes per block
  bool dequantize;    ///< qlora-cpp dequantizes it (kernels/gguf_dequant.h)
};

/// QK_K: elements per super-block of the K-quants.
constexpr int64_t kQK_K = 256;

inline const GgmlTypeInfo* ggml_type_info(uint32_t t) {
  static constexpr GgmlTypeInfo kTypes[] = {
      {GgmlType::F32, "F32", 1, 4, true},          {GgmlType::F16, "F16", 1, 2, true},
      {GgmlType::Q4_0, "Q4_0", 32, 18, true},      {GgmlType::Q4_1, "Q4_1", 32, 20, true},
      {GgmlType::Q5_0, "Q5_0", 32, 22, true},      {GgmlType::Q5_1, "Q5_1", 32, 24, true},
      {GgmlType::Q8_0, "Q8_0", 32, 34, true},      {GgmlType::Q8_1, "Q8_1", 32, 40, false},
      {GgmlType::Q2_K, "Q2_K", 256, 84, true},     {GgmlType::Q3_K, "Q3_K", 256, 110, true},
      {GgmlType::Q4_K, "Q4_K", 256, 144, true},    {GgmlType::Q5_K, "Q5_K", 256, 176, true},
      {GgmlType::Q6_K, "Q6_K", 256, 210, true},    {GgmlType::Q8_K, "Q8_K", 256, 292, false},
      {GgmlType::IQ2_XXS, "IQ2_XXS", 256, 66, false}, {GgmlType::IQ2_XS, "IQ2_XS", 256, 74, false},
      {GgmlType::IQ3_XXS, "IQ3_XXS", 256, 98, false}, {GgmlType::IQ1_S, "IQ1_S", 256, 50, false},
      {GgmlType::IQ4_NL, "IQ4_NL", 32, 18, false}, {GgmlType::IQ3_S, "IQ3_S", 256, 110, false},
      {GgmlType::IQ2_S, "IQ2_S", 256, 82, false},  {GgmlType::IQ4_XS, "IQ4_XS", 256, 136, false},
      {GgmlType::I8, "I8", 1, 1, false},           {GgmlType::I16, "I16", 1, 2, false},
      {GgmlType::I32, "I32", 1, 4, false},         {GgmlType::I64, "I64", 1, 8, false},
      {GgmlType::F64, "F64", 1, 8, false},         {GgmlType::IQ1_M, "IQ1_M", 256, 56, false},
      {GgmlType::BF16, "BF16", 1, 2, true},        {GgmlType::TQ1_0, "TQ1_0", 256, 54, false},
      {GgmlType::TQ2_0, "TQ2_0", 256, 66, false},  {GgmlType::MXFP4, "MXFP4", 32, 17, false},
      {GgmlType::NVFP4, "NVFP4", 64, 36, false},   {GgmlType::Q1_0, "Q1_0", 128, 18, false},
  };
  for (const GgmlTypeInfo& e : kTypes)
    if (static_cast<uint32_t>(e.type) == t) return &e;
  return nullptr;
}

inline const GgmlTypeInfo& ggml_type_info(GgmlType t) {
  return *ggml_type_info(static_cast<uint32_t>(t));
}

}  // namespace qlora::gguf
