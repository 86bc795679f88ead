// How many tokens a speculative round drafts: the length with the most expected tokens per second,
//
//   rate(k) = (1 + E[accepted drafts of k]) / (draft time of k + verify time of k + 1 rows + E[commit time])
//
// from what this sequence's drafts were accepted at each position (DraftAcceptance) and what rounds
// cost on this engine (RoundCosts). Acceptance alone cannot decide it: on CUDA a 9B Q4_K_M verify step
// of 2 rows costs 1.13x a decode step, 5 rows 1.28x, 16 rows 1.58x, 17 rows 1.75x (H200, PERFORMANCE.md
// "Session 48"; the int8 matvecs' 8-token tiles, three at most a pass); an MTP draft step costs the same at
// every position, a DFlash block the same at every length.
#pragma once
#include <array>

namespace hyspec {

inline constexpr int kMaxDraftLength = 64;

// Per-position acceptance: position i (0-based) is reached when the drafts before it were accepted.
// Recent rounds weigh more (each reach decays the position's counts by kDecay). A position's prior is
// the rate of the one before it, or kPrior where that is lower: a draft that got this far is often
// one the drafter knows (a quote of the prompt, a loop), so deep positions, rarely reached, are not
// assumed worse than shallow ones, and one bad round at the first positions does not condemn them.
class DraftAcceptance {
 public:
  void record(int drafted, int accepted);  // one round: `accepted` of `drafted` drafts (a prefix)
  void rates(int k, double* out) const;     // rate(0..k-1), in one pass
  double rate(int i) const;                 // P(draft i accepted | drafts 0..i-1 were)
  double expected_accepted(int k) const;    // E[accepted drafts] when drafting k

 private:
  static constexpr double kDecay = 0.9, kPriorWeight = 1.0, kPrior = 0.75;
  std::array<double, kMaxDraftLength> reached_{}, accepted_{};
};

// Seconds a round's parts cost: the drafter's proposal by draft length, the target's verify step
// (with the acceptance) by width, and the commit (the rollback, the drafter observing the kept rows)
// by rows kept, which follows acceptance, not the draft length. Between measured points an estimate
// is the cost of the point below (a lower bound: costs do not fall as rows are added); past the last
// one it follows the mean slope of the measured ones (one point alone: a verify width 1/8 of its cost
// a row, the others flat). So a length is tried when its estimate looks best, and then its cost is
// known: a backend's steps (a new tile of rows) show once measured, and so does the cheap width
// just below one.
// Samples enter an average clipped to 1.5x either way of the estimate (a preempted round says little
// about the next), with the same weight whichever way they move it, so a width measured often does
// not look cheaper for being measured often.
class RoundCosts {
 public:
  void record_draft(int k, double seconds);
  void record_verify(int width, double seconds);
  void record_commit(int kept, double seconds);
  double draft(int k) const;       // 0 for k = 0, or before any draft was measured
  double verify(int width) const;  // 0 before any round was measured
  double commit(int kept) const;
  // The three estimates for entries 0..n (n <= kMaxDraftLength + 1) in one pass each.
  void estimates(int n, double* draft, double* verify, double* commit) const;

  using Table = std::array<double, kMaxDraftLength + 2>;  // by length, width or rows kept

 private:
  static void update(Table& table, int i, double sample);
  Table draft_{}, verify_{}, commit_{};  // 0: not measured
};

// The draft length in 1..k_max with the best rate (the commit's cost averaged over the rows acceptance
// keeps), preferring the shortest within 1% of it (a longer draft that adds less spends drafting and
// verify rows on noise). With no cost measured yet every length costs alike, and acceptance decides.
int best_draft_length(const DraftAcceptance& acceptance, const RoundCosts& costs, int k_max);

// One sequence's adaptive length: best_draft_length over its acceptance, except that every
// kExploreEvery-th choice drafts one more. The estimates past the best length (the next position's
// acceptance, the next width's cost) change only when it is drafted, so without this one unlucky round
// there (a rejected draft, a slow first replay) would keep the length below it for good.
class DraftLengthPolicy {
 public:
  int choose(const RoundCosts& costs, int k_max);
  void record(int drafted, int accepted) { acceptance_.record(drafted, accepted); }

 private:
  static constexpr int kExploreEvery = 4;
  DraftAcceptance acceptance_;
  int choices_since_explore_ = 0;
};

}  // namespace hyspec
