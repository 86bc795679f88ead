// Oracles for sampled draws, in double: the token that an inverse-CDF draw with uniform u lands on, and how
// far from an edge (of that token's interval, or of a cut) the draw lies. A draw in float, or summed in
// another order, may land elsewhere only when the margin is within rounding.
// - inverse_cdf: temperature alone, in token order, from softmax(l / T); the margin relative to Z.
// - cut_inverse_cdf: the sampler's cuts (top-k, then min-p, then top-p) best first (logit descending, ties by
//   id; NaN never); the margin relative to the kept mass, or to 1 at a cut.
#pragma once
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/sampling_cut.h"

namespace hyspec::test {

struct CdfPick {
  int32_t token = -1;
  double margin = 0;
};

inline CdfPick inverse_cdf(const float* l, int64_t n, float temperature, double u) {
  float m = -FLT_MAX;
  for (int64_t i = 0; i < n; ++i) m = l[i] > m ? l[i] : m;
  std::vector<double> e(static_cast<size_t>(n), 0.0);
  double z = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (l[i] > -INFINITY) e[i] = std::exp(static_cast<double>(l[i] - m) / temperature);
    z += e[i];
  }
  const double target = u * z;
  double before = 0;
  CdfPick pick;
  for (int64_t i = 0; i < n; ++i) {
    if (!(e[i] > 0)) continue;
    pick = {static_cast<int32_t>(i), std::min(target - before, before + e[i] - target) / z};
    if (before + e[i] > target) return pick;
    before += e[i];
  }
  return pick;  // past the end by rounding: the last token with mass
}

inline CdfPick cut_inverse_cdf(const float* l, int64_t n, const SamplingCut& cut, double u) {
  const int top_k = cut.top_k;
  const float temperature = cut.temperature, top_p = cut.top_p, min_p = cut.min_p;
  std::vector<int32_t> order;
  for (int64_t i = 0; i < n; ++i)
    if (!std::isnan(l[i])) order.push_back(static_cast<int32_t>(i));
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
  if (top_k > 0 && static_cast<size_t>(top_k) < order.size()) order.resize(static_cast<size_t>(top_k));
  std::vector<double> p;
  double z = 0;
  for (int32_t id : order) {
    p.push_back(l[id] > -INFINITY ? std::exp(static_cast<double>(l[id] - l[order[0]]) / temperature) : 0.0);
    z += p.back();
  }
  CdfPick pick;
  pick.margin = 1;
  size_t kept = p.size();
  if (min_p > 0) {
    for (size_t i = 0; i < p.size(); ++i) {
      pick.margin = std::min(pick.margin, std::fabs(p[i] / z - min_p * p[0] / z));
      if (p[i] < min_p * p[0]) kept = std::min(kept, i);
    }
  }
  if (top_p < 1) {
    double cum = 0;  // of the probabilities before min-p's cut (the sampler does not renormalise between)
    for (size_t i = 0; i < kept; ++i) {
      cum += p[i] / z;
      pick.margin = std::min(pick.margin, std::fabs(cum - top_p));
      if (cum >= top_p) {
        kept = i + 1;
        break;
      }
    }
  }
  double total = 0;
  for (size_t i = 0; i < kept; ++i) total += p[i];
  const double target = u * total;
  double before = 0;
  for (size_t i = 0; i < kept; ++i) {
    if (!(p[i] > 0)) continue;
    pick.token = order[i];
    const double edge = std::min(target - before, before + p[i] - target) / total;
    if (before + p[i] > target) {
      pick.margin = std::min(pick.margin, edge);
      return pick;
    }
    before += p[i];
  }
  pick.margin = 0;  // past the end by rounding
  return pick;
}

}  // namespace hyspec::test
