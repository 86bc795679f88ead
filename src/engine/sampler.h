// The one sampler: penalties, temperature, top-k, top-p, min-p, seeded RNG. Plain decoding draws
// from `distribution()`, and the speculative verifier uses the very same distribution for its
// acceptance rule, so speculative sampling follows the target distribution exactly.
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "backend/sampling_cut.h"

namespace hyspec {

struct SamplingParams {
  float temperature = 0.0f;  // <= 0: greedy (argmax after penalties)
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  float repeat_penalty = 1.0f;    // llama.cpp-style: divide positive / multiply negative logits of seen tokens
  float presence_penalty = 0.0f;  // OpenAI-style, subtracted once per seen token
  float frequency_penalty = 0.0f; // OpenAI-style, subtracted per occurrence
  int penalty_last_n = 64;        // how many recent tokens the penalties look at (-1: all)
  uint64_t seed = 0;

  bool greedy() const { return temperature <= 0.0f; }
  bool has_penalties() const {
    return repeat_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f;
  }
};

struct TokenLogprob {
  int32_t id;
  float logprob;
};

// One emitted token under the model: its log-probability and the `top` most likely ids, from
// log_softmax of the raw logits (before penalties, temperature and truncation).
struct EmittedLogprobs {
  TokenLogprob token;
  std::vector<TokenLogprob> top;  // descending logprob, ties by id
};
EmittedLogprobs logprobs_of(const float* logits, int n_vocab, int32_t token, int top);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  const SamplingParams& params() const { return params_; }

  // The next-token distribution after every transform, as (id, p) with p > 0 summing to 1: sorted
  // by logit descending (ties by id) when top-k or top-p truncates, else in no set order. Greedy: a
  // single entry with p = 1. `history`: the sequence so far.
  void distribution(const float* logits, int n_vocab, std::span<const int32_t> history,
                    std::vector<TokenProb>& out) const;
  // distribution() of a row known by its best tokens alone: `cand` holds (id, logit) best-first (logit
  // descending, ties by id), a best-first prefix of the row's n_vocab tokens, and `rest` is the sum of
  // exp((l - max) / T) over the tokens not in it. No penalties (they need the whole row). The result
  // is distribution()'s when `cand` is the whole row; with top-k, when `cand` holds at least k tokens;
  // without, when the result is shorter than `cand` (every truncation keeps a best-first prefix, so a
  // cut inside the candidates is the cut of the row).
  void distribution_of_best(std::vector<TokenProb>& cand, int n_vocab, double rest) const;
  // Draw from distribution() with this sampler's RNG.
  int32_t sample(const float* logits, int n_vocab, std::span<const int32_t> history);
  // Draw from an explicit distribution (speculative residuals): one uniform, even from one token.
  int32_t draw(const std::vector<TokenProb>& dist);
  double uniform();  // in [0, 1)
  void reseed(uint64_t seed);

 private:
  // The temperature and cuts that cut_distribution (backend/sampling_cut.h) applies.
  SamplingCut cut() const { return {params_.temperature, params_.top_k, params_.top_p, params_.min_p}; }

  SamplingParams params_;
  std::mt19937_64 rng_;
  mutable std::vector<float> scratch_;
};

}  // namespace hyspec
