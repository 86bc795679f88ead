// The sampler's cuts after temperature (top-k, then min-p, then top-p) and its inverse-CDF draw, in one
// place: Sampler (engine/sampler.h) runs them on the host, the CPU backend's draw_top_k runs this very code,
// and CUDA's draw_top_k takes the same float and double steps on the device from the row's k best tokens
// (backend/cuda/elementwise.cu), so that a uniform draws the same token on every path.
#pragma once
#include <cstdint>
#include <vector>

namespace hyspec {

struct TokenProb {
  int32_t id;
  float p;
};

struct SamplingCut {
  float temperature = 1.0f;  // > 0
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
};

// Best first: logit descending, ties by id (the order every cut keeps a prefix of).
inline bool logit_before(const TokenProb& a, const TokenProb& b) { return a.p > b.p || (a.p == b.p && a.id < b.id); }

// out = (id, logit) -> the distribution (id, p), p > 0 summing to 1: best first when top-k or top-p cut,
// else in out's order. best_first: out is sorted so; otherwise `l` (the row, by id) is needed. rest: the
// sum of exp((l - max) / T) over the row's tokens not in out, unless top-k cuts them away.
void cut_distribution(std::vector<TokenProb>& out, int n_vocab, const SamplingCut& cut, bool best_first, double rest,
                      const float* l);
// The inverse CDF of `dist` in its order at u in [0, 1) (the sampler's draw takes one uniform a draw).
int32_t draw_at(const std::vector<TokenProb>& dist, double u);

}  // namespace hyspec
