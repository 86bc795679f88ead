// Lossless sampling: under speculation the emitted tokens follow the target's distribution exactly.
// Chi-square over the joint distribution of the first two generated tokens (top-k 4 at temperature 1:
// 16 bins); 6000 samples detect a 2% shift of one bin's probability.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

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

TEST(SpecSampling, EmpiricalJointOfTwoTokensMatchesTheTargetDistribution) {
  auto engine = test::make_engine("qwen35-tiny", SpecMethod::Ngram, 4, 256);
  ASSERT_TRUE(engine);
  Engine& e = *engine;
  const std::vector<int32_t> prompt = {501, 500, 505, 194, 87};
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.top_k = 4;

  // Exact joint: p1(t1) p2(t2 | t1).
  std::map<std::pair<int32_t, int32_t>, double> expected;
  const auto p1 = distribution_after(e, prompt, sp);
  ASSERT_EQ(p1.size(), 4u);
  for (const auto& a : p1) {
    auto seq = prompt;
    seq.push_back(a.id);
    for (const auto& b : distribution_after(e, seq, sp)) expected[{a.id, b.id}] = a.p * b.p;
  }
  // The drafter proposes the most likely second token after the most likely first one (often
  // accepted), then a token that is never in the top 4 (always rejected).
  auto seq = prompt;
  seq.push_back(p1[0].id);
  const int32_t likely = distribution_after(e, seq, sp)[0].id;
  const int32_t unlikely = 3;

  const int n = 6000;
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
    ++counts[{out[0], out[1]}];
    accepted += (*s)->stats().accepted;
    drafted += (*s)->stats().drafted;
  }
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, drafted);
  double chi2 = 0;
  for (const auto& [k, p] : expected) {
    const double exp_count = p * n;
    const double d = counts[k] - exp_count;
    chi2 += d * d / exp_count;
  }
  for (const auto& [k, c] : counts) EXPECT_TRUE(expected.count(k)) << "emitted a pair outside the support";
  // 15 degrees of freedom: P(chi2 > 37.7) = 0.001 under the null.
  EXPECT_LT(chi2, 37.7) << "speculative sampling does not follow the target distribution";
}

}  // namespace
}  // namespace hyspec
