// Look-ahead decoding (EngineConfig::look_ahead, Session::look_ahead_round) emits plain greedy decoding's
// tokens and stops where it stops, whatever stops it; the step it enqueued past a stop token or a cancel
// has run the pending token, and probe_next_logits gives that step's logits: the same bits as a plain
// session's probe. (On the CPU the backend runs each op before it returns, so only the bookkeeping is
// under test there; on CUDA, HYSPEC_TEST_BACKEND=cuda, the steps really overlap the host.)
#include <gtest/gtest.h>

#include <algorithm>

#include "engine_test_util.h"

namespace hyspec {
namespace {

constexpr const char* kFixture = "qwen35-tiny";

std::unique_ptr<Engine> engine(LookAhead mode, int64_t n_ctx = 512) {
  return test::make_engine(kFixture, SpecMethod::None, 8, n_ctx, "", false, GgmlType::F32, 0, EngineConfig{}.capture,
                           EngineConfig{}.pad_verify, true, mode);
}

using Outcome = test::SessionRun;

// Generates with `o`, cancelling once `cancel_after` tokens are out (-1: never), then probes the next logits.
Outcome run(Engine& e, const std::vector<int32_t>& prompt, const GenerateOptions& o, int cancel_after = -1) {
  return test::run_session(e, prompt, o, nullptr, cancel_after);
}

class LookAheadDecoding : public ::testing::Test {
 protected:
  void SetUp() override {
    ahead_ = engine(LookAhead::kOn);
    plain_ = engine(LookAhead::kOff);
    ASSERT_TRUE(ahead_ && plain_);
    prompts_ = test::fixture_prompts(kFixture);
  }
  void expect_same(const Outcome& a, const Outcome& p, const std::string& what) {
    EXPECT_EQ(a.emitted, p.emitted) << what;
    EXPECT_EQ(a.finish, p.finish) << what;
    ASSERT_EQ(a.next_logits.size(), p.next_logits.size()) << what;
    EXPECT_TRUE(a.next_logits == p.next_logits) << what << ": the state after the run differs from plain decoding's";
  }
  std::unique_ptr<Engine> ahead_, plain_;
  std::vector<std::vector<int32_t>> prompts_;
};

TEST_F(LookAheadDecoding, EmitsPlainDecodingsTokensUpToMaxTokens) {
  GenerateOptions o;
  o.max_tokens = 40;
  for (size_t i = 0; i < prompts_.size(); ++i) {
    const Outcome a = run(*ahead_, prompts_[i], o), p = run(*plain_, prompts_[i], o);
    ASSERT_EQ(a.emitted.size(), 40u);
    EXPECT_EQ(a.finish, FinishReason::Length);
    expect_same(a, p, "prompt " + std::to_string(i));
    EXPECT_EQ(a.stats.rounds, p.stats.rounds);
  }
}

// A stop token is seen after the next step was enqueued: that step ran it, and its logits are the probe's.
TEST_F(LookAheadDecoding, AStopTokenLeavesTheStateOfPlainDecodingPlusThePendingToken) {
  GenerateOptions o;
  o.max_tokens = 40;
  const Outcome ref = run(*plain_, prompts_[0], o);
  ASSERT_EQ(ref.emitted.size(), 40u);
  for (size_t at : {1u, 2u, 7u, 20u, 39u}) {  // stop at the first occurrence of the token at `at`
    GenerateOptions so = o;
    so.stop_tokens = {ref.emitted[at]};
    const Outcome a = run(*ahead_, prompts_[0], so), p = run(*plain_, prompts_[0], so);
    EXPECT_EQ(a.finish, FinishReason::Stop) << "stop at " << at;
    EXPECT_LE(a.emitted.size(), at + 1);
    expect_same(a, p, "stop token at " + std::to_string(at));
  }
}

TEST_F(LookAheadDecoding, StopsAtTheContextAsPlainDecodingDoes) {
  const int64_t n_ctx = static_cast<int64_t>(prompts_[0].size()) + 9;
  auto ahead = engine(LookAhead::kOn, n_ctx), plain = engine(LookAhead::kOff, n_ctx);
  ASSERT_TRUE(ahead && plain);
  GenerateOptions o;
  o.max_tokens = 40;
  const Outcome a = run(*ahead, prompts_[0], o), p = run(*plain, prompts_[0], o);
  EXPECT_EQ(a.finish, FinishReason::Context);
  expect_same(a, p, "context");
}

TEST_F(LookAheadDecoding, ACancelBetweenRoundsLeavesTheSameState) {
  GenerateOptions o;
  o.max_tokens = 40;
  for (int after : {1, 2, 5, 12}) {
    const Outcome a = run(*ahead_, prompts_[1], o, after), p = run(*plain_, prompts_[1], o, after);
    EXPECT_EQ(a.finish, FinishReason::Cancelled);
    EXPECT_EQ(a.emitted.size(), static_cast<size_t>(after));
    expect_same(a, p, "cancelled after " + std::to_string(after) + " tokens");
  }
}

// A sequence that crosses a key bound (4096: recorded_key_bound) records the next bound's graphs while a
// step is enqueued ahead; F16 and Q8_0 caches.
TEST_F(LookAheadDecoding, AcrossAKeyBoundAsPlainDecoding) {
  std::vector<int32_t> prompt;
  while (prompt.size() < 4085) prompt.push_back(prompts_[0][prompt.size() % prompts_[0].size()]);
  GenerateOptions o;
  o.max_tokens = 24;
  for (GgmlType kv : {GgmlType::F16, GgmlType::Q8_0}) {
    auto make = [&](LookAhead mode) {
      return test::make_engine(kFixture, SpecMethod::None, 8, 9000, "", false, kv, 0, EngineConfig{}.capture,
                               EngineConfig{}.pad_verify, true, mode);
    };
    auto ahead = make(LookAhead::kOn), plain = make(LookAhead::kOff);
    ASSERT_TRUE(ahead && plain);
    const Outcome a = run(*ahead, prompt, o, 20), p = run(*plain, prompt, o, 20);
    ASSERT_EQ(a.emitted.size(), 20u);
    expect_same(a, p, "across 4096, " + std::string(ggml_type_name(kv)));
    EXPECT_EQ(a.stats.graphs_recorded, test::test_backend_kind() == BackendKind::Cuda ? 4 : 0);  // 2 slots x 2 bounds
  }
}

// The probe reads the look-ahead step's logits from the engine's buffer: after another session's step it
// says so instead of returning that session's logits.
TEST_F(LookAheadDecoding, AProbeAfterAnotherSessionsStepIsAnError) {
  GenerateOptions o;
  o.max_tokens = 40;
  const Outcome ref = run(*plain_, prompts_[0], o);
  size_t at = 1;  // a token first emitted by a decode round (the prompt's step emits the first)
  while (at < ref.emitted.size() && std::find(ref.emitted.begin(), ref.emitted.begin() + at, ref.emitted[at]) !=
                                        ref.emitted.begin() + at)
    ++at;
  ASSERT_LT(at, ref.emitted.size());
  GenerateOptions so = o;
  so.stop_tokens = {ref.emitted[at]};
  auto s = ahead_->new_session(), other = ahead_->new_session();
  ASSERT_TRUE(s.is_ok() && other.is_ok());
  ASSERT_TRUE((*s)->start(prompts_[0], so).is_ok());
  while (!(*s)->done()) {
    std::vector<int32_t> out;
    ASSERT_TRUE((*s)->step(out).is_ok());
  }
  ASSERT_EQ((*s)->finish_reason(), FinishReason::Stop);
  ASSERT_TRUE((*other)->start(prompts_[2], o).is_ok());
  std::vector<int32_t> out;
  ASSERT_TRUE((*other)->step(out).is_ok());
  auto l = (*s)->probe_next_logits();
  EXPECT_FALSE(l.is_ok());
}

// Auto: on where the backend runs asynchronously (CUDA), off on the CPU; never with sampling.
TEST_F(LookAheadDecoding, AutoLooksAheadOnAnAsynchronousBackendAndSamplingNever) {
  auto automatic = engine(LookAhead::kAuto);
  ASSERT_TRUE(automatic);
  EXPECT_EQ(automatic->backend().asynchronous(), test::test_backend_kind() == BackendKind::Cuda);
  GenerateOptions o;
  o.max_tokens = 24;
  o.sampling.temperature = 0.8f;
  o.sampling.seed = 7;
  const Outcome a = run(*ahead_, prompts_[1], o), p = run(*plain_, prompts_[1], o);
  expect_same(a, p, "sampled");
}

}  // namespace
}  // namespace hyspec
