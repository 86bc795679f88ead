#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <cmath>

namespace hyspec {
namespace {

TEST(Sampler, GreedyIsArgmaxAndNeedsNoRandomness) {
  SamplingParams p;
  Sampler s(p);
  const float logits[] = {0.1f, 2.0f, -1.0f, 1.9f};
  std::vector<TokenProb> d;
  s.distribution(logits, 4, {}, d);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].id, 1);
  EXPECT_EQ(s.sample(logits, 4, {}), 1);
}

TEST(Sampler, TemperatureSoftmaxTopKTopPMinP) {
  const float logits[] = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  std::vector<TokenProb> d;
  SamplingParams p;
  p.temperature = 1.0f;
  Sampler(p).distribution(logits, 4, {}, d);
  ASSERT_EQ(d.size(), 4u);
  EXPECT_NEAR(d[0].p, 0.5f, 1e-6);
  EXPECT_NEAR(d[3].p, 0.05f, 1e-6);
  p.top_k = 2;
  Sampler(p).distribution(logits, 4, {}, d);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_NEAR(d[0].p, 0.625f, 1e-6);
  p.top_k = 0;
  p.top_p = 0.75f;  // 0.5 + 0.3 passes 0.75
  Sampler(p).distribution(logits, 4, {}, d);
  EXPECT_EQ(d.size(), 2u);
  p.top_p = 1.0f;
  p.min_p = 0.2f;  // keeps p >= 0.1
  Sampler(p).distribution(logits, 4, {}, d);
  EXPECT_EQ(d.size(), 3u);
  p.min_p = 0;
  p.temperature = 0.5f;  // squares then renormalises
  Sampler(p).distribution(logits, 4, {}, d);
  const double z = 0.25 + 0.09 + 0.0225 + 0.0025;
  EXPECT_NEAR(d[0].p, 0.25 / z, 1e-5);
}

TEST(Sampler, PenaltiesApplyToRecentTokensOnly) {
  const float logits[] = {2.0f, 1.0f, -1.0f};
  SamplingParams p;
  p.repeat_penalty = 4.0f;
  p.penalty_last_n = 2;
  std::vector<TokenProb> d;
  const std::vector<int32_t> history = {1, 0, 2};  // token 1 is outside the last 2
  Sampler(p).distribution(logits, 3, history, d);
  EXPECT_EQ(d[0].id, 1);  // 2.0/4 = 0.5 < 1.0
  p.repeat_penalty = 1.0f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 1.0f;
  p.penalty_last_n = -1;
  const std::vector<int32_t> h2 = {0, 0};  // 2.0 - 0.5 - 2*1.0 = -0.5
  Sampler(p).distribution(logits, 3, h2, d);
  EXPECT_EQ(d[0].id, 1);
}

TEST(Sampler, SamplingFollowsTheDistribution) {
  const float logits[] = {std::log(0.7f), std::log(0.2f), std::log(0.1f)};
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 42;
  Sampler s(p);
  int counts[3] = {};
  const int n = 20000;
  for (int i = 0; i < n; ++i) ++counts[s.sample(logits, 3, {})];
  EXPECT_NEAR(counts[0] / double(n), 0.7, 0.015);
  EXPECT_NEAR(counts[1] / double(n), 0.2, 0.015);
}

TEST(Sampler, SameSeedSameStream) {
  const float logits[] = {0.f, 0.f, 0.f, 0.f};
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 7;
  Sampler a(p), b(p);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.sample(logits, 4, {}), b.sample(logits, 4, {}));
}

}  // namespace
}  // namespace hyspec
