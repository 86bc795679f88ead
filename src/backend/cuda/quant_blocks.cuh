// Device-side decoding of GGML weight types, one struct per type. Adding a type = one struct here
// plus one line in the dispatch of matmul.cu. Each struct provides:
//   kBlock          elements per block (a multiple of 32)
//   value(row, i)   element i of a row as f32, evaluated like src/format/quants.cpp (exact; embed
//                   and the fallback matmul use it)
//   Raw, load(row, c, raw), decode(row, raw, c, a)
//                   the 32 elements of chunk c (elements [32c, 32c+32) of the row *as permuted*)
//                   as 16 half2, the fast path of the tensor-core matmul, split in two so the
//                   matvec can issue the loads of its next step before decoding this one
//   chunk(row, c, a)  load + decode
//   kSwizzle        each aligned group of 4 chunk positions holds 4 consecutive elements, in the
//                   order {0,1,2,3} (false) or {0,2,1,3} (true); lets the matvec read activations
//                   as float4 straight from f32 rows
//   perm(j)         which element of its block chunk position j holds: chunk(row, c, a) yields
//                   a[m].x = element perm(32c' + 2m), a[m].y = element perm(32c' + 2m + 1) of the
//                   block, c' = c % (kBlock/32). The permutation lets each type emit values in the
//                   order its bit tricks produce them; the activations are permuted the same way once
//                   per matmul, so no shuffling happens in the inner loop (a dot product does not care
//                   about the order of its terms).
//   kBlockBytes     bytes of one block
//   kStepChunks     chunks per row and pipeline step of the streaming matvec (4 or 8: a whole block
//                   for the K-quants, ~128-272 bytes of a row)
//   kA2             load() reads whole aligned words around 2-byte aligned data (below)
// load() and value() use plain loads, so they decode from global or shared memory alike (the
// matvec streams rows into shared memory and decodes them there at the same address mod 16).
// Blocks of some types (Q8_0, Q4_0, Q6_K) are only 2-byte aligned; load_a2/words_a2 read them with
// aligned 4-byte loads and funnel shifts. It may read up to 4 bytes past the block: every weight
// allocation carries kWeightPad (kernels.h) bytes of padding.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "backend/cuda/kernels.h"
#include "backend/cuda/tensor_core.cuh"
#include "format/iq_tables.h"

namespace hyspec::cuda {

__device__ __forceinline__ float ld_f16(const uint8_t* p) {
  return __half2float(*reinterpret_cast<const __half*>(p));
}

// N little-endian words starting at a 2-byte aligned address: the N+1 aligned words around them
// (load_a2), realigned with funnel shifts (words_a2) once they have arrived.
template <int N>
struct A2Words {
  uint32_t r[N + 1];
};
template <int N>
__device__ __forceinline__ void load_a2(const uint8_t* p, A2Words<N>& raw) {
  // p minus its misalignment (not a cast from an integer), so loads from shared memory stay LDS
  const uint32_t* base = reinterpret_cast<const uint32_t*>(p - (reinterpret_cast<uintptr_t>(p) & 3));
#pragma unroll
  for (int i = 0; i <= N; ++i) raw.r[i] = base[i];
}
template <int N>
__device__ __forceinline__ void words_a2(const uint8_t* p, const A2Words<N>& raw, uint32_t (&w)[N]) {
  const uint32_t sh = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(p) & 3) * 8;  // 0 or 16
#pragma unroll
  for (int i = 0; i < N; ++i) w[i] = __funnelshift_r(raw.r[i], raw.r[i + 1], sh);
}
__device__ __forceinline__ uint16_t ld_u16(const uint8_t* p) { return *reinterpret_cast<const unsigned short*>(p); }
__device__ __forceinline__ half2 h2_of_u16(uint16_t h) {
  return __half2half2(__ushort_as_half(h));
}
// Two 4-bit (plus high bits, already or-ed in) values in the low bits of each 16-bit half of u,
// made into the halves 1024 + q by or-ing in the exponent of 1024.
__device__ __forceinline__ half2 magic_h2(uint32_t u) { return as_half2(u | 0x64006400u); }

// Chunk position j -> offset inside a group of 8 for the nibble order the 4-bit decoders emit:
// a word w = bytes b0..b3 gives (b0,b2) and (b1,b3) low nibbles, then the same high nibbles.
__host__ __device__ constexpr int nibble_pair_offset(int r) { return (r & 1) * 2 + ((r >> 1) & 1); }

// chunk() for every type: load, then decode.
#define HS_CHUNK_FROM_LOAD_DECODE                                                   \
  __device__ static void chunk(const uint8_t* row, int64_t c, half2 (&a)[16]) {     \
    Raw raw;                                                                        \
    load(row, c, raw);                                                              \
    decode(row, raw, c, a);                                                         \
  }

struct TypeF32 {
  static constexpr int kBlock = 32;
  static constexpr int kBlockBytes = 128;
  static constexpr int kStepChunks = 4;
  static constexpr bool kA2 = false;
  static constexpr bool kSwizzle = false;
  struct Raw {
    float4 v[8];
  };
  __device__ static float value(const uint8_t* row, int64_t i) { return reinterpret_cast<const float*>(row)[i]; }
  __device__ static void load(const uint8_t* row, int64_t c, Raw& r) {
    const float4* p = reinterpret_cast<const float4*>(row) + c * 8;
#pragma unroll
    for (int k = 0; k < 8; ++k) r.v[k] = p[k];
  }
  __device__ static void decode(const uint8_t*, const Raw& r, int64_t, half2 (&a)[16]) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      a[2 * k] = __floats2half2_rn(r.v[k].x, r.v[k].y);
      a[2 * k + 1] = __floats2half2_rn(r.v[k].z, r.v[k].w);
    }
  }
  HS_CHUNK_FROM_LOAD_DECODE
  __host__ __device__ static constexpr int perm(int j) { return j; }
};

struct TypeF16 {
  static constexpr int kBlock = 32;
  static constexpr int kBlockBytes = 64;
  static constexpr int kStepChunks = 4;
  static constexpr bool kA2 = false;
  static constexpr bool kSwizzle = false;
  struct Raw {
    uint4 v[4];
  };
  __device__ static float value(const uint8_t* row, int64_t i) { return ld_f16(row + 2 * i); }
  __device__ static void load(const uint8_t* row, int64_t c, Raw& r) {
    const uint4* p = reinterpret_cast<const uint4*>(row + c * 64);
#pragma unroll
    for (int k = 0; k < 4; ++k) r.v[k] = p[k];
  }
  __device__ static void decode(const uint8_t*, const Raw& r, int64_t, half2 (&a)[16]) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      a[4 * k] = as_half2(r.v[k].x), a[4 * k + 1] = as_half2(r.v[k].y);
      a[4 * k + 2] = as_half2(r.v[k].z), a[4 * k + 3] = as_half2(r.v[k].w);
    }
  }
  HS_CHUNK_FROM_LOAD_DECODE
  __host__ __device__ static constexpr int perm(int j) { return j; }
};

struct TypeBF16 {
  static constexpr int kBlock = 32;
  static constexpr int kBlockBytes = 64;
  static constexpr int kStepChunks = 4;
  static constexpr bool kA2 = false;
  static constexpr bool kSwizzle = false;
  using Raw = TypeF16::Raw;
  __device__ static float value(const uint8_t* row, int64_t i) {
    return __uint_as_float(static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(row)[i]) << 16);
  }
  __device__ static void load(const uint8_t* row, int64_t c, Raw& r) { TypeF16::load(row, c, r); }
  __device__ static void decode(const uint8_t*, const Raw& r, int64_t, half2 (&a)[16]) {
    const uint32_t* w = reinterpret_cast<const uint32_t*>(r.v);
#pragma unroll
    for (int k = 0; k < 16; ++k) a[k] = __floats2half2_rn(__uint_as_float(w[k] << 16), __uint_as_float(w[k] & 0xffff0000u));
  }
  HS_CHUNK_FROM_LOAD_DECODE
  __host__ __device__ static constexpr int perm(int j) { return j; }
};

// Q8_0 (34 B): d f16, qs[32] int8; y = d*q.
struct TypeQ8_0 {
  static constexpr int kBlock = 32;
  static constexpr int kBlockBytes = 34;
  static constexpr int kStepChunks = 4;
  static constexpr bool kA2 = true;
  static constexpr bool kSwizzle = false;
  struct Raw {
    uint16_t d;
    A2Words<8> q;
  };
  __device__ static float value(const uint8_t* row, int64_t i) {
    const uint8_t* b = row + (i / 32) * 34;
    return __fmul_rn(ld_f16(b), static_cast<float>(reinterpret_cast<const int8_t*>(b + 2)[i % 32]));
  }
  __device__ static void load(const uint8_t* row, int64_t c, Raw& r) {
    const uint8_t* b = row + c * 34;
    r.d = ld_u16(b);
    load_a2(b + 2, r.q);
  }
  __device__ static void decode(const uint8_t* row, const Raw& r, int64_t c, half2 (&a)[16]) {
    uint32_t w[8];
    words_a2(row + c * 34 + 2, r.q, w);
    const half2 d = h2_of_u16(r.d);
    const half2 bias = __float2half2_rn(1152.0f);  // 1024 + 128
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint32_t x = w[k] ^ 0x80808080u;  // q + 128 as unsigned bytes
      a[2 * k] = __hmul2(__hsub2(as_half2(__byte_perm(x, 0x64646464u, 0x4140)), bias), d);
      a[2 * k + 1] = __hmul2(__hsub2(as_half2(__byte_perm(x, 0x64646464u, 0x4342)), bias), d);
    }
  }
  HS_CHUNK_FROM_LOAD_DECODE
  __host__ __device__ static constexpr int perm(int j) { return j; }
};

// Q4_0 (18 B): d f16, qs[16]; element j<16 = low nibble of qs[j], j>=16 = high nibble of qs[j-16];
// y = d*(q-8).
struct TypeQ4_0 {
  static constexpr int kBlock = 32;
  static constexpr int kBlockBytes = 18;
  static constexpr int kStepChunks = 8;
  static constexpr bool kA2 = true;
  static constexpr bool kSwizzle = true;
  struct Raw {
    uint16_t d;
    A2Words<4> q;
  };
  __device__ static float value(const uint8_t* row, int64_t i) {
    const uint8_t* b = row + (i / 32) * 18;
    const int j = static_cast<int>(i % 32);
    const int q = j < 16 ? (b[2 + j] & 15) : (b[2 + j - 16] >> 4);
    return __fmul_rn(ld_f16(b), static_cast<float>(q - 8));
  }
  __device__ static void load(const uint8_t* row, int64_t c, Raw& r) {
    const uint8_t* b = row + c * 18;
    r.d = ld_u16(b);
    load_a2(b + 2, r.q);
  }
  __device__ static void decode(const uint8_t* row, const Raw& r, int64_t c, half2 (&a)[16]) {
    uint32_t w[4];
    words_a2(row + c * 18 + 2, r.q, w);
    const half2 d = h2_of_u16(r.d);
    const half2 bias = __float2half2_rn(1032.0f);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      a[4 * k + 0] = __hmul2(__hsub2(magic_h2(w[k] & 0x000F000Fu), bias), d);
      a[4 * k + 1] = __hmul2(__hsub2(magic_h2((w[k] >> 8) & 0x000F000Fu), bias), d);
      a[4 * k + 2] = __hmul2(__hsub2(magic_h2((w[k] >> 4) & 0x000F000Fu), bias), d);
      a[4 * k + 3] = __hmul2(__hsub2(magic_h2((w[k] >> 12) & 0x000F000Fu), bias), d);
    }
  }
  HS_CHUNK_FROM_LOAD_DECODE
  // word k of the chunk: positions 8k..8k+7 hold elements 4k + {0,2,1,3} then 16 + 4k + {0,2,1,3}.
  __host__ __device__ static constexpr int perm(int j) {
    return 4 * ((j & 31) >> 3) + nibble_pair_offset(j & 3) + ((j & 4) ? 16 : 0);
  }
};

// Scale and min of sub-block s (0..7) of the 12 packed bytes of Q4_K/Q5_K (words s0..s2).
__device__ __forceinline__ void k_scale_min(const uint32_t (&s)[3], int sub, int& sc, int& mn) {
  auto byte = [&](int i) { return static_cast<int>((s[i >> 2] >> (8 * (i & 3))) & 0xff); };
  if (sub < 4) {
    sc = byte(sub) & 63;
    mn = byte(sub + 4) & 63;
  } else {
    sc = (byte(sub + 4) & 0xF) | ((byte(sub - 4) >> 6) << 4);
    mn = (byte(sub + 4) >> 4) | ((byte(sub) >> 6) << 4);
  }
}

// Chunk layout shared by Q4_K and Q5_K: chunk cb (0..7) of a block covers qs bytes
// [32*(cb/2) + 16*(cb%2), +16): their low nibbles are elements 64*(cb/2) + 16*(cb%2) + l (sub-block
// 2*(cb/2)), their high nibbles the same + 32 (sub-block 2*(cb/2)+1).
__host__ __device__ constexpr int k4_perm(int j) {
  const int cb = j >> 5, jj = j & 31;
  return 64 * (cb >> 1) + 16 * (cb & 1) + 4 * (jj >> 3) + nibble_pair_offset(jj & 3) + ((jj & 4) ? 32 : 0);
}

// Scales of the two sub-blocks of chunk group jg from the 16-byte header (d, dmin, scales[12]):
// y = q*d1 + m1 (low nibbles), q*d2 + m2 (high nibbles). Branch-free: the 6-bit scales and mins of
// sub-blocks 0-3 and 4-7 are assembled as 4 bytes per word, then two bytes picked.
__device__ __forceinline__ void k4_scales(const uint4& hdr, int jg, half2& d1, half2& m1, half2& d2, half2& m2) {
  const uint32_t s0 = hdr.y, s1 = hdr.z, s2 = hdr.w;
  const bool hi = jg >= 2;
  const uint32_t sc = hi ? (s2 & 0x0f0f0f0fu) | ((s0 >> 2) & 0x30303030u) : s0 & 0x3f3f3f3fu;
  const uint32_t mn = hi ? ((s2 >> 4) & 0x0f0f0f0fu) | ((s1 >> 2) & 0x30303030u) : s1 & 0x3f3f3f3fu;
  const int sh = (jg & 1) * 16;
  const float2 dm = __half22float2(as_half2(hdr.x));
  d1 = __float2half2_rn(dm.x * static_cast<float>((sc >> sh) & 0xffu));
  d2 = __float2half2_rn(dm.x * static_cast<float>((sc >> (sh + 8)) & 0xffu));
  m1 = __float2half2_rn(-dm.y * static_cast<float>((mn >> sh) & 0xffu));
  m2 = __float2half2_rn(-dm.y * static_cast<float>((mn >> (sh + 8)) & 0xffu));
}

// Q4_K (144 B): d, dmin f16, scales[12], qs[128]; y = d*sc*q - dmin*m per 32-element sub-block.
struct TypeQ4_K {
  static constexpr int kBlock = 256;
  static constexpr int kBlockBytes = 144;
  static constexpr int kStepChunks = 8;
  static constexpr bool kA2 = false;
  static constexpr bool kSwizzle = true;
  struct Raw {
    uint4 hdr, qs;
  };
  __device__ static float value(const uint8_t* row, int64_t i) {
    const uint8_t* b = row + (i / 256) * 144;
    const int e = static_cast<int>(i % 256), sub = e / 32, l = e % 32;
    uint32_t s[3];
    __builtin_memcpy(s, b + 4, 12);
    int sc, mn;
    k_scale_min(s, sub, sc, mn);
    const int q = (b[16 + 32 * (sub / 2) + l] >> (4 * (sub % 2))) & 15;
    const float dk = __fmul_rn(ld_f16(b), static_cast<float>(sc));
    const float mk = __fmul_rn(ld_f16(b + 2), static_cast<float>(mn));
    return __fsub_rn(__fmul_rn(dk, static_cast<float>(q)), mk);
  }
  __device__ static void load(const uint8_t* row, int64_t c, Raw& r) {
    const uint8_t* b = row + (c >> 3) * 144;
    const int cb = static_cast<int>(c & 7);
    r.hdr = *reinterpret_cast<const uint4*>(b);
    r.qs = *reinterpret_cast<const uint4*>(b + 16 + 32 * (cb >> 1) + 16 * (cb & 1));
  }
  __device__ static void decode(const uint8_t*, const Raw& r, int64_t c, half2 (&a)[16]) {
    half2 d1, m1, d2, m2;
    k4_scales(r.hdr, static_cast<int>(c & 7) >> 1, d1, m1, d2, m2);
    const uint32_t w[4] = {r.qs.x, r.qs.y, r.qs.z, r.qs.w};
    const half2 bias = __float2half2_rn(1024.0f);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      a[4 * k + 0] = __hfma2(__hsub2(magic_h2(w[k] & 0x000F000Fu), bias), d1, m1);
      a[4 * k + 1] = __hfma2(__hsub2(magic_h2((w[k] >> 8) & 0x000F000Fu), bias), d1, m1);
      a[4 * k + 2] = __hfma2(__hsub2(magic_h2((w[k] >> 4) & 0x000F000Fu), bias), d2, m2);
      a[4 * k + 3] = __hfma2(__hsub2(magic_h2((w[k] >> 12) & 0x000F000Fu), bias), d2, m2);
    }
  }
  HS_CHUNK_FROM_LOAD_DECODE
  __host__ __device__ static constexpr int perm(int j) { return k4_perm(j); }
};

// Q5_K (176 B): d, dmin, scales[12], qh[32], qs[128]; as Q4_K with bit `sub` of qh[l] as fifth bit.
struct TypeQ5_K {
  static constexpr int kBlock = 256;
  static constexpr int kBlockBytes = 176;
  static constexpr int kStepChunks = 8;
  static constexpr bool kA2 = false;
  static constexpr bool kSwizzle = true;
  struct Raw {
    uint4 hdr, qs, qh;
  };
  __device__ static float value(const uint8_t* row, int64_t i) {
    const uint8_t* b = row + (i / 256) * 176;
    const int e = static_cast<int>(i % 256), sub = e / 32, l = e % 32;
    uint32_t s[3];
    __builtin_memcpy(s, b + 4, 12);
    int sc, mn;
    k_scale_min(s, sub, sc, mn);
    const int q = ((b[48 + 32 * (sub / 2) + l] >> (4 * (sub % 2))) & 15) | (((b[16 + l] >> sub) & 1) << 4);
    const float dk = __fmul_rn(ld_f16(b), static_cast<float>(sc));
    const float mk = __fmul_rn(ld_f16(b + 2), static_cast<float>(mn));
    return __fsub_rn(__fmul_rn(dk, static_cast<float>(q)), mk);
  }
  __device__ static void load(const uint8_t* row, int64_t c, Raw& r) {
    const uint8_t* b = row + (c >> 3) * 176;
    const int cb = static_cast<int>(c & 7);
    r.hdr = *reinterpret_cast<const uint4*>(b);
    r.qs = *reinterpret_cast<const uint4*>(b + 48 + 32 * (cb >> 1) + 16 * (cb & 1));
    r.qh = *reinterpret_cast<const uint4*>(b + 16 + 16 * (cb & 1));
  }
  __device__ static void decode(const uint8_t*, const Raw& r, int64_t c, half2 (&a)[16]) {
    const int jg = static_cast<int>(c & 7) >> 1;
    half2 d1, m1, d2, m2;
    k4_scales(r.hdr, jg, d1, m1, d2, m2);
    const uint32_t w[4] = {r.qs.x, r.qs.y, r.qs.z, r.qs.w}, u[4] = {r.qh.x, r.qh.y, r.qh.z, r.qh.w};
    const half2 bias = __float2half2_rn(1024.0f);
    const int s1 = 2 * jg, s2 = 2 * jg + 1;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t h02 = ((u[k] >> s1) & 0x00010001u) << 4, h13 = ((u[k] >> (s1 + 8)) & 0x00010001u) << 4;
      const uint32_t g02 = ((u[k] >> s2) & 0x00010001u) << 4, g13 = ((u[k] >> (s2 + 8)) & 0x00010001u) << 4;
      a[4 * k + 0] = __hfma2(__hsub2(magic_h2((w[k] & 0x000F000Fu) | h02), bias), d1, m1);
      a[4 * k + 1] = __hfma2(__hsub2(magic_h2(((w[k] >> 8) & 0x000F000Fu) | h13), bias), d1, m1);
      a[4 * k + 2] = __hfma2(__hsub2(magic_h2(((w[k] >> 4) & 0x000F000Fu) | g02), bias), d2, m2);
      a[4 * k + 3] = __hfma2(__hsub2(magic_h2(((w[k] >> 12) & 0x000F000Fu) | g13), bias), d2, m2);
    }
  }
  HS_CHUNK_FROM_LOAD_DECODE
  __host__ __device__ static constexpr int perm(int j) { return k4_perm(j); }
};

// Q6_K (210 B): ql[128], qh[64], scales[16] int8, d f16; y = d*sc*(q-32).
// Chunk cb (0..7): half nh = cb/4, ql source src = (cb/2)%2, l in 16*(cb%2) + [0,16): the low nibbles
// of ql[64nh + 32src + l] are elements 128nh + 32src + l, the high nibbles the same + 64.
struct TypeQ6_K {
  static constexpr int kBlock = 256;
  static constexpr int kBlockBytes = 210;
  static constexpr int kStepChunks = 8;
  static constexpr bool kA2 = true;
  static constexpr bool kSwizzle = true;
  struct Raw {
    A2Words<4> ql, qh;
    uint16_t d;
    int8_t sc_lo, sc_hi;
  };
  __device__ static float value(const uint8_t* row, int64_t i) {
    const uint8_t* b = row + (i / 256) * 210;
    const int e = static_cast<int>(i % 256), j = e / 128, r = e % 128;
    const int lo = (b[64 * j + r % 64] >> (4 * (r / 64))) & 15;
    const int hi = (b[128 + 32 * j + r % 32] >> (2 * (r / 32))) & 3;
    const float ds = __fmul_rn(ld_f16(b + 208), static_cast<float>(reinterpret_cast<const int8_t*>(b + 192)[e / 16]));
    return __fmul_rn(ds, static_cast<float>((lo | (hi << 4)) - 32));
  }
  __device__ static const uint8_t* ql_at(const uint8_t* b, int cb) { return b + 64 * (cb >> 2) + 32 * ((cb >> 1) & 1) + 16 * (cb & 1); }
  __device__ static const uint8_t* qh_at(const uint8_t* b, int cb) { return b + 128 + 32 * (cb >> 2) + 16 * (cb & 1); }
  __device__ static void load(const uint8_t* row, int64_t c, Raw& r) {
    const uint8_t* b = row + (c >> 3) * 210;
    const int cb = static_cast<int>(c & 7), nh = cb >> 2, src = (cb >> 1) & 1, hh = cb & 1;
    load_a2(ql_at(b, cb), r.ql);
    load_a2(qh_at(b, cb), r.qh);
    const auto* scales = reinterpret_cast<const int8_t*>(b + 192);
    r.sc_lo = scales[8 * nh + hh + 2 * src];
    r.sc_hi = scales[8 * nh + hh + 2 * src + 4];
    r.d = ld_u16(b + 208);
  }
  __device__ static void decode(const uint8_t* row, const Raw& r, int64_t c, half2 (&a)[16]) {
    const uint8_t* b = row + (c >> 3) * 210;
    const int cb = static_cast<int>(c & 7), src = (cb >> 1) & 1;
    uint32_t w[4], u[4];
    words_a2(ql_at(b, cb), r.ql, w);
    words_a2(qh_at(b, cb), r.qh, u);
    const float d = __half2float(__ushort_as_half(r.d));
    const half2 d_lo = __float2half2_rn(d * r.sc_lo), d_hi = __float2half2_rn(d * r.sc_hi);
    const int s_lo = 2 * src, s_hi = 2 * src + 4;
    const half2 bias = __float2half2_rn(1056.0f);  // 1024 + 32
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t h02 = ((u[k] >> s_lo) & 0x00030003u) << 4, h13 = ((u[k] >> (s_lo + 8)) & 0x00030003u) << 4;
      const uint32_t g02 = ((u[k] >> s_hi) & 0x00030003u) << 4, g13 = ((u[k] >> (s_hi + 8)) & 0x00030003u) << 4;
      a[4 * k + 0] = __hmul2(__hsub2(magic_h2((w[k] & 0x000F000Fu) | h02), bias), d_lo);
      a[4 * k + 1] = __hmul2(__hsub2(magic_h2(((w[k] >> 8) & 0x000F000Fu) | h13), bias), d_lo);
      a[4 * k + 2] = __hmul2(__hsub2(magic_h2(((w[k] >> 4) & 0x000F000Fu) | g02), bias), d_hi);
      a[4 * k + 3] = __hmul2(__hsub2(magic_h2(((w[k] >> 12) & 0x000F000Fu) | g13), bias), d_hi);
    }
  }
  HS_CHUNK_FROM_LOAD_DECODE
  __host__ __device__ static constexpr int perm(int j) {
    const int cb = j >> 5, jj = j & 31;
    const int l = 16 * (cb & 1) + 4 * (jj >> 3) + nibble_pair_offset(jj & 3);
    return 128 * (cb >> 2) + 32 * ((cb >> 1) & 1) + l + ((jj & 4) ? 64 : 0);
  }
};

// ---- Types decoded element by element ----------------------------------------------------------
// Q4_1, Q5_0, Q5_1, IQ4_NL (32-element blocks), Q2_K, Q3_K, IQ4_XS and the IQ1/IQ2/IQ3 lattice types
// (256): each struct below gives its block's element e (element(b, e)) and, where it saves work, the
// 32 elements of chunk cb at once (chunk32), in f32, evaluated exactly as src/format/quants.cpp (same
// products in the same order, never fused). Scalar code: slower to decode than the bit tricks above,
// but the weights stay as stored (1.6-6 bits instead of the 8.5 of a Q8_0 copy, and their own values).
// __host__ __device__, so a host test checks them against format/quants (quant_blocks_host_test.cu,
// no GPU needed).

__host__ __device__ inline float f16_at(const uint8_t* p) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(p[0] | (p[1] << 8))));
}
__host__ __device__ inline uint32_t u32_at(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}
// Unfused f32 arithmetic (nvcc would contract a * b + c into an FMA; quants.cpp rounds twice).
__host__ __device__ inline float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
__host__ __device__ inline float add_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
// The IQ4_NL / IQ4_XS codebook (format/iq_tables.h kIq4nlValues), packed so that host and device
// code index it without a memory table.
__host__ __device__ inline float iq4nl_value(int i) {
  constexpr uint64_t lo = 0xF6EADDCFBFAD9881ull, hi = 0x7159453526190D01ull;  // -127..-10, 1..113
  return static_cast<float>(static_cast<int8_t>((i < 8 ? lo : hi) >> (8 * (i & 7))));
}

// S has chunk32(block, cb, v) where decoding a chunk at once saves work (its scales); else element() x 32.
template <class S, class = void>
constexpr bool kHasChunk32 = false;
template <class S>
constexpr bool kHasChunk32<S, std::void_t<decltype(&S::chunk32)>> = true;

// A type from S (kBlock, kBlockBytes, element(block, e), optionally chunk32): chunks in natural order.
template <class S>
struct ScalarDecoded : S {
  static constexpr int kStepChunks = 8;  // one K-quant block, or 8 small blocks (144-220 bytes of a row)
  static constexpr bool kA2 = false;     // byte loads: no aligned-word over-read
  static constexpr bool kSwizzle = false;
  __host__ __device__ static float value(const uint8_t* row, int64_t i) {
    return S::element(row + (i / S::kBlock) * S::kBlockBytes, static_cast<int>(i % S::kBlock));
  }
  __host__ __device__ static void chunk(const uint8_t* row, int64_t c, half2 (&a)[16]) {
    constexpr int kChunks = S::kBlock / 32;
    float v[32];
    const uint8_t* block = row + (c / kChunks) * S::kBlockBytes;
    if constexpr (kHasChunk32<S>) {
      S::chunk32(block, static_cast<int>(c % kChunks), v);
    } else {
#pragma unroll
      for (int e = 0; e < 32; ++e) v[e] = S::element(block, static_cast<int>(c % kChunks) * 32 + e);
    }
#pragma unroll
    for (int m = 0; m < 16; ++m) a[m] = __floats2half2_rn(v[2 * m], v[2 * m + 1]);
  }
  __host__ __device__ static constexpr int perm(int j) { return j; }
};

// Q4_1 (20 B): d, m f16, qs[16] (element j < 16 the low nibble of qs[j], else the high one of qs[j-16]);
// y = d*q + m.
struct Q4_1Block {
  static constexpr int kBlock = 32, kBlockBytes = 20;
  __host__ __device__ static float element(const uint8_t* b, int e) {
    const int q = e < 16 ? (b[4 + e] & 15) : (b[4 + e - 16] >> 4);
    return add_rn(mul_rn(f16_at(b), static_cast<float>(q)), f16_at(b + 2));
  }
};
// Q5_0 (22 B): d, qh u32 (bit e = fifth bit of element e), qs[16]; y = d*(q-16).
struct Q5_0Block {
  static constexpr int kBlock = 32, kBlockBytes = 22;
  __host__ __device__ static float element(const uint8_t* b, int e) {
    const int q = (e < 16 ? (b[6 + e] & 15) : (b[6 + e - 16] >> 4)) | static_cast<int>(((u32_at(b + 2) >> e) & 1) << 4);
    return mul_rn(f16_at(b), static_cast<float>(q - 16));
  }
};
// Q5_1 (24 B): d, m, qh u32, qs[16]; y = d*q + m, q in [0, 31].
struct Q5_1Block {
  static constexpr int kBlock = 32, kBlockBytes = 24;
  __host__ __device__ static float element(const uint8_t* b, int e) {
    const int q = (e < 16 ? (b[8 + e] & 15) : (b[8 + e - 16] >> 4)) | static_cast<int>(((u32_at(b + 4) >> e) & 1) << 4);
    return add_rn(mul_rn(f16_at(b), static_cast<float>(q)), f16_at(b + 2));
  }
};
// IQ4_NL (18 B): d, qs[16] of 4-bit codebook indices (layout as Q4_0); y = d*value.
struct Iq4NlBlock {
  static constexpr int kBlock = 32, kBlockBytes = 18;
  __host__ __device__ static float element(const uint8_t* b, int e) {
    return mul_rn(f16_at(b), iq4nl_value(e < 16 ? (b[2 + e] & 15) : (b[2 + e - 16] >> 4)));
  }
};
// Q2_K (84 B): scales[16] (low nibble scale, high min, per 16 elements), qs[64] 2-bit, d, dmin; element
// e = 128j + 32s + l is bits 2s, 2s+1 of qs[32j + l]; y = (d*sc)*q - dmin*mn.
struct Q2_KBlock {
  static constexpr int kBlock = 256, kBlockBytes = 84;
  __host__ __device__ static float element(const uint8_t* b, int e) {
    const int g = e / 16, j = e / 128, s = e % 128 / 32, l = e % 32;
    const float dl = mul_rn(f16_at(b + 80), static_cast<float>(b[g] & 15));
    const float ml = mul_rn(f16_at(b + 82), static_cast<float>(b[g] >> 4));
    return mul_rn(dl, static_cast<float>((b[16 + 32 * j + l] >> (2 * s)) & 3)) - ml;
  }
  __host__ __device__ static void chunk32(const uint8_t* b, int cb, float (&v)[32]) {
    const float d = f16_at(b + 80), dmin = f16_at(b + 82);
    const int j = cb / 4, s = cb % 4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int g = 2 * cb + h;
      const float dl = mul_rn(d, static_cast<float>(b[g] & 15)), ml = mul_rn(dmin, static_cast<float>(b[g] >> 4));
#pragma unroll
      for (int l = 16 * h; l < 16 * h + 16; ++l)
        v[l] = mul_rn(dl, static_cast<float>((b[16 + 32 * j + l] >> (2 * s)) & 3)) - ml;
    }
  }
};
// Q3_K (110 B): hmask[32], qs[64] 2-bit, scales[12] (16 six-bit scales, offset 32), d; the third bit
// is stored inverted (a clear hmask bit subtracts 4); y = (d*(sc-32)) * q.
struct Q3_KBlock {
  static constexpr int kBlock = 256, kBlockBytes = 110;
  __host__ __device__ static float scale(const uint8_t* b, int k) {  // d * (sc_k - 32)
    const uint8_t* sc = b + 96;
    const int lo = k < 8 ? (sc[k] & 15) : (sc[k - 8] >> 4);
    const int hi = (sc[8 + k % 4] >> (2 * (k / 4))) & 3;
    return mul_rn(f16_at(b + 108), static_cast<float>(static_cast<int8_t>(lo | (hi << 4)) - 32));
  }
  __host__ __device__ static int code(const uint8_t* b, int e) {
    const int j = e / 128, s = e % 128 / 32, l = e % 32;
    const int ql = (b[32 + 32 * j + l] >> (2 * s)) & 3, h = (b[l] >> (4 * j + s)) & 1;
    return ql - ((h ^ 1) << 2);
  }
  __host__ __device__ static float element(const uint8_t* b, int e) {
    return mul_rn(scale(b, e / 16), static_cast<float>(code(b, e)));
  }
  __host__ __device__ static void chunk32(const uint8_t* b, int cb, float (&v)[32]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float dl = scale(b, 2 * cb + h);
#pragma unroll
      for (int l = 16 * h; l < 16 * h + 16; ++l) v[l] = mul_rn(dl, static_cast<float>(code(b, 32 * cb + l)));
    }
  }
};
// IQ4_XS (136 B): d, scales_h u16 (2 high bits per 32), scales_l[4] (a nibble per 32), qs[128]; the 32
// elements of sub-block ib as IQ4_NL's, scale d*(sc-32).
struct Iq4XsBlock {
  static constexpr int kBlock = 256, kBlockBytes = 136;
  __host__ __device__ static float scale(const uint8_t* b, int ib) {
    const int ls = (b[4 + ib / 2] >> (4 * (ib % 2))) & 15, hs = ((b[2] | (b[3] << 8)) >> (2 * ib)) & 3;
    return mul_rn(f16_at(b), static_cast<float>(static_cast<int8_t>(ls | (hs << 4)) - 32));
  }
  __host__ __device__ static float element(const uint8_t* b, int e) {
    const int ib = e / 32, l = e % 32;
    const int q = l < 16 ? (b[8 + 16 * ib + l] & 15) : (b[8 + 16 * ib + l - 16] >> 4);
    return mul_rn(scale(b, ib), iq4nl_value(q));
  }
  __host__ __device__ static void chunk32(const uint8_t* b, int cb, float (&v)[32]) {
    const float dl = scale(b, cb);
#pragma unroll
    for (int l = 0; l < 16; ++l) {
      v[l] = mul_rn(dl, iq4nl_value(b[8 + 16 * cb + l] & 15));
      v[l + 16] = mul_rn(dl, iq4nl_value(b[8 + 16 * cb + l] >> 4));
    }
  }
};

// ---- i-quants: lattice codebooks (format/iq_tables.h), read from device copies on the GPU ----------
// The device copies are filled by upload_iq_grids() (matmul.cu, at the first load of such a weight on a
// device); host code (the host test) reads format/iq_tables' arrays.
__device__ uint8_t d_iq2xxs_grid[256][8];
__device__ uint8_t d_iq2xs_grid[512][8];
__device__ uint8_t d_iq2s_grid[1024][8];
__device__ uint8_t d_iq3xxs_grid[256][4];
__device__ uint8_t d_iq3s_grid[512][4];
__device__ int8_t d_iq1s_grid[2048][8];
__device__ uint8_t d_even_parity_signs[128];
#ifdef __CUDA_ARCH__
#define HS_IQ(dev, host) (dev)
#else
#define HS_IQ(dev, host) (host)
#endif
__host__ __device__ inline float iq2xxs_at(int r, int j) { return HS_IQ(d_iq2xxs_grid[r][j], iq::kIq2xxsGrid[r][j]); }
__host__ __device__ inline float iq2xs_at(int r, int j) { return HS_IQ(d_iq2xs_grid[r][j], iq::kIq2xsGrid[r][j]); }
__host__ __device__ inline float iq2s_at(int r, int j) { return HS_IQ(d_iq2s_grid[r][j], iq::kIq2sGrid[r][j]); }
__host__ __device__ inline float iq3xxs_at(int r, int j) { return HS_IQ(d_iq3xxs_grid[r][j], iq::kIq3xxsGrid[r][j]); }
__host__ __device__ inline float iq3s_at(int r, int j) { return HS_IQ(d_iq3s_grid[r][j], iq::kIq3sGrid[r][j]); }
__host__ __device__ inline float iq1s_at(int r, int j) { return HS_IQ(d_iq1s_grid[r][j], iq::kIq1sGrid[r][j]); }
__host__ __device__ inline int even_signs(int i) { return HS_IQ(d_even_parity_signs[i], iq::kEvenParitySigns[i]); }
#undef HS_IQ
__host__ __device__ inline float sign_of_bit(int signs, int bit) { return (signs >> bit) & 1 ? -1.0f : 1.0f; }
__host__ __device__ inline uint16_t u16_at(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
// d * (0.5 + s) * k, the sub-block scale of the IQ2/IQ3 types, as quants.cpp rounds it.
__host__ __device__ inline float half_step_scale(float d, int s, float k) {
  return mul_rn(mul_rn(d, add_rn(0.5f, static_cast<float>(s))), k);
}

// IQ2_XXS (66 B): d, then per 32 elements two u32: 4 grid indices (bytes), and 4x7 sign bits + a 4-bit scale.
struct Iq2XxsBlock {
  static constexpr int kBlock = 256, kBlockBytes = 66;
  __host__ __device__ static float element(const uint8_t* b, int e) {
    const int ib = e / 32, k = e % 32 / 8, j = e % 8;
    const uint32_t idx = u32_at(b + 2 + 8 * ib), aux = u32_at(b + 6 + 8 * ib);
    const float db = half_step_scale(f16_at(b), static_cast<int>(aux >> 28), 0.25f);
    const float g = iq2xxs_at((idx >> (8 * k)) & 255, j);
    return mul_rn(mul_rn(db, g), sign_of_bit(even_signs((aux >> (7 * k)) & 127), j));
  }
  __host__ __device__ static void chunk32(const uint8_t* b, int cb, float (&v)[32]) {
    const uint32_t idx = u32_at(b + 2 + 8 * cb), aux = u32_at(b + 6 + 8 * cb);
    const float db = half_step_scale(f16_at(b), static_cast<int>(aux >> 28), 0.25f);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int row = (idx >> (8 * k)) & 255, signs = even_signs((aux >> (7 * k)) & 127);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[8 * k + j] = mul_rn(mul_rn(db, iq2xxs_at(row, j)), sign_of_bit(signs, j));
    }
  }
};
// IQ2_XS (74 B): d, qs[32] u16 (9-bit grid index, 7 sign bits), scales[8] (a nibble per 16 elements).
struct Iq2XsBlock {
  static constexpr int kBlock = 256, kBlockBytes = 74;
  __host__ __device__ static float element(const uint8_t* b, int e) {
    const int i = e / 8, j = e % 8;  // element j of 8-group i
    const uint16_t q = u16_at(b + 2 + 2 * i);
    const float db = half_step_scale(f16_at(b), (b[66 + i / 4] >> (4 * ((i / 2) % 2))) & 15, 0.25f);
    return mul_rn(mul_rn(db, iq2xs_at(q & 511, j)), sign_of_bit(even_signs(q >> 9), j));
  }
};
// IQ2_S (82 B): d, qs[32] (low 8 index bits), signs[32], qh[8] (2 high index bits each), scales[8].
struct Iq2SBlock {
  static constexpr int kBlock = 256, kBlockBytes = 82;
  __host__ __device__ static float element(const uint8_t* b, int e) {
    const int i = e / 8, j = e % 8;
    const int idx = b[2 + i] | (((b[66 + i / 4] >> (2 * (i % 4))) & 3) << 8);
    const float db = half_step_scale(f16_at(b), (b[74 + i / 4] >> (4 * ((i / 2) % 2))) & 15, 0.25f);
    return mul_rn(mul_rn(db, iq2s_at(idx, j)), sign_of_bit(b[34 + i], j));
  }
};
// IQ3_XXS (98 B): d, qs[64] grid indices (4 elements each), then per 32 elements a u32 of 4x7 sign bits
// and a 4-bit scale.
struct Iq3XxsBlock {
  static constexpr int kBlock = 256, kBlockBytes = 98;
  __host__ __device__ static float element(const uint8_t* b, int e) {
    const int ib = e / 32, k = e % 32 / 8, j = e % 8;
    const uint32_t aux = u32_at(b + 66 + 4 * ib);
    const float db = half_step_scale(f16_at(b), static_cast<int>(aux >> 28), 0.5f);
    const float g = iq3xxs_at(b[2 + 8 * ib + 2 * k + j / 4], j % 4);
    return mul_rn(mul_rn(db, g), sign_of_bit(even_signs((aux >> (7 * k)) & 127), j));
  }
};
// IQ3_S (110 B): d, qs[64] (low index bits), qh[8] (ninth bits), signs[32], scales[4] (a nibble per 32).
struct Iq3SBlock {
  static constexpr int kBlock = 256, kBlockBytes = 110;
  __host__ __device__ static float element(const uint8_t* b, int e) {
    const int ib = e / 32, i = e / 4;
    const float db = mul_rn(f16_at(b), static_cast<float>(1 + 2 * ((b[106 + ib / 2] >> (4 * (ib % 2))) & 15)));
    const int idx = b[2 + i] | (((b[66 + i / 8] >> (i % 8)) & 1) << 8);
    return mul_rn(mul_rn(db, iq3s_at(idx, e % 4)), sign_of_bit(b[74 + e / 8], e % 8));
  }
};
// IQ1_S (50 B): d, qs[32] (low index bits), qh[8] u16 (4x3 high index bits, a 3-bit scale, the delta's sign).
struct Iq1SBlock {
  static constexpr int kBlock = 256, kBlockBytes = 50;
  __host__ __device__ static float element(const uint8_t* b, int e) {
    const int ib = e / 32, l = e % 32 / 8, j = e % 8;
    const uint16_t qh = u16_at(b + 34 + 2 * ib);
    const float dl = mul_rn(f16_at(b), static_cast<float>(2 * ((qh >> 12) & 7) + 1));
    const float delta = qh & 0x8000 ? -0.125f : 0.125f;
    return mul_rn(dl, add_rn(iq1s_at(b[2 + 4 * ib + l] | (((qh >> (3 * l)) & 7) << 8), j), delta));
  }
};
// IQ1_M (56 B): qs[32], qh[16] (per index a nibble: 3 high bits and the delta's sign), scales[8] = 4 u16 of
// 3-bit scales (one per 16 elements) whose top nibbles form the f16 super-scale.
struct Iq1MBlock {
  static constexpr int kBlock = 256, kBlockBytes = 56;
  __host__ __device__ static float element(const uint8_t* b, int e) {
    const uint16_t s0 = u16_at(b + 48), s1 = u16_at(b + 50), s2 = u16_at(b + 52), s3 = u16_at(b + 54);
    const uint16_t dbits =
        static_cast<uint16_t>((s0 >> 12) | ((s1 >> 8) & 0x00F0) | ((s2 >> 4) & 0x0F00) | (s3 & 0xF000));
    const int p = e / 8, t = p / 2, j = e % 8;
    const uint16_t st = u16_at(b + 48 + 2 * (t / 4));
    const float d = __half2float(__ushort_as_half(dbits));
    const float dl = mul_rn(d, static_cast<float>(2 * ((st >> (3 * (t % 4))) & 7) + 1));
    const int nib = (b[32 + p / 2] >> (4 * (p % 2))) & 15;
    const float delta = nib & 8 ? -0.125f : 0.125f;
    return mul_rn(dl, add_rn(iq1s_at(b[p] | ((nib & 7) << 8), j), delta));
  }
};

using TypeQ4_1 = ScalarDecoded<Q4_1Block>;
using TypeQ5_0 = ScalarDecoded<Q5_0Block>;
using TypeQ5_1 = ScalarDecoded<Q5_1Block>;
using TypeIQ4_NL = ScalarDecoded<Iq4NlBlock>;
using TypeQ2_K = ScalarDecoded<Q2_KBlock>;
using TypeQ3_K = ScalarDecoded<Q3_KBlock>;
using TypeIQ4_XS = ScalarDecoded<Iq4XsBlock>;
using TypeIQ2_XXS = ScalarDecoded<Iq2XxsBlock>;
using TypeIQ2_XS = ScalarDecoded<Iq2XsBlock>;
using TypeIQ2_S = ScalarDecoded<Iq2SBlock>;
using TypeIQ3_XXS = ScalarDecoded<Iq3XxsBlock>;
using TypeIQ3_S = ScalarDecoded<Iq3SBlock>;
using TypeIQ1_S = ScalarDecoded<Iq1SBlock>;
using TypeIQ1_M = ScalarDecoded<Iq1MBlock>;

#undef HS_CHUNK_FROM_LOAD_DECODE

}  // namespace hyspec::cuda
