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
// Inputs are staged in shared memory `chunk` tokens at a time (one load latency per chunk, not per
// token), with 1/|k|, 1/|q| (times the scale) and k.q of every token computed there once, off the
// serial chain; per token the chain is then one P-lane reduction round of S_j.k and S_j.q of the
// old state, and the output follows without a second round:
//   u = decay (S.k) / |k|,  delta = beta (v - u),  S' = decay S + k delta / |k|,
//   o = S'.q^ = q_inv (decay (S.q) + delta (k.q) / |k|).
// k and q rows are padded by 4 floats per 32 (gdn_pitch) so the 8 lanes of a column read distinct
// banks.
// State bytes: read once, written once (+ each token's state to `capture`). FLOPs ~8*d per column
// per token; the loop is latency-bound.
__host__ __device__ constexpr int gdn_pitch(int D) { return D + (D >= 32 ? D / 8 : 4); }  // rows stay 16-byte aligned
__device__ __forceinline__ int gdn_pad(int d) { return d + (d >> 5) * 4; }

__global__ void gdn_kernel(GdnKArgs a, int chunk) {
  extern __shared__ float sm[];
  const int D = a.D, P = D / 16, LD = gdn_pitch(D);
  float* k_s = sm;                  // [chunk][LD] (padded)
  float* q_s = k_s + chunk * LD;    // [chunk][LD]
  float* v_s = q_s + chunk * LD;    // [chunk][16]
  float* g_s = v_s + chunk * 16;    // [chunk][2]: beta, decay
  float* n_s = g_s + chunk * 2;     // [chunk][3]: 1/|k|, q_scale/|q|, k.q
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
        if (i < tc * D / 4) {
          const int at = i / (D / 4) * LD + gdn_pad(i % (D / 4) * 4);
          *reinterpret_cast<float4*>(k_s + at) = kv[u], *reinterpret_cast<float4*>(q_s + at) = qv[u];
        }
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
    // Norms and k.q per token: a warp per token (lanes over d) from d = 32 up, a thread per token below.
    if (D >= 32) {
      const int lane = tid & 31;
      for (int tt = tid >> 5; tt < tc; tt += blockDim.x >> 5) {
        float kk = 0.0f, qq = 0.0f, kq = 0.0f;
        for (int d = lane; d < D; d += 32) {
          const float kv = k_s[tt * LD + gdn_pad(d)], qv = q_s[tt * LD + gdn_pad(d)];
          kk += kv * kv, qq += qv * qv, kq += kv * qv;
        }
        for (int o = 16; o > 0; o >>= 1) {
          kk += __shfl_xor_sync(0xffffffffu, kk, o);
          qq += __shfl_xor_sync(0xffffffffu, qq, o);
          kq += __shfl_xor_sync(0xffffffffu, kq, o);
        }
        if (lane == 0) n_s[3 * tt] = rsqrtf(kk + a.eps), n_s[3 * tt + 1] = rsqrtf(qq + a.eps) * q_scale, n_s[3 * tt + 2] = kq;
      }
    } else {
      for (int tt = tid; tt < tc; tt += blockDim.x) {
        float kk = 0.0f, qq = 0.0f, kq = 0.0f;
        for (int d = 0; d < D; ++d) {
          const float kv = k_s[tt * LD + gdn_pad(d)], qv = q_s[tt * LD + gdn_pad(d)];
          kk += kv * kv, qq += qv * qv, kq += kv * qv;
        }
        n_s[3 * tt] = rsqrtf(kk + a.eps), n_s[3 * tt + 1] = rsqrtf(qq + a.eps) * q_scale, n_s[3 * tt + 2] = kq;
      }
    }
    __syncthreads();
#pragma unroll 2
    for (int tt = 0; tt < tc; ++tt) {
      const int64_t t = t0 + tt;
      float k[16], q[16];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float4 kv = *reinterpret_cast<const float4*>(k_s + tt * LD + gdn_pad(p * 16 + 4 * i));
        const float4 qv = *reinterpret_cast<const float4*>(q_s + tt * LD + gdn_pad(p * 16 + 4 * i));
        k[4 * i] = kv.x, k[4 * i + 1] = kv.y, k[4 * i + 2] = kv.z, k[4 * i + 3] = kv.w;
        q[4 * i] = qv.x, q[4 * i + 1] = qv.y, q[4 * i + 2] = qv.z, q[4 * i + 3] = qv.w;
      }
      const float beta = g_s[2 * tt], decay = g_s[2 * tt + 1];
      float sk0 = 0.0f, sk1 = 0.0f, sq0 = 0.0f, sq1 = 0.0f;
#pragma unroll
      for (int i = 0; i < 16; i += 2) {
        sk0 += S[i] * k[i], sk1 += S[i + 1] * k[i + 1];
        sq0 += S[i] * q[i], sq1 += S[i + 1] * q[i + 1];
      }
      float sk = sk0 + sk1, sq = sq0 + sq1;
      for (int o = P / 2; o > 0; o >>= 1) {
        sk += __shfl_xor_sync(0xffffffffu, sk, o);
        sq += __shfl_xor_sync(0xffffffffu, sq, o);
      }
      const float k_inv = n_s[3 * tt], q_inv = n_s[3 * tt + 1], kq = n_s[3 * tt + 2];
      const float delta = beta * (v_s[tt * 16 + cl] - decay * sk * k_inv);
      const float dk = delta * k_inv;
      const float o = q_inv * (decay * sq + dk * kq);
#pragma unroll
      for (int i = 0; i < 16; ++i) S[i] = S[i] * decay + k[i] * dk;
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
  // Tokens staged per chunk: as many as fit in 40 KB (16 for d = 128).
  const size_t per_token = (2 * static_cast<size_t>(gdn_pitch(D)) + 16 + 2 + 3) * sizeof(float);
  int chunk = 32;
  while (chunk > 1 && chunk * per_token > 40960) chunk /= 2;
  const size_t smem = chunk * per_token;
  const dim3 grid(p.n_v_heads, D / 16);
  gdn_kernel<<<grid, D, smem, stream>>>(a, chunk);
  return cudaGetLastError();
}

}  // namespace hyspec::cuda
