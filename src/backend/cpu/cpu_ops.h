// Internal to the CPU backend: the op implementations, split by family across files. Ops that have
// SIMD kernels take the kernel table (f32_kernels.h) so tests can run both paths on one machine.
#pragma once
#include <cmath>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/f32_kernels.h"
#include "util/thread_pool.h"

namespace hyspec::cpu {

// Per-thread scratch that grows on demand and is reused across calls.
float* scratch_floats(size_t n, int slot = 0);

// Work estimated below this many nanoseconds on one thread runs on the caller alone. A hand-off to
// a spinning worker costs about a microsecond of latency plus a cache line or two per part; waking a
// sleeping one costs the caller a futex syscall; on an oversubscribed machine the worker may not run
// at all for a while (the pool then lets the caller do its parts, but the wake-up is still paid).
// Below ~20 µs of work a second thread cannot win that back, which keeps single-token steps of
// small models (every op a few µs) entirely on the caller.
constexpr double kMinParallelNs = 20000;

// pool.parallel_for(n, fn, grain) when n * ns_per_index is worth a hand-off, else fn(0, n, 0).
template <typename Fn>
void parallel_for_cost(ThreadPool& pool, int64_t n, double ns_per_index, Fn&& fn, int64_t grain = 1) {
  if (n <= 0) return;
  if (pool.size() == 1 || static_cast<double>(n) * ns_per_index < kMinParallelNs) {
    fn(int64_t{0}, n, 0);
    return;
  }
  pool.parallel_for(n, fn, grain);
}

void matmul(ThreadPool& pool, const Weight& w, Rows x, Rows y);
// Weight::exact: each weight row dequantized to f32 once per call and dotted with f32 activations.
void matmul_exact(ThreadPool& pool, const Weight& w, Rows x, Rows y);
// One expert of a stacked expert tensor as a plain weight.
Weight expert_slice(const Weight& w, int64_t expert);

// Row-wise float ops (backend.h semantics), cpu_elementwise.cpp.
void rms_norm(ThreadPool& pool, Rows x, const float* w, int64_t group, float eps, Rows y,
              const F32Kernels& k = f32_kernels());
void gated_rms_norm(ThreadPool& pool, Rows x, Rows z, const float* w, int64_t group, float eps, Rows y,
                    const F32Kernels& k = f32_kernels());
void add(ThreadPool& pool, Rows a, Rows b, Rows y, const F32Kernels& k = f32_kernels());
void add_rms_norm(ThreadPool& pool, Rows x, Rows delta, const float* w, int64_t group, float eps, Rows h,
                  const F32Kernels& k = f32_kernels());
void swiglu(ThreadPool& pool, Rows gate, Rows up, Rows y, const F32Kernels& k = f32_kernels());
void sigmoid_mul(ThreadPool& pool, Rows x, Rows gate, Rows y, const F32Kernels& k = f32_kernels());
void add_sigmoid_scaled(ThreadPool& pool, Rows x, Rows g, Rows y, const F32Kernels& k = f32_kernels());
void rope_neox(Rows x, int head_dim, int n_rot, const int32_t* positions, float freq_base);

void attention(ThreadPool& pool, const AttentionArgs& a, const F32Kernels& k = f32_kernels());
void kv_store(Rows k, Rows v, KvLayer kv, const int32_t* positions);
void causal_conv_silu(ThreadPool& pool, Rows x, const float* weight, int kernel, float* conv_state, float* capture,
                      Rows y, const F32Kernels& k = f32_kernels());
void gated_delta_net(ThreadPool& pool, const GdnArgs& a, const F32Kernels& k = f32_kernels());
void gdn_replay(ThreadPool& pool, const Backend::GdnReplayPart* parts, size_t count, int64_t n_tokens, int n_k_heads,
                int n_v_heads, int head_dim, const F32Kernels& k = f32_kernels());
void moe_ffn(ThreadPool& pool, const MoeArgs& a);
void argmax(ThreadPool& pool, Rows x, int32_t* out, const F32Kernels& k = f32_kernels());
// The sampler's row summaries and candidate selection (backend.h semantics), cpu_elementwise.cpp.
void logit_summary(ThreadPool& pool, Rows x, float inv_t, float* out);
void draw_token(ThreadPool& pool, Rows x, TokenDraw* draw);  // Backend::draw_token
void draw_top_k(ThreadPool& pool, Rows x, TokenDraw* draw);  // Backend::draw_top_k
void select_logits(Rows x, int64_t row, float threshold, int32_t cap, int32_t* count, SelectedLogit* picked);

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

}  // namespace hyspec::cpu
