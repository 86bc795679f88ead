// CPU matmul: y[t] = W x[t]. Activations are prepared once for the weight type (quant_dot.h), then
// vec_dot_tile runs weight rows against activation rows, which (for Q8_0) loads each weight block
// once per 2-4 tokens and each activation block once per 4 weight rows. A single token (decode)
// is the same call with one activation row: a streaming matrix-vector product, 4 rows per pass.
//
// Threads split the work one of two ways:
// - by tokens, when the weight fits in L2 (small models, and a prompt's worth of tokens): each
//   thread prepares its own tokens' activations and runs them against all rows. Preparation is
//   then parallel too; split by rows it would be a serial step before every matmul (~7% of a
//   prompt pass of the tiny model, and most of the gap between the parallel regions);
// - by output rows otherwise: each thread streams only its share of a large weight once, against
//   activations prepared up front.
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
  const auto* wd = static_cast<const uint8_t*>(w.data);
  const double ns_per_token = static_cast<double>(k) * (ns_per_prepared(w.type) + static_cast<double>(m) * ns_per_mac(w.type));
  constexpr size_t kL2Weight = 256 * 1024;
  constexpr int64_t kTokenGrain = 8;  // whole 4-token tiles, and enough tokens per part to reuse a row
  if (static_cast<size_t>(m) * w.row_bytes <= kL2Weight && n >= 2 * kTokenGrain) {
    parallel_for_cost(pool, n, ns_per_token, [&](int64_t b, int64_t e, int) {
      thread_local std::vector<uint8_t> part_act;  // this thread's
      if (part_act.size() < act_bytes * (e - b)) part_act.resize(act_bytes * (e - b));
      for (int64_t t = b; t < e; ++t) prepare_activation_row(w.type, x.row(t), k, part_act.data() + (t - b) * act_bytes);
      vec_dot_tile(w.type, wd, w.row_bytes, part_act.data(), act_bytes, k, static_cast<int>(m), static_cast<int>(e - b),
                   y.row(b), y.stride);
    }, kTokenGrain);
    return;
  }
  thread_local std::vector<uint8_t> act;  // the caller's; workers only read it
  if (act.size() < act_bytes * n) act.resize(act_bytes * n);
  uint8_t* a = act.data();
  parallel_for_cost(pool, n, static_cast<double>(k) * ns_per_prepared(w.type), [&](int64_t b, int64_t e, int) {
    for (int64_t t = b; t < e; ++t) prepare_activation_row(w.type, x.row(t), k, a + t * act_bytes);
  });
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
