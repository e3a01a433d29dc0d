// kernels/gguf_dequant_ref.cpp — scalar reference for GGUF dequantization: each element computed
// on its own from its index, straight from the formulas in gguf_dequant.h (gguf-py quants.py).
#include <cstring>

#include "kernels/gguf_dequant.h"
#include "kernels/gguf_dequant_internal.h"
#include "kernels/quant4.h"  // fp16_to_float

namespace qlora::kernels {
using gguf::GgmlType;

namespace {

float h(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return fp16_to_float(v);
}

// 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K block (ggml get_scale_min_k4).
void scale_min_k4(int j, const uint8_t* s, int* sc, int* mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Element i of one block of type t.
float element(GgmlType t, const uint8_t* b, int i) {
  switch (t) {
    case GgmlType::Q4_0: {
      const int q = i < 16 ? (b[2 + i] & 0xF) : (b[2 + i - 16] >> 4);
      return h(b) * static_cast<float>(q - 8);
    }
    case GgmlType::Q4_1: {
      const int q = i < 16 ? (b[4 + i] & 0xF) : (b[4 + i - 16] >> 4);
      return h(b) * static_cast<float>(q) + h(b + 2);
    }
    case GgmlType::Q5_0: {
      uint32_t qh;
      std::memcpy(&qh, b + 2, 4);
      const int lo = i < 16 ? (b[6 + i] & 0xF) : (b[6 + i - 16] >> 4);
      const int q = lo | static_cast<int>(((qh >> i) & 1u) << 4);
      return h(b) * static_cast<float>(q - 16);
    }
    case GgmlType::Q5_1: {
      uint32_t qh;
      std::memcpy(&qh, b + 4, 4);
      const int lo = i < 16 ? (b[8 + i] & 0xF) : (b[8 + i - 16] >> 4);
      const int q = lo | static_cast<int>(((qh >> i) & 1u) << 4);
      return h(b) * static_cast<float>(q) + h(b + 2);
    }
    case GgmlType::Q8_0:
      return static_cast<float>(static_cast<int8_t>(b[2 + i])) * h(b);
    case GgmlType::Q2_K: {
      const uint8_t sc = b[i / 16];
      const int q = (b[16 + (i / 128) * 32 + i % 32] >> (2 * ((i % 128) / 32))) & 3;
      const float dl = h(b + 80) * static_cast<float>(sc & 0xF);
      const float ml = h(b + 82) * static_cast<float>(sc >> 4);
      return dl * static_cast<float>(q) - ml;
    }
    case GgmlType::Q3_K: {
      const uint8_t* s = b + 96;
      const int j = i / 16;
      const int lo = j < 8 ? (s[j] & 0xF) : (s[j - 8] >> 4);
      const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
      const float dl = h(b + 108) * static_cast<float>((lo | (hi << 4)) - 32);
      const int ql = (b[32 + (i / 128) * 32 + i % 32] >> (2 * ((i % 128) / 32))) & 3;
      const int hbit = (b[i % 32] >> (i / 32)) & 1;
      return dl * static_cast<float>(ql - (hbit ? 0 : 4));
    }
    case GgmlType::Q4_K:
    case GgmlType::Q5_K: {
      int sc, mn;
      scale_min_k4(i / 32, b + 4, &sc, &mn);
      const bool five = t == GgmlType::Q5_K;
      const uint8_t* qs = b + (five ? 48 : 16);
      int q = (qs[(i / 64) * 32 + i % 32] >> (4 * ((i % 64) / 32))) & 0xF;
      if (five) q |= ((b[16 + i % 32] >> (i / 32)) & 1) << 4;
      const float d = h(b) * static_cast<float>(sc);
      const float m = h(b + 2) * static_cast<float>(mn);
      return d * static_cast<float>(q) - m;
    }
    case GgmlType::Q6_K: {
      const int lo = (b[(i / 128) * 64 + i % 64] >> (4 * ((i % 128) / 64))) & 0xF;
      const int hi = (b[128 + (i / 128) * 32 + i % 32] >> (2 * ((i % 128) / 32))) & 3;
      const float d = h(b + 208) * static_cast<float>(static_cast<int8_t>(b[192 + i / 16]));
      return d * static_cast<float>((lo | (hi << 4)) - 32);
    }
    case GgmlType::F32: {
      float v;
      std::memcpy(&v, b, 4);
      return v;
    }
    case GgmlType::F16:
      return h(b);
    case GgmlType::BF16: {
      uint16_t v;
      std::memcpy(&v, b, 2);
      return bf16_to_float(v);
    }
    default:
      return 0.f;  // unreachable: checked by the caller
  }
}

}  // namespace

bool dequantize_gguf_supported(GgmlType t) {
  const gguf::GgmlTypeInfo* ti = gguf::ggml_type_info(static_cast<uint32_t>(t));
  return ti != nullptr && ti->dequantize;
}

void dequantize_gguf_ref(GgmlType t, const uint8_t* src, int64_t n, float* out) {
  const gguf::GgmlTypeInfo* ti = &detail::checked_gguf_type(t, n);
  const int64_t nb = n / ti->block;
  for (int64_t blk = 0; blk < nb; ++blk)
    for (int i = 0; i < ti->block; ++i)
      out[blk * ti->block + i] = element(t, src + blk * ti->type_size, i);
}

}  // namespace qlora::kernels
