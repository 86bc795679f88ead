// AVX2+FMA+F16C dot kernels. Compiled with function-level target attributes (not -mavx2) so the
// library still runs on any x86-64; quant_dot.cpp calls these only after __builtin_cpu_supports.
//
// Integer core: a 32-byte weight vector times 32 int8 activations via vpmaddubsw (u8 x s8 -> pairs
// summed to int16) and vpmaddwd (int16 pairs -> int32, with a per-sub-block scale folded in).
// vpmaddubsw saturates at ±32767; every kernel below keeps |u8| * 127 * 2 under that bound (noted
// per kernel). Each kernel's comment gives weight bytes per 32 or 256 elements; the activation
// side reads 34-36 bytes per 32 (Q8_0/Q8_1) or 292 per 256 (Q8_K), mostly from L1/L2.
#include "backend/cpu/quant_dot_kernels.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <array>
#include <vector>

#include "util/half.h"

#define HS_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace hyspec::cpu {
namespace {

HS_AVX2 inline float f16(uint16_t h) { return _cvtsh_ss(h); }

HS_AVX2 inline float hsum_f32(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

HS_AVX2 inline int hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

// Σ pairs of u * y (u: unsigned codes, y: int8) weighted by int16 `scale` lanes, as 8 int32 lanes.
HS_AVX2 inline __m256i dot_u8_i8_scaled(__m256i u, __m256i y, __m256i scale) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, y), scale);
}
HS_AVX2 inline __m256i dot_u8_i8(__m256i u, __m256i y) {
  return dot_u8_i8_scaled(u, y, _mm256_set1_epi16(1));
}
// Signed x signed: move x's sign onto y so vpmaddubsw sees |x| (|x| <= 128, |y| <= 127: no saturation).
HS_AVX2 inline __m256i dot_i8_i8_scaled(__m256i x, __m256i y, __m256i scale) {
  return dot_u8_i8_scaled(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x), scale);
}
HS_AVX2 inline __m256i dot_i8_i8(__m256i x, __m256i y) {
  return dot_i8_i8_scaled(x, y, _mm256_set1_epi16(1));
}

HS_AVX2 inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
HS_AVX2 inline __m128i load128(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }

// 16 bytes of packed nibbles -> 32 bytes: low nibbles in the low lane, high nibbles in the high
// lane (element j and j+16 of a GGML 32-block).
// (Broadcast load + per-lane shift: two ALU ops instead of four with an insert.)
HS_AVX2 inline __m256i unpack_nibbles(const uint8_t* p) {
  const __m256i both = _mm256_broadcastsi128_si256(load128(p));
  const __m256i shifted = _mm256_srlv_epi64(both, _mm256_set_epi64x(4, 4, 0, 0));
  return _mm256_and_si256(shifted, _mm256_set1_epi8(0x0F));
}

// 32 bits -> 32 bytes, byte k = 0xFF when bit k is set.
HS_AVX2 inline __m256i bits_to_bytes(uint32_t bits) {
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3,
                       3, 3, 3));
  const __m256i select = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  return _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select);
}

// Two int16 scales as a vector: `a` in the low 128-bit lane, `b` in the high one (for kernels whose
// 32 lanes span two 16-element sub-blocks).
HS_AVX2 inline __m256i scale_pair(int a, int b) {
  return _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(b)), _mm_set1_epi16(static_cast<int16_t>(a)));
}

// ---- float weights: 4, 2, 2 bytes per element, 2 FLOPs per element ----

// `load8(i)` gives weights i..i+7 as f32, `load1(i)` weight i (for the tail). Four accumulators:
// the loop is then bound by loads, not by the FMA latency.
template <typename Load8, typename Load1>
HS_AVX2 inline float dot_float_weights(const float* y, int64_t n, Load8 load8, Load1 load1) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; ++k) acc[k] = _mm256_fmadd_ps(load8(i + 8 * k), _mm256_loadu_ps(y + i + 8 * k), acc[k]);
  float sum = hsum_f32(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  for (; i < n; ++i) sum += load1(i) * y[i];
  return sum;
}

HS_AVX2 float dot_f32(const void* w, const void* act, int64_t n) {
  const float* x = static_cast<const float*>(w);
  return dot_float_weights(
      static_cast<const float*>(act), n, [&](int64_t i) HS_AVX2 { return _mm256_loadu_ps(x + i); },
      [&](int64_t i) { return x[i]; });
}

HS_AVX2 float dot_f16(const void* w, const void* act, int64_t n) {
  const uint16_t* x = static_cast<const uint16_t*>(w);
  return dot_float_weights(
      static_cast<const float*>(act), n, [&](int64_t i) HS_AVX2 { return _mm256_cvtph_ps(load128(x + i)); },
      [&](int64_t i) HS_AVX2 { return f16(x[i]); });
}

// bf16 is the top half of an f32: widen to 32 bits and shift into place.
HS_AVX2 float dot_bf16(const void* w, const void* act, int64_t n) {
  const uint16_t* x = static_cast<const uint16_t*>(w);
  return dot_float_weights(
      static_cast<const float*>(act), n,
      [&](int64_t i) HS_AVX2 { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(load128(x + i)), 16)); },
      [&](int64_t i) { return bf16_to_fp32(x[i]); });
}

// ---- 32-element blocks against Q8_0 / Q8_1 (32 int8 MACs + 1 FMA per block) ----
// A block's work is short and ends in one FMA into an accumulator; with a single accumulator the
// loop would run at the FMA latency (4 cycles a block). sum_blocks alternates two.

struct BlockAcc {
  __m256 v;  // Σ block scale * int32 partial sums
  float s;   // Σ block offsets (Q4_1/Q5_1: m * s)
};

template <typename BlockFma>
HS_AVX2 inline float sum_blocks(int64_t nb, BlockFma block) {
  BlockAcc a0{_mm256_setzero_ps(), 0.0f}, a1{_mm256_setzero_ps(), 0.0f};
  int64_t b = 0;
  for (; b + 1 < nb; b += 2) {
    block(b, a0);
    block(b + 1, a1);
  }
  if (b < nb) block(b, a0);
  return hsum_f32(_mm256_add_ps(a0.v, a1.v)) + (a0.s + a1.s);
}

HS_AVX2 inline void add_scaled(BlockAcc& a, float scale, __m256i partial) {
  a.v = _mm256_fmadd_ps(_mm256_set1_ps(scale), _mm256_cvtepi32_ps(partial), a.v);
}

// Q8_0: 34 bytes / 32 elements. |x|, |y| <= 127 (x = -128 is allowed too: |x| = 128 fits).
HS_AVX2 float dot_q8_0(const void* w, const void* act, int64_t n) {
  const auto* x = static_cast<const BlockQ8_0*>(w);
  const auto* y = static_cast<const ActQ8_0*>(act);
  return sum_blocks(n / 32, [&](int64_t b, BlockAcc& a) HS_AVX2 {
    add_scaled(a, f16(x[b].d) * f16(y[b].d), dot_i8_i8(load256(x[b].qs), load256(y[b].qs)));
  });
}

// Q4_0: 18 bytes / 32 elements; codes 0..15 shifted to -8..7.
HS_AVX2 float dot_q4_0(const void* w, const void* act, int64_t n) {
  const auto* x = static_cast<const BlockQ4_0*>(w);
  const auto* y = static_cast<const ActQ8_0*>(act);
  const __m256i eight = _mm256_set1_epi8(8);
  return sum_blocks(n / 32, [&](int64_t b, BlockAcc& a) HS_AVX2 {
    const __m256i q = _mm256_sub_epi8(unpack_nibbles(x[b].qs), eight);
    add_scaled(a, f16(x[b].d) * f16(y[b].d), dot_i8_i8(q, load256(y[b].qs)));
  });
}

// Q4_1: 20 bytes / 32 elements; unsigned codes (15*127*2 < 32767), offset m through y.s.
HS_AVX2 float dot_q4_1(const void* w, const void* act, int64_t n) {
  const auto* x = static_cast<const BlockQ4_1*>(w);
  const auto* y = static_cast<const ActQ8_1*>(act);
  return sum_blocks(n / 32, [&](int64_t b, BlockAcc& a) HS_AVX2 {
    add_scaled(a, f16(x[b].d) * f16(y[b].d), dot_u8_i8(unpack_nibbles(x[b].qs), load256(y[b].qs)));
    a.s += f16(x[b].m) * f16(y[b].s);
  });
}

// Q5_0: 22 bytes / 32 elements. Code - 16 as int8 is the nibble with 0xF0 or-ed in when the fifth
// bit is clear (nibble - 16 in two's complement), and the bare nibble when it is set.
HS_AVX2 float dot_q5_0(const void* w, const void* act, int64_t n) {
  const auto* x = static_cast<const BlockQ5_0*>(w);
  const auto* y = static_cast<const ActQ8_0*>(act);
  const __m256i high_nibble = _mm256_set1_epi8(static_cast<char>(0xF0));
  return sum_blocks(n / 32, [&](int64_t b, BlockAcc& a) HS_AVX2 {
    const __m256i hi = _mm256_andnot_si256(bits_to_bytes(load_le32(x[b].qh)), high_nibble);
    const __m256i q = _mm256_or_si256(unpack_nibbles(x[b].qs), hi);
    add_scaled(a, f16(x[b].d) * f16(y[b].d), dot_i8_i8(q, load256(y[b].qs)));
  });
}

// Q5_1: 24 bytes / 32 elements; unsigned 5-bit codes (31*127*2 < 32767).
HS_AVX2 float dot_q5_1(const void* w, const void* act, int64_t n) {
  const auto* x = static_cast<const BlockQ5_1*>(w);
  const auto* y = static_cast<const ActQ8_1*>(act);
  const __m256i bit4 = _mm256_set1_epi8(0x10);
  return sum_blocks(n / 32, [&](int64_t b, BlockAcc& a) HS_AVX2 {
    const __m256i hi = _mm256_and_si256(bits_to_bytes(load_le32(x[b].qh)), bit4);
    const __m256i q = _mm256_or_si256(unpack_nibbles(x[b].qs), hi);
    add_scaled(a, f16(x[b].d) * f16(y[b].d), dot_u8_i8(q, load256(y[b].qs)));
    a.s += f16(x[b].m) * f16(y[b].s);
  });
}

// IQ4_NL (18 bytes) and MXFP4 (17 bytes) / 32 elements: codebook lookup with vpshufb, then a signed
// dot (|codebook| <= 127).
HS_AVX2 inline __m256i lookup_nibbles(const uint8_t* qs, __m256i codebook) {
  return _mm256_shuffle_epi8(codebook, unpack_nibbles(qs));
}
HS_AVX2 inline __m256i load_codebook(const int8_t values[16]) { return _mm256_broadcastsi128_si256(load128(values)); }

HS_AVX2 float dot_iq4_nl(const void* w, const void* act, int64_t n) {
  const auto* x = static_cast<const BlockIQ4_NL*>(w);
  const auto* y = static_cast<const ActQ8_0*>(act);
  const __m256i codebook = load_codebook(iq::kIq4nlValues);
  return sum_blocks(n / 32, [&](int64_t b, BlockAcc& a) HS_AVX2 {
    add_scaled(a, f16(x[b].d) * f16(y[b].d), dot_i8_i8(lookup_nibbles(x[b].qs, codebook), load256(y[b].qs)));
  });
}

HS_AVX2 float dot_mxfp4(const void* w, const void* act, int64_t n) {
  const auto* x = static_cast<const BlockMXFP4*>(w);
  const auto* y = static_cast<const ActQ8_0*>(act);
  const __m256i codebook = load_codebook(iq::kMxfp4Values);
  return sum_blocks(n / 32, [&](int64_t b, BlockAcc& a) HS_AVX2 {
    add_scaled(a, e8m0_to_fp32_half(x[b].e) * f16(y[b].d), dot_i8_i8(lookup_nibbles(x[b].qs, codebook), load256(y[b].qs)));
  });
}

// ---- 256-element super-blocks against Q8_K (256 int8 MACs + a few float ops per super-block) ----
// Scales are applied in vpmaddwd, so one super-block accumulates into one int32 vector; minimums
// and code offsets go through the activation's bsums.

// Σ_j a[j] * bsums[j] over the 16 groups (a: int16 per group).
HS_AVX2 inline int dot_bsums(const int16_t* bsums, __m256i a) {
  return hsum_i32(_mm256_madd_epi16(load256(bsums), a));
}

// Q2_K: 84 bytes / 256. 2-bit codes (3*127*2 < 32767), 4-bit scale + 4-bit min per 16.
HS_AVX2 float dot_q2_k(const void* w, const void* act, int64_t n) {
  const auto* x = static_cast<const BlockQ2_K*>(w);
  const auto* y = static_cast<const ActQ8_K*>(act);
  const __m256i m2 = _mm256_set1_epi8(3);
  const __m128i m4 = _mm_set1_epi8(0x0F);
  __m256 acc = _mm256_setzero_ps();
  float mins = 0;
  for (int64_t b = 0; b < n / 256; ++b) {
    const __m128i packed = load128(x[b].scales);
    const __m256i min16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), m4));
    mins += f16(x[b].dmin) * y[b].d * static_cast<float>(dot_bsums(y[b].bsums, min16));
    alignas(32) int16_t sc[16];
    _mm256_store_si256(reinterpret_cast<__m256i*>(sc), _mm256_cvtepu8_epi16(_mm_and_si128(packed, m4)));
    __m256i isum = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      __m256i q = load256(x[b].qs + 32 * h);  // 4 groups of 32 elements, 2 bits each
      for (int k = 0; k < 4; ++k) {
        const int g = 8 * h + 2 * k;
        const __m256i codes = _mm256_and_si256(q, m2);
        isum = _mm256_add_epi32(isum, dot_u8_i8_scaled(codes, load256(y[b].qs + 16 * g), scale_pair(sc[g], sc[g + 1])));
        q = _mm256_srli_epi16(q, 2);
      }
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16(x[b].d) * y[b].d), _mm256_cvtepi32_ps(isum), acc);
  }
  return hsum_f32(acc) - mins;
}

// unpack_q3_k_scales with 64-bit integer ops (the scalar loop cost more than the dot itself):
// the 16 scales, bias removed, as int16.
HS_AVX2 inline __m256i q3_k_scales(const uint8_t* p) {
  uint64_t low;  // low nibbles: scales 0..7 in the low halves of bytes 0..7, 8..15 in the high halves
  uint32_t high;  // 2-bit high parts: byte k holds those of scales k, k+4, k+8, k+12
  __builtin_memcpy(&low, p, 8);
  __builtin_memcpy(&high, p + 8, 4);
  const uint64_t m4 = 0x0F0F0F0F0F0F0F0Full;
  const uint32_t m2 = 0x03030303u;
  const uint64_t high_0_7 = (high & m2) | (static_cast<uint64_t>((high >> 2) & m2) << 32);
  const uint64_t high_8_15 = ((high >> 4) & m2) | (static_cast<uint64_t>((high >> 6) & m2) << 32);
  const uint64_t s0 = (low & m4) | (high_0_7 << 4);
  const uint64_t s1 = ((low >> 4) & m4) | (high_8_15 << 4);
  const __m128i biased = _mm_set_epi64x(static_cast<int64_t>(s1), static_cast<int64_t>(s0));
  return _mm256_cvtepi8_epi16(_mm_sub_epi8(biased, _mm_set1_epi8(32)));
}

// Q3_K: 110 bytes / 256. Codes 0..7 = 2 low bits | hmask bit << 2 (7*127*2 < 32767), value code-4,
// signed 6-bit scale per 16: Σ sc (Σ u y - 4 bsum).
HS_AVX2 float dot_q3_k(const void* w, const void* act, int64_t n) {
  const auto* x = static_cast<const BlockQ3_K*>(w);
  const auto* y = static_cast<const ActQ8_K*>(act);
  const __m256i m2 = _mm256_set1_epi8(3);
  const __m256i m1 = _mm256_set1_epi8(1);
  float sum = 0;
  for (int64_t b = 0; b < n / 256; ++b) {
    const __m256i sc16 = q3_k_scales(x[b].scales);
    alignas(32) int16_t sc[16];
    _mm256_store_si256(reinterpret_cast<__m256i*>(sc), sc16);
    const int offset = 4 * dot_bsums(y[b].bsums, sc16);
    __m256i hbits = load256(x[b].hmask);
    __m256i isum = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      __m256i q = load256(x[b].qs + 32 * h);
      for (int k = 0; k < 4; ++k) {
        const int g = 8 * h + 2 * k;
        const __m256i high = _mm256_slli_epi16(_mm256_and_si256(hbits, m1), 2);
        const __m256i codes = _mm256_or_si256(_mm256_and_si256(q, m2), high);
        isum = _mm256_add_epi32(isum, dot_u8_i8_scaled(codes, load256(y[b].qs + 16 * g), scale_pair(sc[g], sc[g + 1])));
        q = _mm256_srli_epi16(q, 2);
        hbits = _mm256_srli_epi16(hbits, 1);
      }
    }
    sum += f16(x[b].d) * y[b].d * static_cast<float>(hsum_i32(isum) - offset);
  }
  return sum;
}

// Q4_K (144 bytes / 256) and Q5_K (176 bytes / 256): 8 sub-blocks of 32 with 6-bit scale and min.
// Codes up to 31 (31*127*2 < 32767). Shared body; kFifthBit selects Q5_K's qh plane.
template <bool kFifthBit, typename Block>
HS_AVX2 inline float dot_q45_k(const Block* x, const ActQ8_K* y, int64_t n) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i m1 = _mm256_set1_epi8(1);
  __m256 acc = _mm256_setzero_ps();
  float mins = 0;
  for (int64_t b = 0; b < n / 256; ++b) {
    uint8_t sc[8], mn[8];
    unpack_k4_scales(x[b].scales, sc, mn);
    int min_sum = 0;
    for (int s = 0; s < 8; ++s) min_sum += mn[s] * (y[b].bsums[2 * s] + y[b].bsums[2 * s + 1]);
    mins += f16(x[b].dmin) * y[b].d * static_cast<float>(min_sum);
    __m256i hbits = _mm256_setzero_si256();
    if constexpr (kFifthBit) hbits = load256(x[b].qh);
    __m256i isum = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {  // 64 elements: sub-block 2c in low nibbles, 2c+1 in high
      const __m256i raw = load256(x[b].qs + 32 * c);
      __m256i lo = _mm256_and_si256(raw, m4);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
      if constexpr (kFifthBit) {
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(hbits, m1), 4));
        hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 1), m1), 4));
        hbits = _mm256_srli_epi16(hbits, 2);
      }
      isum = _mm256_add_epi32(isum, dot_u8_i8_scaled(lo, load256(y[b].qs + 64 * c), _mm256_set1_epi16(sc[2 * c])));
      isum = _mm256_add_epi32(isum, dot_u8_i8_scaled(hi, load256(y[b].qs + 64 * c + 32), _mm256_set1_epi16(sc[2 * c + 1])));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16(x[b].d) * y[b].d), _mm256_cvtepi32_ps(isum), acc);
  }
  return hsum_f32(acc) - mins;
}

HS_AVX2 float dot_q4_k(const void* w, const void* act, int64_t n) {
  return dot_q45_k<false>(static_cast<const BlockQ4_K*>(w), static_cast<const ActQ8_K*>(act), n);
}
HS_AVX2 float dot_q5_k(const void* w, const void* act, int64_t n) {
  return dot_q45_k<true>(static_cast<const BlockQ5_K*>(w), static_cast<const ActQ8_K*>(act), n);
}

// Q6_K: 210 bytes / 256. Codes 0..63 (63*127*2 < 32767), value code-32, int8 scale per 16:
// Σ sc (Σ u y - 32 bsum).
HS_AVX2 float dot_q6_k(const void* w, const void* act, int64_t n) {
  const auto* x = static_cast<const BlockQ6_K*>(w);
  const auto* y = static_cast<const ActQ8_K*>(act);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i m2 = _mm256_set1_epi8(3);
  float sum = 0;
  for (int64_t b = 0; b < n / 256; ++b) {
    const int8_t* sc = x[b].scales;
    const int offset = 32 * dot_bsums(y[b].bsums, _mm256_cvtepi8_epi16(load128(sc)));
    __m256i isum = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = load256(x[b].ql + 64 * h);       // elements 0..31 (low), 64..95 (high)
      const __m256i ql1 = load256(x[b].ql + 64 * h + 32);  // elements 32..63 (low), 96..127 (high)
      const __m256i qh = load256(x[b].qh + 32 * h);
      const __m256i ql_part[4] = {_mm256_and_si256(ql0, m4), _mm256_and_si256(ql1, m4),
                                  _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                                  _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4)};
      __m256i qh_shifted = qh;
      for (int k = 0; k < 4; ++k) {
        const int g = 8 * h + 2 * k;
        const __m256i codes = _mm256_or_si256(ql_part[k], _mm256_slli_epi16(_mm256_and_si256(qh_shifted, m2), 4));
        isum = _mm256_add_epi32(isum, dot_u8_i8_scaled(codes, load256(y[b].qs + 16 * g), scale_pair(sc[g], sc[g + 1])));
        qh_shifted = _mm256_srli_epi16(qh_shifted, 2);
      }
    }
    sum += f16(x[b].d) * y[b].d * static_cast<float>(hsum_i32(isum) - offset);
  }
  return sum;
}

// IQ4_XS: 136 bytes / 256. Codebook lookup, signed dot with the 6-bit scale (bias 32) in vpmaddwd.
HS_AVX2 float dot_iq4_xs(const void* w, const void* act, int64_t n) {
  const auto* x = static_cast<const BlockIQ4_XS*>(w);
  const auto* y = static_cast<const ActQ8_K*>(act);
  const __m256i codebook = load_codebook(iq::kIq4nlValues);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / 256; ++b) {
    __m256i isum = _mm256_setzero_si256();
    for (int s = 0; s < 8; ++s) {
      const int ls = ((x[b].scales_l[s / 2] >> (4 * (s % 2))) & 0xF) | (((x[b].scales_h >> (2 * s)) & 3) << 4);
      const __m256i q = lookup_nibbles(x[b].qs + 16 * s, codebook);
      isum = _mm256_add_epi32(isum, dot_i8_i8_scaled(q, load256(y[b].qs + 32 * s), _mm256_set1_epi16(static_cast<int16_t>(ls - 32))));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16(x[b].d) * y[b].d), _mm256_cvtepi32_ps(isum), acc);
  }
  return hsum_f32(acc);
}

// ---- grid-codebook i-quants against Q8_K ----
// Per 32 elements: 4 (2-bit grids, 8 bytes a row) or 8 (3-bit grids, 4 bytes a row) codebook rows
// gathered with scalar loads into one vector, signs moved onto the activation with vpsignb, then
// vpmaddubsw (grid magnitudes <= 62: 62*127*2 < 32767) and vpmaddwd with the odd integer scale.

// iq::kEvenParitySigns expanded to 8 bytes of ±1 (byte j = -1 when sign bit j is set), so that
// 7 stored sign bits become a vpsignb operand with one load.
const uint64_t* even_parity_sign_bytes() {
  static const std::array<uint64_t, 128> table = [] {
    std::array<uint64_t, 128> t{};
    for (size_t i = 0; i < t.size(); ++i)
      for (int j = 0; j < 8; ++j)
        t[i] |= static_cast<uint64_t>((iq::kEvenParitySigns[i] >> j) & 1 ? 0xFF : 0x01) << (8 * j);
    return t;
  }();
  return table.data();
}

template <size_t kRowBytes>
HS_AVX2 inline uint64_t grid_row(const std::array<uint8_t, kRowBytes>& row) {
  uint64_t v = 0;
  __builtin_memcpy(&v, row.data(), kRowBytes);
  return v;
}
HS_AVX2 inline uint64_t grid_row(const std::array<int8_t, 8>& row) {
  uint64_t v;
  __builtin_memcpy(&v, row.data(), 8);
  return v;
}

// Four 8-byte rows (or pairs of 4-byte rows), row 0 in the lowest bytes.
HS_AVX2 inline __m256i rows4(uint64_t r0, uint64_t r1, uint64_t r2, uint64_t r3) {
  return _mm256_set_epi64x(static_cast<int64_t>(r3), static_cast<int64_t>(r2), static_cast<int64_t>(r1),
                           static_cast<int64_t>(r0));
}
HS_AVX2 inline uint64_t pair(uint64_t lo4, uint64_t hi4) { return lo4 | (hi4 << 32); }

// 32 sign bits -> ±1 bytes for vpsignb.
HS_AVX2 inline __m256i sign_bytes(uint32_t bits) {
  return _mm256_or_si256(bits_to_bytes(bits), _mm256_set1_epi8(1));
}

// Σ grid * sign * y for 32 elements, weighted by the int16 scale lanes.
HS_AVX2 inline __m256i signed_grid_dot(__m256i grid, __m256i signs, const int8_t* y, __m256i scale) {
  return dot_u8_i8_scaled(grid, _mm256_sign_epi8(load256(y), signs), scale);
}

// The skeleton of the IQ kernels: per 256-element super-block, the int32 lanes of its eight
// 32-element sub-blocks (sub(block, ib, y + 32 ib)) summed, then scaled by scale · d · y.d.
template <class Block, class SubBlockDot>
HS_AVX2 inline float iq_superblock_dot(const void* w, const void* act, int64_t n, float scale, SubBlockDot sub) {
  const auto* x = static_cast<const Block*>(w);
  const auto* y = static_cast<const ActQ8_K*>(act);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / 256; ++b) {
    __m256i isum = _mm256_setzero_si256();
    for (int ib = 0; ib < 8; ++ib) isum = _mm256_add_epi32(isum, sub(x[b], ib, y[b].qs + 32 * ib));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(scale * f16(x[b].d) * y[b].d), _mm256_cvtepi32_ps(isum), acc);
  }
  return hsum_f32(acc);
}

// IQ2_XXS: 66 bytes / 256.
HS_AVX2 float dot_iq2_xxs(const void* w, const void* act, int64_t n) {
  const uint64_t* sign8 = even_parity_sign_bytes();
  const auto& grid = iq::kIq2xxsGrid;
  return iq_superblock_dot<BlockIQ2_XXS>(w, act, n, 0.125f, [&](const BlockIQ2_XXS& x, int ib, const int8_t* y) HS_AVX2 {
    const uint32_t idx = load_le32(x.qs + 8 * ib), aux = load_le32(x.qs + 8 * ib + 4);
    const __m256i g = rows4(grid_row(grid[idx & 255]), grid_row(grid[(idx >> 8) & 255]),
                            grid_row(grid[(idx >> 16) & 255]), grid_row(grid[idx >> 24]));
    const __m256i s = rows4(sign8[aux & 127], sign8[(aux >> 7) & 127], sign8[(aux >> 14) & 127], sign8[(aux >> 21) & 127]);
    return signed_grid_dot(g, s, y, _mm256_set1_epi16(static_cast<int16_t>(2 * (aux >> 28) + 1)));
  });
}

// IQ2_XS: 74 bytes / 256.
HS_AVX2 float dot_iq2_xs(const void* w, const void* act, int64_t n) {
  const uint64_t* sign8 = even_parity_sign_bytes();
  const auto& grid = iq::kIq2xsGrid;
  return iq_superblock_dot<BlockIQ2_XS>(w, act, n, 0.125f, [&](const BlockIQ2_XS& x, int ib, const int8_t* y) HS_AVX2 {
    const uint16_t* q = x.qs + 4 * ib;
    const __m256i g = rows4(grid_row(grid[q[0] & 511]), grid_row(grid[q[1] & 511]), grid_row(grid[q[2] & 511]),
                            grid_row(grid[q[3] & 511]));
    const __m256i s = rows4(sign8[q[0] >> 9], sign8[q[1] >> 9], sign8[q[2] >> 9], sign8[q[3] >> 9]);
    const int sc = x.scales[ib];
    return signed_grid_dot(g, s, y, scale_pair(2 * (sc & 0xF) + 1, 2 * (sc >> 4) + 1));
  });
}

// IQ2_S: 82 bytes / 256.
HS_AVX2 float dot_iq2_s(const void* w, const void* act, int64_t n) {
  const auto& grid = iq::kIq2sGrid;
  return iq_superblock_dot<BlockIQ2_S>(w, act, n, 0.125f, [&](const BlockIQ2_S& x, int ib, const int8_t* y) HS_AVX2 {
    const uint8_t* q = x.qs + 4 * ib;
    const int qh = x.qh[ib];
    const __m256i g = rows4(grid_row(grid[q[0] | ((qh << 8) & 0x300)]), grid_row(grid[q[1] | ((qh << 6) & 0x300)]),
                            grid_row(grid[q[2] | ((qh << 4) & 0x300)]), grid_row(grid[q[3] | ((qh << 2) & 0x300)]));
    const int sc = x.scales[ib];
    return signed_grid_dot(g, sign_bytes(load_le32(x.signs + 4 * ib)), y, scale_pair(2 * (sc & 0xF) + 1, 2 * (sc >> 4) + 1));
  });
}

// IQ3_XXS: 98 bytes / 256.
HS_AVX2 float dot_iq3_xxs(const void* w, const void* act, int64_t n) {
  const uint64_t* sign8 = even_parity_sign_bytes();
  const auto& grid = iq::kIq3xxsGrid;
  return iq_superblock_dot<BlockIQ3_XXS>(w, act, n, 0.25f, [&](const BlockIQ3_XXS& x, int ib, const int8_t* y) HS_AVX2 {
    const uint8_t* q = x.qs + 8 * ib;
    const uint32_t aux = load_le32(x.scales_signs + 4 * ib);
    const __m256i g = rows4(pair(grid_row(grid[q[0]]), grid_row(grid[q[1]])), pair(grid_row(grid[q[2]]), grid_row(grid[q[3]])),
                            pair(grid_row(grid[q[4]]), grid_row(grid[q[5]])), pair(grid_row(grid[q[6]]), grid_row(grid[q[7]])));
    const __m256i s = rows4(sign8[aux & 127], sign8[(aux >> 7) & 127], sign8[(aux >> 14) & 127], sign8[(aux >> 21) & 127]);
    return signed_grid_dot(g, s, y, _mm256_set1_epi16(static_cast<int16_t>(2 * (aux >> 28) + 1)));
  });
}

// IQ3_S: 110 bytes / 256.
HS_AVX2 float dot_iq3_s(const void* w, const void* act, int64_t n) {
  const auto& grid = iq::kIq3sGrid;
  return iq_superblock_dot<BlockIQ3_S>(w, act, n, 1.0f, [&](const BlockIQ3_S& x, int ib, const int8_t* y) HS_AVX2 {
    const uint8_t* q = x.qs + 8 * ib;
    const int qh = x.qh[ib];
    uint64_t rows[8];
    for (int k = 0; k < 8; ++k) rows[k] = grid_row(grid[q[k] | (((qh >> k) & 1) << 8)]);
    const __m256i g = rows4(pair(rows[0], rows[1]), pair(rows[2], rows[3]), pair(rows[4], rows[5]), pair(rows[6], rows[7]));
    const int scale = 2 * ((x.scales[ib / 2] >> (4 * (ib % 2))) & 0xF) + 1;
    return signed_grid_dot(g, sign_bytes(load_le32(x.signs + 4 * ib)), y, _mm256_set1_epi16(static_cast<int16_t>(scale)));
  });
}

// IQ1_S (50 bytes / 256) and IQ1_M (56 bytes / 256): grid values g in {-1, 0, 1} plus a delta of
// ±1/8, dotted as the integers 8g ± 1 (|.| <= 9) and scaled by 1/8 at the end.
HS_AVX2 inline __m256i iq1_values(__m256i grid, __m256i delta) {
  return _mm256_add_epi8(_mm256_sign_epi8(_mm256_set1_epi8(8), grid), delta);
}
HS_AVX2 inline uint64_t delta_bytes(bool negative) { return negative ? ~0ull : 0x0101010101010101ull; }

HS_AVX2 float dot_iq1_s(const void* w, const void* act, int64_t n) {
  const auto& grid = iq::kIq1sGrid;
  return iq_superblock_dot<BlockIQ1_S>(w, act, n, 0.125f, [&](const BlockIQ1_S& x, int ib, const int8_t* y) HS_AVX2 {
    const uint8_t* q = x.qs + 4 * ib;
    const int qh = x.qh[ib];
    const __m256i g = rows4(grid_row(grid[q[0] | ((qh << 8) & 0x700)]), grid_row(grid[q[1] | ((qh << 5) & 0x700)]),
                            grid_row(grid[q[2] | ((qh << 2) & 0x700)]), grid_row(grid[q[3] | ((qh >> 1) & 0x700)]));
    const __m256i v = iq1_values(g, _mm256_set1_epi64x(static_cast<int64_t>(delta_bytes(qh & 0x8000))));
    const __m256i scale = _mm256_set1_epi16(static_cast<int16_t>(2 * ((qh >> 12) & 7) + 1));
    return dot_i8_i8_scaled(v, load256(y), scale);
  });
}

HS_AVX2 float dot_iq1_m(const void* w, const void* act, int64_t n) {
  const auto* x = static_cast<const BlockIQ1_M*>(w);
  const auto* y = static_cast<const ActQ8_K*>(act);
  const auto& grid = iq::kIq1sGrid;
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / 256; ++b) {
    uint16_t sc[4], d;
    unpack_iq1_m_scales(x[b], sc, &d);
    __m256i isum = _mm256_setzero_si256();
    for (int ib = 0; ib < 8; ++ib) {
      const uint8_t* q = x[b].qs + 4 * ib;
      const int h01 = x[b].qh[2 * ib], h23 = x[b].qh[2 * ib + 1];  // a nibble per 8: 3 index bits, delta sign
      const __m256i g = rows4(grid_row(grid[q[0] | ((h01 << 8) & 0x700)]), grid_row(grid[q[1] | ((h01 << 4) & 0x700)]),
                              grid_row(grid[q[2] | ((h23 << 8) & 0x700)]), grid_row(grid[q[3] | ((h23 << 4) & 0x700)]));
      const __m256i delta = rows4(delta_bytes(h01 & 0x08), delta_bytes(h01 & 0x80), delta_bytes(h23 & 0x08), delta_bytes(h23 & 0x80));
      const int t = 2 * ib;  // 16-element scale groups t, t+1: 3 bits each, four to a u16
      const int s0 = (sc[t / 4] >> (3 * (t % 4))) & 7, s1 = (sc[(t + 1) / 4] >> (3 * ((t + 1) % 4))) & 7;
      isum = _mm256_add_epi32(isum, dot_i8_i8_scaled(iq1_values(g, delta), load256(y[b].qs + 32 * ib), scale_pair(2 * s0 + 1, 2 * s1 + 1)));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(0.125f * f16(d) * y[b].d), _mm256_cvtepi32_ps(isum), acc);
  }
  return hsum_f32(acc);
}

}  // namespace

// The Q8_0 tile kernels' driver (quant_dot_kernels.h), shared with the AVX-512 tile: block scales
// to f32 once per call (activations) and once per group of 4 weight rows, then the ISA's row group.
HS_AVX2 void q8_0_tile_by_row_groups(const Q8_0RowGroup groups[4], const void* w, size_t w_stride, const void* act,
                                     size_t act_stride, int64_t n, int rows, int cols, float* out, int64_t out_stride) {
  constexpr int kRows = 4;
  const int64_t nb = n / 32;
  thread_local std::vector<float> scales;
  scales.resize(static_cast<size_t>((cols + kRows) * nb));
  float* da = scales.data();
  float* dw = da + cols * nb;
  const auto* ab = static_cast<const uint8_t*>(act);
  for (int c = 0; c < cols; ++c) {
    const auto* a = reinterpret_cast<const ActQ8_0*>(ab + c * act_stride);
    for (int64_t b = 0; b < nb; ++b) da[c * nb + b] = f16(a[b].d);
  }
  for (int r0 = 0; r0 < rows; r0 += kRows) {
    const int R = std::min(kRows, rows - r0);
    const BlockQ8_0* wr[kRows];
    for (int r = 0; r < R; ++r) {
      wr[r] = reinterpret_cast<const BlockQ8_0*>(static_cast<const uint8_t*>(w) + (r0 + r) * w_stride);
      for (int64_t b = 0; b < nb; ++b) dw[r * nb + b] = f16(wr[r][b].d);
    }
    groups[R - 1](wr, dw, ab, act_stride, da, nb, cols, out + r0, out_stride);
  }
}

namespace {

// ---- tiles: Q8_0 weights x Q8_0 activations ----
// R weight rows x T activation rows per pass over the blocks: each weight block is loaded and
// sign-split once per T activation rows, each activation block loaded once per R weight rows.
// Per (row, col, block), 32 MACs: vpsignb, vpmaddubsw, vpmaddwd, a conversion, a multiply and an
// FMA. Block scales come pre-converted to f32 (dw per weight row, da per activation row).
// Bytes: 34 per weight block per T activation rows, 34 per activation block per R weight rows.
constexpr int kTileT = 2;  // activation rows per tile (weight rows: the row group, up to 4)

// Lane i = the sum of the lanes of x_i: three rounds of horizontal adds and a swap of halves.
HS_AVX2 inline __m256 reduce8(__m256 x0, __m256 x1, __m256 x2, __m256 x3, __m256 x4, __m256 x5, __m256 x6, __m256 x7) {
  const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(x0, x1), _mm256_hadd_ps(x2, x3));
  const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(x4, x5), _mm256_hadd_ps(x6, x7));
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// One lane sum in exactly reduce8's order, ((x0+x1)+(x2+x3)) + ((x4+x5)+(x6+x7)), so a dot
// product has the same bits whichever tile shape computed it: a verify step's rows must equal a
// decode step's (batch invariance, tests/backend/batch_invariance_test.cpp).
HS_AVX2 inline float hsum_tree(__m256 x) {
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(x, x), _mm256_hadd_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
}

template <int R, int T>
HS_AVX2 inline __attribute__((always_inline)) void tile_q8_0_micro(const BlockQ8_0* const* w, const ActQ8_0* const* a,
                                                                   const float* dw, const float* da, int64_t nb,
                                                                   float* out, int64_t out_stride) {
  __m256 acc[R][T];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < nb; ++b) {
    __m256i av[T];
    __m256 sa[T];
#pragma GCC unroll 2
    for (int t = 0; t < T; ++t) {
      av[t] = load256(a[t][b].qs);
      sa[t] = _mm256_set1_ps(da[t * nb + b]);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256i wv = load256(w[r][b].qs);
      const __m256i wabs = _mm256_sign_epi8(wv, wv);
      const __m256 sw = _mm256_set1_ps(dw[r * nb + b]);
#pragma GCC unroll 2
      for (int t = 0; t < T; ++t) {
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wabs, _mm256_sign_epi8(av[t], wv)), ones);
        acc[r][t] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(p), sa[t]), sw, acc[r][t]);
      }
    }
  }
  if constexpr (R == 4 && T == 2) {
    // 8 sums at once: lanes 0-3 = rows 0-3 of column 0, lanes 4-7 = rows 0-3 of column 1.
    const __m256 s = reduce8(acc[0][0], acc[1][0], acc[2][0], acc[3][0], acc[0][1], acc[1][1], acc[2][1], acc[3][1]);
    _mm_storeu_ps(out, _mm256_castps256_ps128(s));
    _mm_storeu_ps(out + out_stride, _mm256_extractf128_ps(s, 1));
  } else if constexpr (R == 4 && T == 1) {
    const __m256 u = _mm256_hadd_ps(_mm256_hadd_ps(acc[0][0], acc[1][0]), _mm256_hadd_ps(acc[2][0], acc[3][0]));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1)));
  } else {
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) out[t * out_stride + r] = hsum_tree(acc[r][t]);
  }
}

// R weight rows (one row group) against all `cols` activation rows: full tiles in a loop, then the
// remainder; one function per R so the tile body is inlined into its loop.
template <int R>
HS_AVX2 void tile_q8_0_row_group(const BlockQ8_0* const* wr, const float* dw, const uint8_t* act, size_t act_stride,
                                 const float* da, int64_t nb, int cols, float* out, int64_t out_stride) {
  const ActQ8_0* ar[kTileT];
  int c0 = 0;
  for (; c0 + kTileT <= cols; c0 += kTileT) {
    for (int t = 0; t < kTileT; ++t) ar[t] = reinterpret_cast<const ActQ8_0*>(act + (c0 + t) * act_stride);
    tile_q8_0_micro<R, kTileT>(wr, ar, dw, da + c0 * nb, nb, out + c0 * out_stride, out_stride);
  }
  if (c0 < cols) {  // kTileT == 2: one column left
    ar[0] = reinterpret_cast<const ActQ8_0*>(act + c0 * act_stride);
    tile_q8_0_micro<R, 1>(wr, ar, dw, da + c0 * nb, nb, out + c0 * out_stride, out_stride);
  }
}

HS_AVX2 void tile_q8_0(const void* w, size_t w_stride, const void* act, size_t act_stride, int64_t n, int rows,
                       int cols, float* out, int64_t out_stride) {
  static constexpr Q8_0RowGroup kGroups[4] = {tile_q8_0_row_group<1>, tile_q8_0_row_group<2>, tile_q8_0_row_group<3>,
                                              tile_q8_0_row_group<4>};
  q8_0_tile_by_row_groups(kGroups, w, w_stride, act, act_stride, n, rows, cols, out, out_stride);
}

// ---- activation preparation ----

// quantize_row's Q8_0, bit for bit: d = amax/127 (fp16, round to nearest even as F16C does),
// codes = round-half-away(x * (1/d)). Up to 8 blocks share one vector division for d and 1/d (the
// same IEEE operations as the scalar code, without two division latencies per block). vroundps
// has no half-away mode; trunc(s + copysign(0.49999997, s)) is exactly round-half-away for every
// float s (checked exhaustively for |s| <= 256, more than the 127.x quantization reaches). ~45 ops per
// block of 32.
HS_AVX2 void quantize_q8_0(const float* x, int64_t n, void* out) {
  auto* y = static_cast<ActQ8_0*>(out);
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  const __m256 below_half = _mm256_set1_ps(0.49999997f);
  const int64_t nb = n / 32;
  for (int64_t g = 0; g < nb; g += 8) {
    const int cnt = static_cast<int>(std::min<int64_t>(8, nb - g));
    alignas(32) float amax[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    for (int i = 0; i < cnt; ++i) {
      const float* xb = x + (g + i) * 32;
      __m256 m = _mm256_andnot_ps(sign_bit, _mm256_loadu_ps(xb));
      for (int k = 1; k < 4; ++k) m = _mm256_max_ps(_mm256_andnot_ps(sign_bit, _mm256_loadu_ps(xb + 8 * k)), m);
      __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
      h = _mm_max_ps(h, _mm_movehl_ps(h, h));
      amax[i] = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
    }
    const __m256 d = _mm256_div_ps(_mm256_load_ps(amax), _mm256_set1_ps(127.0f));
    const __m256 nonzero = _mm256_cmp_ps(d, _mm256_setzero_ps(), _CMP_NEQ_OQ);
    alignas(32) float id[8];
    _mm256_store_ps(id, _mm256_and_ps(_mm256_div_ps(_mm256_set1_ps(1.0f), d), nonzero));
    alignas(16) uint16_t dh[8];
    _mm_store_si128(reinterpret_cast<__m128i*>(dh), _mm256_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT));
    for (int i = 0; i < cnt; ++i) {
      const float* xb = x + (g + i) * 32;
      ActQ8_0& blk = y[g + i];
      blk.d = dh[i];
      const __m256 idv = _mm256_set1_ps(id[i]);
      __m256i q[4];
      for (int k = 0; k < 4; ++k) {
        const __m256 s = _mm256_mul_ps(_mm256_loadu_ps(xb + 8 * k), idv);
        const __m256 r = _mm256_add_ps(s, _mm256_or_ps(_mm256_and_ps(s, sign_bit), below_half));
        q[k] = _mm256_cvttps_epi32(r);
      }
      // int32 -> int8: the packs interleave 128-bit lanes; one permute restores the order.
      const __m256i q16a = _mm256_packs_epi32(q[0], q[1]), q16b = _mm256_packs_epi32(q[2], q[3]);
      const __m256i q8 =
          _mm256_permutevar8x32_epi32(_mm256_packs_epi16(q16a, q16b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(blk.qs), q8);
    }
  }
}

// quantize_q8_k (quant_dot.cpp), bit for bit: scale from the first element of largest magnitude
// (d = max / -127 in f32), codes = nearbyint(x * -127/max) (vcvtps2dq rounds to nearest even, as
// nearbyint does in the default mode) capped at 127, and the 16 per-16 code sums. ~3 passes over
// the 256 values.
HS_AVX2 void quantize_q8_k(const float* x, int64_t n, void* out) {
  auto* y = static_cast<ActQ8_K*>(out);
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  const __m256i ones16 = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < n / 256; ++b, x += 256) {
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < 32; ++i) m = _mm256_max_ps(_mm256_andnot_ps(sign_bit, _mm256_loadu_ps(x + 8 * i)), m);
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    const float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
    if (amax == 0) {
      std::memset(&y[b], 0, sizeof(ActQ8_K));
      continue;
    }
    // The first element whose magnitude is amax carries the sign (the scalar code's strict >).
    const __m256 amax_v = _mm256_set1_ps(amax);
    float max = 0;
    for (int i = 0; i < 32; ++i) {
      const __m256 v = _mm256_loadu_ps(x + 8 * i);
      const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign_bit, v), amax_v, _CMP_EQ_OQ));
      if (hit) {
        max = x[8 * i + __builtin_ctz(static_cast<unsigned>(hit))];
        break;
      }
    }
    const float iscale = -127.0f / max;
    const __m256 is = _mm256_set1_ps(iscale);
    __m256i sums[16];
    for (int g = 0; g < 16; ++g) {
      const __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16 * g), is));
      const __m256i q1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16 * g + 8), is));
      // packs_epi32 leaves the four 4-code quarters as q0[0:4] q1[0:4] q0[4:8] q1[4:8]; reorder them.
      const __m256i q16 = _mm256_permute4x64_epi64(
          _mm256_min_epi16(_mm256_packs_epi32(q0, q1), _mm256_set1_epi16(127)), 0xD8);
      sums[g] = _mm256_madd_epi16(q16, ones16);
      // To bytes: each 128-bit lane packs its 8 codes (twice); keep the first copy of each lane.
      const __m256i q8 = _mm256_permute4x64_epi64(_mm256_packs_epi16(q16, q16), 0x08);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(y[b].qs + 16 * g), _mm256_castsi256_si128(q8));
    }
    // 16 vectors of 8 int32 partial sums -> the 16 group sums (two transposing reductions).
    for (int half = 0; half < 2; ++half) {
      const __m256i* s8 = sums + 8 * half;
      const __m256i u0 = _mm256_hadd_epi32(_mm256_hadd_epi32(s8[0], s8[1]), _mm256_hadd_epi32(s8[2], s8[3]));
      const __m256i u1 = _mm256_hadd_epi32(_mm256_hadd_epi32(s8[4], s8[5]), _mm256_hadd_epi32(s8[6], s8[7]));
      const __m256i t = _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20), _mm256_permute2x128_si256(u0, u1, 0x31));
      const __m128i t16 = _mm_packs_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(y[b].bsums + 8 * half), t16);
    }
    y[b].d = 1.0f / iscale;
  }
}

}  // namespace

DotTileKernel avx2_dot_tile_kernel(GgmlType wt) { return wt == GgmlType::Q8_0 ? tile_q8_0 : nullptr; }
QuantizeKernel avx2_quantize_q8_0() { return quantize_q8_0; }
QuantizeKernel avx2_quantize_q8_k() { return quantize_q8_k; }

DotKernel avx2_dot_kernel(GgmlType wt) {
  switch (wt) {
#define HS_KERNEL_CASE(type, suffix) \
  case GgmlType::type: return dot_##suffix;
    HYSPEC_DOT_KERNELS(HS_KERNEL_CASE)
#undef HS_KERNEL_CASE
    default: return nullptr;
  }
}

}  // namespace hyspec::cpu

#else  // not x86-64: no AVX2 kernels

namespace hyspec::cpu {
DotKernel avx2_dot_kernel(GgmlType) { return nullptr; }
DotTileKernel avx2_dot_tile_kernel(GgmlType) { return nullptr; }
QuantizeKernel avx2_quantize_q8_0() { return nullptr; }
QuantizeKernel avx2_quantize_q8_k() { return nullptr; }
}  // namespace hyspec::cpu

#endif
