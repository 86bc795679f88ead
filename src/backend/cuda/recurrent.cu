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

// q, k L2-normalised per head (x / sqrt(sum x^2 + eps)); q also scaled by 1/sqrt(d). A warp per
// (token, head, q|k). Output [n, n_k_heads, d] each.
__global__ void gdn_normalize_kernel(Mat q, Mat k, int n_k, int D, float eps, float* qn, float* kn) {
  const int lane = threadIdx.x & 31;
  const int64_t wid = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  if (wid >= q.rows * n_k * 2) return;
  const bool is_k = wid & 1;
  const int64_t t = wid / 2 / n_k, h = wid / 2 % n_k;
  const Mat& src = is_k ? k : q;
  const float* x = src.data + t * src.stride + h * D;
  float ss = 0.0f;
  for (int i = lane; i < D; i += 32) ss += x[i] * x[i];
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  float scale = 1.0f / sqrtf(ss + eps);
  if (!is_k) scale /= sqrtf(static_cast<float>(D));
  float* dst = (is_k ? kn : qn) + (t * n_k + h) * D;
  for (int i = lane; i < D; i += 32) dst[i] = x[i] * scale;
}

// Per (token, v-head): beta = sigmoid(b), decay = exp(softplus(a + dt_bias) * ssm_a).
__global__ void gdn_gates_kernel(Mat beta_logit, Mat alpha, const float* __restrict__ ssm_a,
                                 const float* __restrict__ dt_bias, int n_v, float2* bd) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= beta_logit.rows * n_v) return;
  const int64_t t = i / n_v;
  const int h = static_cast<int>(i % n_v);
  const float b = beta_logit.data[t * beta_logit.stride + h];
  const float x = alpha.data[t * alpha.stride + h] + dt_bias[h];
  const float sp = x > 20.0f ? x : log1pf(expf(x));
  bd[i] = make_float2(1.0f / (1.0f + expf(-b)), expf(sp * ssm_a[h]));
}

struct GdnKArgs {
  const float* qn;
  const float* kn;
  const float2* bd;
  Mat v, out;
  int n_k, n_v, D;
  float* state;
  float* capture;
};

// The delta rule, token by token. Columns j (v index) of a head's state evolve independently, so a
// block owns 16 columns of one v-head and P = d/16 lanes share a column, 16 state values each, in
// registers for the whole sequence: S_j <- decay*S_j; u = S_j.k; S_j += k*beta*(v_j - u);
// o_j = S_j.q (two reductions over P lanes per token). State bytes: read once, written once (+ each
// token's state to `capture`); per token q, k (d floats each) come from L1/L2, prefetched one token
// ahead. FLOPs: ~6*d per state column per token — the loop is latency-bound, not throughput-bound.
__global__ void gdn_recurrent_kernel(GdnKArgs a) {
  const int D = a.D, P = D / 16;
  const int tid = threadIdx.x, p = tid % P;
  const int h = blockIdx.x, hk = h % a.n_k, col = blockIdx.y * 16 + tid / P;
  float S[16];
  float* st = a.state + (static_cast<int64_t>(h) * D + col) * D + p * 16;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float4 v = reinterpret_cast<const float4*>(st)[i];
    S[4 * i] = v.x, S[4 * i + 1] = v.y, S[4 * i + 2] = v.z, S[4 * i + 3] = v.w;
  }
  const int64_t n = a.v.rows;
  auto load = [&](int64_t t, float (&k)[16], float (&q)[16], float& vj, float2& g) {
    const float4* kr = reinterpret_cast<const float4*>(a.kn + (t * a.n_k + hk) * D + p * 16);
    const float4* qr = reinterpret_cast<const float4*>(a.qn + (t * a.n_k + hk) * D + p * 16);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float4 kv = kr[i], qv = qr[i];
      k[4 * i] = kv.x, k[4 * i + 1] = kv.y, k[4 * i + 2] = kv.z, k[4 * i + 3] = kv.w;
      q[4 * i] = qv.x, q[4 * i + 1] = qv.y, q[4 * i + 2] = qv.z, q[4 * i + 3] = qv.w;
    }
    vj = a.v.data[t * a.v.stride + static_cast<int64_t>(h) * D + col];
    g = a.bd[t * a.n_v + h];
  };
  float k[16], q[16], vj = 0.0f;
  float2 g = make_float2(0.f, 0.f);
  if (n > 0) load(0, k, q, vj, g);
  for (int64_t t = 0; t < n; ++t) {
    float kn[16], qn[16], vn = 0.0f;
    float2 gn = make_float2(0.f, 0.f);
    if (t + 1 < n) load(t + 1, kn, qn, vn, gn);
    float u = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      S[i] *= g.y;
      u += S[i] * k[i];
    }
    for (int o = P / 2; o > 0; o >>= 1) u += __shfl_xor_sync(0xffffffffu, u, o);
    const float delta = g.x * (vj - u);
    float o_acc = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      S[i] += k[i] * delta;
      o_acc += S[i] * q[i];
    }
    for (int o = P / 2; o > 0; o >>= 1) o_acc += __shfl_xor_sync(0xffffffffu, o_acc, o);
    if (p == 0) a.out.data[t * a.out.stride + static_cast<int64_t>(h) * D + col] = o_acc;
    if (a.capture) {
      float4* cap = reinterpret_cast<float4*>(a.capture + ((t * a.n_v + h) * D + col) * static_cast<int64_t>(D) + p * 16);
#pragma unroll
      for (int i = 0; i < 4; ++i) cap[i] = make_float4(S[4 * i], S[4 * i + 1], S[4 * i + 2], S[4 * i + 3]);
    }
#pragma unroll
    for (int i = 0; i < 16; ++i) k[i] = kn[i], q[i] = qn[i];
    vj = vn, g = gn;
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
    reinterpret_cast<float4*>(st)[i] = make_float4(S[4 * i], S[4 * i + 1], S[4 * i + 2], S[4 * i + 3]);
}

size_t align256(size_t v) { return (v + 255) / 256 * 256; }

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

size_t gdn_scratch_bytes(const GdnParams& p) {
  const size_t n = static_cast<size_t>(p.q.rows);
  return 2 * align256(n * p.n_k_heads * p.head_dim * sizeof(float)) + align256(n * p.n_v_heads * sizeof(float2));
}

// The chunked (prompt) form runs this same recurrent kernel: its result is the recurrent form's by
// construction. A chunked-parallel kernel is an optimisation for long prompts, not yet written.
cudaError_t gdn_launch(const GdnParams& p, float* scratch, cudaStream_t stream) {
  const int64_t n = p.q.rows;
  if (n == 0) return cudaSuccess;
  const int D = p.head_dim;
  float* qn = scratch;
  float* kn = reinterpret_cast<float*>(reinterpret_cast<char*>(qn) + align256(n * p.n_k_heads * D * sizeof(float)));
  auto* bd = reinterpret_cast<float2*>(reinterpret_cast<char*>(kn) + align256(n * p.n_k_heads * D * sizeof(float)));
  const int64_t warps = n * p.n_k_heads * 2;
  gdn_normalize_kernel<<<static_cast<unsigned>((warps * 32 + 255) / 256), 256, 0, stream>>>(p.q, p.k, p.n_k_heads, D,
                                                                                           p.eps, qn, kn);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  gdn_gates_kernel<<<static_cast<unsigned>((n * p.n_v_heads + 255) / 256), 256, 0, stream>>>(
      p.beta_logit, p.alpha, p.ssm_a, p.dt_bias, p.n_v_heads, bd);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  GdnKArgs a{qn, kn, bd, p.v, p.out, p.n_k_heads, p.n_v_heads, D, p.state, p.capture};
  const dim3 grid(p.n_v_heads, D / 16);
  gdn_recurrent_kernel<<<grid, 16 * (D / 16), 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace hyspec::cuda
