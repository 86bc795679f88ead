// The op contract every backend implements (CPU reference, CUDA fast path). Model code is written
// once against this header and never knows which backend runs it.
//
// Conventions
// - Activations are f32, row-major: `Rows` = n_rows rows of n_cols values, row r at data + r*stride.
//   A Rows may be a column slice of a wider buffer (stride > n_cols).
// - All pointers are backend memory (host memory on CPU, device memory on CUDA), including the
//   per-step inputs (token ids, positions) that ops read, so a recorded step can be replayed.
// - Ops are asynchronous on CUDA (one stream, in order); `download` and `synchronize` wait.
// - Weights keep their GGML type: `matmul` reads them as stored (f32, f16, bf16, every quant; CUDA
//   stores the types it has no kernels for as Q8_0, see load_weight).
// - C++17 only: CUDA test sources (nvcc at C++17, see CMakeLists.txt) include it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "backend/logit_summary.h"
#include "format/ggml_types.h"
#include "format/gguf.h"
#include "util/status.h"

namespace hyspec {

enum class BackendKind { Cpu, Cuda };

// Backend memory; freed when the last copy goes away.
struct Buffer {
  std::shared_ptr<void> holder;
  size_t size = 0;
  void* data() const { return holder.get(); }
  template <typename T>
  T* as() const { return static_cast<T*>(holder.get()); }
};

// A weight as the backend holds it: n_out rows of n_in elements (GGUF dims [n_in, n_out(, n_expert)]).
// Expert e of a stacked expert tensor starts at data + e * n_out * row_bytes.
struct Weight {
  std::string name;
  GgmlType type = GgmlType::F32;
  int64_t n_in = 0, n_out = 0, n_expert = 1;
  size_t row_bytes = 0;
  const void* data = nullptr;
  std::shared_ptr<void> owner;  // keeps uploaded/converted data alive (empty for mmap views)
  // CPU: dot products use f32 activations against the dequantized weight rows (no activation
  // quantization), so results are exactly what the dequantized weights say. Set by load_weight
  // when the backend was created with exact_activations.
  bool exact = false;

  bool present() const { return data != nullptr; }
  const float* f32() const { return static_cast<const float*>(data); }  // for F32 vectors (norms, biases)

  // The shape of an F32 weight of n_out rows of n_in (no data yet): what weight_from_f32 fills in.
  static Weight f32_shape(std::string name, int64_t n_in, int64_t n_out) {
    Weight w;
    w.name = std::move(name);
    w.n_in = n_in;
    w.n_out = n_out;
    w.row_bytes = static_cast<size_t>(n_in) * sizeof(float);
    return w;
  }
};

struct Rows {
  float* data = nullptr;
  int64_t n_rows = 0, n_cols = 0, stride = 0;

  Rows() = default;
  Rows(float* d, int64_t rows, int64_t cols, int64_t row_stride = -1)
      : data(d), n_rows(rows), n_cols(cols), stride(row_stride < 0 ? cols : row_stride) {}
  Rows cols(int64_t begin, int64_t count) const { return Rows(data + begin, n_rows, count, stride); }
  Rows rows(int64_t begin, int64_t count) const { return Rows(data + begin * stride, count, n_cols, stride); }
  float* row(int64_t r) const { return data + r * stride; }
};

// A KV cache holds, per position and kv head, head_dim keys (values alike) as one slot of
//   F32 / F16 / BF16: head_dim values (16-bit types rounded to nearest even);
//   Q8_0: head_dim int8 codes, then one f16 scale per 32 codes, the slot padded to a multiple of 16
//         bytes (head_dim 256: 272 bytes, 53% of F16). ggml's q8_0 rounding: d = max|x| / 127,
//         code = round(x / d) half away from zero, value = f16(d) * code (llama.cpp's -ctk/-ctv q8_0).
// Bytes of one slot; 0 for a type caches do not take, or a head_dim Q8_0 cannot split into blocks of 32.
inline size_t kv_head_bytes(GgmlType t, int64_t head_dim) {
  if (head_dim <= 0) return 0;
  switch (t) {
    case GgmlType::F32: return static_cast<size_t>(head_dim) * 4;
    case GgmlType::F16:
    case GgmlType::BF16: return static_cast<size_t>(head_dim) * 2;
    case GgmlType::Q8_0:
      if (head_dim % 32 != 0) return 0;
      return (static_cast<size_t>(head_dim) + static_cast<size_t>(head_dim) / 16 + 15) / 16 * 16;
    default: return 0;
  }
}
// OK when a cache of type t can hold heads of head_dim; else why not (model state creation).
inline Status check_kv_cache_type(GgmlType t, int64_t head_dim) {
  if (kv_head_bytes(t, 32) == 0)
    return Status::errorf("KV cache type {} is not supported (F32, F16, BF16 or Q8_0)", ggml_type_name(t));
  if (kv_head_bytes(t, head_dim) == 0)
    return Status::errorf("KV cache type {} needs a head size that is a multiple of 32 (this model's: {})",
                          ggml_type_name(t), head_dim);
  return Status::ok();
}

// KV cache of one attention layer: capacity positions; position p's keys at k + p * row_bytes(), kv head
// h's slot (kv_head_bytes) at + h * head_bytes(); values alike.
struct KvLayer {
  void* k = nullptr;
  void* v = nullptr;
  GgmlType type = GgmlType::F32;
  int64_t capacity = 0;
  int64_t width = 0;     // n_kv_heads * head_dim
  int64_t head_dim = 0;  // width / n_kv_heads
  size_t head_bytes() const { return kv_head_bytes(type, head_dim); }
  size_t row_bytes() const { return head_dim > 0 ? head_bytes() * static_cast<size_t>(width / head_dim) : 0; }
};

struct AttentionArgs {
  Rows q;                          // [n, n_head*head_dim], already normed and roped
  KvLayer kv;                      // keys/values for positions < kv_len, block rows already stored
  const int32_t* positions = nullptr;  // [n] position of each query row
  int n_head = 0, n_kv_head = 0, head_dim = 0;
  float scale = 1.0f;
  // causal: query at position p sees keys 0..p. Otherwise every query sees keys 0..positions[n-1]
  // (a non-causal block whose rows were stored at consecutive positions, as DFlash drafts).
  bool causal = true;
  Rows out;                        // [n, n_head*head_dim]
  // An upper bound on the keys any row reads (the last row's position + 1), or 0: the capacity. A step
  // recorded as a graph passes one that holds for every replay. The CUDA decode kernels lay their splits
  // over min(max_keys, capacity) keys, so that a short context in a long-capacity cache gets a short
  // context's splits; a row gets the same bits in steps of any width that pass the same bound (verify
  // rows equal decode steps only then). A bound below the keys is a caller's bug that still reads every
  // key (the last split takes the rest).
  int64_t max_keys = 0;
};

// Gated DeltaNet over n tokens of one sequence (QWEN35.md, "Gated DeltaNet mixer", steps 3-5).
// State S per v-head is d_k x d_v f32, stored transposed: state[h][j][i] = S_h[i][j] (i over k, j over v).
struct GdnArgs {
  Rows q, k;        // [n, n_k_heads*d]  (after conv + SiLU; normalised inside)
  Rows v;           // [n, n_v_heads*d]
  Rows beta_logit;  // [n, n_v_heads]   b = ssm_beta·h
  Rows alpha;       // [n, n_v_heads]   a = ssm_alpha·h
  const float* ssm_a = nullptr;    // [n_v_heads], = -exp(A_log)
  const float* dt_bias = nullptr;  // [n_v_heads]
  int n_k_heads = 0, n_v_heads = 0, head_dim = 0;
  float eps = 1e-6f;               // for the L2 normalisation of q and k
  float* state = nullptr;          // [n_v_heads, d, d] in/out: final state written in place
  float* capture = nullptr;        // optional [n, n_v_heads, d, d]: state after each token
  uint16_t* capture_f16 = nullptr; // or the same as IEEE halves
  // Or [n, gdn_update_floats(..)]: each token's rank-1 update of the state, in the backend's own form,
  // and the state is left as it was: gdn_replay then applies a prefix of the updates (at most one of
  // capture, capture_f16 and updates is set).
  float* updates = nullptr;
  bool chunked = false;            // chunked (prompt) form; must equal the recurrent form
  Rows out;                        // [n, n_v_heads*d]
};

// Floats per token of a GdnArgs::updates record: one key per k-head, and per v-head one coefficient per
// state column and the decay, rounded up to whole 16-byte vectors. ~1/d of a captured state.
constexpr int64_t gdn_update_floats(int n_k_heads, int n_v_heads, int head_dim) {
  return (int64_t{n_k_heads} * head_dim + int64_t{n_v_heads} * (head_dim + 1) + 3) / 4 * 4;
}

// The query/key preparation of attention (QWEN35.md "Full-attention mixer", DFLASH.md), for n tokens:
//   q[t] = rope(rms_norm(query values of q_in[t], per head) * q_norm)
//   k[t] = rope(rms_norm(k[t], per head) * k_norm)   (in place)
// then k[t] and v[t] stored in the cache at positions[t]. q_in, q and k rows are contiguous (stride ==
// n_cols); no q (q.data null): keys and values only.
struct QkPrepArgs {
  Rows q_in;             // [n, n_head*q_pitch]: head h's head_dim query values at column h*q_pitch
  int64_t q_pitch = 0;   // head_dim, or 2*head_dim where each head's gate follows its query (Qwen3.5 attn_q)
  Rows q;                // [n, n_head*head_dim] out (may be q_in when q_pitch == head_dim)
  Rows k;                // [n, n_kv_head*head_dim] in/out
  Rows v;                // [n, n_kv_head*head_dim]
  const float* q_norm = nullptr;  // [head_dim]
  const float* k_norm = nullptr;  // [head_dim]
  int n_head = 0, n_kv_head = 0, head_dim = 0, n_rot = 0;
  float eps = 1e-6f, freq_base = 10000.0f;
  const int32_t* positions = nullptr;  // [n]
  KvLayer kv;
};

struct MoeArgs {
  Rows x;                  // [n, hidden] normed input
  const Weight* router;    // [hidden, n_expert]
  const Weight* gate_exps; // [hidden, ffn, n_expert]
  const Weight* up_exps;   // [hidden, ffn, n_expert]
  const Weight* down_exps; // [ffn, hidden, n_expert]
  int top_k = 0;
  Rows out;                // [n, hidden]: Σ_k w_k Expert_k(x)  (softmax, top-k, renormalised)
  // Optional: another matmul of x with the router's input width and type (the shared expert's gate,
  // [hidden, 1]) into shared_gate_out, run with the router (one launch on CUDA: both are short rows).
  const Weight* shared_gate = nullptr;
  Rows shared_gate_out;
};

// A few bytes that ops write and the host reads without waiting for ops enqueued after them (look-ahead
// decoding: the host reads one step's token while the next step runs).
class Readback {
 public:
  virtual ~Readback() = default;  // (waits for the ops before the last mark)
  // Where ops may read and write the bytes (CUDA: page-locked host memory mapped into the device's
  // address space), e.g. argmax's out; a recorded graph may hold it.
  virtual void* target() = 0;
  // The host may read the bytes once the ops enqueued so far are done: finish() waits for that.
  virtual void mark() = 0;
  // Wait for the last mark (not for ops enqueued after it) and copy the first `bytes` into dst: an error
  // if the backend has failed on the way.
  virtual Status finish(void* dst, size_t bytes) = 0;
  // Write `bytes` at byte `offset` from the host; no op in flight may touch them.
  virtual void put(const void* src, size_t bytes, size_t offset = 0) = 0;
};

// A recorded sequence of ops that can be replayed with the same pointers (CUDA graph on CUDA;
// on CPU, replay simply runs the recording function again).
class StepGraph {
 public:
  virtual ~StepGraph() = default;
  virtual Status replay() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendKind kind() const = 0;
  virtual std::string name() const = 0;  // "cpu (2 threads, avx2)", "cuda:0 NVIDIA H100"

  // Memory.
  virtual Result<Buffer> alloc(size_t bytes) = 0;
  virtual void upload(void* dst, const void* src, size_t bytes) = 0;          // host -> backend
  virtual void download(void* dst, const void* src, size_t bytes) = 0;        // backend -> host, waits
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;            // backend -> backend
  // Several copies at once (none overlapping another): what copy() does for each, which this default
  // runs; CUDA moves them in one launch where they are 16-byte aligned (a rollback's per-layer states).
  struct CopyPart {
    void* dst;
    const void* src;
    size_t bytes;
  };
  virtual void copy_many(const CopyPart* parts, size_t count) {
    for (size_t i = 0; i < count; ++i) copy(parts[i].dst, parts[i].src, parts[i].bytes);
  }
  virtual void fill_zero(void* dst, size_t bytes) = 0;
  virtual Status synchronize() = 0;
  // Whether ops return before they run (CUDA: enqueued on a stream), so that host work can overlap them.
  virtual bool asynchronous() const { return false; }
  virtual Result<std::unique_ptr<Readback>> new_readback(size_t max_bytes) = 0;

  // Make a GGUF tensor usable as a weight (CPU: zero-copy view; CUDA: uploaded once, and types it has
  // no kernels for re-quantized to Q8_0 on the way: the Weight's type says what is stored).
  // dequantize_to_f32: convert to F32 at load (parity checks of quantized kernels).
  virtual Result<Weight> load_weight(const GgufTensorInfo& t, bool dequantize_to_f32 = false) = 0;
  // A host f32 array as an F32 weight (n_out rows of n_in).
  virtual Result<Weight> weight_from_f32(const std::string& name, const float* data, int64_t n_in, int64_t n_out) = 0;

  // out[t] = dequantized row tokens[t] of table (tokens: backend memory, n ids).
  virtual void embed(const Weight& table, const int32_t* tokens, int64_t n, Rows out) = 0;
  // y[t] = W x[t]   (x.n_cols == W.n_in, y.n_cols == W.n_out)
  virtual void matmul(const Weight& w, Rows x, Rows y) = 0;
  // y_i = W_i x for several weights of one input (a layer's q/k/v, a stacked projection's runs): the
  // bits of one matmul each, which is what this default does; CUDA runs such a set as one launch
  // where its kernels allow. No y overlaps x.
  struct MatmulPart {
    const Weight* w;
    Rows y;
  };
  virtual void matmul_many(Rows x, const MatmulPart* parts, size_t count) {
    for (size_t i = 0; i < count; ++i) matmul(*parts[i].w, x, parts[i].y);
  }
  // y = x / rms(x) * w over each group of `group` consecutive columns (w: [group] or null). In place ok.
  virtual void rms_norm(Rows x, const float* w, int64_t group, float eps, Rows y) = 0;
  // y = rms_norm(x per group) * w * silu(z)
  virtual void gated_rms_norm(Rows x, Rows z, const float* w, int64_t group, float eps, Rows y) = 0;
  virtual void add(Rows a, Rows b, Rows y) = 0;                       // y = a + b
  // A residual add and the norm that reads its result, in one op: x += delta (in place), then
  // h = rms_norm(x) * w as rms_norm above. Each row's result is bit-identical to add(x, delta, x)
  // followed by rms_norm(x, w, group, eps, h), whatever the number of rows. h overlaps neither x nor delta.
  virtual void add_rms_norm(Rows x, Rows delta, const float* w, int64_t group, float eps, Rows h) = 0;
  virtual void swiglu(Rows gate, Rows up, Rows y) = 0;                // y = silu(gate) * up
  // y = silu(gate x) * (up x) in one pass, when the backend has a fused kernel for these weights and
  // this width (CUDA: same type and shape, n <= 16). Returns false, having done nothing, otherwise:
  // the caller then runs matmul, matmul, swiglu.
  virtual bool matmul_swiglu(const Weight& gate, const Weight& up, Rows x, Rows y) {
    (void)gate, (void)up, (void)x, (void)y;
    return false;
  }
  virtual void sigmoid_mul(Rows x, Rows gate, Rows y) = 0;            // y = x * sigmoid(gate)
  // y[r] += sigmoid(g[r][0]) * x[r]   (g: one column)
  virtual void add_sigmoid_scaled(Rows x, Rows g, Rows y) = 0;
  virtual void copy_rows(Rows src, Rows dst) = 0;                     // dst = src (strided)
  // dst[i] = src[i] for n IEEE halves (a state captured as F16 restored to F32).
  virtual void f16_to_f32(const uint16_t* src, float* dst, int64_t n) = 0;
  // Rollback by updates: each part's state (the one a gated_delta_net call with GdnArgs::updates
  // started from) takes that call's first n_tokens updates, in order. The result is bit-identical to
  // what the same call with an F32 capture captured after token n_tokens - 1.
  struct GdnReplayPart {
    float* state;
    const float* updates;
  };
  virtual void gdn_replay(const GdnReplayPart* parts, size_t count, int64_t n_tokens, int n_k_heads, int n_v_heads,
                          int head_dim) = 0;
  // NeoX RoPE, in place, on the first n_rot dims of each head_dim-wide head; theta_i = base^(-2i/n_rot).
  virtual void rope_neox(Rows x, int head_dim, int n_rot, const int32_t* positions, float freq_base) = 0;
  // Write k, v rows into the cache at positions[t].
  virtual void kv_store(Rows k, Rows v, KvLayer kv, const int32_t* positions) = 0;
  // QkPrepArgs in one op where the backend has a fused kernel (CUDA); the same bits as the ops it
  // stands for, which the default runs: rms_norm of the query and key heads, rope_neox of both, kv_store.
  virtual void qk_norm_rope_store(const QkPrepArgs& a);
  virtual void attention(const AttentionArgs& a) = 0;
  // Depthwise causal conv (kernel K) over time, then SiLU. conv_state [K-1, C] holds the previous
  // K-1 inputs (oldest first) and is advanced in place; capture (optional) [n, K-1, C] receives the
  // state after each token. weight [C, K] (GGUF ssm_conv1d [K, C]).
  virtual void causal_conv_silu(Rows x, const float* weight, int kernel, float* conv_state, float* capture,
                                Rows y) = 0;
  virtual void gated_delta_net(const GdnArgs& a) = 0;
  virtual void moe_ffn(const MoeArgs& a) = 0;
  // Ops enqueued between begin_side() and end_side() may run beside those enqueued on the main line
  // after begin_side() (CUDA: a second stream, forked and joined inside captured graphs too) until
  // join_side(), after which every op runs after them. Neither line may touch what the other writes in
  // that span. Where there is one line (the CPU), ops run in order and these do nothing.
  virtual void begin_side() {}
  virtual void end_side() {}
  virtual void join_side() {}
  // out[r] = argmax of row r (first index on ties).
  virtual void argmax(Rows x, int32_t* out) = 0;
  // The input of a one-token step made on the backend: ++*position_counter, then tokens[0] = *token (e.g.
  // the previous step's argmax) and positions[0] = *position_counter.
  virtual void feed_token(const int32_t* token, int32_t* tokens, int32_t* positions, int32_t* position_counter) = 0;
  // Row (*position % ring_rows) of `ring` (ring_rows rows of src.n_cols floats) = src's first row: a step's output
  // row kept by its position where the position lives on the backend (look-ahead decoding's drafter rows).
  virtual void copy_row_to_ring(Rows src, float* ring, int64_t ring_rows, const int32_t* position) = 0;
  // LogitSummary::floats(x.n_cols) floats per row of x into out, row after row.
  virtual void logit_summary(Rows x, float inv_t, float* out) = 0;
  // A token drawn from row 0 of x under temperature alone, draw->temperature, with draw->uniform (ops enqueued
  // before this one may write neither): the chunk path of LogitRows (backend/chunk_draw.h) on the backend,
  // its chunk masses those of logit_summary. A row with no finite mass gets TokenDraw::kNoMass.
  virtual void draw_token(Rows x, TokenDraw* draw) = 0;
  // A token drawn from row 0 of x under draw's temperature and cuts (top_k, then min_p, then top_p) with
  // draw->uniform, as Sampler::distribution and Sampler::draw take it (backend/sampling_cut.h) from the row's
  // top_k best tokens, which the backend finds on its own; ops enqueued before this one may write none of the
  // inputs. A row whose largest logit is not finite gets TokenDraw::kNoMass and its argmax; NaN logits are
  // never drawn.
  virtual void draw_top_k(Rows x, TokenDraw* draw) = 0;
  // The tokens of row `row` of x whose logit is >= threshold (NaN never), in no set order: how many
  // into *count, the first min(*count, cap) of them into picked.
  virtual void select_logits(Rows x, int64_t row, float threshold, int32_t cap, int32_t* count,
                             SelectedLogit* picked) = 0;

  // Record `step` (a sequence of the ops above) for replay.
  virtual Result<std::unique_ptr<StepGraph>> capture(std::function<void()> step) = 0;
};

struct BackendOptions {
  int n_threads = 0;  // CPU: 0 = all cores
  int device = 0;     // CUDA device ordinal
  // CPU: never quantize activations (see Weight::exact); slower on quantized weights.
  bool exact_activations = false;
  // CUDA: Q4_K, Q5_K and Q6_K matmuls of 1..32 tokens on int8 activations (matvec_int8.cu): one-token
  // decode ~1.4x and 16-token verify ~1.1x faster than the f16 tensor-core matvec, ~5e-3 relative error
  // per product (int8 x per 256, as llama.cpp's CPU q8_K) instead of ~3e-4. Every width stays
  // bit-identical to one-token steps either way. false: the f16 matvec.
  bool int8_matvec = true;
};

// A GGUF tensor's weight geometry (name, type, n_in/n_out/n_expert, row bytes), data not yet set.
Result<Weight> weight_geometry(const GgufTensorInfo& t);

Result<std::unique_ptr<Backend>> create_backend(BackendKind kind, const BackendOptions& options = {});
Result<BackendKind> parse_backend_kind(const std::string& name);  // "cpu" | "cuda"
bool cuda_backend_built();

}  // namespace hyspec
