#include "engine/draft_length.h"

#include <algorithm>

namespace hyspec {

namespace {
constexpr double kTolerance = 0.01;
constexpr double kWeight = 0.2, kMaxStep = 1.5;  // cost samples: EMA weight, a sample's bound

// An unmeasured entry between measured ones (> 0) of costs[1..] costs what the one below it does: the
// most it can cost less (costs do not fall as rows are added), so it is tried when that would make it
// the best, which finds the cheap width just below a step (16 rows before a tile of 17). Past the last
// measured entry: the mean slope from the first to the last (one step does not repeat every row), or
// lone_slope(cost) with one.
template <size_t N, class LoneSlope>
double estimate(const std::array<double, N>& costs, int i, LoneSlope lone_slope) {
  i = std::min<int>(i, N - 1);
  if (i < 1) return 0;
  if (costs[i] > 0) return costs[i];
  int lo = i - 1, hi = i + 1;
  while (lo >= 1 && costs[lo] == 0) --lo;
  while (hi < static_cast<int>(N) && costs[hi] == 0) ++hi;
  if (lo >= 1 && hi < static_cast<int>(N)) return costs[lo];
  if (hi < static_cast<int>(N)) return costs[hi];  // nothing measured below
  if (lo < 1) return 0;                            // nothing measured
  int first = 1;
  while (costs[first] == 0) ++first;
  const double slope = first < lo ? std::max(0.0, (costs[lo] - costs[first]) / (lo - first)) : lone_slope(costs[lo]);
  return costs[lo] + slope * (i - lo);
}
}  // namespace

void DraftAcceptance::record(int drafted, int accepted) {
  const int reached = std::min({drafted, accepted + 1, kMaxDraftLength});
  for (int i = 0; i < reached; ++i) {
    reached_[i] = kDecay * reached_[i] + 1.0;
    accepted_[i] = kDecay * accepted_[i] + (i < accepted ? 1.0 : 0.0);
  }
}

double DraftAcceptance::rate(int i) const {
  double prior = kPrior;
  double r = 0;
  for (int j = 0; j <= std::clamp(i, 0, kMaxDraftLength - 1); ++j) {
    r = (accepted_[j] + kPriorWeight * prior) / (reached_[j] + kPriorWeight);
    prior = std::max(kPrior, r);  // a deep position, rarely reached, leans on the one before it
  }
  return r;
}

double DraftAcceptance::expected_accepted(int k) const {
  double sum = 0, reach = 1;
  for (int j = 0; j < std::min(k, kMaxDraftLength); ++j) {
    reach *= rate(j);  // P(drafts 0..j all accepted)
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

double RoundCosts::draft(int k) const {
  return estimate(draft_, k, [](double) { return 0.0; });
}

double RoundCosts::verify(int width) const {
  return estimate(verify_, width, [](double cost) { return cost / 8; });
}

double RoundCosts::commit(int kept) const {
  return estimate(commit_, kept, [](double) { return 0.0; });
}

int best_draft_length(const DraftAcceptance& acceptance, const RoundCosts& costs, int k_max) {
  k_max = std::clamp(k_max, 1, kMaxDraftLength);
  double rates[kMaxDraftLength + 1] = {};
  double best = 0;
  double tokens = 1, reach = 1, commit = 0;  // E[tokens], P(drafts 0..k-1 accepted), E[commit] over j < k
  for (int k = 1; k <= k_max; ++k) {
    const double a = acceptance.rate(k - 1);
    commit += reach * (1 - a) * costs.commit(k);  // draft k-1 rejected: k rows kept
    reach *= a;
    tokens += reach;
    const double cost = costs.draft(k) + costs.verify(k + 1) + commit + reach * costs.commit(k + 1);
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
