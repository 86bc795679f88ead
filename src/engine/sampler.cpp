#include "engine/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>
#include <unordered_map>

namespace hyspec {

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

void Sampler::reseed(uint64_t seed) { rng_.seed(seed); }

double Sampler::uniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }

void Sampler::distribution(const float* logits, int n_vocab, std::span<const int32_t> history,
                           std::vector<TokenProb>& out) const {
  out.clear();
  const SamplingParams& sp = params_;
  const float* l = logits;
  if (sp.has_penalties() && !history.empty()) {
    scratch_.assign(logits, logits + n_vocab);
    const size_t window = sp.penalty_last_n < 0 ? history.size()
                                                : std::min(history.size(), static_cast<size_t>(sp.penalty_last_n));
    std::unordered_map<int32_t, int> counts;
    for (size_t i = history.size() - window; i < history.size(); ++i) ++counts[history[i]];
    for (const auto& [id, count] : counts) {
      if (id < 0 || id >= n_vocab) continue;
      float& v = scratch_[id];
      if (sp.repeat_penalty != 1.0f) v = v > 0 ? v / sp.repeat_penalty : v * sp.repeat_penalty;
      v -= sp.presence_penalty + sp.frequency_penalty * static_cast<float>(count);
    }
    l = scratch_.data();
  }
  if (sp.greedy()) {
    out.push_back({static_cast<int32_t>(std::max_element(l, l + n_vocab) - l), 1.0f});
    return;
  }
  out.resize(static_cast<size_t>(n_vocab));
  for (int i = 0; i < n_vocab; ++i) out[i] = {i, l[i]};
  truncate(out, n_vocab, false, 0.0, l);
}

void Sampler::distribution_of_best(std::vector<TokenProb>& cand, int n_vocab, double rest) const {
  if (cand.empty()) return;
  if (params_.greedy()) {
    cand.erase(cand.begin() + 1, cand.end());
    cand[0].p = 1.0f;
    return;
  }
  truncate(cand, n_vocab, true, rest, nullptr);
}

void Sampler::truncate(std::vector<TokenProb>& out, int n_vocab, bool best_first, double rest, const float* l) const {
  const SamplingParams& sp = params_;
  // Token order: by logit descending, ties by id. Only the truncations need it, and only for the
  // tokens they keep: a full sort of a 248K vocabulary took ~38 ms a token on a small CPU. While
  // out[i].p still holds the logit, partial_sort selects the best (each other token costs one compare).
  const auto by_logit = [](const TokenProb& a, const TokenProb& b) { return a.p > b.p || (a.p == b.p && a.id < b.id); };
  bool sorted = best_first;  // else all of out in token order
  bool top_k_cut = false;
  if (sp.top_k > 0 && sp.top_k < n_vocab) {
    const size_t k = std::min(out.size(), static_cast<size_t>(sp.top_k));
    if (!sorted) std::partial_sort(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(k), out.end(), by_logit);
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

int32_t Sampler::draw(const std::vector<TokenProb>& dist) {
  if (dist.size() == 1) return dist[0].id;
  double u = uniform();
  double total = 0;
  for (const auto& t : dist) total += t.p;
  u *= total;
  for (const auto& t : dist) {
    u -= t.p;
    if (u < 0) return t.id;
  }
  return dist.back().id;
}

int32_t Sampler::sample(const float* logits, int n_vocab, std::span<const int32_t> history) {
  std::vector<TokenProb> dist;
  distribution(logits, n_vocab, history, dist);
  return draw(dist);
}

EmittedLogprobs logprobs_of(const float* logits, int n_vocab, int32_t token, int top) {
  const float mx = *std::max_element(logits, logits + n_vocab);
  double sum = 0;
  for (int i = 0; i < n_vocab; ++i) sum += std::exp(static_cast<double>(logits[i] - mx));
  const double log_z = mx + std::log(sum);
  const auto lp = [&](int32_t id) { return static_cast<float>(logits[id] - log_z); };
  EmittedLogprobs e{{token, token >= 0 && token < n_vocab ? lp(token) : -INFINITY}, {}};
  const int k = std::clamp(top, 0, n_vocab);
  if (k == 0) return e;
  // The k best by a bounded heap (ordered so that the worst kept id is at the front).
  const auto better = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::vector<int32_t> heap;
  heap.reserve(k + 1);
  for (int32_t i = 0; i < n_vocab; ++i) {
    if (static_cast<int>(heap.size()) < k) {
      heap.push_back(i);
      std::push_heap(heap.begin(), heap.end(), better);
    } else if (better(i, heap.front())) {
      std::pop_heap(heap.begin(), heap.end(), better);
      heap.back() = i;
      std::push_heap(heap.begin(), heap.end(), better);
    }
  }
  std::sort(heap.begin(), heap.end(), better);
  for (int32_t id : heap) e.top.push_back({id, lp(id)});
  return e;
}

}  // namespace hyspec
