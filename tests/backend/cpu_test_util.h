// Helpers of the CPU kernel tests: the float-kernel paths this machine can run, and random inputs.
#pragma once
#include <random>
#include <vector>

#include "backend/cpu/quant_dot.h"

namespace hyspec::cpu::test {

// Scalar always; AVX2 where the CPU has it (the AVX-512 path reuses the AVX2 float kernels).
inline std::vector<DotIsa> float_kernel_isas() {
  std::vector<DotIsa> v = {DotIsa::Scalar};
  if (dot_isa_available(DotIsa::Avx2)) v.push_back(DotIsa::Avx2);
  return v;
}
inline const char* isa_name(DotIsa isa) { return isa == DotIsa::Avx2 ? "avx2" : "scalar"; }

inline std::vector<float> randn(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

}  // namespace hyspec::cpu::test
