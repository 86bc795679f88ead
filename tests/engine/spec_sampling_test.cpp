// Lossless sampling: under speculation the emitted tokens follow the target's distribution exactly.
// Chi-square over the joint distribution of the first two generated tokens, for each of the sampler's
// paths; 6000 samples detect a 2% shift of a bin's probability.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "engine_test_util.h"

namespace hyspec {
namespace {

class FixedDrafter final : public Drafter {
 public:
  explicit FixedDrafter(std::vector<int32_t> d) : drafts_(std::move(d)) {}
  std::string name() const override { return "fixed"; }
  Status reset(SequenceState&) override { return Status::ok(); }
  Status observe(const CommittedRows&) override { return Status::ok(); }
  Result<std::vector<int32_t>> propose(int max_k) override {
    return std::vector<int32_t>(drafts_.begin(), drafts_.begin() + std::min<size_t>(max_k, drafts_.size()));
  }

 private:
  std::vector<int32_t> drafts_;
};

std::vector<TokenProb> distribution_after(Engine& e, const std::vector<int32_t>& seq, const SamplingParams& sp) {
  auto logits = e.prompt_logits(seq, false);
  EXPECT_TRUE(logits.is_ok()) << logits.message();
  std::vector<TokenProb> d;
  Sampler(sp).distribution(logits->data(), e.model().hparams().n_vocab, seq, d);
  return d;
}

// The sampler's paths (engine/logit_rows.h): top-k 4 (candidates), top-p with min-p (candidates),
// temperature alone (draws by chunk). Pairs beyond the 4 most likely first tokens, or the 4 most likely
// second tokens after one, are pooled per first token (and all together beyond the first 4).
class SpecSampling : public ::testing::TestWithParam<SamplingParams> {};

TEST_P(SpecSampling, EmpiricalJointOfTwoTokensMatchesTheTargetDistribution) {
  auto engine = test::make_engine("qwen35-tiny", SpecMethod::Ngram, 4, 256);
  ASSERT_TRUE(engine);
  Engine& e = *engine;
  const std::vector<int32_t> prompt = {501, 500, 505, 194, 87};
  const SamplingParams sp = GetParam();
  constexpr int kTop = 4;
  constexpr int32_t kOther = -1;

  // Exact joint: p1(t1) p2(t2 | t1), binned.
  auto best_first = [](std::vector<TokenProb> d) {
    std::sort(d.begin(), d.end(), [](const TokenProb& a, const TokenProb& b) { return a.p > b.p || (a.p == b.p && a.id < b.id); });
    return d;
  };
  const auto p1 = best_first(distribution_after(e, prompt, sp));
  ASSERT_GE(p1.size(), 2u);
  std::map<int32_t, std::vector<int32_t>> top_second;  // first token -> its kTop most likely second tokens
  std::map<std::pair<int32_t, int32_t>, double> expected;
  for (size_t i = 0; i < p1.size(); ++i) {
    if (i >= static_cast<size_t>(kTop)) {
      expected[{kOther, kOther}] += p1[i].p;
      continue;
    }
    auto seq = prompt;
    seq.push_back(p1[i].id);
    const auto p2 = best_first(distribution_after(e, seq, sp));
    for (size_t j = 0; j < p2.size(); ++j) {
      if (j < static_cast<size_t>(kTop)) top_second[p1[i].id].push_back(p2[j].id);
      expected[{p1[i].id, j < static_cast<size_t>(kTop) ? p2[j].id : kOther}] += double(p1[i].p) * p2[j].p;
    }
  }
  // Bins expected fewer than 5 times are pooled (chi-square needs the counts near normal).
  const int n = 6000;
  constexpr std::pair<int32_t, int32_t> kRare{-2, -2};
  for (auto it = expected.begin(); it != expected.end();) {
    if (it->second * n >= 5) {
      ++it;
      continue;
    }
    expected[kRare] += it->second;
    it = expected.erase(it);
  }
  auto bin = [&](int32_t a, int32_t b) -> std::pair<int32_t, int32_t> {
    const auto it = top_second.find(a);
    std::pair<int32_t, int32_t> k{kOther, kOther};
    if (it != top_second.end()) k = {a, std::count(it->second.begin(), it->second.end(), b) ? b : kOther};
    return expected.count(k) ? k : kRare;
  };
  // The drafter proposes the most likely second token after the most likely first one (often
  // accepted), then the least likely token of the first position (mostly rejected).
  const int32_t likely = top_second[p1[0].id][0];
  const int32_t unlikely = p1.back().id;

  std::map<std::pair<int32_t, int32_t>, int> counts;
  int64_t accepted = 0, drafted = 0;
  auto s = e.new_session();
  ASSERT_TRUE(s.is_ok());
  (*s)->set_drafter(std::make_unique<FixedDrafter>(std::vector<int32_t>{likely, unlikely}));
  for (int i = 0; i < n; ++i) {
    GenerateOptions o;
    o.max_tokens = 3;  // the prefill token, then one round verifying one draft
    o.sampling = sp;
    o.sampling.seed = 1000 + i;
    o.adaptive = false;
    ASSERT_TRUE((*s)->start(prompt, o).is_ok());
    std::vector<int32_t> out;
    while (!(*s)->done()) ASSERT_TRUE((*s)->step(out).is_ok());
    ASSERT_GE(out.size(), 2u);
    ++counts[bin(out[0], out[1])];
    accepted += (*s)->stats().accepted;
    drafted += (*s)->stats().drafted;
  }
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, drafted);
  double chi2 = 0;
  int bins = 0;
  for (const auto& [k, p] : expected) {
    if (p <= 0) continue;
    ++bins;
    const double exp_count = p * n;
    const double d = counts[k] - exp_count;
    chi2 += d * d / exp_count;
  }
  for (const auto& [k, c] : counts) EXPECT_TRUE(expected.count(k) && expected.at(k) > 0) << "emitted a pair outside the support";
  // P(chi2 > limit) = 0.001 under the null (Wilson-Hilferty for bins - 1 degrees of freedom).
  const double df = bins - 1, z = 3.09;
  const double limit = df * std::pow(1.0 - 2.0 / (9.0 * df) + z * std::sqrt(2.0 / (9.0 * df)), 3.0);
  EXPECT_LT(chi2, limit) << "speculative sampling does not follow the target distribution (" << bins << " bins)";
}

SamplingParams sampling(float temperature, int top_k, float top_p, float min_p) {
  SamplingParams sp;
  sp.temperature = temperature, sp.top_k = top_k, sp.top_p = top_p, sp.min_p = min_p;
  return sp;
}

std::string path_name(const ::testing::TestParamInfo<SamplingParams>& info) {
  const char* names[] = {"TopK", "TopPMinP", "Temperature"};
  return names[info.index];
}

INSTANTIATE_TEST_SUITE_P(Paths, SpecSampling,
                         ::testing::Values(sampling(1.0f, 4, 1.0f, 0.0f), sampling(0.8f, 0, 0.9f, 0.02f),
                                           sampling(1.0f, 0, 1.0f, 0.0f)),
                         path_name);

}  // namespace
}  // namespace hyspec
