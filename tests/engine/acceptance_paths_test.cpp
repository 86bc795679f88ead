// Every acceptance path leaves the caches exactly as plain decoding of the emitted tokens would:
// a drafter replays the known greedy continuation with errors injected at chosen offsets, and after
// each run the next-step logits must equal those of a plain run that emitted the same tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "engine_test_util.h"

namespace hyspec {
namespace {

constexpr const char* kFixture = "qwen35-tiny";

// A deterministic clock for the engine's round timing (EngineConfig::clock): every reading moves it 1 ms, a
// proposal of k drafts takes k ms, and the verify step after it 0.5 ms a draft more than a decode step. (The
// verify step ends at the third reading after the proposal: the draft phase's end, the verify's start and
// its end; Session::decode_round.) A plain round then costs 5 ms and a speculative one 7 + 1.5 k.
struct TestClock {
  double t = 0, verify_extra = 0;
  int readings_to_verify_end = 0;
  double read() {
    t += 1e-3;
    if (readings_to_verify_end > 0 && --readings_to_verify_end == 0) t += verify_extra;
    return t;
  }
  void proposed(int k) {
    t += 1e-3 * k;
    verify_extra = 0.5e-3 * k;
    readings_to_verify_end = 3;
  }
};

// Proposes reference[g .. g+k) where g counts tokens generated so far; wrong(g_draft_index, i) says
// whether draft i of this proposal is corrupted.
class ReplayDrafter final : public Drafter {
 public:
  ReplayDrafter(std::vector<int32_t> reference, size_t prompt_len, int n_vocab,
                std::function<bool(int round, int i)> corrupt)
      : ref_(std::move(reference)), prompt_len_(prompt_len), n_vocab_(n_vocab), corrupt_(std::move(corrupt)) {}
  std::string name() const override { return "replay"; }
  DrafterNeeds needs() const override { return {hidden_rows != nullptr, {}}; }
  Status reset(SequenceState&) override {
    seq_.clear();
    round_ = 0;
    return Status::ok();
  }
  Status observe(const CommittedRows& rows) override {
    if (static_cast<size_t>(rows.first_pos) >= prompt_len_) largest_decode_observe = std::max(largest_decode_observe, rows.n);
    if (hidden_rows && rows.hidden.data) {  // keep every observed row by position
      EXPECT_EQ(rows.first_pos, static_cast<int64_t>(hidden_rows->size())) << "rows observed out of order";
      for (int64_t r = 0; r < rows.n; ++r) {
        std::vector<float> h(static_cast<size_t>(rows.hidden.n_cols));
        backend->download(h.data(), rows.hidden.row(r), h.size() * sizeof(float));
        hidden_rows->push_back(std::move(h));
      }
    }
    seq_.resize(static_cast<size_t>(rows.first_pos));
    seq_.insert(seq_.end(), rows.row_tokens.begin(), rows.row_tokens.end());
    seq_.push_back(rows.next_tokens.back());
    return Status::ok();
  }
  Result<std::vector<int32_t>> propose(int max_k) override {
    if (asks) asks->emplace_back(static_cast<int64_t>(seq_.size()) - 1, max_k);
    if (watch) {  // the drafter has seen every committed row, up to the pending token
      EXPECT_EQ(seq_, watch->tokens()) << "proposal " << round_;
      ++proposals_checked;
    }
    std::vector<int32_t> d;
    const size_t g = seq_.size() - prompt_len_;  // generated so far, including the pending token
    for (int i = 0; i < std::min(max_k, cap) && g + i < ref_.size(); ++i) {
      int32_t t = ref_[g + i];
      if (corrupt_(round_, i)) t = (t + 1) % n_vocab_;
      d.push_back(t);
    }
    ++round_;
    if (clock) clock->proposed(static_cast<int>(d.size()));
    return d;
  }

  int cap = 64;                    // the most drafts a proposal holds
  const Session* watch = nullptr;  // when set, each proposal checks what was observed against it
  struct TestClock* clock = nullptr;  // when set, told of each proposal
  int proposals_checked = 0;
  int64_t largest_decode_observe = 0;  // the most rows one observe of generated positions took
  std::vector<std::pair<int64_t, int>>* asks = nullptr;  // when set, each proposal's (committed rows, max_k)
  // When set, the drafter needs the target's final hidden rows (as MTP does) and keeps each one it observes.
  std::vector<std::vector<float>>* hidden_rows = nullptr;
  Backend* backend = nullptr;

 private:
  std::vector<int32_t> ref_;
  size_t prompt_len_;
  int n_vocab_;
  std::function<bool(int, int)> corrupt_;
  std::vector<int32_t> seq_;
  int round_ = 0;
};

using RunResult = test::SessionRun;
using test::run_session;

class AcceptancePaths : public ::testing::Test {
 protected:
  void SetUp() override {
    plain_ = test::make_engine(kFixture, SpecMethod::None, 8, 512);
    spec_ = test::make_engine(kFixture, SpecMethod::Ngram, 8, 512);
    ASSERT_TRUE(plain_ && spec_);
    prompt_ = test::fixture_prompts(kFixture)[1];
    GenerateOptions o;
    o.max_tokens = 64;
    ref_ = test::generate_ids(*plain_, prompt_, o);
    ASSERT_EQ(ref_.size(), 64u);
    n_vocab_ = plain_->model().hparams().n_vocab;
  }

  // Speculative run with the replay drafter vs a plain run stopped at the same place.
  void check(const GenerateOptions& o, std::function<bool(int, int)> corrupt, size_t expect_len,
             const char* what, Engine* spec_engine = nullptr, Engine* plain_engine = nullptr, int draft_cap = 64) {
    Engine& se = spec_engine ? *spec_engine : *spec_;
    Engine& pe = plain_engine ? *plain_engine : *plain_;
    GenerateOptions so = o;
    so.adaptive = false;
    auto drafter = std::make_unique<ReplayDrafter>(ref_, prompt_.size(), n_vocab_, corrupt);
    drafter->cap = draft_cap;
    RunResult s = run_session(se, prompt_, so, std::move(drafter));
    RunResult p = run_session(pe, prompt_, o, nullptr);
    ASSERT_EQ(s.emitted.size(), expect_len) << what;
    EXPECT_EQ(s.emitted, p.emitted) << what;
    EXPECT_EQ(s.finish, p.finish) << what;
    ASSERT_EQ(s.next_logits.size(), p.next_logits.size());
    float diff = 0;
    for (size_t i = 0; i < s.next_logits.size(); ++i) diff = std::max(diff, std::fabs(s.next_logits[i] - p.next_logits[i]));
    EXPECT_LE(diff, 1e-4f) << what << ": caches differ from plain decoding";
    last_ = s;
  }

  std::unique_ptr<Engine> plain_, spec_;
  std::vector<int32_t> prompt_, ref_;
  int n_vocab_ = 0;
  RunResult last_;
};

TEST_F(AcceptancePaths, FullAcceptanceEmitsEveryDraftPlusTheBonus) {
  GenerateOptions o;
  o.max_tokens = 40;
  check(o, [](int, int) { return false; }, 40, "full");
  EXPECT_EQ(last_.stats.accepted, last_.stats.drafted);
  EXPECT_GE(last_.stats.accept_histogram[8], 3);
}

TEST_F(AcceptancePaths, PartialAcceptanceAtEveryOffset) {
  for (int j = 0; j < 8; ++j) {
    GenerateOptions o;
    o.max_tokens = 37;
    check(o, [j](int, int i) { return i == j; }, 37, ("offset " + std::to_string(j)).c_str());
    // Every round accepted exactly j drafts, except possibly the last (cut short by max_tokens).
    EXPECT_GE(last_.stats.accept_histogram[j], last_.stats.spec_rounds - 1) << "offset " << j;
  }
}

// Verify steps padded to 8 rows (drafts of 2..6: windows of 3..7 rows) with rows past the real ones: the
// emitted tokens and every cache equal plain decoding's at each acceptance offset.
TEST_F(AcceptancePaths, PaddedVerifyRowsChangeNothing) {
  auto padded = test::make_engine(kFixture, SpecMethod::Ngram, 8, 512, "", false, GgmlType::F32, 0,
                                  EngineConfig{}.capture, PadVerify::kOn);
  ASSERT_TRUE(padded);
  for (int cap = 2; cap <= 6; ++cap)
    for (int j = 0; j <= cap; ++j) {  // j == cap: every draft accepted
      GenerateOptions o;
      o.max_tokens = 30;
      const std::string what = std::to_string(cap) + " drafts, offset " + std::to_string(j);
      check(o, [j](int, int i) { return i == j; }, 30, what.c_str(), padded.get(), nullptr, cap);
      EXPECT_GT(last_.stats.padded_rows, 0) << what;
    }
}

// The default (PadVerify::kAuto) pads where steps are recorded as graphs: on CUDA, not on the CPU.
TEST_F(AcceptancePaths, DefaultPadsVerifyStepsWhereStepsAreRecordedAsGraphs) {
  GenerateOptions o;
  o.max_tokens = 30;
  check(o, [](int, int) { return false; }, 30, "5 drafts a round", nullptr, nullptr, 5);
  EXPECT_EQ(last_.stats.padded_rows > 0, test::test_backend_kind() == BackendKind::Cuda);
}

TEST_F(AcceptancePaths, ZeroAcceptanceStillEmitsTheTargetToken) {
  GenerateOptions o;
  o.max_tokens = 20;
  check(o, [](int, int) { return true; }, 20, "zero");
  EXPECT_EQ(last_.stats.accepted, 0);
}

TEST_F(AcceptancePaths, EndOfGenerationInsideAnAcceptedWindowTruncatesOutputAndCaches) {
  // A stop token that first appears at index m of the reference, inside a window of 9.
  for (size_t m = 3; m < 30; ++m) {
    const int32_t stop = ref_[m];
    if (std::find(ref_.begin(), ref_.begin() + m, stop) != ref_.begin() + m) continue;
    GenerateOptions o;
    o.max_tokens = 60;
    o.stop_tokens = {stop};
    check(o, [](int, int) { return false; }, m + 1, "eos inside window");
    EXPECT_EQ(last_.finish, FinishReason::Stop);
    return;
  }
  GTEST_FAIL() << "no usable stop token in the reference continuation";
}

TEST_F(AcceptancePaths, MaxTokensInsideAnAcceptedWindowTruncatesOutputAndCaches) {
  for (int m : {5, 12, 21}) {
    GenerateOptions o;
    o.max_tokens = m;
    check(o, [](int, int) { return false; }, m, "max_tokens");
    EXPECT_EQ(last_.finish, FinishReason::Length);
  }
}

TEST_F(AcceptancePaths, ContextLimitStopsCleanly) {
  const int64_t ctx = static_cast<int64_t>(prompt_.size()) + 23;
  auto plain = test::make_engine(kFixture, SpecMethod::None, 8, ctx);
  auto spec = test::make_engine(kFixture, SpecMethod::Ngram, 8, ctx);
  GenerateOptions o;
  o.max_tokens = 60;
  // The last emitted token fills the context; nothing can be probed after it, so compare one earlier.
  GenerateOptions stop_early = o;
  check(stop_early, [](int, int) { return false; }, 23, "context", spec.get(), plain.get());
  EXPECT_EQ(last_.finish, FinishReason::Context);
}

// What an adaptive session of 60 tokens did whose every draft was wrong (a replay drafter), timed by TestClock.
struct RejectedRun {
  std::vector<int32_t> out;
  SessionStats stats;
  int proposals_checked = 0;
  int64_t largest_decode_observe = 0;
};

// Also: in a plain stretch the drafter's observes wait and come as one call before its next proposal,
// which still sees every committed row. The engine times its rounds on TestClock, so what they cost is
// the same whatever the machine is doing. (On the steady clock this test failed about once in 20 CI runs
// under load: a one-draft verify and a decode step of this tiny model are within timing noise there.)
class RejectedDrafts : public AcceptancePaths {
 protected:
  // hidden_rows: when set, the drafter needs the target's final hidden rows (MTP's) and keeps them there.
  RejectedRun run(EngineConfig c, LookAhead look_ahead, std::vector<std::vector<float>>* hidden_rows = nullptr) {
    RejectedRun r;
    TestClock clock;
    c.clock = [&clock] { return clock.read(); };
    c.look_ahead = look_ahead;
    auto engine = Engine::create(c);
    EXPECT_TRUE(engine.is_ok()) << engine.message();
    if (!engine.is_ok()) return r;
    GenerateOptions o;
    o.max_tokens = 60;
    o.adaptive = true;
    auto s = (*engine)->new_session();
    EXPECT_TRUE(s.is_ok());
    if (!s.is_ok()) return r;
    auto d = std::make_unique<ReplayDrafter>(ref_, prompt_.size(), n_vocab_, [](int, int) { return true; });
    ReplayDrafter* drafter = d.get();
    drafter->watch = s->get();
    drafter->clock = &clock;
    drafter->hidden_rows = hidden_rows;
    drafter->backend = &(*engine)->backend();
    (*s)->set_drafter(std::move(d));
    EXPECT_TRUE((*s)->start(prompt_, o).is_ok());
    while (!(*s)->done()) {
      const Status st = (*s)->step(r.out);
      EXPECT_TRUE(st.is_ok()) << st.message();
      if (!st.is_ok()) break;
    }
    EXPECT_EQ(r.out, std::vector<int32_t>(ref_.begin(), ref_.begin() + 60));
    r.stats = (*s)->stats();
    r.proposals_checked = drafter->proposals_checked;
    r.largest_decode_observe = drafter->largest_decode_observe;
    return r;
  }
};

// With look-ahead, every plain round of the stretches looks ahead (a step enqueued for the next but in each
// stretch's last round, whose successor may speculate).
TEST_F(RejectedDrafts, AdaptiveSpeculationBacksOffWhenDraftsAreNeverAccepted) {
  for (const LookAhead look_ahead : {LookAhead::kOff, LookAhead::kOn}) {
    SCOPED_TRACE(look_ahead == LookAhead::kOn ? "look-ahead" : "no look-ahead");
    const RejectedRun r = run(spec_->config(), look_ahead);
    const SessionStats& st = r.stats;
    EXPECT_EQ(st.accepted, 0);
    // Zero acceptance: drafts shrink (5 tokens at first, then fewer; without adaptation: 8 per round)
    // and speculation is switched off most of the time, in plain stretches that double from 4 rounds after
    // every failed probe.
    EXPECT_LE(st.drafted, 4 * st.spec_rounds);
    EXPECT_EQ(r.proposals_checked, st.spec_rounds);
    // (On CUDA too, where rounds that record a step graph are not timed: session 49.)
    EXPECT_LT(st.spec_rounds * 4, st.rounds) << st.spec_rounds << " speculative rounds of " << st.rounds;
    EXPECT_GT(r.largest_decode_observe, 8);
    EXPECT_EQ(st.ahead_rounds, look_ahead == LookAhead::kOn ? st.rounds - st.spec_rounds : 0);
  }
}

// A drafter that needs the target's rows (MTP's final hidden) gets the same rows, each position once and in
// order, whether the plain stretches look ahead (the step writes its row into the deferred ring by position)
// or not; in stretches of many rounds, observed at once.
TEST_F(RejectedDrafts, LookAheadStretchesKeepTheRowsADrafterNeeds) {
  auto mtp = test::make_engine(kFixture, SpecMethod::Mtp, 8, 512);
  ASSERT_TRUE(mtp);
  const EngineConfig c = mtp->config();
  mtp.reset();
  std::vector<std::vector<float>> rows[2];
  for (const LookAhead look_ahead : {LookAhead::kOff, LookAhead::kOn}) {
    SCOPED_TRACE(look_ahead == LookAhead::kOn ? "look-ahead" : "no look-ahead");
    std::vector<std::vector<float>>& kept = rows[look_ahead == LookAhead::kOn];
    const RejectedRun r = run(c, look_ahead, &kept);
    // Every committed row but the last ones (a plain stretch's rows wait for a proposal that never came).
    EXPECT_GE(kept.size(), prompt_.size() + 30);
    EXPECT_GT(r.largest_decode_observe, 8);
    if (look_ahead == LookAhead::kOn) EXPECT_GT(r.stats.ahead_rounds, 20);
  }
  const size_t n = std::min(rows[0].size(), rows[1].size());
  for (size_t p = 0; p < n; ++p) {
    float diff = 0;
    for (size_t i = 0; i < rows[0][p].size(); ++i) diff = std::max(diff, std::fabs(rows[0][p][i] - rows[1][p][i]));
    ASSERT_LE(diff, 1e-4f) << "the hidden row at position " << p;
  }
}

// A verify step never reads past the key bound of the plain step at its first position (recorded_key_bound:
// on CUDA the attention's split layout, which a row's bits follow): near position 4096 the session asks for
// fewer drafts, and the tokens and caches stay plain decoding's.
TEST(AcceptanceAtAKeyBound, VerifyStepsStayWithinThePlainStepsBound) {
  const int64_t n_ctx = 9000;
  auto plain = test::make_engine(kFixture, SpecMethod::None, 8, n_ctx);
  auto spec = test::make_engine(kFixture, SpecMethod::Ngram, 8, n_ctx, "", false, GgmlType::F32, 0,
                                EngineConfig{}.capture, PadVerify::kOn);
  ASSERT_TRUE(plain && spec);
  std::vector<int32_t> prompt;
  const auto base = test::fixture_prompts(kFixture)[1];
  while (prompt.size() < 4085) prompt.push_back(base[prompt.size() % base.size()]);
  GenerateOptions o;
  o.max_tokens = 30;
  const auto ref = test::generate_ids(*plain, prompt, o);
  ASSERT_EQ(ref.size(), 30u);
  std::vector<std::pair<int64_t, int>> asks;
  auto drafter = std::make_unique<ReplayDrafter>(ref, prompt.size(), plain->model().hparams().n_vocab,
                                                 [](int, int) { return false; });
  drafter->cap = 8;
  drafter->asks = &asks;
  GenerateOptions so = o;
  so.adaptive = false;
  const RunResult s = run_session(*spec, prompt, so, std::move(drafter));
  const RunResult p = run_session(*plain, prompt, o, nullptr);
  EXPECT_EQ(s.emitted, p.emitted);
  ASSERT_EQ(s.next_logits.size(), p.next_logits.size());
  float diff = 0;
  for (size_t i = 0; i < s.next_logits.size(); ++i) diff = std::max(diff, std::fabs(s.next_logits[i] - p.next_logits[i]));
  EXPECT_LE(diff, 1e-4f) << "caches differ from plain decoding";
  bool clipped = false;
  for (const auto& [committed, max_k] : asks) {
    EXPECT_LE(committed + max_k + 1, recorded_key_bound(committed + 1, n_ctx)) << "at " << committed;
    clipped |= committed < 4096 && committed + 9 > 4096 && max_k < 8;
  }
  EXPECT_TRUE(clipped) << "no proposal met the bound at 4096";
}

}  // namespace
}  // namespace hyspec
