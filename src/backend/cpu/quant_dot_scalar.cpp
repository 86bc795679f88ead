// Scalar dot kernels: the readable reference for every weight type, and the path on CPUs without
// AVX2. Each kernel sums integer products inside a block (exact) and applies the block's float
// scales once per block, the same factorisation as the AVX2 kernels and llama.cpp.
// Cost: one integer multiply-add per element plus 2-4 float ops per block; weight bytes per block
// are the struct sizes in quant_dot_kernels.h (e.g. Q4_0 18 per 32, Q4_K 144 per 256).

#include "backend/cpu/quant_dot_kernels.h"
#include "util/half.h"

namespace hyspec::cpu {
namespace {

float f16(uint16_t h) { return fp16_to_fp32(h); }

// Σ over the blocks of kElems elements of term(weight block, activation block).
template <class Block, class Act, int kElems, class Term>
float block_dot(const void* w, const void* act, int64_t n, Term term) {
  const auto* x = static_cast<const Block*>(w);
  const auto* y = static_cast<const Act*>(act);
  float sum = 0;
  for (int64_t b = 0; b < n / kElems; ++b) sum += term(x[b], y[b]);
  return sum;
}

// ---- float weights against f32 activations ----

float dot_f32(const void* w, const void* act, int64_t n) {
  const float* x = static_cast<const float*>(w);
  const float* y = static_cast<const float*>(act);
  float sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += x[i] * y[i];
  return sum;
}

// F16 and BF16: 2 bytes per element, widened exactly to f32.
template <float (*kToF32)(uint16_t)>
float dot_16bit(const void* w, const void* act, int64_t n) {
  const uint16_t* x = static_cast<const uint16_t*>(w);
  const float* y = static_cast<const float*>(act);
  float sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += kToF32(x[i]) * y[i];
  return sum;
}
constexpr auto dot_f16 = dot_16bit<fp16_to_fp32>;
constexpr auto dot_bf16 = dot_16bit<bf16_to_fp32>;

// ---- 32-element blocks against Q8_0 / Q8_1 activations ----

float dot_q4_0(const void* w, const void* act, int64_t n) {
  return block_dot<BlockQ4_0, ActQ8_0, 32>(w, act, n, [](const BlockQ4_0& x, const ActQ8_0& y) {
    int isum = 0;
    for (int j = 0; j < 16; ++j) {
      isum += ((x.qs[j] & 0xF) - 8) * y.qs[j];
      isum += ((x.qs[j] >> 4) - 8) * y.qs[j + 16];
    }
    return f16(x.d) * f16(y.d) * static_cast<float>(isum);
  });
}

// Σ (d q + m) y = d·dy Σ q qy + m·s   (s = dy Σ qy, precomputed in the Q8_1 block)
float dot_q4_1(const void* w, const void* act, int64_t n) {
  return block_dot<BlockQ4_1, ActQ8_1, 32>(w, act, n, [](const BlockQ4_1& x, const ActQ8_1& y) {
    int isum = 0;
    for (int j = 0; j < 16; ++j) {
      isum += (x.qs[j] & 0xF) * y.qs[j];
      isum += (x.qs[j] >> 4) * y.qs[j + 16];
    }
    return f16(x.d) * f16(y.d) * static_cast<float>(isum) + f16(x.m) * f16(y.s);
  });
}

// Q5: bit j of the little-endian qh word is the fifth bit of element j.
float dot_q5_0(const void* w, const void* act, int64_t n) {
  return block_dot<BlockQ5_0, ActQ8_0, 32>(w, act, n, [](const BlockQ5_0& x, const ActQ8_0& y) {
    const uint32_t qh = load_le32(x.qh);
    int isum = 0;
    for (int j = 0; j < 16; ++j) {
      const int lo = (x.qs[j] & 0xF) | (((qh >> j) & 1) << 4);
      const int hi = (x.qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      isum += (lo - 16) * y.qs[j] + (hi - 16) * y.qs[j + 16];
    }
    return f16(x.d) * f16(y.d) * static_cast<float>(isum);
  });
}

float dot_q5_1(const void* w, const void* act, int64_t n) {
  return block_dot<BlockQ5_1, ActQ8_1, 32>(w, act, n, [](const BlockQ5_1& x, const ActQ8_1& y) {
    const uint32_t qh = load_le32(x.qh);
    int isum = 0;
    for (int j = 0; j < 16; ++j) {
      const int lo = (x.qs[j] & 0xF) | (((qh >> j) & 1) << 4);
      const int hi = (x.qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      isum += lo * y.qs[j] + hi * y.qs[j + 16];
    }
    return f16(x.d) * f16(y.d) * static_cast<float>(isum) + f16(x.m) * f16(y.s);
  });
}

float dot_q8_0(const void* w, const void* act, int64_t n) {
  return block_dot<BlockQ8_0, ActQ8_0, 32>(w, act, n, [](const BlockQ8_0& x, const ActQ8_0& y) {
    int isum = 0;
    for (int j = 0; j < 32; ++j) isum += x.qs[j] * y.qs[j];
    return f16(x.d) * f16(y.d) * static_cast<float>(isum);
  });
}

// IQ4_NL and MXFP4 share the nibble layout and differ in codebook and scale encoding.
int nibble_codebook_dot(const uint8_t qs[16], const int8_t codebook[16], const int8_t* y) {
  int isum = 0;
  for (int j = 0; j < 16; ++j) {
    isum += codebook[qs[j] & 0xF] * y[j];
    isum += codebook[qs[j] >> 4] * y[j + 16];
  }
  return isum;
}

float dot_iq4_nl(const void* w, const void* act, int64_t n) {
  return block_dot<BlockIQ4_NL, ActQ8_0, 32>(w, act, n, [](const BlockIQ4_NL& x, const ActQ8_0& y) {
    return f16(x.d) * f16(y.d) * static_cast<float>(nibble_codebook_dot(x.qs, iq::kIq4nlValues, y.qs));
  });
}

float dot_mxfp4(const void* w, const void* act, int64_t n) {
  return block_dot<BlockMXFP4, ActQ8_0, 32>(w, act, n, [](const BlockMXFP4& x, const ActQ8_0& y) {
    return e8m0_to_fp32_half(x.e) * f16(y.d) * static_cast<float>(nibble_codebook_dot(x.qs, iq::kMxfp4Values, y.qs));
  });
}

// ---- 256-element super-blocks against Q8_K activations ----
// Sub-block minimums are applied through the activation's per-16 sums (bsums), so the inner loops
// only see the unsigned codes: Σ (d sc q - dmin m) y = d Σ sc Σ q y - dmin Σ m Σ y.

float dot_q2_k(const void* w, const void* act, int64_t n) {
  const auto* x = static_cast<const BlockQ2_K*>(w);
  const auto* y = static_cast<const ActQ8_K*>(act);
  float sum = 0;
  for (int64_t b = 0; b < n / 256; ++b) {
    int sum_q = 0, sum_min = 0;
    for (int g = 0; g < 16; ++g) {  // 16 groups of 16: group g is bits 2*(g/2 % 4) of qs[32*(g/8) + 16*(g%2) ..]
      const uint8_t* q = x[b].qs + 32 * (g / 8) + 16 * (g % 2);
      const int shift = 2 * ((g / 2) % 4);
      const int8_t* qy = y[b].qs + 16 * g;
      int s = 0;
      for (int l = 0; l < 16; ++l) s += ((q[l] >> shift) & 3) * qy[l];
      sum_q += (x[b].scales[g] & 0xF) * s;
      sum_min += (x[b].scales[g] >> 4) * y[b].bsums[g];
    }
    sum += y[b].d * (f16(x[b].d) * static_cast<float>(sum_q) - f16(x[b].dmin) * static_cast<float>(sum_min));
  }
  return sum;
}

// Q3_K codes are (2 low bits | high bit from hmask) - 4 with signed 6-bit scales; the -4 is
// applied through bsums like a minimum.
float dot_q3_k(const void* w, const void* act, int64_t n) {
  const auto* x = static_cast<const BlockQ3_K*>(w);
  const auto* y = static_cast<const ActQ8_K*>(act);
  float sum = 0;
  for (int64_t b = 0; b < n / 256; ++b) {
    int8_t sc[16];
    unpack_q3_k_scales(x[b].scales, sc);
    int isum = 0;
    for (int g = 0; g < 16; ++g) {  // layout as Q2_K; group pair g/2 takes hmask bit g/2
      const int l0 = 16 * (g % 2);
      const uint8_t* q = x[b].qs + 32 * (g / 8) + l0;
      const int shift = 2 * ((g / 2) % 4);
      const int hbit = g / 2;
      const int8_t* qy = y[b].qs + 16 * g;
      int s = 0;
      for (int l = 0; l < 16; ++l) {
        const int u = ((q[l] >> shift) & 3) | (((x[b].hmask[l0 + l] >> hbit) & 1) << 2);
        s += u * qy[l];
      }
      isum += sc[g] * (s - 4 * y[b].bsums[g]);
    }
    sum += f16(x[b].d) * y[b].d * static_cast<float>(isum);
  }
  return sum;
}

// Q4_K and Q5_K: 8 sub-blocks of 32 with 6-bit scales and minimums; sub-block s is nibble s%2 of
// qs[32*(s/2) ..], and for Q5_K bit s of qh[l] is the fifth bit.
template <class Block, bool kFifthBit>
float dot_k4_family(const void* w, const void* act, int64_t n) {
  return block_dot<Block, ActQ8_K, 256>(w, act, n, [](const Block& x, const ActQ8_K& y) {
    uint8_t sc[8], mn[8];
    unpack_k4_scales(x.scales, sc, mn);
    int sum_q = 0, sum_min = 0;
    for (int s = 0; s < 8; ++s) {
      const uint8_t* q = x.qs + 32 * (s / 2);
      const int shift = 4 * (s % 2);
      const int8_t* qy = y.qs + 32 * s;
      int t = 0;
      for (int l = 0; l < 32; ++l) {
        int code = (q[l] >> shift) & 0xF;
        if constexpr (kFifthBit) code |= ((x.qh[l] >> s) & 1) << 4;
        t += code * qy[l];
      }
      sum_q += sc[s] * t;
      sum_min += mn[s] * (y.bsums[2 * s] + y.bsums[2 * s + 1]);
    }
    return y.d * (f16(x.d) * static_cast<float>(sum_q) - f16(x.dmin) * static_cast<float>(sum_min));
  });
}
constexpr auto dot_q4_k = dot_k4_family<BlockQ4_K, false>;
constexpr auto dot_q5_k = dot_k4_family<BlockQ5_K, true>;

// Q6_K: 6-bit codes (4 in ql, 2 in qh) minus 32, one int8 scale per 16 elements.
float dot_q6_k(const void* w, const void* act, int64_t n) {
  const auto* x = static_cast<const BlockQ6_K*>(w);
  const auto* y = static_cast<const ActQ8_K*>(act);
  float sum = 0;
  for (int64_t b = 0; b < n / 256; ++b) {
    int isum = 0;
    for (int g = 0; g < 16; ++g) {
      // Element e = 128h + 32k + l (k = 0..3, l = 0..31): ql[64h + 32(k%2) + l] nibble k/2,
      // qh[32h + l] bits 2k..2k+1.
      const int h = g / 8, k = (g / 2) % 4, l0 = 16 * (g % 2);
      const uint8_t* ql = x[b].ql + 64 * h + 32 * (k % 2) + l0;
      const uint8_t* qh = x[b].qh + 32 * h + l0;
      const int8_t* qy = y[b].qs + 16 * g;
      int s = 0;
      for (int l = 0; l < 16; ++l) {
        const int q = ((ql[l] >> (4 * (k / 2))) & 0xF) | (((qh[l] >> (2 * k)) & 3) << 4);
        s += (q - 32) * qy[l];
      }
      isum += x[b].scales[g] * s;
    }
    sum += f16(x[b].d) * y[b].d * static_cast<float>(isum);
  }
  return sum;
}

float dot_iq4_xs(const void* w, const void* act, int64_t n) {
  const auto* x = static_cast<const BlockIQ4_XS*>(w);
  const auto* y = static_cast<const ActQ8_K*>(act);
  float sum = 0;
  for (int64_t b = 0; b < n / 256; ++b) {
    int isum = 0;
    for (int s = 0; s < 8; ++s) {  // 6-bit scale: 4 bits in scales_l, 2 in scales_h, bias 32
      const int ls = ((x[b].scales_l[s / 2] >> (4 * (s % 2))) & 0xF) | (((x[b].scales_h >> (2 * s)) & 3) << 4);
      isum += (ls - 32) * nibble_codebook_dot(x[b].qs + 16 * s, iq::kIq4nlValues, y[b].qs + 32 * s);
    }
    sum += f16(x[b].d) * y[b].d * static_cast<float>(isum);
  }
  return sum;
}

// ---- grid-codebook i-quants against Q8_K ----
// Each group of 4 or 8 elements is a codebook row (unsigned magnitudes) with per-element signs;
// scales are odd integers (2s+1) with a fixed power-of-two factor, so the block sum stays integral.

// Σ_j ±g[j] y[j] over `len` elements, sign bit j of `signs` negating element j.
int signed_grid_dot(const uint8_t* g, uint8_t signs, const int8_t* y, int len) {
  int s = 0;
  for (int j = 0; j < len; ++j) s += (signs >> j & 1 ? -g[j] : g[j]) * y[j];
  return s;
}

// The skeleton of the grid i-quant kernels: per 256-element super-block, the integer sums of its
// eight 32-element sub-blocks (sub(block, ib, y + 32 ib)), scaled by scale · d · y.d.
template <class Block, class SubBlockDot>
float iq_superblock_dot(const void* w, const void* act, int64_t n, float scale, SubBlockDot sub) {
  return block_dot<Block, ActQ8_K, 256>(w, act, n, [&](const Block& x, const ActQ8_K& y) {
    int isum = 0;
    for (int ib = 0; ib < 8; ++ib) isum += sub(x, ib, y.qs + 32 * ib);
    return scale * f16(x.d) * y.d * static_cast<float>(isum);
  });
}

// IQ2_XXS: w = d (2s+1)/8 · grid · sign.
float dot_iq2_xxs(const void* w, const void* act, int64_t n) {
  return iq_superblock_dot<BlockIQ2_XXS>(w, act, n, 0.125f, [](const BlockIQ2_XXS& x, int ib, const int8_t* y) {
    const uint32_t idx = load_le32(x.qs + 8 * ib), aux = load_le32(x.qs + 8 * ib + 4);
    int s = 0;
    for (int k = 0; k < 4; ++k) {
      const uint8_t signs = iq::kEvenParitySigns[(aux >> (7 * k)) & 127];
      s += signed_grid_dot(iq::kIq2xxsGrid[(idx >> (8 * k)) & 255].data(), signs, y + 8 * k, 8);
    }
    return (2 * static_cast<int>(aux >> 28) + 1) * s;
  });
}

// IQ2_XS: w = d (2s+1)/8 · grid · sign, scale s per 16.
float dot_iq2_xs(const void* w, const void* act, int64_t n) {
  return iq_superblock_dot<BlockIQ2_XS>(w, act, n, 0.125f, [](const BlockIQ2_XS& x, int ib, const int8_t* y) {
    int isum = 0;
    for (int i = 4 * ib; i < 4 * ib + 4; ++i) {  // group of 8
      const uint16_t q = x.qs[i];
      const int s = (x.scales[i / 4] >> (4 * ((i / 2) % 2))) & 0xF;
      const uint8_t signs = iq::kEvenParitySigns[q >> 9];
      isum += (2 * s + 1) * signed_grid_dot(iq::kIq2xsGrid[q & 511].data(), signs, y + 8 * (i - 4 * ib), 8);
    }
    return isum;
  });
}

// IQ2_S: as IQ2_XS with a 10-bit index and explicit sign bytes.
float dot_iq2_s(const void* w, const void* act, int64_t n) {
  return iq_superblock_dot<BlockIQ2_S>(w, act, n, 0.125f, [](const BlockIQ2_S& x, int ib, const int8_t* y) {
    int isum = 0;
    for (int i = 4 * ib; i < 4 * ib + 4; ++i) {
      const int idx = x.qs[i] | (((x.qh[i / 4] >> (2 * (i % 4))) & 3) << 8);
      const int s = (x.scales[i / 4] >> (4 * ((i / 2) % 2))) & 0xF;
      isum += (2 * s + 1) * signed_grid_dot(iq::kIq2sGrid[idx].data(), x.signs[i], y + 8 * (i - 4 * ib), 8);
    }
    return isum;
  });
}

// IQ3_XXS: w = d (2s+1)/4 · grid · sign, two 4-element rows per sign byte.
float dot_iq3_xxs(const void* w, const void* act, int64_t n) {
  return iq_superblock_dot<BlockIQ3_XXS>(w, act, n, 0.25f, [](const BlockIQ3_XXS& x, int ib, const int8_t* y) {
    const uint32_t aux = load_le32(x.scales_signs + 4 * ib);
    int s = 0;
    for (int k = 0; k < 4; ++k) {
      const uint8_t signs = iq::kEvenParitySigns[(aux >> (7 * k)) & 127];
      const int8_t* qy = y + 8 * k;
      s += signed_grid_dot(iq::kIq3xxsGrid[x.qs[8 * ib + 2 * k]].data(), signs, qy, 4);
      s += signed_grid_dot(iq::kIq3xxsGrid[x.qs[8 * ib + 2 * k + 1]].data(), signs >> 4, qy + 4, 4);
    }
    return (2 * static_cast<int>(aux >> 28) + 1) * s;
  });
}

// IQ3_S: w = d (2s+1) · grid · sign, scale s per 32.
float dot_iq3_s(const void* w, const void* act, int64_t n) {
  return iq_superblock_dot<BlockIQ3_S>(w, act, n, 1.0f, [](const BlockIQ3_S& x, int ib, const int8_t* y) {
    int s = 0;
    for (int i = 8 * ib; i < 8 * ib + 8; ++i) {  // group of 4
      const int idx = x.qs[i] | (((x.qh[i / 8] >> (i % 8)) & 1) << 8);
      const uint8_t signs = static_cast<uint8_t>(x.signs[i / 2] >> (4 * (i % 2)));
      s += signed_grid_dot(iq::kIq3sGrid[idx].data(), signs, y + 4 * (i - 8 * ib), 4);
    }
    return (2 * ((x.scales[ib / 2] >> (4 * (ib % 2))) & 0xF) + 1) * s;
  });
}

// IQ1_S / IQ1_M: w = d (2s+1) (g + δ/8), g in {-1, 0, 1}, δ = ±1; summed as (8g + δ) to stay integral.
int iq1_group_dot(const int8_t* g, int delta, const int8_t* y) {
  int s = 0;
  for (int j = 0; j < 8; ++j) s += (8 * g[j] + delta) * y[j];
  return s;
}

float dot_iq1_s(const void* w, const void* act, int64_t n) {
  return iq_superblock_dot<BlockIQ1_S>(w, act, n, 0.125f, [](const BlockIQ1_S& x, int ib, const int8_t* y) {
    const uint16_t qh = x.qh[ib];
    const int delta = qh & 0x8000 ? -1 : 1;
    int s = 0;
    for (int l = 0; l < 4; ++l) {
      const int idx = x.qs[4 * ib + l] | (((qh >> (3 * l)) & 7) << 8);
      s += iq1_group_dot(iq::kIq1sGrid[idx].data(), delta, y + 8 * l);
    }
    return (2 * ((qh >> 12) & 7) + 1) * s;
  });
}

float dot_iq1_m(const void* w, const void* act, int64_t n) {
  const auto* x = static_cast<const BlockIQ1_M*>(w);
  const auto* y = static_cast<const ActQ8_K*>(act);
  float sum = 0;
  for (int64_t b = 0; b < n / 256; ++b) {
    uint16_t sc[4], d;
    unpack_iq1_m_scales(x[b], sc, &d);
    int isum = 0;
    for (int p = 0; p < 32; ++p) {  // group of 8; its scale is shared with the neighbour (per 16)
      const int t = p / 2;
      const int nib = (x[b].qh[p / 2] >> (4 * (p % 2))) & 0xF;
      const int idx = x[b].qs[p] | ((nib & 7) << 8);
      const int s = iq1_group_dot(iq::kIq1sGrid[idx].data(), nib & 8 ? -1 : 1, y[b].qs + 8 * p);
      isum += (2 * ((sc[t / 4] >> (3 * (t % 4))) & 7) + 1) * s;
    }
    sum += 0.125f * f16(d) * y[b].d * static_cast<float>(isum);
  }
  return sum;
}

}  // namespace

DotKernel scalar_dot_kernel(GgmlType wt) {
  switch (wt) {
#define HS_KERNEL_CASE(type, suffix) \
  case GgmlType::type: return dot_##suffix;
    HYSPEC_DOT_KERNELS(HS_KERNEL_CASE)
#undef HS_KERNEL_CASE
    default: return nullptr;
  }
}

}  // namespace hyspec::cpu
