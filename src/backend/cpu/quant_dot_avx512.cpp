// AVX-512 VNNI tile kernel for Q8_0 weights x Q8_0 activations: the matmul's inner loop on CPUs
// with AVX-512 F/BW/VL/VNNI (Zen 4/5, Ice Lake and later Xeons), selected at run time as
// DotIsa::Avx512; every other kernel of that path is the AVX2 one. Function-level target
// attributes, as in quant_dot_avx2.cpp, so the library still runs on any x86-64.
//
// One 512-bit vector holds two 32-element blocks. vpdpbusd multiplies unsigned by signed bytes and
// adds groups of 4 into int32 lanes without the int16 saturation of vpmaddubsw, so the activation
// is made unsigned by an offset: a + 128 (a XOR 0x80), and the excess 128·Σw of each 4-byte group
// is subtracted up front by starting the accumulation from -128·Σw (itself one vpdpbusd of w with
// 0x80 bytes, once per weight block pair per tile). Per (weight row, activation row, block pair),
// 64 MACs: vpdpbusd, a conversion, a multiply by the two block scales and an FMA, against the AVX2
// kernel's 6 ops per 32 MACs. Bytes: 68 per weight block pair per 4 activation rows, 68 per
// activation block pair per 4 weight rows; f32 scales from the caller's tables.
#include "backend/cpu/quant_dot_kernels.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "util/half.h"

// GCC 12 reports the _mm512_undefined_* inside the insert intrinsics as maybe-uninitialized.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#define HS_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

namespace hyspec::cpu {
namespace {

constexpr int kTileT = 4;  // activation rows per tile (weight rows: the row group, up to 4)

// Two consecutive 32-byte code arrays (blocks b and b+1, 34 bytes apart) as one vector; the upper
// half is zero when there is no second block.
HS_AVX512 inline __m512i load_block_pair(const int8_t* first, const int8_t* second) {
  // (second is a constant null for a lone block, so the branch folds away)
  const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(first));
  if (!second) return _mm512_zextsi256_si512(lo);
  return _mm512_inserti64x4(_mm512_zextsi256_si512(lo), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(second)), 1);
}

// [s[0] x 8 | s[1] x 8] (or s[0] and 0 for a lone block).
HS_AVX512 inline __m512 scale_pair(const float* s, bool pair) {
  // (64-bit lane inserts: the 32-bit ones would need AVX-512 DQ)
  const __m256 hi = pair ? _mm256_set1_ps(s[1]) : _mm256_setzero_ps();
  return _mm512_castpd_ps(
      _mm512_insertf64x4(_mm512_castps_pd(_mm512_zextps256_ps512(_mm256_set1_ps(s[0]))), _mm256_castps_pd(hi), 1));
}

// The 16 lanes of v added pairwise down to 8.
HS_AVX512 inline __m256 fold(__m512 v) {
  return _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

// One step of the tile over blocks b and b+1 (kPair) or block b alone.
template <int R, int T, bool kPair>
HS_AVX512 inline void tile_step(const BlockQ8_0* const* w, const ActQ8_0* const* a, const float* dw, const float* da,
                                int64_t nb, int64_t b, __m512 (&acc)[R][T]) {
  const __m512i offset = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512i av[T];
  __m512 sa[T];
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) {
    av[t] = _mm512_xor_si512(load_block_pair(a[t][b].qs, kPair ? a[t][b + 1].qs : nullptr), offset);
    sa[t] = scale_pair(da + t * nb + b, kPair);
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const __m512i wv = load_block_pair(w[r][b].qs, kPair ? w[r][b + 1].qs : nullptr);
    const __m512i start = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), offset, wv));
    const __m512 sw = scale_pair(dw + r * nb + b, kPair);
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      const __m512i p = _mm512_dpbusd_epi32(start, av[t], wv);
      acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(sa[t], sw), acc[r][t]);
    }
  }
}

template <int R, int T>
HS_AVX512 inline __attribute__((always_inline)) void tile_micro(const BlockQ8_0* const* w, const ActQ8_0* const* a,
                                                                const float* dw, const float* da, int64_t nb, float* out,
                                                                int64_t out_stride) {
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  int64_t b = 0;
  for (; b + 1 < nb; b += 2) tile_step<R, T, true>(w, a, dw, da, nb, b, acc);
  if (b < nb) tile_step<R, T, false>(w, a, dw, da, nb, b, acc);
  if constexpr (R == 4 && T % 2 == 0) {
    // Fold each accumulator to 8 lanes, then 8 of them at once to one vector: rows 0-3 of column t
    // in lanes 0-3, of column t+1 in lanes 4-7.
    for (int t = 0; t < T; t += 2) {
      const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(fold(acc[0][t]), fold(acc[1][t])),
                                       _mm256_hadd_ps(fold(acc[2][t]), fold(acc[3][t])));
      const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(fold(acc[0][t + 1]), fold(acc[1][t + 1])),
                                       _mm256_hadd_ps(fold(acc[2][t + 1]), fold(acc[3][t + 1])));
      const __m256 s = _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
      _mm_storeu_ps(out + t * out_stride, _mm256_castps256_ps128(s));
      _mm_storeu_ps(out + (t + 1) * out_stride, _mm256_extractf128_ps(s, 1));
    }
  } else if constexpr (R == 4 && T == 1) {
    const __m256 u = _mm256_hadd_ps(_mm256_hadd_ps(fold(acc[0][0]), fold(acc[1][0])),
                                    _mm256_hadd_ps(fold(acc[2][0]), fold(acc[3][0])));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1)));
  } else {
    // The same tree as above for one accumulator, so every tile shape gives a dot the same bits (a
    // verify step's rows must equal a decode step's: tests/backend/batch_invariance_test.cpp).
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) {
        const __m256 f = fold(acc[r][t]);
        const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(f, f), _mm256_hadd_ps(f, f));
        out[t * out_stride + r] = _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
      }
  }
}

// R weight rows (one row group) against all `cols` activation rows: full 4-column tiles in a loop,
// then the remainder; one function per R so the tile body is inlined into its loop.
template <int R>
HS_AVX512 void tile_row_group(const BlockQ8_0* const* wr, const float* dw, const uint8_t* act, size_t act_stride,
                              const float* da, int64_t nb, int cols, float* out, int64_t out_stride) {
  auto rows_at = [&](int c0, const ActQ8_0** ar, int T) HS_AVX512 {
    for (int t = 0; t < T; ++t) ar[t] = reinterpret_cast<const ActQ8_0*>(act + (c0 + t) * act_stride);
  };
  const ActQ8_0* ar[kTileT];
  int c0 = 0;
  for (; c0 + kTileT <= cols; c0 += kTileT) {
    rows_at(c0, ar, kTileT);
    tile_micro<R, kTileT>(wr, ar, dw, da + c0 * nb, nb, out + c0 * out_stride, out_stride);
  }
  rows_at(c0, ar, cols - c0);
  switch (cols - c0) {
    case 1: tile_micro<R, 1>(wr, ar, dw, da + c0 * nb, nb, out + c0 * out_stride, out_stride); break;
    case 2: tile_micro<R, 2>(wr, ar, dw, da + c0 * nb, nb, out + c0 * out_stride, out_stride); break;
    case 3: tile_micro<R, 3>(wr, ar, dw, da + c0 * nb, nb, out + c0 * out_stride, out_stride); break;
    default: break;
  }
}

HS_AVX512 void tile_q8_0(const void* w, size_t w_stride, const void* act, size_t act_stride, int64_t n, int rows,
                         int cols, float* out, int64_t out_stride) {
  static constexpr Q8_0RowGroup kGroups[4] = {tile_row_group<1>, tile_row_group<2>, tile_row_group<3>,
                                              tile_row_group<4>};
  q8_0_tile_by_row_groups(kGroups, w, w_stride, act, act_stride, n, rows, cols, out, out_stride);
}

}  // namespace

DotTileKernel avx512_dot_tile_kernel(GgmlType wt) { return wt == GgmlType::Q8_0 ? tile_q8_0 : nullptr; }

}  // namespace hyspec::cpu

#else  // not x86-64

namespace hyspec::cpu {
DotTileKernel avx512_dot_tile_kernel(GgmlType) { return nullptr; }
}  // namespace hyspec::cpu

#endif
