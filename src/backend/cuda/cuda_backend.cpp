// The CUDA backend: argument checks, memory, scratch arenas, graph capture and error recording
// around the kernel launchers of kernels.h. Every op is enqueued on one non-blocking stream.
//
// Errors: ops return void, so the first failure (a CUDA call, an unsupported type or shape) is kept
// as a Status and returned, then cleared, by the next synchronize(); download() and graph replay
// report through it too. Nothing aborts.
//
// Scratch: two arenas (one private to matmul, one for the intermediates of attention, GDN and MoE)
// that grow on demand, also while capturing (relaxed capture mode). A grown arena never frees its
// old buffer before the backend dies, because a captured graph may still point at it.
#include "backend/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "backend/cuda/kernels.h"
#include "backend/cuda/launch_util.h"
#include "backend/cuda/op_profiler.h"
#include "format/quants.h"

namespace hyspec {
namespace {

using cuda::Mat;

constexpr size_t kCublasWorkspace = size_t(32) << 20;
// MoE steps of at least this many tokens take the grouped expert path (HYSPEC_MOE_GROUPED_MIN overrides;
// 0 turns it off). Two: verify steps too, whose rows must match decode steps bit for bit (they do: the
// grouped matmul decodes and sums like the per-slot one).
int moe_grouped_min_tokens() {
  static const int v = cuda::env_int("HYSPEC_MOE_GROUPED_MIN", 2);
  return v;
}
// Steps of at least this many tokens (and at most kInt8ExpertsMaxTokens) serve an expert's int8 slots
// two at a time (int8_experts_launch's pairs); 0: never. HYSPEC_MOE_PAIRS_MIN. From 10 tokens: at 16-17
// (the engine's verify widths) pairs gained 12% where tokens share experts, and under uniform routing
// lost 2% at 16 and gained 12% at 17; at 2-9 they gained 0-2.5% there and lost 2-6% here
// (PERFORMANCE.md session 30).
int moe_pairs_min_tokens() {
  static const int v = cuda::env_int("HYSPEC_MOE_PAIRS_MIN", 10);
  return v;
}

Mat mat(const Rows& r) { return Mat{r.data, r.n_rows, r.n_cols, r.stride}; }

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

class CudaBackend;

class CudaGraph final : public StepGraph {
 public:
  CudaGraph(CudaBackend* backend, cudaGraphExec_t exec) : backend_(backend), exec_(exec) {}
  ~CudaGraph() override { cudaGraphExecDestroy(exec_); }
  Status replay() override;

 private:
  CudaBackend* backend_;  // the graph must not outlive its backend
  cudaGraphExec_t exec_;
};

// Page-locked host bytes mapped into the device's address space (kernels write them over the bus, no
// copy engine) and an event: finish() waits for the last mark alone, not for the stream.
class CudaReadback final : public Readback {
 public:
  CudaReadback(CudaBackend* backend, void* host, void* device, size_t max_bytes, cudaEvent_t marked)
      : backend_(backend), host_(host), device_(device), max_bytes_(max_bytes), marked_(marked) {}
  ~CudaReadback() override {
    cudaEventSynchronize(marked_);
    cudaEventDestroy(marked_);
    cudaFreeHost(host_);
  }
  void* target() override { return device_; }
  void mark() override;
  Status finish(void* dst, size_t bytes) override;
  void put(const void* src, size_t bytes, size_t offset) override {
    if (offset < max_bytes_) std::memcpy(static_cast<char*>(host_) + offset, src, std::min(bytes, max_bytes_ - offset));
  }

 private:
  CudaBackend* backend_;  // must not outlive its backend
  void* host_;
  void* device_;
  size_t max_bytes_;
  cudaEvent_t marked_;
};

class CudaBackend final : public Backend {
 public:
  static Result<std::unique_ptr<Backend>> create(const BackendOptions& options) {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
      cudaGetLastError();
      return Status::errorf("no CUDA device ({})", e != cudaSuccess ? cudaGetErrorString(e) : "device count is 0");
    }
    if (options.device < 0 || options.device >= count)
      return Status::errorf("CUDA device {} does not exist ({} present)", options.device, count);
    std::unique_ptr<CudaBackend> b(new CudaBackend(options.device, options.int8_matvec));
    HS_RETURN_IF_ERROR(b->init());
    return std::unique_ptr<Backend>(std::move(b));
  }

  ~CudaBackend() override {
#ifdef HYSPEC_ATTN_TRACE
    if (std::getenv("HYSPEC_ATTN_TRACE")) cuda::attention_trace_report("the last attention launch");
#endif
#ifdef HYSPEC_GDN_TRACE
    if (std::getenv("HYSPEC_GDN_TRACE")) cuda::gdn_trace_report("the last GDN recurrence launch");
#endif
#ifdef HYSPEC_STEP_TRACE
    cuda::step_trace_report(step_trace_, cuda::env_int("HYSPEC_STEP_TRACE_STEPS", 1));
    if (step_trace_) cuda::draw_trace_report();  // elementwise.cu: the look-ahead draw kernels' timelines
    if (step_trace_) cudaFree(step_trace_);
#endif
    settle_hook_.reset();  // (what is deferred is dropped: no one can read its results any more)
    if (on_side_) end_side();
    if (stream_) cudaStreamSynchronize(stream_);
    if (side_stream_) cudaStreamSynchronize(side_stream_);
    profiler_.reset();  // prints its table (HYSPEC_CUDA_PROFILE)
    if (cublas_) cublasDestroy(cublas_);
    for (void* p : owned_) cudaFree(p);
    if (stream_) cudaStreamDestroy(stream_);
    if (side_stream_) cudaStreamDestroy(side_stream_);
    for (cudaEvent_t e : {side_fork_, side_done_})
      if (e) cudaEventDestroy(e);
  }

  BackendKind kind() const override { return BackendKind::Cuda; }
  std::string name() const override { return name_; }

  // ---- memory ----
  Result<Buffer> alloc(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 1));
    if (e != cudaSuccess) {
      cudaGetLastError();
      return Status::errorf("cudaMalloc of {} bytes failed: {}", bytes, cudaGetErrorString(e));
    }
    Buffer b;
    b.holder = std::shared_ptr<void>(p, freeing());
    b.size = bytes;
    return b;
  }
  void upload(void* dst, const void* src, size_t bytes) override {
    settle();
    forget_quantized();
    if (!not_capturing("upload")) return;
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "upload");
  }
  void download(void* dst, const void* src, size_t bytes) override {
    if (!not_capturing("download")) return;
    settle();
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "download");
    check(cudaStreamSynchronize(stream_), "download");
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    settle();
    forget_quantized();
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "copy");
  }
  void copy_many(const CopyPart* parts, size_t count) override {
    auto prof = begin_op("copy_many");
    forget_quantized();
    cuda::CopyList list;
    auto flush = [&] {
      check(cuda::copy_many_launch(list, stream_), "copy_many");
      list.count = 0;
    };
    for (size_t i = 0; i < count; ++i) {
      const CopyPart& c = parts[i];
      if (c.bytes == 0) continue;
      if (!cuda::copy_many_supported(c.dst, c.src, c.bytes)) {
        check(cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyDeviceToDevice, stream_), "copy_many");
        continue;
      }
      list.dst[list.count] = c.dst, list.src[list.count] = c.src, list.bytes[list.count] = c.bytes;
      if (++list.count == cuda::kCopyParts) flush();
    }
    if (list.count > 0) flush();
  }
  void gdn_replay(const GdnReplayPart* parts, size_t count, int64_t n_tokens, int n_k_heads, int n_v_heads,
                  int head_dim) override {
    auto prof = begin_op("gdn_replay");
    forget_quantized();
    if (!expect(cuda::gdn_head_dim_supported(head_dim) && n_k_heads > 0 && n_v_heads > 0,
                "gdn_replay: head_dim {} (16..512, a power of 2), {} k-heads, {} v-heads", head_dim, n_k_heads,
                n_v_heads))
      return;
    const int64_t stride = gdn_update_floats(n_k_heads, n_v_heads, head_dim);
    cuda::GdnReplayList list;
    for (size_t i = 0; i < count; ++i) {
      if (!expect(aligned16(parts[i].state) && aligned16(parts[i].updates),
                  "gdn_replay: buffers must be 16-byte aligned"))
        return;
      list.state[list.count] = parts[i].state, list.updates[list.count] = parts[i].updates;
      if (++list.count == cuda::kGdnReplayParts || i + 1 == count) {
        check(cuda::gdn_replay_launch(list, n_tokens, n_k_heads, n_v_heads, head_dim, stride, stream_), "gdn_replay");
        list.count = 0;
      }
    }
  }
  void fill_zero(void* dst, size_t bytes) override {
    settle();
    forget_quantized();
    check(cudaMemsetAsync(dst, 0, bytes, stream_), "fill_zero");
  }
  bool asynchronous() const override { return true; }
  Result<std::unique_ptr<Readback>> new_readback(size_t max_bytes) override {
    void* host = nullptr;
    void* device = nullptr;
    cudaError_t e = cudaHostAlloc(&host, std::max<size_t>(max_bytes, 1), cudaHostAllocMapped);
    if (e == cudaSuccess) e = cudaHostGetDevicePointer(&device, host, 0);
    cudaEvent_t marked = nullptr;
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&marked, cudaEventDisableTiming);
    if (e != cudaSuccess) {
      cudaGetLastError();
      if (host) cudaFreeHost(host);
      return Status::errorf("read-back of {} bytes: {}", max_bytes, cudaGetErrorString(e));
    }
    std::memset(host, 0, max_bytes);
    return std::unique_ptr<Readback>(new CudaReadback(this, host, device, max_bytes, marked));
  }
  // CudaReadback's halves.
  void readback_mark(cudaEvent_t marked) {
    if (!not_capturing("read-back mark")) return;
    join_side();  // (which launches what is deferred)
    check(cudaEventRecord(marked, stream_), "read-back mark");
  }
  Status readback_finish(cudaEvent_t marked) {
    check(cudaEventSynchronize(marked), "read-back");
    Status s = error_;
    error_ = Status::ok();
    return s;
  }

  Status synchronize() override {
    join_side();  // (which launches what is deferred)
    if (!capturing_) check(cudaStreamSynchronize(stream_), "synchronize");
    if (profiler_ && !capturing_) profiler_->resolve();
    Status s = error_;
    error_ = Status::ok();
    return s;
  }

  // ---- weights ----
  Result<Weight> load_weight(const GgufTensorInfo& t, bool dequantize_to_f32) override {
    HS_ASSIGN_OR_RETURN(Weight w, weight_geometry(t));
    const int64_t rows = w.n_out * w.n_expert;
    if (dequantize_to_f32 && t.type != GgmlType::F32) {
      std::vector<float> host(static_cast<size_t>(rows * w.n_in));
      for (int64_t r = 0; r < rows; ++r)
        HS_RETURN_IF_ERROR(dequantize_row(t.type, t.data + r * w.row_bytes, host.data() + r * w.n_in, w.n_in)
                               .with_context("tensor '" + t.name + "'"));
      w.type = GgmlType::F32;
      w.row_bytes = static_cast<size_t>(w.n_in) * sizeof(float);
      HS_ASSIGN_OR_RETURN(w.owner, upload_weight(host.data(), host.size() * sizeof(float), t.name));
    } else {
      if (!ggml_type_traits(t.type).dequantizable && t.type != GgmlType::F32)
        return Status::errorf("tensor '{}': GGML type {} is not supported for weights", t.name, ggml_type_name(t.type));
      if (t.type != GgmlType::F32 && !cuda::matmul_type_supported(t.type)) {
        HS_ASSIGN_OR_RETURN(std::vector<uint8_t> q8, requantize_q8_0(t, w));
        HS_ASSIGN_OR_RETURN(w.owner, upload_weight(q8.data(), q8.size(), t.name));
      } else {
        if (const cudaError_t e = cuda::prepare_weight_type(t.type); e != cudaSuccess)
          return Status::errorf("tensor '{}': preparing type {}: {}", t.name, ggml_type_name(t.type),
                                cudaGetErrorString(e));
        HS_ASSIGN_OR_RETURN(w.owner, upload_weight(t.data, w.row_bytes * rows, t.name));
      }
    }
    w.data = w.owner.get();
    return w;
  }

  // Types without CUDA kernels (Q2_K, Q3_K, Q4_1, Q5_0/1, IQ*, MXFP4) are dequantized on the host and
  // stored as Q8_0, which has them (8.5 bits per weight: 2-4x the memory of a 2-4 bit file; the
  // requantization adds ~0.2% rms of each 32-block's range, far below the source type's own error).
  // Rows are converted in parallel. Sets w's type and row bytes.
  static Result<std::vector<uint8_t>> requantize_q8_0(const GgufTensorInfo& t, Weight& w) {
    const int64_t rows = w.n_out * w.n_expert;
    if (w.n_in % 32 != 0)
      return Status::errorf("tensor '{}': {} rows of {} cannot be stored as Q8_0 on CUDA", t.name,
                            ggml_type_name(t.type), w.n_in);
    const size_t q8_row = static_cast<size_t>(w.n_in / 32) * 34;
    std::vector<uint8_t> out(q8_row * static_cast<size_t>(rows));
    const int n_threads = static_cast<int>(std::clamp<unsigned>(std::thread::hardware_concurrency(), 1u, 16u));
    std::vector<Status> status(static_cast<size_t>(n_threads));
    std::vector<std::thread> threads;
    for (int k = 0; k < n_threads; ++k)
      threads.emplace_back([&, k] {
        std::vector<float> row(static_cast<size_t>(w.n_in));
        for (int64_t r = k; r < rows && status[k].is_ok(); r += n_threads) {
          status[k] = dequantize_row(t.type, t.data + r * w.row_bytes, row.data(), w.n_in);
          if (status[k].is_ok()) status[k] = quantize_row(GgmlType::Q8_0, row.data(), out.data() + r * q8_row, w.n_in);
        }
      });
    for (auto& th : threads) th.join();
    for (const Status& st : status) HS_RETURN_IF_ERROR(st.with_context("tensor '" + t.name + "'"));
    w.type = GgmlType::Q8_0;
    w.row_bytes = q8_row;
    return out;
  }

  Result<Weight> weight_from_f32(const std::string& name, const float* data, int64_t n_in, int64_t n_out) override {
    Weight w = Weight::f32_shape(name, n_in, n_out);
    HS_ASSIGN_OR_RETURN(w.owner, upload_weight(data, w.row_bytes * n_out, name));
    w.data = w.owner.get();
    return w;
  }

  // ---- ops ----
  void embed(const Weight& table, const int32_t* tokens, int64_t n, Rows out) override {
    auto prof = begin_op("embed");
    if (!expect(cuda::matmul_type_supported(table.type), "embed '{}': type {} not supported on CUDA", table.name,
                ggml_type_name(table.type)) ||
        !expect(out.n_cols == table.n_in && out.n_rows >= n, "embed '{}': output [{}, {}] for {} tokens of width {}",
                table.name, out.n_rows, out.n_cols, n, table.n_in))
      return;
    check(cuda::embed_launch(view(table), tokens, Mat{out.data, n, out.n_cols, out.stride}, stream_), "embed");
  }

  void matmul(const Weight& w, Rows x, Rows y) override {
    if (fold_add_norm_one(w, x, y)) return;
    launch_gate_quantized(w, x);                         // (before begin_op, which would launch the op alone)
    const cuda::Int8XFold xfold = take_x_fold(w, x, y);  // (before begin_op, which would launch the op)
    auto prof = begin_op("matmul", &w, /*reads_only_x=*/true);
    if (!expect(w.present(), "matmul: weight '{}' is not loaded", w.name) ||
        !expect(cuda::matmul_type_supported(w.type), "matmul '{}': type {} not supported on CUDA", w.name,
                ggml_type_name(w.type)) ||
        !expect(x.n_cols == w.n_in && y.n_cols == w.n_out && x.n_rows == y.n_rows,
                "matmul '{}' [{} -> {}]: x [{}, {}], y [{}, {}]", w.name, w.n_in, w.n_out, x.n_rows, x.n_cols,
                y.n_rows, y.n_cols))
      return;
    const cuda::WeightView v = view(w);
    const bool folded = xfold.kind != cuda::Int8XFold::kNone;
    const DeferredMany m{{v}, {mat(y)}, 1, x, folded ? nullptr : quantized(x), xfold};
    matmul_wrote(y);
    wrote(y);
    if ((!folded || norm_folds_) && folds_ && cuda::int8_conv_fold_supported(v, x.n_rows)) {
      defer(m);  // (launched by the next op, which may be its conv or the add_rms_norm of its output)
    } else {
      launch_many(m, nullptr);
    }
  }

  void matmul_many(Rows x, const MatmulPart* parts, size_t n_parts) override {
    const int count = static_cast<int>(n_parts);
    if (n_parts >= 2 && n_parts <= static_cast<size_t>(cuda::kInt8MvMaxParts)) {
      cuda::WeightView v[cuda::kInt8MvMaxParts];
      cuda::Mat y[cuda::kInt8MvMaxParts];
      bool shapes = true;
      for (int i = 0; i < count; ++i) {
        const Weight& w = *parts[i].w;
        const Rows& yi = parts[i].y;
        shapes = shapes && w.present() && x.n_cols == w.n_in && yi.n_cols == w.n_out && yi.n_rows == x.n_rows;
        v[i] = view(w);
        y[i] = mat(yi);
      }
      if (shapes && fold_add_norm_many(v, parts, count, x)) return;
      if (deferred_norm_) settle();  // (its norm may quantize x, which the support check below asks about)
      if (shapes && cuda::int8_matvec_multi_supported(v, count, x.n_rows, quantized(x))) {
        auto prof = begin_op("matmul_many", parts[0].w, /*reads_only_x=*/true);
        DeferredMany m{{}, {}, count, x, quantized(x)};
        std::copy(v, v + count, m.w), std::copy(y, y + count, m.y);
        for (int i = 0; i < count; ++i) matmul_wrote(parts[i].y), wrote(parts[i].y);
        if (folds_ && cuda::int8_conv_fold_supported(v, count, x.n_rows, m.qx)) {
          defer(m);  // (launched by the next op, which may be its conv)
        } else {
          launch_many(m, nullptr);
        }
        return;
      }
    }
    Backend::matmul_many(x, parts, n_parts);  // one matmul each (and their shape errors)
  }

  bool matmul_swiglu(const Weight& gate, const Weight& up, Rows x, Rows y) override {
    const cuda::WeightView g = view(gate), u = view(up);
    if (!gate.present() || !up.present() || !cuda::matmul_swiglu_supported(g, u, x.n_rows)) return false;
    if (fold_add_norm(g, u, x, y)) return true;
    auto prof = begin_op("matmul_swiglu", &gate, /*reads_only_x=*/true);
    if (!expect(x.n_cols == gate.n_in && y.n_cols == gate.n_out && x.n_rows == y.n_rows,
                "matmul_swiglu '{}' [{} -> {}]: x [{}, {}], y [{}, {}]", gate.name, gate.n_in, gate.n_out, x.n_rows,
                x.n_cols, y.n_rows, y.n_cols))
      return true;
    void* s = arena(matmul_arena_, cuda::matmul_scratch_bytes(g, x.n_rows));
    if (!s) return true;
    check(cuda::matmul_swiglu_launch(g, u, mat(x), mat(y), {s, matmul_arena_.size}, stream_, quantized(x)),
          "matmul_swiglu");
    matmul_wrote(y);
    return true;
  }

  void rms_norm(Rows x, const float* w, int64_t group, float eps, Rows y) override {
    auto prof = begin_op("rms_norm");
    if (!expect(group > 0 && x.n_cols % group == 0 && same_shape(x, y), "rms_norm: group {} over [{}, {}] -> [{}, {}]",
                group, x.n_rows, x.n_cols, y.n_rows, y.n_cols))
      return;
    bool q = false;
    check(cuda::rms_norm_launch(mat(x), nullptr, 0, w, group, eps, mat(y), stream_, quantize_into(), &q), "rms_norm");
    norm_wrote(y, q);
  }
  void gated_rms_norm(Rows x, Rows z, const float* w, int64_t group, float eps, Rows y) override {
    if (group == cuda::kInt8XFoldGroup && w && same_shape(x, z) &&
        defer_x(DeferredX{cuda::Int8XFold::kGatedNorm, x, z, y, w, group, eps}))
      return;
    auto prof = begin_op("gated_rms_norm");
    if (!expect(group > 0 && x.n_cols % group == 0 && same_shape(x, y) && same_shape(x, z),
                "gated_rms_norm: group {} over [{}, {}]", group, x.n_rows, x.n_cols))
      return;
    bool q = false;
    check(cuda::rms_norm_launch(mat(x), z.data, z.stride, w, group, eps, mat(y), stream_, quantize_into(), &q),
          "gated_rms_norm");
    norm_wrote(y, q);
  }
  void add(Rows a, Rows b, Rows y) override { binary(cuda::Binary::Add, a, b, y, "add"); }
  void add_rms_norm(Rows x, Rows delta, const float* w, int64_t group, float eps, Rows h) override {
    if (defer_add_norm(DeferredNorm{x, delta, h, w, group, eps})) return;
    auto prof = begin_op("add_rms_norm");
    if (!expect(group > 0 && x.n_cols % group == 0 && same_shape(x, delta) && same_shape(x, h),
                "add_rms_norm: group {} over [{}, {}], delta [{}, {}] -> [{}, {}]", group, x.n_rows, x.n_cols,
                delta.n_rows, delta.n_cols, h.n_rows, h.n_cols))
      return;
    launch_add_norm(DeferredNorm{x, delta, h, w, group, eps});
  }
  void swiglu(Rows gate, Rows up, Rows y) override { binary(cuda::Binary::SwiGlu, gate, up, y, "swiglu"); }
  void sigmoid_mul(Rows x, Rows gate, Rows y) override {
    if (same_shape(x, gate) && defer_x(DeferredX{cuda::Int8XFold::kSigmoidGate, x, gate, y, nullptr, 0, 0.0f})) return;
    binary(cuda::Binary::SigmoidMul, x, gate, y, "sigmoid_mul");
  }
  void add_sigmoid_scaled(Rows x, Rows g, Rows y) override {
    auto prof = begin_op("add_sigmoid_scaled");
    if (!expect(same_shape(x, y) && g.n_rows == x.n_rows && g.n_cols >= 1, "add_sigmoid_scaled: shapes")) return;
    check(cuda::binary_launch(cuda::Binary::AddSigmoidScaled, mat(x), mat(g), mat(y), stream_), "add_sigmoid_scaled");
  }
  void f16_to_f32(const uint16_t* src, float* dst, int64_t n) override {
    auto prof = begin_op("f16_to_f32");
    check(cuda::f16_to_f32_launch(src, dst, n, stream_), "f16_to_f32");
  }
  void copy_rows(Rows src, Rows dst) override {
    auto prof = begin_op("copy_rows");
    if (!expect(same_shape(src, dst), "copy_rows: [{}, {}] -> [{}, {}]", src.n_rows, src.n_cols, dst.n_rows,
                dst.n_cols) ||
        src.n_rows == 0)
      return;
    check(cudaMemcpy2DAsync(dst.data, dst.stride * sizeof(float), src.data, src.stride * sizeof(float),
                            src.n_cols * sizeof(float), src.n_rows, cudaMemcpyDeviceToDevice, stream_),
          "copy_rows");
  }
  void rope_neox(Rows x, int head_dim, int n_rot, const int32_t* positions, float freq_base) override {
    auto prof = begin_op("rope_neox");
    if (!expect(head_dim > 0 && x.n_cols % head_dim == 0 && n_rot % 2 == 0 && n_rot <= head_dim,
                "rope_neox: head_dim {}, n_rot {}, {} columns", head_dim, n_rot, x.n_cols))
      return;
    check(cuda::rope_neox_launch(mat(x), head_dim, n_rot, positions, freq_base, stream_), "rope_neox");
  }
  void kv_store(Rows k, Rows v, KvLayer kv, const int32_t* positions) override {
    auto prof = begin_op("kv_store");
    if (!kv_cache_usable(kv, "kv_store") ||
        !expect(k.n_cols == kv.width && v.n_cols == kv.width && k.n_rows == v.n_rows, "kv_store: rows of {}/{} for width {}",
                k.n_cols, v.n_cols, kv.width))
      return;
    check(cuda::kv_store_launch(mat(k), mat(v), kv.k, kv.v, geometry(kv), positions, stream_), "kv_store");
  }

  void qk_norm_rope_store(const QkPrepArgs& a) override {
    const int64_t n = a.k.n_rows, D = a.head_dim;
    const bool contiguous = (!a.q.data || (a.q_in.stride == a.q_in.n_cols && a.q.stride == a.q.n_cols)) &&
                            a.k.stride == a.k.n_cols;
    if (!fused_ops_ || !cuda::qk_prep_supported(a.head_dim) || !contiguous) return Backend::qk_norm_rope_store(a);
    auto prof = begin_op("qk_norm_rope_store");
    if (!kv_cache_usable(a.kv, "qk_norm_rope_store") ||
        !expect(a.kv.head_dim == D, "qk_norm_rope_store: head_dim {}, the cache's {}", D, a.kv.head_dim) ||
        !expect(a.n_rot % 2 == 0 && a.n_rot <= a.head_dim, "qk_norm_rope_store: n_rot {} of head_dim {}", a.n_rot,
                a.head_dim) ||
        !expect(a.k.n_cols == a.n_kv_head * D && a.v.n_cols == a.kv.width && a.kv.width == a.k.n_cols &&
                    a.v.n_rows == n && (!a.q.data || (a.q.n_rows == n && a.q.n_cols == a.n_head * D &&
                                                     a.q_in.n_rows == n && a.q_pitch >= D &&
                                                     a.q_in.n_cols >= (a.n_head - 1) * a.q_pitch + D)),
                "qk_norm_rope_store: q [{}, {}], k [{}, {}], v [{}, {}] for {} + {} heads of {}", a.q.n_rows, a.q.n_cols,
                a.k.n_rows, a.k.n_cols, a.v.n_rows, a.v.n_cols, a.n_head, a.n_kv_head, D))
      return;
    cuda::QkPrepParams p{};
    p.q_in = mat(a.q_in);
    p.q_pitch = a.q_pitch;
    p.q = mat(a.q);
    p.k = mat(a.k);
    p.v = mat(a.v);
    p.q_norm = a.q_norm;
    p.k_norm = a.k_norm;
    p.n_head = a.q.data ? a.n_head : 0;
    p.n_kv_head = a.n_kv_head;
    p.head_dim = a.head_dim;
    p.n_rot = a.n_rot;
    p.eps = a.eps;
    p.freq_base = a.freq_base;
    p.positions = a.positions;
    p.kv = geometry(a.kv);
    check(cuda::qk_prep_launch(p, a.kv.k, a.kv.v, stream_), "qk_norm_rope_store");
  }

  void attention(const AttentionArgs& a) override {
    auto prof = begin_op("attention");
    const int64_t width = static_cast<int64_t>(a.n_head) * a.head_dim;
    if (!expect(cuda::attention_head_dim_supported(a.head_dim), "attention: head_dim {} (32, 64, 128 or 256)",
                a.head_dim) ||
        !expect(a.n_kv_head > 0 && a.n_head % a.n_kv_head == 0, "attention: {} heads over {} kv heads", a.n_head,
                a.n_kv_head) ||
        !kv_cache_usable(a.kv, "attention") ||
        !expect(a.n_kv_head <= cuda::kAttentionMaxKvHeads, "attention: {} kv heads (at most {})", a.n_kv_head,
                cuda::kAttentionMaxKvHeads) ||
        !expect(a.kv.width == static_cast<int64_t>(a.n_kv_head) * a.head_dim && a.kv.head_dim == a.head_dim,
                "attention: KV width {} (heads of {}) for {}x{}", a.kv.width, a.kv.head_dim, a.n_kv_head, a.head_dim) ||
        !expect(a.q.n_cols >= width && a.out.n_cols >= width && a.out.n_rows == a.q.n_rows,
                "attention: q [{}, {}], out [{}, {}] for {} heads of {}", a.q.n_rows, a.q.n_cols, a.out.n_rows,
                a.out.n_cols, a.n_head, a.head_dim) ||
        !expect(aligned16(a.q.data) && aligned16(a.out.data) && a.q.stride % 4 == 0 && a.out.stride % 4 == 0 &&
                    aligned16(a.kv.k) && aligned16(a.kv.v),
                "attention: q, out and the KV cache must be 16-byte aligned with strides a multiple of 4"))
      return;
    cuda::AttentionParams p;
    p.q = mat(a.q);
    p.out = mat(a.out);
    p.k = a.kv.k;
    p.v = a.kv.v;
    p.kv = geometry(a.kv);
    p.positions = a.positions;
    p.n_head = a.n_head;
    p.n_kv_head = a.n_kv_head;
    p.head_dim = a.head_dim;
    p.scale = a.scale;
    p.causal = a.causal;
    p.max_keys = a.max_keys;
    p.counters = attention_counters_;
    const int splits = cuda::attention_splits(p, n_sm_);
    float* scratch = nullptr;
    if (splits > 1 && !(scratch = static_cast<float*>(arena(op_arena_, cuda::attention_scratch_bytes(p, splits)))))
      return;
    check(cuda::attention_launch(p, splits, scratch, stream_), "attention");
    wrote(a.out);
  }

  void causal_conv_silu(Rows x, const float* weight, int kernel, float* conv_state, float* capture, Rows y) override {
    if (fold_conv(x, weight, kernel, conv_state, capture, y)) return;
    auto prof = begin_op("causal_conv_silu");
    if (!expect(kernel >= 1 && kernel <= 8 && same_shape(x, y), "causal_conv_silu: kernel {} (1..8), [{}, {}] -> [{}, {}]",
                kernel, x.n_rows, x.n_cols, y.n_rows, y.n_cols))
      return;
    check(cuda::causal_conv_silu_launch(mat(x), weight, kernel, conv_state, capture, mat(y), stream_),
          "causal_conv_silu");
  }

  void gated_delta_net(const GdnArgs& a) override {
    auto prof = begin_op("gated_delta_net");
    const int64_t n = a.q.n_rows;
    if (!expect(cuda::gdn_head_dim_supported(a.head_dim), "gated_delta_net: head_dim {} (16..512, a power of 2)",
                a.head_dim) ||
        !expect(a.n_k_heads > 0 && a.n_v_heads > 0 && a.k.n_rows == n && a.v.n_rows == n && a.out.n_rows == n &&
                    a.beta_logit.n_rows == n && a.alpha.n_rows == n,
                "gated_delta_net: inconsistent shapes") ||
        !expect((a.capture != nullptr) + (a.capture_f16 != nullptr) + (a.updates != nullptr) <= 1,
                "gated_delta_net: one capture buffer, F32, F16 or updates") ||
        !expect(aligned16(a.state) && aligned16(a.capture) && aligned16(a.capture_f16) && aligned16(a.updates) &&
                    aligned16(a.q.data) &&
                    aligned16(a.k.data) &&
                    a.q.stride % 4 == 0 && a.k.stride % 4 == 0,
                "gated_delta_net: state, capture, q and k rows must be 16-byte aligned"))
      return;
    cuda::GdnParams p;
    p.q = mat(a.q);
    p.k = mat(a.k);
    p.v = mat(a.v);
    p.beta_logit = mat(a.beta_logit);
    p.alpha = mat(a.alpha);
    p.out = mat(a.out);
    p.ssm_a = a.ssm_a;
    p.dt_bias = a.dt_bias;
    p.n_k_heads = a.n_k_heads;
    p.n_v_heads = a.n_v_heads;
    p.head_dim = a.head_dim;
    p.eps = a.eps;
    p.state = a.state;
    p.capture = a.capture;
    p.capture_f16 = a.capture_f16;
    p.updates = a.updates;
    p.update_stride = gdn_update_floats(a.n_k_heads, a.n_v_heads, a.head_dim);
    p.chunked = a.chunked;
    const size_t scratch_bytes = cuda::gdn_scratch_bytes(p);
    void* scratch = nullptr;
    if (scratch_bytes && !(scratch = arena(op_arena_, scratch_bytes))) return;
    check(cuda::gdn_launch(p, scratch, stream_), "gated_delta_net");
    if (!a.capture && !a.capture_f16 && !a.updates)
      wrote(a.out), wrote(a.state, sizeof(float) * a.n_v_heads * a.head_dim * a.head_dim);
  }

  // Router matmul -> softmax/top-k on the device -> the experts' gate and up rows -> swiglu -> down ->
  // weighted sum. One token, and with int8 experts (Q4_K/Q5_K/Q6_K) every step of up to
  // kInt8ExpertsMaxTokens: a matvec per (token, slot). Other steps of several tokens
  // (moe_grouped_min_tokens): grouped by expert on the device, a grouped matmul per projection (gate and
  // up fused).
  void moe_ffn(const MoeArgs& a) override {
    auto prof = begin_op("moe_ffn");
    const int64_t n = a.x.n_rows, hidden = a.x.n_cols;
    if (!expect(a.router && a.gate_exps && a.up_exps && a.down_exps, "moe_ffn: missing weights") ||
        !expect(a.top_k >= 1 && a.top_k <= 32 && a.top_k <= a.router->n_out, "moe_ffn: top_k {} of {} experts",
                a.top_k, a.router ? a.router->n_out : 0) ||
        !expect(a.router->n_in == hidden && a.gate_exps->n_in == hidden && a.up_exps->n_in == hidden &&
                    a.down_exps->n_out == hidden && a.down_exps->n_in == a.gate_exps->n_out &&
                    a.out.n_cols == hidden && a.out.n_rows == n &&
                    (!a.shared_gate || (a.shared_gate->n_in == hidden && a.shared_gate_out.n_rows == n &&
                                        a.shared_gate_out.n_cols == a.shared_gate->n_out)),
                "moe_ffn: inconsistent shapes") ||
        !expect(cuda::matmul_type_supported(a.gate_exps->type) && cuda::matmul_type_supported(a.up_exps->type) &&
                    cuda::matmul_type_supported(a.down_exps->type),
                "moe_ffn: expert types/widths not supported on CUDA"))
      return;
    if (n == 0) return;
    const int64_t E = a.router->n_out, k = a.top_k, nk = n * k, ffn = a.gate_exps->n_out;
    size_t off = 0;
    auto take = [&](size_t bytes) {
      const size_t at = off;
      off += cuda::align_up(bytes, 256);
      return at;
    };
    const cuda::WeightView gv = view(*a.gate_exps), uv = view(*a.up_exps), dv = view(*a.down_exps);
    // Steps of several tokens group the (token, slot) pairs by expert, so that an expert's weights are
    // read once per 16 of its rows, not once per row (a 512-token prompt chunk with 8 of 256 experts
    // per token: ~1 pass over all experts instead of 16); the rows' values are the same bits.
    // Steps of up to kInt8ExpertsMaxTokens (decode and verify) run a matvec per (token, slot) on the
    // int8 kernels where an expert type has them: each row then has the one-token bits at any width.
    const bool int8_slots = n <= cuda::kInt8ExpertsMaxTokens && (cuda::int8_experts_supported(gv) ||
                                                                 cuda::int8_experts_supported(uv) ||
                                                                 cuda::int8_experts_supported(dv));
    const bool grouped = !int8_slots && moe_grouped_min_tokens() > 0 && n >= moe_grouped_min_tokens() && E <= 8192 &&
                         cuda::matmul_grouped_supported(gv) && cuda::matmul_grouped_supported(uv) &&
                         cuda::matmul_grouped_supported(dv);
    const bool fused = cuda::matmul_swiglu_supported(gv, uv, 1);
    const size_t o_logits = take(n * E * 4), o_ids = take(nk * 4), o_w = take(nk * 4), o_g = take(nk * ffn * 4),
                 o_u = take(fused ? 0 : nk * ffn * 4), o_d = take(nk * hidden * 4),
                 o_off = take(grouped ? (E + 1) * 4 : 0), o_order = take(grouped ? nk * 4 : 0),
                 o_pos = take(grouped ? nk * 4 : 0), o_xs = take(grouped ? nk * hidden * 4 : 0);
    auto* base = static_cast<char*>(arena(op_arena_, off));
    if (!base) return;
    auto* logits = reinterpret_cast<float*>(base + o_logits);
    auto* ids = reinterpret_cast<int32_t*>(base + o_ids);
    auto* weights = reinterpret_cast<float*>(base + o_w);
    Mat g{reinterpret_cast<float*>(base + o_g), nk, ffn, ffn}, u{reinterpret_cast<float*>(base + o_u), nk, ffn, ffn},
        d{reinterpret_cast<float*>(base + o_d), nk, hidden, hidden};
    // The router and the shared expert's gate (short rows of one input) in one launch where both take
    // the exact f32 path; else a matmul each.
    const Rows router_out(logits, n, E);
    const cudaError_t pair = a.shared_gate ? cuda::matmul_exact_pair_launch(view(*a.router), mat(router_out),
                                                                             view(*a.shared_gate),
                                                                             mat(a.shared_gate_out), mat(a.x), stream_)
                                           : cudaErrorNotSupported;
    if (pair == cudaErrorNotSupported) {
      matmul(*a.router, a.x, router_out);
      if (a.shared_gate) matmul(*a.shared_gate, a.x, a.shared_gate_out);
    } else {
      check(pair, "moe_ffn router");
    }
    check(cuda::moe_route_launch(Mat{logits, n, E, E}, static_cast<int>(k), ids, weights, stream_), "moe_ffn route");
    // Verify steps pair an expert's slots (two tokens routed to one expert read its weights once).
    const bool pairs = moe_pairs_min_tokens() > 0 && n >= moe_pairs_min_tokens();
    if (grouped) {
      auto* offsets = reinterpret_cast<int32_t*>(base + o_off);
      auto* order = reinterpret_cast<int32_t*>(base + o_order);
      auto* pos = reinterpret_cast<int32_t*>(base + o_pos);
      const Mat xs{reinterpret_cast<float*>(base + o_xs), nk, hidden, hidden};
      void* s = arena(matmul_arena_, std::max(cuda::matmul_grouped_scratch_bytes(gv, nk),
                                              cuda::matmul_grouped_scratch_bytes(dv, nk)));
      if (!s) return;
      const int ne = static_cast<int>(E);
      check(cuda::moe_group_launch(ids, nk, ne, offsets, order, pos, stream_), "moe_ffn group");
      check(cuda::gather_rows_launch(mat(a.x), order, static_cast<int>(k), xs, stream_), "moe_ffn gather");
      if (fused) {
        check(cuda::matmul_grouped_launch(gv, uv.data, offsets, ne, xs, g, s, stream_), "moe_ffn gate+up");
      } else {
        check(cuda::matmul_grouped_launch(gv, nullptr, offsets, ne, xs, g, s, stream_), "moe_ffn gate");
        check(cuda::matmul_grouped_launch(uv, nullptr, offsets, ne, xs, u, s, stream_), "moe_ffn up");
        check(cuda::binary_launch(cuda::Binary::SwiGlu, g, u, g, stream_), "moe_ffn swiglu");
      }
      check(cuda::matmul_grouped_launch(dv, nullptr, offsets, ne, g, d, s, stream_), "moe_ffn down");
      check(cuda::moe_combine_launch(d, pos, weights, static_cast<int>(k), mat(a.out), stream_), "moe_ffn combine");
      return;
    }
    void* s = arena(matmul_arena_, std::max(cuda::matmul_experts_scratch_bytes(gv, n),
                                            cuda::matmul_experts_scratch_bytes(dv, nk)));
    if (!s) return;
    const cuda::MatmulScratch ms{s, matmul_arena_.size};
    auto experts = [&](const cuda::WeightView& w, const uint8_t* up, int x_div, Mat x, Mat y, const char* what) {
      check(int8_slots && cuda::int8_experts_supported(w)
                ? cuda::int8_experts_launch(w, up, E, ids, nk, x_div, x, y, stream_, pairs)
                : cuda::matmul_experts_launch(w, up, ids, nk, x_div, x, y, ms, stream_),
            what);
    };
    if (fused) {
      experts(gv, uv.data, static_cast<int>(k), mat(a.x), g, "moe_ffn gate+up");
    } else {
      experts(gv, nullptr, static_cast<int>(k), mat(a.x), g, "moe_ffn gate");
      experts(uv, nullptr, static_cast<int>(k), mat(a.x), u, "moe_ffn up");
      check(cuda::binary_launch(cuda::Binary::SwiGlu, g, u, g, stream_), "moe_ffn swiglu");
    }
    experts(dv, nullptr, 1, g, d, "moe_ffn down");
    check(cuda::moe_combine_launch(d, nullptr, weights, static_cast<int>(k), mat(a.out), stream_), "moe_ffn combine");
  }

  // The side line: a second stream forked from the main one by an event (a fork in a captured graph), with
  // its own scratch arenas and cuBLAS workspace, joined by another event.
  void begin_side() override {
    if (on_side_ || !side_stream_ || profiler_) return;  // (the op profiler times one stream)
    join_side();  // (which launches what is deferred)
    check(cudaEventRecord(side_fork_, stream_), "begin_side");
    check(cudaStreamWaitEvent(side_stream_, side_fork_), "begin_side");
    switch_line(true);
    on_side_ = true;
  }
  void end_side() override {
    if (!on_side_) return;
    settle();
    check(cudaEventRecord(side_done_, stream_), "end_side");
    switch_line(false);
    on_side_ = false;
    side_pending_ = true;
  }
  void join_side() override {
    settle();
    end_side();
    if (!side_pending_) return;
    check(cudaStreamWaitEvent(stream_, side_done_), "join_side");
    side_pending_ = false;
  }

  void argmax(Rows x, int32_t* out) override {
    auto prof = begin_op("argmax");
    if (!expect(x.n_cols > 0, "argmax: empty rows")) return;
    void* s = arena(op_arena_, cuda::argmax_scratch_bytes(x.n_rows, x.n_cols));
    if (!s) return;
    check(cuda::argmax_launch(mat(x), out, s, stream_), "argmax");
  }

  void feed_token(const int32_t* token, int32_t* tokens, int32_t* positions, int32_t* position_counter) override {
    auto prof = begin_op("feed_token");
    settle();
    forget_quantized();
    check(cuda::feed_token_launch(token, tokens, positions, position_counter, stream_), "feed_token");
  }

  void copy_row_to_ring(Rows src, float* ring, int64_t ring_rows, const int32_t* position) override {
    auto prof = begin_op("copy_row_to_ring");
    if (!expect(src.n_rows > 0 && ring_rows > 0, "copy_row_to_ring: empty")) return;
    check(cuda::copy_row_to_ring_launch(src.data, src.n_cols, ring, ring_rows, position, stream_), "copy_row_to_ring");
  }
  void logit_summary(Rows x, float inv_t, float* out) override {
    auto prof = begin_op("logit_summary");
    if (!expect(x.n_cols > 0, "logit_summary: empty rows")) return;
    void* s = arena(op_arena_, cuda::argmax_scratch_bytes(x.n_rows, x.n_cols));
    if (!s) return;
    check(cuda::logit_summary_launch(mat(x), inv_t, out, s, stream_), "logit_summary");
  }
  void draw_token(Rows x, TokenDraw* draw) override {
    auto prof = begin_op("draw_token");
    if (!expect(x.n_cols > 0 && x.n_rows > 0, "draw_token: empty rows")) return;
    void* s = arena(op_arena_, cuda::draw_token_scratch_bytes(x.n_cols));
    if (!s) return;
    check(cuda::draw_token_launch(mat(x), draw, s, draw_counter_, stream_), "draw_token");
  }
  void draw_top_k(Rows x, TokenDraw* draw) override {
    auto prof = begin_op("draw_top_k");
    if (!expect(x.n_cols > 0 && x.n_rows > 0, "draw_top_k: empty rows")) return;
    void* s = arena(op_arena_, cuda::draw_top_k_scratch_bytes(x.n_cols));
    if (!s) return;
    check(cuda::draw_top_k_launch(mat(x), draw, s, draw_top_k_state_, stream_), "draw_top_k");
  }
  void select_logits(Rows x, int64_t row, float threshold, int32_t cap, int32_t* count,
                     SelectedLogit* picked) override {
    auto prof = begin_op("select_logits");
    check(cuda::select_logits_launch(mat(x), row, threshold, cap, count, picked, stream_), "select_logits");
  }

  // ---- graphs ----
  Result<std::unique_ptr<StepGraph>> capture(std::function<void()> step) override {
    if (!error_.is_ok()) return synchronize().with_context("before capture");
    if (capturing_) return Status::error("capture: already capturing");
    settle();  // eager ops stay out of the graph
    forget_quantized();  // the graph's first matmul must not rely on an eager norm
    cudaError_t e = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed);
    if (e != cudaSuccess) return Status::errorf("capture: cudaStreamBeginCapture: {}", cudaGetErrorString(e));
    capturing_ = true;
#ifdef HYSPEC_STEP_TRACE
    cuda::step_trace_host().launches.clear();
    cuda::step_trace_host().logging = step_trace_ != nullptr;
#endif
    step();
#ifdef HYSPEC_STEP_TRACE
    cuda::step_trace_host().logging = false;
#endif
    join_side();  // a capture ends on the stream it began on, with every fork joined
    capturing_ = false;
    forget_quantized();
    cudaGraph_t graph = nullptr;
    e = cudaStreamEndCapture(stream_, &graph);
    Status st = error_;
    error_ = Status::ok();
    if (st.is_ok() && e != cudaSuccess) st = Status::errorf("cudaStreamEndCapture: {}", cudaGetErrorString(e));
    cudaGetLastError();
    if (!st.is_ok()) {
      if (graph) cudaGraphDestroy(graph);
      return st.with_context("capture");
    }
    cudaGraphExec_t exec = nullptr;
    e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return Status::errorf("capture: cudaGraphInstantiate: {}", cudaGetErrorString(e));
    }
    return std::unique_ptr<StepGraph>(new CudaGraph(this, exec));
  }

  Status launch_graph(cudaGraphExec_t exec) {
    if (capturing_) return Status::error("replay: cannot replay a graph while capturing");
    settle();
    forget_quantized();  // the graph's norms rewrote the quantized rows
    const cudaError_t e = cudaGraphLaunch(exec, stream_);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return Status::errorf("replay: cudaGraphLaunch: {}", cudaGetErrorString(e));
    }
    return Status::ok();
  }

 private:
  struct Arena {
    void* data = nullptr;
    size_t size = 0;
  };

  CudaBackend(int device, bool int8_matvec) : device_(device), int8_matvec_(int8_matvec) {}

  Status init() {
    cudaError_t e = cudaSetDevice(device_);
    cudaDeviceProp prop{};
    if (e == cudaSuccess) e = cudaGetDeviceProperties(&prop, device_);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
    main_stream_ = stream_;
    if (e != cudaSuccess) {
      cudaGetLastError();
      return Status::errorf("CUDA device {}: {}", device_, cudaGetErrorString(e));
    }
    if (prop.major < 8)
      return Status::errorf("CUDA device {} ({}) has compute capability {}.{}; hyspec needs 8.0+", device_, prop.name,
                            prop.major, prop.minor);
#ifdef HYSPEC_STEP_TRACE
    step_trace_ = cuda::step_trace_start();
#endif
    name_ = fmt::format("cuda:{} {}{}", device_, prop.name, int8_matvec_ ? " (int8 matvec)" : "");
    if (cuda::OpProfiler::requested()) profiler_ = std::make_unique<cuda::OpProfiler>(stream_);
    n_sm_ = prop.multiProcessorCount;
    folds_ = int8_matvec_ && !profiler_ && !profile_skip_ && cuda::env_int("HYSPEC_FOLD", 1) != 0;
    norm_folds_ = folds_ && cuda::int8_norm_fold_mode() != 0;
    if (profile_skip_)
      fmt::print(stderr, "HYSPEC_PROFILE_SKIP={}: {}; every result is meaningless\n", profile_skip_,
                 profile_skip_ == 1 ? "only the weight matmuls' kernels are launched"
                                    : "the weight matmuls' kernels are not launched");
    if (cublasCreate(&cublas_) != CUBLAS_STATUS_SUCCESS) return Status::error("cuBLAS initialisation failed");
    void* ws = nullptr;
    if (cudaMalloc(&ws, kCublasWorkspace) != cudaSuccess) return Status::error("cudaMalloc of the cuBLAS workspace failed");
    owned_.push_back(ws);
    cublas_ws_ = ws;
    // The side line (begin_side; HYSPEC_SIDE_STREAM=0: none, its ops run in order on the main stream).
    if (cuda::env_int("HYSPEC_SIDE_STREAM", 1) != 0) {
      if (cudaStreamCreateWithFlags(&side_stream_, cudaStreamNonBlocking) != cudaSuccess ||
          cudaEventCreateWithFlags(&side_fork_, cudaEventDisableTiming) != cudaSuccess ||
          cudaEventCreateWithFlags(&side_done_, cudaEventDisableTiming) != cudaSuccess ||
          cudaMalloc(&side_cublas_ws_, kCublasWorkspace) != cudaSuccess)
        return Status::error("CUDA: creating the side stream failed");
      owned_.push_back(side_cublas_ws_);
    }
    if (cublasSetStream(cublas_, stream_) != CUBLAS_STATUS_SUCCESS ||
        cublasSetWorkspace(cublas_, ws, kCublasWorkspace) != CUBLAS_STATUS_SUCCESS)
      return Status::error("cuBLAS stream/workspace setup failed");
    void* counters = nullptr;  // the attention's, then draw_token's
    if (cudaMalloc(&counters, (cuda::kAttentionMaxKvHeads + 1) * sizeof(unsigned)) != cudaSuccess ||
        cudaMemset(counters, 0, (cuda::kAttentionMaxKvHeads + 1) * sizeof(unsigned)) != cudaSuccess)
      return Status::error("cudaMalloc of the attention counters failed");
    owned_.push_back(counters);
    attention_counters_ = static_cast<unsigned*>(counters);
    draw_counter_ = attention_counters_ + cuda::kAttentionMaxKvHeads;
    if (cudaMalloc(&draw_top_k_state_, cuda::draw_top_k_state_bytes()) != cudaSuccess ||
        cudaMemset(draw_top_k_state_, 0, cuda::draw_top_k_state_bytes()) != cudaSuccess)
      return Status::error("cudaMalloc of draw_top_k's state failed");
    owned_.push_back(draw_top_k_state_);
    // HYSPEC_NORM_QUANTIZE=0 leaves the quantizing to the matvecs (to measure what it saves).
    if (int8_matvec_ && cuda::env_int("HYSPEC_NORM_QUANTIZE", 1) != 0) {
      // Zeroed: the rows past a norm's are the padding of the matvecs' 8-token tiles.
      void* q = nullptr;
      const size_t bytes = cuda::quantized_x_bytes();
      if (cudaMalloc(&q, bytes) != cudaSuccess || cudaMemset(q, 0, bytes) != cudaSuccess)
        return Status::error("cudaMalloc of the quantized activations failed");
      owned_.push_back(q);
      quantized_x_ = cuda::quantized_x_at(q);
    }
    // Enough for every decode-width op of the real models; prefill grows them once.
    if (!arena(matmul_arena_, size_t(8) << 20) || !arena(op_arena_, size_t(32) << 20)) return synchronize();
    if (side_stream_ && (!arena(side_matmul_arena_, size_t(8) << 20) || !arena(side_op_arena_, size_t(4) << 20)))
      return synchronize();
    return Status::ok();
  }

  // Upload with padding (see cuda::kWeightPad); synchronous, so the host source may go right after.
  Result<std::shared_ptr<void>> upload_weight(const void* src, size_t bytes, const std::string& name) {
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, bytes + cuda::kWeightPad);
    if (e == cudaSuccess) e = cudaMemset(p, 0, bytes + cuda::kWeightPad);
    if (e == cudaSuccess && bytes) e = cudaMemcpy(p, src, bytes, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
      cudaGetLastError();
      if (p) cudaFree(p);
      return Status::errorf("tensor '{}': uploading {} bytes: {}", name, bytes, cudaGetErrorString(e));
    }
    return std::shared_ptr<void>(p, freeing());
  }
  // The deleter of backend memory: what is deferred is launched first (it may read or write the memory),
  // when the memory is freed on the thread that deferred it; then cudaFree.
  std::function<void(void*)> freeing() {
    return [hook = std::weak_ptr<std::function<void()>>(settle_hook_)](void* q) {
      if (const auto h = hook.lock()) (*h)();
      cudaFree(q);
    };
  }

  cuda::WeightView view(const Weight& w) const {
    return cuda::WeightView{static_cast<const uint8_t*>(w.data), w.type, w.n_in, w.n_out, w.row_bytes, int8_matvec_};
  }

  // Every op starts here: brackets it for the profiler (when on and not capturing) and forgets the
  // rows the last norm quantized, which the op may rewrite (matmuls, which only read their input,
  // keep them: reads_only_x).
  cuda::OpProfiler::Scope begin_op(const char* op, const Weight* w = nullptr, bool reads_only_x = false) {
    settle();
    if (!reads_only_x) forget_quantized();
    if (profile_skip_) {
      const bool mm = std::strncmp(op, "matmul", 6) == 0;
      cuda::skip_launches() = (profile_skip_ == 1 && !mm) || (profile_skip_ == 2 && mm);
    }
    return cuda::OpProfiler::Scope(profiler_ && !capturing_ ? profiler_.get() : nullptr, op, w ? &w->name : nullptr);
  }

  // ---- a step's conv folded into the matvec that writes its input (cuda::Int8ConvFold) ----
  // A one-row matmul or matmul_many on the int8 dp4a kernels, and a matmul_many of up to 24 rows, is deferred
  // to the next op. When that is the causal_conv_silu (kernel 4; one row: no capture) of a column prefix of
  // its (first part's) output, the launch runs the conv in its tiles' epilogue; any other op (and every
  // memory op, side-line switch, capture, replay and synchronize) first launches it as it was asked. Same
  // bits either way; a decode or verify step of a Qwen3.5 GDN layer saves the conv's launch. HYSPEC_FOLD=0:
  // off; HYSPEC_CONV_FOLD_ROWS=0: one row only.
  struct DeferredMany {
    cuda::WeightView w[cuda::kInt8MvMaxParts];
    cuda::Mat y[cuda::kInt8MvMaxParts];
    int count;  // 1: a matmul
    Rows x;
    const cuda::QuantizedX* qx;
    cuda::Int8XFold xfold;  // a matmul: the op folded into its x (deferred_x_ taken by take_x_fold)
    float* residual = nullptr;  // a one-row matmul: residual += y (the add of a following add_rms_norm)
  };
  void launch_many(const DeferredMany& m, const cuda::Int8ConvFold* conv) {
    if (m.count > 1) {
      check(cuda::int8_matvec_multi_launch(m.w, m.y, m.count, mat(m.x), stream_, m.qx, conv, &m.xfold), "matmul_many");
      return;
    }
    void* s = arena(matmul_arena_, cuda::matmul_scratch_bytes(m.w[0], m.x.n_rows));
    if (!s) return;
    const bool folded = m.xfold.kind != cuda::Int8XFold::kNone;
    check(conv || folded || m.residual
              ? cuda::int8_matvec_launch(m.w[0], nullptr, mat(m.x), m.y[0], s, stream_, m.qx, conv, &m.xfold,
                                         m.residual)
              : cuda::matmul_launch(m.w[0], mat(m.x), m.y[0], {s, matmul_arena_.size}, cublas_, stream_, m.qx),
          "matmul");
  }
  void defer(const DeferredMany& m) {
    deferred_many_ = m;
    deferring_thread_ = std::this_thread::get_id();
  }
  // Launches what is deferred; the stream's last kernel then wrote what no one declared.
  void settle() {
    writes_.count = -1;
    if (deferred_many_) {
      const DeferredMany m = *deferred_many_;
      deferred_many_.reset();
      launch_many(m, nullptr);
    }
    if (deferred_norm_) {
      const DeferredNorm d = *deferred_norm_;
      deferred_norm_.reset();
      launch_add_norm(d);
    }
    if (deferred_x_) {
      const DeferredX d = *deferred_x_;
      deferred_x_.reset();
      launch_x(d);
    }
  }
  bool fold_conv(Rows x, const float* weight, int kernel, float* conv_state, float* capture, Rows y) {
    if (!deferred_many_) return false;
    const DeferredMany& m = *deferred_many_;
    const cuda::Mat& y0 = m.y[0];
    const int64_t C = x.n_cols, n = x.n_rows;
    const Bytes out = region(y), in = bytes(y0.data, ((n - 1) * y0.stride + y0.cols) * sizeof(float)),
                state = bytes(conv_state, 3 * C * sizeof(float)), cap = bytes(capture, n * 3 * C * sizeof(float));
    // One row (decode): a one-row launch or a multi launch's part 0, no capture. Several (verify): a multi
    // launch's part 0, with or without capture.
    const bool ok = kernel == 4 && (n == 1 ? !capture : m.count > 1) &&
                    (m.xfold.kind == cuda::Int8XFold::kNone || m.xfold.kind == cuda::Int8XFold::kRmsNorm) &&
                    !deferred_norm_ && n >= 1 && m.x.n_rows == n && y0.rows == n && y.n_rows == n && y.n_cols == C &&
                    x.data == y0.data && C <= y0.cols &&
                    (n == 1 || (x.stride == y0.stride && y.stride >= C && C % 4 == 0 && aligned16(conv_state))) &&
                    aligned16(weight) && disjoint(out, in) && disjoint(out, state) && disjoint(state, in) &&
                    (!capture || (disjoint(cap, out) && disjoint(cap, in) && disjoint(cap, state)));
    if (!ok) return false;
    const DeferredMany d = m;
    deferred_many_.reset();
    const cuda::Int8ConvFold conv{weight, conv_state, y.data, C, capture, n == 1 ? C : y.stride};
    launch_many(d, &conv);
    forget_quantized();
    writes_.count = -1;  // (the conv's output and state too)
    return true;
  }

  // ---- a decode step's add_rms_norm split into the matvecs around it (Int8XFold::kRmsNorm) ----
  // A one-row add_rms_norm of the output of a deferred one-row dp4a matmul (an attention or GDN layer's
  // o-projection, the FFN down projection) is deferred too. When the next op is a one-row int8 launch on
  // its output h (the FFN's fused SwiGLU: fold_add_norm; the next layer's projections, one matmul or
  // matmul_many, with the GDN conv after them: fold_add_norm_one / _many), the matmul adds its outputs to
  // the residual as it stores them and the next launch's blocks each norm the row as they stage it (storing
  // h too): the norm's launch and its grid hop are saved (9B decode -5.6%, session 45). Any other op
  // launches both as they were asked. Same bits either way (the norm kernel's add and summation order;
  // kernels.h). HYSPEC_FOLD=0 or HYSPEC_NORM_FOLD=0: off.
  struct DeferredNorm {
    Rows x, delta, h;
    const float* w;
    int64_t group;
    float eps;
  };
  void launch_add_norm(const DeferredNorm& d) {
    bool q = false;
    check(cuda::add_rms_norm_launch(mat(d.x), mat(d.delta), d.w, d.group, d.eps, mat(d.h), stream_, quantize_into(),
                                    &q),
          "add_rms_norm");
    norm_wrote(d.h, q);
  }
  bool defer_add_norm(const DeferredNorm& d) {
    if (!norm_folds_ || !deferred_many_ || deferred_norm_ || deferred_x_) return false;
    const DeferredMany& m = *deferred_many_;
    const int64_t K = d.x.n_cols;
    const cuda::Mat& y0 = m.y[0];
    const bool ok = m.count == 1 && m.x.n_rows == 1 && d.x.n_rows == 1 && same_shape(d.x, d.delta) &&
                    same_shape(d.x, d.h) && d.group == K && cuda::int8_norm_fold_row(K) && y0.data == d.delta.data &&
                    y0.rows == 1 && y0.cols == K && cuda::int8_residual_supported(m.w[0], 1) && d.w &&
                    aligned16(d.w) && aligned16(d.x.data) && aligned16(d.h.data) && aligned16(d.delta.data) &&
                    disjoint(region(d.x), region(d.delta)) && disjoint(region(d.h), region(d.x)) &&
                    disjoint(region(d.h), region(d.delta)) && disjoint(region(d.x), region(m.x)) &&
                    misses_xfold(m, region(d.x));
    if (!ok) return false;
    deferred_norm_ = d;
    return true;
  }
  // Whether r misses what a one-row matmul's x fold touches besides x: its output and its gate (whole groups
  // of gate_group values, gate_stride apart).
  static bool misses_xfold(const DeferredMany& m, std::pair<const char*, size_t> r) {  // (r: Bytes, below)
    const cuda::Int8XFold& f = m.xfold;
    if (f.kind == cuda::Int8XFold::kNone) return true;
    bool ok = disjoint(r, bytes(f.y, m.x.n_cols * sizeof(float)));
    if (f.gate && f.gate_group > 0) {
      const int64_t groups = (m.x.n_cols + f.gate_group - 1) / f.gate_group;
      ok = ok && disjoint(r, bytes(f.gate, ((groups - 1) * f.gate_stride + f.gate_group) * sizeof(float)));
    }
    return ok;
  }
  bool fold_add_norm(const cuda::WeightView& g, const cuda::WeightView& u, Rows x, Rows y) {
    if (!deferred_norm_ || !deferred_many_) return false;
    const DeferredNorm& d = *deferred_norm_;
    const int64_t K = d.x.n_cols;
    if (!(x.data == d.h.data && x.n_rows == 1 && x.n_cols == K && y.n_rows == 1 && y.n_cols == g.n_out &&
          cuda::int8_norm_fold_supported(g, true, 1, K) && disjoint(region(y), region(d.x)) &&
          disjoint(region(y), region(d.h)) && disjoint(region(y), region(d.delta))))
      return false;
    void* s = arena(matmul_arena_, cuda::matmul_scratch_bytes(g, 1));
    if (!s) return true;
    cuda::Int8XFold f;
    const DeferredNorm n = launch_norm_producer(f);
    check(cuda::int8_matvec_launch(g, u.data, mat(n.x), mat(y), s, stream_, nullptr, nullptr, &f), "matmul_swiglu");
    matmul_wrote(y);
    wrote(y), wrote(n.h);
    return true;
  }
  // Takes the deferred norm: its producer launched with the residual add, and f the norm's fold for the launch
  // after it (whose writes the caller declares).
  DeferredNorm launch_norm_producer(cuda::Int8XFold& f) {
    DeferredMany producer = *deferred_many_;
    const DeferredNorm n = *deferred_norm_;
    deferred_many_.reset(), deferred_norm_.reset();
    producer.residual = n.x.data;
    launch_many(producer, nullptr);
    f = cuda::Int8XFold{};
    f.kind = cuda::Int8XFold::kRmsNorm;
    f.norm_w = n.w;
    f.eps = n.eps;
    f.y = n.h.data;
    forget_quantized();  // (h is not quantized by a norm launch)
    writes_.count = -1;
    return n;
  }

  // The same with the attention or GDN projections of a layer's first norm (a matmul or matmul_many of one
  // row; deferred in turn for the GDN conv).
  bool fold_add_norm_one(const Weight& w, Rows x, Rows y) {
    if (!deferred_norm_ || !w.present()) return false;
    const cuda::WeightView v = view(w);
    const MatmulPart part{&w, y};
    return w.n_in == x.n_cols && w.n_out == y.n_cols && cuda::int8_norm_fold_supported(v, false, 1, x.n_cols) &&
           fold_add_norm_many(&v, &part, 1, x);
  }
  bool fold_add_norm_many(const cuda::WeightView* v, const MatmulPart* parts, int count, Rows x) {
    if (!deferred_norm_ || !deferred_many_) return false;
    const DeferredNorm& d = *deferred_norm_;
    const int64_t K = d.x.n_cols;
    bool ok = x.data == d.h.data && x.n_rows == 1 && x.n_cols == K &&
              (count == 1 ? cuda::int8_norm_fold_supported(v[0], false, 1, K)
                          : cuda::int8_multi_norm_fold_supported(v, count, 1, K));
    for (int i = 0; ok && i < count; ++i) {
      const Rows& yi = parts[i].y;
      ok = yi.n_rows == 1 && disjoint(region(yi), region(d.x)) && disjoint(region(yi), region(d.h)) &&
           disjoint(region(yi), region(d.delta));
    }
    if (!ok) return false;
    DeferredMany m{{}, {}, count, Rows(d.x.data, 1, K), nullptr};
    const DeferredNorm n = launch_norm_producer(m.xfold);
    for (int i = 0; i < count; ++i) m.w[i] = v[i], m.y[i] = mat(parts[i].y);
    for (int i = 0; i < count; ++i) matmul_wrote(parts[i].y), wrote(parts[i].y);
    wrote(n.h);
    if (count == 1 ? cuda::int8_conv_fold_supported(v[0], 1) : cuda::int8_conv_fold_supported(v, count, 1, nullptr)) {
      defer(m);  // (launched by the next op, which may be its conv)
    } else {
      launch_many(m, nullptr);
    }
    return true;
  }

  // ---- the op before a one-row matvec folded into its staging of x (cuda::Int8XFold) ----
  // A one-row gated_rms_norm (groups of 128) or sigmoid_mul is deferred to the next op. When that is a
  // one-row matmul of exactly the op's output on the int8 dp4a kernels (K <= kInt8XFoldMaxK), the matvec
  // applies the op as it quantizes x in-block and stores the op's output too; any other op launches the
  // op first, as it was asked. Same bits either way; a decode step saves the gated norm of each GDN layer
  // and the gate of each attention layer. The op's output must not overlap its inputs (the model's
  // calls write elsewhere: the matvec's blocks read x while others store y). A sigmoid_mul of several
  // rows is deferred too, for launch_gate_quantized. HYSPEC_FOLD=0: off.
  struct DeferredX {
    cuda::Int8XFold::Kind kind;
    Rows x, gate, y;
    const float* w;
    int64_t group;
    float eps;
    bool gate_early = false;  // the gate was not written by the op before this one (writes_)
    int64_t gate_stride() const { return gate.n_rows == 1 ? gate.n_cols : gate.stride; }
  };
  // Byte ranges of device memory: the bytes at p, a region's (rows of a stride), and whether two overlap.
  using Bytes = std::pair<const char*, size_t>;
  static Bytes bytes(const void* p, size_t n) { return {static_cast<const char*>(p), n}; }
  static Bytes region(const Rows& r) {
    const size_t n = r.n_rows > 0 ? static_cast<size_t>((r.n_rows - 1) * r.stride + r.n_cols) : 0;
    return bytes(r.data, n * sizeof(float));
  }
  static bool disjoint(Bytes a, Bytes b) { return a.first + a.second <= b.first || b.first + b.second <= a.first; }
  // Rows held one after the other (stride == n_cols, or one row).
  static bool packed(const Rows& r) { return r.n_rows == 1 || r.stride == r.n_cols; }
  bool defer_x(DeferredX d) {
    const int64_t K = d.x.n_rows * d.x.n_cols;
    const bool size_ok = K <= cuda::kInt8XFoldMaxK || (d.kind == cuda::Int8XFold::kSigmoidGate && quantize_into() &&
                                                        K <= cuda::kInt8MvMaxWidth * cuda::kQuantizedXMaxK);
    const bool ok = folds_ && same_shape(d.x, d.y) && packed(d.x) && packed(d.y) && K % 256 == 0 && size_ok &&
                    d.x.n_cols % 8 == 0 && aligned16(d.x.data) && aligned16(d.y.data) &&
                    aligned16(d.gate.data) && d.gate.stride % 4 == 0 && aligned16(d.w) &&
                    (d.kind != cuda::Int8XFold::kGatedNorm || (d.x.n_rows == 1 && d.x.n_cols % d.group == 0)) &&
                    disjoint(region(d.y), region(d.x)) && disjoint(region(d.y), region(d.gate));
    if (!ok) return false;
    d.gate_early = writes_.count >= 0;
    for (int i = 0; i < writes_.count; ++i) d.gate_early = d.gate_early && disjoint(writes_.r[i], region(d.gate));
    settle();  // (nothing is deferred behind it)
    forget_quantized();
    deferred_x_ = d;
    deferring_thread_ = std::this_thread::get_id();
    return true;
  }
  void launch_x(const DeferredX& d) {
    if (d.kind == cuda::Int8XFold::kSigmoidGate) {
      check(cuda::binary_launch(cuda::Binary::SigmoidMul, mat(d.x), mat(d.gate), mat(d.y), stream_), "sigmoid_mul");
      return;
    }
    bool q = false;
    check(cuda::rms_norm_launch(mat(d.x), d.gate.data, d.gate.stride, d.w, d.group, d.eps, mat(d.y), stream_,
                                quantize_into(), &q),
          "gated_rms_norm");
    norm_wrote(d.y, q);
  }
  // The fold of the deferred op into matmul(w, x, y), taking it and setting x to the op's input (one row),
  // or kNone (begin_op then launches the op).
  cuda::Int8XFold take_x_fold(const Weight& w, Rows& x, Rows y) {
    cuda::Int8XFold f;
    if (!deferred_x_) return f;
    const DeferredX& d = *deferred_x_;
    const int64_t K = d.x.n_rows * d.x.n_cols;
    if (!(w.present() && x.n_rows == 1 && y.n_rows == 1 && x.data == d.y.data && x.n_cols == K && w.n_in == K &&
          y.n_cols == w.n_out && cuda::int8_xfold_supported(view(w), 1) && disjoint(region(y), region(d.x)) &&
          disjoint(region(y), region(d.gate)) && disjoint(region(y), region(d.y))))
      return f;
    f.kind = d.kind;
    f.gate = d.gate.data;
    f.gate_group = d.gate.n_cols;
    f.gate_stride = d.gate_stride();
    f.norm_w = d.w;
    f.eps = d.eps;
    f.y = d.y.data;
    f.gate_early = d.gate_early;
    x = Rows(d.x.data, 1, K);
    deferred_x_.reset();
    return f;
  }
  // A deferred sigmoid_mul whose output a matmul of 2..kInt8MvMaxWidth rows on the int8 matvecs reads (as
  // [n, K]) is launched with the quantize that matmul would launch next (cuda::sigmoid_gate_quantize_launch):
  // the matmul then reads the quantized rows, as after a norm. Same bits; a verify step saves a launch in
  // each attention layer (one-row steps fold the gate into the matvec instead).
  void launch_gate_quantized(const Weight& w, Rows x) {
    const cuda::QuantizedX* qx = quantize_into();
    if (!deferred_x_ || deferred_x_->kind != cuda::Int8XFold::kSigmoidGate || !qx) return;
    const DeferredX& d = *deferred_x_;
    const int64_t n = x.n_rows, K = x.n_cols;
    if (!(n >= 2 && n <= cuda::kInt8MvMaxWidth && x.data == d.y.data && n * K == d.y.n_rows * d.y.n_cols &&
          packed(x) && K % 256 == 0 && K <= cuda::kQuantizedXMaxK && d.gate.n_cols % 8 == 0 && w.present() &&
          w.n_in == K && cuda::int8_matvec_supported(view(w), n)))
      return;
    const DeferredX g = d;
    deferred_x_.reset();
    check(cuda::sigmoid_gate_quantize_launch(g.x.data, g.gate.data, g.gate.n_cols, g.gate_stride(), g.y.data, n, K, *qx,
                                             stream_),
          "sigmoid_mul");
    norm_wrote(x, true);
  }
  // What the stream's last kernel wrote, where its op declares it (matmuls, the GDN recurrence, attention):
  // a folded op's gate outside it may be read before that kernel is done. count -1: unknown.
  struct Writes {
    Bytes r[cuda::kInt8MvMaxParts + 1];
    int count = -1;
  };
  void wrote(Rows r) { wrote(region(r)); }
  void wrote(const void* p, size_t n) { wrote(bytes(p, n)); }
  void wrote(Bytes b) {
    if (writes_.count < 0) writes_.count = 0;
    if (writes_.count < static_cast<int>(std::size(writes_.r)))
      writes_.r[writes_.count++] = b;
    else
      writes_.count = -1;
  }

  // ---- rows quantized by a norm (see quantized_rows_) ----
  const cuda::QuantizedX* quantize_into() const { return quantized_x_.d ? &quantized_x_ : nullptr; }
  void norm_wrote(Rows y, bool quantized) {
    quantized_rows_ = quantized ? y : Rows();
  }
  const cuda::QuantizedX* quantized(Rows x) const {
    const Rows& q = quantized_rows_;
    const bool same =
        q.data && x.data == q.data && x.n_rows == q.n_rows && x.n_cols == q.n_cols && x.stride == q.stride;
    return same ? &quantized_x_ : nullptr;
  }
  // After a matmul wrote y: the quantized rows are stale if y overlaps them.
  void matmul_wrote(Rows y) {
    const Rows& q = quantized_rows_;
    if (!q.data || y.n_rows == 0) return;
    auto end = [](const Rows& r) { return r.data + (r.n_rows - 1) * r.stride + r.n_cols; };
    if (y.data < end(q) && q.data < end(y)) forget_quantized();
  }
  void forget_quantized() { quantized_rows_ = Rows(); }

  static bool same_shape(const Rows& a, const Rows& b) { return a.n_rows == b.n_rows && a.n_cols == b.n_cols; }

  void binary(cuda::Binary op, Rows a, Rows b, Rows y, const char* what) {
    auto prof = begin_op(what);
    if (!expect(same_shape(a, b) && same_shape(a, y), "{}: [{}, {}], [{}, {}] -> [{}, {}]", what, a.n_rows, a.n_cols,
                b.n_rows, b.n_cols, y.n_rows, y.n_cols))
      return;
    check(cuda::binary_launch(op, mat(a), mat(b), mat(y), stream_), what);
  }

  // Enqueue on the side line's stream (or the main one's) from here on, with that line's arenas and
  // cuBLAS workspace.
  void switch_line(bool side) {
    stream_ = side ? side_stream_ : main_stream_;
    std::swap(matmul_arena_, side_matmul_arena_);
    std::swap(op_arena_, side_op_arena_);
    if (cublasSetStream(cublas_, stream_) != CUBLAS_STATUS_SUCCESS ||
        cublasSetWorkspace(cublas_, side ? side_cublas_ws_ : cublas_ws_, kCublasWorkspace) != CUBLAS_STATUS_SUCCESS)
      record(Status::error("cuBLAS: switching streams failed"));
  }

  void* arena(Arena& a, size_t bytes) {
    if (bytes <= a.size) return a.data;
    const size_t size = std::max(bytes, a.size * 2);
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, size);
    if (e != cudaSuccess) {
      cudaGetLastError();
      record(Status::errorf("scratch of {} bytes: {}", size, cudaGetErrorString(e)));
      return nullptr;
    }
    owned_.push_back(p);  // the old buffer stays alive: captured graphs may use it
    a = {p, size};
    return p;
  }

  void record(Status s) {
    if (error_.is_ok()) error_ = std::move(s);
  }
  void check(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return;
    cudaGetLastError();  // clear non-sticky errors so later ops report their own
    record(Status::errorf("{}: {} ({})", what, cudaGetErrorName(e), cudaGetErrorString(e)));
  }
  static cuda::KvGeometry geometry(const KvLayer& kv) {
    return cuda::KvGeometry{kv.type, kv.capacity, static_cast<int64_t>(kv.row_bytes()),
                            static_cast<int64_t>(kv.head_bytes()), static_cast<int>(kv.head_dim)};
  }
  // A cache type and geometry the kernels take.
  bool kv_cache_usable(const KvLayer& kv, const char* op) {
    return expect(kv.head_bytes() != 0 && kv.width % kv.head_dim == 0, "{}: KV type {} with heads of {} (F32, F16, "
                  "BF16, or Q8_0 with heads a multiple of 32)", op, ggml_type_name(kv.type), kv.head_dim);
  }
  template <typename... Args>
  bool expect(bool cond, fmt::format_string<Args...> f, Args&&... args) {
    if (!cond) record(Status::errorf(f, std::forward<Args>(args)...));
    return cond;
  }
  bool not_capturing(const char* what) {
    return expect(!capturing_, "{}: not allowed while capturing a graph (per-step values live in device memory)", what);
  }

  int device_ = 0;
  bool int8_matvec_ = false;
  // HYSPEC_FUSED_OPS=0: the fused ops (qk_norm_rope_store) run as the ops they stand for, to measure
  // what a fusion saves.
  bool fused_ops_ = cuda::env_int("HYSPEC_FUSED_OPS", 1) != 0;
  // HYSPEC_PROFILE_SKIP, to split a step's time between the weight matmuls and the rest (`hyspec bench`
  // under it): 1 enqueues only the kernels of the matmul and matmul_swiglu ops (their quantize kernels
  // included; moe_ffn counts as the rest), 2 all but those. Results are meaningless then.
  int profile_skip_ = cuda::env_int("HYSPEC_PROFILE_SKIP", 0);
  // Deferred launches for the conv and x folds (see settle); off under the op profiler and
  // HYSPEC_PROFILE_SKIP, which time ops one by one. Set in init.
  bool folds_ = false;
  bool norm_folds_ = false;  // (DeferredNorm)
  std::optional<DeferredMany> deferred_many_;
  std::optional<DeferredX> deferred_x_;
  std::optional<DeferredNorm> deferred_norm_;  // (behind deferred_many_, which wrote its delta)
  Writes writes_;
  std::thread::id deferring_thread_;
  // settle() for the deleters of backend memory (freeing), on the thread that deferred; reset first
  // thing by the destructor.
  std::shared_ptr<std::function<void()>> settle_hook_ = std::make_shared<std::function<void()>>([this] {
    if ((deferred_many_ || deferred_x_ || deferred_norm_) && std::this_thread::get_id() == deferring_thread_) settle();
  });
  int n_sm_ = 1;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  Status error_;
  bool capturing_ = false;
#ifdef HYSPEC_STEP_TRACE
  cuda::StepTraceBuf* step_trace_ = nullptr;  // HYSPEC_STEP_TRACE=1 only
#endif
  std::unique_ptr<cuda::OpProfiler> profiler_;  // HYSPEC_CUDA_PROFILE only
  Arena matmul_arena_, op_arena_;
  // The side line (begin_side): its stream, fork and join events, and the arenas and cuBLAS workspace
  // it swaps in while ops are enqueued on it (the main line's are swapped out to the side_ names; stream_
  // is main_stream_ outside that span).
  cudaStream_t side_stream_ = nullptr, main_stream_ = nullptr;
  cudaEvent_t side_fork_ = nullptr, side_done_ = nullptr;
  Arena side_matmul_arena_, side_op_arena_;
  void* cublas_ws_ = nullptr;
  void* side_cublas_ws_ = nullptr;
  bool on_side_ = false, side_pending_ = false;
  unsigned* attention_counters_ = nullptr;
  unsigned* draw_counter_ = nullptr;  // draw_token's last-block count
  void* draw_top_k_state_ = nullptr;  // draw_top_k's bins, counts and last-block counts
  // The rows the last norm also quantized for the int8 matvecs (into quantized_x_), while no op since
  // may have rewritten them: a matmul of exactly these rows reads quantized_x_ instead of quantizing
  // its input. Every other op, memory op, capture and replay forgets them.
  cuda::QuantizedX quantized_x_;
  Rows quantized_rows_;
  std::vector<void*> owned_;
};

Status CudaGraph::replay() { return backend_->launch_graph(exec_); }

void CudaReadback::mark() { backend_->readback_mark(marked_); }

Status CudaReadback::finish(void* dst, size_t bytes) {
  HS_RETURN_IF_ERROR(backend_->readback_finish(marked_));
  if (bytes > max_bytes_) return Status::errorf("read-back of {} bytes from {}", bytes, max_bytes_);
  std::memcpy(dst, host_, bytes);
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<Backend>> create_cuda_backend(const BackendOptions& options) {
  return CudaBackend::create(options);
}

}  // namespace hyspec
