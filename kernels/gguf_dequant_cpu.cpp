// kernels/gguf_dequant_cpu.cpp — CPU production path for GGUF dequantization: OpenMP over blocks;
// per block the quants are unpacked into a small integer array in ggml's layout order, then one
// float32 loop per sub-block (the same operations per element as gguf_dequant_ref.cpp, so the
// results are bit-identical; tests/kernels/test_gguf_dequant.cpp checks it).
#include <algorithm>
#include <cstring>

#include "kernels/gguf_dequant.h"
#include "kernels/gguf_dequant_internal.h"
#include "kernels/quant4.h"  // fp16_to_float, bf16_to_float

namespace qlora::kernels {
using gguf::GgmlType;

namespace {

inline float h(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return fp16_to_float(v);
}

// y[i] = d * q[i] (+ m) over n elements.
inline void scale(const int8_t* q, float d, int n, float* y) {
  for (int i = 0; i < n; ++i) y[i] = d * static_cast<float>(q[i]);
}
inline void scale_add(const int8_t* q, float d, float m, int n, float* y) {
  for (int i = 0; i < n; ++i) y[i] = d * static_cast<float>(q[i]) + m;
}
inline void scale_sub(const int8_t* q, float d, float m, int n, float* y) {
  for (int i = 0; i < n; ++i) y[i] = d * static_cast<float>(q[i]) - m;
}

void block_q4(const uint8_t* b, bool has_min, float* y) {
  const uint8_t* qs = b + (has_min ? 4 : 2);
  int8_t q[32];
  for (int l = 0; l < 16; ++l) {
    q[l] = static_cast<int8_t>(qs[l] & 0xF);
    q[l + 16] = static_cast<int8_t>(qs[l] >> 4);
  }
  if (has_min) return scale_add(q, h(b), h(b + 2), 32, y);
  for (int l = 0; l < 32; ++l) q[l] = static_cast<int8_t>(q[l] - 8);
  scale(q, h(b), 32, y);
}

void block_q5(const uint8_t* b, bool has_min, float* y) {
  uint32_t qh;
  std::memcpy(&qh, b + (has_min ? 4 : 2), 4);
  const uint8_t* qs = b + (has_min ? 8 : 6);
  int8_t q[32];
  for (int l = 0; l < 16; ++l) {
    q[l] = static_cast<int8_t>((qs[l] & 0xF) | (((qh >> l) & 1u) << 4));
    q[l + 16] = static_cast<int8_t>((qs[l] >> 4) | (((qh >> (l + 16)) & 1u) << 4));
  }
  if (has_min) return scale_add(q, h(b), h(b + 2), 32, y);
  for (int l = 0; l < 32; ++l) q[l] = static_cast<int8_t>(q[l] - 16);
  scale(q, h(b), 32, y);
}

void block_q8_0(const uint8_t* b, float* y) {
  const float d = h(b);
  for (int l = 0; l < 32; ++l) y[l] = static_cast<float>(static_cast<int8_t>(b[2 + l])) * d;
}

// 2-bit planes of a K-quant: element g*128 + s*32 + l = (qs[g*32 + l] >> 2s) & 3.
inline void unpack2(const uint8_t* qs, int8_t* q) {
  for (int g = 0; g < 2; ++g)
    for (int s = 0; s < 4; ++s)
      for (int l = 0; l < 32; ++l) q[g * 128 + s * 32 + l] = static_cast<int8_t>((qs[g * 32 + l] >> (2 * s)) & 3);
}

void block_q2_k(const uint8_t* b, float* y) {
  int8_t q[256];
  unpack2(b + 16, q);
  const float d = h(b + 80), dmin = h(b + 82);
  for (int j = 0; j < 16; ++j) {
    const float dl = d * static_cast<float>(b[j] & 0xF);
    const float ml = dmin * static_cast<float>(b[j] >> 4);
    scale_sub(q + 16 * j, dl, ml, 16, y + 16 * j);
  }
}

void block_q3_k(const uint8_t* b, float* y) {
  int8_t q[256];
  unpack2(b + 32, q);
  for (int s = 0; s < 8; ++s)
    for (int l = 0; l < 32; ++l)
      q[s * 32 + l] = static_cast<int8_t>(q[s * 32 + l] - (((b[l] >> s) & 1) ? 0 : 4));
  const uint8_t* sc = b + 96;
  const float d = h(b + 108);
  for (int j = 0; j < 16; ++j) {
    const int lo = j < 8 ? (sc[j] & 0xF) : (sc[j - 8] >> 4);
    const int hi = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
    scale(q + 16 * j, d * static_cast<float>((lo | (hi << 4)) - 32), 16, y + 16 * j);
  }
}

void block_q45_k(const uint8_t* b, bool five, float* y) {
  int8_t q[256];
  const uint8_t* qs = b + (five ? 48 : 16);
  for (int g = 0; g < 4; ++g)
    for (int l = 0; l < 32; ++l) {
      q[g * 64 + l] = static_cast<int8_t>(qs[g * 32 + l] & 0xF);
      q[g * 64 + 32 + l] = static_cast<int8_t>(qs[g * 32 + l] >> 4);
    }
  if (five)
    for (int s = 0; s < 8; ++s)
      for (int l = 0; l < 32; ++l) q[s * 32 + l] = static_cast<int8_t>(q[s * 32 + l] | (((b[16 + l] >> s) & 1) << 4));
  const uint8_t* s = b + 4;
  const float d = h(b), dmin = h(b + 2);
  for (int j = 0; j < 8; ++j) {
    int sc, mn;
    if (j < 4) {
      sc = s[j] & 63;
      mn = s[j + 4] & 63;
    } else {
      sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
      mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
    scale_sub(q + 32 * j, d * static_cast<float>(sc), dmin * static_cast<float>(mn), 32, y + 32 * j);
  }
}

void block_q6_k(const uint8_t* b, float* y) {
  int8_t q[256];
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  for (int g = 0; g < 2; ++g)
    for (int l = 0; l < 32; ++l) {
      const uint8_t hb = qh[g * 32 + l];
      int8_t* o = q + g * 128;
      o[l] = static_cast<int8_t>(((ql[g * 64 + l] & 0xF) | ((hb & 3) << 4)) - 32);
      o[32 + l] = static_cast<int8_t>(((ql[g * 64 + 32 + l] & 0xF) | (((hb >> 2) & 3) << 4)) - 32);
      o[64 + l] = static_cast<int8_t>(((ql[g * 64 + l] >> 4) | (((hb >> 4) & 3) << 4)) - 32);
      o[96 + l] = static_cast<int8_t>(((ql[g * 64 + 32 + l] >> 4) | (((hb >> 6) & 3) << 4)) - 32);
    }
  const float d = h(b + 208);
  for (int j = 0; j < 16; ++j)
    scale(q + 16 * j, d * static_cast<float>(static_cast<int8_t>(b[192 + j])), 16, y + 16 * j);
}

void block(GgmlType t, const uint8_t* b, float* y) {
  switch (t) {
    case GgmlType::Q4_0: return block_q4(b, false, y);
    case GgmlType::Q4_1: return block_q4(b, true, y);
    case GgmlType::Q5_0: return block_q5(b, false, y);
    case GgmlType::Q5_1: return block_q5(b, true, y);
    case GgmlType::Q8_0: return block_q8_0(b, y);
    case GgmlType::Q2_K: return block_q2_k(b, y);
    case GgmlType::Q3_K: return block_q3_k(b, y);
    case GgmlType::Q4_K: return block_q45_k(b, false, y);
    case GgmlType::Q5_K: return block_q45_k(b, true, y);
    case GgmlType::Q6_K: return block_q6_k(b, y);
    default: return;
  }
}

}  // namespace

void dequantize_gguf_cpu(GgmlType t, const uint8_t* src, int64_t n, float* out) {
  const gguf::GgmlTypeInfo* ti = &detail::checked_gguf_type(t, n);
  if (t == GgmlType::F32) {
    if (n) std::memcpy(out, src, static_cast<size_t>(n) * 4);
    return;
  }
  if (t == GgmlType::F16 || t == GgmlType::BF16) {
    const bool bf = t == GgmlType::BF16;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      uint16_t v;
      std::memcpy(&v, src + 2 * i, 2);
      out[i] = bf ? bf16_to_float(v) : fp16_to_float(v);
    }
    return;
  }
  const int64_t nb = n / ti->block;
  const int64_t bs = ti->block, ts = ti->type_size;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < nb; ++b) block(t, src + b * ts, out + b * bs);
}

}  // namespace qlora::kernels
