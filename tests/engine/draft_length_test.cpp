// The adaptive draft length (engine/draft_length.h): acceptance by position, cost estimates, and the
// length the rule picks against an exhaustive search of the same rate.
#include "engine/draft_length.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <utility>
#include <vector>

namespace hyspec {
namespace {

RoundCosts flat_costs(int widths, double draft_step, double verify) {
  RoundCosts c;
  for (int k = 1; k < widths; ++k) c.record_draft(k, draft_step * k);
  for (int w = 1; w <= widths; ++w) c.record_verify(w, verify);
  return c;
}

TEST(DraftAcceptance, RatesFollowEachPosition) {
  DraftAcceptance a;
  EXPECT_NEAR(a.rate(0), 0.75, 1e-12);  // the prior, before any round
  for (int r = 0; r < 200; ++r) a.record(2, r % 2 ? 2 : 0);  // half the rounds take both drafts, half none
  EXPECT_NEAR(a.rate(0), 0.5, 0.08);  // ~10 recent rounds and the prior decide
  EXPECT_GT(a.rate(1), 0.9);                  // reached only when the first was accepted, then always accepted
  EXPECT_NEAR(a.rate(2), a.rate(1), 1e-12);   // never reached: leans on the position before
  DraftAcceptance b;
  for (int r = 0; r < 50; ++r) b.record(3, 0);
  EXPECT_NEAR(b.rate(1), 0.75, 1e-12);        // but not below the prior
  EXPECT_NEAR(a.expected_accepted(2), a.rate(0) * (1 + a.rate(1)), 1e-12);
  EXPECT_EQ(a.expected_accepted(0), 0.0);
}

TEST(DraftAcceptance, RecentRoundsOutweighOldOnes) {
  DraftAcceptance a;
  for (int r = 0; r < 100; ++r) a.record(4, 4);
  for (int r = 0; r < 30; ++r) a.record(4, 0);
  EXPECT_LT(a.rate(0), 0.15);
}

TEST(RoundCosts, EstimatesBetweenMeasuredPointsAreLowerBoundsAndPastThemFollowTheSlope) {
  RoundCosts c;
  EXPECT_EQ(c.verify(3), 0.0);
  c.record_verify(1, 1.0);
  EXPECT_DOUBLE_EQ(c.verify(9), 2.0);  // one width alone: 1/8 of its cost a row
  c.record_verify(4, 2.0);
  EXPECT_DOUBLE_EQ(c.verify(3), 1.0);   // between: what the width below costs
  EXPECT_DOUBLE_EQ(c.verify(10), 4.0);  // the measured points' slope
  c.record_verify(5, 3.0);               // a step (a new tile) at width 5
  EXPECT_DOUBLE_EQ(c.verify(9), 5.0);   // past it the mean slope, 2/4 a row, not the step's 1 a row
  c.record_verify(4, 100.0);  // one preempted round
  EXPECT_DOUBLE_EQ(c.verify(4), 2.2);  // moves by 0.2 of 1.5x
  c.record_verify(4, 0.0001);
  EXPECT_NEAR(c.verify(4), 2.2 - 0.2 * (2.2 - 2.2 / 1.5), 1e-12);
  EXPECT_EQ(c.draft(0), 0.0);
  c.record_draft(3, 0.3);
  EXPECT_DOUBLE_EQ(c.draft(1), 0.3);  // one draft length alone: flat (a block drafter's cost)
  EXPECT_DOUBLE_EQ(c.draft(7), 0.3);
  c.record_draft(5, 0.5);
  EXPECT_DOUBLE_EQ(c.draft(7), 0.7);  // a chained drafter's cost grows by the step
}

TEST(BestDraftLength, AvoidsAVerifyWidthThatStartsATile) {
  DraftAcceptance a;
  for (int r = 0; r < 50; ++r) a.record(16, 16);  // every draft accepted
  // 9B-like costs (decode = 1): widths up to 16 cost 1 + 0.0213 (w - 1); 17 rows start a third tile.
  RoundCosts c;
  for (int w = 1; w <= 16; ++w) c.record_verify(w, 1.0 + 0.0213 * (w - 1));
  c.record_verify(17, 1.43);
  EXPECT_EQ(best_draft_length(a, c, 16), 15);
  RoundCosts smooth;
  for (int w = 1; w <= 17; ++w) smooth.record_verify(w, 1.0 + 0.0213 * (w - 1));
  EXPECT_EQ(best_draft_length(a, smooth, 16), 16);
}

TEST(BestDraftLength, NeverAcceptedDraftsShrinkToOne) {
  DraftAcceptance a;
  for (int r = 0; r < 20; ++r) a.record(8, 0);
  EXPECT_EQ(best_draft_length(a, flat_costs(9, 0.05, 1.0), 8), 1);
}

TEST(BestDraftLength, MatchesAnExhaustiveSearchWithDraftCosts) {
  // MTP-like: a draft step costs `step` of a decode step; verify rows add a little each.
  for (double step : {0.02, 0.1, 0.3}) {
    for (int pattern : {1, 2, 3, 5}) {
      DraftAcceptance a;
      for (int r = 0; r < 300; ++r) a.record(12, r % pattern == 0 ? 12 : r % 4);
      RoundCosts c;
      for (int k = 1; k <= 12; ++k) c.record_draft(k, step * k);
      for (int w = 1; w <= 13; ++w) c.record_verify(w, 1.0 + 0.03 * (w - 1));
      double best = 0;
      for (int k = 1; k <= 12; ++k)
        best = std::max(best, (1 + a.expected_accepted(k)) / (step * k + 1.0 + 0.03 * k));
      const int got = best_draft_length(a, c, 12);
      const double rate = (1 + a.expected_accepted(got)) / (step * got + 1.0 + 0.03 * got);
      EXPECT_GE(rate, 0.99 * best) << "step " << step << " pattern " << pattern << " k " << got;
      for (int k = 1; k < got; ++k)  // the shortest length within 1% of the best
        EXPECT_LT((1 + a.expected_accepted(k)) / (step * k + 1.0 + 0.03 * k), 0.99 * best);
    }
  }
}

TEST(BestDraftLength, ACommitThatGrowsWithRowsKeptDoesNotShortenDrafts) {
  // The commit's cost follows the rows acceptance keeps, so it is paid per emitted token whatever the
  // draft length: with flat verify costs and drafts that are always accepted, the longest length wins.
  DraftAcceptance a;
  for (int r = 0; r < 50; ++r) a.record(8, 8);
  RoundCosts c = flat_costs(9, 0.0, 1.0);
  for (int kept = 1; kept <= 9; ++kept) c.record_commit(kept, 0.5 * kept);
  EXPECT_EQ(best_draft_length(a, c, 8), 8);
}

TEST(BestDraftLength, TriesAnUnmeasuredWidthThenHeedsItsCost) {
  DraftAcceptance a;
  for (int r = 0; r < 50; ++r) a.record(8, 8);
  RoundCosts c = flat_costs(4, 0.0, 1.0);  // widths 1..4 measured at decode's cost
  const int first = best_draft_length(a, c, 8);
  EXPECT_GT(first, 3);  // wider widths look as cheap as width 4 until measured
  for (int w = 5; w <= 9; ++w) c.record_verify(w, 10.0);  // they are not
  EXPECT_EQ(best_draft_length(a, c, 8), 3);
}

// A session's rounds against a 9B-like cost table (decode = 1; 16 rows 1.30x, 17..24 rows 1.41-1.54x,
// 25 rows 2.03x), every draft accepted except in the first probe, whose fourth draft is rejected and whose
// verify step runs 1.4x slow (a first replay). Returns the lengths chosen.
std::vector<int> simulate_rounds(int rounds, int k_max) {
  auto verify_cost = [](int w) {
    if (w <= 16) return 1.0 + 0.02 * (w - 1);
    if (w <= 24) return 1.41 + 0.0186 * (w - 17);
    return 2.03 + 0.06 * (w - 25);
  };
  RoundCosts costs;
  costs.record_verify(1, 1.0);  // the opening plain rounds
  DraftLengthPolicy policy;
  std::vector<int> chosen;
  for (int r = 0; r < rounds; ++r) {
    const int k = policy.choose(costs, k_max);
    chosen.push_back(k);
    policy.record(k, r == 0 ? std::min(k, 3) : k);
    costs.record_verify(k + 1, verify_cost(k + 1) * (r == 0 ? 1.4 : 1.0));
  }
  return chosen;
}

TEST(DraftLengthPolicy, ClimbsPastAnUnluckyFirstProbeToTheCheapestTile) {
  // With at most 16 drafts: 15 (16 rows, 1.30x) beats 16 (17 rows, 1.41x); with at most 32, 23 (24 rows,
  // 1.54x: 15.6 tokens a decode step's time) beats both 15 (12.3) and 32 (33 rows, 2.51x: 13.1). In the
  // last 20 rounds every choice is that length but the explored one above it, every fourth round.
  for (auto [k_max, best] : {std::pair{16, 15}, std::pair{32, 23}}) {
    const std::vector<int> chosen = simulate_rounds(60, k_max);
    int at_best = 0;
    for (size_t r = 40; r < chosen.size(); ++r) at_best += chosen[r] == best;
    EXPECT_EQ(at_best, 15) << "at most " << k_max << " drafts: rounds 40..59 should choose " << best;
  }
}

}  // namespace
}  // namespace hyspec
