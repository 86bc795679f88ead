// The float kernels (f32_kernels.inc) on AVX2+FMA+F16C. The whole file after the includes is
// compiled for that target (a pragma, not -mavx2, so the library still runs on any x86-64);
// f32_kernels() hands these out only after dot_isa_available(DotIsa::Avx2).
#include "backend/cpu/f32_kernels.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

namespace hyspec::cpu {
namespace {

struct V {
  __m256 v;

  static V zero() { return {_mm256_setzero_ps()}; }
  static V set1(float x) { return {_mm256_set1_ps(x)}; }
  static V load(const float* p) { return {_mm256_loadu_ps(p)}; }
  void store(float* p) const { _mm256_storeu_ps(p, v); }
  void store_lo4(float* p) const { _mm_storeu_ps(p, _mm256_castps256_ps128(v)); }
  void store_hi4(float* p) const { _mm_storeu_ps(p, _mm256_extractf128_ps(v, 1)); }
  static V fma(V a, V b, V c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
  static V max(V a, V b) { return {_mm256_max_ps(a.v, b.v)}; }
  static V min(V a, V b) { return {_mm256_min_ps(a.v, b.v)}; }
  static V round(V a) { return {_mm256_round_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)}; }
  static V sqrt(V a) { return {_mm256_sqrt_ps(a.v)}; }
  // (a < b) ? x : y per lane
  static V select_lt(V a, V b, V x, V y) { return {_mm256_blendv_ps(y.v, x.v, _mm256_cmp_ps(a.v, b.v, _CMP_LT_OQ))}; }
  static V pow2i(V n) {
    const __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n.v), _mm256_set1_epi32(127));
    return {_mm256_castsi256_ps(_mm256_slli_epi32(e, 23))};
  }
  static float hsum(V a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static float hmax(V a) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  // Three rounds of pairwise horizontal adds, then the two 128-bit halves: 6 hadd, 2 permutes, 1 add.
  static V reduce8(const V* x) {
    const __m256 t0 = _mm256_hadd_ps(x[0].v, x[1].v), t1 = _mm256_hadd_ps(x[2].v, x[3].v);
    const __m256 t2 = _mm256_hadd_ps(x[4].v, x[5].v), t3 = _mm256_hadd_ps(x[6].v, x[7].v);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return {_mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31))};
  }
};

// Operators outside the struct: GCC does not apply the target pragma to friends defined in a class.
inline V operator+(V a, V b) { return {_mm256_add_ps(a.v, b.v)}; }
inline V operator-(V a, V b) { return {_mm256_sub_ps(a.v, b.v)}; }
inline V operator*(V a, V b) { return {_mm256_mul_ps(a.v, b.v)}; }
inline V operator/(V a, V b) { return {_mm256_div_ps(a.v, b.v)}; }

void k_f16_to_f32(const uint16_t* x, int64_t n, float* y) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))));
  for (; i < n; ++i) y[i] = _cvtsh_ss(x[i]);
}

#include "backend/cpu/f32_kernels.inc"

}  // namespace

const F32Kernels& avx2_f32_kernels() { return kKernels; }

}  // namespace hyspec::cpu

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif  // x86-64
