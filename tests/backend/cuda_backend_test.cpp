// The CUDA backend against the CPU backend, op by op, on random inputs (never zeros), with every
// output poisoned (NaN) before the op so an unwritten element fails. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/chunk_draw.h"
#include "common/fixtures.h"
#include "common/inverse_cdf.h"
#include "common/kv_cache_bytes.h"
#include "format/quants.h"
#include "util/half.h"

#ifdef HYSPEC_HAVE_CUDA
#include "backend/cuda/kernels.h"  // attention_trace_report, int8_matvec_tma_available
#endif

namespace hyspec {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// ||a - b|| / ||b||, or infinity when a holds a non-finite value.
double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return std::numeric_limits<double>::infinity();
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// A buffer on one backend with its host mirror.
struct Tensor {
  Buffer buf;
  size_t n = 0;
  float* f() const { return buf.as<float>(); }
  Rows rows(int64_t r, int64_t c, int64_t stride = -1) const { return Rows(f(), r, c, stride); }
};

// KV cache with `ctx` earlier positions stored, then n new rows at ctx..ctx+n-1.
struct AttnCase {
  int n_head, n_kv, head_dim;
  int64_t ctx;
  int64_t capacity = 0;  // of the cache (0: the keys read)
};

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto g = create_backend(BackendKind::Cuda, options_);
    if (!g.is_ok()) GTEST_SKIP() << "no CUDA device: " << g.message();
    gpu_ = std::move(g).value();
    auto c = create_backend(BackendKind::Cpu);
    ASSERT_TRUE(c.is_ok()) << c.message();
    cpu_ = std::move(c).value();
  }
  void TearDown() override {
    if (gpu_) {
      Status s = gpu_->synchronize();
      EXPECT_TRUE(s.is_ok()) << s.message();
    }
  }

  BackendOptions options_;

  std::vector<float> randn(size_t n, float scale = 1.0f) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng_);
    return v;
  }
  int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

  // ops(run, t, n, settle) on rows [t, t + n) of three: into ref one row at a time with the backend
  // synchronized between its ops (settle: nothing deferred across them), into eager one row at a time, into
  // graph one row at a time, each captured as a graph and replayed, and into wide as one 3-row step.
  template <class Run, class Ops>
  void run_each_way(Ops&& ops, Run& ref, Run& eager, Run& graph, Run& wide) {
    for (int64_t t = 0; t < 3; ++t) ops(ref, t, 1, true), ops(eager, t, 1, false);
    for (int64_t t = 0; t < 3; ++t) {
      auto g = gpu_->capture([&] { ops(graph, t, 1, false); });
      ASSERT_TRUE(g.is_ok()) << g.message();
      ASSERT_TRUE(g.value()->replay().is_ok());
    }
    ops(wide, 0, 3, false);
  }

  static Tensor put(Backend& b, const std::vector<float>& v) {
    Tensor t{b.alloc(v.size() * sizeof(float)).value(), v.size()};
    b.upload(t.f(), v.data(), v.size() * sizeof(float));
    return t;
  }
  static Tensor poison(Backend& b, size_t n) { return put(b, std::vector<float>(n, kNaN)); }
  static Buffer put_i32(Backend& b, const std::vector<int32_t>& v) {
    Buffer buf = b.alloc(v.size() * sizeof(int32_t)).value();
    b.upload(buf.data(), v.data(), v.size() * sizeof(int32_t));
    return buf;
  }
  static std::vector<float> get(Backend& b, const Tensor& t) {
    std::vector<float> v(t.n);
    b.download(v.data(), t.f(), t.n * sizeof(float));
    return v;
  }
  std::vector<float> get_gpu(const Tensor& t) {
    auto v = get(*gpu_, t);
    Status s = gpu_->synchronize();
    EXPECT_TRUE(s.is_ok()) << s.message();
    return v;
  }

  // Same inputs on both backends.
  struct Pair {
    Tensor c, g;
  };
  Pair both(const std::vector<float>& v) { return {put(*cpu_, v), put(*gpu_, v)}; }
  Pair both_poison(size_t n) { return {poison(*cpu_, n), poison(*gpu_, n)}; }
  void expect_close(const Pair& p, double tol, const std::string& what) {
    const auto c = get(*cpu_, p.c), g = get_gpu(p.g);
    const double e = rel_err(g, c);
    EXPECT_LE(e, tol) << what;
  }

  // gated_delta_net on both backends with the same inputs; q, k, v are column views of one
  // [n, (2 n_k + n_v) d] buffer, as the model passes them.
  struct GdnPairs {
    int n_k, n_v, d;
    int64_t n;
    Pair qkv, beta, alpha, ssm_a, dt_bias, state, out, capture;  // capture: read only with_capture
  };

  // Attention of n new rows at ctx..ctx+n-1 (keys and values of every position stored by kv_store) on
  // both backends, within 1e-4 (max_keys: AttentionArgs').
  void attention_matches_cpu(const AttnCase& ac, GgmlType kv_type, int64_t n, bool causal, int64_t max_keys = 0) {
    const int64_t D = ac.head_dim, W = ac.n_kv * D, cap = std::max(ac.capacity, ac.ctx + n + 3), total = ac.ctx + n;
    const size_t row = KvLayer{nullptr, nullptr, kv_type, cap, W, D}.row_bytes();
    std::vector<int32_t> pos(total);
    for (int64_t i = 0; i < total; ++i) pos[i] = static_cast<int32_t>(i);
    Pair k = both(randn(total * W)), v = both(randn(total * W)), q = both(randn(n * ac.n_head * D));
    Pair out = both_poison(n * ac.n_head * D);
    for (Backend* be : {cpu_.get(), gpu_.get()}) {
      const bool g = be == gpu_.get();
      Buffer kc = be->alloc(cap * row).value(), vc = be->alloc(cap * row).value();
      Buffer p = put_i32(*be, pos);
      KvLayer kv{kc.data(), vc.data(), kv_type, cap, W, D};
      be->kv_store((g ? k.g : k.c).rows(total, W), (g ? v.g : v.c).rows(total, W), kv, p.as<int32_t>());
      AttentionArgs a;
      a.q = (g ? q.g : q.c).rows(n, ac.n_head * D);
      a.kv = kv;
      a.positions = p.as<int32_t>() + ac.ctx;
      a.n_head = ac.n_head;
      a.n_kv_head = ac.n_kv;
      a.head_dim = ac.head_dim;
      a.scale = 1.0f / std::sqrt(static_cast<float>(D));
      a.causal = causal;
      a.out = (g ? out.g : out.c).rows(n, ac.n_head * D);
      a.max_keys = max_keys;
      be->attention(a);
      ASSERT_TRUE(be->synchronize().is_ok());
    }
    expect_close(out, 1e-4,
                 fmt::format("H={} Hkv={} D={} ctx={} kv={} n={} causal={} max_keys={}", ac.n_head, ac.n_kv, D, ac.ctx,
                             ggml_type_name(kv_type), n, causal, max_keys));
  }
  void gdn_on_both(const GdnPairs& p, bool chunked, bool with_capture) {
    const int64_t Kc = int64_t{p.n_k} * p.d, Vc = int64_t{p.n_v} * p.d;
    for (Backend* be : {cpu_.get(), gpu_.get()}) {
      const bool g = be == gpu_.get();
      auto on = [g](const Pair& x) -> const Tensor& { return g ? x.g : x.c; };
      Rows X = on(p.qkv).rows(p.n, 2 * Kc + Vc);
      GdnArgs a;
      a.q = X.cols(0, Kc);
      a.k = X.cols(Kc, Kc);
      a.v = X.cols(2 * Kc, Vc);
      a.beta_logit = on(p.beta).rows(p.n, p.n_v);
      a.alpha = on(p.alpha).rows(p.n, p.n_v);
      a.ssm_a = on(p.ssm_a).f();
      a.dt_bias = on(p.dt_bias).f();
      a.n_k_heads = p.n_k;
      a.n_v_heads = p.n_v;
      a.head_dim = p.d;
      a.state = on(p.state).f();
      a.capture = with_capture ? on(p.capture).f() : nullptr;
      a.chunked = chunked;
      a.out = on(p.out).rows(p.n, Vc);
      be->gated_delta_net(a);
    }
  }

  // One look-ahead draw through its read-back slot (mapped host memory): the inputs put, `enqueue` (the op, or a
  // graph that replays it), the slot read back.
  static TokenDraw draw_through(Readback& slot, const TokenDraw& in, const std::function<void()>& enqueue) {
    slot.put(&in, sizeof(in));
    enqueue();
    slot.mark();
    TokenDraw got{};
    EXPECT_TRUE(slot.finish(&got, sizeof(got)).is_ok());
    return got;
  }

  std::unique_ptr<Backend> cpu_, gpu_;
  std::mt19937 rng_{20261122};
};

// ---- weights ----

// Random GGML blocks of n_out rows x n_in: real quantization where hyspec can quantize, else random
// bytes with small, finite scales.
// Random blocks: quantized normal rows where format/quants can quantize the type, else random bytes
// with each block's f16 scales (offset, magnitude) set to keep values ~1e-2..1e-1.
std::vector<uint8_t> random_weight_bytes(GgmlType type, int64_t n_in, int64_t n_out, std::mt19937& rng) {
  const size_t row_bytes = ggml_row_bytes(type, n_in).value();
  std::vector<uint8_t> bytes(row_bytes * n_out);
  std::vector<std::pair<int, float>> scales;  // (byte offset in the block, magnitude)
  switch (type) {
    case GgmlType::Q4_K: case GgmlType::Q5_K: scales = {{0, 4e-3f}, {2, 2e-3f}}; break;
    case GgmlType::Q6_K: scales = {{208, 2e-3f}}; break;
    case GgmlType::Q4_1: case GgmlType::Q5_1: scales = {{0, 4e-3f}, {2, -3e-2f}}; break;
    case GgmlType::Q5_0: scales = {{0, 4e-3f}}; break;
    case GgmlType::IQ4_NL: scales = {{0, 5e-4f}}; break;
    case GgmlType::IQ4_XS: scales = {{0, 2e-5f}}; break;
    case GgmlType::Q2_K: scales = {{80, 8e-3f}, {82, 4e-3f}}; break;
    case GgmlType::Q3_K: scales = {{108, 2e-3f}}; break;
    case GgmlType::IQ2_XXS: case GgmlType::IQ2_XS: case GgmlType::IQ2_S: scales = {{0, 2e-4f}}; break;
    case GgmlType::IQ3_XXS: case GgmlType::IQ3_S: scales = {{0, 1e-4f}}; break;
    case GgmlType::IQ1_S: scales = {{0, 3e-3f}}; break;
    case GgmlType::IQ1_M: scales = {{-1, 3e-3f}}; break;  // its f16 scale is the top nibbles of 4 u16 at 48
    default: break;
  }
  if (!scales.empty()) {
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    std::uniform_real_distribution<float> u(0.5f, 1.5f);
    const size_t bs = ggml_type_traits(type).type_size;
    for (size_t off = 0; off < bytes.size(); off += bs)
      for (const auto& [at, mag] : scales) {
        const uint16_t h = fp32_to_fp16(mag * u(rng));
        if (at >= 0) {
          std::memcpy(&bytes[off + at], &h, 2);
          continue;
        }
        for (int i = 0; i < 4; ++i)  // IQ1_M: nibble i of the scale in the top nibble of u16 i
          bytes[off + 49 + 2 * i] =
              static_cast<uint8_t>((bytes[off + 49 + 2 * i] & 0x0F) | (((h >> (4 * i)) & 15) << 4));
      }
    return bytes;
  }
  std::normal_distribution<float> d(0.0f, 0.05f);
  std::vector<float> row(n_in);
  for (int64_t r = 0; r < n_out; ++r) {
    for (auto& x : row) x = d(rng);
    EXPECT_TRUE(quantize_row(type, row.data(), bytes.data() + r * row_bytes, n_in).is_ok());
  }
  return bytes;
}

GgufTensorInfo tensor_info(const std::string& name, GgmlType type, const std::vector<uint8_t>& bytes, int64_t n_in,
                           int64_t n_out, int64_t n_expert = 1) {
  GgufTensorInfo t;
  t.name = name;
  t.type = type;
  t.n_dims = n_expert > 1 ? 3 : 2;
  t.ne[0] = n_in;
  t.ne[1] = n_out;
  t.ne[2] = n_expert;
  t.nbytes = bytes.size();
  t.data = bytes.data();
  return t;
}

// A weight [n_in -> n_out] of random bytes of `type`, loaded on b (the bytes are copied at the load).
Weight load_random_weight(Backend& b, GgmlType type, int64_t n_in, int64_t n_out, std::mt19937& rng) {
  auto w = b.load_weight(tensor_info("w", type, random_weight_bytes(type, n_in, n_out, rng), n_in, n_out));
  EXPECT_TRUE(w.is_ok()) << w.message();
  return std::move(w).value();
}

// The matmul tests run twice: with BackendOptions::int8_matvec (the default: Q4_K, Q5_K, Q6_K, Q3_K and IQ4_XS on
// int8 activations, matvec_int8.cu) and without (the f16 tensor-core matvec for every type).
class CudaMatmulTest : public CudaBackendTest, public ::testing::WithParamInterface<bool> {
 protected:
  void SetUp() override {
    options_.int8_matvec = GetParam();
    CudaBackendTest::SetUp();
  }
};
INSTANTIATE_TEST_SUITE_P(Matvec, CudaMatmulTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "int8" : "f16"; });

// The types of the int8 matvec (BackendOptions::int8_matvec).
bool int8_type(GgmlType t) {
  return t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q6_K || t == GgmlType::Q3_K || t == GgmlType::IQ4_XS;
}

// Relative error of CUDA matmul against the CPU on the dequantized weights. Q4_K, Q5_K and Q6_K at
// widths <= 32 quantize activations to int8 per 256 elements (matvec_int8.cu, as llama.cpp's CPU
// q8_K): ~5e-3 rms relative for random x; the f16 tensor-core paths ~3e-4. BF16 products take bf16
// activations at every width (bf16 MMAs, cuBLAS on the weights as stored): x rounded to 8 mantissa
// bits, ~1.1e-3 rms relative.
double matmul_tol(GgmlType type, int64_t n, double f16_tol, bool int8) {
  if (int8 && int8_type(type) && n <= 64) return 1.2e-2;  // 33..64 rows: two int8 chunks
  if (type == GgmlType::BF16) return 3e-3;
  return f16_tol;
}

const GgmlType kTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16,   GgmlType::Q8_0,  GgmlType::Q4_0,
                           GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K,   GgmlType::Q4_1,  GgmlType::Q5_0,
                           GgmlType::Q5_1, GgmlType::Q2_K, GgmlType::Q3_K,   GgmlType::IQ4_NL, GgmlType::IQ4_XS,
                           GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ2_S, GgmlType::IQ3_XXS,
                           GgmlType::IQ3_S, GgmlType::IQ1_S, GgmlType::IQ1_M};
const int64_t kWidths[] = {1, 2, 3, 8, 16, 17, 24, 32, 100};

// The oracle is the CPU on the f32 dequantisation (exact f32 dots); the CUDA kernels for stored
// F16/quant weights multiply in f16 with f32 accumulation, ~3e-4 relative; BF16 in bf16.
TEST_P(CudaMatmulTest, MatmulEveryTypeAndWidthMatchesDequantizedReference) {
  const int64_t K = 512, N = 72;  // N not a multiple of 16: partial row tiles
  for (GgmlType type : kTypes) {
    const auto bytes = random_weight_bytes(type, K, N, rng_);
    const GgufTensorInfo info = tensor_info("w", type, bytes, K, N);
    auto wc = cpu_->load_weight(info, /*dequantize_to_f32=*/true);
    auto wg = gpu_->load_weight(info);
    auto wg32 = gpu_->load_weight(info, true);
    ASSERT_TRUE(wc.is_ok() && wg.is_ok() && wg32.is_ok()) << wc.message() << wg.message();
    for (int64_t n : kWidths) {
      // x is a column slice of a wider buffer, y too.
      const auto xv = randn(n * (K + 8));
      Pair x = both(xv), y = both_poison(n * (N + 4)), y32 = both_poison(n * N);
      cpu_->matmul(*wc, x.c.rows(n, K, K + 8), y.c.rows(n, N, N + 4));
      gpu_->matmul(*wg, x.g.rows(n, K, K + 8), y.g.rows(n, N, N + 4));
      gpu_->matmul(*wg32, x.g.rows(n, K, K + 8), y32.g.rows(n, N));
      const auto c = get(*cpu_, y.c), g = get_gpu(y.g), g32 = get_gpu(y32.g);
      std::vector<float> cs, gs;
      for (int64_t t = 0; t < n; ++t)
        for (int64_t o = 0; o < N; ++o) cs.push_back(c[t * (N + 4) + o]), gs.push_back(g[t * (N + 4) + o]);
      // F32 weights (and the dequantized copies) take the exact f32 path.
      const double tol = type == GgmlType::F32 ? 1e-5 : matmul_tol(type, n, 1e-3, options_.int8_matvec);
      EXPECT_LE(rel_err(gs, cs), tol) << ggml_type_name(type) << " n=" << n;
      EXPECT_LE(rel_err(g32, cs), 1e-5) << ggml_type_name(type) << " dequantized, n=" << n;
      for (int64_t t = 0; t < n; ++t)
        for (int64_t o = N; o < N + 4; ++o) ASSERT_TRUE(std::isnan(g[t * (N + 4) + o])) << "wrote past the slice";
    }
  }
}

// Shapes that exercise the streaming matvec beyond one tile per block and one step per warp: more
// row tiles than the persistent grid has blocks, rows not 16-byte aligned (Q6_K with an odd number
// of blocks per row, Q8_0/Q4_0 with 33 chunks), and a last step with fewer chunks than a full one.
TEST_P(CudaMatmulTest, MatmulStreamsLargeAndMisalignedShapes) {
  struct Case {
    GgmlType type;
    int64_t K;
  };
  const int64_t N = 8456;  // 529 tiles of 16 rows, 265 of 32
  for (const Case cs : {Case{GgmlType::Q4_K, 2304}, Case{GgmlType::Q5_K, 2304}, Case{GgmlType::Q6_K, 2304},
                        Case{GgmlType::Q8_0, 1056}, Case{GgmlType::Q4_0, 1056}, Case{GgmlType::F16, 1056},
                        Case{GgmlType::BF16, 1056}, Case{GgmlType::Q3_K, 2304}, Case{GgmlType::Q5_0, 1056},
                        Case{GgmlType::IQ4_XS, 2304}}) {
    const int64_t K = cs.K;
    const auto bytes = random_weight_bytes(cs.type, K, N, rng_);
    const GgufTensorInfo info = tensor_info("w", cs.type, bytes, K, N);
    auto wc = cpu_->load_weight(info, /*dequantize_to_f32=*/true);
    auto wg = gpu_->load_weight(info);
    ASSERT_TRUE(wc.is_ok() && wg.is_ok()) << wc.message() << wg.message();
    for (int64_t n : {1, 4, 5, 16, 17, 32}) {
      Pair x = both(randn(n * K)), y = both_poison(n * N);
      cpu_->matmul(*wc, x.c.rows(n, K), y.c.rows(n, N));
      gpu_->matmul(*wg, x.g.rows(n, K), y.g.rows(n, N));
      expect_close(y, matmul_tol(cs.type, n, 1e-3, options_.int8_matvec), fmt::format("{} K={} n={}", ggml_type_name(cs.type), K, n));
    }
  }
}

// The fused gate/up/SwiGLU matvec equals matmul, matmul, swiglu (CPU, dequantized weights).
TEST_P(CudaMatmulTest, MatmulSwiGluMatchesSeparateOps) {
  const int64_t N = 1000;
  for (GgmlType type : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::Q4_0,
                        GgmlType::F16, GgmlType::BF16}) {
    const int64_t K = ggml_type_traits(type).block_size == 256 ? 2304 : 1056;
    const auto gb = random_weight_bytes(type, K, N, rng_), ub = random_weight_bytes(type, K, N, rng_);
    const GgufTensorInfo gi = tensor_info("gate", type, gb, K, N), ui = tensor_info("up", type, ub, K, N);
    auto gc = cpu_->load_weight(gi, true), uc = cpu_->load_weight(ui, true);
    auto gg = gpu_->load_weight(gi), ug = gpu_->load_weight(ui);
    ASSERT_TRUE(gc.is_ok() && uc.is_ok() && gg.is_ok() && ug.is_ok());
    for (int64_t n : {1, 3, 8, 9, 16, 17, 24, 25}) {
      Pair x = both(randn(n * K)), y = both_poison(n * N);
      Tensor g = poison(*cpu_, n * N), u = poison(*cpu_, n * N);
      cpu_->matmul(*gc, x.c.rows(n, K), g.rows(n, N));
      cpu_->matmul(*uc, x.c.rows(n, K), u.rows(n, N));
      cpu_->swiglu(g.rows(n, N), u.rows(n, N), y.c.rows(n, N));
      const bool fused = gpu_->matmul_swiglu(*gg, *ug, x.g.rows(n, K), y.g.rows(n, N));
      EXPECT_EQ(fused, n <= 24) << ggml_type_name(type) << " n=" << n;
      if (!fused) continue;
      // silu(g) * u compounds the int8- (bf16-) activation errors of both products
      expect_close(y, options_.int8_matvec && int8_type(type) ? 3e-2 : type == GgmlType::BF16 ? 5e-3 : 2e-3,
                   fmt::format("{} n={}", ggml_type_name(type), n));
    }
  }
}

// Speculative verify must reproduce decode steps bit for bit: row t of an n-row matmul equals the
// 1-row matmul of x[t], for every width of the matvec paths, and the fused SwiGLU equals
// matmul, matmul, swiglu on the same weights.
TEST_P(CudaMatmulTest, MatvecRowsAreBitIdenticalAcrossWidths) {
  const int64_t N = 200;
  struct Case {
    GgmlType type;
    int64_t K;
  };
  // K = 8448, 17408: past the int8 one-token kernel's in-block limit. Q4_K and Q6_K stage x in two or three
  // rounds of blocks (Int8XFold::kPlain); Q3_K and IQ4_XS copy x quantized by a launch of its own.
  for (const auto [type, K] : {Case{GgmlType::Q4_K, 2304}, Case{GgmlType::Q4_K, 8448}, Case{GgmlType::Q4_K, 17408},
                               Case{GgmlType::Q5_K, 2304},
                               Case{GgmlType::Q6_K, 2304}, Case{GgmlType::Q6_K, 8448}, Case{GgmlType::Q8_0, 2304},
                               Case{GgmlType::Q4_0, 2304}, Case{GgmlType::F16, 2304}, Case{GgmlType::BF16, 2304},
                               Case{GgmlType::Q3_K, 2304}, Case{GgmlType::Q3_K, 8448}, Case{GgmlType::IQ4_XS, 2304},
                               Case{GgmlType::IQ4_XS, 8448}, Case{GgmlType::F32, 2048}, Case{GgmlType::F32, 1002},
                               Case{GgmlType::F16, 40}}) {  // the last three: the exact f32 kernel
    const auto gb = random_weight_bytes(type, K, N, rng_), ub = random_weight_bytes(type, K, N, rng_);
    const GgufTensorInfo gi = tensor_info("gate", type, gb, K, N), ui = tensor_info("up", type, ub, K, N);
    auto gg = gpu_->load_weight(gi), ug = gpu_->load_weight(ui);
    ASSERT_TRUE(gg.is_ok() && ug.is_ok());
    // 33 and 48 rows: the int8 types run in two chunks of at most 32 (verify-32 steps are 33 rows).
    const bool chunked = GetParam() && int8_type(type);
    const int64_t n_max = chunked ? 48 : 32;
    Pair x = both(randn(n_max * K));
    Pair one = both_poison(n_max * N), one_u = both_poison(n_max * N), ref_sw = both_poison(n_max * N);
    for (int64_t t = 0; t < n_max; ++t) {
      gpu_->matmul(*gg, x.g.rows(n_max, K).rows(t, 1), one.g.rows(n_max, N).rows(t, 1));
      gpu_->matmul(*ug, x.g.rows(n_max, K).rows(t, 1), one_u.g.rows(n_max, N).rows(t, 1));
    }
    gpu_->swiglu(one.g.rows(n_max, N), one_u.g.rows(n_max, N), ref_sw.g.rows(n_max, N));
    const auto ref = get_gpu(one.g), ref_s = get_gpu(ref_sw.g);
    for (int64_t n : {2, 3, 5, 8, 9, 16, 17, 24, 25, 32, 33, 48}) {
      if (n > n_max) continue;
      Pair y = both_poison(n * N), ys = both_poison(n * N);
      gpu_->matmul(*gg, x.g.rows(n, K), y.g.rows(n, N));
      const auto got = get_gpu(y.g);
      for (int64_t i = 0; i < n * N; ++i)
        ASSERT_EQ(std::memcmp(&got[i], &ref[i], 4), 0) << ggml_type_name(type) << " n=" << n << " at " << i;
      if (gpu_->matmul_swiglu(*gg, *ug, x.g.rows(n, K), ys.g.rows(n, N))) {
        const auto sw = get_gpu(ys.g);
        for (int64_t i = 0; i < n * N; ++i)
          ASSERT_EQ(std::memcmp(&sw[i], &ref_s[i], 4), 0) << ggml_type_name(type) << " swiglu n=" << n << " at " << i;
      }
    }
  }
}

// Sets an environment variable for its lifetime, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* before = std::getenv(name)) saved_ = before;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (saved_) setenv(name_, saved_->c_str(), 1);
    else unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> saved_;
};

// A Q6_K matmul of 3..16 tokens with many more row tiles than warps (the output head) runs on warp tiles
// (matvec_int8.cu, s16_mma_wt_kernel), the tiles left over in the block form: row t keeps the bits of the
// one-row matmul of x[t] (17 and 24 tokens take the block form: a check on the test). HYSPEC_WARP_TILES=8
// puts any shape with a tile a warp on 8 blocks (64 warps). K = 2304 gives the block form's warps unequal
// steps (9 super-blocks), 4096 two each; 8456 rows leave a part tile.
TEST_P(CudaMatmulTest, MatvecOnWarpTilesKeepsTheOneRowBits) {
  if (!GetParam()) GTEST_SKIP() << "the int8 matvec's kernels";
  const ScopedEnv forced("HYSPEC_WARP_TILES", "8");
  const int64_t N = 8456;
  for (const int64_t K : {2304, 4096}) {
    const auto bytes = random_weight_bytes(GgmlType::Q6_K, K, N, rng_);
    auto w = gpu_->load_weight(tensor_info("head", GgmlType::Q6_K, bytes, K, N));
    ASSERT_TRUE(w.is_ok()) << w.message();
    const int64_t n_max = 24;
    const Tensor x = put(*gpu_, randn(n_max * K)), one = poison(*gpu_, n_max * N);  // (no CPU side: CUDA against CUDA)
    for (int64_t t = 0; t < n_max; ++t) gpu_->matmul(*w, x.rows(n_max, K).rows(t, 1), one.rows(n_max, N).rows(t, 1));
    const auto ref = get_gpu(one);
    for (const int64_t n : {3, 8, 9, 16, 17, 24}) {
      const Tensor y = poison(*gpu_, n * N);
      gpu_->matmul(*w, x.rows(n, K), y.rows(n, N));
      const auto got = get_gpu(y);
      for (int64_t i = 0; i < n * N; ++i)
        ASSERT_EQ(std::memcmp(&got[i], &ref[i], 4), 0) << "K=" << K << " n=" << n << " token " << i / N << " row " << i % N;
    }
  }
}

// On sm_90 the Q4_K and Q6_K matmuls take their weights by TMA boxes (matvec_int8.cu, TmaStepRing) instead
// of cp.async copies (HYSPEC_TMA_RING=0, HYSPEC_TMA_Q6K=0): the same slots, so the same bits, for the plain
// matmul, the fused SwiGLU and a matmul_many with a Q6_K part (by TMA at K = 4096; at 2304, whose rows no map
// takes, its cp.async ring in the same launch), at 1..32 tokens, on Q4_K's one-n-tile three-stage ring and
// the two-stage one (HYSPEC_TMA_STAGES=2), with a part tile past the matrix (8456 rows) and unequal steps a
// warp (K = 2304).
TEST_P(CudaMatmulTest, MatvecByTmaKeepsTheCopiesBits) {
  if (!GetParam()) GTEST_SKIP() << "the int8 matvec's kernels";
#ifdef HYSPEC_HAVE_CUDA
  if (!cuda::int8_matvec_tma_available()) GTEST_SKIP() << "no TMA here (sm_90 and the driver's tensor-map encoder)";
#endif
  const int64_t N = 8456, N6 = 264, n_max = 32;
  const int64_t widths[] = {1, 2, 3, 8, 9, 16, 17, 24, 25, 32};
  for (const int64_t K : {2304, 4096}) {
    const auto gb = random_weight_bytes(GgmlType::Q4_K, K, N, rng_), ub = random_weight_bytes(GgmlType::Q4_K, K, N, rng_);
    const auto b6 = random_weight_bytes(GgmlType::Q6_K, K, N6, rng_), u6 = random_weight_bytes(GgmlType::Q6_K, K, N6, rng_);
    auto w = gpu_->load_weight(tensor_info("w", GgmlType::Q4_K, gb, K, N));
    auto up = gpu_->load_weight(tensor_info("up", GgmlType::Q4_K, ub, K, N));
    auto w6 = gpu_->load_weight(tensor_info("w6", GgmlType::Q6_K, b6, K, N6));
    auto up6 = gpu_->load_weight(tensor_info("up6", GgmlType::Q6_K, u6, K, N6));
    ASSERT_TRUE(w.is_ok() && up.is_ok() && w6.is_ok() && up6.is_ok());
    // (matmul_many's one launch at 3+ tokens takes x quantized by the norm that wrote it)
    const Tensor x = put(*gpu_, randn(n_max * K)), wn = put(*gpu_, randn(K)), h = poison(*gpu_, n_max * K);
    gpu_->rms_norm(x.rows(n_max, K), wn.f(), K, 1e-6f, h.rows(n_max, K));
    auto run = [&](const char* tma, const char* stages = "3") {
      // (every width on TMA where tma is 1; restored after: a run may set them for every test)
      const ScopedEnv ring("HYSPEC_TMA_RING", tma), nt1("HYSPEC_TMA_NT1_MIN_BLOCKS", "0"),
          depth("HYSPEC_TMA_STAGES", stages);
      std::vector<std::vector<float>> out;
      for (const int64_t n : widths) {
        const Tensor y = poison(*gpu_, n * N), ys = poison(*gpu_, n * N), ym = poison(*gpu_, n * (2 * N + N6));
        gpu_->matmul(*w, x.rows(n, K), y.rows(n, N));
        out.push_back(get_gpu(y));
        if (gpu_->matmul_swiglu(*w, *up, x.rows(n, K), ys.rows(n, N))) out.push_back(get_gpu(ys));
        const Backend::MatmulPart parts[] = {{&*w, ym.rows(n, 2 * N + N6).cols(0, N)},
                                             {&*w6, ym.rows(n, 2 * N + N6).cols(N, N6)},
                                             {&*up, ym.rows(n, 2 * N + N6).cols(N + N6, N)}};
        for (const Tensor* in : {&x, &h}) {
          gpu_->matmul_many(in->rows(n, K), parts, 3);
          out.push_back(get_gpu(ym));
        }
      }
      return out;
    };
    // (stages 2: Q4_K's one-n-tile kernel on a two-stage ring too, the A/B switch)
    const auto copies = run("0"), tma = run("1"), tma2 = run("1", "2");
    // Q6_K, plain and SwiGLU (K = 4096; 2304 gives 1890-byte rows, which no tensor map takes)
    auto run6 = [&](const char* tma6) {
      const ScopedEnv ring("HYSPEC_TMA_Q6K", tma6);
      std::vector<std::vector<float>> out;
      for (const int64_t n : widths) {
        const Tensor y = poison(*gpu_, n * N6), ys = poison(*gpu_, n * N6);
        gpu_->matmul(*w6, x.rows(n, K), y.rows(n, N6));
        out.push_back(get_gpu(y));
        if (gpu_->matmul_swiglu(*w6, *up6, x.rows(n, K), ys.rows(n, N6))) out.push_back(get_gpu(ys));
      }
      return out;
    };
    const auto copies6 = run6("0"), tma6 = run6("2");
    ASSERT_EQ(copies6.size(), tma6.size());
    for (size_t i = 0; i < copies6.size(); ++i)
      for (size_t e = 0; e < copies6[i].size(); ++e)
        ASSERT_EQ(std::memcmp(&copies6[i][e], &tma6[i][e], 4), 0) << "Q6_K K=" << K << " output " << i << " at " << e;
    for (const auto* other : {&tma, &tma2}) {
      ASSERT_EQ(copies.size(), other->size());
      for (size_t i = 0; i < copies.size(); ++i) {
        ASSERT_EQ(copies[i].size(), (*other)[i].size());
        for (size_t e = 0; e < copies[i].size(); ++e)
          ASSERT_EQ(std::memcmp(&copies[i][e], &(*other)[i][e], 4), 0)
              << "K=" << K << (other == &tma ? "" : " stages 2") << " output " << i << " at " << e;
      }
    }
  }
  // Q6_K rows 8 bytes past a 16-byte multiple (K = 5120: 4200 bytes) take a map of row pairs on the tensor-core
  // kernels (3+ rows; 1-2 rows keep cp.async): the plain matmul (warp tiles forced on too), the SwiGLU (its
  // 8-row halves keep cp.async), and a matmul_many beside a Q4_K part; 263 rows (no whole pairs) keep cp.async.
  const int64_t K = 5120;
  const Tensor x = put(*gpu_, randn(n_max * K)), wn = put(*gpu_, randn(K)), h = poison(*gpu_, n_max * K);
  gpu_->rms_norm(x.rows(n_max, K), wn.f(), K, 1e-6f, h.rows(n_max, K));
  const auto b4 = random_weight_bytes(GgmlType::Q4_K, K, 64, rng_);
  auto w4 = gpu_->load_weight(tensor_info("w4", GgmlType::Q4_K, b4, K, 64));
  ASSERT_TRUE(w4.is_ok());
  for (const int64_t rows : {int64_t{264}, int64_t{263}, int64_t{8456}}) {
    const auto b6 = random_weight_bytes(GgmlType::Q6_K, K, rows, rng_), u6 = random_weight_bytes(GgmlType::Q6_K, K, rows, rng_);
    auto w6 = gpu_->load_weight(tensor_info("w6", GgmlType::Q6_K, b6, K, rows));
    auto up6 = gpu_->load_weight(tensor_info("up6", GgmlType::Q6_K, u6, K, rows));
    ASSERT_TRUE(w6.is_ok() && up6.is_ok());
    auto run = [&](const char* tma, const char* warp_tiles) {
      const ScopedEnv ring("HYSPEC_TMA_RING", tma), wt("HYSPEC_WARP_TILES", warp_tiles);
      std::vector<std::vector<float>> out;
      for (const int64_t n : widths) {
        const Tensor y = poison(*gpu_, n * rows), ys = poison(*gpu_, n * rows), ym = poison(*gpu_, n * (rows + 64));
        gpu_->matmul(*w6, x.rows(n, K), y.rows(n, rows));
        out.push_back(get_gpu(y));
        if (gpu_->matmul_swiglu(*w6, *up6, x.rows(n, K), ys.rows(n, rows))) out.push_back(get_gpu(ys));
        const Backend::MatmulPart parts[] = {{&*w6, ym.rows(n, rows + 64).cols(0, rows)},
                                             {&*w4, ym.rows(n, rows + 64).cols(rows, 64)}};
        for (const Tensor* in : {&x, &h}) {
          gpu_->matmul_many(in->rows(n, K), parts, 2);
          out.push_back(get_gpu(ym));
        }
      }
      return out;
    };
    const auto copies = run("0", "0");
    for (const char* warp_tiles : {"0", "8"}) {
      const auto tma = run("1", warp_tiles);
      ASSERT_EQ(copies.size(), tma.size());
      for (size_t i = 0; i < copies.size(); ++i)
        for (size_t e = 0; e < copies[i].size(); ++e)
          ASSERT_EQ(std::memcmp(&copies[i][e], &tma[i][e], 4), 0)
              << "Q6_K K=5120, " << rows << " rows, warp tiles " << warp_tiles << ": output " << i << " at " << e;
    }
  }
}

// Several weights of one input in one call (a layer's q/k/v, a stacked projection's runs: outputs
// that are column views of one buffer): every part's rows are the bits of its own matmul, at every
// width, for Q4_K and Q6_K parts (one launch where the int8 matvecs allow: x quantized in-block, K <=
// 8192, or by the norm that wrote it) and for sets with other types (one matmul each).
TEST_P(CudaMatmulTest, MatmulManyEqualsOneMatmulEach) {
  struct Part {
    GgmlType type;
    int64_t n_out;
  };
  const std::vector<std::vector<Part>> sets = {
      {{GgmlType::Q4_K, 200}, {GgmlType::Q4_K, 40}, {GgmlType::Q6_K, 72}},
      {{GgmlType::Q6_K, 520}, {GgmlType::Q4_K, 8}},
      {{GgmlType::Q4_K, 33}, {GgmlType::Q6_K, 16}, {GgmlType::Q6_K, 1}, {GgmlType::Q4_K, 300}},
      {{GgmlType::Q8_0, 64}, {GgmlType::Q4_K, 64}},
  };
  for (const int64_t K : {2304, 8448}) {
    const Tensor wn = put(*gpu_, randn(K));
    for (const auto& set : sets) {
      std::vector<Weight> ws;
      std::vector<std::vector<uint8_t>> bytes;
      int64_t total = 0;
      for (const Part& p : set) {
        bytes.push_back(random_weight_bytes(p.type, K, p.n_out, rng_));
        auto w = gpu_->load_weight(tensor_info("w", p.type, bytes.back(), K, p.n_out));
        ASSERT_TRUE(w.is_ok()) << w.message();
        ws.push_back(std::move(w).value());
        total += p.n_out;
      }
      for (const int64_t n : {1, 2, 3, 8, 9, 16, 17, 24, 25}) {
        const Tensor x = put(*gpu_, randn(n * K, 2.0f)), h = poison(*gpu_, n * K);
        for (const bool normed : {false, true}) {
          const std::string what = fmt::format("K={} parts={} n={} normed={}", K, set.size(), n, normed);
          const Tensor ref = poison(*gpu_, n * total), got = poison(*gpu_, n * total);
          const Tensor& in = normed ? h : x;
          if (normed) gpu_->rms_norm(x.rows(n, K), wn.f(), K, 1e-6f, h.rows(n, K));
          std::vector<Backend::MatmulPart> parts;
          int64_t col = 0;
          for (const Weight& w : ws) {
            gpu_->matmul(w, in.rows(n, K), ref.rows(n, total).cols(col, w.n_out));
            parts.push_back({&w, got.rows(n, total).cols(col, w.n_out)});
            col += w.n_out;
          }
          gpu_->matmul_many(in.rows(n, K), parts.data(), parts.size());
          const auto r = get_gpu(ref), g = get_gpu(got);
          for (size_t i = 0; i < r.size(); ++i) {
            ASSERT_TRUE(std::isfinite(r[i])) << what << " at " << i;
            ASSERT_EQ(std::memcmp(&g[i], &r[i], 4), 0) << what << " at " << i;
          }
        }
      }
    }
  }
}

TEST_F(CudaBackendTest, MatmulRowsNotMultipleOf32UseExactFallback) {
  for (GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16}) {
    const int64_t K = 40, N = 9, n = 5;
    const auto bytes = random_weight_bytes(type, K, N, rng_);
    const GgufTensorInfo info = tensor_info("w", type, bytes, K, N);
    auto wc = cpu_->load_weight(info, true);
    auto wg = gpu_->load_weight(info);
    ASSERT_TRUE(wc.is_ok() && wg.is_ok());
    Pair x = both(randn(n * K)), y = both_poison(n * N);
    cpu_->matmul(*wc, x.c.rows(n, K), y.c.rows(n, N));
    gpu_->matmul(*wg, x.g.rows(n, K), y.g.rows(n, N));
    expect_close(y, 1e-5, std::string(ggml_type_name(type)));
  }
}

// Types without CUDA kernels load as Q8_0 requantized on the host: matmul and embed then follow the
// source's dequantized values to the Q8_0 grid's precision (gguf-py's fixture blocks, every such type).
// The fixture's random scales differ wildly between neighbouring sub-blocks (16 or 32 elements), so a
// 32-element Q8_0 block can hold values of very different size: up to ~2% relative here (measured
// 1.75% worst, H100), against ~0.3% for weights whose neighbouring sub-blocks have similar scales.
// Every type of the quants fixture without a bit-trick decoder (blocks made by gguf-py): the element-decoded
// ones natively, MXFP4 re-quantized to Q8_0 at load.
TEST_F(CudaBackendTest, FixtureTypesRunNativelyOrAsQ8_0) {
  for (GgmlType type : {GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                        GgmlType::IQ4_NL, GgmlType::IQ4_XS, GgmlType::MXFP4, GgmlType::IQ1_S, GgmlType::IQ1_M,
                        GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ2_S, GgmlType::IQ3_XXS, GgmlType::IQ3_S}) {
    const bool native = type != GgmlType::MXFP4;
    const std::string name(ggml_type_name(type));
    const std::string blocks = test::read_text_file(test::fixture_path("quants/" + name + ".blocks"));
    const std::vector<uint8_t> bytes(blocks.begin(), blocks.end());
    const int64_t block = ggml_type_traits(type).block_size, N = 8;
    const int64_t K = static_cast<int64_t>(bytes.size() / ggml_type_traits(type).type_size) * block / N;
    ASSERT_EQ(ggml_row_bytes(type, K).value() * N, bytes.size()) << name;
    const GgufTensorInfo info = tensor_info("w", type, bytes, K, N);
    auto wc = cpu_->load_weight(info, /*dequantize_to_f32=*/true);
    auto wg = gpu_->load_weight(info);
    ASSERT_TRUE(wc.is_ok() && wg.is_ok()) << name << ": " << wg.message();
    EXPECT_EQ(wg->type, native ? type : GgmlType::Q8_0) << name;
    for (int64_t n : {1, 17, 40}) {
      Pair x = both(randn(n * K)), y = both_poison(n * N);
      cpu_->matmul(*wc, x.c.rows(n, K), y.c.rows(n, N));
      gpu_->matmul(*wg, x.g.rows(n, K), y.g.rows(n, N));
      expect_close(y, native ? matmul_tol(type, n, 2e-3, options_.int8_matvec) : 3e-2, fmt::format("{} n={}", name, n));
    }
    std::vector<int32_t> ids = {0, 5, 7, 3};
    Buffer tc = put_i32(*cpu_, ids), tg = put_i32(*gpu_, ids);
    Pair out = both_poison(4 * K);
    cpu_->embed(*wc, tc.as<int32_t>(), 4, out.c.rows(4, K));
    gpu_->embed(*wg, tg.as<int32_t>(), 4, out.g.rows(4, K));
    expect_close(out, native ? 1e-6 : 3e-2, name + " embed");
  }
}

TEST_F(CudaBackendTest, EmbedEveryTypeIsExact) {
  const int64_t K = 256, V = 40, n = 7;
  std::vector<int32_t> ids(n);
  for (auto& id : ids) id = uniform(0, V - 1);
  ids[3] = V + 5;  // out of range: zeros on both
  for (GgmlType type : kTypes) {
    const auto bytes = random_weight_bytes(type, K, V, rng_);
    const GgufTensorInfo info = tensor_info("tok", type, bytes, K, V);
    auto wc = cpu_->load_weight(info);
    auto wg = gpu_->load_weight(info);
    ASSERT_TRUE(wc.is_ok() && wg.is_ok());
    Buffer tc = put_i32(*cpu_, ids), tg = put_i32(*gpu_, ids);
    Pair out = both_poison(n * K);
    cpu_->embed(*wc, tc.as<int32_t>(), n, out.c.rows(n, K));
    gpu_->embed(*wg, tg.as<int32_t>(), n, out.g.rows(n, K));
    expect_close(out, 1e-6, std::string(ggml_type_name(type)));
  }
}

TEST_F(CudaBackendTest, RmsNormsMatchCpu) {
  for (int64_t group : {64, 1000}) {
    const int64_t n = 5, C = group * 3;
    const auto xv = randn(n * (C + 4), 3.0f), zv = randn(n * C), wv = randn(group);
    Pair x = both(xv), z = both(zv), w = both(wv), y = both_poison(n * C), y2 = both_poison(n * C);
    Pair g = both_poison(n * C);
    for (Backend* b : {cpu_.get(), gpu_.get()}) {
      const bool is_gpu = b == gpu_.get();
      auto& X = is_gpu ? x.g : x.c;
      b->rms_norm(X.rows(n, C, C + 4), (is_gpu ? w.g : w.c).f(), group, 1e-6f, (is_gpu ? y.g : y.c).rows(n, C));
      b->rms_norm(X.rows(n, C, C + 4), nullptr, group, 1e-6f, (is_gpu ? y2.g : y2.c).rows(n, C));
      b->gated_rms_norm(X.rows(n, C, C + 4), (is_gpu ? z.g : z.c).rows(n, C), (is_gpu ? w.g : w.c).f(), group, 1e-6f,
                        (is_gpu ? g.g : g.c).rows(n, C));
    }
    expect_close(y, 1e-5, "rms_norm group " + std::to_string(group));
    expect_close(y2, 1e-5, "rms_norm without weight");
    expect_close(g, 1e-5, "gated_rms_norm");
  }
}

// The [n, C] values of a strided buffer.
std::vector<float> valid_region(const std::vector<float>& v, int64_t n, int64_t C, int64_t stride) {
  std::vector<float> out;
  for (int64_t r = 0; r < n; ++r) out.insert(out.end(), v.begin() + r * stride, v.begin() + r * stride + C);
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// add_rms_norm is CUDA's add then CUDA's rms_norm in one launch, bit for bit, and a row's bits do
// not depend on how many rows share the call (a verify row equals its decode step); against the CPU
// within the rms_norm tolerance. Groups of a warp (<= 512) and of a block (> 512), strided rows.
TEST_F(CudaBackendTest, AddRmsNormIsBitIdenticalToAddThenRmsNorm) {
  struct Shape {
    int64_t group, groups;
    bool weighted;
  };
  for (const Shape sh : {Shape{64, 3, true}, Shape{128, 1, false}, Shape{1000, 2, true}, Shape{4096, 1, true}}) {
    for (int64_t n : {1, 3, 17}) {
      const int64_t C = sh.group * sh.groups, xs = C + 4, ds = C + 8, hs = C + 2;
      const auto xv = randn(n * xs, 3.0f), dv = randn(n * ds), wv = randn(sh.group);
      const std::string what = "group " + std::to_string(sh.group) + " x " + std::to_string(sh.groups) + ", n " +
                               std::to_string(n) + (sh.weighted ? "" : ", no weight");
      Tensor d = put(*gpu_, dv), w = put(*gpu_, wv);
      const float* wp = sh.weighted ? w.f() : nullptr;
      Rows D = d.rows(n, C, ds);
      // Fused, in one call of n rows.
      Tensor x_fused = put(*gpu_, xv), h_fused = poison(*gpu_, n * hs);
      gpu_->add_rms_norm(x_fused.rows(n, C, xs), D, wp, sh.group, 1e-6f, h_fused.rows(n, C, hs));
      // Fused, one call per row.
      Tensor x_rows = put(*gpu_, xv), h_rows = poison(*gpu_, n * hs);
      for (int64_t r = 0; r < n; ++r)
        gpu_->add_rms_norm(x_rows.rows(n, C, xs).rows(r, 1), D.rows(r, 1), wp, sh.group, 1e-6f,
                           h_rows.rows(n, C, hs).rows(r, 1));
      // CUDA's separate ops.
      Tensor x_ref = put(*gpu_, xv), h_ref = poison(*gpu_, n * hs);
      gpu_->add(x_ref.rows(n, C, xs), D, x_ref.rows(n, C, xs));
      gpu_->rms_norm(x_ref.rows(n, C, xs), wp, sh.group, 1e-6f, h_ref.rows(n, C, hs));
      // The CPU.
      Tensor x_cpu = put(*cpu_, xv), d_cpu = put(*cpu_, dv), w_cpu = put(*cpu_, wv), h_cpu = poison(*cpu_, n * hs);
      cpu_->add_rms_norm(x_cpu.rows(n, C, xs), d_cpu.rows(n, C, ds), sh.weighted ? w_cpu.f() : nullptr, sh.group,
                         1e-6f, h_cpu.rows(n, C, hs));

      const auto xf = get_gpu(x_fused), hf = get_gpu(h_fused), xr = get_gpu(x_ref), hr = get_gpu(h_ref);
      EXPECT_TRUE(same_bits(xf, xr)) << what << ": x";
      EXPECT_TRUE(same_bits(valid_region(hf, n, C, hs), valid_region(hr, n, C, hs))) << what << ": h";
      EXPECT_TRUE(same_bits(get_gpu(x_rows), xr)) << what << ": x, row by row";
      EXPECT_TRUE(same_bits(valid_region(get_gpu(h_rows), n, C, hs), valid_region(hr, n, C, hs)))
          << what << ": h, row by row";
      EXPECT_LE(rel_err(valid_region(xf, n, C, xs), valid_region(get(*cpu_, x_cpu), n, C, xs)), 1e-7) << what;
      EXPECT_LE(rel_err(valid_region(hf, n, C, hs), valid_region(get(*cpu_, h_cpu), n, C, hs)), 1e-5) << what;
    }
  }
}

// A norm of at most 32 rows also quantizes its output for the int8 matvecs, and a matmul of exactly
// those rows reads that copy instead of quantizing them again: the products are the bits of a
// matmul of the same values that no norm quantized (a copy), for the plain, gated and residual norms
// and every matvec width, fused SwiGLU included. An op that rewrites the rows makes the matmul read
// the new values; rows rewritten behind the backend's back (by another backend, which the contract
// forbids) show that the quantized copy is what the matmul read.
TEST_P(CudaMatmulTest, MatmulOfNormOutputReadsTheNormsQuantizedCopy) {
  const int64_t K = 2048, N = 200, group_gated = 128;
  auto made = create_backend(BackendKind::Cuda, options_);
  ASSERT_TRUE(made.is_ok()) << made.message();
  const std::unique_ptr<Backend> other = std::move(made).value();
  for (GgmlType type : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
    const auto gb = random_weight_bytes(type, K, N, rng_), ub = random_weight_bytes(type, K, N, rng_);
    const GgufTensorInfo gi = tensor_info("gate", type, gb, K, N), ui = tensor_info("up", type, ub, K, N);
    auto gg = gpu_->load_weight(gi), ug = gpu_->load_weight(ui);
    ASSERT_TRUE(gg.is_ok() && ug.is_ok());
    const Tensor wn = put(*gpu_, randn(K)), wg = put(*gpu_, randn(group_gated));
    for (int64_t n : {1, 2, 3, 8, 17, 24, 32}) {
      const Tensor x = put(*gpu_, randn(n * K, 3.0f)), z = put(*gpu_, randn(n * K)), d = put(*gpu_, randn(n * K));
      for (int kind = 0; kind < 3; ++kind) {
        const std::string what = fmt::format("{} n={} {}", ggml_type_name(type), n,
                                             kind == 0 ? "rms_norm" : kind == 1 ? "gated_rms_norm" : "add_rms_norm");
        // Every buffer is made first: an upload (as any op) between a norm and its matmul forgets the copy.
        const Tensor xr = put(*gpu_, get_gpu(x)), h = poison(*gpu_, n * K), h2 = poison(*gpu_, n * K);
        const Tensor y = poison(*gpu_, n * N), ys = poison(*gpu_, n * N), y2 = poison(*gpu_, n * N),
                     ys2 = poison(*gpu_, n * N), y3 = poison(*gpu_, n * N), y4 = poison(*gpu_, n * N),
                     y5 = poison(*gpu_, n * N);
        const std::vector<float> x_host = get_gpu(x), other_rows = randn(n * K);
        auto norm = [&] {
          if (kind == 0) gpu_->rms_norm(xr.rows(n, K), wn.f(), K, 1e-6f, h.rows(n, K));
          if (kind == 1) gpu_->gated_rms_norm(xr.rows(n, K), z.rows(n, K), wg.f(), group_gated, 1e-6f, h.rows(n, K));
          if (kind == 2) gpu_->add_rms_norm(xr.rows(n, K), d.rows(n, K), wn.f(), K, 1e-6f, h.rows(n, K));
        };
        norm();
        gpu_->matmul(*gg, h.rows(n, K), y.rows(n, N));
        const bool fused = gpu_->matmul_swiglu(*gg, *ug, h.rows(n, K), ys.rows(n, N));
        // The same values, not quantized by a norm.
        gpu_->copy_rows(h.rows(n, K), h2.rows(n, K));
        gpu_->matmul(*gg, h2.rows(n, K), y2.rows(n, N));
        if (fused) gpu_->matmul_swiglu(*gg, *ug, h2.rows(n, K), ys2.rows(n, N));
        const auto ref = get_gpu(y2);
        EXPECT_TRUE(same_bits(get_gpu(y), ref)) << what;
        if (fused) EXPECT_TRUE(same_bits(get_gpu(ys), get_gpu(ys2))) << what << " swiglu";

        // An op that rewrites the rows after the norm (here in place): the matmul sees the new rows.
        if (kind == 2) gpu_->upload(xr.f(), x_host.data(), n * K * sizeof(float));
        norm();
        gpu_->add(h.rows(n, K), d.rows(n, K), h.rows(n, K));
        gpu_->copy_rows(h.rows(n, K), h2.rows(n, K));
        gpu_->matmul(*gg, h.rows(n, K), y3.rows(n, N));
        gpu_->matmul(*gg, h2.rows(n, K), y4.rows(n, N));
        const auto after_add = get_gpu(y3);
        EXPECT_TRUE(same_bits(after_add, get_gpu(y4))) << what << " after an add";
        EXPECT_FALSE(same_bits(after_add, ref)) << what;

        // Rows rewritten where the backend cannot see it: with int8 matvecs the product is still that
        // of the norm's output.
        if (kind == 2) gpu_->upload(xr.f(), x_host.data(), n * K * sizeof(float));
        norm();
        ASSERT_TRUE(gpu_->synchronize().is_ok());
        other->upload(h.f(), other_rows.data(), other_rows.size() * sizeof(float));
        ASSERT_TRUE(other->synchronize().is_ok());
        gpu_->matmul(*gg, h.rows(n, K), y5.rows(n, N));
        const auto behind = get_gpu(y5);
        if (options_.int8_matvec) {
          EXPECT_TRUE(same_bits(behind, ref)) << what << ": the matmul read the norm's quantized copy";
        } else {
          EXPECT_FALSE(same_bits(behind, ref)) << what << ": without int8 matvecs nothing is quantized";
        }
      }
    }
  }
}

// A one-row matmul_many (or matmul) followed by the causal conv (kernel 4, no capture) of a column prefix of
// its first part's output runs the conv in the matvec's epilogue (cuda_backend.cpp, Int8ConvFold): the outputs, the
// conv's output and its advanced state are the bits of the two ops launched one by one, step after step,
// eagerly and in a captured graph; so are the rows of a 3-token step (no fold) against 3 one-token steps.
TEST_P(CudaMatmulTest, ConvFoldedIntoTheMatvecGivesTheOpsBits) {
  const int64_t K = 2048, C = 768, Z = 96;
  auto load = [&](GgmlType t, int64_t n_out) { return load_random_weight(*gpu_, t, K, n_out, rng_); };
  const Weight qkv = load(GgmlType::Q6_K, C + 32), z = load(GgmlType::Q4_K, Z);  // conv over C of the C + 32
  const Weight all = load(GgmlType::Q5_K, C + 32 + Z);                            // or one weight: a matmul
  for (const bool single : {false, true}) {
    const Tensor cw = put(*gpu_, randn(C * 4)), x = put(*gpu_, randn(3 * K));
    const std::vector<float> state0 = randn(3 * C);
    struct Run {
      Tensor y, conv, state;
    };
    auto fresh = [&] { return Run{poison(*gpu_, 3 * (C + 32 + Z)), poison(*gpu_, 3 * C), put(*gpu_, state0)}; };
    const int64_t W = C + 32 + Z;
    // Step t of one token (settle: synchronize between the ops, so nothing folds).
    auto step = [&](Run& r, int64_t t, bool settle) {
      const Rows xr = x.rows(3, K).rows(t, 1), yr = r.y.rows(3, W).rows(t, 1);
      const Backend::MatmulPart parts[] = {{&qkv, yr.cols(0, C + 32)}, {&z, yr.cols(C + 32, Z)}};
      if (single) gpu_->matmul(all, xr, yr);
      else gpu_->matmul_many(xr, parts, 2);
      if (settle) ASSERT_TRUE(gpu_->synchronize().is_ok());
      gpu_->causal_conv_silu(yr.cols(0, C), cw.f(), 4, r.state.f(), nullptr, r.conv.rows(3, C).rows(t, 1));
    };
    Run ref = fresh(), eager = fresh(), graph = fresh(), wide = fresh();
    for (int64_t t = 0; t < 3; ++t) step(ref, t, true), step(eager, t, false);
    for (int64_t t = 0; t < 3; ++t) {
      auto g = gpu_->capture([&] { step(graph, t, false); });
      ASSERT_TRUE(g.is_ok()) << g.message();
      ASSERT_TRUE(g.value()->replay().is_ok());
    }
    // The 3 tokens in one step (the conv kernel, no fold).
    const Rows wy = wide.y.rows(3, W);
    const Backend::MatmulPart parts[] = {{&qkv, wy.cols(0, C + 32)}, {&z, wy.cols(C + 32, Z)}};
    if (single) gpu_->matmul(all, x.rows(3, K), wide.y.rows(3, W));
    else gpu_->matmul_many(x.rows(3, K), parts, 2);
    gpu_->causal_conv_silu(wide.y.rows(3, W).cols(0, C), cw.f(), 4, wide.state.f(), nullptr, wide.conv.rows(3, C));
    for (const Run* r : {&eager, &graph, &wide}) {
      const std::string what = std::string(single ? "matmul, " : "matmul_many, ") +
                               (r == &eager ? "eager" : r == &graph ? "graph" : "3-token step");
      EXPECT_TRUE(same_bits(get_gpu(r->y), get_gpu(ref.y))) << what << ": matvec outputs";
      EXPECT_TRUE(same_bits(get_gpu(r->conv), get_gpu(ref.conv))) << what << ": conv outputs";
      EXPECT_TRUE(same_bits(get_gpu(r->state), get_gpu(ref.state))) << what << ": conv state";
    }
  }
}

// A verify step's GDN in-projection: a matmul_many of n normed rows (2: the dp4a kernels; 5, 16, 17: the
// tensor-core kernels at one, two and three n-tiles) followed by the causal conv (kernel 4) of its first part's
// columns, with each token's window captured or not, runs the conv in the tiles' epilogue (Int8ConvFold): the
// matvec's outputs, the conv's outputs, its state and its captures are the bits of the two ops launched apart
// (a synchronize between them), eagerly and in a captured graph, two steps in a row (the state carried).
TEST_P(CudaMatmulTest, ConvFoldedIntoSeveralRowsGivesTheOpsBits) {
  const int64_t K = 2048, C = 768, Z = 96, W = C + 32 + Z;
  const Weight qkv = load_random_weight(*gpu_, GgmlType::Q6_K, K, C + 32, rng_);  // conv over C of the C + 32
  const Weight z = load_random_weight(*gpu_, GgmlType::Q4_K, K, Z, rng_);
  const Tensor cw = put(*gpu_, randn(C * 4)), norm_w = put(*gpu_, randn(K));
  for (const int64_t n : {2, 5, 16, 17})
    for (const bool capture : {true, false}) {
      const std::string what = fmt::format("{} rows{}", n, capture ? ", captured" : "");
      const Tensor x = put(*gpu_, randn(2 * n * K));
      const std::vector<float> state0 = randn(3 * C);
      struct Run {
        Tensor xn, y, conv, state, cap;
      };
      auto fresh = [&] {
        return Run{poison(*gpu_, n * K), poison(*gpu_, n * W), poison(*gpu_, 2 * n * C), put(*gpu_, state0),
                   poison(*gpu_, 2 * n * 3 * C)};
      };
      // Step s: norm rows [s n, s n + n) of x, the projections, the conv.
      auto step = [&](Run& r, int64_t s, bool settle) {
        gpu_->rms_norm(x.rows(2 * n, K).rows(s * n, n), norm_w.f(), K, 1e-6f, r.xn.rows(n, K));
        const Rows y = r.y.rows(n, W);
        const Backend::MatmulPart parts[] = {{&qkv, y.cols(0, C + 32)}, {&z, y.cols(C + 32, Z)}};
        gpu_->matmul_many(r.xn.rows(n, K), parts, 2);
        if (settle) ASSERT_TRUE(gpu_->synchronize().is_ok());
        gpu_->causal_conv_silu(y.cols(0, C), cw.f(), 4, r.state.f(), capture ? r.cap.f() + s * n * 3 * C : nullptr,
                               r.conv.rows(2 * n, C).rows(s * n, n));
      };
      Run ref = fresh(), eager = fresh(), graph = fresh();
      for (int64_t s = 0; s < 2; ++s) {
        ASSERT_NO_FATAL_FAILURE(step(ref, s, true)) << what;
        step(eager, s, false);
        auto g = gpu_->capture([&] { step(graph, s, false); });
        ASSERT_TRUE(g.is_ok()) << g.message();
        ASSERT_TRUE(g.value()->replay().is_ok());
      }
      for (const Run* r : {&eager, &graph}) {
        const std::string how = what + (r == &eager ? ", eager" : ", graph");
        EXPECT_TRUE(same_bits(get_gpu(r->y), get_gpu(ref.y))) << how << ": matvec outputs";
        EXPECT_TRUE(same_bits(get_gpu(r->conv), get_gpu(ref.conv))) << how << ": conv outputs";
        EXPECT_TRUE(same_bits(get_gpu(r->state), get_gpu(ref.state))) << how << ": conv state";
        if (capture) EXPECT_TRUE(same_bits(get_gpu(r->cap), get_gpu(ref.cap))) << how << ": captured windows";
      }
    }
}

// A one-row gated_rms_norm (groups of 128) or sigmoid_mul followed by a one-row matmul of its output runs the
// op in the matvec's staging of x (cuda_backend.cpp, Int8XFold): the matmul's outputs and the op's own output
// are the bits of the two ops launched one by one, eagerly and in a captured graph, whether the op before
// them wrote the gate (which the matvec then reads after the wait) or another buffer; so are the rows of a
// 3-token step (no fold; its sigmoid gate runs with the matmul's quantize in one launch,
// sigmoid_gate_quantize_launch). K = 1024 leaves warps without a block of x; 6144 gives each warp three.
TEST_P(CudaMatmulTest, GateOpsFoldedIntoTheMatvecGiveTheOpsBits) {
  const int64_t N = 80, D = 256;
  const Weight before = load_random_weight(*gpu_, GgmlType::Q4_K, 256, 64, rng_);
  const Tensor before_x = put(*gpu_, randn(256)), before_y = poison(*gpu_, 64), norm_w = put(*gpu_, randn(128));
  for (const int64_t K : {1024, 4096, 6144})
    for (const GgmlType type : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
      const Weight w = load_random_weight(*gpu_, type, K, N, rng_);
      for (const bool norm : {true, false})
        for (const bool gate_written : {false, true}) {
          const std::string what = fmt::format("K {} {} {}{}", K, ggml_type_name(type),
                                               norm ? "gated norm" : "sigmoid gate",
                                               gate_written ? ", gate written just before" : "");
          // 3 rows of x, and of the gates: the norm's [3, K]; the attention's [3, 2K], per head of D a query
          // half (unused here) and a gate half.
          const Tensor x = put(*gpu_, randn(3 * K)), zero = put(*gpu_, std::vector<float>(3 * 2 * K, 0.0f));
          const std::vector<float> gate0 = randn(3 * 2 * K);
          struct Run {
            Tensor gate, y, out;
          };
          auto fresh = [&] { return Run{put(*gpu_, gate0), poison(*gpu_, 3 * K), poison(*gpu_, 3 * N)}; };
          // The op over rows [t, t + n) (the gate rewritten with its own values first, or a matmul elsewhere).
          auto ops = [&](Run& r, int64_t t, int64_t n, bool settle) {
            if (gate_written) gpu_->add(r.gate.rows(3, 2 * K).rows(t, n), zero.rows(3, 2 * K).rows(t, n),
                                        r.gate.rows(3, 2 * K).rows(t, n));
            else gpu_->matmul(before, before_x.rows(1, 256), before_y.rows(1, 64));
            if (settle) ASSERT_TRUE(gpu_->synchronize().is_ok());
            const Rows xr = x.rows(3, K).rows(t, n), yr = r.y.rows(3, K).rows(t, n);
            if (norm) {
              gpu_->gated_rms_norm(xr, r.gate.rows(3, 2 * K).rows(t, n).cols(0, K), norm_w.f(), 128, 1e-6f, yr);
            } else {
              const Rows gates(r.gate.f() + t * 2 * K + D, n * K / D, D, 2 * D);
              gpu_->sigmoid_mul(Rows(xr.data, n * K / D, D), gates, Rows(yr.data, n * K / D, D));
            }
            if (settle) ASSERT_TRUE(gpu_->synchronize().is_ok());
            gpu_->matmul(w, yr, r.out.rows(3, N).rows(t, n));
          };
          Run ref = fresh(), eager = fresh(), graph = fresh(), wide = fresh();
          ASSERT_NO_FATAL_FAILURE(run_each_way(ops, ref, eager, graph, wide)) << what;
          for (const Run* r : {&eager, &graph, &wide}) {
            const std::string how = what + (r == &eager ? ", eager" : r == &graph ? ", graph" : ", 3-token step");
            EXPECT_TRUE(same_bits(get_gpu(r->out), get_gpu(ref.out))) << how << ": matvec outputs";
            EXPECT_TRUE(same_bits(get_gpu(r->y), get_gpu(ref.y))) << how << ": the op's outputs";
            EXPECT_TRUE(same_bits(get_gpu(r->gate), get_gpu(ref.gate))) << how << ": gates";
          }
        }
    }
}

// A one-row add_rms_norm of a one-row int8 matvec's output, followed by the fused SwiGLU of its h, a matvec
// of h or several in one launch (matmul_many), the last two with or without the conv that folds into them,
// is split into the matvecs around it (cuda_backend.cpp, DeferredNorm): the matvec adds to the residual as it
// stores its outputs and the next launch's blocks norm the row as they stage it. The residual, h, the
// matvec's and the next ops' outputs are the bits of the ops launched one by one (a synchronize after the
// matvec keeps the norm apart), eagerly, in a captured graph and in a 3-token step. Rows of 4096 and 6144
// (the fold: two and three float4s of the norm kernel's 512 threads), 5120 and 2048 (five and two of its 256
// threads; 5120 leaves half the warps two 256-blocks, the others three) and 2560 (no fold: the norm's loop form).
TEST_P(CudaMatmulTest, AddNormSplitIntoTheMatvecsAroundItGivesTheNormsBits) {
  const int64_t F = 512, F2 = 272;
  const Tensor zw = put(*gpu_, randn(128)), conv_w = put(*gpu_, randn(4 * F));
  for (const int64_t N : {4096, 6144, 5120, 2048, 2560}) {
    const Tensor norm_w = put(*gpu_, randn(N));
    const Weight gate = load_random_weight(*gpu_, GgmlType::Q4_K, N, F, rng_);
    const Weight up = load_random_weight(*gpu_, GgmlType::Q4_K, N, F, rng_);
    const Weight other = load_random_weight(*gpu_, GgmlType::Q6_K, N, F2, rng_);
    for (const GgmlType type : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K})
      for (const int how_x : {0, 1, 2})
        for (const int next : {0, 1, 2, 3, 4}) {
          // The matvec's x: through a gated norm (groups of 128) folded into it, a norm's quantized rows, or
          // 8448 inputs staged in rounds. The op of h: the SwiGLU, a Q6_K matmul, matmul_many + conv, a Q4_K
          // matmul + conv, matmul_many.
          const int64_t K = how_x == 2 ? 8448 : 4096;
          const Weight w = load_random_weight(*gpu_, type, K, N, rng_);
          static const char* const kNext[] = {"swiglu", "Q6_K matmul", "matmul_many + conv", "Q4_K matmul + conv",
                                              "matmul_many"};
          const std::string what = fmt::format("N {} {} {} {}", N, ggml_type_name(type),
                                               how_x == 0 ? "gated-norm fold" : how_x == 1 ? "normed x" : "rounds",
                                               kNext[next]);
          const Tensor x = put(*gpu_, randn(3 * K)), z = put(*gpu_, randn(3 * K));
          const std::vector<float> res0 = randn(3 * N), state0 = randn(3 * F);
          struct Run {
            Tensor xn, delta, res, h, out, out2, state, conv;
          };
          auto fresh = [&] {
            return Run{poison(*gpu_, 3 * K), poison(*gpu_, 3 * N), put(*gpu_, res0),     poison(*gpu_, 3 * N),
                       poison(*gpu_, 3 * F), poison(*gpu_, 3 * F2), put(*gpu_, state0), poison(*gpu_, 3 * F)};
          };
          // Rows [t, t + n): x's op, the matmul, the residual add + norm of its output, the op(s) of h.
          auto ops = [&](Run& r, int64_t t, int64_t n, bool settle) {
            Rows xin = x.rows(3, K).rows(t, n), xn = r.xn.rows(3, K).rows(t, n);
            if (how_x == 0) gpu_->gated_rms_norm(xin, z.rows(3, K).rows(t, n), zw.f(), 128, 1e-6f, xn);
            if (how_x == 1) gpu_->rms_norm(xin, zw.f(), 128, 1e-6f, xn);
            gpu_->matmul(w, how_x == 2 ? xin : xn, r.delta.rows(3, N).rows(t, n));
            if (settle) ASSERT_TRUE(gpu_->synchronize().is_ok());
            const Rows h = r.h.rows(3, N).rows(t, n), out = r.out.rows(3, F).rows(t, n);
            gpu_->add_rms_norm(r.res.rows(3, N).rows(t, n), r.delta.rows(3, N).rows(t, n), norm_w.f(), N, 1e-6f, h);
            if (next == 0) {
              ASSERT_TRUE(gpu_->matmul_swiglu(gate, up, h, out));
            } else if (next == 1) {
              gpu_->matmul(other, h, r.out2.rows(3, F2).rows(t, n));
            } else {
              const Backend::MatmulPart mp[] = {{&gate, out}, {&other, r.out2.rows(3, F2).rows(t, n)}};
              if (next == 3) {
                gpu_->matmul(gate, h, out);
              } else {
                gpu_->matmul_many(h, mp, 2);
              }
              if (next != 4)
                gpu_->causal_conv_silu(out, conv_w.f(), 4, r.state.f(), nullptr, r.conv.rows(3, F).rows(t, n));
            }
          };
          Run ref = fresh(), eager = fresh(), graph = fresh(), wide = fresh();
          ASSERT_NO_FATAL_FAILURE(run_each_way(ops, ref, eager, graph, wide)) << what;
          ASSERT_TRUE(gpu_->synchronize().is_ok()) << what;
          for (const Run* r : {&eager, &graph, &wide}) {
            const std::string how = what + (r == &eager ? ", eager" : r == &graph ? ", graph" : ", 3-token step");
            EXPECT_TRUE(same_bits(get_gpu(r->delta), get_gpu(ref.delta))) << how << ": matvec outputs";
            EXPECT_TRUE(same_bits(get_gpu(r->res), get_gpu(ref.res))) << how << ": residual";
            EXPECT_TRUE(same_bits(get_gpu(r->h), get_gpu(ref.h))) << how << ": normed rows";
            if (next != 1) EXPECT_TRUE(same_bits(get_gpu(r->out), get_gpu(ref.out))) << how << ": the op of h";
            if (next == 1 || next == 2 || next == 4)
              EXPECT_TRUE(same_bits(get_gpu(r->out2), get_gpu(ref.out2))) << how << ": the Q6_K part";
            if (next == 2 || next == 3) {
              EXPECT_TRUE(same_bits(get_gpu(r->state), get_gpu(ref.state))) << how << ": conv state";
              EXPECT_TRUE(same_bits(get_gpu(r->conv), get_gpu(ref.conv))) << how << ": conv output";
            }
          }
        }
  }
}

// One- and two-row matvecs whose 16-row tiles fill two blocks an SM in rounds badly (5120 outputs: 320 tiles)
// run three blocks an SM where they fit (matvec_int8.cu, launch): the same bits as two (HYSPEC_MATVEC_WAVES=0),
// for x staged in rounds (K = 17408: the 27B's down projection), copied from a norm's rows or quantized in-block;
// and with three forced wherever they fit (=2) on 8448 outputs too (528 tiles, which keep two by default).
TEST_P(CudaMatmulTest, ThreeBlocksAnSmKeepTheBits) {
  if (!GetParam()) GTEST_SKIP() << "the int8 matvec's kernels";
  for (const int64_t N : {5120, 8448})
    for (const int64_t K : {17408, 4096, 1024})
      for (const GgmlType type : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
        const Weight w = load_random_weight(*gpu_, type, K, N, rng_);
        const Tensor x = put(*gpu_, randn(2 * K)), wn = put(*gpu_, randn(K)), h = poison(*gpu_, 2 * K);
        for (const int64_t n : {1, 2})
          for (const bool normed : {false, true}) {
            auto run = [&](const char* waves) {
              const ScopedEnv env("HYSPEC_MATVEC_WAVES", waves);
              const Tensor y = poison(*gpu_, n * N);
              if (normed) gpu_->rms_norm(x.rows(2, K).rows(0, n), wn.f(), K, 1e-6f, h.rows(n, K));
              gpu_->matmul(w, (normed ? h : x).rows(2, K).rows(0, n), y.rows(n, N));
              return get_gpu(y);
            };
            const auto two = run("0"), three = run("1"), forced = run("2");
            const std::string what = fmt::format("{} {} x {}, {} rows{}", ggml_type_name(type), K, N, n,
                                                 normed ? ", a norm's x" : "");
            EXPECT_TRUE(same_bits(two, three)) << what;
            EXPECT_TRUE(same_bits(two, forced)) << what << ", three forced";
          }
      }
}

// A one-row int8 matmul may be launched as late as the backend's next call (the conv fold defers it): a
// weight or an output buffer freed before then gets the launch first (run under compute-sanitizer
// memcheck on the device: no access to freed memory).
TEST_F(CudaBackendTest, DeferredMatmulRunsBeforeItsMemoryIsFreed) {
  const int64_t K = 1024, N = 64;
  const auto bytes = random_weight_bytes(GgmlType::Q4_K, K, N, rng_);
  const GgufTensorInfo info = tensor_info("w", GgmlType::Q4_K, bytes, K, N);
  const Tensor x = put(*gpu_, randn(K)), ref = poison(*gpu_, N), got = poison(*gpu_, N);
  {
    auto w = gpu_->load_weight(info);
    ASSERT_TRUE(w.is_ok()) << w.message();
    gpu_->matmul(*w, x.rows(1, K), ref.rows(1, N));
    ASSERT_TRUE(gpu_->synchronize().is_ok());
  }
  {
    auto w = gpu_->load_weight(info);
    ASSERT_TRUE(w.is_ok()) << w.message();
    gpu_->matmul(*w, x.rows(1, K), got.rows(1, N));
  }  // the weight is freed here
  {
    auto w = gpu_->load_weight(info);
    ASSERT_TRUE(w.is_ok()) << w.message();
    const Tensor gone = poison(*gpu_, N);
    gpu_->matmul(*w, x.rows(1, K), gone.rows(1, N));
  }  // the output, then the weight
  EXPECT_TRUE(same_bits(get_gpu(got), get_gpu(ref)));
}

TEST_F(CudaBackendTest, ElementwiseOpsMatchCpu) {
  const int64_t n = 7, C = 300, S = 310;
  const auto av = randn(n * S), bv = randn(n * S), yv = randn(n * C);
  for (int op = 0; op < 5; ++op) {
    Pair a = both(av), b = both(bv), y = op == 3 ? both(yv) : both_poison(n * C);
    for (Backend* be : {cpu_.get(), gpu_.get()}) {
      const bool g = be == gpu_.get();
      Rows A = (g ? a.g : a.c).rows(n, C, S), B = (g ? b.g : b.c).rows(n, C, S), Y = (g ? y.g : y.c).rows(n, C);
      switch (op) {
        case 0: be->add(A, B, Y); break;
        case 1: be->swiglu(A, B, Y); break;
        case 2: be->sigmoid_mul(A, B, Y); break;
        case 3: be->add_sigmoid_scaled(A, (g ? b.g : b.c).rows(n, 1, S), Y); break;
        case 4: be->copy_rows(A, Y); break;
      }
    }
    expect_close(y, 1e-6, "op " + std::to_string(op));
  }
  // In place (y aliases a).
  Pair a = both(av), b = both(bv);
  cpu_->add(a.c.rows(n, C, S), b.c.rows(n, C, S), a.c.rows(n, C, S));
  gpu_->add(a.g.rows(n, C, S), b.g.rows(n, C, S), a.g.rows(n, C, S));
  expect_close(a, 1e-6, "add in place");
}

TEST_F(CudaBackendTest, RopeNeoxMatchesCpu) {
  const int64_t n = 9, heads = 3;
  std::vector<int32_t> pos(n);
  for (auto& p : pos) p = uniform(0, 5000);
  for (int n_rot : {16, 64}) {
    const int head_dim = 64;
    Pair x = both(randn(n * heads * head_dim));
    Buffer pc = put_i32(*cpu_, pos), pg = put_i32(*gpu_, pos);
    cpu_->rope_neox(x.c.rows(n, heads * head_dim), head_dim, n_rot, pc.as<int32_t>(), 1e7f);
    gpu_->rope_neox(x.g.rows(n, heads * head_dim), head_dim, n_rot, pg.as<int32_t>(), 1e7f);
    expect_close(x, 1e-5, "n_rot " + std::to_string(n_rot));
  }
}

// kv_store writes the bytes of backend.h's layout (tests/common/kv_cache_bytes.h, the CPU's too) for every
// cache type, Q8_0's blocks and padding included, and skips positions outside the cache.
TEST_F(CudaBackendTest, KvStoreWritesTheCacheLayoutOfEveryType) {
  const int64_t D = 64, W = 3 * D, cap = 9, n = 5;
  const std::vector<int32_t> pos = {7, -1, 0, 9, 3};  // rows 1 and 3 fall outside
  const auto kv = randn(n * W, 3.0f), vv = randn(n * W);
  for (const GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0}) {
    const test::KvCacheBytes want = test::encode_kv_cache(type, kv, vv, W, D);
    const size_t row = KvLayer{nullptr, nullptr, type, cap, W, D}.row_bytes();
    std::vector<uint8_t> init(cap * row, 0xab);
    Buffer kc = gpu_->alloc(init.size()).value(), vc = gpu_->alloc(init.size()).value();
    gpu_->upload(kc.data(), init.data(), init.size());
    gpu_->upload(vc.data(), init.data(), init.size());
    Tensor k = put(*gpu_, kv), v = put(*gpu_, vv);
    Buffer p = put_i32(*gpu_, pos);
    gpu_->kv_store(k.rows(n, W), v.rows(n, W), KvLayer{kc.data(), vc.data(), type, cap, W, D}, p.as<int32_t>());
    std::vector<uint8_t> gk(init.size()), gv(init.size());
    gpu_->download(gk.data(), kc.data(), gk.size());
    gpu_->download(gv.data(), vc.data(), gv.size());
    ASSERT_TRUE(gpu_->synchronize().is_ok()) << ggml_type_name(type);
    std::vector<uint8_t> wk = init, wv = init;
    for (int64_t t = 0; t < n; ++t) {
      if (pos[t] < 0 || pos[t] >= cap) continue;
      std::memcpy(&wk[pos[t] * row], &want.k[t * row], row);
      std::memcpy(&wv[pos[t] * row], &want.v[t * row], row);
    }
    EXPECT_EQ(gk, wk) << ggml_type_name(type);
    EXPECT_EQ(gv, wv) << ggml_type_name(type);
  }
}

// qk_norm_rope_store on CUDA is one kernel; its q, k and cache rows are the bits of the five ops it
// stands for (Backend's default), for warp norms of both forms (head_dim 256: float4s; 64: scalars),
// gated and plain query rows, keys only, F16, BF16, F32 and Q8_0 caches and positions outside the cache
// (skipped); and within the norm tolerance of the CPU.
TEST_F(CudaBackendTest, QkNormRopeStoreIsBitIdenticalToTheOpsItReplaces) {
  const int H = 4, Hkv = 2;
  const int64_t cap = 40;
  for (const int D : {64, 128, 256}) {
    for (const int64_t n : {1, 17}) {
      for (const int q_mode : {0, 1, 2}) {  // gated query rows, plain (in place), keys only
        for (const GgmlType kv_type : {GgmlType::F16, GgmlType::BF16, GgmlType::F32, GgmlType::Q8_0}) {
          const int64_t q_pitch = q_mode == 0 ? 2 * D : D, W = int64_t{Hkv} * D;
          const std::string what = "head_dim " + std::to_string(D) + ", n " + std::to_string(n) + ", q mode " +
                                   std::to_string(q_mode) + ", " + std::string(ggml_type_name(kv_type));
          std::vector<int32_t> pos(n);
          for (int64_t t = 0; t < n; ++t) pos[t] = static_cast<int32_t>((t * 7 + 3) % cap);
          pos[0] = n > 1 ? -1 : 5;        // outside the cache: no store
          if (n > 2) pos[2] = int32_t(cap);  // likewise
          const auto qv = randn(n * H * q_pitch, 2.0f), kv = randn(n * W, 2.0f), vv = randn(n * W);
          const auto qw = randn(D), kw = randn(D);
          const size_t cache_bytes = static_cast<size_t>(cap) * KvLayer{nullptr, nullptr, kv_type, cap, W, D}.row_bytes();
          struct Run {
            Tensor q_in, q, k, v, qw, kw;
            Buffer pos, kc, vc;
          };
          auto run = [&](Backend& b, int how) {  // how: 0 the backend's op, 1 Backend's default
            Run r{put(b, qv), poison(b, n * H * D), put(b, kv), put(b, vv), put(b, qw), put(b, kw), put_i32(b, pos),
                  b.alloc(cache_bytes).value(), b.alloc(cache_bytes).value()};
            b.fill_zero(r.kc.data(), cache_bytes);
            b.fill_zero(r.vc.data(), cache_bytes);
            QkPrepArgs a;
            if (q_mode != 2) {
              a.q_in = r.q_in.rows(n, H * q_pitch);
              a.q_pitch = q_pitch;
              a.q = q_mode == 1 ? r.q_in.rows(n, H * D) : r.q.rows(n, H * D);
            }
            a.k = r.k.rows(n, W);
            a.v = r.v.rows(n, W);
            a.q_norm = r.qw.f();
            a.k_norm = r.kw.f();
            a.n_head = H;
            a.n_kv_head = Hkv;
            a.head_dim = D;
            a.n_rot = D / 4;
            a.eps = 1e-6f;
            a.freq_base = 1e7f;
            a.positions = r.pos.as<int32_t>();
            a.kv = KvLayer{r.kc.data(), r.vc.data(), kv_type, cap, W, D};
            if (how == 0) b.qk_norm_rope_store(a);
            else b.Backend::qk_norm_rope_store(a);
            return r;
          };
          auto bytes = [](Backend& b, const Buffer& buf) {
            std::vector<uint8_t> h(buf.size);
            b.download(h.data(), buf.data(), buf.size);
            return h;
          };
          const Run fused = run(*gpu_, 0), ops = run(*gpu_, 1), cpu = run(*cpu_, 0);
          const Tensor& qf = q_mode == 1 ? fused.q_in : fused.q;
          const Tensor& qo = q_mode == 1 ? ops.q_in : ops.q;
          const Tensor& qc = q_mode == 1 ? cpu.q_in : cpu.q;
          if (q_mode != 2) {
            EXPECT_TRUE(same_bits(get_gpu(qf), get_gpu(qo))) << what << ": q";
            EXPECT_LE(rel_err(valid_region(get_gpu(qf), n, H * D, H * D), valid_region(get(*cpu_, qc), n, H * D, H * D)),
                      1e-5)
                << what << ": q against the CPU";
          }
          EXPECT_TRUE(same_bits(get_gpu(fused.k), get_gpu(ops.k))) << what << ": k";
          EXPECT_LE(rel_err(get_gpu(fused.k), get(*cpu_, cpu.k)), 1e-5) << what << ": k against the CPU";
          EXPECT_EQ(bytes(*gpu_, fused.kc), bytes(*gpu_, ops.kc)) << what << ": K cache";
          EXPECT_EQ(bytes(*gpu_, fused.vc), bytes(*gpu_, ops.vc)) << what << ": V cache";
          EXPECT_TRUE(gpu_->synchronize().is_ok()) << what;
        }
      }
    }
  }
}

TEST_F(CudaBackendTest, ArgmaxFirstIndexOnTies) {
  const int64_t n = 6, C = 5000;
  auto xv = randn(n * C);
  xv[2 * C + 100] = 50.0f;
  xv[2 * C + 200] = 50.0f;
  Pair x = both(xv);
  std::vector<int32_t> init(n, -7);
  Buffer oc = put_i32(*cpu_, init), og = put_i32(*gpu_, init);
  cpu_->argmax(x.c.rows(n, C), oc.as<int32_t>());
  gpu_->argmax(x.g.rows(n, C), og.as<int32_t>());
  std::vector<int32_t> c(n), g(n);
  cpu_->download(c.data(), oc.data(), n * 4);
  gpu_->download(g.data(), og.data(), n * 4);
  EXPECT_EQ(c, g);
  EXPECT_EQ(g[2], 100);
}

// Rows of a Qwen3.5 vocabulary (the GPU's first pass splits them into many chunks), strided: the first
// index of the largest value, as the CPU gives, with ties across chunks, the winner in the last partial
// chunk or at 0, and a row of -inf only (0); NaN never wins.
TEST_F(CudaBackendTest, ArgmaxOfVocabularyRowsAcrossChunks) {
  const int64_t n = 5, C = 248320, S = C + 64;
  auto xv = randn(n * S);
  xv[0 * S + 4096 * 3 + 7] = 60.0f, xv[0 * S + 4096 * 50 + 1] = 60.0f;
  xv[1 * S + C - 1] = 70.0f;
  xv[2 * S] = 80.0f;
  for (int64_t c = 0; c < C; c += 997) xv[3 * S + c] = std::numeric_limits<float>::quiet_NaN();
  xv[3 * S + 1000] = 90.0f;
  std::fill(xv.begin() + 4 * S, xv.begin() + 4 * S + C, -std::numeric_limits<float>::infinity());
  Pair x = both(xv);
  std::vector<int32_t> init(n, -7);
  Buffer oc = put_i32(*cpu_, init), og = put_i32(*gpu_, init);
  cpu_->argmax(x.c.rows(n, C, S), oc.as<int32_t>());
  gpu_->argmax(x.g.rows(n, C, S), og.as<int32_t>());
  std::vector<int32_t> c(n), g(n);
  cpu_->download(c.data(), oc.data(), n * 4);
  gpu_->download(g.data(), og.data(), n * 4);
  ASSERT_TRUE(gpu_->synchronize().is_ok());
  EXPECT_EQ(g[0], 4096 * 3 + 7);
  EXPECT_EQ(g[1], C - 1);
  EXPECT_EQ(g[2], 0);
  EXPECT_EQ(g[3], 1000);
  EXPECT_EQ(g[4], 0);
  for (int r : {0, 1, 2, 4}) EXPECT_EQ(g[r], c[r]) << "row " << r;
}

// Look-ahead decoding's pieces, as a session chains them: feed_token makes a step's input from a token the
// last argmax left in a read-back (CUDA: mapped host memory) and advances a position counter; a read-back's
// finish() returns what the ops before its mark wrote, also when later ops (here the next argmax into the
// other read-back) were enqueued after the mark. Eagerly and in a recorded graph, on both backends.
TEST_F(CudaBackendTest, FeedTokenAndReadbacksChainStepsOnTheBackend) {
  for (Backend* be : {cpu_.get(), gpu_.get()}) {
    for (bool graph : {false, true}) {
      SCOPED_TRACE(be->name() + (graph ? ", graph" : ", eager"));
      const int64_t C = 248320;
      auto xv = randn(2 * C);
      xv[C - 3] = 40.0f;      // row 0's winner
      xv[C + 1234] = 40.0f;   // row 1's
      Tensor x = put(*be, xv);
      Buffer ints = put_i32(*be, {-7, -7, 41});  // [token, position, counter]
      int32_t* io = ints.as<int32_t>();
      auto r0 = be->new_readback(sizeof(int32_t)), r1 = be->new_readback(sizeof(int32_t));
      ASSERT_TRUE(r0.is_ok() && r1.is_ok());
      auto* t0 = static_cast<int32_t*>((*r0)->target());
      auto* t1 = static_cast<int32_t*>((*r1)->target());
      const int32_t seed = 99;
      (*r1)->put(&seed, sizeof(int32_t));
      // step 0: feed from r1, argmax of row 0 into r0; step 1: feed from r0, argmax of row 1 into r1
      auto step = [&](int row, int32_t* from, int32_t* into) {
        be->feed_token(from, io, io + 1, io + 2);
        be->argmax(x.rows(2, C).rows(row, 1), into);
      };
      std::unique_ptr<StepGraph> g0, g1;
      if (graph && be == gpu_.get()) {
        auto a = be->capture([&] { step(0, t1, t0); });
        auto b = be->capture([&] { step(1, t0, t1); });
        ASSERT_TRUE(a.is_ok() && b.is_ok());
        g0 = std::move(a).value(), g1 = std::move(b).value();
      }
      auto run = [&](std::unique_ptr<StepGraph>& g, int row, int32_t* from, int32_t* into) {
        if (g) {
          ASSERT_TRUE(g->replay().is_ok());
        } else {
          step(row, from, into);
        }
      };
      run(g0, 0, t1, t0);
      (*r0)->mark();
      std::vector<int32_t> host(3);
      be->download(host.data(), ints.data(), 3 * sizeof(int32_t));
      EXPECT_EQ(host, (std::vector<int32_t>{99, 42, 42}));  // fed from the seed, at the counter + 1
      run(g1, 1, t0, t1);
      (*r1)->mark();
      int32_t got0 = -1, got1 = -1;
      ASSERT_TRUE((*r0)->finish(&got0, sizeof(int32_t)).is_ok());
      ASSERT_TRUE((*r1)->finish(&got1, sizeof(int32_t)).is_ok());
      EXPECT_EQ(got0, C - 3);
      EXPECT_EQ(got1, 1234);
      be->download(host.data(), ints.data(), 3 * sizeof(int32_t));
      EXPECT_EQ(host, (std::vector<int32_t>{static_cast<int32_t>(C - 3), 43, 43}));  // fed from step 0's argmax
      EXPECT_FALSE((*r0)->finish(&got0, 2 * sizeof(int32_t)).is_ok());  // more than it holds
    }
  }
  EXPECT_TRUE(gpu_->asynchronous());
  EXPECT_FALSE(cpu_->asynchronous());
}

// copy_row_to_ring (look-ahead decoding's drafter rows): the row lands in the ring slot of the position the
// backend holds, eagerly and from a recorded graph that reads a position fed after its recording; nothing
// else of the ring changes.
TEST_F(CudaBackendTest, CopyRowToRingWritesTheSlotOfItsPosition) {
  const int64_t cols = 4100, ring_rows = 6;
  for (Backend* be : {cpu_.get(), gpu_.get()}) {
    SCOPED_TRACE(be->name());
    const auto row = randn(static_cast<size_t>(cols));
    Tensor src = put(*be, row), ring = put(*be, std::vector<float>(static_cast<size_t>(ring_rows * cols), 0.0f));
    Buffer position = put_i32(*be, {3});
    be->copy_row_to_ring(src.rows(1, cols), ring.f(), ring_rows, position.as<int32_t>());
    std::unique_ptr<StepGraph> graph;
    if (be == gpu_.get()) {
      auto g = be->capture([&] { be->copy_row_to_ring(src.rows(1, cols), ring.f(), ring_rows, position.as<int32_t>()); });
      ASSERT_TRUE(g.is_ok()) << g.message();
      graph = std::move(g).value();
    }
    const int32_t later = 13;  // slot 1
    be->upload(position.data(), &later, sizeof(later));
    if (graph) {
      ASSERT_TRUE(graph->replay().is_ok());
    } else {
      be->copy_row_to_ring(src.rows(1, cols), ring.f(), ring_rows, position.as<int32_t>());
    }
    const auto got = get(*be, ring);
    ASSERT_TRUE(be->synchronize().is_ok());
    for (int64_t r = 0; r < ring_rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        ASSERT_EQ(got[r * cols + c], r == 1 || r == 3 ? row[c] : 0.0f) << "ring row " << r << ", column " << c;
  }
}

// draw_token on CUDA (look-ahead sampling's draw): the token the host's chunk path draws from the same
// masses (logit_summary's on this backend, read back) for the same uniform, and the inverse CDF of the
// row's softmax; eagerly and from a recorded graph that reads each draw's temperature and uniform from a
// read-back (mapped host memory), over 248K-logit rows with NaN and -inf, a peaked row, a row whose last
// chunk is partial, a row of more chunks than the kernel stages in shared memory (a 4.3M vocabulary); kNoMass
// and the argmax for a row of -inf and one with +inf.
TEST_F(CudaBackendTest, DrawTokenDrawsAsTheHostsChunkPath) {
  using S = LogitSummary;
  std::vector<std::vector<float>> rows(4, randn(248320, 3.0f));
  for (size_t c = 0; c < rows[1].size(); c += 991) rows[1][c] = kNaN;
  rows[1][12] = -std::numeric_limits<float>::infinity();
  rows[2] = randn(5000);
  rows[2][4200] = 9.0f;  // much of the mass in the partial chunk
  rows[3] = randn(4300000, 3.0f);
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<double> uniforms = {0.0, 1e-12, 0.5, 0.999999, std::nextafter(1.0, 0.0)};
  for (int i = 0; i < 24; ++i) uniforms.push_back(unit(rng));
  auto slot = gpu_->new_readback(sizeof(TokenDraw));
  ASSERT_TRUE(slot.is_ok());
  auto* draw = static_cast<TokenDraw*>((*slot)->target());
  int checked = 0, same_as_cdf = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    const int64_t C = static_cast<int64_t>(rows[r].size());
    Tensor x = put(*gpu_, rows[r]), summary = poison(*gpu_, static_cast<size_t>(S::floats(C)));
    std::unique_ptr<StepGraph> graph;
    {
      auto g = gpu_->capture([&] { gpu_->draw_token(x.rows(1, C), draw); });
      ASSERT_TRUE(g.is_ok()) << g.message();
      graph = std::move(g).value();
    }
    for (const float t : {0.7f, 1.3f}) {
      gpu_->logit_summary(x.rows(1, C), 1.0f / t, summary.f());
      const auto sv = get_gpu(summary);
      const ChunkedRow row{sv[0], sv.data() + S::chunk_at(), S::chunks(C), C, chunk_total(sv.data() + S::chunk_at(), S::chunks(C)), t};
      ASSERT_TRUE(chunk_row_drawable(row));
      const float* l = rows[r].data();
      for (size_t i = 0; i < uniforms.size(); ++i) {
        const double u = uniforms[i];
        const int32_t host = draw_by_chunks(
            row, -1, [&] { return u; }, [&](int32_t id) { return l[id]; },
            [&](int64_t c) { return std::span<const float>(l + c * S::kChunk, std::min(S::kChunk, C - c * S::kChunk)); });
        const TokenDraw got = draw_through(**slot, TokenDraw{-1, -1, t, 0, u}, [&] {
          if (i % 2) {
            EXPECT_TRUE(graph->replay().is_ok());
          } else {
            gpu_->draw_token(x.rows(1, C), draw);
          }
        });
        ASSERT_EQ(got.status, TokenDraw::kDrawn);
        EXPECT_EQ(got.token, host) << "row " << r << ", T " << t << ", u " << u;
        const hyspec::test::CdfPick want = hyspec::test::inverse_cdf(l, C, t, u);
        if (want.margin < 1e-6) continue;  // within the f32 masses' rounding of an edge
        ++checked;
        same_as_cdf += got.token == want.token;
      }
    }
  }
  EXPECT_GE(checked, 120);
  EXPECT_EQ(same_as_cdf, checked);
  std::vector<float> none(248320, -std::numeric_limits<float>::infinity()), inf = rows[0];
  inf[70000] = std::numeric_limits<float>::infinity();
  for (auto* row : {&none, &inf}) {
    Tensor x = put(*gpu_, *row);
    const TokenDraw got =
        draw_through(**slot, TokenDraw{-1, -1, 1.0f, 0, 0.5}, [&] { gpu_->draw_token(x.rows(1, 248320), draw); });
    EXPECT_EQ(got.status, TokenDraw::kNoMass);
    EXPECT_EQ(got.token, row == &none ? 0 : 70000);
  }
}

// draw_top_k on CUDA (look-ahead sampling's draw under a top-k cut): the CPU's token (the sampler's own steps,
// backend/sampling_cut.h) for the same row and uniform, but where the double oracle puts the draw within
// rounding of an edge; eagerly and from a recorded graph that reads each draw's inputs from a read-back
// (mapped host memory), over 248K-logit rows with NaN and -inf, hundreds of ties at the k-th token's logit, a
// row of ties only (more candidates than the kernel holds: its slow path), a peaked row, a row whose last
// chunk is partial; kNoMass and the argmax for rows without a finite max.
TEST_F(CudaBackendTest, DrawTopKDrawsAsTheCpu) {
  std::vector<std::vector<float>> rows(5, randn(248320, 3.0f));
  for (size_t c = 0; c < rows[1].size(); c += 991) rows[1][c] = kNaN;
  rows[1][12] = -std::numeric_limits<float>::infinity();
  for (float& v : rows[2]) v = std::round(v / 1.5f) / 2.0f;  // logits on a 0.5 grid
  std::fill(rows[3].begin(), rows[3].end(), 0.0f);  // every token ties
  rows[3][200000] = 1.0f, rows[3][7] = -1.0f;
  rows[4] = randn(5000);
  rows[4][4200] = 9.0f;  // the best token in the partial chunk
  const SamplingCut cuts[] = {{1.0f, 1, 1.0f, 0.0f}, {0.8f, 40, 0.95f, 0.05f}, {1.3f, 256, 1.0f, 0.0f},
                              {1.0f, 50, 0.6f, 0.0f}};
  std::mt19937_64 rng(13);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<double> uniforms = {0.0, 0.5, std::nextafter(1.0, 0.0)};
  for (int i = 0; i < 9; ++i) uniforms.push_back(unit(rng));
  auto slot = gpu_->new_readback(sizeof(TokenDraw));
  ASSERT_TRUE(slot.is_ok());
  auto* draw = static_cast<TokenDraw*>((*slot)->target());
  int checked = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    const int64_t C = static_cast<int64_t>(rows[r].size());
    Tensor x = put(*gpu_, rows[r]);
    std::unique_ptr<StepGraph> graph;
    {
      auto g = gpu_->capture([&] { gpu_->draw_top_k(x.rows(1, C), draw); });
      ASSERT_TRUE(g.is_ok()) << g.message();
      graph = std::move(g).value();
    }
    int step = 0;
    for (const SamplingCut& cut : cuts) {
      for (const double u : uniforms) {
        if (r == 3 && cut.top_k > 40) continue;  // the slow path: one pass over the row a token
        TokenDraw want{-1, -1, cut.temperature, cut.top_k, u, cut.top_p, cut.min_p};
        cpu_->draw_top_k(Rows(rows[r].data(), 1, C), &want);
        ASSERT_EQ(want.status, TokenDraw::kDrawn);
        const TokenDraw got = draw_through(**slot, want, [&] {
          if (step++ % 2) {
            EXPECT_TRUE(graph->replay().is_ok());
          } else {
            gpu_->draw_top_k(x.rows(1, C), draw);
          }
        });
        ASSERT_EQ(got.status, TokenDraw::kDrawn);
        const hyspec::test::CdfPick pick = hyspec::test::cut_inverse_cdf(rows[r].data(), C, cut, u);
        if (pick.margin < 1e-6) continue;  // at a rounding edge (of glibc's expf or the device's)
        ++checked;
        EXPECT_EQ(got.token, want.token) << "row " << r << ", k " << cut.top_k << ", u " << u;
        EXPECT_EQ(got.token, pick.token) << "row " << r << ", k " << cut.top_k << ", u " << u;
      }
    }
  }
  EXPECT_GE(checked, 180);
  std::vector<float> none(248320, -std::numeric_limits<float>::infinity()), inf = rows[0], nan(248320, kNaN);
  inf[70000] = std::numeric_limits<float>::infinity();
  for (auto* row : {&none, &inf, &nan}) {
    Tensor x = put(*gpu_, *row);
    const TokenDraw got = draw_through(**slot, TokenDraw{-1, -1, 1.0f, 40, 0.5, 0.95f, 0.05f},
                                       [&] { gpu_->draw_top_k(x.rows(1, 248320), draw); });
    EXPECT_EQ(got.status, TokenDraw::kNoMass);
    EXPECT_EQ(got.token, row == &inf ? 70000 : 0);
  }
}

// The sampler's row summaries and candidate selection: the max and the bucket counts exact, the f32
// sums within rounding of the CPU's (another order), the selected set the same. Strided 248K rows with
// NaN, -inf, and a row of -inf only.
TEST_F(CudaBackendTest, LogitSummaryAndSelectMatchCpu) {
  using S = LogitSummary;
  const int64_t n = 4, C = 248320, stride = C + 64, F = S::floats(C);
  auto xv = randn(n * stride, 3.0f);
  for (int64_t c = 0; c < C; c += 991) xv[1 * stride + c] = kNaN;
  xv[1 * stride + 12] = -std::numeric_limits<float>::infinity();
  xv[2 * stride + C - 1] = 40.0f;
  std::fill(xv.begin() + 3 * stride, xv.begin() + 3 * stride + C, -std::numeric_limits<float>::infinity());
  Pair x = both(xv);
  for (const float inv_t : {1.0f, 1.0f / 0.6f}) {
    Pair o = both_poison(static_cast<size_t>(n * F));
    cpu_->logit_summary(x.c.rows(n, C, stride), inv_t, o.c.f());
    gpu_->logit_summary(x.g.rows(n, C, stride), inv_t, o.g.f());
    const auto c = get(*cpu_, o.c), g = get_gpu(o.g);
    for (int64_t r = 0; r < n; ++r) {
      const float* cr = c.data() + r * F;
      const float* gr = g.data() + r * F;
      ASSERT_EQ(gr[0], cr[0]) << "max, row " << r;
      for (int64_t i = 1; i < F; ++i) {
        const bool is_count = i >= S::count_at(C) && i < S::mass_at(C);
        // Chunk sums are a tree of f32 adds, bucket masses f32 atomics in any order (the CPU's sum in doubles).
        const float tol = i < S::count_at(C) ? 2e-5f : 1e-4f;
        if (is_count) ASSERT_EQ(gr[i], cr[i]) << "row " << r << " float " << i;
        else ASSERT_NEAR(gr[i], cr[i], tol * std::max(1.0f, std::fabs(cr[i]))) << "row " << r << " float " << i;
      }
    }
  }
  for (const float threshold : {12.0f, 30.0f}) {  // ~8 tokens of 248K random normals (sd 3), then the one at 40
    const int32_t cap = 64;
    auto select = [&](Backend& be, Tensor& x_) {
      Buffer out = be.alloc((cap + 1) * sizeof(SelectedLogit)).value();
      be.fill_zero(out.data(), out.size);
      be.select_logits(x_.rows(n, C, stride), 2, threshold, cap, out.as<int32_t>(),
                       out.as<SelectedLogit>() + 1);
      std::vector<SelectedLogit> got(cap + 1);
      be.download(got.data(), out.data(), got.size() * sizeof(SelectedLogit));
      const int32_t count = got[0].id;
      std::vector<std::pair<int32_t, float>> picked;
      for (int32_t i = 0; i < std::min(count, cap); ++i) picked.push_back({got[1 + i].id, got[1 + i].logit});
      std::sort(picked.begin(), picked.end());
      return std::make_pair(count, picked);
    };
    const auto c = select(*cpu_, x.c), g = select(*gpu_, x.g);
    ASSERT_EQ(g.first, c.first) << threshold;
    ASSERT_GT(c.first, 0);
    ASSERT_LE(c.first, cap) << "the test wants every selected token";
    EXPECT_EQ(g.second, c.second) << threshold;
  }
}

// copy_many: every part lands, the aligned ones in one launch per 64 (70 of them here: two launches),
// the others (odd offsets, sizes not a multiple of 16 bytes) by plain copies; nothing else is touched.
TEST_F(CudaBackendTest, CopyManyCopiesEveryPart) {
  const size_t n = 6 << 20;
  const auto src_host = randn(n);
  Tensor src = put(*gpu_, src_host), dst = poison(*gpu_, n);
  std::vector<Backend::CopyPart> parts;
  std::vector<float> want(n, kNaN);
  size_t at = 0;
  for (int i = 0; i < 140; ++i) {
    const bool aligned = i % 2 == 0;
    const size_t floats = i == 3 ? 0 : aligned ? size_t{256} << (i % 6) : 4099 + static_cast<size_t>(i);
    if (aligned) at = (at + 3) / 4 * 4;
    const size_t from = aligned ? (static_cast<size_t>(i) * 4100) % (n - floats) / 4 * 4 : (at * 7 + 1) % (n - floats - 1);
    parts.push_back({dst.f() + at, src.f() + from, floats * sizeof(float)});
    for (size_t k = 0; k < floats; ++k) want[at + k] = src_host[from + k];
    at += floats + 5;
    ASSERT_LT(at, n);
  }
  gpu_->copy_many(parts.data(), parts.size());
  const auto got = get_gpu(dst);
  for (size_t k = 0; k < n; ++k)
    if (std::isnan(want[k])) ASSERT_TRUE(std::isnan(got[k])) << k;
    else ASSERT_EQ(got[k], want[k]) << k;
}

TEST_F(CudaBackendTest, AttentionMatchesCpuForEveryWidthKvTypeAndMode) {
  const AttnCase cases[] = {{4, 2, 64, 37}, {8, 2, 256, 700}, {6, 2, 128, 1500}, {2, 2, 32, 0}};
  for (const AttnCase& ac : cases)
    for (GgmlType kv_type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0})
      for (int64_t n : kWidths)
        for (bool causal : {true, false}) attention_matches_cpu(ac, kv_type, n, causal);
}

// A cache of more splits than one wave of decode blocks holds (40000 keys: 79 splits of 512 on 132 SMs, where a wave
// is 33 blocks a kv head) at a depth past that wave (20000 keys: 40 splits): the splits run in two waves and the
// merge takes 40 partials.
TEST_F(CudaBackendTest, AttentionInALongCacheMatchesCpu) {
  for (GgmlType kv_type : {GgmlType::F16, GgmlType::Q8_0})
    for (int64_t n : {1, 17}) attention_matches_cpu(AttnCase{16, 4, 256, 20000, 40000}, kv_type, n, true);
}

// AttentionArgs::max_keys below the step's keys (a caller's bug): the decode kernels lay their splits over
// 600 keys, and the last split's blocks read the other ~19400, so the output is still the attention, and the
// merge's counters are left reset for the next step (a bounded and an unbounded one after it).
TEST_F(CudaBackendTest, AttentionWithAKeyBoundBelowItsKeysStillReadsThemAll) {
  for (GgmlType kv_type : {GgmlType::F32, GgmlType::F16, GgmlType::Q8_0})
    for (int64_t n : {1, 17})
      for (int64_t max_keys : {int64_t{600}, 20000 + n, int64_t{0}})
        attention_matches_cpu(AttnCase{16, 4, 256, 20000, 40000}, kv_type, n, true, max_keys);
}

// Prompt steps at the 9B's shape (16 heads, 4 kv heads of 256): many 64-query blocks (the tensor-core
// prompt kernel for 16-bit caches), a last partial one, causal and block mode, with and without earlier
// context (one split, then several).
TEST_F(CudaBackendTest, PromptAttentionAtModelShapesMatchesCpu) {
  for (int64_t ctx : {0, 3000})
    for (GgmlType kv_type : {GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0})
      for (bool causal : {true, false}) attention_matches_cpu(AttnCase{16, 4, 256, ctx}, kv_type, 333, causal);
}

// Speculative verify is lossless only if a verify row's attention is the decode step's, bit for bit:
// every width of the decode kernels (SIMT for F32, tensor cores for F16/BF16/Q8_0) against one-row calls.
TEST_F(CudaBackendTest, AttentionVerifyRowsEqualDecodeSteps) {
  // 9000 keys: 33 splits of 288 keys on 132 SMs, so a decode block's warps (8 on one query group, the output dims split
  // over warp pairs) walk their copy stages round more than once. On 132 SMs the rows of 2280 keys (splits of 96)
  // reach into 24 and 25 splits, those of 2550 in a 10000-key cache (splits of 320) into 8 and 9: a wider step's
  // blocks merge splits past its first rows' keys, which must add exact zeros to those rows (any grouping of the
  // split merge must keep that; session 49 measured one in two levels). 20000 keys of 40000 (79 splits of 512): the
  // rows reach 40 splits, more than one wave of blocks.
  const AttnCase cases[] = {{16, 4, 256, 300},       {16, 4, 256, 9000}, {4, 2, 64, 1100},
                            {16, 4, 256, 2280},      {16, 4, 256, 2550, 10000}, {16, 4, 256, 20000, 40000}};
  for (const AttnCase& ac : cases) {
    for (GgmlType kv_type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0}) {
      const int64_t D = ac.head_dim, W = ac.n_kv * D, n_max = 32, QW = ac.n_head * D;
      const int64_t total = std::max(ac.ctx + n_max, ac.capacity);
      const size_t row = KvLayer{nullptr, nullptr, kv_type, total, W, D}.row_bytes();
      std::vector<int32_t> pos(total);
      for (int64_t i = 0; i < total; ++i) pos[i] = static_cast<int32_t>(i);
      Tensor k = put(*gpu_, randn(total * W)), v = put(*gpu_, randn(total * W)), q = put(*gpu_, randn(n_max * QW));
      Tensor one = poison(*gpu_, n_max * QW), many = poison(*gpu_, n_max * QW);
      Buffer kc = gpu_->alloc(total * row).value(), vc = gpu_->alloc(total * row).value();
      Buffer p = put_i32(*gpu_, pos);
      const KvLayer kv{kc.data(), vc.data(), kv_type, total, W, D};
      gpu_->kv_store(k.rows(total, W), v.rows(total, W), kv, p.as<int32_t>());
      // Steps of one key bound (AttentionArgs::max_keys: 0, the capacity, or the last row's keys, where the
      // splits are laid over fewer keys than the capacity), as a session's steps pass them.
      for (int64_t bound : {int64_t{0}, ac.ctx + n_max}) {
        auto run = [&](int64_t t0, int64_t n, Tensor& out) {
          AttentionArgs a;
          a.q = q.rows(n_max, QW).rows(t0, n);
          a.kv = kv;
          a.positions = p.as<int32_t>() + ac.ctx + t0;
          a.n_head = ac.n_head;
          a.n_kv_head = ac.n_kv;
          a.head_dim = ac.head_dim;
          a.scale = 1.0f / std::sqrt(static_cast<float>(D));
          a.out = out.rows(n_max, QW).rows(t0, n);
          a.max_keys = bound;
          gpu_->attention(a);
        };
        for (int64_t t = 0; t < n_max; ++t) run(t, 1, one);
        const auto want = get_gpu(one);
        for (int64_t n : {2, 5, 17, 32}) {
          run(0, n, many);
          const auto got = get_gpu(many);
          EXPECT_EQ(std::memcmp(got.data(), want.data(), static_cast<size_t>(n * QW) * sizeof(float)), 0)
              << fmt::format("D={} ctx={} kv={} n={} bound={}", D, ac.ctx, ggml_type_name(kv_type), n, bound);
        }
      }
      ASSERT_TRUE(gpu_->synchronize().is_ok());
    }
  }
}

// A decode or verify step's attention right after the store of its rows (launched with PDL, the kernels
// overlap): the rows just stored, poisoned before, are seen, and the output has the bits of the same step
// launched after another (positions at another address).
TEST_F(CudaBackendTest, AttentionAfterTheStoreOfItsRowsSeesThem) {
  const AttnCase cases[] = {{16, 4, 256, 3000}, {4, 2, 64, 3000}};
  for (const AttnCase& ac : cases) {
    for (GgmlType kv_type : {GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0}) {
      const int64_t D = ac.head_dim, W = ac.n_kv * D, QW = ac.n_head * D, total = ac.ctx + 32;
      const size_t row = KvLayer{nullptr, nullptr, kv_type, total, W, D}.row_bytes();
      std::vector<int32_t> pos(total);
      for (int64_t i = 0; i < total; ++i) pos[i] = static_cast<int32_t>(i);
      Tensor k = put(*gpu_, randn(total * W)), v = put(*gpu_, randn(total * W)), q = put(*gpu_, randn(17 * QW));
      Buffer kc = gpu_->alloc(total * row).value(), vc = gpu_->alloc(total * row).value();
      Buffer p = put_i32(*gpu_, pos);
      const KvLayer kv{kc.data(), vc.data(), kv_type, total, W, D};
      gpu_->kv_store(k.rows(total, W), v.rows(total, W), kv, p.as<int32_t>());
      for (int64_t n : {1, 2, 5, 17}) {
        const int64_t s = ac.ctx - 700 + 37 * n;  // the step's first position, inside a split
        std::vector<int32_t> step(pos.begin() + s, pos.begin() + s + n);
        Buffer ps = put_i32(*gpu_, step), ps_copy = put_i32(*gpu_, step);
        const std::vector<uint8_t> nan_rows(static_cast<size_t>(n) * row, 0xff);  // NaN in every cache type
        gpu_->upload(static_cast<uint8_t*>(kc.data()) + s * row, nan_rows.data(), nan_rows.size());
        gpu_->upload(static_cast<uint8_t*>(vc.data()) + s * row, nan_rows.data(), nan_rows.size());
        Tensor after_store = poison(*gpu_, n * QW), after_attend = poison(*gpu_, n * QW);
        auto attend = [&](const Buffer& positions, Tensor& out) {
          AttentionArgs a;
          a.q = q.rows(17, QW).rows(0, n);
          a.kv = kv;
          a.positions = positions.as<int32_t>();
          a.n_head = ac.n_head;
          a.n_kv_head = ac.n_kv;
          a.head_dim = ac.head_dim;
          a.scale = 1.0f / std::sqrt(static_cast<float>(D));
          a.out = out.rows(n, QW);
          gpu_->attention(a);
        };
        gpu_->kv_store(k.rows(total, W).rows(s, n), v.rows(total, W).rows(s, n), kv, ps.as<int32_t>());
        attend(ps, after_store);
        attend(ps_copy, after_attend);
        const auto got = get_gpu(after_store), want = get_gpu(after_attend);
        const std::string what = fmt::format("D={} kv={} n={}", D, ggml_type_name(kv_type), n);
        EXPECT_EQ(std::count_if(got.begin(), got.end(), [](float x) { return !std::isfinite(x); }), 0) << what;
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << what;
      }
      ASSERT_TRUE(gpu_->synchronize().is_ok());
    }
  }
}

// A non-finite query value reaches its own head's output as NaN (as f32 arithmetic would) and no other
// head's, for every decode-kernel cache (the Q8_0 one turns Q into int8 digits, where a NaN would
// otherwise become a meaningless finite code) and for a prompt step.
TEST_F(CudaBackendTest, AttentionPropagatesNonFiniteQueries) {
  const int64_t H = 16, Hkv = 4, D = 256, ctx = 700, W = Hkv * D, QW = H * D;
  for (GgmlType kv_type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0}) {
    for (int64_t n : {1, 17, 40}) {
      const int64_t total = ctx + n;
      const size_t row = KvLayer{nullptr, nullptr, kv_type, total, W, D}.row_bytes();
      std::vector<int32_t> pos(total);
      for (int64_t i = 0; i < total; ++i) pos[i] = static_cast<int32_t>(i);
      auto qv = randn(n * QW);
      qv[5 * D + 77] = kNaN;  // row 0, head 5 (kv head 1)
      if (n > 1) qv[QW + 9 * D + 3] = std::numeric_limits<float>::infinity();  // row 1, head 9
      Tensor k = put(*gpu_, randn(total * W)), v = put(*gpu_, randn(total * W)), q = put(*gpu_, qv);
      Tensor out = poison(*gpu_, n * QW);
      Buffer kc = gpu_->alloc(total * row).value(), vc = gpu_->alloc(total * row).value();
      Buffer p = put_i32(*gpu_, pos);
      const KvLayer kv{kc.data(), vc.data(), kv_type, total, W, D};
      gpu_->kv_store(k.rows(total, W), v.rows(total, W), kv, p.as<int32_t>());
      AttentionArgs a;
      a.q = q.rows(n, QW);
      a.kv = kv;
      a.positions = p.as<int32_t>() + ctx;
      a.n_head = H;
      a.n_kv_head = Hkv;
      a.head_dim = D;
      a.scale = 0.0625f;
      a.out = out.rows(n, QW);
      gpu_->attention(a);
      ASSERT_TRUE(gpu_->synchronize().is_ok());
      const auto got = get_gpu(out);
      for (int64_t t = 0; t < n; ++t)
        for (int64_t h = 0; h < H; ++h) {
          const bool poisoned = (t == 0 && h == 5) || (t == 1 && h == 9);
          int64_t non_finite = 0;
          for (int64_t d = 0; d < D; ++d) non_finite += !std::isfinite(got[(t * H + h) * D + d]);
          EXPECT_EQ(non_finite, poisoned ? D : 0)
              << fmt::format("kv={} n={} row {} head {}", ggml_type_name(kv_type), n, t, h);
        }
    }
  }
}

TEST_F(CudaBackendTest, CausalConvMatchesCpuWithStateAndCapture) {
  const int64_t C = 96;
  const int K = 4;
  const auto wv = randn(C * K, 0.5f);
  for (int64_t n : {1, 3, 8, 17, 100}) {
    for (bool in_place : {false, true}) {
      const auto xv = randn(n * C), sv = randn((K - 1) * C);
      Pair x = both(xv), w = both(wv), st = both(sv), cap = both_poison(n * (K - 1) * C), y = both_poison(n * C);
      for (Backend* be : {cpu_.get(), gpu_.get()}) {
        const bool g = be == gpu_.get();
        Rows X = (g ? x.g : x.c).rows(n, C);
        be->causal_conv_silu(X, (g ? w.g : w.c).f(), K, (g ? st.g : st.c).f(), (g ? cap.g : cap.c).f(),
                             in_place ? X : (g ? y.g : y.c).rows(n, C));
      }
      const std::string what = fmt::format("n={} in_place={}", n, in_place);
      expect_close(in_place ? x : y, 1e-5, what + " y");
      expect_close(st, 1e-6, what + " state");
      expect_close(cap, 1e-6, what + " capture");
    }
  }
}

// A verify step's conv (split into token spans on the GPU) gives the bits of one-token steps: outputs,
// each token's captured window and the final state.
TEST_F(CudaBackendTest, CausalConvVerifyStepsEqualOneTokenSteps) {
  const int64_t C = 300;
  for (int K : {4, 8}) {
    const int64_t n_max = 33, W = (K - 1) * C;
    Tensor x = put(*gpu_, randn(n_max * C)), w = put(*gpu_, randn(C * K, 0.5f));
    const auto init = randn(W);
    Tensor st1 = put(*gpu_, init), y1 = poison(*gpu_, n_max * C), cap1 = poison(*gpu_, n_max * W);
    // The kernel reads the state before waiting on the previous kernel (PDL), which in a model step is
    // never the conv that wrote it; back to back here, so each step waits for the last.
    for (int64_t t = 0; t < n_max; ++t) {
      gpu_->causal_conv_silu(x.rows(n_max, C).rows(t, 1), w.f(), K, st1.f(), cap1.f() + t * W,
                             y1.rows(n_max, C).rows(t, 1));
      ASSERT_TRUE(gpu_->synchronize().is_ok());
    }
    const auto want_y = get_gpu(y1), want_cap = get_gpu(cap1);
    for (int64_t n : {2, 5, 7, 9, 17, 33}) {
      // The one-token run's state after n tokens is its capture of token n-1.
      const std::vector<float> want_state(want_cap.begin() + (n - 1) * W, want_cap.begin() + n * W);
      Tensor st = put(*gpu_, init), y = poison(*gpu_, n * C), cap = poison(*gpu_, n * W);
      ASSERT_TRUE(gpu_->synchronize().is_ok());
      gpu_->causal_conv_silu(x.rows(n, C), w.f(), K, st.f(), cap.f(), y.rows(n, C));
      const auto got_y = get_gpu(y), got_cap = get_gpu(cap), got_state = get_gpu(st);
      const std::string what = fmt::format("K={} n={}", K, n);
      EXPECT_EQ(std::memcmp(got_y.data(), want_y.data(), n * C * sizeof(float)), 0) << what << " y";
      EXPECT_EQ(std::memcmp(got_cap.data(), want_cap.data(), n * W * sizeof(float)), 0) << what << " capture";
      EXPECT_EQ(std::memcmp(got_state.data(), want_state.data(), W * sizeof(float)), 0) << what << " state";
    }
  }
}

TEST_F(CudaBackendTest, GatedDeltaNetMatchesCpuRecurrentAndChunked) {
  struct Case {
    int n_k, n_v, d;
  };
  for (const Case cs : {Case{2, 4, 32}, Case{1, 2, 128}}) {
    for (int64_t n : kWidths) {
      for (bool chunked : {false, true}) {
        const int64_t Kc = int64_t{cs.n_k} * cs.d, Vc = int64_t{cs.n_v} * cs.d, S = cs.n_v * cs.d * cs.d;
        Pair qkv = both(randn(n * (2 * Kc + Vc))), beta = both(randn(n * cs.n_v)), alpha = both(randn(n * cs.n_v));
        std::vector<float> a_log = randn(cs.n_v), ssm_a(cs.n_v);
        for (int h = 0; h < cs.n_v; ++h) ssm_a[h] = -std::exp(0.5f * a_log[h]);
        Pair A = both(ssm_a), dt = both(randn(cs.n_v)), state = both(randn(S, 0.1f));
        const GdnPairs p{cs.n_k, cs.n_v, cs.d, n, qkv, beta, alpha, A, dt, state, both_poison(n * Vc),
                         both_poison(chunked ? 1 : n * S)};
        gdn_on_both(p, chunked, /*with_capture=*/!chunked);
        const std::string what = fmt::format("d={} n={} chunked={}", cs.d, n, chunked);
        expect_close(p.out, 1e-3, what + " out");
        expect_close(p.state, 1e-3, what + " state");
        if (!chunked) expect_close(p.capture, 1e-3, what + " capture");
      }
    }
  }
}

// Updates capture on CUDA: the outputs of an F32-capture run, bit for bit, the state untouched, and
// gdn_replay of the first m updates (several layers' parts in one launch) lands exactly on the state
// captured after token m - 1, so a rollback by updates is as lossless as one by captured states.
TEST_F(CudaBackendTest, GatedDeltaNetUpdatesReplayToTheCapturedStates) {
  struct Case {
    int n_k, n_v, d;
  };
  for (const Case cs : {Case{2, 4, 32}, Case{16, 32, 128}}) {
    const int64_t n = 17, Kc = int64_t{cs.n_k} * cs.d, Vc = int64_t{cs.n_v} * cs.d, S = int64_t{cs.n_v} * cs.d * cs.d;
    const int64_t R = gdn_update_floats(cs.n_k, cs.n_v, cs.d);
    const std::vector<float> init = randn(S, 0.1f);
    std::vector<float> a_log = randn(cs.n_v), ssm_a(cs.n_v);
    for (int h = 0; h < cs.n_v; ++h) ssm_a[h] = -std::exp(0.5f * a_log[h]);
    Tensor qkv = put(*gpu_, randn(n * (2 * Kc + Vc))), beta = put(*gpu_, randn(n * cs.n_v)),
           alpha = put(*gpu_, randn(n * cs.n_v)), A = put(*gpu_, ssm_a), dt = put(*gpu_, randn(cs.n_v));
    auto run = [&](Tensor& state, Tensor& out, float* capture, float* updates) {
      Rows X = qkv.rows(n, 2 * Kc + Vc);
      GdnArgs a;
      a.q = X.cols(0, Kc);
      a.k = X.cols(Kc, Kc);
      a.v = X.cols(2 * Kc, Vc);
      a.beta_logit = beta.rows(n, cs.n_v);
      a.alpha = alpha.rows(n, cs.n_v);
      a.ssm_a = A.f();
      a.dt_bias = dt.f();
      a.n_k_heads = cs.n_k;
      a.n_v_heads = cs.n_v;
      a.head_dim = cs.d;
      a.state = state.f();
      a.capture = capture;
      a.updates = updates;
      a.out = out.rows(n, Vc);
      gpu_->gated_delta_net(a);
    };
    Tensor s_cap = put(*gpu_, init), out_cap = poison(*gpu_, n * Vc), cap = poison(*gpu_, n * S);
    Tensor s_upd = put(*gpu_, init), out_upd = poison(*gpu_, n * Vc), upd = poison(*gpu_, n * R);
    run(s_cap, out_cap, cap.f(), nullptr);
    run(s_upd, out_upd, nullptr, upd.f());
    const std::string what = fmt::format("n_k={} n_v={} d={}", cs.n_k, cs.n_v, cs.d);
    EXPECT_EQ(get_gpu(out_upd), get_gpu(out_cap)) << what << " out";
    EXPECT_EQ(get_gpu(s_upd), init) << what << ": the state stays as it was";
    const auto want_cap = get_gpu(cap);
    for (int64_t m : {1, 2, 9, 16, 17}) {
      Tensor s1 = put(*gpu_, init), s2 = put(*gpu_, init);
      const Backend::GdnReplayPart parts[2] = {{s1.f(), upd.f()}, {s2.f(), upd.f()}};
      gpu_->gdn_replay(parts, 2, m, cs.n_k, cs.n_v, cs.d);
      const std::vector<float> want(want_cap.begin() + (m - 1) * S, want_cap.begin() + m * S);
      EXPECT_EQ(get_gpu(s1), want) << what << " after " << m << " updates";
      EXPECT_EQ(get_gpu(s2), want) << what << " after " << m << " updates, second part";
    }
  }
}

// Prompts of >= 64 tokens with head_dim 32..128 (multiples of 32) run the chunked kernels (chunks
// of 64: W/U by forward substitution, then a scan over the chunks); the CPU, at these head dims,
// runs its recurrent row kernel, so this compares the two forms, state included, from a nonzero
// state. n = 1 and 63 stay on the recurrent kernel (the dispatch boundary); 65 and 200 end in a
// partial chunk. Gates as in the real models: A in [1, 16] and softplus(alpha + dt_bias) from ~1e-4
// to ~1, so heads with slow decay carry the state through the whole prompt. The chunked form rounds
// differently (triangular solve, decays as e^(gamma_i - gamma_j)): a host emulation of the kernels
// measured ~1e-6 relative against a double-precision recurrence (the f32 recurrence: ~2e-7), so
// 1e-4 leaves two orders of magnitude while a wrong index or a missing barrier gives O(1).
TEST_F(CudaBackendTest, GatedDeltaNetChunkedPromptMatchesCpuRecurrent) {
  struct Case {
    int n_k, n_v, d;
  };
  for (const Case cs : {Case{16, 32, 128}, Case{2, 4, 32}}) {  // Qwen3.5-9B, the tiny fixtures
    for (int64_t n : {1, 63, 64, 65, 200, 512}) {
      const int64_t Kc = int64_t{cs.n_k} * cs.d, Vc = int64_t{cs.n_v} * cs.d, S = int64_t{cs.n_v} * cs.d * cs.d;
      std::uniform_real_distribution<float> u01(0.0f, 1.0f);
      std::vector<float> ssm_a(cs.n_v), dt_bias(cs.n_v);
      for (int h = 0; h < cs.n_v; ++h) {
        ssm_a[h] = -(1.0f + 15.0f * u01(rng_));
        dt_bias[h] = -7.0f + 5.0f * u01(rng_);
      }
      const GdnPairs p{cs.n_k, cs.n_v, cs.d, n, both(randn(n * (2 * Kc + Vc))), both(randn(n * cs.n_v)),
                       both(randn(n * cs.n_v)), both(ssm_a), both(dt_bias), both(randn(S, 0.1f)),
                       both_poison(n * Vc), Pair{}};
      gdn_on_both(p, /*chunked=*/true, /*with_capture=*/false);
      const std::string what = fmt::format("n_k={} n_v={} d={} n={}", cs.n_k, cs.n_v, cs.d, n);
      const double eo = rel_err(get_gpu(p.out.g), get(*cpu_, p.out.c));
      const double es = rel_err(get_gpu(p.state.g), get(*cpu_, p.state.c));
      std::printf("gdn chunked %s: relative error out %.2e, state %.2e\n", what.c_str(), eo, es);
      EXPECT_LE(eo, 1e-4) << what << " out";
      EXPECT_LE(es, 1e-4) << what << " state";
    }
  }
}

// Widths of several tokens take the grouped expert path (up to 25 rows per expert at n = 100: two
// 16-row tiles); Q4_K at 256-wide rows, with 16 experts and top-4.
TEST_F(CudaBackendTest, MoeFfnMatchesCpu) {
  struct Case {
    GgmlType type;
    int64_t hidden, ffn, E;
    int top_k;
  };
  for (const Case cs : {Case{GgmlType::Q8_0, 128, 64, 8, 2}, Case{GgmlType::F16, 128, 64, 8, 2},
                        Case{GgmlType::Q4_K, 256, 256, 16, 4}}) {
    const GgmlType type = cs.type;
    const int64_t hidden = cs.hidden, ffn = cs.ffn, E = cs.E;
    const auto router_b = random_weight_bytes(GgmlType::F32, hidden, E, rng_);
    const auto gate_b = random_weight_bytes(type, hidden, ffn * E, rng_), up_b = random_weight_bytes(type, hidden, ffn * E, rng_);
    const auto down_b = random_weight_bytes(type, ffn, hidden * E, rng_);
    const auto shared_b = random_weight_bytes(GgmlType::F32, hidden, 1, rng_);
    std::vector<GgufTensorInfo> infos = {tensor_info("router", GgmlType::F32, router_b, hidden, E),
                                         tensor_info("gate", type, gate_b, hidden, ffn, E),
                                         tensor_info("up", type, up_b, hidden, ffn, E),
                                         tensor_info("down", type, down_b, ffn, hidden, E),
                                         tensor_info("shared_gate", GgmlType::F32, shared_b, hidden, 1)};
    std::vector<Weight> wc, wg;
    for (const auto& info : infos) {
      wc.push_back(cpu_->load_weight(info, true).value());
      wg.push_back(gpu_->load_weight(info).value());
    }
    for (int64_t n : {1, 3, 16, 40, 100}) {
      Pair x = both(randn(n * hidden)), out = both_poison(n * hidden), sg = both_poison(n);
      for (Backend* be : {cpu_.get(), gpu_.get()}) {
        const bool g = be == gpu_.get();
        auto& w = g ? wg : wc;
        MoeArgs a;
        a.x = (g ? x.g : x.c).rows(n, hidden);
        a.router = &w[0];
        a.gate_exps = &w[1];
        a.up_exps = &w[2];
        a.down_exps = &w[3];
        a.top_k = cs.top_k;
        a.out = (g ? out.g : out.c).rows(n, hidden);
        a.shared_gate = &w[4];  // with the router in one launch on CUDA
        a.shared_gate_out = (g ? sg.g : sg.c).rows(n, 1);
        be->moe_ffn(a);
      }
      // Q4_K experts run on the int8 matvec up to kInt8ExpertsMaxTokens (gate/up, then down: two
      // quantized activations), above on the f16 grouped path.
      const bool int8 = type == GgmlType::Q4_K && n <= 65;
      expect_close(out, int8 ? 3e-2 : 2e-3, fmt::format("{} n={}", ggml_type_name(type), n));
      expect_close(sg, 1e-5, fmt::format("{} n={} shared gate", ggml_type_name(type), n));
      Tensor alone = poison(*gpu_, n);  // the shared gate's own matmul: the same bits
      gpu_->matmul(wg[4], x.g.rows(n, hidden), alone.rows(n, 1));
      EXPECT_EQ(get_gpu(alone), get_gpu(sg.g)) << ggml_type_name(type) << " n=" << n;
    }
  }
}

// A row of a several-token MoE step has the bits of the same token in a one-token step: speculative
// verify rows must equal decode steps. With the int8 matvec (the default) K-quant experts run per slot
// at these widths, an expert's slots two at a time (pairs, from 10 tokens: 96 slots over 16 experts
// here, so nearly all paired); without it, and for Q8_0, the step is grouped by expert.
TEST_F(CudaBackendTest, MoeFfnGroupedRowsEqualOneTokenSteps) {
  const int64_t hidden = 256, ffn = 256, E = 16, n = 24;
  for (const bool int8 : {true, false})
  for (GgmlType type : {GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0}) {
    BackendOptions options;
    options.int8_matvec = int8;
    std::unique_ptr<Backend> gpu = create_backend(BackendKind::Cuda, options).value();
    const auto router_b = random_weight_bytes(GgmlType::F32, hidden, E, rng_);
    const auto gate_b = random_weight_bytes(type, hidden, ffn * E, rng_), up_b = random_weight_bytes(type, hidden, ffn * E, rng_);
    const auto down_b = random_weight_bytes(type, ffn, hidden * E, rng_);
    Weight router = gpu->load_weight(tensor_info("router", GgmlType::F32, router_b, hidden, E)).value();
    Weight gate = gpu->load_weight(tensor_info("gate", type, gate_b, hidden, ffn, E)).value();
    Weight up = gpu->load_weight(tensor_info("up", type, up_b, hidden, ffn, E)).value();
    Weight down = gpu->load_weight(tensor_info("down", type, down_b, ffn, hidden, E)).value();
    Tensor x = put(*gpu, randn(n * hidden)), all = poison(*gpu, n * hidden), one = poison(*gpu, n * hidden);
    auto run = [&](int64_t row0, int64_t rows, Tensor& out) {
      MoeArgs a;
      a.x = Rows(x.f() + row0 * hidden, rows, hidden);
      a.router = &router;
      a.gate_exps = &gate;
      a.up_exps = &up;
      a.down_exps = &down;
      a.top_k = 4;
      a.out = Rows(out.f() + row0 * hidden, rows, hidden);
      gpu->moe_ffn(a);
    };
    run(0, n, all);
    for (int64_t t = 0; t < n; ++t) run(t, 1, one);
    const auto va = get(*gpu, all), vo = get(*gpu, one);
    ASSERT_TRUE(gpu->synchronize().is_ok());
    EXPECT_EQ(std::memcmp(va.data(), vo.data(), va.size() * sizeof(float)), 0) << ggml_type_name(type) << " int8 "
                                                                                 << int8;
  }
}

// The per-slot int8 experts take their weights by TMA boxes of a map of all experts' rows on sm_90
// (HYSPEC_TMA_EXPERTS=0: cp.async copies): the same bits, one slot at a time (1 and 3 tokens) and in pairs
// (24), with the SwiGLU and the down projection's warp tiles (ffn 256 < 8 super-blocks); Q6_K at 2048-wide
// rows (1680 bytes: 16-byte rows, which its maps need).
TEST_F(CudaBackendTest, MoeFfnByTmaKeepsTheCopiesBits) {
#ifdef HYSPEC_HAVE_CUDA
  if (!cuda::int8_matvec_tma_available()) GTEST_SKIP() << "no TMA here (sm_90 and the driver's tensor-map encoder)";
#endif
  struct Case {
    GgmlType type;
    int64_t hidden, ffn;
  };
  const int64_t E = 8;
  for (const Case cs : {Case{GgmlType::Q4_K, 256, 256}, Case{GgmlType::Q4_K, 2048, 256}, Case{GgmlType::Q6_K, 2048, 2048}}) {
    const int64_t hidden = cs.hidden, ffn = cs.ffn;
    const auto router_b = random_weight_bytes(GgmlType::F32, hidden, E, rng_);
    const auto gate_b = random_weight_bytes(cs.type, hidden, ffn * E, rng_);
    const auto up_b = random_weight_bytes(cs.type, hidden, ffn * E, rng_);
    const auto down_b = random_weight_bytes(cs.type, ffn, hidden * E, rng_);
    Weight router = gpu_->load_weight(tensor_info("router", GgmlType::F32, router_b, hidden, E)).value();
    Weight gate = gpu_->load_weight(tensor_info("gate", cs.type, gate_b, hidden, ffn, E)).value();
    Weight up = gpu_->load_weight(tensor_info("up", cs.type, up_b, hidden, ffn, E)).value();
    Weight down = gpu_->load_weight(tensor_info("down", cs.type, down_b, ffn, hidden, E)).value();
    for (const int64_t n : {1, 3, 24}) {
      const Tensor x = put(*gpu_, randn(n * hidden));
      auto run = [&](const char* tma) {
        const ScopedEnv ring("HYSPEC_TMA_EXPERTS", tma);
        const Tensor out = poison(*gpu_, n * hidden);
        MoeArgs a;
        a.x = x.rows(n, hidden);
        a.router = &router;
        a.gate_exps = &gate;
        a.up_exps = &up;
        a.down_exps = &down;
        a.top_k = 4;
        a.out = out.rows(n, hidden);
        gpu_->moe_ffn(a);
        return get_gpu(out);
      };
      const auto copies = run("0"), tma = run("1");
      ASSERT_EQ(copies.size(), tma.size());
      for (size_t i = 0; i < copies.size(); ++i) {
        ASSERT_TRUE(std::isfinite(copies[i])) << ggml_type_name(cs.type) << " n=" << n << " at " << i;
        ASSERT_EQ(std::memcmp(&copies[i], &tma[i], 4), 0) << ggml_type_name(cs.type) << " hidden=" << hidden << " n=" << n
                                                          << " at " << i;
      }
    }
  }
}

// A decode step recorded once and replayed with new token ids and positions equals running the ops.
TEST_F(CudaBackendTest, CapturedStepReplaysWithNewPositions) {
  Backend& b = *gpu_;
  const int64_t E = 256, V = 64, H = 4, Hkv = 2, D = 64, W = Hkv * D, cap = 128, n = 3;
  const auto emb_b = random_weight_bytes(GgmlType::Q8_0, E, V, rng_);
  const auto wq_b = random_weight_bytes(GgmlType::Q4_K, E, H * D, rng_);
  const auto wk_b = random_weight_bytes(GgmlType::Q6_K, E, W, rng_);
  const auto wo_b = random_weight_bytes(GgmlType::Q5_K, H * D, V, rng_);
  Weight emb = b.load_weight(tensor_info("emb", GgmlType::Q8_0, emb_b, E, V)).value();
  Weight wq = b.load_weight(tensor_info("q", GgmlType::Q4_K, wq_b, E, H * D)).value();
  Weight wk = b.load_weight(tensor_info("k", GgmlType::Q6_K, wk_b, E, W)).value();
  Weight wo = b.load_weight(tensor_info("o", GgmlType::Q5_K, wo_b, H * D, V)).value();
  Tensor x = poison(b, n * E), q = poison(b, n * H * D), k = poison(b, n * W), att = poison(b, n * H * D),
         logits = poison(b, n * V), norm_w = put(b, randn(E));
  Buffer tokens = b.alloc(n * 4).value(), pos = b.alloc(n * 4).value(), out_ids = b.alloc(n * 4).value();
  Buffer kc = b.alloc(cap * W * 2).value(), vc = b.alloc(cap * W * 2).value();
  const auto kv_init = randn(cap * W);
  std::vector<uint16_t> kv_h(kv_init.size());
  for (size_t i = 0; i < kv_h.size(); ++i) kv_h[i] = fp32_to_fp16(kv_init[i]);
  KvLayer kv{kc.data(), vc.data(), GgmlType::F16, cap, W, D};
  auto step = [&] {
    b.embed(emb, tokens.as<int32_t>(), n, x.rows(n, E));
    b.rms_norm(x.rows(n, E), norm_w.f(), E, 1e-6f, x.rows(n, E));
    b.matmul(wq, x.rows(n, E), q.rows(n, H * D));
    b.matmul(wk, x.rows(n, E), k.rows(n, W));
    b.rope_neox(q.rows(n, H * D), D, 16, pos.as<int32_t>(), 1e7f);
    b.rope_neox(k.rows(n, W), D, 16, pos.as<int32_t>(), 1e7f);
    b.kv_store(k.rows(n, W), k.rows(n, W), kv, pos.as<int32_t>());
    AttentionArgs a;
    a.q = q.rows(n, H * D);
    a.kv = kv;
    a.positions = pos.as<int32_t>();
    a.n_head = H;
    a.n_kv_head = Hkv;
    a.head_dim = D;
    a.scale = 0.125f;
    a.out = att.rows(n, H * D);
    b.attention(a);
    b.matmul(wo, att.rows(n, H * D), logits.rows(n, V));
    b.argmax(logits.rows(n, V), out_ids.as<int32_t>());
  };
  auto set_inputs = [&](int first_pos) {
    std::vector<int32_t> t(n), p(n);
    for (int64_t i = 0; i < n; ++i) t[i] = uniform(0, V - 1), p[i] = first_pos + static_cast<int32_t>(i);
    b.upload(tokens.data(), t.data(), n * 4);
    b.upload(pos.data(), p.data(), n * 4);
    b.upload(kc.data(), kv_h.data(), kv_h.size() * 2);
    b.upload(vc.data(), kv_h.data(), kv_h.size() * 2);
  };
  auto graph = b.capture(step);
  ASSERT_TRUE(graph.is_ok()) << graph.message();
  for (int first_pos : {5, 90, 17}) {
    set_inputs(first_pos);
    b.fill_zero(logits.f(), n * V * 4);
    step();
    const auto direct = get_gpu(logits);
    b.upload(kc.data(), kv_h.data(), kv_h.size() * 2);
    b.upload(vc.data(), kv_h.data(), kv_h.size() * 2);
    b.fill_zero(logits.f(), n * V * 4);
    ASSERT_TRUE((*graph)->replay().is_ok());
    const auto replayed = get_gpu(logits);
    EXPECT_EQ(direct, replayed) << "first position " << first_pos;
  }
}

TEST_F(CudaBackendTest, ErrorsAreReportedBySynchronizeNotAborts) {
  const auto bytes = random_weight_bytes(GgmlType::Q8_0, 64, 8, rng_);
  Weight w = gpu_->load_weight(tensor_info("w", GgmlType::Q8_0, bytes, 64, 8)).value();
  Tensor x = put(*gpu_, randn(2 * 64)), y = poison(*gpu_, 2 * 8);
  gpu_->matmul(w, x.rows(2, 32), y.rows(2, 8));  // wrong width
  Status s = gpu_->synchronize();
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("'w'"), std::string::npos) << s.message();
  EXPECT_TRUE(gpu_->synchronize().is_ok());  // reported once
  auto bad = gpu_->capture([&] { gpu_->download(nullptr, x.f(), 4); });
  EXPECT_FALSE(bad.is_ok());
}

// Decode-path speed on real shapes; run with HYSPEC_CUDA_BENCH=1. Times graph replays (launch gaps
// amortised) of many calls rotating over copies whose total exceeds L2, so weights stream from HBM.
class CudaBench : public CudaBackendTest {
 protected:
  // Seconds per call of `calls` calls recorded in one graph.
  double time_graph(const std::function<void()>& body, int calls) {
    Backend& b = *gpu_;
    auto g = b.capture(body);
    EXPECT_TRUE(g.is_ok()) << g.message();
    if (!g.is_ok()) return 0;
    (void)(*g)->replay();
    EXPECT_TRUE(b.synchronize().is_ok());
    constexpr int kReplays = 20;
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < kReplays; ++r) (void)(*g)->replay();
    EXPECT_TRUE(b.synchronize().is_ok());
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / (kReplays * calls);
  }
  void SetUp() override {
    if (!std::getenv("HYSPEC_CUDA_BENCH")) GTEST_SKIP() << "set HYSPEC_CUDA_BENCH=1";
    const char* int8 = std::getenv("HYSPEC_BENCH_INT8");  // 0: the f16 matvec (BackendOptions::int8_matvec)
    options_.int8_matvec = !(int8 && *int8 == '0');
    CudaBackendTest::SetUp();
  }
};

// The widths a bench runs: HYSPEC_BENCH_WIDTHS (e.g. "1,16", for profilers), else its own.
std::vector<int64_t> bench_widths(std::vector<int64_t> widths) {
  if (const char* env = std::getenv("HYSPEC_BENCH_WIDTHS")) {
    widths.clear();
    for (const char* p = env; *p;) {
      widths.push_back(std::strtol(p, const_cast<char**>(&p), 10));
      if (*p == ',') ++p;
    }
  }
  return widths;
}

TEST_F(CudaBench, MatmulDecode) {
  Backend& b = *gpu_;
  struct Shape {
    int64_t K, N;
  };
  const char* only = std::getenv("HYSPEC_BENCH_TYPE");  // e.g. Q4_K
  const std::vector<int64_t> widths = bench_widths({1, 4, 8, 16, 17, 32, 128});
  std::string table;
  for (GgmlType type : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::Q4_0,
                        GgmlType::BF16, GgmlType::F16, GgmlType::Q3_K, GgmlType::IQ4_XS}) {
    if (only && ggml_type_name(type) != only) continue;
    // 9B shapes: attn_k/v-sized, ffn gate/up, ffn_down, GDN attn_qkv; or HYSPEC_BENCH_SHAPES ("KxN,..."; the
    // 9B's output head: 4096x248320)
    std::vector<Shape> shapes = {{4096, 4096}, {4096, 12288}, {12288, 4096}, {4096, 8192}};
    if (const char* env = std::getenv("HYSPEC_BENCH_SHAPES")) {
      shapes.clear();
      for (const char* p = env; *p;) {
        Shape sh{};
        sh.K = std::strtol(p, const_cast<char**>(&p), 10);
        if (*p == 'x') ++p;
        sh.N = std::strtol(p, const_cast<char**>(&p), 10);
        if (sh.K > 0 && sh.N > 0) shapes.push_back(sh);
        if (*p != ',') break;
        ++p;
      }
    }
    // Weight copies the graph walks (HYSPEC_BENCH_COPIES, default 8: past L2; 1 keeps a weight of up to ~40 MB in
    // L2, to see how fast a matvec runs on weights that a prefetch put there)
    const char* copies_env = std::getenv("HYSPEC_BENCH_COPIES");
    const int copies = copies_env && *copies_env ? std::max(1, std::atoi(copies_env)) : 8;
    for (const Shape sh : shapes) {
      const auto bytes = random_weight_bytes(type, sh.K, sh.N, rng_);
      std::vector<Weight> ws;
      for (int c = 0; c < copies; ++c) ws.push_back(b.load_weight(tensor_info("w", type, bytes, sh.K, sh.N)).value());
      table += fmt::format("| {} {}x{} |", ggml_type_name(type), sh.K, sh.N);
      for (int64_t n : widths) {
        Tensor x = put(b, randn(n * sh.K)), y = poison(b, n * sh.N);
        const double s = time_graph(
            [&] {
              for (int rep = 0; rep < 4; ++rep)
                for (auto& w : ws) b.matmul(w, x.rows(n, sh.K), y.rows(n, sh.N));
            },
            4 * copies);
        std::printf("BENCH matmul %-5s %5ldx%-5ld n=%-3ld %8.2f us %6.0f GB/s %6.1f TFLOP/s\n",
                    std::string(ggml_type_name(type)).c_str(), static_cast<long>(sh.K), static_cast<long>(sh.N),
                    static_cast<long>(n), s * 1e6, bytes.size() / s / 1e9, 2.0 * sh.K * sh.N * n / s / 1e12);
        table += fmt::format(" {:.0f} |", bytes.size() / s / 1e9);
      }
      table += "\n";
    }
  }
  std::string head = "| weight [K x N] |";
  for (int64_t n : widths) head += fmt::format(" n={} |", n);
  std::printf("BENCH TABLE matmul GB/s\n%s\n%s", head.c_str(), table.c_str());
}

// FFN gate+up (4096 -> 12288 each): fused matvec + SwiGLU vs two matmuls and a swiglu.
TEST_F(CudaBench, MatmulSwiGlu) {
  Backend& b = *gpu_;
  const int64_t K = 4096, N = 12288;
  for (GgmlType type : {GgmlType::Q4_K, GgmlType::Q6_K}) {
    constexpr int kCopies = 4;
    const auto gb = random_weight_bytes(type, K, N, rng_), ub = random_weight_bytes(type, K, N, rng_);
    std::vector<Weight> gs, us;
    for (int c = 0; c < kCopies; ++c) {
      gs.push_back(b.load_weight(tensor_info("g", type, gb, K, N)).value());
      us.push_back(b.load_weight(tensor_info("u", type, ub, K, N)).value());
    }
    for (int64_t n : {1, 16, 17}) {
      Tensor x = put(b, randn(n * K)), y = poison(b, n * N), g = poison(b, n * N), u = poison(b, n * N);
      const double fused = time_graph(
          [&] {
            for (int rep = 0; rep < 4; ++rep)
              for (int c = 0; c < kCopies; ++c) b.matmul_swiglu(gs[c], us[c], x.rows(n, K), y.rows(n, N));
          },
          4 * kCopies);
      const double separate = time_graph(
          [&] {
            for (int rep = 0; rep < 4; ++rep)
              for (int c = 0; c < kCopies; ++c) {
                b.matmul(gs[c], x.rows(n, K), g.rows(n, N));
                b.matmul(us[c], x.rows(n, K), u.rows(n, N));
                b.swiglu(g.rows(n, N), u.rows(n, N), y.rows(n, N));
              }
          },
          4 * kCopies);
      const double bytes = 2.0 * gb.size();
      std::printf("BENCH swiglu %-5s %ldx%ld n=%-3ld fused %8.2f us %6.0f GB/s | separate %8.2f us %6.0f GB/s\n",
                  std::string(ggml_type_name(type)).c_str(), static_cast<long>(K), static_cast<long>(N),
                  static_cast<long>(n), fused * 1e6, bytes / fused / 1e9, separate * 1e6, bytes / separate / 1e9);
    }
  }
}

// The bandwidth ceiling: device-to-device copies of 256 MiB (bytes read + written).
TEST_F(CudaBench, CopyBandwidth) {
  Backend& b = *gpu_;
  const size_t bytes = size_t(256) << 20;
  Buffer src = b.alloc(bytes).value(), dst = b.alloc(bytes).value();
  b.fill_zero(src.data(), bytes);
  const double s = time_graph([&] { for (int i = 0; i < 4; ++i) b.copy(dst.data(), src.data(), bytes); }, 4);
  std::printf("BENCH copy 256 MiB %8.2f us %6.0f GB/s (read + write)\n", s * 1e6, 2.0 * bytes / s / 1e9);
}

// The greedy pick over a Qwen3.5 vocabulary (248320 logits a row) for a decode step and a 16-row verify step.
TEST_F(CudaBench, Argmax) {
  Backend& b = *gpu_;
  const int64_t V = 248320;
  for (const int64_t rows : {1, 16}) {
    const Tensor x = put(b, randn(rows * V));
    Buffer ids = b.alloc(rows * sizeof(int32_t)).value();
    const double s = time_graph([&] { for (int i = 0; i < 8; ++i) b.argmax(x.rows(rows, V), ids.as<int32_t>()); }, 8);
    std::printf("BENCH argmax %lld x %lld %8.2f us %6.0f GB/s\n", static_cast<long long>(rows), static_cast<long long>(V),
                s * 1e6, rows * V * 4.0 / s / 1e9);
  }
}

// MoE expert FFN (Qwen3.5-35B-A3B's: 2048 wide, 256 experts of 512, top-8; HYSPEC_BENCH_MOE=128x768:
// the 128 experts of 768 of sessions 28-29) with Q4_K experts at decode, verify and prompt widths.
// HYSPEC_MOE_GROUPED_MIN=0 times the per-slot path instead of the grouped.
TEST_F(CudaBench, MoeFfn) {
  Backend& b = *gpu_;
  const char* shape = std::getenv("HYSPEC_BENCH_MOE");
  const bool old_shape = shape && std::string(shape) == "128x768";
  const int64_t hidden = 2048, ffn = old_shape ? 768 : 512, E = old_shape ? 128 : 256;
  const auto router_b = random_weight_bytes(GgmlType::F32, hidden, E, rng_);
  Weight router = b.load_weight(tensor_info("router", GgmlType::F32, router_b, hidden, E)).value();
  std::vector<Weight> w;
  for (const char* name : {"gate", "up", "down"}) {
    const bool down = name[0] == 'd';
    const auto bytes = random_weight_bytes(GgmlType::Q4_K, down ? ffn : hidden, (down ? hidden : ffn) * E, rng_);
    w.push_back(b.load_weight(tensor_info(name, GgmlType::Q4_K, bytes, down ? ffn : hidden, down ? hidden : ffn, E)).value());
  }
  const double expert_bytes = 3.0 * static_cast<double>(ggml_row_bytes(GgmlType::Q4_K, hidden).value()) * ffn;
  for (int64_t n : bench_widths({1, 17, 128, 512})) {
    Tensor x = put(b, randn(n * hidden)), out = poison(b, n * hidden);
    MoeArgs a;
    a.x = x.rows(n, hidden);
    a.router = &router;
    a.gate_exps = &w[0];
    a.up_exps = &w[1];
    a.down_exps = &w[2];
    a.top_k = 8;
    a.out = out.rows(n, hidden);
    b.moe_ffn(a);  // sizes the scratch arenas before the capture
    ASSERT_TRUE(b.synchronize().is_ok());
    const double s = time_graph([&] { for (int i = 0; i < 4; ++i) b.moe_ffn(a); }, 4);
    const double used = std::min<double>(E, 8.0 * n) * expert_bytes;  // at least this many expert bytes
    std::printf("BENCH moe_ffn n=%-4ld %9.1f us %7.2f us/token  >= %6.0f GB/s of experts\n", static_cast<long>(n),
                s * 1e6, s * 1e6 / n, used / s / 1e9);
    if (n != 1) continue;
    // With the shared expert's gate (2048 x 1, F32): in the router's launch, or a matmul of its own.
    const auto shared_b = random_weight_bytes(GgmlType::F32, hidden, 1, rng_);
    Weight shared = b.load_weight(tensor_info("shared_gate", GgmlType::F32, shared_b, hidden, 1)).value();
    Tensor sg = poison(b, n);
    const double alone = time_graph([&] {
      for (int i = 0; i < 4; ++i) b.moe_ffn(a), b.matmul(shared, a.x, sg.rows(n, 1));
    }, 4);
    a.shared_gate = &shared;
    a.shared_gate_out = sg.rows(n, 1);
    b.moe_ffn(a);
    ASSERT_TRUE(b.synchronize().is_ok());
    const double paired = time_graph([&] { for (int i = 0; i < 4; ++i) b.moe_ffn(a); }, 4);
    std::printf("BENCH moe_ffn n=1 with the shared gate: %.1f us in the router's launch, %.1f us on its own\n",
                paired * 1e6, alone * 1e6);
  }
}

TEST_F(CudaBench, AttentionAndGdnDecode) {
  Backend& b = *gpu_;
  // 9B shapes: 16 q / 4 kv heads of 256, F16 and BF16 KV; GDN 16 k / 32 v heads of 128.
  const int H = 16, Hkv = 4, D = 256;
  const int64_t W = Hkv * D;
  const char* only_ctx = std::getenv("HYSPEC_BENCH_CTX");    // e.g. 16384 (profilers)
  const char* only_kv = std::getenv("HYSPEC_BENCH_KV");      // e.g. Q8_0
  const char* only_rows = std::getenv("HYSPEC_BENCH_ROWS");  // e.g. 1
  // Each timed pass rotates over enough caches (random keys and values) to pass twice the L2 (50 MB on
  // the H100): one cache re-read would stay in L2 where it fits (a Q8_0 cache at 16K is 37 MB).
  constexpr double kPastL2 = 128e6;
  constexpr int64_t kPattern = 256;  // positions of random data, repeated through each cache
  for (const GgmlType kv_type : {GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0})
  for (int64_t ctx : {1024, 8192, 16384, 32768}) {
    if (only_ctx && std::atoll(only_ctx) != ctx) continue;
    if (only_kv && ggml_type_name(kv_type) != only_kv) continue;
    const int64_t cap = ctx + 512;
    const size_t row = KvLayer{nullptr, nullptr, kv_type, cap, W, D}.row_bytes();
    const int copies = static_cast<int>(std::clamp<double>(std::ceil(kPastL2 / (2.0 * cap * row)), 1, 16));
    const test::KvCacheBytes pattern =
        test::encode_kv_cache(kv_type, randn(kPattern * W), randn(kPattern * W), W, D);
    std::vector<Buffer> caches;
    for (int c = 0; c < 2 * copies; ++c) {
      caches.push_back(b.alloc(cap * row).value());
      const std::vector<uint8_t>& bytes = c % 2 ? pattern.v : pattern.k;
      for (int64_t p0 = 0; p0 < cap; p0 += kPattern)
        b.upload(static_cast<uint8_t*>(caches.back().data()) + p0 * row, bytes.data(),
                 std::min(kPattern, cap - p0) * row);
    }
    for (int64_t n : {1, 8, 16, 512}) {
      if (kv_type == GgmlType::BF16 && n == 512) continue;
      if (only_rows && std::atoll(only_rows) != n) continue;
      if (n == 512 && ctx != 1024 && ctx != 16384) continue;  // prefill: a 512-token chunk after ctx cached
      std::vector<int32_t> pos(n);
      for (int64_t i = 0; i < n; ++i) pos[i] = static_cast<int32_t>(ctx + i);
      Buffer p = put_i32(b, pos);
      Tensor q = put(b, randn(n * H * D)), out = poison(b, n * H * D);
      AttentionArgs a;
      a.q = q.rows(n, H * D);
      a.positions = p.as<int32_t>();
      a.n_head = H;
      a.n_kv_head = Hkv;
      a.head_dim = D;
      a.scale = 0.0625f;
      a.out = out.rows(n, H * D);
      const int calls = copies * ((10 + copies - 1) / copies);
      const double s = time_graph(
          [&] {
            for (int i = 0; i < calls; ++i) {
              a.kv = KvLayer{caches[2 * (i % copies)].data(), caches[2 * (i % copies) + 1].data(), kv_type, cap, W, D};
              b.attention(a);
            }
          },
          calls);
#ifdef HYSPEC_ATTN_TRACE
      if (std::getenv("HYSPEC_ATTN_TRACE"))  // the last of the timed launches (they overlap: PDL)
        cuda::attention_trace_report(fmt::format("{} ctx={} n={}", ggml_type_name(kv_type), ctx, n).c_str());
#endif
      const double bytes = 2.0 * (ctx + n) * static_cast<double>(row), flops = 4.0 * n * H * D * (ctx + n / 2.0);
      std::printf("BENCH attention %s ctx=%-6ld n=%-3ld %8.2f us %6.0f GB/s %6.1f TFLOP/s (%d caches)\n",
                  ggml_type_name(kv_type).data(), static_cast<long>(ctx), static_cast<long>(n), s * 1e6,
                  bytes / s / 1e9, flops / s / 1e12, copies);
    }
  }
  const int nk = 16, nv = 32, d = 128;
  // The small ops of a prompt step at 9B shapes: the conv reads the q/k/v columns of the GDN input
  // projection's output (row stride 12352), SwiGLU [n, 12288], the norms [n, 4096].
  for (int64_t n : {17, 512}) {
    const int64_t C = (2 * nk + nv) * d, in_w = C + 4096 + 2 * nv, E = 4096, F = 12288;
    Tensor in = put(b, randn(n * in_w)), y = poison(b, n * C), wconv = put(b, randn(C * 4, 0.5f)),
           conv_state = put(b, randn(3 * C));
    const double conv = time_graph(
        [&] {
          for (int i = 0; i < 10; ++i) b.causal_conv_silu(in.rows(n, C, in_w), wconv.f(), 4, conv_state.f(), nullptr, y.rows(n, C));
        },
        10);
    Tensor g = put(b, randn(n * F)), u = put(b, randn(n * F)), sw = poison(b, n * F);
    const double swiglu = time_graph([&] { for (int i = 0; i < 10; ++i) b.swiglu(g.rows(n, F), u.rows(n, F), sw.rows(n, F)); }, 10);
    Tensor x = put(b, randn(n * E)), delta = put(b, randn(n * E)), nw = put(b, randn(E)), h = poison(b, n * E);
    const double add_norm = time_graph(
        [&] { for (int i = 0; i < 10; ++i) b.add_rms_norm(x.rows(n, E), delta.rows(n, E), nw.f(), E, 1e-6f, h.rows(n, E)); }, 10);
    std::printf("BENCH prompt ops n=%-3ld conv %7.2f us (%4.0f GB/s)  swiglu %7.2f us (%4.0f GB/s)  add_rms_norm %7.2f us (%4.0f GB/s)\n",
                static_cast<long>(n), conv * 1e6, 8.0 * n * C / conv / 1e9, swiglu * 1e6, 12.0 * n * F / swiglu / 1e9,
                add_norm * 1e6, 16.0 * n * E / add_norm / 1e9);
  }
  Tensor state = put(b, randn(int64_t{nv} * d * d, 0.1f)), ssm_a = put(b, std::vector<float>(nv, -1.0f)),
         dt = put(b, randn(nv));
  // Decode and verify widths, then prompt steps: the recurrent kernel (no capture, every state captured,
  // and the verify steps' default, each token's update recorded) up to 128 tokens, and from 64 tokens on
  // the chunked kernels against it (chunked = true, no capture). HYSPEC_BENCH_GDN_N and
  // HYSPEC_BENCH_GDN_MODE pick one width and one capture mode (ncu).
  const char* only_gdn_n = std::getenv("HYSPEC_BENCH_GDN_N");
  const char* only_gdn_mode = std::getenv("HYSPEC_BENCH_GDN_MODE");
  for (int64_t n : {1, 8, 16, 64, 128, 256, 512}) {
    if (only_gdn_n && std::atoll(only_gdn_n) != n) continue;
    Tensor qkv = put(b, randn(n * (2 * nk + nv) * d)), ba = put(b, randn(n * 2 * nv)), out = poison(b, n * nv * d);
    Tensor cap = poison(b, n <= 128 ? n * nv * d * d : 1), upd = poison(b, n * gdn_update_floats(nk, nv, d));
    GdnArgs g;
    Rows X = qkv.rows(n, (2 * nk + nv) * d);
    g.q = X.cols(0, nk * d);
    g.k = X.cols(nk * d, nk * d);
    g.v = X.cols(2 * nk * d, nv * d);
    g.beta_logit = ba.rows(n, nv, 2 * nv);
    g.alpha = ba.rows(n, nv, 2 * nv).cols(0, nv);
    g.alpha.data += nv;
    g.ssm_a = ssm_a.f();
    g.dt_bias = dt.f();
    g.n_k_heads = nk;
    g.n_v_heads = nv;
    g.head_dim = d;
    g.state = state.f();
    g.out = out.rows(n, nv * d);
    double recurrent = 0;
    for (const char* mode : {"none", "states", "updates"}) {
      const bool states = mode[0] == 's', updates = mode[0] == 'u';
      if (((states || updates) && n > 128) || (only_gdn_mode && std::string(only_gdn_mode) != mode)) continue;
      g.capture = states ? cap.f() : nullptr;
      g.updates = updates ? upd.f() : nullptr;
      const double s = time_graph([&] { for (int i = 0; i < 10; ++i) b.gated_delta_net(g); }, 10);
      const double bytes = (updates ? 1.0 : 2.0) * nv * d * d * 4 + (states ? double(n) * nv * d * d * 4 : 0.0);
      std::printf("BENCH gdn n=%-3ld capture=%-7s %8.2f us %6.0f GB/s\n", static_cast<long>(n), mode, s * 1e6,
                  bytes / s / 1e9);
      if (!states && !updates) recurrent = s;
    }
    if (n >= 64) {
      g.capture = g.updates = nullptr;
      g.chunked = true;
      const double s = time_graph([&] { for (int i = 0; i < 10; ++i) b.gated_delta_net(g); }, 10);
      std::printf("BENCH gdn n=%-3ld chunked   %8.2f us (recurrent %.2f us: %.2fx)\n", static_cast<long>(n), s * 1e6,
                  recurrent * 1e6, recurrent / s);
    }
  }
}

}  // namespace
}  // namespace hyspec
