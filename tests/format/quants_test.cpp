// Dequantization against gguf-py's numpy output (bit-exact), quantization round trips.
#include "format/quants.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/fixtures.h"
#include "util/half.h"

namespace hyspec {
namespace {

std::vector<uint8_t> read_bytes(const std::string& path) {
  const std::string s = test::read_text_file(path);
  return std::vector<uint8_t>(s.begin(), s.end());
}

GgmlType type_named(const std::string& name) {
  for (uint32_t id = 0; id < 64; ++id)
    if (ggml_type_traits(id).block_size != 0 && ggml_type_traits(id).name == name) return static_cast<GgmlType>(id);
  ADD_FAILURE() << "no GGML type named " << name;
  return GgmlType::F32;
}

class DequantFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(DequantFixture, MatchesGgufPyBitForBit) {
  const std::string name = GetParam();
  const nlohmann::json manifest = test::read_json_file(test::fixture_path("quants/manifest.json"));
  const nlohmann::json& m = manifest.at("types").at(name);
  const GgmlType type = type_named(name);
  const GgmlTypeTraits tr = ggml_type_traits(type);
  ASSERT_EQ(static_cast<uint32_t>(type), m.at("ggml_type").get<uint32_t>());
  ASSERT_EQ(tr.block_size, m.at("block_size").get<uint32_t>());
  ASSERT_EQ(tr.type_size, m.at("type_size").get<uint32_t>());
  ASSERT_TRUE(tr.dequantizable);

  const std::vector<uint8_t> blocks = read_bytes(test::fixture_path("quants/" + name + ".blocks"));
  const std::vector<float> expected = test::read_f32_file(test::fixture_path("quants/" + name + ".f32"));
  const int64_t nblocks = m.at("nblocks").get<int64_t>();
  ASSERT_EQ(blocks.size(), static_cast<size_t>(nblocks) * tr.type_size);
  ASSERT_EQ(expected.size(), static_cast<size_t>(nblocks) * tr.block_size);

  std::vector<float> got(expected.size(), std::nanf(""));
  const Status st = dequantize_row(type, blocks.data(), got.data(), static_cast<int64_t>(got.size()));
  ASSERT_TRUE(st.is_ok()) << st.message();
  int mismatches = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(expected[i])) {
      if (++mismatches <= 5)
        ADD_FAILURE() << name << " element " << i << " (block " << i / tr.block_size << "): got " << got[i]
                      << " expected " << expected[i];
    }
  }
  EXPECT_EQ(mismatches, 0);
}

INSTANTIATE_TEST_SUITE_P(AllFixtureTypes, DequantFixture,
                         ::testing::Values("F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K",
                                           "Q4_K", "Q5_K", "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S",
                                           "IQ1_S", "IQ1_M", "IQ4_NL", "IQ4_XS", "MXFP4"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST(Dequant, EveryDequantizableTypeHasAFixture) {
  const nlohmann::json manifest = test::read_json_file(test::fixture_path("quants/manifest.json"));
  int n = 0;
  for (uint32_t id = 0; id < 64; ++id) {
    const GgmlTypeTraits tr = ggml_type_traits(id);
    if (!tr.dequantizable || id == static_cast<uint32_t>(GgmlType::F32)) continue;
    EXPECT_TRUE(manifest.at("types").contains(std::string(tr.name))) << tr.name;
    ++n;
  }
  EXPECT_EQ(n, 22);
}

TEST(Dequant, F32IsACopy) {
  const float src[3] = {1.5f, -0.0f, 3.0e-39f};
  float dst[3];
  ASSERT_TRUE(dequantize_row(GgmlType::F32, src, dst, 3).is_ok());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(std::bit_cast<uint32_t>(dst[i]), std::bit_cast<uint32_t>(src[i]));
}

TEST(Dequant, RejectsTypesWithoutADecoder) {
  uint8_t block[64] = {};
  float out[32];
  const Status q81 = dequantize_row(GgmlType::Q8_1, block, out, 32);
  ASSERT_FALSE(q81.is_ok());
  EXPECT_NE(q81.message().find("Q8_1"), std::string::npos) << q81.message();
  const Status unknown = dequantize_row(static_cast<GgmlType>(99), block, out, 32);
  ASSERT_FALSE(unknown.is_ok());
  EXPECT_NE(unknown.message().find("unknown GGML type id 99"), std::string::npos) << unknown.message();
}

TEST(Dequant, RejectsRowsThatAreNotWholeBlocks) {
  uint8_t block[34] = {};
  float out[64];
  const Status st = dequantize_row(GgmlType::Q8_0, block, out, 33);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("not a multiple of the Q8_0 block size 32"), std::string::npos) << st.message();
  EXPECT_FALSE(dequantize_row(GgmlType::Q8_0, block, out, -32).is_ok());
}

// Re-quantizing a dequantized block reproduces it exactly when the block's extreme code is the
// one the quantizer would choose (Q8_0: |q| = 127 with d > 0; Q4_0: code 0, i.e. -8*d).
TEST(Quantize, Q8_0RequantizesFixtureBlocksToTheSameBytes) {
  const std::vector<uint8_t> blocks = read_bytes(test::fixture_path("quants/Q8_0.blocks"));
  int checked = 0;
  for (size_t off = 0; off + 34 <= blocks.size(); off += 34) {
    const uint8_t* b = blocks.data() + off;
    uint16_t dh;
    std::memcpy(&dh, b, 2);
    int maxq = 0;
    for (int j = 0; j < 32; ++j) maxq = std::max(maxq, std::abs(static_cast<int>(static_cast<int8_t>(b[2 + j]))));
    if (maxq != 127 || !(fp16_to_fp32(dh) > 0.0f)) continue;
    float x[32];
    ASSERT_TRUE(dequantize_row(GgmlType::Q8_0, b, x, 32).is_ok());
    uint8_t again[34];
    ASSERT_TRUE(quantize_row(GgmlType::Q8_0, x, again, 32).is_ok());
    EXPECT_EQ(std::memcmp(again, b, 34), 0) << "block at byte " << off;
    ++checked;
  }
  EXPECT_GE(checked, 3);
}

TEST(Quantize, Q4_0RequantizesFixtureBlocksToTheSameBytes) {
  const std::vector<uint8_t> blocks = read_bytes(test::fixture_path("quants/Q4_0.blocks"));
  int checked = 0;
  for (size_t off = 0; off + 18 <= blocks.size(); off += 18) {
    const uint8_t* b = blocks.data() + off;
    uint16_t dh;
    std::memcpy(&dh, b, 2);
    bool has_zero_code = false;
    for (int j = 0; j < 16; ++j) has_zero_code |= (b[2 + j] & 0x0F) == 0 || (b[2 + j] >> 4) == 0;
    if (!has_zero_code || fp16_to_fp32(dh) == 0.0f) continue;
    float x[32];
    ASSERT_TRUE(dequantize_row(GgmlType::Q4_0, b, x, 32).is_ok());
    uint8_t again[18];
    ASSERT_TRUE(quantize_row(GgmlType::Q4_0, x, again, 32).is_ok());
    EXPECT_EQ(std::memcmp(again, b, 18), 0) << "block at byte " << off;
    ++checked;
  }
  EXPECT_GE(checked, 32);
}

TEST(Quantize, Q8_0RoundsHalfAwayFromZero) {
  // amax = 127 gives d = 1 exactly, so q = round(x): ties go away from zero, not to even.
  float x[32] = {};
  x[0] = 127.0f;
  x[1] = 2.5f;
  x[2] = -2.5f;
  x[3] = 0.5f;
  x[4] = -0.5f;
  x[5] = 1.4999f;
  x[6] = 3.5f;
  uint8_t b[34];
  ASSERT_TRUE(quantize_row(GgmlType::Q8_0, x, b, 32).is_ok());
  uint16_t dh;
  std::memcpy(&dh, b, 2);
  EXPECT_EQ(dh, 0x3C00);  // 1.0 in fp16
  const int8_t expected[7] = {127, 3, -3, 1, -1, 1, 4};
  for (int j = 0; j < 7; ++j) EXPECT_EQ(static_cast<int8_t>(b[2 + j]), expected[j]) << j;
}

TEST(Quantize, AllZeroBlocksQuantizeToZero) {
  const float x[32] = {};
  uint8_t b8[34], b4[18];
  ASSERT_TRUE(quantize_row(GgmlType::Q8_0, x, b8, 32).is_ok());
  ASSERT_TRUE(quantize_row(GgmlType::Q4_0, x, b4, 32).is_ok());
  float y[32];
  ASSERT_TRUE(dequantize_row(GgmlType::Q8_0, b8, y, 32).is_ok());
  for (float v : y) EXPECT_EQ(v, 0.0f);
  ASSERT_TRUE(dequantize_row(GgmlType::Q4_0, b4, y, 32).is_ok());
  for (float v : y) EXPECT_EQ(v, 0.0f);
}

// Round trips of random rows stay within each type's step: half a step for rounding types
// (Q4_0's top code is clipped, a full step) plus the fp16 rounding of the scale (q * d * 2^-11),
// relative 2^-11 for F16 and 2^-8 for BF16.
TEST(Quantize, RoundTripErrorIsWithinTheTypeStep) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  const int64_t n = 32 * 64;
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0}) {
    const size_t bytes = ggml_row_bytes(t, n).value();
    std::vector<uint8_t> q(bytes);
    std::vector<float> y(n);
    ASSERT_TRUE(quantize_row(t, x.data(), q.data(), n).is_ok()) << ggml_type_name(t);
    ASSERT_TRUE(dequantize_row(t, q.data(), y.data(), n).is_ok()) << ggml_type_name(t);
    for (int64_t blk = 0; blk < n / 32; ++blk) {
      float amax = 0.0f;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[blk * 32 + j]));
      for (int j = 0; j < 32; ++j) {
        const int64_t i = blk * 32 + j;
        const float err = std::fabs(y[i] - x[i]);
        float bound = 0.0f;
        switch (t) {
          case GgmlType::F32: bound = 0.0f; break;
          case GgmlType::F16: bound = std::fabs(x[i]) * 0x1p-11f; break;
          case GgmlType::BF16: bound = std::fabs(x[i]) * 0x1p-8f; break;
          case GgmlType::Q8_0: bound = amax / 127.0f * (0.5f + 127.0f * 0x1p-11f + 1e-3f); break;
          default: bound = amax / 8.0f * (1.0f + 8.0f * 0x1p-11f + 1e-3f); break;
        }
        ASSERT_LE(err, bound) << ggml_type_name(t) << " element " << i;
      }
    }
  }
}

TEST(Quantize, RejectsTypesItCannotWrite) {
  const float x[256] = {};
  uint8_t out[512];
  const Status st = quantize_row(GgmlType::Q4_K, x, out, 256);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("Q4_K"), std::string::npos) << st.message();
  EXPECT_FALSE(quantize_row(static_cast<GgmlType>(77), x, out, 32).is_ok());
  EXPECT_FALSE(quantize_row(GgmlType::Q8_0, x, out, 31).is_ok());
}

}  // namespace
}  // namespace hyspec
