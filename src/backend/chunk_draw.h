// The sampler's draw under temperature alone from a row known by its LogitSummary chunk masses: the
// inverse CDF in token order of softmax(l / T), where the masses pick the chunk and the chunk's own
// exps (in double) pick the token in it. LogitRows draws so on the host, the CPU backend's draw_token
// runs this very code, and CUDA's draw_token takes the same steps on the device (its in-chunk sums in
// another order, so a draw may differ at a rounding edge of a token).
#pragma once
#include <cstdint>
#include <functional>
#include <span>

namespace hyspec {

struct ChunkedRow {
  float max = 0;                  // the row's largest logit
  const float* mass = nullptr;    // [chunks] sum of exp((l - max) / T) over each chunk
  int64_t chunks = 0, n_vocab = 0;
  double total = 0;               // the masses summed in chunk order (chunk_total)
  float temperature = 1;
};

// The masses summed in chunk order, in double; whether the row can be drawn from: a finite max and a
// finite, positive total.
double chunk_total(const float* mass, int64_t chunks);
bool chunk_row_drawable(const ChunkedRow& row);
// A token's share exp((l - max) / T) as the in-chunk walk counts it (0 for NaN and -inf).
double chunk_token_mass(float logit, float max, float temperature);

// One draw; with exclude >= 0, from the row without that token (a speculative residual). `uniform` is
// called once, unless nothing is left; `logit_of(id)` and `chunk(c)` read the row. -1: nothing can be
// drawn (the masses and the chunk's exps disagree at underflow).
int32_t draw_by_chunks(const ChunkedRow& row, int32_t exclude, const std::function<double()>& uniform,
                       const std::function<float(int32_t)>& logit_of,
                       const std::function<std::span<const float>(int64_t)>& chunk);

}  // namespace hyspec
