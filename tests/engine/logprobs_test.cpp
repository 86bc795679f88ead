// Per-token logprobs (GenerateOptions::logprobs): the target's log_softmax at each emitted token,
// checked against a full prefill of the generated sequence, and identical with speculation on.
#include <gtest/gtest.h>

#include <cmath>

#include "engine_test_util.h"

namespace hyspec {
namespace {

// log_softmax of one logits row, in double.
std::vector<double> log_softmax(const float* row, int n) {
  double mx = row[0];
  for (int i = 1; i < n; ++i) mx = std::max<double>(mx, row[i]);
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += std::exp(row[i] - mx);
  std::vector<double> out(n);
  for (int i = 0; i < n; ++i) out[i] = row[i] - mx - std::log(sum);
  return out;
}

struct Generated {
  std::vector<int32_t> tokens;
  std::vector<EmittedLogprobs> logprobs;
};

Generated generate_with_logprobs(Engine& e, const std::vector<int32_t>& prompt, GenerateOptions o) {
  Generated g;
  auto s = e.new_session();
  EXPECT_TRUE(s.is_ok()) << s.message();
  if (!s.is_ok()) return g;
  EXPECT_TRUE((*s)->start(prompt, o).is_ok());
  while (!(*s)->done()) EXPECT_TRUE((*s)->step(g.tokens).is_ok());
  g.logprobs = (*s)->logprobs();
  return g;
}

TEST(EngineLogprobs, EachEmittedTokenCarriesTheTargetLogSoftmaxAndItsTopIds) {
  auto e = test::make_engine("qwen35-tiny", SpecMethod::None);
  ASSERT_TRUE(e);
  const std::vector<int32_t> prompt = test::fixture_prompts("qwen35-tiny")[0];
  GenerateOptions o;
  o.max_tokens = 12;
  o.logprobs = 4;
  const Generated g = generate_with_logprobs(*e, prompt, o);
  ASSERT_EQ(g.tokens.size(), 12u);
  ASSERT_EQ(g.logprobs.size(), g.tokens.size());

  std::vector<int32_t> all = prompt;
  all.insert(all.end(), g.tokens.begin(), g.tokens.end());
  auto logits = e->prompt_logits(all, /*all_rows=*/true);
  ASSERT_TRUE(logits.is_ok()) << logits.message();
  const int V = 512;
  for (size_t i = 0; i < g.tokens.size(); ++i) {
    const auto want = log_softmax(&(*logits)[(prompt.size() - 1 + i) * V], V);
    const EmittedLogprobs& lp = g.logprobs[i];
    EXPECT_EQ(lp.token.id, g.tokens[i]);
    EXPECT_NEAR(lp.token.logprob, want[g.tokens[i]], 1e-3) << "token " << i;
    ASSERT_EQ(lp.top.size(), 4u);
    EXPECT_EQ(lp.top[0].id, g.tokens[i]) << "greedy emits the most likely id";
    for (size_t j = 0; j < lp.top.size(); ++j) {
      EXPECT_NEAR(lp.top[j].logprob, want[lp.top[j].id], 1e-3);
      if (j > 0) EXPECT_GE(lp.top[j - 1].logprob, lp.top[j].logprob);
    }
  }
}

TEST(EngineLogprobs, SpeculativeDecodingReportsTheSameLogprobsAsPlainDecoding) {
  auto plain = test::make_engine("qwen35-tiny", SpecMethod::None);
  auto mtp = test::make_engine("qwen35-tiny", SpecMethod::Mtp);
  ASSERT_TRUE(plain && mtp);
  GenerateOptions o;
  o.max_tokens = 40;
  o.logprobs = 2;
  o.adaptive = false;
  const std::vector<int32_t> prompt = test::fixture_prompts("qwen35-tiny")[1];
  const Generated a = generate_with_logprobs(*plain, prompt, o);
  const Generated b = generate_with_logprobs(*mtp, prompt, o);
  ASSERT_EQ(a.tokens, b.tokens);
  ASSERT_EQ(a.logprobs.size(), 40u);
  ASSERT_EQ(b.logprobs.size(), 40u);
  for (size_t i = 0; i < a.logprobs.size(); ++i) {
    EXPECT_NEAR(a.logprobs[i].token.logprob, b.logprobs[i].token.logprob, 1e-3) << "token " << i;
    ASSERT_EQ(b.logprobs[i].top.size(), 2u);
    EXPECT_EQ(a.logprobs[i].top[1].id, b.logprobs[i].top[1].id);
  }
}

TEST(EngineLogprobs, OffByDefault) {
  auto e = test::make_engine("qwen35-tiny", SpecMethod::None);
  ASSERT_TRUE(e);
  GenerateOptions o;
  o.max_tokens = 3;
  EXPECT_TRUE(generate_with_logprobs(*e, {1, 2, 3}, o).logprobs.empty());
}

}  // namespace
}  // namespace hyspec
