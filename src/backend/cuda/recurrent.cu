// The recurrent ops of the Gated DeltaNet mixer: the causal depthwise conv with its rolling state,
// and the delta-rule recurrence (QWEN35.md, "Gated DeltaNet mixer").
#include <cmath>

#include "backend/cuda/kernels.h"

namespace hyspec::cuda {
namespace {

constexpr int kMaxConvKernel = 8;

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

// y[t][c] = silu(sum_j w[c][j] * in(t - K + 1 + j)), in(tau) = x[tau] for tau >= 0, else the conv state
// row K-1+tau. A thread walks `span` consecutive tokens of one channel, its window in registers
// (in place, x == y, runs with one span covering all tokens). capture[t] = the K-1 newest inputs
// after token t. With a single span the thread also writes the new state (it read the old one
// first); otherwise conv_state_kernel does. Bytes: x and y once (+ capture), state and weights once
// per span.
__global__ void conv_kernel(Mat x, const float* __restrict__ w, int K, float* state, float* capture, Mat y,
                            int span) {
  const int64_t C = x.cols;
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * span, t1 = min(t0 + span, x.rows);
  float win[kMaxConvKernel], wc[kMaxConvKernel];
#pragma unroll
  for (int j = 0; j < kMaxConvKernel; ++j) {
    wc[j] = j < K ? w[c * K + j] : 0.0f;
    // win[j] holds in(t0 - K + 1 + j) for j < K-1 before the first token.
    const int64_t tau = t0 - K + 1 + j;
    win[j] = j >= K - 1 ? 0.0f : (tau >= 0 ? x.data[tau * x.stride + c] : state[(K - 1 + tau) * C + c]);
  }
  for (int64_t t = t0; t < t1; ++t) {
    const float xt = x.data[t * x.stride + c];
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxConvKernel; ++j) {
      if (j == K - 1) win[j] = xt;
      if (j < K) acc += wc[j] * win[j];
    }
    y.data[t * y.stride + c] = silu(acc);
    if (capture) {
#pragma unroll
      for (int j = 0; j + 1 < kMaxConvKernel; ++j)
        if (j < K - 1) capture[(t * (K - 1) + j) * C + c] = win[j + 1];
    }
#pragma unroll
    for (int j = 0; j + 1 < kMaxConvKernel; ++j)
      if (j < K - 1) win[j] = win[j + 1];
  }
  if (gridDim.y == 1) {
#pragma unroll
    for (int j = 0; j + 1 < kMaxConvKernel; ++j)
      if (j < K - 1) state[j * C + c] = win[j];
  }
}

// state[j] = in(n - K + 1 + j): reads index n + j >= j of the old state before writing j, so the
// ascending loop is safe in place. Must run after conv_kernel (stream order).
__global__ void conv_state_kernel(Mat x, int K, float* state) {
  const int64_t C = x.cols, n = x.rows;
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  for (int j = 0; j < K - 1; ++j) {
    const int64_t tau = n - K + 1 + j;
    state[j * C + c] = tau >= 0 ? x.data[tau * x.stride + c] : state[(K - 1 + tau) * C + c];
  }
}

struct GdnKArgs {
  Mat q, k, v, beta_logit, alpha, out;
  const float* ssm_a;
  const float* dt_bias;
  int n_k, n_v, D;
  float eps;
  float* state;
  float* capture;
};

// One token's inputs as one thread sees them: its 16 of the d values of q and k, v at its column,
// and the head's gate inputs.
struct GdnToken {
  float k[16], q[16], v, b, a;
};

// The delta rule, token by token, in one kernel. Columns j (v index) of a head's state evolve
// independently, so a block owns 16 columns of one v-head and P = d/16 lanes share a column, 16 state
// values each, kept in registers for the whole sequence. Per token: q, k L2-normalised (sums over the
// P lanes; q also scaled by 1/sqrt(d)), beta = sigmoid(b), decay = exp(softplus(a + dt_bias) * ssm_a),
// S_j <- decay*S_j; u = S_j.k; S_j += k*beta*(v_j - u); o_j = S_j.q.
// State bytes: read once, written once (+ each token's state to `capture`); q, k come from L1/L2
// (each block re-reads its head's), prefetched one token ahead. FLOPs ~8*d per column per token: the
// loop is latency-bound (four P-lane reductions per token).
__global__ void gdn_kernel(GdnKArgs a) {
  const int D = a.D, P = D / 16;
  const int tid = threadIdx.x, p = tid % P;
  const int h = blockIdx.x, hk = h % a.n_k, col = blockIdx.y * 16 + tid / P;
  const float ssm_a = a.ssm_a[h], dt_bias = a.dt_bias[h], q_scale = 1.0f / sqrtf(static_cast<float>(D));
  float S[16];
  float* st = a.state + (static_cast<int64_t>(h) * D + col) * D + p * 16;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float4 v = reinterpret_cast<const float4*>(st)[i];
    S[4 * i] = v.x, S[4 * i + 1] = v.y, S[4 * i + 2] = v.z, S[4 * i + 3] = v.w;
  }
  const int64_t n = a.v.rows;
  auto load = [&](int64_t t, GdnToken& x) {
    const float4* kr = reinterpret_cast<const float4*>(a.k.data + t * a.k.stride + hk * D + p * 16);
    const float4* qr = reinterpret_cast<const float4*>(a.q.data + t * a.q.stride + hk * D + p * 16);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float4 kv = __ldg(kr + i), qv = __ldg(qr + i);
      x.k[4 * i] = kv.x, x.k[4 * i + 1] = kv.y, x.k[4 * i + 2] = kv.z, x.k[4 * i + 3] = kv.w;
      x.q[4 * i] = qv.x, x.q[4 * i + 1] = qv.y, x.q[4 * i + 2] = qv.z, x.q[4 * i + 3] = qv.w;
    }
    x.v = a.v.data[t * a.v.stride + static_cast<int64_t>(h) * D + col];
    x.b = a.beta_logit.data[t * a.beta_logit.stride + h];
    x.a = a.alpha.data[t * a.alpha.stride + h];
  };
  auto lane_sum = [&](float v) {
    for (int o = P / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
  };
  GdnToken cur;
  if (n > 0) load(0, cur);
  for (int64_t t = 0; t < n; ++t) {
    GdnToken next;
    if (t + 1 < n) load(t + 1, next);
    float kk = 0.0f, qq = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; ++i) kk += cur.k[i] * cur.k[i], qq += cur.q[i] * cur.q[i];
    const float k_inv = 1.0f / sqrtf(lane_sum(kk) + a.eps);
    const float q_inv = 1.0f / sqrtf(lane_sum(qq) + a.eps) * q_scale;
    const float beta = 1.0f / (1.0f + expf(-cur.b));
    const float x = cur.a + dt_bias;
    const float decay = expf((x > 20.0f ? x : log1pf(expf(x))) * ssm_a);
    float u = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      cur.k[i] *= k_inv;
      S[i] *= decay;
      u += S[i] * cur.k[i];
    }
    const float delta = beta * (cur.v - lane_sum(u));
    float o = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      S[i] += cur.k[i] * delta;
      o += S[i] * (cur.q[i] * q_inv);
    }
    o = lane_sum(o);
    if (p == 0) a.out.data[t * a.out.stride + static_cast<int64_t>(h) * D + col] = o;
    if (a.capture) {
      float4* cap = reinterpret_cast<float4*>(a.capture + ((t * a.n_v + h) * D + col) * static_cast<int64_t>(D) + p * 16);
#pragma unroll
      for (int i = 0; i < 4; ++i) cap[i] = make_float4(S[4 * i], S[4 * i + 1], S[4 * i + 2], S[4 * i + 3]);
    }
    cur = next;
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
    reinterpret_cast<float4*>(st)[i] = make_float4(S[4 * i], S[4 * i + 1], S[4 * i + 2], S[4 * i + 3]);
}

}  // namespace

cudaError_t causal_conv_silu_launch(Mat x, const float* weight, int kernel, float* conv_state, float* capture, Mat y,
                                    cudaStream_t stream) {
  if (kernel < 1 || kernel > kMaxConvKernel) return cudaErrorInvalidValue;
  if (x.rows == 0) return cudaSuccess;
  // Spans of 64 tokens run in parallel; in place (y overlaps x) needs one span per channel.
  const bool in_place = y.data < x.data + x.rows * x.stride && x.data < y.data + y.rows * y.stride;
  const int span = in_place ? static_cast<int>(x.rows) : 64;
  const dim3 grid(static_cast<unsigned>((x.cols + 127) / 128), static_cast<unsigned>((x.rows + span - 1) / span));
  conv_kernel<<<grid, 128, 0, stream>>>(x, weight, kernel, conv_state, capture, y, span);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || grid.y == 1) return err;
  conv_state_kernel<<<static_cast<unsigned>((x.cols + 127) / 128), 128, 0, stream>>>(x, kernel, conv_state);
  return cudaGetLastError();
}

bool gdn_head_dim_supported(int d) { return d == 16 || d == 32 || d == 64 || d == 128 || d == 256 || d == 512; }

// The chunked (prompt) form runs this same recurrent kernel: its result is the recurrent form's by
// construction. A chunked-parallel kernel is an optimisation for long prompts, not yet written.
cudaError_t gdn_launch(const GdnParams& p, cudaStream_t stream) {
  if (p.q.rows == 0) return cudaSuccess;
  const int D = p.head_dim;
  GdnKArgs a{p.q, p.k, p.v, p.beta_logit, p.alpha, p.out, p.ssm_a, p.dt_bias, p.n_k_heads, p.n_v_heads, D, p.eps,
             p.state, p.capture};
  const dim3 grid(p.n_v_heads, D / 16);
  gdn_kernel<<<grid, D, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace hyspec::cuda
