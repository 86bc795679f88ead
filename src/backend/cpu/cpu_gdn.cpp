// CPU Gated DeltaNet: the causal conv and the delta-rule recurrence in its two forms.
//
// Recurrent form, per v-head h (k-head kh = h mod n_k_heads), token t, with S stored transposed
// (row j = S[:, j]): every row j is independent, so rows are split across threads:
//   row *= exp(g_t); u = row·k_t; row += beta_t (v_t[j] - u) k_t; o_t[j] = row·q_t / sqrt(d)
// The SIMD kernel (f32_kernels.h, gdn_row_block) runs 8 rows through all tokens while they sit in
// L1: 3d FMAs per row and token, no state traffic beyond the first read and last write. By MAC
// count that is also the cheapest way to run a prompt: the chunked form below does the same 3d²
// MACs per token and head plus ~2.5·64·d + 64²/6 for the intra-chunk products (2.9x the MACs at
// d = 32, 1.4x at d = 128); its matrix shape pays on GPUs, and the row kernel already runs at
// 15-17 MAC/ns here (docs/PERFORMANCE.md). So every request with head_dim % 8 == 0 runs the row
// kernel, `chunked` included (the two forms agree to rounding, which is all the contract asks); the
// scalar forms below remain for other head sizes.
// Chunked form (chunk 64), per head: within a chunk with cumulative log-decay γ, the
// "UT transform" T = (I - A)^-1 with A[i][j] = -β_i (k_i·k_j) e^(γ_i-γ_j) (j < i) turns the
// sequential updates into matrix products:
//   U = T (β v),  W = T (β e^γ k),  v_new = U - W S,
//   o_i = e^(γ_i) q_i S + Σ_{j<=i} (q_i·k_j) e^(γ_i-γ_j) v_new_j,
//   S' = e^(γ_last) S + Σ_j e^(γ_last-γ_j) k_j v_new_jᵀ.
#include <algorithm>
#include <cstdlib>
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

// An updates record's parts for token t (GdnArgs::updates; the CPU's form): the normalised key of
// each k-head, delta_j of each v-head's rows, and each v-head's decay.
struct UpdateRecord {
  float* base;
  int64_t stride;
  int hk, hv, d;
  UpdateRecord(float* u, int hk_, int hv_, int d_)
      : base(u), stride(gdn_update_floats(hk_, hv_, d_)), hk(hk_), hv(hv_), d(d_) {}
  float* key(int64_t t, int kh) const { return base + t * stride + int64_t{kh} * d; }
  float* deltas(int64_t t, int h) const { return base + t * stride + int64_t{hk} * d + int64_t{h} * d; }
  float* decay(int64_t t, int h) const { return base + t * stride + int64_t{hk + hv} * d + h; }
};

// The scalar form's state update of one row and token, shared with its replay: the same bits.
inline void decay_row(float* row, int d, float decay) {
  for (int i = 0; i < d; ++i) row[i] *= decay;
}
inline void add_delta_row(float* row, const float* k, int d, float delta) {
  for (int i = 0; i < d; ++i) row[i] += delta * k[i];
}

void recurrent(ThreadPool& pool, const GdnArgs& a, const std::vector<float>& qn, const std::vector<float>& kn) {
  const int64_t n = a.q.n_rows;
  const int d = a.head_dim, hv = a.n_v_heads, hk = a.n_k_heads;
  constexpr int kRowsPerItem = 16;
  const int items_per_head = (d + kRowsPerItem - 1) / kRowsPerItem;
  const UpdateRecord rec(a.updates, hk, hv, d);
  if (a.updates)
    for (int64_t t = 0; t < n; ++t) {
      for (int kh = 0; kh < hk; ++kh) std::memcpy(rec.key(t, kh), &kn[(t * hk + kh) * d], sizeof(float) * d);
      for (int h = 0; h < hv; ++h) *rec.decay(t, h) = std::exp(gate_log_decay(a, t, h));
    }
  auto work = [&](int64_t b, int64_t e, int) {
    std::vector<float> rows;  // updates: the item's rows, worked on a copy (the state stays as it was)
    for (int64_t item = b; item < e; ++item) {
      const int h = static_cast<int>(item / items_per_head);
      const int j0 = static_cast<int>(item % items_per_head) * kRowsPerItem;
      const int j1 = std::min(d, j0 + kRowsPerItem);
      const int kh = h % hk;
      float* rows_j0 = a.state + (static_cast<int64_t>(h) * d + j0) * d;  // row j0 of the head's state
      if (a.updates) {
        rows.assign(rows_j0, rows_j0 + int64_t{j1 - j0} * d);
        rows_j0 = rows.data();
      }
      for (int64_t t = 0; t < n; ++t) {
        const float* k = &kn[(t * hk + kh) * d];
        const float* q = &qn[(t * hk + kh) * d];
        const float decay = std::exp(gate_log_decay(a, t, h));
        const float beta = sigmoid(a.beta_logit.row(t)[h]);
        const float* v = a.v.row(t) + static_cast<int64_t>(h) * d;
        float* o = a.out.row(t) + static_cast<int64_t>(h) * d;
        for (int j = j0; j < j1; ++j) {
          float* row = rows_j0 + static_cast<int64_t>(j - j0) * d;
          decay_row(row, d, decay);
          const float delta = beta * (v[j] - dot(row, k, d));
          add_delta_row(row, k, d, delta);
          o[j] = dot(row, q, d);
          if (a.updates) rec.deltas(t, h)[j] = delta;
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

// K taps per output (K FMAs + one SiLU), vectorised over channels by the conv_silu kernel; then
// the window after each token (capture) and after the last one (conv_state) are plain row copies.
void causal_conv_silu(ThreadPool& pool, Rows x, const float* weight, int kernel, float* conv_state, float* capture,
                      Rows y, const F32Kernels& k) {
  const int64_t n = x.n_rows, C = x.n_cols;
  const int hist = kernel - 1;
  // In place (y over x): the window and the capture are read from x after y is written, so work
  // from a copy of x.
  thread_local std::vector<float> x_copy;
  if (y.data == x.data && n > 0) {
    x_copy.resize(static_cast<size_t>(n * C));
    for (int64_t t = 0; t < n; ++t) std::memcpy(x_copy.data() + t * C, x.row(t), static_cast<size_t>(C) * sizeof(float));
    x = Rows(x_copy.data(), n, C);
  }
  thread_local std::vector<float> taps_buf;  // the caller's; workers read it through `taps`
  taps_buf.resize(static_cast<size_t>(kernel * C));
  float* taps = taps_buf.data();
  for (int64_t c = 0; c < C; ++c)
    for (int i = 0; i < kernel; ++i) taps[i * C + c] = weight[c * kernel + i];
  // Input row s of the run: x for s >= 0, the previous window (oldest first) for s < 0.
  auto src = [&](int64_t s) { return s >= 0 ? x.row(s) : conv_state + (hist + s) * C; };
  auto work = [&](int64_t b, int64_t e, int) {
    const size_t bytes = static_cast<size_t>(e - b) * sizeof(float);
    k.conv_silu(x.data + b, x.stride, conv_state + b, C, taps + b, C, kernel, n, e - b, y.data + b, y.stride);
    if (capture)
      for (int64_t t = 0; t < n; ++t)
        for (int i = 0; i < hist; ++i) std::memcpy(capture + (t * hist + i) * C + b, src(t - hist + 1 + i) + b, bytes);
    // Ascending i reads rows at or after the one it writes, so the in-place shift is safe.
    for (int i = 0; i < hist; ++i) std::memmove(conv_state + i * C + b, src(n - hist + i) + b, bytes);
  };
  parallel_for_cost(pool, C, static_cast<double>(n) * (0.5 + 0.1 * kernel), work, 64);
}

void gated_delta_net(ThreadPool& pool, const GdnArgs& a, const F32Kernels& k) {
  // The caller's buffers; named through references because a lambda would otherwise reach each
  // worker's own (empty) thread_local.
  thread_local std::vector<float> qn_buf, kn_buf, gate_buf;
  std::vector<float>& qn = qn_buf;
  std::vector<float>& kn = kn_buf;
  const int64_t n = a.q.n_rows;
  const int d = a.head_dim, hv = a.n_v_heads, hk = a.n_k_heads;
  if (n <= 0) return;
  // HYSPEC_CPU_GDN_CHUNKED=1 runs prompts through the chunked form (model-level tests compare it
  // with the recurrent one).
  const bool recorded = a.capture || a.updates;
  const bool force_chunked = a.chunked && !recorded && std::getenv("HYSPEC_CPU_GDN_CHUNKED") != nullptr;
  if (d % 8 != 0 || force_chunked) {
    normalise_qk(a, qn, kn);
    if (a.chunked && !recorded) {
      pool.parallel_for(a.n_v_heads, [&](int64_t b, int64_t e, int) {
        for (int64_t h = b; h < e; ++h) chunked_head(a, static_cast<int>(h), qn, kn);
      });
    } else {
      recurrent(pool, a, qn, kn);
    }
    return;
  }
  // q̂, k̂ [n, hk, d]; per k-head k̂·q̂ [hk, n]; per v-head decay and beta [hv, n].
  qn.resize(static_cast<size_t>(n * hk * d));
  kn.resize(qn.size());
  std::vector<float>& gates = gate_buf;
  gates.resize(static_cast<size_t>(n * (hk + 2 * hv)));
  float* kq = gates.data();
  float* decay = kq + n * hk;
  float* beta = decay + n * hv;
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(d));
  const UpdateRecord rec(a.updates, hk, hv, d);
  // Per token: 2·hk L2 normalisations of d values and hv gates (an exp and a log1p each).
  const double ns_per_token = hk * d * 0.6 + hv * 40.0;
  parallel_for_cost(pool, n, ns_per_token, [&](int64_t tb, int64_t te, int) {
    for (int64_t t = tb; t < te; ++t) {
      for (int h = 0; h < hk; ++h) {
        float* q = &qn[(t * hk + h) * d];
        float* kk = &kn[(t * hk + h) * d];
        std::memcpy(q, a.q.row(t) + h * d, sizeof(float) * d);
        std::memcpy(kk, a.k.row(t) + h * d, sizeof(float) * d);
        k.l2_normalize(q, d, a.eps, q_scale);
        k.l2_normalize(kk, d, a.eps, 1.0f);
        kq[h * n + t] = k.dot(kk, q, d);
      }
      for (int h = 0; h < hv; ++h) {
        decay[h * n + t] = std::exp(gate_log_decay(a, t, h));
        beta[h * n + t] = sigmoid(a.beta_logit.row(t)[h]);
      }
      if (a.updates) {
        std::memcpy(rec.key(t, 0), &kn[t * hk * d], sizeof(float) * hk * d);
        for (int h = 0; h < hv; ++h) *rec.decay(t, h) = decay[h * n + t];
      }
    }
  }, 8);
  const int blocks = d / 8;
  auto work = [&](int64_t b, int64_t e, int) {
    std::vector<float> rows;  // updates: the block's 8 rows, worked on a copy (the state stays as it was)
    for (int64_t item = b; item < e; ++item) {
      const int h = static_cast<int>(item / blocks), j0 = static_cast<int>(item % blocks) * 8, kh = h % hk;
      GdnRowBlock rb;
      rb.n = n;
      rb.d = d;
      rb.state = a.state + (static_cast<int64_t>(h) * d + j0) * d;
      if (a.updates) {
        rows.assign(rb.state, rb.state + 8 * d);
        rb.state = rows.data();
        rb.deltas = rec.deltas(0, h) + j0;
        rb.deltas_stride = rec.stride;
      }
      rb.k = &kn[kh * d];
      rb.q = &qn[kh * d];
      rb.qk_stride = static_cast<int64_t>(hk) * d;
      rb.kq = kq + kh * n;
      rb.decay = decay + h * n;
      rb.beta = beta + h * n;
      rb.v = a.v.row(0) + static_cast<int64_t>(h) * d + j0;
      rb.v_stride = a.v.stride;
      rb.out = a.out.row(0) + static_cast<int64_t>(h) * d + j0;
      rb.out_stride = a.out.stride;
      if (a.capture) {
        rb.capture = a.capture + (static_cast<int64_t>(h) * d + j0) * d;
        rb.capture_stride = static_cast<int64_t>(hv) * d * d;
      }
      k.gdn_row_block(rb);
    }
  };
  // ~1 ns per token and state column for 8 rows (3 FMAs per element, 8 lanes, plus the reductions).
  parallel_for_cost(pool, static_cast<int64_t>(hv) * blocks, static_cast<double>(n) * d * 1.0, work);
}

void gdn_replay(ThreadPool& pool, const Backend::GdnReplayPart* parts, size_t count, int64_t n, int hk, int hv, int d,
                const F32Kernels& k) {
  if (n <= 0 || count == 0) return;
  // The form that recorded the updates: the row kernel where d % 8 == 0, else the scalar rows.
  const int rows_per_item = d % 8 == 0 ? 8 : 1, items_per_head = d / rows_per_item;
  const int64_t items = static_cast<int64_t>(count) * hv * items_per_head;
  auto work = [&](int64_t b, int64_t e, int) {
    for (int64_t item = b; item < e; ++item) {
      const Backend::GdnReplayPart& p = parts[item / (int64_t{hv} * items_per_head)];
      const int h = static_cast<int>(item / items_per_head % hv);
      const int j0 = static_cast<int>(item % items_per_head) * rows_per_item;
      const UpdateRecord rec(const_cast<float*>(p.updates), hk, hv, d);
      float* row = p.state + (static_cast<int64_t>(h) * d + j0) * d;
      if (rows_per_item == 1) {
        for (int64_t t = 0; t < n; ++t) {
          decay_row(row, d, *rec.decay(t, h));
          add_delta_row(row, rec.key(t, h % hk), d, rec.deltas(t, h)[j0]);
        }
        continue;
      }
      GdnRowBlock rb;
      rb.n = n;
      rb.d = d;
      rb.state = row;
      rb.k = rec.key(0, h % hk);
      rb.qk_stride = rec.stride;
      rb.decay = rec.decay(0, h);
      rb.decay_stride = rec.stride;
      rb.deltas = rec.deltas(0, h) + j0;
      rb.deltas_stride = rec.stride;
      k.gdn_replay_block(rb);
    }
  };
  parallel_for_cost(pool, items, static_cast<double>(n) * d * rows_per_item * 0.3, work);
}

}  // namespace hyspec::cpu
