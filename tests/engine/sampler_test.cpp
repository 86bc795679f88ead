#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

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

// The definition, by a full sort: candidates by logit descending (ties by id), top-k, softmax with
// temperature, min-p, the shortest prefix reaching top-p, renormalised.
std::map<int32_t, double> reference_distribution(const std::vector<float>& l, const SamplingParams& sp) {
  std::vector<int32_t> ids(l.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
  if (sp.top_k > 0 && static_cast<size_t>(sp.top_k) < ids.size()) ids.resize(sp.top_k);
  std::vector<double> p;
  double sum = 0;
  for (int32_t id : ids) p.push_back(std::exp(double(l[id] - l[ids[0]]) / sp.temperature)), sum += p.back();
  for (double& v : p) v /= sum;
  size_t n = ids.size();
  if (sp.min_p > 0) n = std::count_if(p.begin(), p.end(), [&](double v) { return v >= sp.min_p * p[0]; });
  if (sp.top_p < 1) {
    double cum = 0;
    size_t m = 0;
    while (m < n) {
      cum += p[m++];
      if (cum >= sp.top_p) break;
    }
    n = m;
  }
  double kept = 0;
  for (size_t i = 0; i < n; ++i) kept += p[i];
  std::map<int32_t, double> out;
  for (size_t i = 0; i < n; ++i) out[ids[i]] = p[i] / kept;
  return out;
}

// A Qwen3.5-sized vocabulary, peaked and flat: the distribution keeps the same tokens with the same
// probabilities as the definition, and is best-first whenever top-k or top-p truncates.
TEST(Sampler, LargeVocabularyMatchesTheDefinition) {
  std::mt19937 rng(5);
  for (const float spread : {1.0f, 6.0f}) {
    std::vector<float> l(248320);
    std::normal_distribution<float> d(0.0f, spread);
    for (auto& v : l) v = d(rng);
    l[777] = l[778] = 4.0f * spread;  // a tie at the top
    struct Case {
      float temperature, top_p, min_p;
      int top_k;
    };
    for (const Case c : {Case{0.7f, 1.0f, 0.0f, 0}, Case{0.7f, 0.8f, 0.0f, 0}, Case{1.0f, 0.95f, 0.05f, 0},
                         Case{0.7f, 1.0f, 0.1f, 0}, Case{0.7f, 0.8f, 0.0f, 20}, Case{1.3f, 0.5f, 0.0f, 1000},
                         Case{0.5f, 0.0f, 0.0f, 0}}) {
      SamplingParams sp;
      sp.temperature = c.temperature, sp.top_p = c.top_p, sp.min_p = c.min_p, sp.top_k = c.top_k;
      const std::string what = fmt::format("spread {} T {} top_p {} min_p {} top_k {}", spread, c.temperature, c.top_p,
                                           c.min_p, c.top_k);
      std::vector<TokenProb> got;
      Sampler(sp).distribution(l.data(), static_cast<int>(l.size()), {}, got);
      const auto want = reference_distribution(l, sp);
      ASSERT_EQ(got.size(), want.size()) << what;
      double total = 0;
      for (const auto& t : got) {
        ASSERT_TRUE(want.count(t.id)) << what << ": token " << t.id;
        EXPECT_NEAR(t.p, want.at(t.id), 1e-6 + 1e-4 * want.at(t.id)) << what << ": token " << t.id;
        total += t.p;
      }
      EXPECT_NEAR(total, 1.0, 1e-5) << what;
      if (c.top_k > 0 || c.top_p < 1.0f)
        for (size_t i = 1; i < got.size(); ++i)
          ASSERT_TRUE(l[got[i - 1].id] > l[got[i].id] || (l[got[i - 1].id] == l[got[i].id] && got[i - 1].id < got[i].id))
              << what << ": not best-first at " << i;
    }
  }
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
