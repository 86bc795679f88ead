// Float kernels of the CPU backend (norms, activations, attention tiles, the gated delta rule, the
// causal conv), each written once in f32_kernels.inc against an 8-lane vector type and compiled
// twice: with AVX2+FMA (f32_kernels_avx2.cpp, chosen at run time like the dot kernels) and as
// portable scalar code (f32_kernels_scalar.cpp, the path on other CPUs). Drivers in cpu_*.cpp split
// the work across threads and call these on one part at a time. Thread-safe (no state).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "backend/cpu/quant_dot.h"

namespace hyspec::cpu {

// One query tile of causal attention against one KV head: m query rows of d floats; row r sees keys
// [0, kv_len[r]) (kv_len[r] >= 1) and gets out[r] = softmax(scale * q_r·Kᵀ) V. Key j is the d floats
// at k + j * kv_stride (likewise v). d is a multiple of 8.
struct AttentionTile {
  int m = 0, d = 0;
  const float* const* q = nullptr;
  float* const* out = nullptr;
  const int64_t* kv_len = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t kv_stride = 0;
  float scale = 1.0f;
};

// The gated delta rule over n tokens for 8 consecutive rows j0..j0+7 of one v-head's state, which
// is stored transposed (row j = S[:, j], d floats; QWEN35.md step 5). Per token t, with k, q the
// L2-normalised key and (1/sqrt(d)-scaled) query of the head's k-head:
//   u = decay_t (row·k);  δ_j = beta_t (v_t[j] - u);  row ← decay_t row + δ_j k;  o_t[j] = row·q.
// Rows are independent, so any split of a head's rows into 8-row blocks gives the same result.
struct GdnRowBlock {
  int64_t n = 0;
  int d = 0;                       // multiple of 8
  float* state = nullptr;          // row j0 of the head's state; rows are d floats apart
  const float* k = nullptr;        // token t's k at k + t * qk_stride (d floats)
  const float* q = nullptr;
  int64_t qk_stride = 0;
  const float* kq = nullptr;       // [n] k_t·q_t
  const float* decay = nullptr;    // [n] exp(g_t)
  const float* beta = nullptr;     // [n]
  const float* v = nullptr;        // token t's v[j0..j0+8) at v + t * v_stride
  int64_t v_stride = 0;
  float* out = nullptr;            // o_t[j0..j0+8) at out + t * out_stride
  int64_t out_stride = 0;
  float* capture = nullptr;        // optional: the 8 rows after token t at capture + t * capture_stride
  int64_t capture_stride = 0;
  float* deltas = nullptr;         // optional: token t's delta[j0..j0+8) at deltas + t * deltas_stride
  int64_t deltas_stride = 0;
  int64_t decay_stride = 1;        // token t's decay at decay[t * decay_stride]
};

struct F32Kernels {
  // y = x / rms(x) * w over n values (w may be null: 1). In place ok.
  void (*rms_norm)(const float* x, const float* w, int64_t n, float eps, float* y);
  // y = x / rms(x) * w * silu(z). In place ok.
  void (*gated_rms_norm)(const float* x, const float* z, const float* w, int64_t n, float eps, float* y);
  // x *= 1 / sqrt(Σx² + eps) * scale; returns nothing. (The GDN's L2 normalisation of q and k.)
  void (*l2_normalize)(float* x, int64_t n, float eps, float scale);
  float (*dot)(const float* a, const float* b, int64_t n);
  void (*add)(const float* a, const float* b, int64_t n, float* y);           // y = a + b
  void (*swiglu)(const float* g, const float* u, int64_t n, float* y);        // y = silu(g) * u
  void (*sigmoid_mul)(const float* x, const float* g, int64_t n, float* y);   // y = x * sigmoid(g)
  void (*axpy)(float a, const float* x, int64_t n, float* y);                 // y += a * x
  void (*exp)(const float* x, int64_t n, float* y);                           // y = e^x (the fast exp)
  // The first index of the largest value of x[0, n) that is at least -FLT_MAX (NaN and -inf never
  // win: the CUDA argmax's rule); -1 when there is none.
  int64_t (*argmax)(const float* x, int64_t n);
  void (*f16_to_f32)(const uint16_t* x, int64_t n, float* y);
  // Causal depthwise conv + SiLU on C channels of a run of n rows (kernel K):
  // y_t[c] = silu(Σ_i taps[i][c] · x_{t-K+1+i}[c]), where x_s is row s of x for s >= 0 and row K-1+s
  // of hist (the previous inputs, oldest first) for s < 0. All row strides in floats.
  void (*conv_silu)(const float* x, int64_t x_stride, const float* hist, int64_t hist_stride, const float* taps,
                    int64_t taps_stride, int kernel, int64_t n, int64_t C, float* y, int64_t y_stride);
  // Attention for one tile; scratch holds at least attention_scratch_floats(m, d, max kv_len) floats.
  void (*attention_tile)(const AttentionTile& t, float* scratch);
  void (*gdn_row_block)(const GdnRowBlock& b);
  // The state updates of gdn_row_block alone (row <- decay row + delta_j k), from the k, decay and
  // deltas it recorded: the same bits. Reads n, d, state, k, qk_stride, decay(_stride), deltas(_stride).
  void (*gdn_replay_block)(const GdnRowBlock& b);
};

inline size_t attention_scratch_floats(int m, int d, int64_t max_kv_len) {
  const size_t keys = static_cast<size_t>((max_kv_len + 7) / 8 * 8);
  return static_cast<size_t>(std::max(m, 8)) * (keys + 1) + static_cast<size_t>(8 * d);
}

// The kernels of one path: Avx2 and Avx512 give the AVX2 kernels when the CPU has AVX2, else scalar.
const F32Kernels& f32_kernels(DotIsa isa);
// The path the backend uses: the same choice as the dot kernels (HYSPEC_CPU_ISA=scalar forces scalar).
const F32Kernels& f32_kernels();

const F32Kernels& scalar_f32_kernels();
const F32Kernels& avx2_f32_kernels();  // only on x86-64 builds

}  // namespace hyspec::cpu
