#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/quant_dot.h"
#include "format/quants.h"
#include "util/half.h"

namespace hyspec {
namespace cpu {

float* scratch_floats(size_t n, int slot) {
  thread_local std::vector<float> buffers[4];
  std::vector<float>& b = buffers[slot];
  if (b.size() < n) b.resize(n);
  return b.data();
}

}  // namespace cpu

namespace {

using cpu::sigmoid;
using cpu::silu;

// Elementwise ops on tiny rows are cheaper than a thread hand-off; split only big ones.
constexpr int64_t kParallelElements = 1 << 15;

class CpuGraph final : public StepGraph {
 public:
  explicit CpuGraph(std::function<void()> step) : step_(std::move(step)) {}
  Status replay() override {
    step_();
    return Status::ok();
  }

 private:
  std::function<void()> step_;
};

class CpuBackend final : public Backend {
 public:
  CpuBackend(int n_threads, bool exact) : pool_(n_threads), exact_(exact) {}

  BackendKind kind() const override { return BackendKind::Cpu; }
  std::string name() const override {
    return fmt::format("cpu ({} threads, {})", pool_.size(), cpu::vec_dot_isa());
  }

  Result<Buffer> alloc(size_t bytes) override {
    void* p = std::aligned_alloc(64, std::max<size_t>(64, (bytes + 63) / 64 * 64));
    if (!p) return Status::errorf("out of host memory allocating {} bytes", bytes);
    Buffer b;
    b.holder = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
    b.size = bytes;
    return b;
  }
  void upload(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void download(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override { std::memmove(dst, src, bytes); }
  void fill_zero(void* dst, size_t bytes) override { std::memset(dst, 0, bytes); }
  Status synchronize() override { return Status::ok(); }

  Result<Weight> load_weight(const GgufTensorInfo& t, bool dequantize_to_f32) override {
    HS_ASSIGN_OR_RETURN(Weight w, weight_geometry(t));
    if (!cpu::vec_dot_supported(t.type) && t.type != GgmlType::F32)
      return Status::errorf("tensor '{}': GGML type {} is not supported for weights", t.name, ggml_type_name(t.type));
    w.data = t.data;
    w.exact = exact_;
    if (dequantize_to_f32 && t.type != GgmlType::F32) {
      const int64_t rows = w.n_out * w.n_expert;
      HS_ASSIGN_OR_RETURN(Buffer b, alloc(static_cast<size_t>(rows * w.n_in) * sizeof(float)));
      for (int64_t r = 0; r < rows; ++r)
        HS_RETURN_IF_ERROR(dequantize_row(t.type, t.data + r * w.row_bytes, b.as<float>() + r * w.n_in, w.n_in)
                               .with_context("tensor '" + t.name + "'"));
      w.type = GgmlType::F32;
      w.row_bytes = static_cast<size_t>(w.n_in) * sizeof(float);
      w.data = b.data();
      w.owner = b.holder;
    }
    return w;
  }

  Result<Weight> weight_from_f32(const std::string& name, const float* data, int64_t n_in, int64_t n_out) override {
    HS_ASSIGN_OR_RETURN(Buffer b, alloc(static_cast<size_t>(n_in * n_out) * sizeof(float)));
    std::memcpy(b.data(), data, static_cast<size_t>(n_in * n_out) * sizeof(float));
    Weight w;
    w.name = name;
    w.type = GgmlType::F32;
    w.n_in = n_in;
    w.n_out = n_out;
    w.row_bytes = static_cast<size_t>(n_in) * sizeof(float);
    w.data = b.data();
    w.owner = b.holder;
    return w;
  }

  void embed(const Weight& table, const int32_t* tokens, int64_t n, Rows out) override {
    for (int64_t t = 0; t < n; ++t) {
      const int32_t id = tokens[t];
      if (id < 0 || id >= table.n_out) {  // the engine validates ids; never read out of bounds
        std::fill_n(out.row(t), out.n_cols, 0.0f);
        continue;
      }
      const auto* row = static_cast<const uint8_t*>(table.data) + static_cast<size_t>(id) * table.row_bytes;
      (void)dequantize_row(table.type, row, out.row(t), table.n_in);
    }
  }

  void matmul(const Weight& w, Rows x, Rows y) override { cpu::matmul(pool_, w, x, y); }

  void rms_norm(Rows x, const float* w, int64_t group, float eps, Rows y) override {
    for_rows(x.n_rows, x.n_cols, [&](int64_t r) {
      const float* xr = x.row(r);
      float* yr = y.row(r);
      for (int64_t g0 = 0; g0 < x.n_cols; g0 += group) {
        double ss = 0;
        for (int64_t i = 0; i < group; ++i) ss += static_cast<double>(xr[g0 + i]) * xr[g0 + i];
        const float inv = static_cast<float>(1.0 / std::sqrt(ss / group + eps));
        for (int64_t i = 0; i < group; ++i) yr[g0 + i] = xr[g0 + i] * inv * (w ? w[i] : 1.0f);
      }
    });
  }

  void gated_rms_norm(Rows x, Rows z, const float* w, int64_t group, float eps, Rows y) override {
    for_rows(x.n_rows, x.n_cols, [&](int64_t r) {
      const float* xr = x.row(r);
      const float* zr = z.row(r);
      float* yr = y.row(r);
      for (int64_t g0 = 0; g0 < x.n_cols; g0 += group) {
        double ss = 0;
        for (int64_t i = 0; i < group; ++i) ss += static_cast<double>(xr[g0 + i]) * xr[g0 + i];
        const float inv = static_cast<float>(1.0 / std::sqrt(ss / group + eps));
        for (int64_t i = 0; i < group; ++i) yr[g0 + i] = xr[g0 + i] * inv * w[i] * silu(zr[g0 + i]);
      }
    });
  }

  void add(Rows a, Rows b, Rows y) override {
    for_rows(a.n_rows, a.n_cols, [&](int64_t r) {
      const float *ar = a.row(r), *br = b.row(r);
      float* yr = y.row(r);
      for (int64_t i = 0; i < a.n_cols; ++i) yr[i] = ar[i] + br[i];
    });
  }
  void swiglu(Rows gate, Rows up, Rows y) override {
    for_rows(gate.n_rows, gate.n_cols, [&](int64_t r) {
      const float *g = gate.row(r), *u = up.row(r);
      float* yr = y.row(r);
      for (int64_t i = 0; i < gate.n_cols; ++i) yr[i] = silu(g[i]) * u[i];
    });
  }
  void sigmoid_mul(Rows x, Rows gate, Rows y) override {
    for_rows(x.n_rows, x.n_cols, [&](int64_t r) {
      const float *xr = x.row(r), *g = gate.row(r);
      float* yr = y.row(r);
      for (int64_t i = 0; i < x.n_cols; ++i) yr[i] = xr[i] * sigmoid(g[i]);
    });
  }
  void add_sigmoid_scaled(Rows x, Rows g, Rows y) override {
    for_rows(x.n_rows, x.n_cols, [&](int64_t r) {
      const float s = sigmoid(g.row(r)[0]);
      const float* xr = x.row(r);
      float* yr = y.row(r);
      for (int64_t i = 0; i < x.n_cols; ++i) yr[i] += s * xr[i];
    });
  }
  void copy_rows(Rows src, Rows dst) override {
    for (int64_t r = 0; r < src.n_rows; ++r)
      std::memmove(dst.row(r), src.row(r), static_cast<size_t>(src.n_cols) * sizeof(float));
  }

  void rope_neox(Rows x, int head_dim, int n_rot, const int32_t* positions, float freq_base) override {
    const int half = n_rot / 2;
    std::vector<float> inv_freq(half);
    for (int i = 0; i < half; ++i)
      inv_freq[i] = static_cast<float>(std::pow(static_cast<double>(freq_base), -2.0 * i / n_rot));
    const int64_t n_heads = x.n_cols / head_dim;
    for (int64_t r = 0; r < x.n_rows; ++r) {
      const double pos = positions[r];
      for (int i = 0; i < half; ++i) {
        const double theta = pos * inv_freq[i];
        const float c = static_cast<float>(std::cos(theta)), s = static_cast<float>(std::sin(theta));
        for (int64_t h = 0; h < n_heads; ++h) {
          float* v = x.row(r) + h * head_dim;
          const float x0 = v[i], x1 = v[i + half];
          v[i] = x0 * c - x1 * s;
          v[i + half] = x0 * s + x1 * c;
        }
      }
    }
  }

  void kv_store(Rows k, Rows v, KvLayer kv, const int32_t* positions) override { cpu::kv_store(k, v, kv, positions); }
  void attention(const AttentionArgs& a) override { cpu::attention(pool_, a); }
  void causal_conv_silu(Rows x, const float* weight, int kernel, float* conv_state, float* capture, Rows y) override {
    cpu::causal_conv_silu(pool_, x, weight, kernel, conv_state, capture, y);
  }
  void gated_delta_net(const GdnArgs& a) override { cpu::gated_delta_net(pool_, a); }
  void moe_ffn(const MoeArgs& a) override { cpu::moe_ffn(pool_, a); }

  void argmax(Rows x, int32_t* out) override {
    for (int64_t r = 0; r < x.n_rows; ++r) {
      const float* xr = x.row(r);
      out[r] = static_cast<int32_t>(std::max_element(xr, xr + x.n_cols) - xr);
    }
  }

  Result<std::unique_ptr<StepGraph>> capture(std::function<void()> step) override {
    // Like a CUDA capture, recording does not run the step; replay() does.
    return std::unique_ptr<StepGraph>(new CpuGraph(std::move(step)));
  }

 private:
  template <typename Fn>
  void for_rows(int64_t n_rows, int64_t n_cols, Fn&& fn) {
    if (n_rows * n_cols < kParallelElements || n_rows < 2) {
      for (int64_t r = 0; r < n_rows; ++r) fn(r);
      return;
    }
    pool_.parallel_for(n_rows, [&](int64_t b, int64_t e, int) {
      for (int64_t r = b; r < e; ++r) fn(r);
    });
  }

  ThreadPool pool_;
  bool exact_;
};

}  // namespace

Result<std::unique_ptr<Backend>> create_cpu_backend(const BackendOptions& options) {
  return std::unique_ptr<Backend>(new CpuBackend(options.n_threads, options.exact_activations));
}

}  // namespace hyspec
