#include "engine/draft_length.h"

#include <algorithm>

namespace hyspec {

namespace {
constexpr double kTolerance = 0.01;
constexpr double kWeight = 0.2, kMaxStep = 1.5;  // cost samples: EMA weight, a sample's bound

// Estimates of costs[0..n] in one pass. An unmeasured entry between measured ones (> 0) costs what the
// one below it does: the most it can cost less (costs do not fall as rows are added), so it is tried
// when that would make it the best, which finds the cheap width just below a step (16 rows before a tile
// of 17). Below the first measured entry: that entry. Past the last: the mean slope from the first to
// the last (one step does not repeat every row), or lone_slope(cost) with one. Nothing measured: 0.
template <size_t N, class LoneSlope>
void estimates(const std::array<double, N>& costs, int n, LoneSlope lone_slope, double* out) {
  constexpr int kLast = static_cast<int>(N) - 1;
  int first = 1, last = kLast;
  while (first <= kLast && costs[first] == 0) ++first;
  while (last >= 1 && costs[last] == 0) --last;
  const double slope = first > last ? 0
                       : first < last ? std::max(0.0, (costs[last] - costs[first]) / (last - first))
                                      : lone_slope(costs[first]);
  int lo = 0;  // the measured entry at or below i
  for (int i = 0; i <= n; ++i) {
    const int c = std::min(i, kLast);
    if (c >= 1 && costs[c] > 0) lo = c;
    out[i] = c < 1 || first > last ? 0 : lo == 0 ? costs[first] : c <= last ? costs[lo] : costs[lo] + slope * (i - lo);
  }
}

// Lone slopes: a verify width alone costs 1/8 of it a row; a draft length or a commit alone, flat.
const auto kFlat = [](double) { return 0.0; };
const auto kEighthARow = [](double cost) { return cost / 8; };

template <class LoneSlope>
double estimate_at(const RoundCosts::Table& costs, int i, LoneSlope lone_slope) {
  if (i < 0) return 0;
  i = std::min(i, kMaxDraftLength + 1);
  RoundCosts::Table out;
  estimates(costs, i, lone_slope, out.data());
  return out[i];
}
}  // namespace

void DraftAcceptance::record(int drafted, int accepted) {
  const int reached = std::min({drafted, accepted + 1, kMaxDraftLength});
  for (int i = 0; i < reached; ++i) {
    reached_[i] = kDecay * reached_[i] + 1.0;
    accepted_[i] = kDecay * accepted_[i] + (i < accepted ? 1.0 : 0.0);
  }
}

void DraftAcceptance::rates(int k, double* out) const {
  double prior = kPrior;
  for (int j = 0; j < std::min(k, kMaxDraftLength); ++j) {
    out[j] = (accepted_[j] + kPriorWeight * prior) / (reached_[j] + kPriorWeight);
    prior = std::max(kPrior, out[j]);  // a deep position, rarely reached, leans on the one before it
  }
}

double DraftAcceptance::rate(int i) const {
  double r[kMaxDraftLength];
  i = std::clamp(i, 0, kMaxDraftLength - 1);
  rates(i + 1, r);
  return r[i];
}

double DraftAcceptance::expected_accepted(int k) const {
  double r[kMaxDraftLength];
  k = std::clamp(k, 0, kMaxDraftLength);
  rates(k, r);
  double sum = 0, reach = 1;
  for (int j = 0; j < k; ++j) {
    reach *= r[j];  // P(drafts 0..j all accepted)
    sum += reach;
  }
  return sum;
}

void RoundCosts::update(Table& table, int i, double sample) {
  if (i < 1 || i >= static_cast<int>(table.size()) || !(sample > 0)) return;
  double& e = table[i];
  e = e == 0 ? sample : e + kWeight * (std::clamp(sample, e / kMaxStep, e * kMaxStep) - e);
}

void RoundCosts::record_draft(int k, double seconds) { update(draft_, k, seconds); }
void RoundCosts::record_verify(int width, double seconds) { update(verify_, width, seconds); }
void RoundCosts::record_commit(int kept, double seconds) { update(commit_, kept, seconds); }

void RoundCosts::estimates(int n, double* draft, double* verify, double* commit) const {
  n = std::clamp(n, 0, kMaxDraftLength + 1);
  ::hyspec::estimates(draft_, n, kFlat, draft);
  ::hyspec::estimates(verify_, n, kEighthARow, verify);
  ::hyspec::estimates(commit_, n, kFlat, commit);
}

double RoundCosts::draft(int k) const { return estimate_at(draft_, k, kFlat); }
double RoundCosts::verify(int width) const { return estimate_at(verify_, width, kEighthARow); }
double RoundCosts::commit(int kept) const { return estimate_at(commit_, kept, kFlat); }

int best_draft_length(const DraftAcceptance& acceptance, const RoundCosts& costs, int k_max) {
  k_max = std::clamp(k_max, 1, kMaxDraftLength);
  double a[kMaxDraftLength];
  acceptance.rates(k_max, a);
  RoundCosts::Table draft, verify, commit;
  costs.estimates(k_max + 1, draft.data(), verify.data(), commit.data());
  double rates[kMaxDraftLength + 1] = {};
  double best = 0;
  double tokens = 1, reach = 1, expected_commit = 0;  // E[tokens], P(drafts 0..k-1 accepted), E[commit] over j < k
  for (int k = 1; k <= k_max; ++k) {
    expected_commit += reach * (1 - a[k - 1]) * commit[k];  // draft k-1 rejected: k rows kept
    reach *= a[k - 1];
    tokens += reach;
    const double cost = draft[k] + verify[k + 1] + expected_commit + reach * commit[k + 1];
    rates[k] = tokens / (cost > 0 ? cost : 1.0);
    best = std::max(best, rates[k]);
  }
  for (int k = 1; k <= k_max; ++k)
    if (rates[k] >= (1.0 - kTolerance) * best) return k;
  return k_max;
}

int DraftLengthPolicy::choose(const RoundCosts& costs, int k_max) {
  int k = best_draft_length(acceptance_, costs, k_max);
  if (++choices_since_explore_ >= kExploreEvery && k < k_max) {
    choices_since_explore_ = 0;
    ++k;
  }
  return k;
}

}  // namespace hyspec
