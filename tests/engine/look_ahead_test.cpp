// Look-ahead decoding (EngineConfig::look_ahead, Session::look_ahead_round) emits plain decoding's tokens
// (greedy, or sampled under temperature alone or a top-k cut with the same seed) and stops where it stops,
// whatever stops it; the step it enqueued past a stop token or a cancel has run the pending token, and
// probe_next_logits gives that step's logits: the same bits as a plain session's probe. (On the CPU the
// backend runs each op before it returns, so only the bookkeeping is under test there; on CUDA,
// HYSPEC_TEST_BACKEND=cuda, the steps really overlap the host.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

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
  // expect_same within the verify steps' rounding (a drafter session's state went through them).
  void expect_near(const Outcome& a, const Outcome& p, const std::string& what) {
    EXPECT_EQ(a.emitted, p.emitted) << what;
    EXPECT_EQ(a.finish, p.finish) << what;
    ASSERT_EQ(a.next_logits.size(), p.next_logits.size()) << what;
    float diff = 0;
    for (size_t i = 0; i < a.next_logits.size(); ++i) diff = std::max(diff, std::fabs(a.next_logits[i] - p.next_logits[i]));
    EXPECT_LE(diff, 1e-4f) << what << ": the state differs from plain decoding's";
  }
  // A sampled session (o.max_tokens tokens, every round looking ahead) against a plain one: the same tokens
  // and state, then again with a stop token at a token it drew, and cancelled after 5 tokens.
  void expect_sampled_as_plain(const std::vector<int32_t>& prompt, const GenerateOptions& o, const std::string& what) {
    const Outcome a = run(*ahead_, prompt, o), p = run(*plain_, prompt, o);
    ASSERT_EQ(a.emitted.size(), static_cast<size_t>(o.max_tokens)) << what;
    EXPECT_EQ(a.stats.ahead_rounds, a.stats.rounds) << what;
    expect_same(a, p, what);
    GenerateOptions so = o;
    so.stop_tokens = {p.emitted[9 + o.sampling.seed % 20]};
    expect_same(run(*ahead_, prompt, so), run(*plain_, prompt, so), what + ", stop");
    expect_same(run(*ahead_, prompt, o, 5), run(*plain_, prompt, o, 5), what + ", cancelled");
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

// Auto: on where the backend runs asynchronously (CUDA), off on the CPU.
TEST_F(LookAheadDecoding, AutoLooksAheadOnAnAsynchronousBackend) {
  auto automatic = engine(LookAhead::kAuto);
  ASSERT_TRUE(automatic);
  EXPECT_EQ(automatic->backend().asynchronous(), test::test_backend_kind() == BackendKind::Cuda);
  GenerateOptions o;
  o.max_tokens = 24;
  const Outcome a = run(*automatic, prompts_[1], o), p = run(*plain_, prompts_[1], o);
  expect_same(a, p, "auto");
}

// Sampled under temperature alone, each step's draw is made on the backend (Backend::draw_token) with the
// uniform the host's draw would take: the same tokens for a seed as a plain session, and the same state
// after a stop token or a cancel. (On CUDA the device's in-chunk sums run in another order than the host's:
// a draw at a rounding edge of a token could differ, about once in 1e12 draws.)
TEST_F(LookAheadDecoding, SampledUnderTemperatureAloneDrawsPlainDecodingsTokens) {
  for (const float t : {0.5f, 1.0f, 1.6f}) {
    for (const uint64_t seed : {1u, 7u, 123u}) {
      GenerateOptions o;
      o.max_tokens = 32;
      o.sampling.temperature = t;
      o.sampling.seed = seed;
      expect_sampled_as_plain(prompts_[seed % prompts_.size()], o,
                              "T " + std::to_string(t) + ", seed " + std::to_string(seed));
    }
  }
}

// Sampled under a top-k cut (min-p and top-p after it: the CLI's default cuts among them), each step's draw is
// made on the backend (Backend::draw_top_k) from the row's k best tokens, with the uniform the host's draw
// would take: the same tokens for a seed as a plain session, and the same state after a stop token or a
// cancel. (On CUDA an exp may round otherwise than glibc's expf: a draw at a rounding edge could differ.)
TEST_F(LookAheadDecoding, SampledUnderATopKCutDrawsPlainDecodingsTokens) {
  const SamplingCut cuts[] = {{0.8f, 40, 0.95f, 0.05f}, {1.5f, 5, 1.0f, 0.0f}, {1.0f, 1, 1.0f, 0.0f},
                              {1.2f, 256, 0.5f, 0.0f}, {1.0f, 64, 1.0f, 0.1f}};
  for (const SamplingCut& cut : cuts) {
    for (const uint64_t seed : {2u, 9u}) {
      GenerateOptions o;
      o.max_tokens = 32;
      o.sampling.temperature = cut.temperature;
      o.sampling.top_k = cut.top_k;
      o.sampling.top_p = cut.top_p;
      o.sampling.min_p = cut.min_p;
      o.sampling.seed = seed;
      expect_sampled_as_plain(prompts_[(seed + cut.top_k) % prompts_.size()], o,
                              "top-k " + std::to_string(cut.top_k) + ", seed " + std::to_string(seed));
    }
  }
}

// A drafter session looks ahead in its plain rounds while the round after is surely plain (the two that open
// a sequence, back-off stretches), and not into a speculative one; the steps keep the rows a model drafter
// needs (RejectedDrafts.LookAheadStretchesKeepTheRowsADrafterNeeds). Plain decoding's tokens, and its state
// (within the verify steps' rounding) after stop tokens and cancels: n-gram, MTP and DFlash sessions.
TEST_F(LookAheadDecoding, DrafterSessionsLookAheadInTheirPlainStretches) {
  const std::pair<SpecMethod, std::string> drafters[] = {
      {SpecMethod::Ngram, ""}, {SpecMethod::Mtp, ""}, {SpecMethod::Dflash, test::fixture_path("dflash-tiny/dflash-tiny-f32.gguf")}};
  for (const auto& [method, draft_model] : drafters) {
    SCOPED_TRACE(spec_method_name(method));
    auto spec = test::make_engine(kFixture, method, 8, 512, draft_model, false, GgmlType::F32, 0,
                                  EngineConfig{}.capture, EngineConfig{}.pad_verify, true, LookAhead::kOn);
    ASSERT_TRUE(spec);
    GenerateOptions o;
    o.max_tokens = 40;
    for (size_t i = 0; i < prompts_.size(); ++i) {
      const Outcome a = run(*spec, prompts_[i], o), p = run(*plain_, prompts_[i], o);
      expect_near(a, p, "prompt " + std::to_string(i));
      EXPECT_GE(a.stats.ahead_rounds, 2) << "the two plain rounds that open a sequence";
      for (size_t at : {1u, 2u, 3u, 7u, 20u}) {
        GenerateOptions so = o;
        so.stop_tokens = {p.emitted[at]};
        expect_near(run(*spec, prompts_[i], so), run(*plain_, prompts_[i], so), "stop token at " + std::to_string(at));
      }
      for (int after : {1, 2, 3, 5})
        expect_near(run(*spec, prompts_[i], o, after), run(*plain_, prompts_[i], o, after),
             "cancelled after " + std::to_string(after));
      GenerateOptions plain_only = o;  // a request that opts out of speculation: every round looks ahead
      plain_only.speculative = false;
      const Outcome n = run(*spec, prompts_[i], plain_only);
      expect_near(n, p, "not speculative");
      EXPECT_EQ(n.stats.ahead_rounds, n.stats.rounds);
    }
  }
}

// Whether a session under `o` kept a step enqueued ahead: after a cancel, that step's logits are what the
// probe reads, and another session's step makes that an error; a plain session's probe runs its token.
bool looked_ahead(Engine& e, const std::vector<int32_t>& prompt, const std::vector<int32_t>& other_prompt,
                  const GenerateOptions& o) {
  auto s = e.new_session(), other = e.new_session();
  EXPECT_TRUE(s.is_ok() && other.is_ok());
  EXPECT_TRUE((*s)->start(prompt, o).is_ok());
  std::vector<int32_t> out;
  while (out.size() < 3 && !(*s)->done()) EXPECT_TRUE((*s)->step(out).is_ok());
  (*s)->cancel();
  EXPECT_TRUE((*other)->start(other_prompt, GenerateOptions{}).is_ok());
  EXPECT_TRUE((*other)->step(out).is_ok());
  return !(*s)->probe_next_logits().is_ok();
}

// Look-ahead applies where the backend can pick each token on its own: greedy, temperature alone, or a top-k
// cut of at most TokenDraw::kMaxTopK tokens (with min-p and top-p after it); not top-p or min-p without top-k
// (their cut may reach deep into the row), a larger k, penalties or logprobs, which need the host. Those
// sessions decode plainly and give plain decoding's tokens.
TEST_F(LookAheadDecoding, LooksAheadOnlyWhereTheBackendPicksTheTokens) {
  GenerateOptions greedy, alone, top_k, wide_k, top_p, min_p, penalty, logprobs;
  for (GenerateOptions* o : {&alone, &top_k, &wide_k, &top_p, &min_p, &penalty, &logprobs})
    o->sampling.temperature = 0.9f;
  top_k.sampling.top_k = 40;
  top_k.sampling.top_p = 0.9f;
  top_k.sampling.min_p = 0.05f;
  wide_k.sampling.top_k = TokenDraw::kMaxTopK + 1;
  top_p.sampling.top_p = 0.9f;
  min_p.sampling.min_p = 0.05f;
  penalty.sampling.repeat_penalty = 1.1f;
  penalty.sampling.top_k = 40;
  logprobs.logprobs = 2;
  EXPECT_TRUE(looked_ahead(*ahead_, prompts_[0], prompts_[1], greedy));
  EXPECT_TRUE(looked_ahead(*ahead_, prompts_[0], prompts_[1], alone));
  EXPECT_TRUE(looked_ahead(*ahead_, prompts_[0], prompts_[1], top_k));
  for (const GenerateOptions* o : {&wide_k, &top_p, &min_p, &penalty, &logprobs}) {
    EXPECT_FALSE(looked_ahead(*ahead_, prompts_[0], prompts_[1], *o));
    GenerateOptions m = *o;
    m.max_tokens = 16;
    m.sampling.seed = 3;
    expect_same(run(*ahead_, prompts_[2], m), run(*plain_, prompts_[2], m), "a session the host samples");
  }
  EXPECT_FALSE(looked_ahead(*plain_, prompts_[0], prompts_[1], alone));
}

}  // namespace
}  // namespace hyspec
