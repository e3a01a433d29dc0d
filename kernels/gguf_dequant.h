// kernels/gguf_dequant.h — dequantization of GGUF (ggml) tensor blocks to float32. Torch-free.
//
// Block layouts and arithmetic follow ggml (ggml/src/ggml-common.h block_q*, ggml-quants.c
// dequantize_row_q*) and are bit-identical to the gguf Python package 0.19.0 (gguf/quants.py
// `dequantize`), which tests/fixtures/make_gguf_refs.py uses as the reference: every product and sum
// is one float32 operation in the order gguf-py does it (scale = d·sc first, then scale·q [− min]
// or d·q + m), so the kernels are compiled with -ffp-contract=off. fp16 scales are converted exactly.
//
//   type  block bytes  element i of a block
//   Q4_0  32    18     d·(q−8),          q = nibble i of qs (low nibbles first, then high)
//   Q4_1  32    20     d·q + m
//   Q5_0  32    22     d·(q−16),         q = nibble | bit i of qh << 4
//   Q5_1  32    24     d·q + m
//   Q8_0  32    34     q·d,              q = int8
//   Q2_K  256   84     (d·sc)·q − dmin·mn, 2-bit q, 16 sub-blocks of 16 with 4-bit sc/mn
//   Q3_K  256   110    (d·(sc−32))·q,    q = 2 low bits − (hmask bit ? 0 : 4), 6-bit sc
//   Q4_K  256   144    (d·sc)·q − dmin·mn, 8 sub-blocks of 32, 6-bit sc/mn (get_scale_min_k4)
//   Q5_K  256   176    as Q4_K with a 5th bit from qh
//   Q6_K  256   210    (d·sc)·(q−32),    4 low bits from ql, 2 high from qh, int8 sc per 16
// F32 (copy), F16 and BF16 (exact widening) are accepted too. Other ggml types are refused.
// Two implementations: *_ref (scalar, element by element from the formula above; the ground truth
// in tests) and *_cpu (OpenMP over blocks, sub-block loops the compiler vectorises), bit-identical.
#pragma once
#include <cstdint>

#include "common/gguf_types.h"

namespace qlora::kernels {

/// True for the types dequantize_gguf_* accept (gguf::ggml_type_info(t).dequantize).
bool dequantize_gguf_supported(gguf::GgmlType t);

/// Dequantizes `n` elements of type `t` (n a multiple of the type's block size; `src` holds
/// n / block × type_size bytes, any alignment) into `out` (n float32). Scalar reference.
/// Throws qlora::Error for an unsupported type, n < 0 or n not a multiple of the block size.
void dequantize_gguf_ref(gguf::GgmlType t, const uint8_t* src, int64_t n, float* out);

/// As dequantize_gguf_ref (bit-identical results), multithreaded with OpenMP over blocks.
void dequantize_gguf_cpu(gguf::GgmlType t, const uint8_t* src, int64_t n, float* out);

}  // namespace qlora::kernels
