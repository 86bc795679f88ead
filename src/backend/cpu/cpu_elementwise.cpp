// Row-wise float ops of the CPU backend: norms, residual adds, gates, RoPE. Each row goes through
// one SIMD kernel call (f32_kernels.h); rows are split across threads only when the whole op is
// worth a hand-off (parallel_for_cost), which for a single token of a small model it never is.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/chunk_draw.h"
#include "backend/sampling_cut.h"
#include "backend/cpu/cpu_ops.h"

namespace hyspec::cpu {

namespace {

// Single-thread cost per element (ns), measured in a tiny-model prompt pass (perf, 3.1 GHz Zen 5,
// AVX2 kernels): add/axpy 0.13, rms_norm 0.28 (two passes), swiglu/sigmoid_mul 0.28 (one exp),
// gated_rms_norm 0.8 (two passes and an exp).
constexpr double kNsAdd = 0.15;
constexpr double kNsNorm = 0.3;
constexpr double kNsGate = 0.3;
constexpr double kNsGatedNorm = 0.8;
constexpr double kNsArgmax = 0.05;

template <typename Fn>
void for_rows(ThreadPool& pool, int64_t n_rows, int64_t n_cols, double ns_per_element, Fn&& fn) {
  parallel_for_cost(pool, n_rows, static_cast<double>(n_cols) * ns_per_element, [&](int64_t b, int64_t e, int) {
    for (int64_t r = b; r < e; ++r) fn(r);
  });
}

}  // namespace

// Rows in parts of at least kArgmaxPart values (a 248K vocabulary: 7 parts), the parts across threads;
// a row's parts merge in order, so the first index wins ties as in one scan.
void argmax(ThreadPool& pool, Rows x, int32_t* out, const F32Kernels& k) {
  constexpr int64_t kArgmaxPart = 32768;
  const int64_t parts = std::max<int64_t>(1, x.n_cols / kArgmaxPart);
  std::vector<int64_t> best(static_cast<size_t>(x.n_rows * parts));
  parallel_for_cost(pool, x.n_rows * parts, static_cast<double>(x.n_cols / parts) * kNsArgmax, [&](int64_t b, int64_t e, int) {
    for (int64_t j = b; j < e; ++j) {
      const int64_t r = j / parts, c0 = x.n_cols * (j % parts) / parts, c1 = x.n_cols * (j % parts + 1) / parts;
      const int64_t i = k.argmax(x.row(r) + c0, c1 - c0);
      best[static_cast<size_t>(j)] = i < 0 ? -1 : c0 + i;
    }
  });
  for (int64_t r = 0; r < x.n_rows; ++r) {
    const float* row = x.row(r);
    int64_t idx = -1;
    for (int64_t p = 0; p < parts; ++p) {
      const int64_t i = best[static_cast<size_t>(r * parts + p)];
      if (i >= 0 && (idx < 0 || row[i] > row[idx])) idx = i;
    }
    out[r] = static_cast<int32_t>(idx < 0 ? 0 : idx);
  }
}

void rms_norm(ThreadPool& pool, Rows x, const float* w, int64_t group, float eps, Rows y, const F32Kernels& k) {
  for_rows(pool, x.n_rows, x.n_cols, kNsNorm, [&](int64_t r) {
    for (int64_t g0 = 0; g0 < x.n_cols; g0 += group) k.rms_norm(x.row(r) + g0, w, group, eps, y.row(r) + g0);
  });
}

void gated_rms_norm(ThreadPool& pool, Rows x, Rows z, const float* w, int64_t group, float eps, Rows y,
                    const F32Kernels& k) {
  for_rows(pool, x.n_rows, x.n_cols, kNsGatedNorm, [&](int64_t r) {
    for (int64_t g0 = 0; g0 < x.n_cols; g0 += group)
      k.gated_rms_norm(x.row(r) + g0, z.row(r) + g0, w, group, eps, y.row(r) + g0);
  });
}

void add(ThreadPool& pool, Rows a, Rows b, Rows y, const F32Kernels& k) {
  for_rows(pool, a.n_rows, a.n_cols, kNsAdd, [&](int64_t r) { k.add(a.row(r), b.row(r), a.n_cols, y.row(r)); });
}

// The add and the norm run row by row with the same kernels as add and rms_norm (so the results are
// the same bits); the norm reads the row while it is still in L1.
void add_rms_norm(ThreadPool& pool, Rows x, Rows delta, const float* w, int64_t group, float eps, Rows h,
                  const F32Kernels& k) {
  for_rows(pool, x.n_rows, x.n_cols, kNsAdd + kNsNorm, [&](int64_t r) {
    float* xr = x.row(r);
    k.add(xr, delta.row(r), x.n_cols, xr);
    for (int64_t g0 = 0; g0 < x.n_cols; g0 += group) k.rms_norm(xr + g0, w, group, eps, h.row(r) + g0);
  });
}

void swiglu(ThreadPool& pool, Rows gate, Rows up, Rows y, const F32Kernels& k) {
  for_rows(pool, gate.n_rows, gate.n_cols, kNsGate,
           [&](int64_t r) { k.swiglu(gate.row(r), up.row(r), gate.n_cols, y.row(r)); });
}

void sigmoid_mul(ThreadPool& pool, Rows x, Rows gate, Rows y, const F32Kernels& k) {
  for_rows(pool, x.n_rows, x.n_cols, kNsGate,
           [&](int64_t r) { k.sigmoid_mul(x.row(r), gate.row(r), x.n_cols, y.row(r)); });
}

void add_sigmoid_scaled(ThreadPool& pool, Rows x, Rows g, Rows y, const F32Kernels& k) {
  for_rows(pool, x.n_rows, x.n_cols, kNsAdd,
           [&](int64_t r) { k.axpy(sigmoid(g.row(r)[0]), x.row(r), x.n_cols, y.row(r)); });
}

// cos/sin of pos * base^(-2i/n_rot) in double (positions reach 10^5 and more, where a float angle
// would be off by 10^-2), kept per thread for the last positions seen: a forward ropes q and k of
// every attention layer at the same positions, so all but the first call reuse the table.
void rope_neox(Rows x, int head_dim, int n_rot, const int32_t* positions, float freq_base) {
  struct Table {
    std::vector<int32_t> positions;
    int n_rot = 0;
    float base = 0;
    std::vector<float> cs;  // [n, half, 2]: cos, sin
  };
  thread_local Table tab;
  const int half = n_rot / 2;
  const int64_t n = x.n_rows;
  if (n <= 0 || half <= 0) return;
  if (tab.n_rot != n_rot || tab.base != freq_base || tab.positions.size() != static_cast<size_t>(n) ||
      std::memcmp(tab.positions.data(), positions, static_cast<size_t>(n) * sizeof(int32_t)) != 0) {
    tab.positions.assign(positions, positions + n);
    tab.n_rot = n_rot;
    tab.base = freq_base;
    tab.cs.resize(static_cast<size_t>(n * half * 2));
    std::vector<double> inv_freq(half);
    for (int i = 0; i < half; ++i) inv_freq[i] = std::pow(static_cast<double>(freq_base), -2.0 * i / n_rot);
    for (int64_t r = 0; r < n; ++r)
      for (int i = 0; i < half; ++i) {
        const double theta = positions[r] * inv_freq[i];
        tab.cs[(r * half + i) * 2] = static_cast<float>(std::cos(theta));
        tab.cs[(r * half + i) * 2 + 1] = static_cast<float>(std::sin(theta));
      }
  }
  const int64_t n_heads = x.n_cols / head_dim;
  for (int64_t r = 0; r < n; ++r) {
    const float* cs = &tab.cs[r * half * 2];
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x.row(r) + h * head_dim;
      for (int i = 0; i < half; ++i) {
        const float c = cs[2 * i], s = cs[2 * i + 1];
        const float x0 = v[i], x1 = v[i + half];
        v[i] = x0 * c - x1 * s;
        v[i + half] = x0 * s + x1 * c;
      }
    }
  }
}

void logit_summary(ThreadPool& pool, Rows x, float inv_t, float* out) {
  using S = LogitSummary;
  const int64_t C = x.n_cols, chunks = S::chunks(C), per_row = S::floats(C);
  const float scale = inv_t * S::kPerNat;
  parallel_for_cost(pool, x.n_rows, 3.0 * static_cast<double>(C), [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* l = x.row(r);
      float* o = out + r * per_row;
      float m = -FLT_MAX;
      for (int64_t c = 0; c < C; ++c) m = l[c] > m ? l[c] : m;  // NaN never
      o[0] = m;
      std::vector<double> count(S::kBuckets, 0.0), mass(S::kBuckets, 0.0);  // the reference: sums in double
      for (int64_t ch = 0; ch < chunks; ++ch) {
        double sum = 0;
        for (int64_t c = ch * S::kChunk; c < std::min(C, (ch + 1) * S::kChunk); ++c) {
          if (!(l[c] > -INFINITY)) continue;  // NaN, -inf
          const float e = std::exp((l[c] - m) * inv_t), d = (m - l[c]) * scale;
          const int64_t b = d < static_cast<float>(S::kBuckets) ? static_cast<int64_t>(d) : S::kBuckets - 1;
          sum += e;
          count[b] += 1.0;
          mass[b] += e;
        }
        o[S::chunk_at() + ch] = static_cast<float>(sum);
      }
      for (int64_t b = 0; b < S::kBuckets; ++b) {
        o[S::count_at(C) + b] = static_cast<float>(count[b]);
        o[S::mass_at(C) + b] = static_cast<float>(mass[b]);
      }
    }
  });
}

void draw_token(ThreadPool& pool, Rows x, TokenDraw* draw) {
  using S = LogitSummary;
  const int64_t C = x.n_cols;
  std::vector<float> summary(static_cast<size_t>(S::floats(C)));
  logit_summary(pool, x.rows(0, 1), 1.0f / draw->temperature, summary.data());
  const float* mass = summary.data() + S::chunk_at();
  const ChunkedRow row{summary[0], mass, S::chunks(C), C, chunk_total(mass, S::chunks(C)), draw->temperature};
  const float* l = x.row(0);
  const int32_t token =
      chunk_row_drawable(row)
          ? draw_by_chunks(
                row, -1, [&] { return draw->uniform; }, [&](int32_t id) { return l[id]; },
                [&](int64_t c) { return std::span<const float>(l + c * S::kChunk, std::min(S::kChunk, C - c * S::kChunk)); })
          : -1;
  draw->status = token >= 0 ? TokenDraw::kDrawn : TokenDraw::kNoMass;
  if (token >= 0) {
    draw->token = token;
  } else {
    argmax(pool, x.rows(0, 1), &draw->token);
  }
}

void draw_top_k(ThreadPool& pool, Rows x, TokenDraw* draw) {
  const float* l = x.row(0);
  const int n_vocab = static_cast<int>(x.n_cols);
  std::vector<TokenProb> row;  // the tokens that can be drawn: NaN never
  row.reserve(static_cast<size_t>(n_vocab));
  float max = -INFINITY;
  for (int i = 0; i < n_vocab; ++i) {
    if (std::isnan(l[i])) continue;
    row.push_back({i, l[i]});
    max = std::max(max, l[i]);
  }
  if (!std::isfinite(max)) {
    draw->status = TokenDraw::kNoMass;
    argmax(pool, x.rows(0, 1), &draw->token);
    return;
  }
  cut_distribution(row, n_vocab, SamplingCut{draw->temperature, draw->top_k, draw->top_p, draw->min_p}, false, 0.0, l);
  draw->token = draw_at(row, draw->uniform);
  draw->status = TokenDraw::kDrawn;
}

void select_logits(Rows x, int64_t row, float threshold, int32_t cap, int32_t* count, SelectedLogit* picked) {
  const float* l = x.row(row);
  int32_t n = 0;
  for (int64_t c = 0; c < x.n_cols; ++c) {
    if (!(l[c] >= threshold)) continue;
    if (n < cap) picked[n] = {static_cast<int32_t>(c), l[c]};
    ++n;
  }
  *count = n;
}

}  // namespace hyspec::cpu
