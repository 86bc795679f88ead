// Internal to the CPU dot kernels (quant_dot*.cpp): the byte layouts the kernels read, and the
// per-type kernel entry points that quant_dot.cpp dispatches to.
//
// Weight blocks are GGML's on-disk layouts (fp16 fields kept as raw uint16 bits); the prepared
// activation blocks mirror llama.cpp's block_q8_0 / block_q8_1 / block_q8_K so that dots equal
// llama.cpp's. Every struct has exactly its GGUF byte size (static_asserts below) and needs at
// most 2-byte alignment (ActQ8_K: 4).
#pragma once
#include <cstddef>
#include <cstdint>

#include "format/ggml_types.h"
#include "format/iq_tables.h"

namespace hyspec::cpu {

// ---- weight blocks (32 elements) ----
struct BlockQ4_0 { uint16_t d; uint8_t qs[16]; };                      // x = d*(q-8)
struct BlockQ4_1 { uint16_t d, m; uint8_t qs[16]; };                   // x = d*q + m
struct BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; };       // x = d*(q-16), bit 5 in qh
struct BlockQ5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; };    // x = d*q + m
struct BlockQ8_0 { uint16_t d; int8_t qs[32]; };                       // x = d*q
struct BlockIQ4_NL { uint16_t d; uint8_t qs[16]; };                    // x = d*iq::kIq4nlValues[q]
struct BlockMXFP4 { uint8_t e; uint8_t qs[16]; };                      // x = 2^(e-128)*iq::kMxfp4Values[q]
// In every 32-element 4-bit layout above, byte j holds element j (low nibble) and j+16 (high).

// ---- weight super-blocks (256 elements) ----
struct BlockQ2_K { uint8_t scales[16]; uint8_t qs[64]; uint16_t d, dmin; };
struct BlockQ3_K { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; uint16_t d; };
struct BlockQ4_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; };
struct BlockQ5_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; };
struct BlockQ6_K { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; };
struct BlockIQ4_XS { uint16_t d; uint16_t scales_h; uint8_t scales_l[4]; uint8_t qs[128]; };

// ---- grid-codebook i-quants (256 elements; codebooks in format/iq_tables.h) ----
// Per 32 elements: a u32 of 4 kIq2xxsGrid indices, a u32 of 4x7 sign bits | 4-bit scale << 28.
struct BlockIQ2_XXS { uint16_t d; uint8_t qs[64]; };
// Per 8 elements a u16: 9-bit kIq2xsGrid index | 7 sign bits << 9; a 4-bit scale per 16.
struct BlockIQ2_XS { uint16_t d; uint16_t qs[32]; uint8_t scales[8]; };
// Per 8 elements: index qs | 2 bits of qh << 8 into kIq2sGrid, a sign byte; 4-bit scale per 16.
struct BlockIQ2_S { uint16_t d; uint8_t qs[32]; uint8_t signs[32]; uint8_t qh[8]; uint8_t scales[8]; };
// Per 4 elements a kIq3xxsGrid index; per 32 a u32 of 4x7 sign bits | 4-bit scale << 28.
struct BlockIQ3_XXS { uint16_t d; uint8_t qs[64]; uint8_t scales_signs[32]; };
// Per 4 elements: index qs | 1 bit of qh << 8 into kIq3sGrid; a sign bit per element; 4-bit scale per 32.
struct BlockIQ3_S { uint16_t d; uint8_t qs[64]; uint8_t qh[8]; uint8_t signs[32]; uint8_t scales[4]; };
// Per 8 elements: index qs | 3 bits of qh << 8 into kIq1sGrid; per 32 in qh: 3-bit scale, delta sign.
struct BlockIQ1_S { uint16_t d; uint8_t qs[32]; uint16_t qh[8]; };
// As IQ1_S but a 3-bit scale per 16 and a delta sign per 8; the fp16 d is spread over the top
// nibbles of the four u16 scale words.
struct BlockIQ1_M { uint8_t qs[32]; uint8_t qh[16]; uint8_t scales[8]; };

// ---- prepared activation blocks ----
struct ActQ8_0 { uint16_t d; int8_t qs[32]; };             // d = fp16(amax/127), qs = roundf(x/d)
struct ActQ8_1 { uint16_t d, s; int8_t qs[32]; };          // as Q8_0, s = fp16(d * Σqs)
struct ActQ8_K { float d; int8_t qs[256]; int16_t bsums[16]; };  // bsums[j] = Σ qs[16j..16j+16)

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34 && sizeof(BlockIQ4_NL) == 18);
static_assert(sizeof(BlockMXFP4) == 17 && sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ4_K) == 144 && sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockIQ4_XS) == 136 && sizeof(BlockIQ2_XXS) == 66 && sizeof(BlockIQ2_XS) == 74);
static_assert(sizeof(BlockIQ2_S) == 82 && sizeof(BlockIQ3_XXS) == 98 && sizeof(BlockIQ3_S) == 110);
static_assert(sizeof(BlockIQ1_S) == 50 && sizeof(BlockIQ1_M) == 56);
static_assert(sizeof(ActQ8_0) == 34 && sizeof(ActQ8_1) == 36 && sizeof(ActQ8_K) == 292);

// E8M0 exponent e as 2^(e-127) / 2 (the half pairs with the doubled iq::kMxfp4Values).
inline float e8m0_to_fp32_half(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23;
  float f;
  __builtin_memcpy(&f, &bits, sizeof f);
  return f;
}

// Q4_K / Q5_K: the 8 six-bit (scale, min) pairs packed in 12 bytes.
inline void unpack_k4_scales(const uint8_t* p, uint8_t sc[8], uint8_t mn[8]) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = p[j] & 63;
    mn[j] = p[j + 4] & 63;
    sc[j + 4] = (p[j + 8] & 0xF) | ((p[j] >> 6) << 4);
    mn[j + 4] = (p[j + 8] >> 4) | ((p[j + 4] >> 6) << 4);
  }
}

// Q3_K: the 16 six-bit scales packed in 12 bytes (low 4 bits in bytes 0-7, high 2 bits in 8-11),
// returned with their -32 bias removed.
inline void unpack_q3_k_scales(const uint8_t* p, int8_t sc[16]) {
  for (int j = 0; j < 16; ++j) {
    const int lo = j < 8 ? p[j] & 0xF : p[j - 8] >> 4;
    const int hi = (p[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
    sc[j] = static_cast<int8_t>((lo | (hi << 4)) - 32);
  }
}

inline uint32_t load_le32(const uint8_t* p) {
  uint32_t v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}

// IQ1_M: the four u16 scale words, and the fp16 super-scale from their top nibbles.
inline void unpack_iq1_m_scales(const BlockIQ1_M& b, uint16_t sc[4], uint16_t* d) {
  __builtin_memcpy(sc, b.scales, 8);
  *d = static_cast<uint16_t>((sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000));
}

// One dot kernel: n elements of a weight row against a prepared activation row.
using DotKernel = float (*)(const void* w, const void* act, int64_t n);

// Every weight type with a kernel, and the suffix of its kernel name: quant_dot_scalar.cpp and
// quant_dot_avx2.cpp each define dot_<suffix> for all of them.
#define HYSPEC_DOT_KERNELS(X)                                                                       \
  X(F32, f32) X(F16, f16) X(BF16, bf16) X(Q4_0, q4_0) X(Q4_1, q4_1) X(Q5_0, q5_0) X(Q5_1, q5_1)     \
  X(Q8_0, q8_0) X(IQ4_NL, iq4_nl) X(MXFP4, mxfp4) X(Q2_K, q2_k) X(Q3_K, q3_k) X(Q4_K, q4_k)         \
  X(Q5_K, q5_k) X(Q6_K, q6_k) X(IQ4_XS, iq4_xs) X(IQ1_S, iq1_s) X(IQ1_M, iq1_m) X(IQ2_XXS, iq2_xxs) \
  X(IQ2_XS, iq2_xs) X(IQ2_S, iq2_s) X(IQ3_XXS, iq3_xxs) X(IQ3_S, iq3_s)

// out[c * out_stride + r] = W_r · act_c for r < rows, c < cols; W_r at w + r * w_stride bytes, act_c
// at act + c * act_stride bytes (prepared for the weight type).
using DotTileKernel = void (*)(const void* w, size_t w_stride, const void* act, size_t act_stride, int64_t n,
                               int rows, int cols, float* out, int64_t out_stride);
// n f32 values -> prepared activation blocks.
using QuantizeKernel = void (*)(const float* x, int64_t n, void* out);

// Scalar kernels (quant_dot_scalar.cpp): the reference, for every supported type.
DotKernel scalar_dot_kernel(GgmlType wt);
// AVX2+FMA+F16C kernels (quant_dot_avx2.cpp); null when the type has none or the build is not x86-64.
DotKernel avx2_dot_kernel(GgmlType wt);
// AVX2 tile kernels for the types that have one (Q8_0), else null: the caller loops over dots.
DotTileKernel avx2_dot_tile_kernel(GgmlType wt);
// The Q8_0 tile kernels run groups of R <= 4 weight rows (wr, their f32 block scales dw [R][nb])
// against all `cols` activation rows (act_stride bytes apart, f32 block scales da [cols][nb]).
using Q8_0RowGroup = void (*)(const BlockQ8_0* const* wr, const float* dw, const uint8_t* act, size_t act_stride,
                              const float* da, int64_t nb, int cols, float* out, int64_t out_stride);
// Their shared driver (AVX2+F16C; quant_dot_avx2.cpp): converts the scales, calls groups[R - 1].
void q8_0_tile_by_row_groups(const Q8_0RowGroup groups[4], const void* w, size_t w_stride, const void* act,
                             size_t act_stride, int64_t n, int rows, int cols, float* out, int64_t out_stride);
// AVX-512 VNNI tile kernels (quant_dot_avx512.cpp): Q8_0, else null.
DotTileKernel avx512_dot_tile_kernel(GgmlType wt);
// AVX2 Q8_0 activation quantization, bit-identical to quantize_row (null off x86-64).
QuantizeKernel avx2_quantize_q8_0();
// AVX2 Q8_K activation quantization, bit-identical to the scalar quantize_q8_k (null off x86-64).
QuantizeKernel avx2_quantize_q8_k();

}  // namespace hyspec::cpu
