#include <gtest/gtest.h>

#include <bit>
#include <cmath>

#include "util/half.h"
#include "util/status.h"
#include "util/thread_pool.h"

namespace hyspec {

TEST(Half, EveryFp16RoundTripsThroughFp32) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = fp16_to_fp32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(fp32_to_fp16(f), h) << std::hex << h;
  }
}

TEST(Half, Fp32ToFp16RoundsToNearestEven) {
  EXPECT_EQ(fp32_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(fp32_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(fp32_to_fp16(1e6f), 0x7c00);
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1.0).
  EXPECT_EQ(fp32_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(fp32_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -24)), 0x0001);   // smallest subnormal
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -26)), 0x0000);   // rounds to zero
}

TEST(Half, Bf16IsTheUpperHalfOfFp32) {
  EXPECT_EQ(bf16_to_fp32(0x3f80), 1.0f);
  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(0x3f808000u)), 0x3f80);  // tie to even
  EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(0x3f818000u)), 0x3f82);
}

TEST(Status, ResultCarriesValueOrMessage) {
  Result<int> ok = 3;
  Result<int> bad = Status::errorf("file {}: broken", "x.gguf");
  ASSERT_TRUE(ok.is_ok());
  EXPECT_EQ(*ok, 3);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.message(), "file x.gguf: broken");
  EXPECT_EQ(bad.status().with_context("loading").message(), "loading: file x.gguf: broken");
}

TEST(ThreadPool, ParallelForCoversEveryIndexOnce) {
  ThreadPool pool(3);
  for (int64_t n : {1, 2, 7, 64, 1000}) {
    std::vector<std::atomic<int>> hits(n);
    for (int rep = 0; rep < 50; ++rep)
      pool.parallel_for(n, [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
      });
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 50);
  }
}

}  // namespace hyspec
