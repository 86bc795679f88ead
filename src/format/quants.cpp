// Reference block decoders. Each one evaluates in float32 and in the same order as gguf-py's numpy
// code (scale products first, then the element product, then the offset), so the results are
// bit-identical with it; numpy never fuses a multiply-add, so neither may we.
#include "format/quants.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "format/iq_tables.h"
#include "util/half.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

namespace hyspec {
namespace {

constexpr int kQK = 256;  // super-block size of the K and i-quant types

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
float load_f16(const uint8_t* p) { return fp16_to_fp32(load_u16(p)); }

// ---- 32-element blocks ----------------------------------------------------------------------

// Q4_0: d:f16, qs[16]; element j<16 is the low nibble of qs[j], j>=16 the high nibble of qs[j-16].
void dequant_q4_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>((qs[j] & 0x0F) - 8);
    y[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
  }
}

// Q4_1: d:f16, m:f16, qs[16]; y = d*q + m.
void dequant_q4_1(const uint8_t* b, float* y) {
  const float d = load_f16(b), m = load_f16(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(qs[j] & 0x0F) + m;
    y[j + 16] = d * static_cast<float>(qs[j] >> 4) + m;
  }
}

// Q5_0: d:f16, qh:u32 (bit j = fifth bit of element j), qs[16]; q in [-16, 15].
void dequant_q5_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const uint32_t qh = load_u32(b + 2);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4);
    y[j] = d * static_cast<float>(lo - 16);
    y[j + 16] = d * static_cast<float>(hi - 16);
  }
}

// Q5_1: d:f16, m:f16, qh:u32, qs[16]; y = d*q + m with q in [0, 31].
void dequant_q5_1(const uint8_t* b, float* y) {
  const float d = load_f16(b), m = load_f16(b + 2);
  const uint32_t qh = load_u32(b + 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4);
    y[j] = d * static_cast<float>(lo) + m;
    y[j + 16] = d * static_cast<float>(hi) + m;
  }
}

// Q8_0: d:f16, qs[32] int8.
void dequant_q8_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}

// IQ4_NL: d:f16, qs[16] of 4-bit indices into the non-linear codebook (layout as Q4_0).
void dequant_iq4_nl(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(iq::kIq4nlValues[qs[j] & 0x0F]);
    y[j + 16] = d * static_cast<float>(iq::kIq4nlValues[qs[j] >> 4]);
  }
}

// MXFP4: e:e8m0 shared exponent, qs[16] of FP4 (e2m1) codes (layout as Q4_0). The codebook is
// doubled, so the scale is 2^(e-128), i.e. half of the e8m0 value, built directly as float bits.
void dequant_mxfp4(const uint8_t* b, float* y) {
  const uint32_t e = b[0];
  const uint32_t bits = e < 2 ? (uint32_t{0x00200000} << e) : ((e - 1) << 23);
  const float d = std::bit_cast<float>(bits);
  const uint8_t* qs = b + 1;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(iq::kMxfp4Values[qs[j] & 0x0F]);
    y[j + 16] = d * static_cast<float>(iq::kMxfp4Values[qs[j] >> 4]);
  }
}

// ---- K-quants (256-element super-blocks) ----------------------------------------------------

// Q2_K: scales[16] (low nibble: scale, high: min, per 16 elements), qs[64] 2-bit, d, dmin.
// Element e = 128*j + 32*s + l is bits 2s..2s+1 of qs[32*j + l].
void dequant_q2_k(const uint8_t* b, float* y) {
  const uint8_t* sc = b;
  const uint8_t* qs = b + 16;
  const float d = load_f16(b + 80), dmin = load_f16(b + 82);
  for (int e = 0; e < kQK; ++e) {
    const int j = e / 128, s = (e % 128) / 32, l = e % 32, g = e / 16;
    const float dl = d * static_cast<float>(sc[g] & 0x0F);
    const float ml = dmin * static_cast<float>(sc[g] >> 4);
    const int q = (qs[32 * j + l] >> (2 * s)) & 3;
    y[e] = dl * static_cast<float>(q) - ml;
  }
}

// Q3_K: hmask[32], qs[64] 2-bit, scales[12] (16 six-bit scales, offset 32), d.
// The third bit is stored inverted: a clear hmask bit subtracts 4.
void dequant_q3_k(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* sc = b + 96;
  const float d = load_f16(b + 108);
  float dl[16];
  for (int k = 0; k < 16; ++k) {
    const int lo = k < 8 ? (sc[k] & 0x0F) : (sc[k - 8] >> 4);
    const int hi = (sc[8 + k % 4] >> (2 * (k / 4))) & 3;
    dl[k] = d * static_cast<float>(static_cast<int8_t>(lo | (hi << 4)) - 32);
  }
  for (int e = 0; e < kQK; ++e) {
    const int j = e / 128, s = (e % 128) / 32, l = e % 32;
    const int ql = (qs[32 * j + l] >> (2 * s)) & 3;
    const int h = (hmask[l] >> (4 * j + s)) & 1;
    y[e] = dl[e / 16] * static_cast<float>(ql - ((h ^ 1) << 2));
  }
}

// The 12-byte block of eight 6-bit scales and eight 6-bit mins shared by Q4_K and Q5_K.
void unpack_k_scales(const uint8_t* s, uint8_t sc[8], uint8_t mn[8]) {
  for (int i = 0; i < 4; ++i) {
    sc[i] = s[i] & 0x3F;
    mn[i] = s[4 + i] & 0x3F;
    sc[4 + i] = static_cast<uint8_t>((s[8 + i] & 0x0F) | ((s[i] >> 2) & 0x30));
    mn[4 + i] = static_cast<uint8_t>((s[8 + i] >> 4) | ((s[4 + i] >> 2) & 0x30));
  }
}

// Q4_K: d, dmin, scales[12], qs[128]; sub-block k (32 elements) is nibble k%2 of qs[32*(k/2) + l].
void dequant_q4_k(const uint8_t* b, float* y) {
  const float d = load_f16(b), dmin = load_f16(b + 2);
  uint8_t sc[8], mn[8];
  unpack_k_scales(b + 4, sc, mn);
  const uint8_t* qs = b + 16;
  for (int k = 0; k < 8; ++k) {
    const float dk = d * static_cast<float>(sc[k]);
    const float mk = dmin * static_cast<float>(mn[k]);
    for (int l = 0; l < 32; ++l) {
      const int q = (qs[32 * (k / 2) + l] >> (4 * (k % 2))) & 0x0F;
      y[32 * k + l] = dk * static_cast<float>(q) - mk;
    }
  }
}

// Q5_K: as Q4_K plus qh[32] whose bit k is the fifth bit of element l of sub-block k.
void dequant_q5_k(const uint8_t* b, float* y) {
  const float d = load_f16(b), dmin = load_f16(b + 2);
  uint8_t sc[8], mn[8];
  unpack_k_scales(b + 4, sc, mn);
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int k = 0; k < 8; ++k) {
    const float dk = d * static_cast<float>(sc[k]);
    const float mk = dmin * static_cast<float>(mn[k]);
    for (int l = 0; l < 32; ++l) {
      const int q = ((qs[32 * (k / 2) + l] >> (4 * (k % 2))) & 0x0F) | (((qh[l] >> k) & 1) << 4);
      y[32 * k + l] = dk * static_cast<float>(q) - mk;
    }
  }
}

// Q6_K: ql[128] low nibbles, qh[64] high 2 bits, scales[16] int8, d; q in [-32, 31].
void dequant_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = load_f16(b + 208);
  for (int e = 0; e < kQK; ++e) {
    const int j = e / 128, r = e % 128;
    const int lo = (ql[64 * j + r % 64] >> (4 * (r / 64))) & 0x0F;
    const int hi = (qh[32 * j + r % 32] >> (2 * (r / 32))) & 3;
    const float ds = d * static_cast<float>(sc[e / 16]);
    y[e] = ds * static_cast<float>((lo | (hi << 4)) - 32);
  }
}

// ---- i-quants -------------------------------------------------------------------------------

float sign_of(uint8_t signs, int bit) { return (signs >> bit) & 1 ? -1.0f : 1.0f; }

// IQ2_XXS: d, then per 32 elements two u32: 4 grid indices (bytes), and 4x7 sign bits + 4-bit scale.
void dequant_iq2_xxs(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  for (int ib = 0; ib < 8; ++ib) {
    const uint32_t idx = load_u32(b + 2 + 8 * ib);
    const uint32_t aux = load_u32(b + 6 + 8 * ib);
    const float db = d * (0.5f + static_cast<float>(aux >> 28)) * 0.25f;
    for (int k = 0; k < 4; ++k) {
      const auto& g = iq::kIq2xxsGrid[(idx >> (8 * k)) & 0xFF];
      const uint8_t signs = iq::kEvenParitySigns[(aux >> (7 * k)) & 0x7F];
      for (int j = 0; j < 8; ++j) y[32 * ib + 8 * k + j] = db * static_cast<float>(g[j]) * sign_of(signs, j);
    }
  }
}

// IQ2_XS: d, qs[32] u16 (9-bit grid index, 7 sign bits), scales[8] (a nibble per 16 elements).
void dequant_iq2_xs(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const uint8_t* scales = b + 66;
  for (int i = 0; i < 32; ++i) {
    const uint16_t q = load_u16(b + 2 + 2 * i);
    const int s = (scales[i / 4] >> (4 * ((i / 2) % 2))) & 0x0F;
    const float db = d * (0.5f + static_cast<float>(s)) * 0.25f;
    const auto& g = iq::kIq2xsGrid[q & 511];
    const uint8_t signs = iq::kEvenParitySigns[q >> 9];
    for (int j = 0; j < 8; ++j) y[8 * i + j] = db * static_cast<float>(g[j]) * sign_of(signs, j);
  }
}

// IQ2_S: d, qs[32] (low 8 index bits), signs[32], qh[8] (2 high index bits each), scales[8].
void dequant_iq2_s(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const uint8_t* qs = b + 2;
  const uint8_t* signs = b + 34;
  const uint8_t* qh = b + 66;
  const uint8_t* scales = b + 74;
  for (int i = 0; i < 32; ++i) {
    const int idx = qs[i] | (((qh[i / 4] >> (2 * (i % 4))) & 3) << 8);
    const int s = (scales[i / 4] >> (4 * ((i / 2) % 2))) & 0x0F;
    const float db = d * (0.5f + static_cast<float>(s)) * 0.25f;
    const auto& g = iq::kIq2sGrid[idx];
    for (int j = 0; j < 8; ++j) y[8 * i + j] = db * static_cast<float>(g[j]) * sign_of(signs[i], j);
  }
}

// IQ3_XXS: d, qs[64] grid indices (4 elements each), then per 32 elements a u32 of 4x7 sign
// bits + a 4-bit scale.
void dequant_iq3_xxs(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const uint8_t* qs = b + 2;
  for (int ib = 0; ib < 8; ++ib) {
    const uint32_t aux = load_u32(b + 66 + 4 * ib);
    const float db = d * (0.5f + static_cast<float>(aux >> 28)) * 0.5f;
    for (int k = 0; k < 4; ++k) {
      const uint8_t signs = iq::kEvenParitySigns[(aux >> (7 * k)) & 0x7F];
      for (int j = 0; j < 8; ++j) {
        const auto& g = iq::kIq3xxsGrid[qs[8 * ib + 2 * k + j / 4]];
        y[32 * ib + 8 * k + j] = db * static_cast<float>(g[j % 4]) * sign_of(signs, j);
      }
    }
  }
}

// IQ3_S: d, qs[64] (low index bits), qh[8] (ninth bit), signs[32], scales[4] (a nibble per 32).
void dequant_iq3_s(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const uint8_t* qs = b + 2;
  const uint8_t* qh = b + 66;
  const uint8_t* signs = b + 74;
  const uint8_t* scales = b + 106;
  for (int e = 0; e < kQK; ++e) {
    const int ib = e / 32, i = e / 4;
    const float db = d * static_cast<float>(1 + 2 * ((scales[ib / 2] >> (4 * (ib % 2))) & 0x0F));
    const int idx = qs[i] | (((qh[i / 8] >> (i % 8)) & 1) << 8);
    y[e] = db * static_cast<float>(iq::kIq3sGrid[idx][e % 4]) * sign_of(signs[e / 8], e % 8);
  }
}

// IQ1_S: d, qs[32] (low index bits), qh[8] u16: 4x3 high index bits, 3-bit scale, delta sign.
void dequant_iq1_s(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const uint8_t* qs = b + 2;
  for (int ib = 0; ib < 8; ++ib) {
    const uint16_t qh = load_u16(b + 34 + 2 * ib);
    const float dl = d * static_cast<float>(2 * ((qh >> 12) & 7) + 1);
    const float delta = qh & 0x8000 ? -0.125f : 0.125f;
    for (int l = 0; l < 4; ++l) {
      const auto& g = iq::kIq1sGrid[qs[4 * ib + l] | (((qh >> (3 * l)) & 7) << 8)];
      for (int j = 0; j < 8; ++j) y[32 * ib + 8 * l + j] = dl * (static_cast<float>(g[j]) + delta);
    }
  }
}

// IQ1_M: qs[32], qh[16] (per index a nibble: 3 high bits + delta sign), scales[8] = 4 u16 of
// 3-bit scales (one per 16 elements) whose top nibbles together form the f16 super-scale.
void dequant_iq1_m(const uint8_t* b, float* y) {
  const uint8_t* qs = b;
  const uint8_t* qh = b + 32;
  uint16_t sc[4];
  for (int i = 0; i < 4; ++i) sc[i] = load_u16(b + 48 + 2 * i);
  const uint16_t dbits = static_cast<uint16_t>((sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) |
                                               (sc[3] & 0xF000));
  const float d = fp16_to_fp32(dbits);
  for (int p = 0; p < 32; ++p) {
    const int t = p / 2;  // 16-element scale group
    const float dl = d * static_cast<float>(2 * ((sc[t / 4] >> (3 * (t % 4))) & 7) + 1);
    const int nib = (qh[p / 2] >> (4 * (p % 2))) & 0x0F;
    const float delta = nib & 8 ? -0.125f : 0.125f;
    const auto& g = iq::kIq1sGrid[qs[p] | ((nib & 7) << 8)];
    for (int j = 0; j < 8; ++j) y[8 * p + j] = dl * (static_cast<float>(g[j]) + delta);
  }
}

// IQ4_XS: d, scales_h:u16 (2 high bits per 32), scales_l[4] (low nibbles), qs[128].
void dequant_iq4_xs(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const uint16_t sh = load_u16(b + 2);
  const uint8_t* sl = b + 4;
  const uint8_t* qs = b + 8;
  for (int ib = 0; ib < 8; ++ib) {
    const int ls = (sl[ib / 2] >> (4 * (ib % 2))) & 0x0F;
    const int hs = (sh >> (2 * ib)) & 3;
    const float dl = d * static_cast<float>(static_cast<int8_t>(ls | (hs << 4)) - 32);
    for (int j = 0; j < 16; ++j) {
      y[32 * ib + j] = dl * static_cast<float>(iq::kIq4nlValues[qs[16 * ib + j] & 0x0F]);
      y[32 * ib + 16 + j] = dl * static_cast<float>(iq::kIq4nlValues[qs[16 * ib + j] >> 4]);
    }
  }
}

using BlockDecoder = void (*)(const uint8_t*, float*);

BlockDecoder block_decoder(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: return dequant_q4_0;
    case GgmlType::Q4_1: return dequant_q4_1;
    case GgmlType::Q5_0: return dequant_q5_0;
    case GgmlType::Q5_1: return dequant_q5_1;
    case GgmlType::Q8_0: return dequant_q8_0;
    case GgmlType::Q2_K: return dequant_q2_k;
    case GgmlType::Q3_K: return dequant_q3_k;
    case GgmlType::Q4_K: return dequant_q4_k;
    case GgmlType::Q5_K: return dequant_q5_k;
    case GgmlType::Q6_K: return dequant_q6_k;
    case GgmlType::IQ2_XXS: return dequant_iq2_xxs;
    case GgmlType::IQ2_XS: return dequant_iq2_xs;
    case GgmlType::IQ2_S: return dequant_iq2_s;
    case GgmlType::IQ3_XXS: return dequant_iq3_xxs;
    case GgmlType::IQ3_S: return dequant_iq3_s;
    case GgmlType::IQ1_S: return dequant_iq1_s;
    case GgmlType::IQ1_M: return dequant_iq1_m;
    case GgmlType::IQ4_NL: return dequant_iq4_nl;
    case GgmlType::IQ4_XS: return dequant_iq4_xs;
    case GgmlType::MXFP4: return dequant_mxfp4;
    default: return nullptr;
  }
}

// ---- quantization ---------------------------------------------------------------------------

// ggml's reference Q8_0: d = amax/127, q = round-half-away(x/d).
void quant_q8_0(const float* x, uint8_t* b) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const uint16_t dh = fp32_to_fp16(d);
  std::memcpy(b, &dh, 2);
  for (int j = 0; j < 32; ++j) b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::round(x[j] * id)));
}

// ggml's reference Q4_0: d = (signed value of largest magnitude) / -8, q = trunc(x/d + 8.5) in [0, 15].
void quant_q4_0(const float* x, uint8_t* b) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < 32; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const float d = max / -8.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const uint16_t dh = fp32_to_fp16(d);
  std::memcpy(b, &dh, 2);
  for (int j = 0; j < 16; ++j) {
    const float x0 = x[j] * id;
    const float x1 = x[j + 16] * id;
    const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>(x0 + 8.5f)));
    const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>(x1 + 8.5f)));
    b[2 + j] = static_cast<uint8_t>(q0 | (q1 << 4));
  }
}

Status check_row(GgmlType type, int64_t n, const GgmlTypeTraits& tr) {
  if (tr.block_size == 0) return Status::errorf("unknown GGML type id {}", static_cast<uint32_t>(type));
  if (n < 0 || n % tr.block_size != 0)
    return Status::errorf("row of {} elements is not a multiple of the {} block size {}", n, tr.name, tr.block_size);
  return Status::ok();
}

}  // namespace

Status dequantize_row(GgmlType type, const void* src, float* dst, int64_t n) {
  const GgmlTypeTraits tr = ggml_type_traits(type);
  HS_RETURN_IF_ERROR(check_row(type, n, tr));
  const auto* p = static_cast<const uint8_t*>(src);
  switch (type) {
    case GgmlType::F32:
      std::memcpy(dst, p, static_cast<size_t>(n) * sizeof(float));
      return Status::ok();
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) dst[i] = load_f16(p + 2 * i);
      return Status::ok();
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(load_u16(p + 2 * i));
      return Status::ok();
    default:
      break;
  }
  const BlockDecoder decode = block_decoder(type);
  if (!decode) return Status::errorf("dequantization of GGML type {} is not supported", tr.name);
  for (int64_t ib = 0; ib < n / tr.block_size; ++ib) decode(p + ib * tr.type_size, dst + ib * tr.block_size);
  return Status::ok();
}

Status quantize_row(GgmlType type, const float* src, void* dst, int64_t n) {
  const GgmlTypeTraits tr = ggml_type_traits(type);
  HS_RETURN_IF_ERROR(check_row(type, n, tr));
  auto* p = static_cast<uint8_t*>(dst);
  switch (type) {
    case GgmlType::F32:
      std::memcpy(p, src, static_cast<size_t>(n) * sizeof(float));
      return Status::ok();
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = fp32_to_fp16(src[i]);
        std::memcpy(p + 2 * i, &h, 2);
      }
      return Status::ok();
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = fp32_to_bf16(src[i]);
        std::memcpy(p + 2 * i, &h, 2);
      }
      return Status::ok();
    case GgmlType::Q8_0:
      for (int64_t ib = 0; ib < n / 32; ++ib) quant_q8_0(src + 32 * ib, p + 34 * ib);
      return Status::ok();
    case GgmlType::Q4_0:
      for (int64_t ib = 0; ib < n / 32; ++ib) quant_q4_0(src + 32 * ib, p + 18 * ib);
      return Status::ok();
    default:
      return Status::errorf("quantization to GGML type {} is not supported (F32, F16, BF16, Q8_0, Q4_0 are)",
                            tr.name);
  }
}

}  // namespace hyspec
