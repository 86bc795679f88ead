// CPU float kernels (backend/cpu/f32_kernels.h) and the ops built on them (cpu_ops.h).
//
// Oracles: plain double-precision formulas written here from QWEN35.md / backend.h, on random
// inputs with shapes that leave vector tails, odd tile rows and partial row blocks. Every test runs
// the scalar and (where the CPU has it) the AVX2 kernels explicitly, whatever the machine's default,
// and the two paths are also compared with each other.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/f32_kernels.h"
#include "backend/cpu/quant_dot.h"
#include "backend/cpu_test_util.h"
#include "common/inverse_cdf.h"
#include "common/kv_cache_bytes.h"
#include "format/quants.h"
#include "util/half.h"

namespace hyspec::cpu {
namespace {

std::vector<DotIsa> isas() { return test::float_kernel_isas(); }
const char* name(DotIsa isa) { return test::isa_name(isa); }
using test::randn;

double sigmoid_d(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Relative-or-absolute closeness: |a - b| <= tol * max(1, |b|).
#define EXPECT_CLOSE(a, b, tol) EXPECT_LE(std::fabs((a) - (b)), (tol) * std::max(1.0, std::fabs(double(b))))

TEST(F32Kernels, FastExpIsWithinTwoUlpsAndZeroBelowTheClamp) {
  std::vector<float> x;
  for (float v = -87.0f; v <= 88.0f; v += 0.01f) x.push_back(v);
  x.push_back(-88.5f);
  x.push_back(-1000.0f);
  x.push_back(-INFINITY);
  for (DotIsa isa : isas()) {
    std::vector<float> y(x.size());
    f32_kernels(isa).exp(x.data(), static_cast<int64_t>(x.size()), y.data());
    for (size_t i = 0; i < x.size(); ++i) {
      if (x[i] < -88.4f) {
        EXPECT_EQ(y[i], 0.0f) << name(isa) << " x=" << x[i];
      } else {
        const double want = std::exp(static_cast<double>(x[i]));
        EXPECT_LE(std::fabs(y[i] - want), 2.5e-7 * want) << name(isa) << " x=" << x[i];
      }
    }
  }
}

TEST(F32Kernels, RowKernelsMatchDoubleFormulasForEveryTailLength) {
  std::mt19937 rng(3);
  for (int64_t n : {1, 5, 8, 13, 16, 31, 64, 100}) {
    const std::vector<float> x = randn(n, rng, 2.0f), z = randn(n, rng, 3.0f), w = randn(n, rng);
    double ss = 0, dot = 0;
    for (int64_t i = 0; i < n; ++i) {
      ss += double(x[i]) * x[i];
      dot += double(x[i]) * z[i];
    }
    const double inv = 1.0 / std::sqrt(ss / n + 1e-6);
    for (DotIsa isa : isas()) {
      const F32Kernels& k = f32_kernels(isa);
      std::vector<float> y(n), y2(n), y3(n);
      k.rms_norm(x.data(), w.data(), n, 1e-6f, y.data());
      k.gated_rms_norm(x.data(), z.data(), w.data(), n, 1e-6f, y2.data());
      for (int64_t i = 0; i < n; ++i) {
        EXPECT_CLOSE(y[i], x[i] * inv * w[i], 2e-6) << name(isa) << " rms_norm n=" << n;
        EXPECT_CLOSE(y2[i], x[i] * inv * w[i] * z[i] * sigmoid_d(z[i]), 2e-6) << name(isa) << " gated n=" << n;
      }
      k.rms_norm(x.data(), nullptr, n, 1e-6f, y.data());
      for (int64_t i = 0; i < n; ++i) EXPECT_CLOSE(y[i], x[i] * inv, 2e-6) << name(isa) << " rms_norm, no weight";
      EXPECT_CLOSE(k.dot(x.data(), z.data(), n), dot, 1e-5 * std::sqrt(double(n))) << name(isa) << " dot n=" << n;
      k.add(x.data(), z.data(), n, y.data());
      k.swiglu(x.data(), z.data(), n, y2.data());
      k.sigmoid_mul(x.data(), z.data(), n, y3.data());
      for (int64_t i = 0; i < n; ++i) {
        EXPECT_EQ(y[i], x[i] + z[i]) << name(isa);
        EXPECT_CLOSE(y2[i], x[i] * sigmoid_d(x[i]) * z[i], 2e-6) << name(isa) << " swiglu";
        EXPECT_CLOSE(y3[i], x[i] * sigmoid_d(z[i]), 2e-6) << name(isa) << " sigmoid_mul";
      }
      y = z;
      k.axpy(0.75f, x.data(), n, y.data());
      for (int64_t i = 0; i < n; ++i) EXPECT_CLOSE(y[i], z[i] + 0.75 * x[i], 1e-6) << name(isa) << " axpy";
      y = x;
      k.l2_normalize(y.data(), n, 1e-6f, 0.5f);
      for (int64_t i = 0; i < n; ++i) EXPECT_CLOSE(y[i], 0.5 * x[i] / std::sqrt(ss + 1e-6), 2e-6) << name(isa) << " l2";
      std::vector<uint16_t> h(n);
      for (int64_t i = 0; i < n; ++i) h[i] = fp32_to_fp16(x[i]);
      k.f16_to_f32(h.data(), n, y.data());
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(y[i], fp16_to_fp32(h[i])) << name(isa) << " f16";
    }
  }
}

// ---- ops ----

// causal_conv_silu against the definition, in two runs (state carried), with capture.
TEST(CpuOps, CausalConvMatchesTheDefinitionAcrossRunsAndCapturesEveryWindow) {
  std::mt19937 rng(8);
  const int K = 4;
  ThreadPool pool(2);
  for (int64_t C : {5, 24, 70}) {
    const int64_t n1 = 3, n2 = 6;
    const std::vector<float> x = randn((n1 + n2) * C, rng), wt = randn(C * K, rng, 0.5f), init = randn((K - 1) * C, rng);
    for (DotIsa isa : isas()) {
      std::vector<float> state = init, y((n1 + n2) * C), cap(n2 * (K - 1) * C);
      causal_conv_silu(pool, Rows(const_cast<float*>(x.data()), n1, C), wt.data(), K, state.data(), nullptr,
                       Rows(y.data(), n1, C), f32_kernels(isa));
      causal_conv_silu(pool, Rows(const_cast<float*>(x.data()) + n1 * C, n2, C), wt.data(), K, state.data(),
                       cap.data(), Rows(y.data() + n1 * C, n2, C), f32_kernels(isa));
      // Input s of the whole sequence: init rows for s < 0.
      auto in = [&](int64_t s, int64_t c) { return s >= 0 ? x[s * C + c] : init[(K - 1 + s) * C + c]; };
      for (int64_t t = 0; t < n1 + n2; ++t)
        for (int64_t c = 0; c < C; ++c) {
          double acc = 0;
          for (int i = 0; i < K; ++i) acc += double(wt[c * K + i]) * in(t - K + 1 + i, c);
          EXPECT_CLOSE(y[t * C + c], acc * sigmoid_d(acc), 1e-5) << name(isa) << " C=" << C << " t=" << t;
        }
      for (int64_t t = 0; t < n2; ++t)
        for (int i = 0; i < K - 1; ++i)
          for (int64_t c = 0; c < C; ++c)
            EXPECT_EQ(cap[(t * (K - 1) + i) * C + c], in(n1 + t - K + 2 + i, c)) << name(isa) << " capture";
      for (int i = 0; i < K - 1; ++i)
        for (int64_t c = 0; c < C; ++c) EXPECT_EQ(state[i * C + c], in(n1 + n2 - K + 1 + i, c)) << name(isa) << " state";
    }
  }
}

TEST(CpuOps, CausalConvInPlaceEqualsOutOfPlaceIncludingStateAndCapture) {
  std::mt19937 rng(9);
  const int K = 4;
  ThreadPool pool(2);
  const int64_t n = 7, C = 40;
  const std::vector<float> x = randn(n * C, rng), wt = randn(C * K, rng, 0.5f), init = randn((K - 1) * C, rng);
  for (DotIsa isa : isas()) {
    std::vector<float> s1 = init, s2 = init, y(n * C), cap1(n * (K - 1) * C), cap2(cap1.size()), inplace = x;
    causal_conv_silu(pool, Rows(const_cast<float*>(x.data()), n, C), wt.data(), K, s1.data(), cap1.data(),
                     Rows(y.data(), n, C), f32_kernels(isa));
    causal_conv_silu(pool, Rows(inplace.data(), n, C), wt.data(), K, s2.data(), cap2.data(), Rows(inplace.data(), n, C),
                     f32_kernels(isa));
    EXPECT_EQ(inplace, y) << name(isa);
    EXPECT_EQ(s2, s1) << name(isa);
    EXPECT_EQ(cap2, cap1) << name(isa);
  }
}

// kv_store writes each type's slots as backend.h lays them out (rounded as the host conversions and
// ggml's q8_0 do: tests/common/kv_cache_bytes.h) and skips positions outside the cache.
TEST(CpuOps, KvStoreRoundsToTheCacheTypeAndSkipsPositionsOutside) {
  std::mt19937 rng(5);
  const int64_t W = 64, D = 32, cap = 6, n = 4;
  std::vector<float> k = randn(n * W, rng), v = randn(n * W, rng);
  k[3] = 1e30f;  // F16 overflows to inf, BF16 keeps the exponent
  const std::vector<int32_t> pos = {4, -1, 1, 6};  // rows 1 and 3 fall outside
  for (const GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0}) {
    const hyspec::test::KvCacheBytes want = hyspec::test::encode_kv_cache(type, k, v, W, D);
    const size_t row = kv_head_bytes(type, D) * (W / D);
    std::vector<uint8_t> kc(cap * row, 0xab), vc(kc.size(), 0xab);
    const KvLayer kv{kc.data(), vc.data(), type, cap, W, D};
    ASSERT_EQ(kv.row_bytes(), row);
    kv_store(Rows(k.data(), n, W), Rows(v.data(), n, W), kv, pos.data());
    for (int64_t t : {0, 2})
      for (size_t b = 0; b < row; ++b) {
        ASSERT_EQ(kc[pos[t] * row + b], want.k[t * row + b]) << ggml_type_name(type) << " k row " << t << " byte " << b;
        ASSERT_EQ(vc[pos[t] * row + b], want.v[t * row + b]) << ggml_type_name(type) << " v row " << t << " byte " << b;
      }
    if (type == GgmlType::BF16) EXPECT_NEAR(want.kf[3], 1e30f, 1e28f);
    if (type == GgmlType::F16) EXPECT_TRUE(std::isinf(want.kf[3]));
    for (int64_t p : {0, 2, 3, 5})  // untouched
      for (size_t b = 0; b < row; ++b) ASSERT_EQ(kc[p * row + b], 0xab) << ggml_type_name(type) << " pos " << p;
  }
}

// The Q8_0 slot of backend.h, byte by byte: codes, then f16 scales, then zero padding to 16 bytes.
TEST(CpuOps, KvStoreQ8_0SlotLayout) {
  EXPECT_EQ(kv_head_bytes(GgmlType::Q8_0, 256), 272u);
  EXPECT_EQ(kv_head_bytes(GgmlType::Q8_0, 128), 144u);
  EXPECT_EQ(kv_head_bytes(GgmlType::Q8_0, 32), 48u);
  EXPECT_EQ(kv_head_bytes(GgmlType::Q8_0, 40), 0u);  // not whole blocks
  EXPECT_EQ(kv_head_bytes(GgmlType::Q4_0, 256), 0u);
  std::vector<float> x(64);
  for (int i = 0; i < 64; ++i) x[i] = i < 32 ? (i - 16) * 0.5f : (i == 40 ? -3.0f : 0.0f);
  std::vector<uint8_t> kc(kv_head_bytes(GgmlType::Q8_0, 64), 0xab), vc(kc.size(), 0xab);
  const int32_t p0 = 0;
  kv_store(Rows(x.data(), 1, 64), Rows(x.data(), 1, 64), KvLayer{kc.data(), vc.data(), GgmlType::Q8_0, 1, 64, 64}, &p0);
  ASSERT_EQ(kc.size(), 80u);
  // block 0: max |x| = 8 (x[0] = -8): d = 8/127, codes round(x * 127/8); block 1: only x[40] = -3 -> -127
  EXPECT_EQ(static_cast<int8_t>(kc[0]), -127);
  EXPECT_EQ(static_cast<int8_t>(kc[16]), 0);
  EXPECT_EQ(static_cast<int8_t>(kc[17]), 8);  // 0.5 * 127/8 = 7.94
  EXPECT_EQ(static_cast<int8_t>(kc[40]), -127);
  EXPECT_EQ(kc[41], 0);
  uint16_t d0, d1;
  std::memcpy(&d0, &kc[64], 2);
  std::memcpy(&d1, &kc[66], 2);
  EXPECT_EQ(d0, fp32_to_fp16(8.0f / 127.0f));
  EXPECT_EQ(d1, fp32_to_fp16(3.0f / 127.0f));
  for (size_t b = 68; b < 80; ++b) EXPECT_EQ(kc[b], 0) << b;
  EXPECT_EQ(kc, vc);
}

struct AttnCase {
  int n, depth, n_head, n_kv, d;
  bool causal;
  GgmlType kv_type;
};

// attention against softmax(q·Kᵀ·scale) V in double, rows stored at positions depth..depth+n-1.
TEST(CpuOps, AttentionMatchesDoubleSoftmaxForTilesOfEveryShape) {
  const AttnCase cases[] = {
      {1, 0, 4, 2, 64, true, GgmlType::F32},     {1, 77, 4, 2, 64, true, GgmlType::F32},
      {37, 0, 4, 2, 64, true, GgmlType::F32},    {9, 40, 8, 2, 32, true, GgmlType::F32},
      {5, 3, 3, 3, 16, true, GgmlType::F32},     {6, 10, 4, 1, 40, true, GgmlType::F16},
      {7, 20, 4, 2, 64, false, GgmlType::F32},   {4, 4, 2, 1, 12, true, GgmlType::F32},  // head_dim % 8 != 0
      {3, 2, 16, 2, 8, true, GgmlType::F16},     {6, 10, 4, 1, 40, true, GgmlType::BF16},
      {5, 9, 4, 2, 64, false, GgmlType::BF16},   {4, 4, 2, 1, 12, true, GgmlType::BF16},
      {6, 10, 4, 1, 64, true, GgmlType::Q8_0},   {5, 9, 4, 2, 32, false, GgmlType::Q8_0},
      {37, 0, 4, 2, 64, true, GgmlType::Q8_0},
  };
  std::mt19937 rng(11);
  ThreadPool pool(2);
  for (const AttnCase& c : cases) {
    const int total = c.depth + c.n, width = c.n_kv * c.d;
    const std::vector<float> q = randn(static_cast<size_t>(c.n) * c.n_head * c.d, rng);
    const std::vector<float> k0 = randn(static_cast<size_t>(total) * width, rng), v0 = randn(k0.size(), rng);
    // the reference uses the values the cache holds
    hyspec::test::KvCacheBytes cache = hyspec::test::encode_kv_cache(c.kv_type, k0, v0, width, c.d);
    const std::vector<float>&kf = cache.kf, &vf = cache.vf;
    std::vector<int32_t> pos(c.n);
    for (int t = 0; t < c.n; ++t) pos[t] = c.depth + t;
    const float scale = 1.0f / std::sqrt(float(c.d));
    const int group = c.n_head / c.n_kv;
    for (DotIsa isa : isas()) {
      std::vector<float> out(q.size(), 0.0f);
      AttentionArgs a;
      a.q = Rows(const_cast<float*>(q.data()), c.n, c.n_head * c.d);
      a.kv = cache.layer(c.kv_type, total, width, c.d);
      a.positions = pos.data();
      a.n_head = c.n_head;
      a.n_kv_head = c.n_kv;
      a.head_dim = c.d;
      a.scale = scale;
      a.causal = c.causal;
      a.out = Rows(out.data(), c.n, c.n_head * c.d);
      attention(pool, a, f32_kernels(isa));
      for (int t = 0; t < c.n; ++t)
        for (int h = 0; h < c.n_head; ++h) {
          const int kvh = h / group, len = (c.causal ? pos[t] : pos[c.n - 1]) + 1;
          std::vector<double> s(len);
          double mx = -1e300, sum = 0;
          for (int j = 0; j < len; ++j) {
            double acc = 0;
            for (int i = 0; i < c.d; ++i) acc += double(q[(t * c.n_head + h) * c.d + i]) * kf[j * width + kvh * c.d + i];
            s[j] = acc * scale;
            mx = std::max(mx, s[j]);
          }
          for (int j = 0; j < len; ++j) sum += (s[j] = std::exp(s[j] - mx));
          for (int i = 0; i < c.d; ++i) {
            double o = 0;
            for (int j = 0; j < len; ++j) o += s[j] * vf[j * width + kvh * c.d + i];
            EXPECT_CLOSE(out[(t * c.n_head + h) * c.d + i], o / sum, 2e-5)
                << name(isa) << " n=" << c.n << " depth=" << c.depth << " d=" << c.d << " t=" << t << " h=" << h;
          }
        }
    }
  }
}

// The gated delta rule (QWEN35.md step 5) in double, token by token, S[i][j] untransposed.
struct GdnReference {
  int hk, hv, d;
  std::vector<double> S;  // [hv][d][d]
  void step(const float* q, const float* k, const float* v, const float* b, const float* al, const float* ssm_a,
            const float* dt, float eps, float* o) {
    for (int h = 0; h < hv; ++h) {
      const int kh = h % hk;
      double qn = 0, kn = 0;
      for (int i = 0; i < d; ++i) {
        qn += double(q[kh * d + i]) * q[kh * d + i];
        kn += double(k[kh * d + i]) * k[kh * d + i];
      }
      qn = 1 / std::sqrt(qn + eps) / std::sqrt(double(d));
      kn = 1 / std::sqrt(kn + eps);
      const double x = al[h] + dt[h];
      const double g = (x > 20 ? x : std::log1p(std::exp(x))) * ssm_a[h];
      const double beta = sigmoid_d(b[h]);
      double* s = &S[static_cast<size_t>(h) * d * d];
      for (int i = 0; i < d * d; ++i) s[i] *= std::exp(g);
      for (int j = 0; j < d; ++j) {
        double u = 0;
        for (int i = 0; i < d; ++i) u += s[i * d + j] * k[kh * d + i] * kn;
        const double delta = beta * (v[h * d + j] - u);
        for (int i = 0; i < d; ++i) s[i * d + j] += k[kh * d + i] * kn * delta;
      }
      for (int j = 0; j < d; ++j) {
        double acc = 0;
        for (int i = 0; i < d; ++i) acc += s[i * d + j] * q[kh * d + i] * qn;
        o[h * d + j] = static_cast<float>(acc);
      }
    }
  }
};

// Random inputs of a gated_delta_net call of n tokens, and the GdnArgs over them.
struct GdnInputs {
  int hk, hv, d, n;
  std::vector<float> q, k, v, b, al, a_neg, dt;
  GdnInputs(int hk_, int hv_, int d_, int n_, std::mt19937& rng) : hk(hk_), hv(hv_), d(d_), n(n_) {
    q = randn(n * hk * d, rng);
    k = randn(n * hk * d, rng);
    v = randn(n * hv * d, rng);
    b = randn(n * hv, rng);
    al = randn(n * hv, rng);
    a_neg = randn(hv, rng, 0.5f);
    dt = randn(hv, rng);
    for (float& x : a_neg) x = -std::fabs(x);
  }
  GdnArgs args(float* state, float* out) const {
    auto rows = [&](const std::vector<float>& x, int64_t cols) { return Rows(const_cast<float*>(x.data()), n, cols); };
    GdnArgs g;
    g.q = rows(q, int64_t{hk} * d);
    g.k = rows(k, int64_t{hk} * d);
    g.v = rows(v, int64_t{hv} * d);
    g.beta_logit = rows(b, hv);
    g.alpha = rows(al, hv);
    g.ssm_a = a_neg.data();
    g.dt_bias = dt.data();
    g.n_k_heads = hk;
    g.n_v_heads = hv;
    g.head_dim = d;
    g.state = state;
    g.out = Rows(out, n, int64_t{hv} * d);
    return g;
  }
};

TEST(CpuOps, GatedDeltaNetMatchesTheRecurrenceInEveryFormWithCapture) {
  struct Shape {
    int hk, hv, d, n;
  };
  std::mt19937 rng(21);
  ThreadPool pool(2);
  for (const Shape sh : {Shape{2, 4, 32, 70}, Shape{1, 3, 16, 5}, Shape{2, 2, 12, 9}, Shape{1, 1, 8, 1}}) {
    const int n = sh.n, d = sh.d, K = sh.hk * d, V = sh.hv * d;
    const GdnInputs in(sh.hk, sh.hv, d, n, rng);
    const std::vector<float>&q = in.q, &k = in.k, &v = in.v, &b = in.b, &al = in.al, &a_neg = in.a_neg, &dt = in.dt;
    const std::vector<float> init = randn(static_cast<size_t>(sh.hv) * d * d, rng, 0.1f);
    GdnReference ref{sh.hk, sh.hv, d, std::vector<double>(init.size())};
    for (int h = 0; h < sh.hv; ++h)  // init is stored transposed: state[h][j][i] = S[i][j]
      for (int i = 0; i < d; ++i)
        for (int j = 0; j < d; ++j) ref.S[(h * d + i) * d + j] = init[(h * d + j) * d + i];
    std::vector<float> want(n * V);
    std::vector<std::vector<double>> want_states;
    for (int t = 0; t < n; ++t) {
      ref.step(&q[t * K], &k[t * K], &v[t * V], &b[t * sh.hv], &al[t * sh.hv], a_neg.data(), dt.data(), 1e-6f,
               &want[t * V]);
      want_states.push_back(ref.S);
    }
    for (DotIsa isa : isas()) {
      for (int form = 0; form < 3; ++form) {  // recurrent, chunked, recurrent with capture
        std::vector<float> state = init, out(n * V), cap(form == 2 ? static_cast<size_t>(n) * init.size() : 0);
        GdnArgs g = in.args(state.data(), out.data());
        g.capture = form == 2 ? cap.data() : nullptr;
        g.chunked = form == 1;
        gated_delta_net(pool, g, f32_kernels(isa));
        for (int i = 0; i < n * V; ++i)
          EXPECT_CLOSE(out[i], want[i], 1e-4) << name(isa) << " form " << form << " d=" << d << " at " << i;
        for (int h = 0; h < sh.hv; ++h)
          for (int j = 0; j < d; ++j)
            for (int i = 0; i < d; ++i) {
              const size_t at = (static_cast<size_t>(h) * d + j) * d + i;
              EXPECT_CLOSE(state[at], want_states[n - 1][(h * d + i) * d + j], 1e-4) << name(isa) << " final state";
              if (form == 2)
                for (int t = 0; t < n; t += std::max(1, n / 4))
                  EXPECT_CLOSE(cap[t * init.size() + at], want_states[t][(h * d + i) * d + j], 1e-4)
                      << name(isa) << " capture t=" << t;
            }
      }
    }
  }
}

// Updates capture: the same outputs as an F32 capture, the state left as it was, and gdn_replay of the
// first m updates reaches exactly the state captured after token m - 1 (the row kernel, and the scalar
// form at d = 12).
TEST(CpuOps, GatedDeltaNetUpdatesReplayToTheCapturedStates) {
  struct Shape {
    int hk, hv, d, n;
  };
  std::mt19937 rng(23);
  ThreadPool pool(2);
  for (const Shape sh : {Shape{2, 4, 32, 17}, Shape{2, 2, 12, 9}, Shape{1, 1, 8, 1}}) {
    const int n = sh.n, d = sh.d, V = sh.hv * d;
    const size_t S = static_cast<size_t>(sh.hv) * d * d;
    const GdnInputs in(sh.hk, sh.hv, d, n, rng);
    const std::vector<float> init = randn(S, rng, 0.1f);
    for (DotIsa isa : isas()) {
      auto run = [&](std::vector<float>& state, std::vector<float>& out, float* capture, float* updates) {
        GdnArgs g = in.args(state.data(), out.data());
        g.capture = capture;
        g.updates = updates;
        gated_delta_net(pool, g, f32_kernels(isa));
      };
      std::vector<float> s_cap = init, out_cap(n * V), cap(n * S);
      run(s_cap, out_cap, cap.data(), nullptr);
      std::vector<float> s_upd = init, out_upd(n * V), upd(n * gdn_update_floats(sh.hk, sh.hv, d));
      run(s_upd, out_upd, nullptr, upd.data());
      EXPECT_EQ(out_upd, out_cap) << name(isa) << " d=" << d;
      EXPECT_EQ(s_upd, init) << name(isa) << " d=" << d << ": the state stays as it was";
      for (int m = 1; m <= n; ++m) {
        std::vector<float> s = init, s2 = init;
        const Backend::GdnReplayPart parts[2] = {{s.data(), upd.data()}, {s2.data(), upd.data()}};
        gdn_replay(pool, parts, 2, m, sh.hk, sh.hv, d, f32_kernels(isa));
        const std::vector<float> want(cap.begin() + (m - 1) * S, cap.begin() + m * S);
        ASSERT_EQ(s, want) << name(isa) << " d=" << d << " after " << m << " updates";
        ASSERT_EQ(s2, want) << name(isa) << " d=" << d << " second part";
      }
    }
  }
}

// The row ops split across threads exactly as they run alone, on both paths.
// The sampler's row summary against its definition in doubles (logit_summary.h), on strided rows with
// a partial last chunk, NaN and -inf; select_logits against a scan.
TEST(CpuOps, LogitSummaryAndSelectMatchTheirDefinitions) {
  using S = LogitSummary;
  std::mt19937 rng(9);
  const int64_t n = 3, C = 3 * S::kChunk + 123, stride = C + 7;
  std::vector<float> x = randn(n * stride, rng);
  for (float& v : x) v *= 4.0f;
  x[1 * stride + 10] = std::nanf(""), x[1 * stride + 11] = -INFINITY, x[2 * stride + C - 1] = 30.0f;
  const float inv_t = 1.0f / 0.7f;
  std::vector<float> out(n * S::floats(C), -1.0f);
  ThreadPool pool(2);
  logit_summary(pool, Rows(x.data(), n, C, stride), inv_t, out.data());
  for (int64_t r = 0; r < n; ++r) {
    const float* l = x.data() + r * stride;
    const float* o = out.data() + r * S::floats(C);
    float m = -FLT_MAX;
    for (int64_t c = 0; c < C; ++c)
      if (l[c] > m) m = l[c];
    ASSERT_EQ(o[0], m) << r;
    std::vector<double> chunk(S::chunks(C)), count(S::kBuckets), mass(S::kBuckets);
    for (int64_t c = 0; c < C; ++c) {
      if (!(l[c] > -INFINITY)) continue;
      const double e = std::exp(double(l[c] - m) * inv_t);
      const float d = (m - l[c]) * (inv_t * S::kPerNat);
      const int64_t b = std::min<int64_t>(S::kBuckets - 1, static_cast<int64_t>(d));
      chunk[c / S::kChunk] += e, count[b] += 1, mass[b] += e;
    }
    for (int64_t c = 0; c < S::chunks(C); ++c) EXPECT_CLOSE(o[S::chunk_at() + c], chunk[c], 1e-5) << r << " chunk " << c;
    for (int64_t b = 0; b < S::kBuckets; ++b) {
      ASSERT_EQ(o[S::count_at(C) + b], count[b]) << r << " bucket " << b;
      EXPECT_CLOSE(o[S::mass_at(C) + b], mass[b], 1e-5) << r << " bucket " << b;
    }
  }
  const float threshold = 5.0f;
  std::vector<SelectedLogit> picked(8);
  int32_t count = -1;
  select_logits(Rows(x.data(), n, C, stride), 2, threshold, 8, &count, picked.data());
  std::vector<int32_t> want;
  for (int64_t c = 0; c < C; ++c)
    if (x[2 * stride + c] >= threshold) want.push_back(static_cast<int32_t>(c));
  ASSERT_EQ(count, static_cast<int32_t>(want.size()));
  ASSERT_GT(count, 8);  // more than fit: the first 8
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(picked[i].id, want[i]);
    EXPECT_EQ(picked[i].logit, x[2 * stride + want[i]]);
  }
}

// draw_token (look-ahead sampling's draw) against an inverse CDF of the row's softmax in double: rows with
// a partial last chunk, NaN and -inf, a peaked one; uniforms at both ends and between. Rows without finite
// mass (all -inf; a +inf logit) give kNoMass and the argmax.
TEST(CpuOps, DrawTokenIsTheInverseCdfOfTheSoftmax) {
  std::mt19937 rng(5);
  const int64_t C = 3 * LogitSummary::kChunk + 123;
  ThreadPool pool(2);
  std::vector<std::vector<float>> rows(3, randn(C, rng));
  for (float& v : rows[1]) v *= 4.0f;
  rows[1][10] = std::nanf(""), rows[1][11] = -INFINITY, rows[1][C - 1] = 6.0f;
  rows[2][2 * LogitSummary::kChunk + 7] = 30.0f;  // nearly all the mass on one token
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<double> uniforms = {0.0, 1e-12, 0.25, 0.5, 0.999999, std::nextafter(1.0, 0.0)};
  for (int i = 0; i < 40; ++i) uniforms.push_back(unit(rng));
  int checked = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    for (const float t : {0.6f, 1.0f, 1.7f}) {
      for (const double u : uniforms) {
        TokenDraw d{-1, -1, t, 0, u};
        draw_token(pool, Rows(rows[r].data(), 1, C), &d);
        ASSERT_EQ(d.status, TokenDraw::kDrawn);
        const hyspec::test::CdfPick want = hyspec::test::inverse_cdf(rows[r].data(), C, t, u);
        if (want.margin < 1e-9) continue;  // at a rounding edge
        ++checked;
        EXPECT_EQ(d.token, want.token) << "row " << r << ", T " << t << ", u " << u;
      }
    }
  }
  EXPECT_GE(checked, 387);  // all but u = 0, 1e-12 and the last double below 1 (margin 0)
  std::vector<float> none(C, -INFINITY), inf = rows[0];
  inf[4097] = INFINITY;
  for (auto* row : {&none, &inf}) {
    TokenDraw d{-1, -1, 1.0f, 0, 0.5};
    draw_token(pool, Rows(row->data(), 1, C), &d);
    EXPECT_EQ(d.status, TokenDraw::kNoMass);
    EXPECT_EQ(d.token, row == &none ? 0 : 4097);
  }
}

// draw_top_k (look-ahead sampling's draw under a top-k cut) against an inverse CDF of the sampler's cuts in
// double: rows with NaN and -inf, ties (logits on a coarse grid), a peaked one; cuts from top-k alone to all
// three; uniforms at both ends and between. Rows whose max is not finite give kNoMass and the argmax.
TEST(CpuOps, DrawTopKIsTheInverseCdfOfTheCutSoftmax) {
  std::mt19937 rng(9);
  const int64_t C = 3 * LogitSummary::kChunk + 123;
  ThreadPool pool(2);
  std::vector<std::vector<float>> rows(4, randn(C, rng));
  for (float& v : rows[1]) v *= 4.0f;
  rows[1][10] = std::nanf(""), rows[1][11] = -INFINITY, rows[1][C - 1] = 16.0f;
  rows[2][2 * LogitSummary::kChunk + 7] = 30.0f;  // nearly all the mass on one token
  for (float& v : rows[3]) v = std::round(v * 2.0f) / 2.0f;  // hundreds of ties at each value
  const SamplingCut cuts[] = {{1.0f, 1, 1.0f, 0.0f}, {0.8f, 40, 0.95f, 0.05f}, {1.3f, 256, 1.0f, 0.0f},
                              {1.0f, 50, 0.6f, 0.0f}, {0.6f, 7, 1.0f, 0.2f}};
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<double> uniforms = {0.0, 0.25, 0.5, 0.999999, std::nextafter(1.0, 0.0)};
  for (int i = 0; i < 20; ++i) uniforms.push_back(unit(rng));
  int checked = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    for (const SamplingCut& cut : cuts) {
      for (const double u : uniforms) {
        TokenDraw d{-1, -1, cut.temperature, cut.top_k, u, cut.top_p, cut.min_p};
        draw_top_k(pool, Rows(rows[r].data(), 1, C), &d);
        ASSERT_EQ(d.status, TokenDraw::kDrawn);
        const hyspec::test::CdfPick want = hyspec::test::cut_inverse_cdf(rows[r].data(), C, cut, u);
        if (want.margin < 1e-6) continue;  // at a rounding edge
        ++checked;
        EXPECT_EQ(d.token, want.token) << "row " << r << ", k " << cut.top_k << ", u " << u;
      }
    }
  }
  EXPECT_GE(checked, 400);
  std::vector<float> none(C, -INFINITY), inf = rows[0], nan(C, std::nanf(""));
  inf[4097] = INFINITY;
  for (auto* row : {&none, &inf, &nan}) {
    TokenDraw d{-1, -1, 1.0f, 40, 0.5, 0.9f, 0.05f};
    draw_top_k(pool, Rows(row->data(), 1, C), &d);
    EXPECT_EQ(d.status, TokenDraw::kNoMass);
    EXPECT_EQ(d.token, row == &inf ? 4097 : 0);
  }
}

// argmax: the first index of the largest value >= -FLT_MAX (NaN and -inf never win; none: 0), the CUDA
// argmax's rule, against a plain scan: rows with ties, NaNs, infinities, lengths that leave vector and
// block tails, rows split into parts across threads (a vocabulary-sized row), on both kernel paths.
TEST(CpuOps, ArgmaxIsTheFirstLargestValueWithNaNAndMinusInfinityNeverWinning) {
  auto reference = [](const float* x, int64_t n) {
    int64_t idx = -1;
    for (int64_t i = 0; i < n; ++i)
      if (x[i] >= -FLT_MAX && (idx < 0 || x[i] > x[idx])) idx = i;
    return static_cast<int32_t>(idx < 0 ? 0 : idx);
  };
  std::mt19937 rng(11);
  const float nan = std::nanf(""), inf = INFINITY;
  std::vector<std::vector<float>> rows;
  for (int64_t n : {1, 7, 8, 33, 511, 512, 513, 1000, 70001, 248320}) {
    std::vector<float> r = randn(n, rng);
    for (float& v : r) v = std::round(v * 4) / 4;  // many ties
    rows.push_back(r);
    std::vector<float> t = r;  // NaNs and infinities scattered, the largest value repeated near the end
    for (int64_t i = 0; i < n; i += 5) t[i] = nan;
    for (int64_t i = 2; i < n; i += 7) t[i] = -inf;
    if (n > 3) t[n - 2] = t[n - 3] = 9.0f;
    rows.push_back(t);
  }
  rows.push_back({nan, -inf, nan});      // nothing wins: 0
  rows.push_back({-inf, -FLT_MAX, 1e-30f, -FLT_MAX});
  rows.push_back({nan, -FLT_MAX, -FLT_MAX});  // -FLT_MAX wins, first of its ties
  rows.push_back({nan, 3.0f, inf, 2.0f, inf});  // +inf wins
  for (DotIsa isa : isas())
    for (int threads : {1, 4}) {
      ThreadPool pool(threads);
      for (const auto& r : rows) {
        int32_t got = -7;
        argmax(pool, Rows(const_cast<float*>(r.data()), 1, static_cast<int64_t>(r.size())), &got, f32_kernels(isa));
        EXPECT_EQ(got, reference(r.data(), static_cast<int64_t>(r.size())))
            << name(isa) << ", " << threads << " threads, " << r.size() << " values";
      }
      // Several rows at once, strided.
      const int64_t n = 1000, stride = 1003;
      std::vector<float> m = randn(5 * stride, rng);
      std::vector<int32_t> out(5, -7);
      argmax(pool, Rows(m.data(), 5, n, stride), out.data(), f32_kernels(isa));
      for (int64_t r = 0; r < 5; ++r) EXPECT_EQ(out[r], reference(m.data() + r * stride, n)) << name(isa) << " row " << r;
    }
}

TEST(CpuOps, RowOpsGiveTheSameResultWithOneOrFourThreads) {
  std::mt19937 rng(5);
  const int64_t n = 300, cols = 256;  // big enough to be split
  const std::vector<float> x = randn(n * cols, rng), z = randn(n * cols, rng), w = randn(64, rng);
  for (DotIsa isa : isas()) {
    std::vector<std::vector<float>> results;
    for (int threads : {1, 4}) {
      ThreadPool pool(threads);
      std::vector<float> y(n * cols), y2(n * cols);
      Rows X(const_cast<float*>(x.data()), n, cols), Z(const_cast<float*>(z.data()), n, cols), Y(y.data(), n, cols),
          Y2(y2.data(), n, cols);
      rms_norm(pool, X, w.data(), 64, 1e-6f, Y, f32_kernels(isa));
      gated_rms_norm(pool, X, Z, w.data(), 64, 1e-6f, Y2, f32_kernels(isa));
      swiglu(pool, Y, Y2, Y, f32_kernels(isa));
      sigmoid_mul(pool, Y, Z, Y, f32_kernels(isa));
      add(pool, Y, X, Y, f32_kernels(isa));
      add_sigmoid_scaled(pool, X, Z, Y, f32_kernels(isa));
      results.push_back(y);
    }
    EXPECT_EQ(results[0], results[1]) << name(isa);
  }
}

// add_rms_norm is add then rms_norm, bit for bit (the model fuses every residual add with the next
// norm and the CPU stays the reference): strided rows, groups with vector tails, with and without a
// weight, one thread or four (300 rows are split), on both float-kernel paths.
TEST(CpuOps, AddRmsNormIsBitIdenticalToAddThenRmsNorm) {
  std::mt19937 rng(8);
  struct Shape {
    int64_t rows, group, groups, x_pad, d_pad, h_pad;
    bool weighted;
  };
  const Shape shapes[] = {{1, 256, 1, 0, 0, 0, true},  {5, 64, 3, 4, 8, 2, true}, {3, 37, 2, 3, 0, 5, false},
                          {17, 13, 4, 0, 1, 0, true},  {300, 96, 2, 8, 0, 0, true}};
  for (const Shape& sh : shapes) {
    const int64_t n = sh.rows, C = sh.group * sh.groups, xs = C + sh.x_pad, ds = C + sh.d_pad, hs = C + sh.h_pad;
    const std::vector<float> x0 = randn(n * xs, rng, 2.0f), delta = randn(n * ds, rng), w = randn(sh.group, rng);
    const float* wp = sh.weighted ? w.data() : nullptr;
    for (DotIsa isa : isas()) {
      for (int threads : {1, 4}) {
        ThreadPool pool(threads);
        const F32Kernels& k = f32_kernels(isa);
        std::vector<float> x_fused = x0, x_ref = x0, h_fused(n * hs, -1.0f), h_ref(n * hs, -1.0f);
        Rows D(const_cast<float*>(delta.data()), n, C, ds);
        add_rms_norm(pool, Rows(x_fused.data(), n, C, xs), D, wp, sh.group, 1e-6f, Rows(h_fused.data(), n, C, hs), k);
        add(pool, Rows(x_ref.data(), n, C, xs), D, Rows(x_ref.data(), n, C, xs), k);
        rms_norm(pool, Rows(x_ref.data(), n, C, xs), wp, sh.group, 1e-6f, Rows(h_ref.data(), n, C, hs), k);
        const std::string what = std::string(name(isa)) + " rows=" + std::to_string(n) +
                                 " group=" + std::to_string(sh.group) + " threads=" + std::to_string(threads);
        EXPECT_EQ(std::memcmp(x_fused.data(), x_ref.data(), x_ref.size() * sizeof(float)), 0) << what << ": x";
        EXPECT_EQ(std::memcmp(h_fused.data(), h_ref.data(), h_ref.size() * sizeof(float)), 0) << what << ": h";
        EXPECT_NE(x_fused, x0) << what;  // the add happened
      }
    }
  }
}

// matmul == vec_dot per (token, output row), whichever way it splits the work: small weights by
// tokens (each part prepares its own activations), large ones (> 256 KiB) by output rows.
TEST(CpuOps, MatmulEqualsDotsWhetherSplitByTokensOrRows) {
  std::mt19937 rng(31);
  struct Shape {
    int64_t k, m;
  };
  // 53 KiB and 319 KiB of Q8_0, both enough work (n >= 16) to be split across threads.
  for (const Shape sh : {Shape{128, 400}, Shape{512, 600}}) {
    const int64_t k = sh.k, m = sh.m;
    const std::vector<float> wf = randn(static_cast<size_t>(k * m), rng, 0.05f);
    const size_t rb = static_cast<size_t>(k / 32 * 34);
    std::vector<uint8_t> wq(rb * m);
    for (int64_t r = 0; r < m; ++r) ASSERT_TRUE(quantize_row(GgmlType::Q8_0, &wf[r * k], wq.data() + r * rb, k).is_ok());
    Weight w;
    w.type = GgmlType::Q8_0;
    w.n_in = k;
    w.n_out = m;
    w.row_bytes = rb;
    w.data = wq.data();
    for (int64_t n : {1, 5, 16, 37}) {
      const std::vector<float> x = randn(static_cast<size_t>(n * k), rng);
      std::vector<uint8_t> act(prepared_row_bytes(GgmlType::Q8_0, k));
      std::vector<float> want(static_cast<size_t>(n * m));
      for (int64_t t = 0; t < n; ++t) {
        prepare_activation_row(GgmlType::Q8_0, &x[t * k], k, act.data());
        for (int64_t r = 0; r < m; ++r) want[t * m + r] = vec_dot(GgmlType::Q8_0, wq.data() + r * rb, act.data(), k);
      }
      for (int threads : {1, 3}) {
        ThreadPool pool(threads);
        std::vector<float> y(static_cast<size_t>(n * (m + 2)), -7.0f);  // output rows wider than m
        matmul(pool, w, Rows(const_cast<float*>(x.data()), n, k), Rows(y.data(), n, m, m + 2));
        for (int64_t t = 0; t < n; ++t) {
          for (int64_t r = 0; r < m; ++r)
            EXPECT_CLOSE(y[t * (m + 2) + r], want[t * m + r], 1e-5) << "k=" << k << " n=" << n << " threads=" << threads;
          EXPECT_EQ(y[t * (m + 2) + m], -7.0f) << "wrote past the row";
        }
      }
    }
  }
}

TEST(F32Kernels, Avx2AgreesWithScalarOnAttentionAndGdnBlocks) {
  if (!dot_isa_available(DotIsa::Avx2)) GTEST_SKIP() << "CPU without AVX2/FMA/F16C";
  std::mt19937 rng(9);
  const int d = 64, len = 45, m = 13;  // a full group of 8 rows, then 5 in a padded group
  const std::vector<float> q = randn(m * d, rng), kv = randn(2 * len * d, rng);
  std::vector<float> outs[2];
  for (int p = 0; p < 2; ++p) {
    outs[p].assign(m * d, 0.0f);
    std::vector<const float*> qr(m);
    std::vector<float*> orow(m);
    std::vector<int64_t> lens(m);
    for (int r = 0; r < m; ++r) {
      qr[r] = &q[r * d];
      orow[r] = &outs[p][r * d];
      lens[r] = len - 3 * r;
    }
    AttentionTile t;
    t.m = m;
    t.d = d;
    t.q = qr.data();
    t.out = orow.data();
    t.kv_len = lens.data();
    t.k = kv.data();
    t.v = kv.data() + len * d;
    t.kv_stride = d;
    t.scale = 0.125f;
    std::vector<float> scratch(attention_scratch_floats(m, d, len));
    f32_kernels(p ? DotIsa::Avx2 : DotIsa::Scalar).attention_tile(t, scratch.data());
  }
  for (int i = 0; i < m * d; ++i) EXPECT_NEAR(outs[0][i], outs[1][i], 1e-5) << i;
}

}  // namespace
}  // namespace hyspec::cpu
