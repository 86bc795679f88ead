// The element-by-element CUDA weight decoders (src/backend/cuda/quant_blocks.cuh: Q4_1, Q5_0, Q5_1,
// IQ4_NL, Q2_K, Q3_K, IQ4_XS and the IQ1/IQ2/IQ3 lattice types) run on the host: value() must be format/quants' dequantization bit for
// bit (it is gguf-py's), and chunk() its f16 rounding, on the quants fixture's blocks (made by gguf-py)
// and on random bytes. Compiled by nvcc, needs no GPU: CI runs it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/quant_blocks.cuh"
#include "common/fixtures.h"
#include "format/ggml_types.h"
#include "format/iq_tables.h"
#include "format/quants.h"

namespace hyspec::cuda {
namespace {

bool same(float a, float b) {
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y || (std::isnan(a) && std::isnan(b));
}

template <class T>
void expect_decodes_as_reference(GgmlType type, const std::vector<uint8_t>& bytes, const std::string& what) {
  ASSERT_EQ(bytes.size() % T::kBlockBytes, 0u) << what;
  const int64_t n = static_cast<int64_t>(bytes.size() / T::kBlockBytes) * T::kBlock;
  std::vector<float> want(static_cast<size_t>(n));
  ASSERT_TRUE(dequantize_row(type, bytes.data(), want.data(), n).is_ok()) << what;
  int bad = 0;
  for (int64_t i = 0; i < n && bad < 5; ++i) {
    const float got = T::value(bytes.data(), i);
    if (!same(got, want[i])) ++bad, ADD_FAILURE() << what << " value(" << i << ") = " << got << ", want " << want[i];
  }
  for (int64_t c = 0; c < n / 32 && bad < 5; ++c) {
    half2 a[16];
    T::chunk(bytes.data(), c, a);
    for (int m = 0; m < 16; ++m) {
      uint16_t h[2];
      std::memcpy(h, &a[m], 4);
      for (int k = 0; k < 2; ++k) {
        const float w = want[32 * c + T::perm(2 * m + k)];
        const uint16_t wh = __half_as_ushort(__float2half_rn(w));  // (util/half.h is C++20; nvcc builds C++17)
        if (h[k] != wh && !(std::isnan(w) && std::isnan(__half2float(__ushort_as_half(h[k])))))
          ++bad, ADD_FAILURE() << what << " chunk " << c << " element " << 2 * m + k << ": f16 " << h[k] << ", want " << wh;
      }
    }
  }
}

template <class T>
void check_type(GgmlType type) {
  const std::string name(ggml_type_name(type));
  const std::string fixture = test::read_text_file(test::fixture_path("quants/" + name + ".blocks"));
  expect_decodes_as_reference<T>(type, std::vector<uint8_t>(fixture.begin(), fixture.end()), name + " fixture");
  std::mt19937 rng(7);
  std::vector<uint8_t> random(64 * T::kBlockBytes);
  for (auto& b : random) b = static_cast<uint8_t>(rng());  // f16 fields of every kind, inf and NaN among them
  expect_decodes_as_reference<T>(type, random, name + " random bytes");
}

TEST(QuantBlocksOnHost, Iq4NlCodebookMatchesTheTable) {
  for (int i = 0; i < 16; ++i) EXPECT_EQ(iq4nl_value(i), static_cast<float>(iq::kIq4nlValues[i])) << i;
}

TEST(QuantBlocksOnHost, ElementDecodedTypesEqualTheReferenceDequantization) {
  check_type<TypeQ4_1>(GgmlType::Q4_1);
  check_type<TypeQ5_0>(GgmlType::Q5_0);
  check_type<TypeQ5_1>(GgmlType::Q5_1);
  check_type<TypeIQ4_NL>(GgmlType::IQ4_NL);
  check_type<TypeQ2_K>(GgmlType::Q2_K);
  check_type<TypeQ3_K>(GgmlType::Q3_K);
  check_type<TypeIQ4_XS>(GgmlType::IQ4_XS);
  check_type<TypeIQ2_XXS>(GgmlType::IQ2_XXS);
  check_type<TypeIQ2_XS>(GgmlType::IQ2_XS);
  check_type<TypeIQ2_S>(GgmlType::IQ2_S);
  check_type<TypeIQ3_XXS>(GgmlType::IQ3_XXS);
  check_type<TypeIQ3_S>(GgmlType::IQ3_S);
  check_type<TypeIQ1_S>(GgmlType::IQ1_S);
  check_type<TypeIQ1_M>(GgmlType::IQ1_M);
}

}  // namespace
}  // namespace hyspec::cuda
