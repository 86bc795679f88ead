// The float kernels (f32_kernels.inc) in portable C++: V is 8 floats in an array, every operation a
// loop over the lanes. The reference for the AVX2 path (same algorithms, same lane order; results
// differ only where AVX2 fuses a multiply-add) and the path on CPUs without AVX2.
#include <algorithm>
#include <cfloat>
#include <bit>
#include <cmath>
#include <cstring>

#include "backend/cpu/f32_kernels.h"
#include "util/half.h"

namespace hyspec::cpu {
namespace {

struct V {
  float v[8];

  template <typename F>
  static V map(F f) {
    V r;
    for (int i = 0; i < 8; ++i) r.v[i] = f(i);
    return r;
  }
  static V zero() { return set1(0.0f); }
  static V set1(float x) { return map([&](int) { return x; }); }
  static V load(const float* p) { return map([&](int i) { return p[i]; }); }
  void store(float* p) const { std::memcpy(p, v, sizeof v); }
  void store_lo4(float* p) const { std::memcpy(p, v, 4 * sizeof(float)); }
  void store_hi4(float* p) const { std::memcpy(p, v + 4, 4 * sizeof(float)); }
  static V fma(V a, V b, V c) { return map([&](int i) { return a.v[i] * b.v[i] + c.v[i]; }); }
  // As vmaxps/vminps: the second operand when either is NaN.
  static V max(V a, V b) { return map([&](int i) { return a.v[i] > b.v[i] ? a.v[i] : b.v[i]; }); }
  static V min(V a, V b) { return map([&](int i) { return a.v[i] < b.v[i] ? a.v[i] : b.v[i]; }); }
  static V round(V a) { return map([&](int i) { return std::nearbyint(a.v[i]); }); }
  static V sqrt(V a) { return map([&](int i) { return std::sqrt(a.v[i]); }); }
  static V select_lt(V a, V b, V x, V y) { return map([&](int i) { return a.v[i] < b.v[i] ? x.v[i] : y.v[i]; }); }
  static V pow2i(V n) {
    return map([&](int i) { return std::bit_cast<float>(static_cast<uint32_t>(static_cast<int>(n.v[i]) + 127) << 23); });
  }
  // Same association as the AVX2 reductions: halves, then pairs.
  static float hsum(V a) {
    float s[4];
    for (int i = 0; i < 4; ++i) s[i] = a.v[i] + a.v[i + 4];
    return (s[0] + s[2]) + (s[1] + s[3]);
  }
  static float hmax(V a) {
    float m = a.v[0];
    for (int i = 1; i < 8; ++i) m = std::max(m, a.v[i]);
    return m;
  }
  static V reduce8(const V* x) { return map([&](int i) { return hsum(x[i]); }); }
};

inline V operator+(V a, V b) { return V::map([&](int i) { return a.v[i] + b.v[i]; }); }
inline V operator-(V a, V b) { return V::map([&](int i) { return a.v[i] - b.v[i]; }); }
inline V operator*(V a, V b) { return V::map([&](int i) { return a.v[i] * b.v[i]; }); }
inline V operator/(V a, V b) { return V::map([&](int i) { return a.v[i] / b.v[i]; }); }

void k_f16_to_f32(const uint16_t* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = fp16_to_fp32(x[i]);
}

#include "backend/cpu/f32_kernels.inc"

}  // namespace

const F32Kernels& scalar_f32_kernels() { return kKernels; }

const F32Kernels& f32_kernels(DotIsa isa) {
#if defined(__x86_64__) || defined(_M_X64)
  static const bool avx2 = dot_isa_available(DotIsa::Avx2);
  if (isa != DotIsa::Scalar && avx2) return avx2_f32_kernels();  // Avx512 runs the AVX2 float kernels
#endif
  (void)isa;
  return kKernels;
}

const F32Kernels& f32_kernels() {
  static const F32Kernels& active = f32_kernels(detect_dot_isa());
  return active;
}

}  // namespace hyspec::cpu
