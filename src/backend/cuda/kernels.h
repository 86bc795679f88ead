// Kernel launchers of the CUDA backend (private to src/backend/cuda/). Each enqueues work on `stream`
// and returns the launch status; argument checks live in cuda_backend.cu. Shapes use the conventions
// of backend.h: f32 row-major rows with a stride in elements.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/logit_summary.h"
#include "format/ggml_types.h"

namespace hyspec::cuda {

// Bytes of zero padding after every weight upload: decoders of 2-byte aligned blocks read whole
// aligned words and may touch up to 4 bytes past a row's last block.
constexpr size_t kWeightPad = 64;

// A strided f32 matrix on the device.
struct Mat {
  float* data = nullptr;
  int64_t rows = 0, cols = 0, stride = 0;
};

// Scratch the matmul may use for its own staging (activations as f16, dequantised weight tiles).
struct MatmulScratch {
  void* data = nullptr;
  size_t bytes = 0;
};

// A weight as the kernels see it: n_out rows of n_in elements of `type`; experts are n_out rows apart.
struct WeightView {
  const uint8_t* data = nullptr;
  GgmlType type = GgmlType::F32;
  int64_t n_in = 0, n_out = 0;
  size_t row_bytes = 0;
  bool int8_matvec = false;  // BackendOptions::int8_matvec
};

// True when matmul/embed support the type.
bool matmul_type_supported(GgmlType t);
// What a supported type needs on the current device before its first kernel (the i-quants' codebooks);
// host-synchronous, not for graph capture: called when a weight is loaded.
cudaError_t prepare_weight_type(GgmlType t);
// Bytes of scratch matmul_launch needs for n rows of x.
size_t matmul_scratch_bytes(const WeightView& w, int64_t n);

// Rows a norm quantized for the int8 matvecs as it wrote them (rms_norm_launch with qx): the codes in
// each XOrder, and the scales and 16-code sums they share, for up to kInt8MvMaxWidth rows of K <=
// kQuantizedXMaxK elements, in q8k.cuh's step-major order of pitch padded_tokens(rows). A matmul of
// those rows reads them instead of quantizing its input again.
constexpr int64_t kQuantizedXMaxK = 16384;
struct QuantizedX {
  int8_t* q[3] = {nullptr, nullptr, nullptr};  // by XOrder: natural, fragment-major Q4_K/Q5_K, Q6_K
  float* d = nullptr;
  uint16_t* bs = nullptr;  // f16
};
size_t quantized_x_bytes();
QuantizedX quantized_x_at(void* base);  // the layout in quantized_x_bytes() at base (256-byte aligned)

// y[t] = W x[t] for t < x.rows. Widths <= 32 read each weight byte once (tensor-core matvec); wider
// inputs dequantise weight tiles to f16 and call cuBLAS. qx: x as a norm quantized it, or null.
cudaError_t matmul_launch(const WeightView& w, Mat x, Mat y, MatmulScratch scratch, cublasHandle_t cublas,
                          cudaStream_t stream, const QuantizedX* qx = nullptr);

// y[t] = silu(Wg x[t]) * (Wu x[t]) in one pass over both weights (decode/verify widths). Supported when
// gate and up have the same type and shape, rows are whole 32-element chunks and n <= kMmvSwiGluMaxWidth; scratch as
// matmul_scratch_bytes(gate, n).
constexpr int64_t kMmvSwiGluMaxWidth = 24;
bool matmul_swiglu_supported(const WeightView& gate, const WeightView& up, int64_t n);
cudaError_t matmul_swiglu_launch(const WeightView& gate, const WeightView& up, Mat x, Mat y, MatmulScratch scratch,
                                 cudaStream_t stream, const QuantizedX* qx = nullptr);

// Q4_K, Q5_K and Q6_K at widths 1..kInt8MvMaxWidth (matvec_int8.cu): activations quantized to int8 per 256
// elements, integer dot products (dp4a / int8 mma); matmul_launch and matmul_swiglu_launch route such
// calls here (up: the SwiGLU up weights, or null) when the weight view says int8_matvec
// (BackendOptions::int8_matvec, the default).
constexpr int64_t kInt8MvMaxWidth = 32;
bool int8_matvec_supported(const WeightView& w, int64_t n);
// Whether the int8 matvecs can take their weights by TMA boxes here (sm_90 and the driver's tensor-map
// encoder; HYSPEC_TMA_RING=0 turns them off).
bool int8_matvec_tma_available();
size_t int8_matvec_scratch_bytes(const WeightView& w, int64_t n);
// A step's depthwise causal conv of kernel 4 + SiLU (causal_conv_silu_launch) folded into the launch that
// writes its input: a one-row launch, or part 0 of a multi launch of one row (decode) or of up to 24 (verify,
// where capture may be set). Outputs c < channels of token t also give y[t][c] = silu(sum_j w[c][j] in_j)
// over the 4 newest inputs (the 3 state rows before token 0), capture[t] the window after token t, and the
// state the last 3 inputs, with the conv kernel's arithmetic (cuda_backend.cpp defers the launch to find
// the conv).
struct Int8ConvFold {
  const float* w;  // [channels, 4]
  float* state;    // [3, channels]
  float* y;        // [n, channels], rows y_stride apart
  int64_t channels;
  float* capture = nullptr;  // [n, 3, channels], or null
  int64_t y_stride = 0;
};
bool int8_conv_fold_supported(const WeightView& w, int64_t n);
// The op that writes a one-row matvec's input, folded into the dp4a kernel's in-block quantization of x:
// every block applies it to the op's input (the launch's x) as it stages x, and the launch's x is that
// op's input; elements c of block c / 256 == blockIdx.x (mod the grid) are also stored to y, the op's
// output, so the op's result stays as it was asked. The arithmetic is the op's (elementwise.cu), so the
// bits are the same as the op's launch followed by the matvec's (cuda_backend.cpp defers the op to find
// the matvec). Gate element of x[c]: gate[(c / gate_group) * gate_stride + c % gate_group].
struct Int8XFold {
  // kPlain: no op, x itself (one row of up to kInt8PlainMaxK, staged in-block instead of a quantize launch).
  // kRmsNorm: y = x / sqrt(mean of squares over the row + eps) * norm_w (rms_norm of one group, the row;
  // int8_norm_fold_supported says which rows), with rms_norm_kernel's summation order.
  enum Kind : int { kNone, kGatedNorm, kSigmoidGate, kPlain, kRmsNorm };
  Kind kind = kNone;
  // kGatedNorm: y = x / sqrt(mean of squares over each 128-group + eps) * norm_w[c % 128] * silu(gate)
  // (gated_rms_norm, group 128); kSigmoidGate: y = x * sigmoid(gate) (sigmoid_mul).
  const float* gate = nullptr;
  int64_t gate_group = 0, gate_stride = 0;
  const float* norm_w = nullptr;
  float eps = 0.0f;
  float* y = nullptr;
  // The gate may be read before the previous kernel is done (it was written earlier than that).
  bool gate_early = false;
  int norm_threads = 0;  // kRmsNorm: norm_threads_per_group(row) (set by the launch)
};
constexpr int64_t kInt8XFoldGroup = 128, kInt8XFoldMaxK = 6144, kInt8PlainMaxK = 18432;
bool int8_xfold_supported(const WeightView& w, int64_t n);
// kRmsNorm folded into a one-row launch on the dp4a kernels (the fused SwiGLU of Q4_K gate/up, or a Q4_K or
// Q6_K matvec, with or without the conv fold), on the rows int8_norm_fold_row takes: those where rms_norm_kernel
// runs 512 threads with 2 or 3 float4s each (4096, 6144: a lane of the matvec's warp w holds two of its threads
// whole) or 256 threads (multiples of 1024 up to kInt8XFoldMaxK, 4096 too with HYSPEC_NORM_THREADS=256: each
// thread loads that thread's float4s as well). HYSPEC_NORM_FOLD=0: none; 2: the SwiGLU's only (not the
// attention and GDN projections after a layer's first norm, the plain matvecs and int8_matvec_multi_launch).
int int8_norm_fold_mode();  // HYSPEC_NORM_FOLD: 0, 1 (the default) or 2, as above
bool int8_norm_fold_row(int64_t K);
bool int8_norm_fold_supported(const WeightView& w, bool swiglu, int64_t n, int64_t K);
// The threads of rms_norm_kernel's block for a group (32, 256 or 512; elementwise.cu).
int norm_threads_per_group(int64_t group);
// residual (one row, dp4a): residual[i] += y[i] as each output is stored, the residual add of an
// add_rms_norm that follows (the norm kernel's x + delta, so its bits), saving the norm that step.
cudaError_t int8_matvec_launch(const WeightView& w, const uint8_t* up, Mat x, Mat y, void* scratch,
                               cudaStream_t stream, const QuantizedX* qx = nullptr,
                               const Int8ConvFold* conv = nullptr, const Int8XFold* xfold = nullptr,
                               float* residual = nullptr);
bool int8_residual_supported(const WeightView& w, int64_t n);

// y[i] = W[i] x for several Q4_K / Q6_K weights of one input in one launch (the blocks shared out by
// bytes), the bits of one int8_matvec_launch each: widths 1..24 whose x the dp4a kernels quantize
// in-block or a norm quantized (qx); int8_matvec_multi_supported says which (none with
// HYSPEC_MATMUL_MANY=0), and the launch returns cudaErrorNotSupported for the others.
constexpr int kInt8MvMaxParts = 4;
bool int8_matvec_multi_supported(const WeightView* w, int parts, int64_t n, const QuantizedX* qx);
bool int8_conv_fold_supported(const WeightView* w, int parts, int64_t n, const QuantizedX* qx);
// xfold (one row, kRmsNorm only): every part's blocks norm x as they stage it (int8_norm_fold_supported).
bool int8_multi_norm_fold_supported(const WeightView* w, int parts, int64_t n, int64_t K);
cudaError_t int8_matvec_multi_launch(const WeightView* w, const Mat* y, int parts, Mat x, cudaStream_t stream,
                                     const QuantizedX* qx, const Int8ConvFold* conv = nullptr,
                                     const Int8XFold* xfold = nullptr);

// Two matmuls of x on the exact f32 path (F32 weights, or rows not of whole 32-element chunks) with the
// same type and row bytes in one launch, each row the bits of its own matmul_launch; cudaErrorNotSupported
// (nothing launched) for any other pair.
cudaError_t matmul_exact_pair_launch(const WeightView& a, Mat ya, const WeightView& b, Mat yb, Mat x,
                                     cudaStream_t stream);
// Expert matmul for MoE: for b < n_batch, y[b] = W[expert_ids[b]] x[b / x_div]; with `up` (same type
// and shape as w = gate, not F32), y[b] = silu(Wg x) * (Wu x) in the same pass.
cudaError_t matmul_experts_launch(const WeightView& w, const uint8_t* up, const int32_t* expert_ids, int64_t n_batch,
                                  int x_div, Mat x, Mat y, MatmulScratch scratch, cudaStream_t stream);
size_t matmul_experts_scratch_bytes(const WeightView& w, int64_t n_x_rows);
// Per-slot expert matmul on the int8 matvec (Q4_K, Q5_K, Q6_K experts with BackendOptions::int8_matvec):
// as matmul_experts_launch, each slot's row computed alike in every step (a one-token int8 matvec of its
// expert; rows of fewer than 8 super-blocks on warp tiles), so every step width gives decode's bits. MoE steps of up to kInt8ExpertsMaxTokens tokens take it (the
// engine's widest verify step: --draft-max 64); wider ones (prompts) take the grouped f16 path.
constexpr int64_t kInt8ExpertsMaxTokens = 65;
bool int8_experts_supported(const WeightView& w);
// pairs: the slots of one expert served two at a time (the two-token dp4a kernel, the same bits per
// row), reading the expert's weights once per pair (steps of up to 256 slots; more take them one by one).
// n_experts: the experts w (and up) hold, one after another (w.n_out rows each).
cudaError_t int8_experts_launch(const WeightView& w, const uint8_t* up, int64_t n_experts, const int32_t* expert_ids,
                                int64_t n_slots, int x_div, Mat x, Mat y, cudaStream_t stream, bool pairs = false);
// Grouped expert matmul (MoE steps of several tokens): rows [offsets[e], offsets[e+1]) of x and y
// belong to expert e (moe_group_launch's order); y[j] = W[e] x[j], each expert's weights read once
// per 16 of its rows instead of once per row. up: fused SwiGLU with these up weights (same type and
// shape as w = gate), or null. Bit-identical per row to matmul_experts_launch (same decode and
// summation order). Scratch: matmul_grouped_scratch_bytes(w, x.rows).
bool matmul_grouped_supported(const WeightView& w);
size_t matmul_grouped_scratch_bytes(const WeightView& w, int64_t n_rows);
cudaError_t matmul_grouped_launch(const WeightView& w, const uint8_t* up, const int32_t* offsets, int n_experts,
                                  Mat x, Mat y, void* scratch, cudaStream_t stream);

// out[t] = row tokens[t] of the table, dequantised to f32.
cudaError_t embed_launch(const WeightView& table, const int32_t* tokens, Mat out, cudaStream_t stream);

// ---- elementwise and normalisation (elementwise.cu) ----
// With qx, the norms also quantize their output into *qx where they can (*quantized says whether they
// did): at most kInt8MvMaxWidth rows of K % 256 == 0 and K <= kQuantizedXMaxK, whole float4 groups
// (one round trip), a block's groups whole 256-blocks of one row.
cudaError_t rms_norm_launch(Mat x, const float* z_gate, int64_t z_stride, const float* w, int64_t group, float eps,
                            Mat y, cudaStream_t stream, const QuantizedX* qx = nullptr,
                            bool* quantized = nullptr);  // z_gate == nullptr: plain rms norm
// x += delta in place, then h = rms_norm(x) * w: the same bits as binary_launch(Add, x, delta, x) followed
// by rms_norm_launch(x, nullptr, 0, w, group, eps, h), in one launch.
cudaError_t add_rms_norm_launch(Mat x, Mat delta, const float* w, int64_t group, float eps, Mat h,
                                cudaStream_t stream, const QuantizedX* qx = nullptr, bool* quantized = nullptr);
enum class Binary { Add, SwiGlu, SigmoidMul, AddSigmoidScaled };
cudaError_t binary_launch(Binary op, Mat a, Mat b, Mat y, cudaStream_t stream);
// binary_launch(SigmoidMul, x, gate, y) over n rows of K values (x and y packed; the gate's rows of `group`
// values, a multiple of 8, at gate_stride, 16-byte aligned), with y also quantized into qx as a norm quantizes
// its output: one launch where a several-token step's attention gate took two (the op, then the next
// matmul's quantize_q8k). n <= kInt8MvMaxWidth, K % 256 == 0, K <= kQuantizedXMaxK.
cudaError_t sigmoid_gate_quantize_launch(const float* x, const float* gate, int64_t group, int64_t gate_stride, float* y,
                                         int64_t n, int64_t K, const QuantizedX& qx, cudaStream_t stream);
cudaError_t rope_neox_launch(Mat x, int head_dim, int n_rot, const int32_t* positions, float freq_base,
                             cudaStream_t stream);
// A KV cache as the kernels address it (backend.h KvLayer): the slot of position p and kv head h at
// base + p * row_bytes + h * head_bytes.
struct KvGeometry {
  GgmlType type = GgmlType::F32;  // F32, F16, BF16 or Q8_0 (kv_cache.cuh)
  int64_t capacity = 0, row_bytes = 0, head_bytes = 0;
  int head_dim = 0;
};
// k, v: [n, n_kv_heads * head_dim]. Rows whose position is outside [0, capacity) are skipped.
cudaError_t kv_store_launch(Mat k, Mat v, void* k_cache, void* v_cache, const KvGeometry& kv, const int32_t* positions,
                            cudaStream_t stream);
// QkPrepArgs (backend.h) in one launch, bit-identical to the rms_norm, rope_neox and kv_store launches it
// replaces; head_dim <= kQkPrepMaxHeadDim (qk_prep_supported), n_head 0 for keys only.
constexpr int kQkPrepWarps = 4, kQkPrepMaxHeadDim = 512;
inline bool qk_prep_supported(int head_dim) { return head_dim > 0 && head_dim <= kQkPrepMaxHeadDim; }
struct QkPrepParams {
  Mat q_in;
  int64_t q_pitch;
  Mat q, k, v;
  const float* q_norm;
  const float* k_norm;
  int n_head, n_kv_head, head_dim, n_rot;
  float eps, freq_base;
  const int32_t* positions;
  KvGeometry kv;
  int vec4_q, vec4_k;  // set by the launcher
};
cudaError_t qk_prep_launch(QkPrepParams p, void* k_cache, void* v_cache, cudaStream_t stream);
size_t argmax_scratch_bytes(int64_t rows, int64_t cols);
cudaError_t argmax_launch(Mat x, int32_t* out, void* scratch, cudaStream_t stream);  // scratch: argmax_scratch_bytes
// Backend::feed_token: tokens[0] = *token, positions[0] = ++*position_counter.
cudaError_t feed_token_launch(const int32_t* token, int32_t* tokens, int32_t* positions, int32_t* position_counter,
                              cudaStream_t stream);
// Backend::copy_row_to_ring: ring row (*position % ring_rows) = src[0 .. cols).
cudaError_t copy_row_to_ring_launch(const float* src, int64_t cols, float* ring, int64_t ring_rows,
                                    const int32_t* position, cudaStream_t stream);
// Backend::logit_summary (scratch: argmax_scratch_bytes) and Backend::select_logits.
cudaError_t logit_summary_launch(Mat x, float inv_t, float* out, void* scratch, cudaStream_t stream);
cudaError_t select_logits_launch(Mat x, int64_t row, float threshold, int32_t cap, int32_t* count,
                                 SelectedLogit* picked, cudaStream_t stream);
// Backend::draw_token on row 0 of x; done: a zeroed counter that each draw leaves zeroed.
size_t draw_token_scratch_bytes(int64_t cols);
cudaError_t draw_token_launch(Mat x, TokenDraw* draw, void* scratch, unsigned* done, cudaStream_t stream);
// Backend::draw_top_k on row 0 of x; state: draw_top_k_state_bytes zeroed once, which each draw leaves so.
size_t draw_top_k_scratch_bytes(int64_t cols);
size_t draw_top_k_state_bytes();
cudaError_t draw_top_k_launch(Mat x, TokenDraw* draw, void* scratch, void* state, cudaStream_t stream);
// Router: softmax over the n_expert logits, top-k, renormalised weights. ids/weights: [rows, k].
cudaError_t moe_route_launch(Mat logits, int top_k, int32_t* ids, float* weights, cudaStream_t stream);
// out[t] = sum_s weights[t][s] * expert_out[t*k + s]
// out[t] = sum_s weights[t*k+s] * expert_out[row of slot t*k+s]: row = pos[slot], or the slot itself
// when pos is null.
cudaError_t moe_combine_launch(Mat expert_out, const int32_t* pos, const float* weights, int top_k, Mat out,
                               cudaStream_t stream);
// The (token, slot) pairs of a step grouped by expert, in one block: offsets[0..n_experts] (the run of
// expert e is [offsets[e], offsets[e+1])), order[j] = the slot at position j, pos[slot] = its position.
// Positions within a run follow no fixed order (each row is computed on its own).
cudaError_t moe_group_launch(const int32_t* ids, int64_t n_slots, int n_experts, int32_t* offsets, int32_t* order,
                             int32_t* pos, cudaStream_t stream);
// y[j] = x[order[j] / x_div] (rows).
cudaError_t gather_rows_launch(Mat x, const int32_t* order, int x_div, Mat y, cudaStream_t stream);

// ---- attention (attention.cu) ----
struct AttentionParams {
  Mat q, out;
  const void* k = nullptr;
  const void* v = nullptr;
  KvGeometry kv;
  const int32_t* positions = nullptr;
  int n_head = 0, n_kv_head = 0, head_dim = 0;
  float scale = 1.0f;
  bool causal = true;
  int64_t max_keys = 0;  // AttentionArgs::max_keys
  // >= n_kv_head zeroed counters the decode kernel uses to merge its splits (left zeroed).
  unsigned* counters = nullptr;
};
constexpr int kAttentionMaxKvHeads = 1024;
bool attention_head_dim_supported(int head_dim);
// Split count the launcher will use, and the scratch it needs for the partial results.
int attention_splits(const AttentionParams& p, int n_sm);
size_t attention_scratch_bytes(const AttentionParams& p, int n_splits);
cudaError_t attention_launch(const AttentionParams& p, int n_splits, float* scratch, cudaStream_t stream);
#ifdef HYSPEC_ATTN_TRACE
// Builds with -DHYSPEC_ATTN_TRACE=ON: the decode kernels' per-block timeline of their last launch (the
// phases' min / median / max in us from the first block's start, to stdout), then cleared.
void attention_trace_report(const char* label);
#endif
#ifdef HYSPEC_GDN_TRACE
// Builds with -DHYSPEC_GDN_TRACE=ON: gdn_kernel's per-block timeline of its last launch, as above.
void gdn_trace_report(const char* label);
#endif

// ---- recurrent ops (recurrent.cu) ----
cudaError_t causal_conv_silu_launch(Mat x, const float* weight, int kernel, float* conv_state, float* capture, Mat y,
                                    cudaStream_t stream);
struct GdnParams {
  Mat q, k, v, beta_logit, alpha, out;
  const float* ssm_a = nullptr;
  const float* dt_bias = nullptr;
  int n_k_heads = 0, n_v_heads = 0, head_dim = 0;
  float eps = 1e-6f;
  float* state = nullptr;
  float* capture = nullptr;
  uint16_t* capture_f16 = nullptr;  // or the captured states as halves
  // Or each token's update (backend.h GdnArgs::updates) at updates + t * update_stride, in the form
  // [n_k * d keys as read][n_v * d coefficients][n_v decays]; the state is then not written.
  float* updates = nullptr;
  int64_t update_stride = 0;
  bool chunked = false;  // prompt form: the chunked kernels where they pay (gdn_launch decides)
};
bool gdn_head_dim_supported(int head_dim);
// Bytes of scratch gdn_launch needs for p (0 when it runs the recurrent kernel), 16-byte aligned.
size_t gdn_scratch_bytes(const GdnParams& p);
// q, k: 16-byte aligned rows (float4 loads); state and capture 16-byte aligned.
cudaError_t gdn_launch(const GdnParams& p, void* scratch, cudaStream_t stream);
// Rollback by updates (backend.h gdn_replay): part i's state takes updates 0..n_tokens-1 of the
// record at updates[i] (GdnParams' form and stride), in one launch.
constexpr int kGdnReplayParts = 64;
struct GdnReplayList {
  int count = 0;
  float* state[kGdnReplayParts] = {};
  const float* updates[kGdnReplayParts] = {};
};
cudaError_t gdn_replay_launch(const GdnReplayList& l, int64_t n_tokens, int n_k_heads, int n_v_heads, int head_dim,
                              int64_t update_stride, cudaStream_t stream);
// dst[i] = src[i], n halves to floats.
cudaError_t f16_to_f32_launch(const uint16_t* src, float* dst, int64_t n, cudaStream_t stream);
// Copies of whole 16-byte words in one launch (recurrent.cu): up to kCopyParts of them, each 16-byte
// aligned at both ends with bytes a multiple of 16 (copy_many_supported).
constexpr int kCopyParts = 64;
struct CopyList {
  int count = 0;
  unsigned first_block[kCopyParts + 1] = {};  // set by the launcher
  void* dst[kCopyParts] = {};
  const void* src[kCopyParts] = {};
  size_t bytes[kCopyParts] = {};
};
bool copy_many_supported(const void* dst, const void* src, size_t bytes);
cudaError_t copy_many_launch(CopyList list, cudaStream_t stream);

}  // namespace hyspec::cuda
