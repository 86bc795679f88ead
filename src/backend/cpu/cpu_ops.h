// Internal to the CPU backend: the op implementations, split by family across files.
#pragma once
#include <cmath>
#include <vector>

#include "backend/backend.h"
#include "util/thread_pool.h"

namespace hyspec::cpu {

// Per-thread scratch that grows on demand and is reused across calls.
float* scratch_floats(size_t n, int slot = 0);

void matmul(ThreadPool& pool, const Weight& w, Rows x, Rows y);
// Weight::exact: each weight row dequantized to f32 once per call and dotted with f32 activations.
void matmul_exact(ThreadPool& pool, const Weight& w, Rows x, Rows y);
// One expert of a stacked expert tensor as a plain weight.
Weight expert_slice(const Weight& w, int64_t expert);
void attention(ThreadPool& pool, const AttentionArgs& a);
void kv_store(Rows k, Rows v, KvLayer kv, const int32_t* positions);
void causal_conv_silu(ThreadPool& pool, Rows x, const float* weight, int kernel, float* conv_state, float* capture,
                      Rows y);
void gated_delta_net(ThreadPool& pool, const GdnArgs& a);
void moe_ffn(ThreadPool& pool, const MoeArgs& a);

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

}  // namespace hyspec::cpu
