#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

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

// Ops have run by the time they return: the bytes are plain host memory, marks wait for nothing.
class CpuReadback final : public Readback {
 public:
  explicit CpuReadback(size_t max_bytes) : bytes_(max_bytes) {}
  void* target() override { return bytes_.data(); }
  void mark() override {}
  Status finish(void* dst, size_t bytes) override {
    if (bytes > bytes_.size()) return Status::errorf("read-back of {} bytes from {}", bytes, bytes_.size());
    std::memcpy(dst, bytes_.data(), bytes);
    return Status::ok();
  }
  void put(const void* src, size_t bytes, size_t offset) override {
    if (offset < bytes_.size()) std::memcpy(bytes_.data() + offset, src, std::min(bytes, bytes_.size() - offset));
  }

 private:
  std::vector<unsigned char> bytes_;
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
  Result<std::unique_ptr<Readback>> new_readback(size_t max_bytes) override {
    return std::unique_ptr<Readback>(new CpuReadback(max_bytes));
  }

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
    Weight w = Weight::f32_shape(name, n_in, n_out);
    HS_ASSIGN_OR_RETURN(Buffer b, alloc(w.row_bytes * static_cast<size_t>(n_out)));
    std::memcpy(b.data(), data, w.row_bytes * static_cast<size_t>(n_out));
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
    cpu::rms_norm(pool_, x, w, group, eps, y);
  }
  void gated_rms_norm(Rows x, Rows z, const float* w, int64_t group, float eps, Rows y) override {
    cpu::gated_rms_norm(pool_, x, z, w, group, eps, y);
  }
  void add(Rows a, Rows b, Rows y) override { cpu::add(pool_, a, b, y); }
  void add_rms_norm(Rows x, Rows delta, const float* w, int64_t group, float eps, Rows h) override {
    cpu::add_rms_norm(pool_, x, delta, w, group, eps, h);
  }
  void swiglu(Rows gate, Rows up, Rows y) override { cpu::swiglu(pool_, gate, up, y); }
  void sigmoid_mul(Rows x, Rows gate, Rows y) override { cpu::sigmoid_mul(pool_, x, gate, y); }
  void add_sigmoid_scaled(Rows x, Rows g, Rows y) override { cpu::add_sigmoid_scaled(pool_, x, g, y); }
  void copy_rows(Rows src, Rows dst) override {
    for (int64_t r = 0; r < src.n_rows; ++r)
      std::memmove(dst.row(r), src.row(r), static_cast<size_t>(src.n_cols) * sizeof(float));
  }

  void rope_neox(Rows x, int head_dim, int n_rot, const int32_t* positions, float freq_base) override {
    cpu::rope_neox(x, head_dim, n_rot, positions, freq_base);
  }

  void kv_store(Rows k, Rows v, KvLayer kv, const int32_t* positions) override { cpu::kv_store(k, v, kv, positions); }
  void attention(const AttentionArgs& a) override { cpu::attention(pool_, a); }
  void causal_conv_silu(Rows x, const float* weight, int kernel, float* conv_state, float* capture, Rows y) override {
    cpu::causal_conv_silu(pool_, x, weight, kernel, conv_state, capture, y);
  }
  void gated_delta_net(const GdnArgs& a) override {
    if (!a.capture_f16) return cpu::gated_delta_net(pool_, a);
    // F16 capture: the f32 states into a scratch copy, then rounded (the kernels write f32 rows).
    const size_t count = static_cast<size_t>(a.q.n_rows) * a.n_v_heads * a.head_dim * a.head_dim;
    capture_scratch_.resize(count);
    GdnArgs f = a;
    f.capture = capture_scratch_.data();
    f.capture_f16 = nullptr;
    cpu::gated_delta_net(pool_, f);
    pool_.parallel_for(static_cast<int64_t>(count), [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) a.capture_f16[i] = fp32_to_fp16(capture_scratch_[i]);
    }, 4096);
  }
  void gdn_replay(const GdnReplayPart* parts, size_t count, int64_t n_tokens, int n_k_heads, int n_v_heads,
                  int head_dim) override {
    cpu::gdn_replay(pool_, parts, count, n_tokens, n_k_heads, n_v_heads, head_dim);
  }
  void f16_to_f32(const uint16_t* src, float* dst, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(src[i]);
  }
  void moe_ffn(const MoeArgs& a) override { cpu::moe_ffn(pool_, a); }

  void argmax(Rows x, int32_t* out) override { cpu::argmax(pool_, x, out); }
  void feed_token(const int32_t* token, int32_t* tokens, int32_t* positions, int32_t* position_counter) override {
    tokens[0] = *token;
    positions[0] = ++*position_counter;
  }

  void copy_row_to_ring(Rows src, float* ring, int64_t ring_rows, const int32_t* position) override {
    const int64_t slot = ((*position % ring_rows) + ring_rows) % ring_rows;
    std::memcpy(ring + slot * src.n_cols, src.data, static_cast<size_t>(src.n_cols) * sizeof(float));
  }
  void logit_summary(Rows x, float inv_t, float* out) override { cpu::logit_summary(pool_, x, inv_t, out); }
  void draw_token(Rows x, TokenDraw* draw) override { cpu::draw_token(pool_, x, draw); }
  void draw_top_k(Rows x, TokenDraw* draw) override { cpu::draw_top_k(pool_, x, draw); }
  void select_logits(Rows x, int64_t row, float threshold, int32_t cap, int32_t* count,
                     SelectedLogit* picked) override {
    cpu::select_logits(x, row, threshold, cap, count, picked);
  }

  Result<std::unique_ptr<StepGraph>> capture(std::function<void()> step) override {
    // Like a CUDA capture, recording does not run the step; replay() does.
    return std::unique_ptr<StepGraph>(new CpuGraph(std::move(step)));
  }

 private:
  ThreadPool pool_;
  bool exact_;
  std::vector<float> capture_scratch_;  // F16 GDN capture: the f32 states before rounding
};

}  // namespace

Result<std::unique_ptr<Backend>> create_cpu_backend(const BackendOptions& options) {
  return std::unique_ptr<Backend>(new CpuBackend(options.n_threads, options.exact_activations));
}

}  // namespace hyspec
