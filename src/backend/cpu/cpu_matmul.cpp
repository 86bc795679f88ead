// CPU matmul: y[t] = W x[t]. Activations are prepared once for the weight type (quant_dot.h),
// then output rows are split across threads; each weight row is read once per call and dotted
// with every activation row while it is in cache.
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/quant_dot.h"

namespace hyspec::cpu {

Weight expert_slice(const Weight& w, int64_t expert) {
  Weight e = w;
  e.n_expert = 1;
  e.data = static_cast<const uint8_t*>(w.data) + static_cast<size_t>(expert * w.n_out) * w.row_bytes;
  return e;
}

void matmul(ThreadPool& pool, const Weight& w, Rows x, Rows y) {
  if (w.exact && w.type != GgmlType::F32) return matmul_exact(pool, w, x, y);
  const int64_t n = x.n_rows, k = w.n_in, m = w.n_out;
  const size_t act_bytes = prepared_row_bytes(w.type, k);
  thread_local std::vector<uint8_t> act;  // the caller's; workers only read it
  if (act.size() < act_bytes * n) act.resize(act_bytes * n);
  uint8_t* a = act.data();
  for (int64_t t = 0; t < n; ++t) prepare_activation_row(w.type, x.row(t), k, a + t * act_bytes);

  const auto* wd = static_cast<const uint8_t*>(w.data);
  auto rows = [&](int64_t b, int64_t e, int) {
    constexpr int64_t kTokenTile = 8;  // keep a few activation rows hot against each weight row
    for (int64_t t0 = 0; t0 < n; t0 += kTokenTile) {
      const int64_t t1 = std::min(n, t0 + kTokenTile);
      for (int64_t o = b; o < e; ++o) {
        const uint8_t* wr = wd + o * w.row_bytes;
        for (int64_t t = t0; t < t1; ++t) y.row(t)[o] = vec_dot(w.type, wr, a + t * act_bytes, k);
      }
    }
  };
  if (m * k * n < (1 << 15)) {
    rows(0, m, 0);
  } else {
    pool.parallel_for(m, rows, 4);
  }
}

}  // namespace hyspec::cpu
