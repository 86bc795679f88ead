// CPU mixture-of-experts FFN: softmax router, top-k, renormalised weights; tokens are grouped by
// expert so each selected expert's weights are read once per call.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_ops.h"

namespace hyspec::cpu {

void moe_ffn(ThreadPool& pool, const MoeArgs& a) {
  const int64_t n = a.x.n_rows, hidden = a.x.n_cols;
  const int64_t n_exp = a.router->n_out, ffn = a.gate_exps->n_out;
  std::vector<float> logits(static_cast<size_t>(n * n_exp));
  matmul(pool, *a.router, a.x, Rows(logits.data(), n, n_exp));
  if (a.shared_gate) matmul(pool, *a.shared_gate, a.x, a.shared_gate_out);

  // Route: per token the top_k experts and their renormalised softmax weights.
  std::vector<std::vector<std::pair<int64_t, float>>> by_expert(n_exp);  // (token, weight)
  std::vector<int64_t> order(n_exp);
  for (int64_t t = 0; t < n; ++t) {
    const float* l = &logits[t * n_exp];
    const float mx = *std::max_element(l, l + n_exp);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + a.top_k, order.end(),
                      [&](int64_t x, int64_t y) { return l[x] > l[y] || (l[x] == l[y] && x < y); });
    // softmax then renormalise over the top k == softmax over the top k logits
    double sum = 0;
    for (int k = 0; k < a.top_k; ++k) sum += std::exp(l[order[k]] - mx);
    for (int k = 0; k < a.top_k; ++k)
      by_expert[order[k]].emplace_back(t, static_cast<float>(std::exp(l[order[k]] - mx) / sum));
  }

  for (int64_t t = 0; t < n; ++t) std::fill_n(a.out.row(t), hidden, 0.0f);
  const F32Kernels& kernels = f32_kernels();
  std::vector<float> xin, gate, up, down;
  for (int64_t e = 0; e < n_exp; ++e) {
    const auto& toks = by_expert[e];
    if (toks.empty()) continue;
    const int64_t m = static_cast<int64_t>(toks.size());
    xin.resize(static_cast<size_t>(m * hidden));
    gate.resize(static_cast<size_t>(m * ffn));
    up.resize(gate.size());
    down.resize(xin.size());
    for (int64_t i = 0; i < m; ++i) std::copy_n(a.x.row(toks[i].first), hidden, &xin[i * hidden]);
    matmul(pool, expert_slice(*a.gate_exps, e), Rows(xin.data(), m, hidden), Rows(gate.data(), m, ffn));
    matmul(pool, expert_slice(*a.up_exps, e), Rows(xin.data(), m, hidden), Rows(up.data(), m, ffn));
    kernels.swiglu(gate.data(), up.data(), static_cast<int64_t>(gate.size()), gate.data());
    matmul(pool, expert_slice(*a.down_exps, e), Rows(gate.data(), m, ffn), Rows(down.data(), m, hidden));
    for (int64_t i = 0; i < m; ++i) {
      float* o = a.out.row(toks[i].first);
      kernels.axpy(toks[i].second, &down[i * hidden], hidden, o);
    }
  }
}

}  // namespace hyspec::cpu
