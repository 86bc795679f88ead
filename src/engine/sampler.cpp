#include "engine/sampler.h"

#include <algorithm>
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
  cut_distribution(out, n_vocab, cut(), false, 0.0, l);
}

void Sampler::distribution_of_best(std::vector<TokenProb>& cand, int n_vocab, double rest) const {
  if (cand.empty()) return;
  if (params_.greedy()) {
    cand.erase(cand.begin() + 1, cand.end());
    cand[0].p = 1.0f;
    return;
  }
  cut_distribution(cand, n_vocab, cut(), true, rest, nullptr);
}

int32_t Sampler::draw(const std::vector<TokenProb>& dist) {
  // One uniform a draw, even from one token: a backend that draws ahead of the host (Backend::draw_top_k)
  // is handed each draw's uniform before it knows how many tokens the cuts leave.
  return draw_at(dist, uniform());
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
