// CPU dot kernels (backend/cpu/quant_dot.h) for every dequantizable weight type.
//
// Oracles:
// - dequantize_row(w) · x in double, within the activation-quantization bound of the type's family;
// - dequantize_row(w) · x̂ in double, where x̂ is the prepared activation decoded back to floats:
//   this isolates the kernel (only float rounding remains), so it catches small indexing errors the
//   looser quantization bound could hide;
// - the fixture blocks with gguf-py's dequantization (../shared/fixtures/quants), independent of ours;
// - the AVX2 and scalar paths against each other (both run whatever the machine's default is).
#include "backend/cpu/quant_dot.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/quant_dot_kernels.h"
#include "common/fixtures.h"
#include "format/quants.h"
#include "util/half.h"

namespace hyspec::cpu {
namespace {

const GgmlType kTypes[] = {
    GgmlType::F32,    GgmlType::F16,     GgmlType::BF16,   GgmlType::Q4_0,    GgmlType::Q4_1,   GgmlType::Q5_0,
    GgmlType::Q5_1,   GgmlType::Q8_0,    GgmlType::Q2_K,   GgmlType::Q3_K,    GgmlType::Q4_K,   GgmlType::Q5_K,
    GgmlType::Q6_K,   GgmlType::IQ1_S,   GgmlType::IQ1_M,  GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ2_S,
    GgmlType::IQ3_XXS, GgmlType::IQ3_S,  GgmlType::IQ4_NL, GgmlType::IQ4_XS,  GgmlType::MXFP4,
};

std::string type_name(GgmlType t) { return std::string(ggml_type_name(t)); }

bool uses_q8_1(GgmlType t) { return t == GgmlType::Q4_1 || t == GgmlType::Q5_1; }

// Activations with uneven block magnitudes (as real hidden states have), one all-zero block per
// 2048 values (the amax == 0 path) and occasional outliers.
std::vector<float> random_activation(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> magnitude(0.05f, 4.0f);
  std::vector<float> x(static_cast<size_t>(n));
  float block_scale = 1.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (i % 32 == 0) block_scale = magnitude(rng);
    x[i] = normal(rng) * block_scale;
    if (rng() % 97 == 0) x[i] *= 8.0f;
    if (i % 2048 >= 256 && i % 2048 < 512) x[i] = 0.0f;  // one zero 256-block (hence 32-blocks too)
  }
  return x;
}

void put_f16(uint8_t* p, float v) {
  const uint16_t h = fp32_to_fp16(v);
  std::memcpy(p, &h, 2);
}

// A random weight row: quantize_row of random floats where hyspec quantizes the type, else random
// bytes (every bit pattern of codes, grid indices and signs is valid) with the fp16 scale fields
// set to finite values of either sign.
std::vector<uint8_t> random_weight_row(GgmlType t, int64_t n, std::mt19937& rng) {
  const GgmlTypeTraits tr = ggml_type_traits(t);
  const size_t bytes = static_cast<size_t>(n / tr.block_size) * tr.type_size;
  std::vector<uint8_t> w(bytes);
  if (t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16 || t == GgmlType::Q8_0 || t == GgmlType::Q4_0) {
    std::normal_distribution<float> normal(0.0f, 0.02f);
    std::vector<float> f(static_cast<size_t>(n));
    for (float& v : f) v = normal(rng);
    EXPECT_TRUE(quantize_row(t, f.data(), w.data(), n).is_ok());
    return w;
  }
  for (uint8_t& b : w) b = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> scale(0.001f, 0.01f);
  auto random_scale = [&] { return rng() % 2 ? scale(rng) : -scale(rng); };
  std::vector<size_t> f16_fields;  // byte offsets of fp16 scales within a block
  switch (t) {
    case GgmlType::Q4_1: case GgmlType::Q5_1: case GgmlType::Q4_K: case GgmlType::Q5_K: f16_fields = {0, 2}; break;
    case GgmlType::Q2_K: f16_fields = {80, 82}; break;
    case GgmlType::Q3_K: f16_fields = {108}; break;
    case GgmlType::Q6_K: f16_fields = {208}; break;
    default: f16_fields = {0}; break;  // Q5_0, IQ4_NL, IQ4_XS, IQ2_*, IQ3_*, IQ1_S: d first
  }
  for (size_t b = 0; b < bytes / tr.type_size; ++b) {
    uint8_t* blk = w.data() + b * tr.type_size;
    if (t == GgmlType::MXFP4) {
      blk[0] = static_cast<uint8_t>(118 + rng() % 12);  // e8m0 exponent: 2^-9 .. 2^2
    } else if (t == GgmlType::IQ1_M) {
      // The fp16 super-scale is spread over the top nibbles of the four u16 scale words.
      const uint16_t d = fp32_to_fp16(random_scale());
      for (int i = 0; i < 4; ++i) {
        uint16_t sc;
        std::memcpy(&sc, blk + 48 + 2 * i, 2);
        sc = static_cast<uint16_t>((sc & 0x0FFF) | (((d >> (4 * i)) & 0xF) << 12));
        std::memcpy(blk + 48 + 2 * i, &sc, 2);
      }
    } else {
      for (size_t off : f16_fields) put_f16(blk + off, random_scale());
    }
  }
  return w;
}

std::vector<float> dequantize(GgmlType t, const void* w, int64_t n) {
  std::vector<float> f(static_cast<size_t>(n));
  EXPECT_TRUE(dequantize_row(t, w, f.data(), n).is_ok());
  return f;
}

std::vector<uint8_t> prepare(GgmlType t, const std::vector<float>& x) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<uint8_t> act(prepared_row_bytes(t, n) + 64);  // +64: sentinel for overruns
  std::memset(act.data() + act.size() - 64, 0xAB, 64);
  prepare_activation_row(t, x.data(), n, act.data());
  for (size_t i = act.size() - 64; i < act.size(); ++i) EXPECT_EQ(act[i], 0xAB) << "prepare wrote past the row";
  return act;
}

// The prepared activation decoded back to values x̂ (what the kernels actually multiply).
std::vector<double> decode_prepared(GgmlType t, const std::vector<uint8_t>& act, int64_t n) {
  std::vector<double> xh(static_cast<size_t>(n));
  const uint32_t bs = ggml_type_traits(t).block_size;
  for (int64_t i = 0; i < n; ++i) {
    if (bs == 1) {
      xh[i] = reinterpret_cast<const float*>(act.data())[i];
    } else if (bs == 256) {
      const auto& b = reinterpret_cast<const ActQ8_K*>(act.data())[i / 256];
      xh[i] = static_cast<double>(b.d) * b.qs[i % 256];
    } else if (uses_q8_1(t)) {
      const auto& b = reinterpret_cast<const ActQ8_1*>(act.data())[i / 32];
      xh[i] = static_cast<double>(fp16_to_fp32(b.d)) * b.qs[i % 32];
    } else {
      const auto& b = reinterpret_cast<const ActQ8_0*>(act.data())[i / 32];
      xh[i] = static_cast<double>(fp16_to_fp32(b.d)) * b.qs[i % 32];
    }
  }
  return xh;
}

struct Expected {
  double value = 0;      // oracle
  double tolerance = 0;  // allowed |vec_dot - value|
};

// Oracle against x̂, tolerance for float rounding only (1e-5 of Σ|w x̂|). Q4_1/Q5_1 apply their
// offset m through the activation's s = fp16(d Σq) rather than Σ x̂ = fp16(d) Σq; the oracle does
// the same, as llama.cpp's dot does.
Expected against_prepared(GgmlType t, const uint8_t* w, const std::vector<float>& wf,
                          const std::vector<uint8_t>& act, int64_t n) {
  const std::vector<double> xh = decode_prepared(t, act, n);
  Expected e;
  double magnitude = 0;
  for (int64_t i = 0; i < n; ++i) {
    e.value += static_cast<double>(wf[i]) * xh[i];
    magnitude += std::fabs(static_cast<double>(wf[i]) * xh[i]);
  }
  if (uses_q8_1(t)) {
    const size_t block_bytes = ggml_type_traits(t).type_size;
    for (int64_t b = 0; b < n / 32; ++b) {
      uint16_t m_bits;
      std::memcpy(&m_bits, w + b * block_bytes + 2, 2);  // Q4_1 / Q5_1: d, then m
      const double m = fp16_to_fp32(m_bits);
      const auto& a = reinterpret_cast<const ActQ8_1*>(act.data())[b];
      double sum_xh = 0;
      for (int j = 0; j < 32; ++j) sum_xh += xh[32 * b + j];
      e.value += m * (fp16_to_fp32(a.s) - sum_xh);
      magnitude += std::fabs(m * fp16_to_fp32(a.s));
    }
  }
  e.tolerance = 1e-5 * magnitude + 1e-30;
  return e;
}

// Oracle against the original x, with the activation-quantization bound of the family:
// - F32/F16/BF16: x is used as is; bound 0.
// - Q8_0 activations (Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4), per 32-block with d = amax/127:
//   |x - x̂| <= d/2 (rounding to the grid) + (|x| + d/2) 2^-11 (d stored as fp16).
// - Q8_1 (Q4_1, Q5_1): as Q8_0, plus the offset term |m| |s - Σx̂| <= |m| 2^-10 (Σ|x| + 16 d).
// - Q8_K (K and IQ 256-block types), d = amax/127 in f32: |x - x̂| <= d/2 (+ 1e-6 |x| for 1/iscale).
// Bound = Σ |w_i| |x_i - x̂_i|max (+ offset terms) + the float-rounding allowance 1e-5 Σ|w x|.
Expected against_original(GgmlType t, const uint8_t* w, const std::vector<float>& wf, const std::vector<float>& x) {
  const int64_t n = static_cast<int64_t>(x.size());
  const uint32_t bs = ggml_type_traits(t).block_size;
  Expected e;
  double magnitude = 0, bound = 0;
  for (int64_t b0 = 0; b0 < n; b0 += bs) {
    double amax = 0, sum_abs_x = 0;
    for (uint32_t j = 0; j < bs; ++j) {
      amax = std::fmax(amax, std::fabs(x[b0 + j]));
      sum_abs_x += std::fabs(x[b0 + j]);
    }
    const double d = amax / 127.0;
    for (uint32_t j = 0; j < bs; ++j) {
      const double wi = wf[b0 + j], xi = x[b0 + j];
      e.value += wi * xi;
      magnitude += std::fabs(wi * xi);
      if (bs == 32) bound += std::fabs(wi) * (d / 2 + (std::fabs(xi) + d / 2) * 0x1p-11);
      if (bs == 256) bound += std::fabs(wi) * (d / 2 + 1e-6 * std::fabs(xi));
    }
    if (uses_q8_1(t)) {
      uint16_t m_bits;
      std::memcpy(&m_bits, w + (b0 / 32) * ggml_type_traits(t).type_size + 2, 2);
      bound += std::fabs(fp16_to_fp32(m_bits)) * 0x1p-10 * (sum_abs_x + 16 * d);
    }
  }
  e.tolerance = bound + 1e-5 * magnitude + 1e-30;
  return e;
}

std::vector<DotIsa> available_isas() {
  std::vector<DotIsa> isas = {DotIsa::Scalar};
  if (dot_isa_available(DotIsa::Avx2)) isas.push_back(DotIsa::Avx2);
  if (dot_isa_available(DotIsa::Avx512)) isas.push_back(DotIsa::Avx512);
  return isas;
}

const char* isa_name(DotIsa isa) { return isa == DotIsa::Avx512 ? "avx512" : isa == DotIsa::Avx2 ? "avx2" : "scalar"; }

class QuantDotType : public ::testing::TestWithParam<GgmlType> {};

TEST_P(QuantDotType, MatchesDequantizedDotOnRandomRows) {
  const GgmlType t = GetParam();
  constexpr int64_t n = 4096;
  std::mt19937 rng(1234 + static_cast<uint32_t>(t));
  for (int row = 0; row < 8; ++row) {
    const std::vector<uint8_t> w = random_weight_row(t, n, rng);
    const std::vector<float> wf = dequantize(t, w.data(), n);
    const std::vector<float> x = random_activation(n, rng);
    const std::vector<uint8_t> act = prepare(t, x);
    const Expected tight = against_prepared(t, w.data(), wf, act, n);
    const Expected loose = against_original(t, w.data(), wf, x);
    for (DotIsa isa : available_isas()) {
      const double got = vec_dot_on(isa, t, w.data(), act.data(), n);
      EXPECT_NEAR(got, tight.value, tight.tolerance) << type_name(t) << " " << isa_name(isa) << " row " << row << " vs x̂";
      EXPECT_NEAR(got, loose.value, loose.tolerance) << type_name(t) << " " << isa_name(isa) << " row " << row << " vs x";
    }
  }
}

TEST_P(QuantDotType, MatchesGgufPyDequantizationOfFixtureBlocks) {
  const GgmlType t = GetParam();
  if (t == GgmlType::F32) GTEST_SKIP() << "no F32 fixture (nothing to dequantize)";
  const std::string name = type_name(t);
  const std::string blocks = test::read_text_file(test::fixture_path("quants/" + name + ".blocks"));
  const std::vector<float> wf = test::read_f32_file(test::fixture_path("quants/" + name + ".f32"));
  const int64_t n = static_cast<int64_t>(wf.size());
  ASSERT_EQ(blocks.size(), ggml_row_bytes(t, n).value());
  const auto* w = reinterpret_cast<const uint8_t*>(blocks.data());
  std::mt19937 rng(99);
  for (int trial = 0; trial < 4; ++trial) {
    const std::vector<float> x = random_activation(n, rng);
    const std::vector<uint8_t> act = prepare(t, x);
    const Expected tight = against_prepared(t, w, wf, act, n);
    const Expected loose = against_original(t, w, wf, x);
    for (DotIsa isa : available_isas()) {
      const double got = vec_dot_on(isa, t, w, act.data(), n);
      EXPECT_NEAR(got, tight.value, tight.tolerance) << name << " " << isa_name(isa) << " vs x̂";
      EXPECT_NEAR(got, loose.value, loose.tolerance) << name << " " << isa_name(isa) << " vs x";
    }
  }
}

TEST_P(QuantDotType, Avx2AgreesWithScalar) {
  if (!dot_isa_available(DotIsa::Avx2)) GTEST_SKIP() << "CPU without AVX2/FMA/F16C";
  const GgmlType t = GetParam();
  const int64_t block = ggml_type_traits(t).block_size;
  std::mt19937 rng(777 + static_cast<uint32_t>(t));
  // Lengths with and without a partial 32-wide tail for the float types; whole blocks otherwise.
  const std::vector<int64_t> lengths = block == 1 ? std::vector<int64_t>{1, 7, 33, 4096 + 5}
                                                  : std::vector<int64_t>{block, 3 * block, 4096 + 2 * block};
  for (int64_t n : lengths) {
    const std::vector<uint8_t> w = random_weight_row(t, n, rng);
    const std::vector<float> wf = dequantize(t, w.data(), n);
    const std::vector<uint8_t> act = prepare(t, random_activation(n, rng));
    const Expected e = against_prepared(t, w.data(), wf, act, n);
    const double scalar = vec_dot_on(DotIsa::Scalar, t, w.data(), act.data(), n);
    const double avx2 = vec_dot_on(DotIsa::Avx2, t, w.data(), act.data(), n);
    EXPECT_NEAR(avx2, scalar, e.tolerance) << type_name(t) << " n=" << n;
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, QuantDotType, ::testing::ValuesIn(kTypes),
                         [](const ::testing::TestParamInfo<GgmlType>& info) { return type_name(info.param); });

TEST(QuantDot, SupportsExactlyTheDequantizableTypes) {
  for (uint32_t id = 0; id < 64; ++id) {
    const GgmlTypeTraits tr = ggml_type_traits(id);
    EXPECT_EQ(vec_dot_supported(static_cast<GgmlType>(id)), tr.block_size != 0 && tr.dequantizable) << "type id " << id;
  }
}

TEST(QuantDot, UnsupportedTypeGivesNanAndNoPreparedBytes) {
  const uint8_t zeros[292] = {};
  EXPECT_TRUE(std::isnan(vec_dot(GgmlType::Q8_K, zeros, zeros, 256)));
  EXPECT_EQ(prepared_row_bytes(GgmlType::Q8_K, 256), 0u);
}

TEST(QuantDot, PreparedRowBytesFollowTheActivationFormat) {
  EXPECT_EQ(prepared_row_bytes(GgmlType::F16, 4096), 4096u * 4);
  EXPECT_EQ(prepared_row_bytes(GgmlType::Q4_0, 4096), 128u * 34);  // Q8_0
  EXPECT_EQ(prepared_row_bytes(GgmlType::Q5_1, 4096), 128u * 36);  // Q8_1
  EXPECT_EQ(prepared_row_bytes(GgmlType::IQ4_NL, 4096), 128u * 34);
  EXPECT_EQ(prepared_row_bytes(GgmlType::Q4_K, 4096), 16u * 292);  // Q8_K
  EXPECT_EQ(prepared_row_bytes(GgmlType::IQ2_XXS, 4096), 16u * 292);
}

TEST(QuantDot, Q8_0ActivationIsQuantizeRowQ8_0) {
  // llama.cpp's vec_dot_type for Q4_0/Q8_0 is Q8_0 from quantize_row_q8_0: same bytes.
  std::mt19937 rng(5);
  const std::vector<float> x = random_activation(1024, rng);
  std::vector<uint8_t> expected(static_cast<size_t>(ggml_row_bytes(GgmlType::Q8_0, 1024).value()));
  ASSERT_TRUE(quantize_row(GgmlType::Q8_0, x.data(), expected.data(), 1024).is_ok());
  std::vector<uint8_t> act = prepare(GgmlType::Q4_0, x);
  act.resize(expected.size());
  EXPECT_EQ(act, expected);
}

TEST(QuantDot, Q8_0ActivationIsBitIdenticalOnEveryPathIncludingTies) {
  // Blocks with amax = 127 * 2^e have d = 2^e exactly, so (k + 1/2) * 2^e lands on exact ties, which
  // quantize_row rounds away from zero (vroundps only rounds to even); e = -20 gives an fp16
  // subnormal d. Other blocks span magnitudes from 1e-6 to 1e4.
  std::mt19937 rng(17);
  std::vector<float> x = random_activation(8192, rng);
  std::uniform_int_distribution<int> code(-126, 126);
  std::uniform_real_distribution<float> log_mag(-6.0f, 4.0f);
  const int exps[] = {-20, -3, 0, 5};
  for (int b = 0; b < 256; ++b) {
    float* blk = x.data() + 32 * b;
    if (b % 3 == 0) {
      const float unit = std::ldexp(1.0f, exps[(b / 3) % 4]);
      blk[0] = (b % 2 ? -127.0f : 127.0f) * unit;
      for (int j = 1; j < 32; ++j)
        blk[j] = (static_cast<float>(code(rng)) + (j % 3 == 0 ? 0.5f : j % 3 == 1 ? -0.5f : 0.25f)) * unit;
    } else if (b % 3 == 1) {
      const float mag = std::pow(10.0f, log_mag(rng));
      for (int j = 0; j < 32; ++j) blk[j] *= mag;
    }
  }
  // Just below ties in a scale-1 block: must round down (a naive floor(x + 0.5) rounds 0.49999997 up).
  x[288] = 127.0f;
  x[300] = 0.49999997f;
  x[301] = -0.49999997f;
  x[302] = 2.4999998f;
  std::fill(x.begin() + 320, x.begin() + 352, 0.0f);  // an all-zero block: d = 0, codes 0
  for (int64_t n : {int64_t{8192}, int64_t{128}, int64_t{32}}) {  // groups of 8 blocks, fewer, one
    std::vector<uint8_t> expected(static_cast<size_t>(ggml_row_bytes(GgmlType::Q8_0, n).value()));
    ASSERT_TRUE(quantize_row(GgmlType::Q8_0, x.data(), expected.data(), n).is_ok());
    for (DotIsa isa : available_isas()) {
      std::vector<uint8_t> act(prepared_row_bytes(GgmlType::Q8_0, n));
      prepare_activation_row_on(isa, GgmlType::Q8_0, x.data(), n, act.data());
      EXPECT_EQ(act, expected) << isa_name(isa) << " n=" << n;
    }
  }
}

TEST(QuantDot, Q8_KActivationIsBitIdenticalOnEveryPath) {
  // Random magnitudes, a zero block, blocks whose extreme magnitude appears with both signs (the
  // first occurrence sets the sign of d), and exact ties for the half-to-even rounding.
  std::mt19937 rng(23);
  const int64_t n = 256 * 12;
  std::vector<float> x = random_activation(n, rng);
  std::uniform_real_distribution<float> log_mag(-6.0f, 4.0f);
  for (int b = 0; b < 12; ++b) {
    float* blk = x.data() + 256 * b;
    const float mag = std::pow(10.0f, log_mag(rng));
    for (int j = 0; j < 256; ++j) blk[j] *= mag;
    if (b % 4 == 1) {
      blk[40] = -1000.0f * mag;
      blk[200] = 1000.0f * mag;
    }
    if (b % 4 == 2) {  // iscale = -1: codes are -x, ties at .5
      for (int j = 0; j < 256; ++j) blk[j] = static_cast<float>(static_cast<int>(rng() % 200) - 100) + 0.5f;
      blk[7] = 127.0f;
    }
  }
  std::fill(x.begin() + 256 * 3, x.begin() + 256 * 4, 0.0f);
  std::vector<uint8_t> want(prepared_row_bytes(GgmlType::Q4_K, n));
  prepare_activation_row_on(DotIsa::Scalar, GgmlType::Q4_K, x.data(), n, want.data());
  for (DotIsa isa : available_isas()) {
    std::vector<uint8_t> act(want.size());
    prepare_activation_row_on(isa, GgmlType::Q4_K, x.data(), n, act.data());
    EXPECT_EQ(act, want) << isa_name(isa);
  }
}

// vec_dot_tile == vec_dot for every (row, column) pair, on every path, for shapes that leave
// partial tiles in both directions; Q8_0 has a tile kernel, Q4_K goes through the per-pair loop.
TEST(QuantDot, TileEqualsDotsForEveryPairAndPartialTile) {
  struct Case {
    GgmlType t;
    int64_t n;  // Q8_0: one block, and an odd count of blocks (pairs + a lone block on AVX-512)
  };
  for (const Case tc : {Case{GgmlType::Q8_0, 32}, Case{GgmlType::Q8_0, 160}, Case{GgmlType::Q4_K, 512},
                        Case{GgmlType::F32, 40}}) {
    const GgmlType t = tc.t;
    const int64_t n = tc.n;
    std::mt19937 rng(41 + static_cast<uint32_t>(t) + static_cast<uint32_t>(n));
    for (int rows : {1, 3, 4, 9}) {
      for (int cols : {1, 2, 5, 8}) {
        const size_t wb = static_cast<size_t>(ggml_row_bytes(t, n).value()), ab = prepared_row_bytes(t, n);
        std::vector<uint8_t> w, a;
        for (int r = 0; r < rows; ++r) {
          const std::vector<uint8_t> row = random_weight_row(t, n, rng);
          w.insert(w.end(), row.begin(), row.end());
        }
        for (int c = 0; c < cols; ++c) {
          const std::vector<uint8_t> act = prepare(t, random_activation(n, rng));
          a.insert(a.end(), act.begin(), act.begin() + static_cast<std::ptrdiff_t>(ab));
        }
        for (DotIsa isa : available_isas()) {
          const int64_t stride = rows + 3;  // output rows wider than the tile
          std::vector<float> out(static_cast<size_t>(cols * stride), -1.0f);
          vec_dot_tile_on(isa, t, w.data(), wb, a.data(), ab, n, rows, cols, out.data(), stride);
          for (int c = 0; c < cols; ++c) {
            for (int r = 0; r < rows; ++r) {
              const double want = vec_dot_on(isa, t, w.data() + r * wb, a.data() + c * ab, n);
              EXPECT_NEAR(out[c * stride + r], want, 1e-5 * (1 + std::fabs(want)))
                  << type_name(t) << " " << isa_name(isa) << " rows " << rows << " cols " << cols << " at " << r << "," << c;
            }
            for (int64_t r = rows; r < stride; ++r) EXPECT_EQ(out[c * stride + r], -1.0f) << "wrote outside the tile";
          }
        }
      }
    }
  }
}

TEST(QuantDot, Q8_1ActivationRoundsHalfAwayFromZeroAndCarriesTheScaledSum) {
  std::vector<float> x(32, 0.0f);
  x[0] = 127.0f;  // amax 127 -> d = 1, codes = round(x)
  x[1] = 2.5f;
  x[2] = -2.5f;
  x[3] = 0.49f;
  const std::vector<uint8_t> act = prepare(GgmlType::Q4_1, x);
  const auto& b = *reinterpret_cast<const ActQ8_1*>(act.data());
  EXPECT_EQ(fp16_to_fp32(b.d), 1.0f);
  EXPECT_EQ(b.qs[0], 127);
  EXPECT_EQ(b.qs[1], 3);  // roundf: half away from zero
  EXPECT_EQ(b.qs[2], -3);
  EXPECT_EQ(b.qs[3], 0);
  EXPECT_EQ(fp16_to_fp32(b.s), 127.0f);  // d * (127 + 3 - 3 + 0)
}

TEST(QuantDot, Q8_KActivationUsesTheSignedExtremeAndRoundsHalfToEven) {
  std::vector<float> x(256, 0.0f);
  x[0] = 127.0f;  // positive extreme: iscale = -127/127 = -1, so d = -1 and codes = -x
  x[1] = 2.5f;
  x[2] = 3.5f;
  x[17] = -1.0f;
  const std::vector<uint8_t> act = prepare(GgmlType::Q4_K, x);
  const auto& b = *reinterpret_cast<const ActQ8_K*>(act.data());
  EXPECT_EQ(b.d, -1.0f);
  EXPECT_EQ(b.qs[0], -127);
  EXPECT_EQ(b.qs[1], -2);  // -2.5 to even
  EXPECT_EQ(b.qs[2], -4);  // -3.5 to even
  EXPECT_EQ(b.qs[17], 1);
  EXPECT_EQ(b.bsums[0], -127 - 2 - 4);
  EXPECT_EQ(b.bsums[1], 1);
  for (int g = 2; g < 16; ++g) EXPECT_EQ(b.bsums[g], 0);
}

TEST(QuantDot, EnvironmentCapsThePath) {
  const char* old = std::getenv("HYSPEC_CPU_ISA");
  const std::string saved = old ? old : "";
  const DotIsa best = dot_isa_available(DotIsa::Avx512) ? DotIsa::Avx512
                      : dot_isa_available(DotIsa::Avx2) ? DotIsa::Avx2
                                                        : DotIsa::Scalar;
  setenv("HYSPEC_CPU_ISA", "scalar", 1);
  EXPECT_EQ(detect_dot_isa(), DotIsa::Scalar);
  setenv("HYSPEC_CPU_ISA", "avx2", 1);
  EXPECT_EQ(detect_dot_isa(), best == DotIsa::Avx512 ? DotIsa::Avx2 : best);
  unsetenv("HYSPEC_CPU_ISA");
  EXPECT_EQ(detect_dot_isa(), best);
  if (old) setenv("HYSPEC_CPU_ISA", saved.c_str(), 1);
  EXPECT_STREQ(vec_dot_isa(), isa_name(detect_dot_isa()));
}

}  // namespace
}  // namespace hyspec::cpu
