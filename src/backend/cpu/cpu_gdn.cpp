// CPU Gated DeltaNet: the causal conv and the delta-rule recurrence in its two forms.
//
// Recurrent form, per v-head h (k-head kh = h mod n_k_heads), token t, with S stored transposed
// (row j = S[:, j]): every row j is independent, so rows are split across threads:
//   row *= exp(g_t); u = row·k_t; row += beta_t (v_t[j] - u) k_t; o_t[j] = row·q_t / sqrt(d)
// Chunked form (chunk 64), per head: within a chunk with cumulative log-decay γ, the
// "UT transform" T = (I - A)^-1 with A[i][j] = -β_i (k_i·k_j) e^(γ_i-γ_j) (j < i) turns the
// sequential updates into matrix products:
//   U = T (β v),  W = T (β e^γ k),  v_new = U - W S,
//   o_i = e^(γ_i) q_i S + Σ_{j<=i} (q_i·k_j) e^(γ_i-γ_j) v_new_j,
//   S' = e^(γ_last) S + Σ_j e^(γ_last-γ_j) k_j v_new_jᵀ.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_ops.h"

namespace hyspec::cpu {

namespace {

constexpr int kChunk = 64;

inline float dot(const float* a, const float* b, int n) {
  float s = 0;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// q, k of every token and k-head, L2-normalised (q also scaled by 1/sqrt(d)): [n, n_k_heads, d] each.
void normalise_qk(const GdnArgs& a, std::vector<float>& qn, std::vector<float>& kn) {
  const int64_t n = a.q.n_rows;
  const int d = a.head_dim, hk = a.n_k_heads;
  qn.resize(static_cast<size_t>(n * hk * d));
  kn.resize(qn.size());
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int64_t t = 0; t < n; ++t)
    for (int h = 0; h < hk; ++h) {
      const float* q = a.q.row(t) + h * d;
      const float* k = a.k.row(t) + h * d;
      const float qi = 1.0f / std::sqrt(dot(q, q, d) + a.eps);
      const float ki = 1.0f / std::sqrt(dot(k, k, d) + a.eps);
      float* qo = &qn[(t * hk + h) * d];
      float* ko = &kn[(t * hk + h) * d];
      for (int i = 0; i < d; ++i) {
        qo[i] = q[i] * qi * scale;
        ko[i] = k[i] * ki;
      }
    }
}

inline float gate_log_decay(const GdnArgs& a, int64_t t, int h) {
  return softplus(a.alpha.row(t)[h] + a.dt_bias[h]) * a.ssm_a[h];
}

void recurrent(ThreadPool& pool, const GdnArgs& a, const std::vector<float>& qn, const std::vector<float>& kn) {
  const int64_t n = a.q.n_rows;
  const int d = a.head_dim, hv = a.n_v_heads, hk = a.n_k_heads;
  constexpr int kRowsPerItem = 16;
  const int items_per_head = (d + kRowsPerItem - 1) / kRowsPerItem;
  auto work = [&](int64_t b, int64_t e, int) {
    for (int64_t item = b; item < e; ++item) {
      const int h = static_cast<int>(item / items_per_head);
      const int j0 = static_cast<int>(item % items_per_head) * kRowsPerItem;
      const int j1 = std::min(d, j0 + kRowsPerItem);
      const int kh = h % hk;
      float* S = a.state + static_cast<int64_t>(h) * d * d;
      for (int64_t t = 0; t < n; ++t) {
        const float* k = &kn[(t * hk + kh) * d];
        const float* q = &qn[(t * hk + kh) * d];
        const float decay = std::exp(gate_log_decay(a, t, h));
        const float beta = sigmoid(a.beta_logit.row(t)[h]);
        const float* v = a.v.row(t) + static_cast<int64_t>(h) * d;
        float* o = a.out.row(t) + static_cast<int64_t>(h) * d;
        for (int j = j0; j < j1; ++j) {
          float* row = S + static_cast<int64_t>(j) * d;
          float u = 0;
          for (int i = 0; i < d; ++i) {
            row[i] *= decay;
            u += row[i] * k[i];
          }
          const float delta = beta * (v[j] - u);
          float acc = 0;
          for (int i = 0; i < d; ++i) {
            row[i] += delta * k[i];
            acc += row[i] * q[i];
          }
          o[j] = acc;
          if (a.capture)
            std::memcpy(a.capture + ((t * hv + h) * d + j) * static_cast<int64_t>(d), row,
                        static_cast<size_t>(d) * sizeof(float));
        }
      }
    }
  };
  const int64_t items = static_cast<int64_t>(hv) * items_per_head;
  if (n * hv * d * d < (1 << 15)) {
    work(0, items, 0);
  } else {
    pool.parallel_for(items, work);
  }
}

void chunked_head(const GdnArgs& a, int h, const std::vector<float>& qn, const std::vector<float>& kn) {
  const int64_t n = a.q.n_rows;
  const int d = a.head_dim, hk = a.n_k_heads, kh = h % hk;
  float* S = a.state + static_cast<int64_t>(h) * d * d;  // S[i][j] at S[j*d + i]
  std::vector<float> gam(kChunk), beta(kChunk), A(kChunk * kChunk), U(kChunk * d), W(kChunk * d),
      vnew(kChunk * d), qk(kChunk * kChunk);
  for (int64_t s = 0; s < n; s += kChunk) {
    const int L = static_cast<int>(std::min<int64_t>(kChunk, n - s));
    auto K = [&](int i) { return &kn[((s + i) * hk + kh) * d]; };
    auto Q = [&](int i) { return &qn[((s + i) * hk + kh) * d]; };
    auto V = [&](int i) { return a.v.row(s + i) + static_cast<int64_t>(h) * d; };
    float g = 0;
    for (int i = 0; i < L; ++i) {
      g += gate_log_decay(a, s + i, h);
      gam[i] = g;
      beta[i] = sigmoid(a.beta_logit.row(s + i)[h]);
    }
    // A (strictly lower), then T = (I - A)^-1 by forward substitution, stored in A with unit diagonal.
    for (int i = 0; i < L; ++i)
      for (int j = 0; j < L; ++j)
        A[i * kChunk + j] = j < i ? -beta[i] * dot(K(i), K(j), d) * std::exp(gam[i] - gam[j]) : 0.0f;
    for (int i = 1; i < L; ++i)
      for (int j = 0; j < i; ++j) {
        float acc = A[i * kChunk + j];
        for (int m = j + 1; m < i; ++m) acc += A[i * kChunk + m] * A[m * kChunk + j];
        A[i * kChunk + j] = acc;
      }
    for (int i = 0; i < L; ++i) A[i * kChunk + i] = 1.0f;
    // U = T (β v), W = T (β e^γ k)
    for (int i = 0; i < L; ++i) {
      float* u = &U[i * d];
      float* w = &W[i * d];
      std::fill_n(u, d, 0.0f);
      std::fill_n(w, d, 0.0f);
      for (int j = 0; j <= i; ++j) {
        const float t = A[i * kChunk + j];
        const float cu = t * beta[j], cw = t * beta[j] * std::exp(gam[j]);
        const float* vj = V(j);
        const float* kj = K(j);
        for (int c = 0; c < d; ++c) {
          u[c] += cu * vj[c];
          w[c] += cw * kj[c];
        }
      }
    }
    // v_new = U - W S ;  o_inter = e^γ q S
    for (int i = 0; i < L; ++i) {
      float* o = a.out.row(s + i) + static_cast<int64_t>(h) * d;
      const float eg = std::exp(gam[i]);
      for (int j = 0; j < d; ++j) {
        const float* col = S + static_cast<int64_t>(j) * d;
        vnew[i * d + j] = U[i * d + j] - dot(&W[i * d], col, d);
        o[j] = eg * dot(Q(i), col, d);
      }
    }
    // o += Σ_{j<=i} (q_i·k_j) e^(γ_i-γ_j) v_new_j
    for (int i = 0; i < L; ++i) {
      float* o = a.out.row(s + i) + static_cast<int64_t>(h) * d;
      for (int j = 0; j <= i; ++j) {
        const float c = dot(Q(i), K(j), d) * std::exp(gam[i] - gam[j]);
        for (int x = 0; x < d; ++x) o[x] += c * vnew[j * d + x];
      }
    }
    // S' = e^(γ_last) S + Σ_j e^(γ_last-γ_j) k_j v_new_jᵀ
    const float glast = gam[L - 1];
    const float el = std::exp(glast);
    for (int jv = 0; jv < d; ++jv) {
      float* col = S + static_cast<int64_t>(jv) * d;
      for (int i = 0; i < d; ++i) col[i] *= el;
    }
    for (int j = 0; j < L; ++j) {
      const float c = std::exp(glast - gam[j]);
      const float* kj = K(j);
      for (int jv = 0; jv < d; ++jv) {
        const float f = c * vnew[j * d + jv];
        float* col = S + static_cast<int64_t>(jv) * d;
        for (int i = 0; i < d; ++i) col[i] += f * kj[i];
      }
    }
  }
}

}  // namespace

void causal_conv_silu(ThreadPool& pool, Rows x, const float* weight, int kernel, float* conv_state, float* capture,
                      Rows y) {
  const int64_t n = x.n_rows, C = x.n_cols;
  const int hist = kernel - 1;
  auto work = [&](int64_t b, int64_t e, int) {
    float window[8];
    for (int64_t c = b; c < e; ++c) {
      const float* w = weight + c * kernel;
      for (int i = 0; i < hist; ++i) window[i] = conv_state[i * C + c];
      for (int64_t t = 0; t < n; ++t) {
        const float xt = x.row(t)[c];
        float acc = w[hist] * xt;
        for (int i = 0; i < hist; ++i) acc += w[i] * window[i];
        for (int i = 0; i + 1 < hist; ++i) window[i] = window[i + 1];
        if (hist > 0) window[hist - 1] = xt;
        y.row(t)[c] = silu(acc);
        if (capture)
          for (int i = 0; i < hist; ++i) capture[(t * hist + i) * C + c] = window[i];
      }
      for (int i = 0; i < hist; ++i) conv_state[i * C + c] = window[i];
    }
  };
  if (n * C < (1 << 14)) {
    work(0, C, 0);
  } else {
    pool.parallel_for(C, work, 16);
  }
}

void gated_delta_net(ThreadPool& pool, const GdnArgs& a) {
  // The caller's buffers; named through references because a lambda would otherwise reach each
  // worker's own (empty) thread_local.
  thread_local std::vector<float> qn_buf, kn_buf;
  std::vector<float>& qn = qn_buf;
  std::vector<float>& kn = kn_buf;
  normalise_qk(a, qn, kn);
  if (a.chunked && !a.capture) {
    pool.parallel_for(a.n_v_heads, [&](int64_t b, int64_t e, int) {
      for (int64_t h = b; h < e; ++h) chunked_head(a, static_cast<int>(h), qn, kn);
    });
  } else {
    recurrent(pool, a, qn, kn);
  }
}

}  // namespace hyspec::cpu
