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

// The delta rule, token by token, in one kernel. Columns j (v index) of a head's state evolve
// independently, so a block owns 16 columns of one v-head and P = d/16 lanes share a column, 16 state
// values each, kept in registers for the whole sequence. Per token: q, k L2-normalised (q also
// scaled by 1/sqrt(d)), beta = sigmoid(b), decay = exp(softplus(a + dt_bias) * ssm_a),
// S_j <- decay*S_j; u = S_j.k; S_j += k*beta*(v_j - u); o_j = S_j.q.
// The norms are folded in: one P-lane reduction gives |k|^2, |q|^2 and S_j.k_raw together, a second
// gives S_j.q_raw. Inputs are staged in shared memory `chunk` tokens at a time (one load latency
// per chunk, not per token).
// State bytes: read once, written once (+ each token's state to `capture`). FLOPs ~8*d per column
// per token; the loop is latency-bound.
__global__ void gdn_kernel(GdnKArgs a, int chunk) {
  extern __shared__ float sm[];
  const int D = a.D, P = D / 16;
  float* k_s = sm;                  // [chunk][D]
  float* q_s = k_s + chunk * D;     // [chunk][D]
  float* v_s = q_s + chunk * D;     // [chunk][16]
  float* g_s = v_s + chunk * 16;    // [chunk][2]: beta, decay
  const int tid = threadIdx.x, p = tid % P, cl = tid / P;
  const int h = blockIdx.x, hk = h % a.n_k, col = blockIdx.y * 16 + cl;
  const float ssm_a = a.ssm_a[h], dt_bias = a.dt_bias[h], q_scale = 1.0f / sqrtf(static_cast<float>(D));
  float S[16];
  float* st = a.state + (static_cast<int64_t>(h) * D + col) * D + p * 16;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float4 v = reinterpret_cast<const float4*>(st)[i];
    S[4 * i] = v.x, S[4 * i + 1] = v.y, S[4 * i + 2] = v.z, S[4 * i + 3] = v.w;
  }
  auto lane_sum = [&](float v) {
    for (int o = P / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
  };
  const int64_t n = a.v.rows;
  for (int64_t t0 = 0; t0 < n; t0 += chunk) {
    const int tc = static_cast<int>(n - t0 < chunk ? n - t0 : chunk);
    __syncthreads();  // previous chunk consumed
    // Four float4 of k and of q per thread in flight before the first store.
    for (int i0 = 0; i0 < tc * D / 4; i0 += 4 * blockDim.x) {
      float4 kv[4], qv[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int i = i0 + u * blockDim.x + tid;
        if (i < tc * D / 4) {
          const int64_t t = t0 + i / (D / 4);
          const int d4 = i % (D / 4) * 4;
          kv[u] = __ldg(reinterpret_cast<const float4*>(a.k.data + t * a.k.stride + hk * D + d4));
          qv[u] = __ldg(reinterpret_cast<const float4*>(a.q.data + t * a.q.stride + hk * D + d4));
        }
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int i = i0 + u * blockDim.x + tid;
        if (i < tc * D / 4) reinterpret_cast<float4*>(k_s)[i] = kv[u], reinterpret_cast<float4*>(q_s)[i] = qv[u];
      }
    }
    for (int i = tid; i < tc * 16; i += blockDim.x) {
      const int64_t t = t0 + i / 16;
      v_s[i] = a.v.data[t * a.v.stride + static_cast<int64_t>(h) * D + blockIdx.y * 16 + i % 16];
    }
    for (int i = tid; i < tc; i += blockDim.x) {
      const int64_t t = t0 + i;
      const float x = a.alpha.data[t * a.alpha.stride + h] + dt_bias;
      g_s[2 * i] = 1.0f / (1.0f + expf(-a.beta_logit.data[t * a.beta_logit.stride + h]));
      g_s[2 * i + 1] = expf((x > 20.0f ? x : log1pf(expf(x))) * ssm_a);
    }
    __syncthreads();
    for (int tt = 0; tt < tc; ++tt) {
      const int64_t t = t0 + tt;
      float k[16], q[16];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float4 kv = reinterpret_cast<const float4*>(k_s + tt * D + p * 16)[i];
        const float4 qv = reinterpret_cast<const float4*>(q_s + tt * D + p * 16)[i];
        k[4 * i] = kv.x, k[4 * i + 1] = kv.y, k[4 * i + 2] = kv.z, k[4 * i + 3] = kv.w;
        q[4 * i] = qv.x, q[4 * i + 1] = qv.y, q[4 * i + 2] = qv.z, q[4 * i + 3] = qv.w;
      }
      const float beta = g_s[2 * tt], decay = g_s[2 * tt + 1];
      float kk = 0.0f, qq = 0.0f, su = 0.0f;
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        S[i] *= decay;
        kk += k[i] * k[i];
        qq += q[i] * q[i];
        su += S[i] * k[i];
      }
      for (int o = P / 2; o > 0; o >>= 1) {
        kk += __shfl_xor_sync(0xffffffffu, kk, o);
        qq += __shfl_xor_sync(0xffffffffu, qq, o);
        su += __shfl_xor_sync(0xffffffffu, su, o);
      }
      const float k_inv = 1.0f / sqrtf(kk + a.eps), q_inv = 1.0f / sqrtf(qq + a.eps) * q_scale;
      const float delta_k = beta * (v_s[tt * 16 + cl] - su * k_inv) * k_inv;  // beta*(v - u), times k's norm
      float o = 0.0f;
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        S[i] += k[i] * delta_k;
        o += S[i] * q[i];
      }
      o = lane_sum(o) * q_inv;
      if (p == 0) a.out.data[t * a.out.stride + static_cast<int64_t>(h) * D + col] = o;
      if (a.capture) {
        float4* cap =
            reinterpret_cast<float4*>(a.capture + ((t * a.n_v + h) * D + col) * static_cast<int64_t>(D) + p * 16);
#pragma unroll
        for (int i = 0; i < 4; ++i) cap[i] = make_float4(S[4 * i], S[4 * i + 1], S[4 * i + 2], S[4 * i + 3]);
      }
    }
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
  // Tokens staged per chunk: as many as fit in 32 KB (16 for d = 128).
  int chunk = 32;
  while (chunk > 1 && static_cast<size_t>(chunk) * (2 * D + 18) * sizeof(float) > 32768) chunk /= 2;
  const size_t smem = static_cast<size_t>(chunk) * (2 * D + 18) * sizeof(float);
  const dim3 grid(p.n_v_heads, D / 16);
  gdn_kernel<<<grid, D, smem, stream>>>(a, chunk);
  return cudaGetLastError();
}

}  // namespace hyspec::cuda
