// CPU matmul: y[t] = W x[t]. Activations are prepared once for the weight type (quant_dot.h);
// output rows are split across threads, and each thread runs its rows against all tokens through
// vec_dot_tile, which (for Q8_0) decodes each weight block once per pair of tokens and each
// activation block once per 4 weight rows. A single token (decode) is the same call with one
// activation row: a streaming matrix-vector product, 4 weight rows per pass.
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/quant_dot.h"

namespace hyspec::cpu {

namespace {
// Single-thread cost per multiply-add (ns), for the threading decision: the Q8_0 tile kernel does
// ~14 MACs per cycle at 2 GHz; the per-pair dot kernels of other types ~2-3x less.
double ns_per_mac(GgmlType t) { return t == GgmlType::Q8_0 ? 0.035 : 0.08; }
// Preparing an activation element: ~0.15 ns for the vectorised Q8_0 quantizer or a copy, a few ns
// for the scalar Q8_1/Q8_K quantizers.
double ns_per_prepared(GgmlType t) {
  const size_t q8_0 = prepared_row_bytes(GgmlType::Q8_0, 32), f32 = prepared_row_bytes(GgmlType::F32, 32);
  const size_t mine = prepared_row_bytes(t, 32);
  return mine == q8_0 || mine == f32 ? 0.15 : 2.0;
}
}  // namespace

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
  parallel_for_cost(pool, n, static_cast<double>(k) * ns_per_prepared(w.type), [&](int64_t b, int64_t e, int) {
    for (int64_t t = b; t < e; ++t) prepare_activation_row(w.type, x.row(t), k, a + t * act_bytes);
  });
  const auto* wd = static_cast<const uint8_t*>(w.data);
  auto rows = [&](int64_t b, int64_t e, int) {
    // Tokens in chunks, so that a chunk's activations stay in L2 while the rows stream past.
    constexpr int64_t kTokenChunk = 256;
    for (int64_t t0 = 0; t0 < n; t0 += kTokenChunk) {
      const int cols = static_cast<int>(std::min(kTokenChunk, n - t0));
      vec_dot_tile(w.type, wd + b * w.row_bytes, w.row_bytes, a + t0 * act_bytes, act_bytes, k, static_cast<int>(e - b),
                   cols, y.row(t0) + b, y.stride);
    }
  };
  parallel_for_cost(pool, m, static_cast<double>(n * k) * ns_per_mac(w.type), rows, 4);
}

}  // namespace hyspec::cpu
