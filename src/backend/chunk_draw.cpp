#include "backend/chunk_draw.h"

#include <cmath>

#include "backend/logit_summary.h"

namespace hyspec {

double chunk_total(const float* mass, int64_t chunks) {
  double z = 0;
  for (int64_t c = 0; c < chunks; ++c) z += mass[c];
  return z;
}

bool chunk_row_drawable(const ChunkedRow& row) {
  return std::isfinite(row.max) && std::isfinite(row.total) && row.total > 0;
}

double chunk_token_mass(float logit, float max, float temperature) {
  return logit > -INFINITY ? static_cast<double>(std::exp((logit - max) / temperature)) : 0.0;
}

int32_t draw_by_chunks(const ChunkedRow& row, int32_t exclude, const std::function<double()>& uniform,
                       const std::function<float(int32_t)>& logit_of,
                       const std::function<std::span<const float>(int64_t)>& chunk) {
  constexpr int64_t kChunk = LogitSummary::kChunk;
  const bool excluding = exclude >= 0 && exclude < row.n_vocab;
  const double e_x = excluding ? chunk_token_mass(logit_of(exclude), row.max, row.temperature) : 0.0;
  const int64_t c_x = excluding ? exclude / kChunk : -1;
  const double total = row.total - e_x;
  if (!(total > 0)) return -1;
  double target = uniform() * total;
  int64_t c = -1, last = -1;
  double chunk_sum = 0;
  for (int64_t ch = 0; ch < row.chunks; ++ch) {
    const double s = row.mass[ch] - (ch == c_x ? e_x : 0.0);
    if (!(s > 0)) continue;
    last = ch;
    chunk_sum = s;
    if (target < s) {
      c = ch;
      break;
    }
    target -= s;
  }
  if (last < 0) return -1;
  if (c < 0) c = last, target = chunk_sum;  // past the end by rounding: the last token that can be drawn
  // The chunk's share of the target, rescaled to the sum of its tokens' own exps.
  const std::span<const float> l = chunk(c);
  double own = 0;
  for (size_t i = 0; i < l.size(); ++i)
    if (static_cast<int64_t>(c * kChunk + static_cast<int64_t>(i)) != exclude)
      own += chunk_token_mass(l[i], row.max, row.temperature);
  double t = target / chunk_sum * own;
  int32_t best = -1;
  for (size_t i = 0; i < l.size(); ++i) {
    const int32_t id = static_cast<int32_t>(c * kChunk + static_cast<int64_t>(i));
    const double e = id == exclude ? 0.0 : chunk_token_mass(l[i], row.max, row.temperature);
    if (!(e > 0)) continue;
    best = id;
    t -= e;
    if (t < 0) return id;
  }
  return best;
}

}  // namespace hyspec
