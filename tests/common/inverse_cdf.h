// An oracle for draws under temperature alone: the token that an inverse-CDF draw with uniform u lands on,
// in token order, from softmax(l / T) computed in double, and how far u * Z lies from the edges of that
// token's interval (relative to Z). A draw that sums in another order may land on a neighbour only when
// the margin is within rounding.
#pragma once
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <vector>

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

}  // namespace hyspec::test
