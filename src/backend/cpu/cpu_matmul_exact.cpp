// Exact-activation matmul (Weight::exact): per output row, dequantize the weight row to f32 once,
// then an f32 dot with every activation row. No activation quantization, so the result is what the
// dequantized weights say up to f32 summation order; costs one dequantization per row per call.
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/quant_dot.h"
#include "format/quants.h"

namespace hyspec::cpu {

void matmul_exact(ThreadPool& pool, const Weight& w, Rows x, Rows y) {
  const int64_t n = x.n_rows, k = w.n_in, m = w.n_out;
  const auto* wd = static_cast<const uint8_t*>(w.data);
  auto rows = [&](int64_t b, int64_t e, int) {
    float* row = scratch_floats(static_cast<size_t>(k), 2);
    for (int64_t o = b; o < e; ++o) {
      (void)dequantize_row(w.type, wd + o * w.row_bytes, row, k);  // the type was checked at load
      for (int64_t t = 0; t < n; ++t) y.row(t)[o] = vec_dot(GgmlType::F32, row, x.row(t), k);
    }
  };
  // Per output row: a dequantization (~1 ns per element) and n f32 dots (~0.05 ns per MAC).
  parallel_for_cost(pool, m, static_cast<double>(k) * (1.0 + 0.05 * static_cast<double>(n)), rows, 4);
}

}  // namespace hyspec::cpu
