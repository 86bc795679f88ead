// Batch invariance of the CPU ops: row t of an n-row call is bit-identical to the same row computed
// in a call of its own (with the state the earlier rows left). Speculative decoding depends on it:
// a verify step must give each position exactly the logits a decode step would, or greedy output
// flips at near-ties and speculation is no longer lossless. Every op the model runs is covered, on
// the scalar and AVX2 float kernels; the quantized dot kernels run on the machine's active ISA (run
// the binary with HYSPEC_CPU_ISA=scalar|avx2|avx512 to cover the others).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/f32_kernels.h"
#include "backend/cpu/quant_dot.h"
#include "backend/cpu_test_util.h"
#include "common/kv_cache_bytes.h"
#include "format/quants.h"
#include "util/half.h"

namespace hyspec::cpu {
namespace {

std::vector<DotIsa> isas() { return test::float_kernel_isas(); }
const char* name(DotIsa isa) { return test::isa_name(isa); }
using test::randn;

// Index of the first element whose bits differ, or -1.
int64_t first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return static_cast<int64_t>(i);
  return -1;
}

constexpr int kWidths[] = {2, 3, 4, 5, 8, 9, 16, 17, 33};

TEST(BatchInvariance, MatmulRowsDoNotDependOnHowManyTokensShareTheCall) {
  std::mt19937 rng(1);
  // 40 KiB (split by tokens from 16 tokens on) and 600 KiB of Q8_0 (split by rows).
  struct Shape {
    int64_t k, m;
  };
  for (GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0}) {
    for (const Shape sh : {Shape{256, 160}, Shape{1024, 600}}) {
      const std::vector<float> wf = randn(static_cast<size_t>(sh.k * sh.m), rng, 0.05f);
      const size_t rb = ggml_row_bytes(type, sh.k).value();
      std::vector<uint8_t> wq(rb * sh.m);
      for (int64_t r = 0; r < sh.m; ++r) ASSERT_TRUE(quantize_row(type, &wf[r * sh.k], wq.data() + r * rb, sh.k).is_ok());
      Weight w;
      w.type = type;
      w.n_in = sh.k;
      w.n_out = sh.m;
      w.row_bytes = rb;
      w.data = wq.data();
      const int64_t n_max = 33;
      const std::vector<float> x = randn(static_cast<size_t>(n_max * sh.k), rng);
      for (int threads : {1, 3}) {
        ThreadPool pool(threads);
        std::vector<float> single(static_cast<size_t>(n_max * sh.m));
        for (int64_t t = 0; t < n_max; ++t)
          matmul(pool, w, Rows(const_cast<float*>(&x[t * sh.k]), 1, sh.k), Rows(&single[t * sh.m], 1, sh.m));
        for (int n : kWidths) {
          std::vector<float> batch(static_cast<size_t>(n * sh.m));
          matmul(pool, w, Rows(const_cast<float*>(x.data()), n, sh.k), Rows(batch.data(), n, sh.m));
          const std::vector<float> want(single.begin(), single.begin() + n * sh.m);
          const int64_t at = first_difference(batch, want);
          EXPECT_EQ(at, -1) << ggml_type_name(type) << " k=" << sh.k << " m=" << sh.m << " n=" << n
                            << " threads=" << threads << ": token " << at / sh.m;
        }
      }
    }
  }
}

TEST(BatchInvariance, AttentionRowsDoNotDependOnTheVerifyWidth) {
  std::mt19937 rng(2);
  struct Case {
    int depth, n_head, n_kv, d;
    GgmlType kv;
  };
  for (const Case c : {Case{0, 8, 2, 64, GgmlType::F16}, Case{37, 8, 2, 64, GgmlType::F32},
                       Case{300, 16, 2, 128, GgmlType::F16}, Case{5, 4, 4, 32, GgmlType::F16},
                       Case{40, 8, 2, 64, GgmlType::BF16}, Case{40, 8, 2, 64, GgmlType::Q8_0}}) {
    const int n_max = 33, total = c.depth + n_max, width = c.n_kv * c.d, qw = c.n_head * c.d;
    const std::vector<float> kf = randn(static_cast<size_t>(total) * width, rng), vf = randn(kf.size(), rng);
    hyspec::test::KvCacheBytes cache = hyspec::test::encode_kv_cache(c.kv, kf, vf, width, c.d);
    const std::vector<float> q = randn(static_cast<size_t>(n_max) * qw, rng);
    std::vector<int32_t> pos(n_max);
    for (int t = 0; t < n_max; ++t) pos[t] = c.depth + t;
    auto run = [&](int t0, int n, std::vector<float>& out, const F32Kernels& k, ThreadPool& pool) {
      AttentionArgs a;
      a.q = Rows(const_cast<float*>(&q[static_cast<size_t>(t0) * qw]), n, qw);
      a.kv = cache.layer(c.kv, total, width, c.d);
      a.positions = &pos[t0];
      a.n_head = c.n_head;
      a.n_kv_head = c.n_kv;
      a.head_dim = c.d;
      a.scale = 0.125f;
      a.causal = true;
      a.out = Rows(&out[static_cast<size_t>(t0) * qw], n, qw);
      attention(pool, a, k);
    };
    for (DotIsa isa : isas())
      for (int threads : {1, 3}) {
        ThreadPool pool(threads);
        std::vector<float> single(static_cast<size_t>(n_max) * qw);
        for (int t = 0; t < n_max; ++t) run(t, 1, single, f32_kernels(isa), pool);
        for (int n : kWidths) {
          std::vector<float> batch(single.size());
          run(0, n, batch, f32_kernels(isa), pool);
          batch.resize(static_cast<size_t>(n) * qw);
          const std::vector<float> want(single.begin(), single.begin() + batch.size());
          const int64_t at = first_difference(batch, want);
          EXPECT_EQ(at, -1) << name(isa) << " depth=" << c.depth << " d=" << c.d << " n=" << n << " threads=" << threads
                            << ": token " << at / qw;
        }
      }
  }
}

TEST(BatchInvariance, GatedDeltaNetAndConvStepsEqualOneTokenSteps) {
  std::mt19937 rng(3);
  struct Shape {
    int hk, hv, d;
  };
  for (const Shape sh : {Shape{2, 4, 32}, Shape{1, 2, 12}, Shape{2, 4, 128}}) {
    const int n_max = 33, d = sh.d, K = sh.hk * d, V = sh.hv * d, conv_k = 4;
    const std::vector<float> q = randn(n_max * K, rng), k = randn(n_max * K, rng), v = randn(n_max * V, rng),
                             b = randn(n_max * sh.hv, rng), al = randn(n_max * sh.hv, rng), dt = randn(sh.hv, rng),
                             init = randn(static_cast<size_t>(sh.hv) * d * d, rng, 0.1f),
                             conv_w = randn(static_cast<size_t>(V) * conv_k, rng, 0.5f),
                             conv_init = randn(static_cast<size_t>(conv_k - 1) * V, rng);
    std::vector<float> ssm_a = randn(sh.hv, rng, 0.5f);
    for (float& a : ssm_a) a = -std::fabs(a);
    // One step over tokens [t0, t0+n): GDN with capture, and the causal conv over v.
    auto step = [&](int t0, int n, std::vector<float>& state, std::vector<float>& conv_state, std::vector<float>& out,
                    std::vector<float>& conv_out, const F32Kernels& kern, ThreadPool& pool) {
      std::vector<float> cap(static_cast<size_t>(n) * init.size()), conv_cap(static_cast<size_t>(n) * (conv_k - 1) * V);
      GdnArgs g;
      g.q = Rows(const_cast<float*>(&q[t0 * K]), n, K);
      g.k = Rows(const_cast<float*>(&k[t0 * K]), n, K);
      g.v = Rows(const_cast<float*>(&v[t0 * V]), n, V);
      g.beta_logit = Rows(const_cast<float*>(&b[t0 * sh.hv]), n, sh.hv);
      g.alpha = Rows(const_cast<float*>(&al[t0 * sh.hv]), n, sh.hv);
      g.ssm_a = ssm_a.data();
      g.dt_bias = dt.data();
      g.n_k_heads = sh.hk;
      g.n_v_heads = sh.hv;
      g.head_dim = d;
      g.state = state.data();
      g.capture = n > 1 ? cap.data() : nullptr;
      g.out = Rows(&out[t0 * V], n, V);
      gated_delta_net(pool, g, kern);
      causal_conv_silu(pool, Rows(const_cast<float*>(&v[t0 * V]), n, V), conv_w.data(), conv_k, conv_state.data(),
                       n > 1 ? conv_cap.data() : nullptr, Rows(&conv_out[t0 * V], n, V), kern);
    };
    for (DotIsa isa : isas())
      for (int threads : {1, 3}) {
        ThreadPool pool(threads);
        std::vector<float> state = init, conv_state = conv_init, out(n_max * V), conv_out(n_max * V);
        std::vector<std::vector<float>> states;
        for (int t = 0; t < n_max; ++t) {
          step(t, 1, state, conv_state, out, conv_out, f32_kernels(isa), pool);
          states.push_back(state);
        }
        for (int n : kWidths) {
          std::vector<float> s2 = init, c2 = conv_init, out2(n_max * V), conv2(n_max * V);
          step(0, n, s2, c2, out2, conv2, f32_kernels(isa), pool);
          out2.resize(n * V);
          conv2.resize(n * V);
          const std::string where = std::string(name(isa)) + " d=" + std::to_string(d) + " n=" + std::to_string(n) +
                                    " threads=" + std::to_string(threads);
          EXPECT_EQ(first_difference(out2, std::vector<float>(out.begin(), out.begin() + n * V)), -1) << "gdn out " << where;
          EXPECT_EQ(first_difference(s2, states[n - 1]), -1) << "gdn state " << where;
          EXPECT_EQ(first_difference(conv2, std::vector<float>(conv_out.begin(), conv_out.begin() + n * V)), -1)
              << "conv out " << where;
        }
      }
  }
}

}  // namespace
}  // namespace hyspec::cpu
