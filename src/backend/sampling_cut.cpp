#include "backend/sampling_cut.h"

#include <algorithm>
#include <bit>
#include <cmath>

namespace hyspec {

void cut_distribution(std::vector<TokenProb>& out, int n_vocab, const SamplingCut& sp, bool best_first, double rest,
                      const float* l) {
  // Only the cuts need the token order, and only for the tokens they keep: a full sort of a 248K vocabulary
  // took ~38 ms a token on a small CPU. While out[i].p still holds the logit, partial_sort selects the best
  // (each other token costs one compare).
  bool sorted = best_first;  // else all of out in token order
  bool top_k_cut = false;
  if (sp.top_k > 0 && sp.top_k < n_vocab) {
    const size_t k = std::min(out.size(), static_cast<size_t>(sp.top_k));
    if (!sorted) std::partial_sort(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(k), out.end(), logit_before);
    out.resize(k);
    sorted = top_k_cut = true;
  }
  // Softmax with temperature over the candidates (and the mass of the row's other tokens, unless
  // top-k has cut them).
  float mx = -INFINITY;
  if (sorted) mx = out[0].p;
  else for (const auto& t : out) mx = std::max(mx, t.p);
  double sum = top_k_cut ? 0.0 : rest;
  for (auto& t : out) {
    t.p = std::exp((t.p - mx) / sp.temperature);
    sum += t.p;
  }
  for (auto& t : out) t.p = static_cast<float>(t.p / sum);
  if (sp.min_p > 0.0f) {  // p >= min_p * the largest p (the best token's exp(0) / sum); keeps the order
    const float best = static_cast<float>(1.0 / sum), floor_p = std::min(best, sp.min_p * best);
    std::erase_if(out, [&](const TokenProb& t) { return t.p < floor_p; });
  }
  if (sp.top_p < 1.0f) {  // the shortest best-first prefix whose mass reaches top_p
    if (!sorted) {
      // Only the tokens that can be in it get sorted: by the top 12 bits of p (8 buckets per octave;
      // p's bits grow with p), the buckets from the top until their mass reaches top_p, widened by a
      // bucket when the prefix's own sum falls short of the buckets' (float order).
      constexpr int kBuckets = 4096;
      std::vector<double> mass(kBuckets, 0.0);
      std::vector<int> count(kBuckets, 0);
      auto bucket = [](float p) { return static_cast<int>(std::bit_cast<uint32_t>(p) >> 20); };
      for (const auto& t : out) mass[bucket(t.p)] += t.p, ++count[bucket(t.p)];
      int lowest = kBuckets;
      double reached = 0;
      size_t taken = 0;
      while (lowest > 0 && (taken == 0 || reached < sp.top_p)) --lowest, reached += mass[lowest], taken += count[lowest];
      for (;;) {
        const auto end = std::partition(out.begin(), out.end(), [&](const TokenProb& t) { return bucket(t.p) >= lowest; });
        std::sort(out.begin(), end, [l](const TokenProb& a, const TokenProb& b) {
          return l[a.id] > l[b.id] || (l[a.id] == l[b.id] && a.id < b.id);
        });
        double cum = 0;
        for (auto it = out.begin(); it != end && cum < sp.top_p; ++it) cum += it->p;
        if (cum >= sp.top_p || end == out.end()) break;
        do --lowest;
        while (lowest > 0 && count[lowest] == 0);
      }
    }
    double cum = 0;
    size_t n = 0;
    while (n < out.size()) {  // at least one token
      cum += out[n++].p;
      if (cum >= sp.top_p) break;
    }
    out.resize(n);
  }
  double total = 0;
  for (const auto& t : out) total += t.p;
  for (auto& t : out) t.p = static_cast<float>(t.p / total);
  std::erase_if(out, [](const TokenProb& t) { return t.p <= 0.0f; });
}

int32_t draw_at(const std::vector<TokenProb>& dist, double u) {
  if (dist.empty()) return -1;
  double total = 0;
  for (const auto& t : dist) total += t.p;
  u *= total;
  for (const auto& t : dist) {
    u -= t.p;
    if (u < 0) return t.id;
  }
  return dist.back().id;
}

}  // namespace hyspec
