// kernels/quant4.h — 4-bit NF4/FP4 blockwise quantization in the bitsandbytes format (torch-free).
//
// Layout (bitsandbytes 0.50.2, functional.quantize_4bit + backends/default/ops.py "quantize_4bit"):
//   * the input is flattened row-major into x[0..n); block b covers x[b*bs, min((b+1)*bs, n)),
//     the last block may be partial; absmax[b] = max |x| over the block, float32;
//   * each element is scaled into [-1, 1] and mapped to the nearest 4-bit code (bucketize on the
//     float32 midpoints of the sorted code table, ties to the lower code);
//   * two codes per byte: element 2k in the HIGH nibble, element 2k+1 in the LOW nibble; an odd n
//     pads the last low nibble with the code of 0.0;
//   * double quant ("compress_statistics"): offset = mean(absmax); (absmax - offset) is quantized
//     blockwise (blocksize 256) with the signed 8-bit dynamic map (functional.create_dynamic_map),
//     nested_absmax float32 per 256 absmax values.
// Three implementations share this header: *_ref (scalar ground truth, quant4_ref.cpp), *_cpu
// (OpenMP production path, quant4_cpu.cpp, bit-identical to *_ref) and the CUDA launchers in
// quant4.cuh. docs/quantization.md describes the format and its sources in detail.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

#include "common/error.h"

namespace qlora::kernels {

/// The 4-bit code book: NF4 (QLoRA normal-float quantiles) or FP4 (bnb's e2m1 variant). The one
/// quant-type enum of the project: the ATen glue (quant_tensor.h), the model's QuantOptions
/// (model/options.h) and the config's `quantization.method` all use it.
enum class Quant4Type : int { NF4 = 0, FP4 = 1 };

/// "nf4" -> NF4, "fp4" -> FP4 (exact, lower case, as bnb's `bnb_4bit_quant_type`). Anything else
/// throws qlora::Error naming the value.
inline Quant4Type parse_quant_type(const std::string& name) {
  if (name == "nf4") return Quant4Type::NF4;
  if (name == "fp4") return Quant4Type::FP4;
  fail("unknown quant type '", name, "': expected \"nf4\" or \"fp4\"");
}
/// "nf4" / "fp4" (bnb's spelling).
inline const char* quant_type_name(Quant4Type type) { return type == Quant4Type::NF4 ? "nf4" : "fp4"; }

/// A bfloat16 / float16 value as its raw bits (the torch-free stand-in for c10::BFloat16/Half;
/// same size and layout, so a tensor's data pointer may be reinterpreted as these).
struct BF16Bits { uint16_t bits; };
struct FP16Bits { uint16_t bits; };
static_assert(sizeof(BF16Bits) == 2 && sizeof(FP16Bits) == 2, "16-bit wrappers must be 2 bytes");

/// Blocksize of the nested (double) quantization of absmax, fixed by bitsandbytes.
constexpr int64_t kNestedBlocksize = 256;
/// Number of strided partial sums in absmax_mean (shared by the CPU and CUDA paths, see below).
constexpr int64_t kMeanLanes = 1024;

/// True for the blocksizes bitsandbytes accepts: powers of two 32..4096.
inline bool quant4_valid_blocksize(int64_t bs) {
  return bs >= 32 && bs <= 4096 && (bs & (bs - 1)) == 0;
}
/// Number of blocks (absmax entries) for n elements: ceil(n / bs).
inline int64_t quant4_num_blocks(int64_t n, int64_t bs) { return (n + bs - 1) / bs; }
/// Packed bytes for n elements: ceil(n / 2).
inline int64_t quant4_packed_bytes(int64_t n) { return (n + 1) / 2; }
/// Exact bytes a 4-bit weight of `numel` elements occupies (what qlora::QuantizedWeight::bytes()
/// returns, kernels/quant_tensor.h): ceil(n/2) packed + nblocks·4 absmax (float32), or with double
/// quant nblocks·1 (absmax_q) + ceil(nblocks/256)·4 (nested absmax) + 256·4 (nested code) + 4
/// (offset); nblocks = ceil(n / blocksize). Pure arithmetic, no validation (docs/quantization.md).
inline int64_t quantized_weight_bytes(int64_t numel, int64_t blocksize, bool double_quant) {
  const int64_t nblocks = quant4_num_blocks(numel, blocksize);
  const int64_t packed = quant4_packed_bytes(numel);
  if (!double_quant) return packed + nblocks * 4;
  return packed + nblocks + quant4_num_blocks(nblocks, kNestedBlocksize) * 4 + 256 * 4 + 4;
}

/// The 16 float32 code values, indexed by the 4-bit code (bnb functional.get_4bit_type).
const float* quant4_code(Quant4Type type);
/// The 15 float32 bucket bounds (midpoints of the sorted code) and the sorted-position -> code map
/// (bnb backends/default/ops.py _get_4bit_quantize_bounds; identity for NF4).
const float* quant4_bounds(Quant4Type type);
const uint8_t* quant4_order(Quant4Type type);
/// The code given to a padding element (0.0 after scaling): 7 for NF4, 0 for FP4.
uint8_t quant4_zero_code(Quant4Type type);
/// The signed 8-bit dynamic map, 256 float32 values ascending (bnb functional.create_dynamic_map(signed=True)).
const float* dynamic_map_signed();

// ---- bit-exact 16-bit float conversions (round to nearest even, like c10::BFloat16 / c10::Half) ----
inline float f32_from_bits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t bits_from_f32(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bf16_to_float(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }
/// RNE; every NaN becomes 0x7FC0 (as c10::BFloat16 does).
inline uint16_t float_to_bf16(float f) {
  uint32_t u = bits_from_f32(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float fp16_to_float(uint16_t h);
/// RNE with IEEE overflow to inf and gradual underflow; NaN -> quiet NaN with the input's sign.
uint16_t float_to_fp16(float f);

inline float to_float(float v) { return v; }
inline float to_float(BF16Bits v) { return bf16_to_float(v.bits); }
inline float to_float(FP16Bits v) { return fp16_to_float(v.bits); }
template <typename T> T from_float(float v);
template <> inline float from_float<float>(float v) { return v; }
template <> inline BF16Bits from_float<BF16Bits>(float v) { return BF16Bits{float_to_bf16(v)}; }
template <> inline FP16Bits from_float<FP16Bits>(float v) { return FP16Bits{float_to_fp16(v)}; }

/// Where the per-block scales of a quantized tensor come from: plain `absmax`, or (double quant)
/// absmax[b] = nested_code[absmax_q[b]] * nested_absmax[b / 256] + offset (two float32 roundings,
/// as bnb functional.dequantize_4bit: dequantize_blockwise then `absmax += offset`).
struct Quant4Scales {
  const float* absmax = nullptr;         // (nblocks,) or null when double-quantized
  const uint8_t* absmax_q = nullptr;     // (nblocks,)
  const float* nested_absmax = nullptr;  // (ceil(nblocks / 256),)
  const float* nested_code = nullptr;    // (256,) dynamic map
  float offset = 0.f;
  bool nested() const { return absmax == nullptr; }
};

// ================================ scalar reference ================================
// All functions throw qlora::Error on an invalid blocksize or a null pointer for n > 0.

/// Quantizes x (n,) into packed (ceil(n/2),) uint8 and absmax (ceil(n/bs),) float32.
/// Math per block (bnb default backend): full block s = clamp(x * (1/max(am,1e-38)), -1, 1) with
/// absmax = am; partial last block s = clamp(x / max(am,1e-38), -1, 1) with absmax = max(am,1e-38);
/// code = order[#(bounds < s)]. T: float, BF16Bits, FP16Bits.
template <typename T>
void quantize_4bit_ref(const T* x, int64_t n, int64_t blocksize, Quant4Type type, uint8_t* packed,
                       float* absmax);

/// Dequantizes packed (ceil(n/2),) with `scales` into out (n,): out = T(code[q] * absmax[b])
/// (one float32 product, one rounding to T). T: float, BF16Bits, FP16Bits.
template <typename T>
void dequantize_4bit_ref(const uint8_t* packed, const Quant4Scales& scales, int64_t n,
                         int64_t blocksize, Quant4Type type, T* out);

/// mean(absmax) as float32. Defined order (so the CUDA path matches bit for bit): 1024 strided
/// double partial sums S_t = sum_{i = t mod 1024, ascending} absmax[i], summed t = 0..1023 in
/// double, divided by nblocks in double, rounded once to float. torch's float32 mean (what bnb
/// stores as `offset`) may differ from this by an ulp; tests compare it with a tolerance.
float absmax_mean_ref(const float* absmax, int64_t nblocks);

/// Double quant of the absmax: v = absmax - offset (float32), quantized blockwise (256) with
/// `code` (256 ascending values, normally dynamic_map_signed()): am = max|v| (NaN ignored), and the
/// code chosen exactly as bitsandbytes 0.50.2's CPU path does (csrc/cpu_ops.cpp build_quantize_lut /
/// norm_to_lut_index: s = clamp(v·(1/am), −1, 1), a 65536-bin lookup k = fma((s+1)/2, 65535, 0.5),
/// q = #{midpoints < 2k/65535 − 1}) — not always the nearest code; see docs/quantization.md.
/// absmax_q (nblocks,), nested_absmax (ceil(nblocks/256),).
void quantize_absmax_ref(const float* absmax, int64_t nblocks, float offset, const float* code,
                         uint8_t* absmax_q, float* nested_absmax);

/// Inverse of quantize_absmax_ref into absmax (nblocks,), float32.
void dequantize_absmax_ref(const Quant4Scales& scales, int64_t nblocks, float* absmax);

// ============================ CPU production path (OpenMP) ============================
// Same contracts as the *_ref functions, parallel over blocks; results are bit-identical.
template <typename T>
void quantize_4bit_cpu(const T* x, int64_t n, int64_t blocksize, Quant4Type type, uint8_t* packed,
                       float* absmax);
template <typename T>
void dequantize_4bit_cpu(const uint8_t* packed, const Quant4Scales& scales, int64_t n,
                         int64_t blocksize, Quant4Type type, T* out);
void quantize_absmax_cpu(const float* absmax, int64_t nblocks, float offset, const float* code,
                         uint8_t* absmax_q, float* nested_absmax);

}  // namespace qlora::kernels
