// The recurrent ops of the Gated DeltaNet mixer: the causal depthwise conv with its rolling state,
// and the delta-rule recurrence (QWEN35.md, "Gated DeltaNet mixer").
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/activations.cuh"
#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch_util.h"
#ifdef HYSPEC_GDN_TRACE
#include "backend/cuda/timeline.cuh"
#endif

namespace hyspec::cuda {

// ---- gdn_kernel's timeline (cmake -DHYSPEC_GDN_TRACE=ON; compiled out otherwise) ----
// Thread 0 of each block stores %globaltimer at the phases below, the last launch's values kept
// (gdn_trace_report). PERFORMANCE.md "Session 35" read a verify step's recurrence with it.
enum GdnMark { kGdnStart, kGdnWaited, kGdnStaged, kGdnNormed, kGdnLoopDone, kGdnEnd, kGdnMarks };
#ifdef HYSPEC_GDN_TRACE
__device__ BlockTimeline<4096, kGdnMarks> g_gdn_trace;
__device__ __forceinline__ void gdn_mark(GdnMark m) { timeline_mark(g_gdn_trace, blockIdx.x + gridDim.x * blockIdx.y, m); }
void gdn_trace_report(const char* label) {
  const char* const names[kGdnMarks] = {"start", "waited", "staged", "normed", "loop done", "end"};
  timeline_report(g_gdn_trace, names, label);
}
#else
__device__ __forceinline__ void gdn_mark(GdnMark) {}
#endif

namespace {

constexpr int kMaxConvKernel = 8;

// y[t][c] = silu(sum_j w[c][j] * in(t - K + 1 + j)), in(tau) = x[tau] for tau >= 0, else the conv state
// row K-1+tau. A thread walks `span` consecutive tokens of one channel, its window in registers
// (in place, x == y, runs with one span covering all tokens). capture[t] = the K-1 newest inputs
// after token t. The first span's thread writes the new state: only it reads the old one (spans are
// at least K-1 tokens), before writing; with several spans the new state is the last K-1 inputs.
// Outputs depend on the inputs only, so any span split gives the same bits. Bytes: x and y once
// (+ capture), state and weights once per span.
// kFma: the products accumulate with explicit fmaf. Prompts of more than 64 tokens (16-token spans, no
// capture) take it: 512 tokens of 8192 channels 42 -> 21 us on the H200. Decode and verify steps keep
// the plain expression: with fmaf a 9B Q4_K_M verify-16 step ran 4.97 ms against 4.75 (H100, session 20),
// and a verify row must get the decode step's bits whatever its width.
// kK: the kernel size as a constant (4: Qwen3.5's), or 0: K. The loops over the window then unroll to 4
// instead of kMaxConvKernel's 8 predicated slots (49 -> 20 KB of SASS): a verify-15 step -1.1% (session 36).
template <bool kFma, int kK = 0>
__global__ void conv_kernel(Mat x, const float* __restrict__ w, int K_arg, float* state, float* capture, Mat y,
                            int span) {
  constexpr int kWin = kK ? kK : kMaxConvKernel;  // the window arrays and loops
  const int K = kK ? kK : K_arg;
  const int64_t C = x.cols;
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * span, t1 = min(t0 + span, x.rows);
  // The weights and the window's state rows first, while the previous kernel (the projection that
  // writes x) finishes: the state was written by an earlier step, which every kernel before that
  // projection waited for. win[j] holds in(t0 - K + 1 + j) for j < K-1 before the first token.
  float win[kWin], wc[kWin];
#pragma unroll
  for (int j = 0; j < kWin; ++j) {
    const int64_t tau = t0 - K + 1 + j;
    wc[j] = c < C && j < K ? w[c * K + j] : 0.0f;
    win[j] = c < C && j < K - 1 && tau < 0 ? state[(K - 1 + tau) * C + c] : 0.0f;
  }
  pdl_wait();
  pdl_trigger();
  if (c >= C) return;
#pragma unroll
  for (int j = 0; j < kWin; ++j) {
    const int64_t tau = t0 - K + 1 + j;
    if (j < K - 1 && tau >= 0) win[j] = x.data[tau * x.stride + c];
  }
  // kConvBatch tokens' inputs are loaded before any of their outputs is stored: one memory round trip
  // per batch instead of per token (a verify step's 17 tokens took 15 us one by one). In place, y[t]
  // is x[t], which was read before.
  constexpr int kConvBatch = 8;
  for (int64_t tb = t0; tb < t1; tb += kConvBatch) {
    float xs[kConvBatch];
#pragma unroll
    for (int i = 0; i < kConvBatch; ++i) xs[i] = tb + i < t1 ? x.data[(tb + i) * x.stride + c] : 0.0f;
#pragma unroll
    for (int i = 0; i < kConvBatch; ++i) {
      const int64_t t = tb + i;
      if (t >= t1) break;
      float acc = 0.0f;
#pragma unroll
      for (int j = 0; j < kWin; ++j) {
        if (j == K - 1) win[j] = xs[i];
        if constexpr (kFma) {
          if (j < K) acc = fmaf(wc[j], win[j], acc);
        } else {
          if (j < K) acc += wc[j] * win[j];
        }
      }
      y.data[t * y.stride + c] = silu(acc);
      if (capture) {
#pragma unroll
        for (int j = 0; j + 1 < kWin; ++j)
          if (j < K - 1) capture[(t * (K - 1) + j) * C + c] = win[j + 1];
      }
#pragma unroll
      for (int j = 0; j + 1 < kWin; ++j)
        if (j < K - 1) win[j] = win[j + 1];
    }
  }
  if (gridDim.y == 1) {
#pragma unroll
    for (int j = 0; j + 1 < kWin; ++j)
      if (j < K - 1) state[j * C + c] = win[j];
  } else if (blockIdx.y == 0) {
#pragma unroll
    for (int j = 0; j + 1 < kWin; ++j)
      if (j < K - 1) state[j * C + c] = x.data[(x.rows - K + 1 + j) * x.stride + c];
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
  uint16_t* capture_f16;
  float* updates;  // GdnParams::updates: keys, then coefficients dk, then decays, update_stride floats a token
  int64_t update_stride;
};

// One state value's update, S <- decay S + k dk: the one rounding sequence of gdn_kernel and its replay.
__device__ __forceinline__ float gdn_decay_add(float s, float decay, float k, float dk) {
  return __fmaf_rn(k, dk, __fmul_rn(s, decay));
}

// Lane p of a state column's P lanes holds its float4s p, p + P, p + 2P, p + 3P (16 values): the lanes
// of a column read and write 16*P contiguous bytes per instruction. gdn_kernel and its replay.
__device__ __forceinline__ void load_column(const float* st, int p, int P, float (&S)[16]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float4 v = reinterpret_cast<const float4*>(st)[p + P * i];
    S[4 * i] = v.x, S[4 * i + 1] = v.y, S[4 * i + 2] = v.z, S[4 * i + 3] = v.w;
  }
}
__device__ __forceinline__ void store_column(float* st, int p, int P, const float (&S)[16]) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
    reinterpret_cast<float4*>(st)[p + P * i] = make_float4(S[4 * i], S[4 * i + 1], S[4 * i + 2], S[4 * i + 3]);
}

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
// The lanes of a column read a token's k and q as contiguous float4s (no bank conflicts without
// padding; rows of head dims under 32, read a thread per token, take 4 floats more).
// With `updates` each token's update is recorded instead (k as read, dk = delta / |k| per column, the
// decay: ~1/d of a state) and the state is not written back; gdn_replay_kernel applies a prefix.
// State bytes: read once, written once (+ each token's state to `capture`). FLOPs ~8*d per column
// per token; the loop is latency-bound.
__host__ __device__ constexpr int gdn_pitch(int D) { return D >= 32 ? D : D + 4; }  // rows stay 16-byte aligned

// kD: the head dim as a constant (the 9B's and 27B's 128: the lanes' reduction rounds unrolled and the
// shared-memory addressing folded), or 0: a.D. H100, 9B shapes, 16 tokens recording updates: 10.9 -> 8.8
// us, one token 3.44 -> 3.25. (8 state values a lane, twice the blocks, took 11.3: a fourth shuffle round
// on the per-token chain costs more than the second warp per scheduler gains.)
// kWide: a step of several tokens (the staging, norms and outputs below); a one-token step (false) keeps
// the plain forms: its tokens' outputs need no second pass, and with the several-token forms a decode
// step at depth 16K ran 0.6% slower (H200; at depth 0 level; why was not traced).
template <int kD, bool kWide>
__global__ void gdn_kernel(GdnKArgs a, int chunk) {
  extern __shared__ float sm[];
  const int D = kD ? kD : a.D, P = D / 16, LD = gdn_pitch(D);
  float* k_s = sm;                  // [chunk][LD]
  float* q_s = k_s + chunk * LD;    // [chunk][LD]
  float* v_s = q_s + chunk * LD;    // [chunk][16]
  float* o_s = v_s + chunk * 16;    // [chunk][16]: the outputs, written out once a chunk
  float* dk_s = o_s + chunk * 16;   // [chunk][16]: the recorded coefficients (with `updates`)
  float* g_s = dk_s + chunk * 16;   // [chunk][2]: beta, decay
  float* n_s = g_s + chunk * 2;     // [chunk][3]: 1/|k|, q_scale/|q|, k.q
  const int tid = threadIdx.x, p = tid % P, cl = tid / P;
  const int h = blockIdx.x, hk = h % a.n_k, col = blockIdx.y * 16 + cl;
  const float ssm_a = a.ssm_a[h], dt_bias = a.dt_bias[h], q_scale = 1.0f / sqrtf(static_cast<float>(D));
  const bool capture = a.capture != nullptr, capture_f16 = a.capture_f16 != nullptr, updates = a.updates != nullptr;
  float S[16];
  // Lane p of a column holds its float4s p, p + P, p + 2P, p + 3P (16 values): the P lanes of a column
  // read and write 16*P contiguous bytes per instruction (state, capture) and distinct banks of k, q.
  gdn_mark(kGdnStart);
  float* st = a.state + (static_cast<int64_t>(h) * D + col) * D;
  load_column(st, p, P, S);
  // The state (an earlier step's, which every kernel before the conv waited for) and the weights are
  // in flight before waiting on the conv that writes q, k and v.
  pdl_wait();
  pdl_trigger();
  gdn_mark(kGdnWaited);
  const int64_t n = a.v.rows;
  for (int64_t t0 = 0; t0 < n; t0 += chunk) {
    const int tc = static_cast<int>(n - t0 < chunk ? n - t0 : chunk);
    __syncthreads();  // previous chunk consumed
    // Several tokens: one round trip a chunk, the v columns, gates and the first four float4 of k and of
    // q per thread all in flight before the first store (a chunk of 16 tokens at d = 128 is one batch).
    constexpr int kVRegs = kWide ? 4 : 0;
    float vr[kVRegs > 0 ? kVRegs : 1], alpha_r = 0.0f, beta_r = 0.0f;
#pragma unroll
    for (int u = 0; u < kVRegs; ++u) {
      const int i = u * blockDim.x + tid;
      if (i < tc * 16) vr[u] = __ldg(a.v.data + (t0 + i / 16) * a.v.stride + static_cast<int64_t>(h) * D + blockIdx.y * 16 + i % 16);
    }
    if (kWide && tid < tc) {
      alpha_r = __ldg(a.alpha.data + (t0 + tid) * a.alpha.stride + h);
      beta_r = __ldg(a.beta_logit.data + (t0 + tid) * a.beta_logit.stride + h);
    }
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
          const int at = i / (D / 4) * LD + i % (D / 4) * 4;
          *reinterpret_cast<float4*>(k_s + at) = kv[u], *reinterpret_cast<float4*>(q_s + at) = qv[u];
          if (updates && blockIdx.y == 0 && h < a.n_k)  // k-head h's keys, once
            *reinterpret_cast<float4*>(a.updates + (t0 + i / (D / 4)) * a.update_stride + h * D + i % (D / 4) * 4) =
                kv[u];
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kVRegs; ++u) {
      const int i = u * blockDim.x + tid;
      if (i < tc * 16) v_s[i] = vr[u];
    }
    for (int i = kVRegs * blockDim.x + tid; i < tc * 16; i += blockDim.x)  // (one token; head dims under 128)
      v_s[i] = a.v.data[(t0 + i / 16) * a.v.stride + static_cast<int64_t>(h) * D + blockIdx.y * 16 + i % 16];
    for (int i = tid; i < tc; i += blockDim.x) {
      const int64_t t = t0 + i;
      const float x = (kWide && i == tid ? alpha_r : a.alpha.data[t * a.alpha.stride + h]) + dt_bias;
      g_s[2 * i] = sigmoid(kWide && i == tid ? beta_r : a.beta_logit.data[t * a.beta_logit.stride + h]);
      g_s[2 * i + 1] = expf((x > 20.0f ? x : log1pf(expf(x))) * ssm_a);
      if (updates && blockIdx.y == 0) a.updates[t * a.update_stride + (a.n_k + a.n_v) * D + h] = g_s[2 * i + 1];
    }
    __syncthreads();
    gdn_mark(kGdnStaged);
    // Norms and k.q per token: a warp per token (lanes over d) from d = 32 up, with several tokens two a
    // warp at a time so their shuffle rounds overlap; a thread per token below.
    if (kWide && D >= 32) {
      const int lane = tid & 31, warps = blockDim.x >> 5;
      for (int tt = tid >> 5; tt < tc; tt += 2 * warps) {
        const int tb = min(tt + warps, tc - 1);  // the second token (recomputes tt's when there is none)
        float kk = 0.0f, qq = 0.0f, kq = 0.0f, kk2 = 0.0f, qq2 = 0.0f, kq2 = 0.0f;
        for (int d = lane; d < D; d += 32) {
          const float kv = k_s[tt * LD + d], qv = q_s[tt * LD + d];
          const float kv2 = k_s[tb * LD + d], qv2 = q_s[tb * LD + d];
          kk += kv * kv, qq += qv * qv, kq += kv * qv;
          kk2 += kv2 * kv2, qq2 += qv2 * qv2, kq2 += kv2 * qv2;
        }
        for (int o = 16; o > 0; o >>= 1) {
          kk += __shfl_xor_sync(0xffffffffu, kk, o);
          qq += __shfl_xor_sync(0xffffffffu, qq, o);
          kq += __shfl_xor_sync(0xffffffffu, kq, o);
          kk2 += __shfl_xor_sync(0xffffffffu, kk2, o);
          qq2 += __shfl_xor_sync(0xffffffffu, qq2, o);
          kq2 += __shfl_xor_sync(0xffffffffu, kq2, o);
        }
        if (lane == 0) {
          n_s[3 * tt] = rsqrtf(kk + a.eps), n_s[3 * tt + 1] = rsqrtf(qq + a.eps) * q_scale, n_s[3 * tt + 2] = kq;
          if (tt + warps < tc)
            n_s[3 * tb] = rsqrtf(kk2 + a.eps), n_s[3 * tb + 1] = rsqrtf(qq2 + a.eps) * q_scale, n_s[3 * tb + 2] = kq2;
        }
      }
    } else if (D >= 32) {
      const int lane = tid & 31;
      for (int tt = tid >> 5; tt < tc; tt += blockDim.x >> 5) {
        float kk = 0.0f, qq = 0.0f, kq = 0.0f;
        for (int d = lane; d < D; d += 32) {
          const float kv = k_s[tt * LD + d], qv = q_s[tt * LD + d];
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
          const float kv = k_s[tt * LD + d], qv = q_s[tt * LD + d];
          kk += kv * kv, qq += qv * qv, kq += kv * qv;
        }
        n_s[3 * tt] = rsqrtf(kk + a.eps), n_s[3 * tt + 1] = rsqrtf(qq + a.eps) * q_scale, n_s[3 * tt + 2] = kq;
      }
    }
    __syncthreads();
    gdn_mark(kGdnNormed);
    // The token loop: per token one P-lane reduction round of S.k and S.q. With several tokens their
    // outputs and coefficients go to shared memory (lane 0 of each column), and out to global memory
    // after the chunk, so the serial chain carries no 64-bit address arithmetic (a verify step's 16
    // tokens: 8.8 -> 7.6 us, H200).
    const int64_t cap_token = static_cast<int64_t>(a.n_v) * D * D;
    const int64_t cap_col = ((t0 * a.n_v + h) * D + col) * static_cast<int64_t>(D);
#pragma unroll 2
    for (int tt = 0; tt < tc; ++tt) {
      const float* kt = k_s + tt * LD;
      const float* qt = q_s + tt * LD;
      float k[16], q[16];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float4 kv = *reinterpret_cast<const float4*>(kt + 4 * (p + P * i));
        const float4 qv = *reinterpret_cast<const float4*>(qt + 4 * (p + P * i));
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
#pragma unroll
      for (int o = P / 2; o > 0; o >>= 1) {
        sk += __shfl_xor_sync(0xffffffffu, sk, o);
        sq += __shfl_xor_sync(0xffffffffu, sq, o);
      }
      const float k_inv = n_s[3 * tt], q_inv = n_s[3 * tt + 1], kq = n_s[3 * tt + 2];
      const float delta = beta * (v_s[tt * 16 + cl] - decay * sk * k_inv);
      const float dk = delta * k_inv;
      const float o = q_inv * (decay * sq + dk * kq);
#pragma unroll
      for (int i = 0; i < 16; ++i) S[i] = gdn_decay_add(S[i], decay, k[i], dk);
      if (p == 0) {
        if constexpr (kWide) {
          o_s[tt * 16 + cl] = o, dk_s[tt * 16 + cl] = dk;
        } else {
          const int64_t c = static_cast<int64_t>(h) * D + col, t = t0 + tt;
          a.out.data[t * a.out.stride + c] = o;
          if (updates) a.updates[t * a.update_stride + a.n_k * D + c] = dk;
        }
      }
      if (capture) {
        float4* cap = reinterpret_cast<float4*>(a.capture + cap_col + tt * cap_token);
#pragma unroll
        for (int i = 0; i < 4; ++i) cap[p + P * i] = make_float4(S[4 * i], S[4 * i + 1], S[4 * i + 2], S[4 * i + 3]);
      } else if (capture_f16) {
        uint2* cap = reinterpret_cast<uint2*>(a.capture_f16 + cap_col + tt * cap_token);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const __half2 lo = __floats2half2_rn(S[4 * i], S[4 * i + 1]), hi = __floats2half2_rn(S[4 * i + 2], S[4 * i + 3]);
          cap[p + P * i] = make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
        }
      }
    }
    if (!kWide) continue;
    __syncthreads();
    // The chunk's outputs (and coefficients), 16 contiguous columns a token.
    for (int i = tid; i < tc * 16; i += blockDim.x) {
      const int64_t t = t0 + i / 16;
      const int64_t c = static_cast<int64_t>(h) * D + blockIdx.y * 16 + i % 16;
      a.out.data[t * a.out.stride + c] = o_s[i];
      if (updates) a.updates[t * a.update_stride + a.n_k * D + c] = dk_s[i];
    }
  }
  gdn_mark(kGdnLoopDone);
  if (updates) return;  // the state stays as it was: a rollback replays the updates it keeps
  store_column(st, p, P, S);
  gdn_mark(kGdnEnd);
}

// gdn_kernel's state updates alone, from the updates it recorded: a block per (v-head, 16 columns,
// part), the thread layout of gdn_kernel, so each value takes the same gdn_decay_add sequence. The
// records of kReplayStage tokens (the k-head's keys, the 16 columns' coefficients, the decays) are
// staged in shared memory with all their loads in flight at once: read token by token from L2 or
// HBM, each token waited on its own loads (15 tokens: 0.096 ms for a 9B's 24 layers, twice a copy of
// the states). Bytes: each state read and written once, n tokens' records (~1/d of a state each).
constexpr int kReplayStage = 16;
__global__ void gdn_replay_kernel(GdnReplayList l, int n, int n_k, int n_v, int64_t stride) {
  extern __shared__ float4 stage[];  // [kReplayStage][D / 4] keys, then [kReplayStage][16 + 1] floats
  const int D = blockDim.x, P = D / 16, p = threadIdx.x % P, cl = threadIdx.x / P;
  const int h = blockIdx.x, hk = h % n_k, col0 = blockIdx.y * 16, col = col0 + cl;
  float* coef = reinterpret_cast<float*>(stage + kReplayStage * (D / 4));  // [t][16] dk, then [t] decay
  float* st = l.state[blockIdx.z] + (static_cast<int64_t>(h) * D + col) * D;
  const float* rec = l.updates[blockIdx.z];
  pdl_wait();  // the verify step that recorded the updates
  pdl_trigger();
  float S[16];
  load_column(st, p, P, S);
  for (int t0 = 0; t0 < n; t0 += kReplayStage) {
    const int tc = min(kReplayStage, n - t0);
    __syncthreads();  // the previous stage is consumed
    for (int i = threadIdx.x; i < tc * (D / 4); i += D) {
      const int t = i / (D / 4), e = i % (D / 4);
      stage[i] = reinterpret_cast<const float4*>(rec + (t0 + t) * stride + hk * D)[e];
    }
    for (int i = threadIdx.x; i < tc * 17; i += D) {
      const int t = i / 17, c = i % 17;
      const float* r = rec + (t0 + t) * stride;
      coef[i] = c < 16 ? r[(n_k + h) * D + col0 + c] : r[(n_k + n_v) * D + h];
    }
    __syncthreads();
    for (int t = 0; t < tc; ++t) {
      const float dk = coef[t * 17 + cl], decay = coef[t * 17 + 16];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float4 k = stage[t * (D / 4) + p + P * i];
        S[4 * i] = gdn_decay_add(S[4 * i], decay, k.x, dk);
        S[4 * i + 1] = gdn_decay_add(S[4 * i + 1], decay, k.y, dk);
        S[4 * i + 2] = gdn_decay_add(S[4 * i + 2], decay, k.z, dk);
        S[4 * i + 3] = gdn_decay_add(S[4 * i + 3], decay, k.w, dk);
      }
    }
  }
  store_column(st, p, P, S);
}

// ---- The chunked (prompt) form: two kernels over chunks of 64 tokens ----
//
// Per v-head h (k-head h mod n_k) and chunk of L <= 64 tokens, with g_t = ssm_a softplus(a_t + dt_bias)
// (log-decay), gamma_t = g_0 + .. + g_t, beta_t = sigmoid(b_t), k^_t = k_t/|k_t|, q^_t = q_t/(|q_t| sqrt(d))
// and S the [d_k, d_v] state (stored as rows S[:, j], like the recurrent kernel), the chunk's L serial
// updates are (the WY/UT form of cpu_gdn.cpp's chunked_head):
//   A[i][m] = -beta_i (k^_i.k^_m) e^(gamma_i - gamma_m) for m < i;  T = (I - A)^-1
//   W = T (beta e^gamma k^),  U = T (beta v)                                    [L, d] each
//   v_new = U - W S;  P[t][j] = (q^_t.k^_j) e^(gamma_t - gamma_j) for j <= t
//   o_t = e^gamma_t q^_t S + sum_{j<=t} P[t][j] v_new_j
//   S' = e^gamma_last S + sum_t e^(gamma_last-gamma_t) k^_t v_new_t^T
// gdn_chunk_prep_kernel computes W, U, P and the per-token factors of every (chunk, v-head) in
// parallel; gdn_chunk_scan_kernel carries the state through the chunks of a head in order, a block
// per (v-head, 32 state columns), the state slice in shared memory for the whole prompt. All f32.
// W and U are not formed through T: each thread solves (I - A) x = rhs for one column of
// [beta e^gamma k^ | beta v] by forward substitution, x in registers, A^T broadcast from shared memory.
// Rows past the end of the prompt enter as zeros (beta = 0, k = q = v = 0), so they add nothing.
// Work per (v-head, chunk), d = head dim: prep 8192 d MACs (the full Gram [k; q] k^T) + 4032 d (2 d
// triangular solves); scan, per slice of 32 state columns, 4096 d ([W; q] S) + 2048 d (the state
// update) + ~0.1M (P v_new). At d = 128: 1.6M + 3.5M MACs, 80K per token and head, 1.6x the recurrent
// form's 3 d^2; a 9B layer at 512 tokens: 1.3G MACs (2.6 GFLOP). Bytes there: prep reads q, k (17 MB
// as each v-head reads its k-head, 8 MB distinct) and v (8 MB), writes W, U (17 MB) and P (4 MB);
// scan reads W, q, k and P once per slice (115 MB, mostly L2 hits: 4 slices per head), U (8 MB)
// and the state (2 MiB) once, and writes the state and the output (8 MB).
constexpr int kGdnChunk = 64;                  // tokens per chunk
constexpr int kGdnSlice = 32;                  // state columns per scan block
constexpr int kGdnThreads = 256;               // both kernels; the tilings below assume 256
constexpr int kGdnPitch64 = kGdnChunk + 4;     // rows of 64 in shared memory (68 = 4 mod 32: conflict-free)
constexpr int kGdnFacPitch = 2 * kGdnChunk + 4;  // per (v-head, chunk): q factor [64], k factor [64], e^gamma_last
// H100, 9B shapes: chunked 46 us vs recurrent 34 us at 64 tokens, 57 vs 65 at 128, 148 vs 253 at 512.
constexpr int64_t kGdnChunkedMinTokens = 128;

__host__ __device__ constexpr int gdn_chunk_ld(int D) { return D + 4; }  // D % 32 == 0: pitch = 4 mod 32
__host__ __device__ constexpr size_t gdn_prep_smem(int D) {
  return (2 * kGdnChunk * static_cast<size_t>(gdn_chunk_ld(D)) + kGdnChunk * kGdnPitch64 + 5 * kGdnChunk) *
         sizeof(float);
}
__host__ __device__ constexpr size_t gdn_scan_smem(int D) {
  return ((3 * kGdnChunk + kGdnSlice) * static_cast<size_t>(gdn_chunk_ld(D)) + kGdnChunk * kGdnPitch64 +
          2 * kGdnSlice * kGdnPitch64) *
         sizeof(float);
}

// Scratch of the chunked form (n_pad = n_chunks * 64 rows per head).
struct GdnChunkScratch {
  float* W;    // [n_v][n_pad][D]
  float* U;    // [n_v][n_pad][D]
  float* P;    // [n_v][n_chunks][64][64] (zero above the diagonal and in rows past the prompt)
  float* fac;  // [n_v][n_chunks][kGdnFacPitch]: e^gamma_t / (|q_t| sqrt(d)), e^(gamma_last - gamma_t) / |k_t|
               // (both 0 past the prompt), e^gamma_last
  int n_chunks;
};

__device__ __forceinline__ float dot4(float4 a, float4 b, float acc) {
  return fmaf(a.w, b.w, fmaf(a.z, b.z, fmaf(a.y, b.y, fmaf(a.x, b.x, acc))));
}

// Block (chunk c, v-head h), 256 threads. Shared: raw k and q rows [64][d+4] each, A^T [64][68],
// gamma, beta, 1/|k|, 1/|q|, beta e^gamma/|k| [64] each (86 KB at d = 128, two blocks per SM).
__global__ void __launch_bounds__(kGdnThreads, 2) gdn_chunk_prep_kernel(GdnKArgs a, GdnChunkScratch s) {
  extern __shared__ float sm[];
  const int D = a.D, LD = gdn_chunk_ld(D), D4 = D / 4, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int c = blockIdx.x, h = blockIdx.y, hk = h % a.n_k;
  const int64_t n = a.v.rows, t0 = static_cast<int64_t>(c) * kGdnChunk;
  const int L = static_cast<int>(n - t0 < kGdnChunk ? n - t0 : kGdnChunk);
  float* k_s = sm;                         // [64][LD]
  float* q_s = k_s + kGdnChunk * LD;       // [64][LD]
  float* at_s = q_s + kGdnChunk * LD;      // [64][68]: at_s[m][i] = A[i][m]
  float* gam = at_s + kGdnChunk * kGdnPitch64;
  float* beta = gam + kGdnChunk;
  float* kinv = beta + kGdnChunk;
  float* qinv = kinv + kGdnChunk;
  float* wfac = qinv + kGdnChunk;          // beta_t e^gamma_t / |k_t|
  for (int i = tid; i < kGdnChunk * D4; i += kGdnThreads) {
    const int t = i / D4, d = i % D4 * 4;
    float4 kv = make_float4(0.0f, 0.0f, 0.0f, 0.0f), qv = kv;
    if (t < L) {
      const int64_t row = t0 + t;
      kv = __ldg(reinterpret_cast<const float4*>(a.k.data + row * a.k.stride + static_cast<int64_t>(hk) * D + d));
      qv = __ldg(reinterpret_cast<const float4*>(a.q.data + row * a.q.stride + static_cast<int64_t>(hk) * D + d));
    }
    *reinterpret_cast<float4*>(k_s + t * LD + d) = kv;
    *reinterpret_cast<float4*>(q_s + t * LD + d) = qv;
  }
  if (tid < kGdnChunk) {
    float g = 0.0f, b = 0.0f;
    if (tid < L) {
      const int64_t row = t0 + tid;
      const float x = a.alpha.data[row * a.alpha.stride + h] + a.dt_bias[h];
      g = (x > 20.0f ? x : log1pf(expf(x))) * a.ssm_a[h];
      b = 1.0f / (1.0f + expf(-a.beta_logit.data[row * a.beta_logit.stride + h]));
    }
    gam[tid] = g;
    beta[tid] = b;
  }
  __syncthreads();
  if (warp == 0) {  // gamma: inclusive prefix sum, lane l holding tokens 2l and 2l+1
    const float g0 = gam[2 * lane], g1 = gam[2 * lane + 1];
    float incl = g0 + g1;
    for (int o = 1; o < 32; o <<= 1) {
      const float y = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += y;
    }
    const float before = __shfl_up_sync(0xffffffffu, incl, 1);
    gam[2 * lane] = (lane > 0 ? before : 0.0f) + g0;
    gam[2 * lane + 1] = incl;
  }
  const float q_scale = 1.0f / sqrtf(static_cast<float>(D));
  for (int t = warp; t < kGdnChunk; t += kGdnThreads / 32) {  // a warp per token, lanes over d (d >= 32)
    float kk = 0.0f, qq = 0.0f;
    for (int d = lane; d < D; d += 32) {
      const float kv = k_s[t * LD + d], qv = q_s[t * LD + d];
      kk += kv * kv, qq += qv * qv;
    }
    for (int o = 16; o > 0; o >>= 1) {
      kk += __shfl_xor_sync(0xffffffffu, kk, o);
      qq += __shfl_xor_sync(0xffffffffu, qq, o);
    }
    // Rows past the prompt (zeros) get 0, not 1/sqrt(eps): nothing they touch may become 0 * inf.
    if (lane == 0) kinv[t] = t < L ? rsqrtf(kk + a.eps) : 0.0f, qinv[t] = t < L ? rsqrtf(qq + a.eps) * q_scale : 0.0f;
  }
  __syncthreads();
  if (tid < kGdnChunk) {  // per-token factors: for the solve (shared) and for the scan (global)
    const int t = tid;
    const float e = expf(gam[t]);
    wfac[t] = beta[t] * e * kinv[t];
    float* f = s.fac + (static_cast<int64_t>(h) * s.n_chunks + c) * kGdnFacPitch;
    f[t] = t < L ? qinv[t] * e : 0.0f;
    f[kGdnChunk + t] = t < L ? kinv[t] * expf(gam[L - 1] - gam[t]) : 0.0f;
    if (t == 0) f[2 * kGdnChunk] = expf(gam[L - 1]);
  }
  // Gram products G = [k; q] k^T ([128, 64], inner d): thread rows tr, tr+32 of k and of q, columns
  // tc + 8u. A quarter warp shares its rows (broadcast) and reads 8 k rows 4 banks apart.
  const int tr = tid / 8, tc = tid % 8;
  {
    float acc[4][8];
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int u = 0; u < 8; ++u) acc[r][u] = 0.0f;
    const float* rows[4] = {k_s + tr * LD, k_s + (tr + 32) * LD, q_s + tr * LD, q_s + (tr + 32) * LD};
    for (int d = 0; d < D; d += 4) {
      float4 x[4], y[8];
#pragma unroll
      for (int r = 0; r < 4; ++r) x[r] = *reinterpret_cast<const float4*>(rows[r] + d);
#pragma unroll
      for (int u = 0; u < 8; ++u) y[u] = *reinterpret_cast<const float4*>(k_s + (tc + 8 * u) * LD + d);
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int u = 0; u < 8; ++u) acc[r][u] = dot4(x[r], y[u], acc[r][u]);
    }
    float* P = s.P + (static_cast<int64_t>(h) * s.n_chunks + c) * kGdnChunk * kGdnChunk;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int i = tr + 32 * (r & 1);
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const int j = tc + 8 * u;
        const float decay = j <= i ? expf(gam[i] - gam[j]) : 0.0f;  // (above the diagonal it may overflow)
        if (r < 2)
          at_s[j * kGdnPitch64 + i] = j < i ? -beta[i] * kinv[i] * kinv[j] * acc[r][u] * decay : 0.0f;
        else
          P[i * kGdnChunk + j] = qinv[i] * kinv[j] * acc[r][u] * decay;
      }
    }
  }
  __syncthreads();
  // (I - A) x = rhs, one column per thread: x_i = rhs_i + sum_{m<i} A[i][m] x_m, right-looking (step m
  // adds A[i][m] x_m to every later row), fully unrolled so x stays in registers.
  if (tid < 2 * D) {
    const bool is_w = tid < D;
    const int col = is_w ? tid : tid - D;
    float x[kGdnChunk];
#pragma unroll
    for (int t = 0; t < kGdnChunk; ++t)
      x[t] = is_w ? wfac[t] * k_s[t * LD + col]
                  : (t < L ? beta[t] * a.v.data[(t0 + t) * a.v.stride + static_cast<int64_t>(h) * D + col] : 0.0f);
#pragma unroll
    for (int m = 0; m < kGdnChunk - 1; ++m) {
#pragma unroll
      for (int i4 = (m + 1) / 4; i4 < kGdnChunk / 4; ++i4) {
        const float4 am = *reinterpret_cast<const float4*>(at_s + m * kGdnPitch64 + 4 * i4);
        if (4 * i4 + 0 > m) x[4 * i4 + 0] = fmaf(am.x, x[m], x[4 * i4 + 0]);
        if (4 * i4 + 1 > m) x[4 * i4 + 1] = fmaf(am.y, x[m], x[4 * i4 + 1]);
        if (4 * i4 + 2 > m) x[4 * i4 + 2] = fmaf(am.z, x[m], x[4 * i4 + 2]);
        if (4 * i4 + 3 > m) x[4 * i4 + 3] = fmaf(am.w, x[m], x[4 * i4 + 3]);
      }
    }
    float* dst = (is_w ? s.W : s.U) + (static_cast<int64_t>(h) * s.n_chunks * kGdnChunk + t0) * D + col;
#pragma unroll
    for (int t = 0; t < kGdnChunk; ++t) dst[static_cast<int64_t>(t) * D] = x[t];
  }
}

// Block (v-head h, state columns c0 = 32 blockIdx.y ..), 256 threads, chunks in order. Shared: W and
// raw q rows [128][d+4], raw k rows [64][d+4], P [64][68], the state slice [32][d+4] (st_s[c][i] =
// S[i][c0+c]), v_new^T and v_new^T times the k factors [32][68] each (150 KB at d = 128, one block
// per SM). cp.async brings the next chunk's W and q while this one finishes, and k and P while the
// next one starts:
//   wait W,q(c) | (a) X = [W; q] S | issue W,q(c+1) | (b) v_new = U - X_w | wait k,P(c)
//   | (c) o = q-factor X_q + P v_new | (d) S = e^gamma_last S + k^T (k-factor v_new) | issue k,P(c+1)
// Thread (tr, tc) = (tid / 8, tid % 8) owns rows t = tr, tr + 32 and columns tc + 8u (u < 4) in
// (a)-(c), and state rows 4 tr .. 4 tr + 3 of the same columns in (d).
__global__ void __launch_bounds__(kGdnThreads, 1) gdn_chunk_scan_kernel(GdnKArgs a, GdnChunkScratch s) {
  extern __shared__ float sm[];
  const int D = a.D, LD = gdn_chunk_ld(D), D4 = D / 4, tid = threadIdx.x, tr = tid / 8, tc = tid % 8;
  const int h = blockIdx.x, hk = h % a.n_k, c0 = blockIdx.y * kGdnSlice, nc = s.n_chunks;
  const int64_t n = a.v.rows, head_rows = static_cast<int64_t>(h) * nc * kGdnChunk;
  float* wq_s = sm;                                   // [128][LD]
  float* k_s = wq_s + 2 * kGdnChunk * LD;             // [64][LD]
  float* st_s = k_s + kGdnChunk * LD;                 // [32][LD]
  float* p_s = st_s + kGdnSlice * LD;                 // [64][68]
  float* vn_s = p_s + kGdnChunk * kGdnPitch64;        // [32][68]
  float* vs_s = vn_s + kGdnSlice * kGdnPitch64;       // [32][68]
  const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  auto stage_wq = [&](int c) {
    const int64_t t0 = static_cast<int64_t>(c) * kGdnChunk;
    for (int i = tid; i < 2 * kGdnChunk * D4; i += kGdnThreads) {
      const int r = i / D4, d = i % D4 * 4;
      float* dst = wq_s + r * LD + d;
      const int64_t t = t0 + r - kGdnChunk;  // q row of the r >= 64 half
      if (r < kGdnChunk)
        cp_async16(dst, s.W + (head_rows + t0 + r) * D + d);
      else if (t < n)
        cp_async16(dst, a.q.data + t * a.q.stride + static_cast<int64_t>(hk) * D + d);
      else
        *reinterpret_cast<float4*>(dst) = zero;
    }
  };
  auto stage_kp = [&](int c) {
    const int64_t t0 = static_cast<int64_t>(c) * kGdnChunk;
    for (int i = tid; i < kGdnChunk * D4; i += kGdnThreads) {
      const int r = i / D4, d = i % D4 * 4;
      float* dst = k_s + r * LD + d;
      if (t0 + r < n)
        cp_async16(dst, a.k.data + (t0 + r) * a.k.stride + static_cast<int64_t>(hk) * D + d);
      else
        *reinterpret_cast<float4*>(dst) = zero;
    }
    const float* P = s.P + (static_cast<int64_t>(h) * nc + c) * kGdnChunk * kGdnChunk;
    for (int i = tid; i < kGdnChunk * kGdnChunk / 4; i += kGdnThreads) {
      const int r = i / (kGdnChunk / 4), j = i % (kGdnChunk / 4) * 4;
      cp_async16(p_s + r * kGdnPitch64 + j, P + r * kGdnChunk + j);
    }
  };
  float* state = a.state + (static_cast<int64_t>(h) * D + c0) * D;  // state + c * D + i = S[i][c0 + c]
  for (int i = tid; i < kGdnSlice * D4; i += kGdnThreads) {
    const int cc = i / D4, d = i % D4 * 4;
    *reinterpret_cast<float4*>(st_s + cc * LD + d) = *reinterpret_cast<const float4*>(state + cc * D + d);
  }
  // One commit group per stage call, empty or not, so that "wait until one group is left" always
  // means "this chunk's half has landed".
  stage_wq(0);
  cp_async_commit();
  stage_kp(0);
  cp_async_commit();
  for (int c = 0; c < nc; ++c) {
    const int64_t t0 = static_cast<int64_t>(c) * kGdnChunk;
    const float* f = s.fac + (static_cast<int64_t>(h) * nc + c) * kGdnFacPitch;
    float u_r[2][4], qf[2], kf[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int t = tr + 32 * r;
      qf[r] = __ldg(f + t), kf[r] = __ldg(f + kGdnChunk + t);
#pragma unroll
      for (int u = 0; u < 4; ++u) u_r[r][u] = __ldg(s.U + (head_rows + t0 + t) * D + c0 + tc + 8 * u);
    }
    const float e_last = __ldg(f + 2 * kGdnChunk);
    cp_async_wait<1>();
    __syncthreads();  // W, q of chunk c and the state slice are in shared memory
    // (a) X = [W; q] S: rows tr, tr+32 of W (r = 0, 1) and of q (r = 2, 3).
    float acc[4][4];
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int u = 0; u < 4; ++u) acc[r][u] = 0.0f;
    for (int d = 0; d < D; d += 4) {
      float4 x[4], y[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) x[r] = *reinterpret_cast<const float4*>(wq_s + (tr + 32 * r) * LD + d);
#pragma unroll
      for (int u = 0; u < 4; ++u) y[u] = *reinterpret_cast<const float4*>(st_s + (tc + 8 * u) * LD + d);
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int u = 0; u < 4; ++u) acc[r][u] = dot4(x[r], y[u], acc[r][u]);
    }
    __syncthreads();  // wq_s consumed
    if (c + 1 < nc) stage_wq(c + 1);
    cp_async_commit();
    // (b) v_new = U - W S, stored transposed (and scaled for the state update).
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int at = (tc + 8 * u) * kGdnPitch64 + tr + 32 * r;
        const float vn = u_r[r][u] - acc[r][u];
        vn_s[at] = vn;
        vs_s[at] = kf[r] * vn;
      }
    cp_async_wait<1>();
    __syncthreads();  // k, P of chunk c and v_new are in shared memory
    // (c) o_t = q-factor_t (q_t S) + sum_{j <= t} P[t][j] v_new_j; P is zero above the diagonal, so
    // the loop runs to the larger row (tr + 32; uniform per warp).
    {
      float o[2][4];
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int u = 0; u < 4; ++u) o[r][u] = qf[r] * acc[2 + r][u];
      for (int j = 0; j <= tr + 32; j += 4) {
        const float4 p0 = *reinterpret_cast<const float4*>(p_s + tr * kGdnPitch64 + j);
        const float4 p1 = *reinterpret_cast<const float4*>(p_s + (tr + 32) * kGdnPitch64 + j);
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const float4 y = *reinterpret_cast<const float4*>(vn_s + (tc + 8 * u) * kGdnPitch64 + j);
          o[0][u] = dot4(p0, y, o[0][u]);
          o[1][u] = dot4(p1, y, o[1][u]);
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int64_t t = t0 + tr + 32 * r;
        if (t < n) {
          float* out = a.out.data + t * a.out.stride + static_cast<int64_t>(h) * D + c0 + tc;
#pragma unroll
          for (int u = 0; u < 4; ++u) out[8 * u] = o[r][u];
        }
      }
    }
    // (d) S[i][c] = e^gamma_last S[i][c] + sum_t k_t[i] (k-factor_t v_new_t[c]) for i = 4 tr .. 4 tr + 3.
    if (tr < D4) {
      float4 sa[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const float4 old = *reinterpret_cast<const float4*>(st_s + (tc + 8 * u) * LD + 4 * tr);
        sa[u] = make_float4(e_last * old.x, e_last * old.y, e_last * old.z, e_last * old.w);
      }
      for (int t = 0; t < kGdnChunk; t += 4) {
        float4 kr[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) kr[e] = *reinterpret_cast<const float4*>(k_s + (t + e) * LD + 4 * tr);
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const float4 v = *reinterpret_cast<const float4*>(vs_s + (tc + 8 * u) * kGdnPitch64 + t);
          sa[u].x = fmaf(kr[3].x, v.w, fmaf(kr[2].x, v.z, fmaf(kr[1].x, v.y, fmaf(kr[0].x, v.x, sa[u].x))));
          sa[u].y = fmaf(kr[3].y, v.w, fmaf(kr[2].y, v.z, fmaf(kr[1].y, v.y, fmaf(kr[0].y, v.x, sa[u].y))));
          sa[u].z = fmaf(kr[3].z, v.w, fmaf(kr[2].z, v.z, fmaf(kr[1].z, v.y, fmaf(kr[0].z, v.x, sa[u].z))));
          sa[u].w = fmaf(kr[3].w, v.w, fmaf(kr[2].w, v.z, fmaf(kr[1].w, v.y, fmaf(kr[0].w, v.x, sa[u].w))));
        }
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) *reinterpret_cast<float4*>(st_s + (tc + 8 * u) * LD + 4 * tr) = sa[u];
    }
    __syncthreads();  // k_s, p_s, vn_s, vs_s consumed; the state slice updated
    if (c + 1 < nc) stage_kp(c + 1);
    cp_async_commit();
  }
  cp_async_wait<0>();  // only empty groups are left
  for (int i = tid; i < kGdnSlice * D4; i += kGdnThreads) {
    const int cc = i / D4, d = i % D4 * 4;
    *reinterpret_cast<float4*>(state + cc * D + d) = *reinterpret_cast<const float4*>(st_s + cc * LD + d);
  }
}

// The chunked kernels run prompts of >= 64 tokens: a partial chunk costs what a full one does (two
// launches, a 64-token prep and one scan step: ~10-15 us predicted at 9B shapes), while the recurrent
// kernel takes ~0.25-0.5 us per token, so the crossover should lie below one chunk; 64 keeps the
// chunked path to steps that fill at least one chunk (CudaBench.AttentionAndGdnDecode measures it). Head
// dims must be multiples of 32 up to 128 (the tilings above). Everything else, and any request with
// capture, runs the recurrent kernel. Both compute the same function, up to f32 rounding.
bool gdn_uses_chunked(const GdnParams& p) {
  return p.chunked && !p.capture && !p.capture_f16 && !p.updates && p.q.rows >= kGdnChunkedMinTokens && p.head_dim % kGdnSlice == 0 &&
         p.head_dim <= 128;
}

cudaError_t gdn_chunked_launch(const GdnKArgs& a, float* scratch, cudaStream_t stream) {
  static const cudaError_t attr = [] {
    cudaError_t e = cudaFuncSetAttribute(gdn_chunk_prep_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(gdn_prep_smem(128)));
    if (e == cudaSuccess)
      e = cudaFuncSetAttribute(gdn_chunk_scan_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(gdn_scan_smem(128)));
    return e;
  }();
  if (attr != cudaSuccess) return attr;
  if (!scratch) return cudaErrorInvalidValue;
  const int64_t n_chunks = (a.v.rows + kGdnChunk - 1) / kGdnChunk, rows = n_chunks * kGdnChunk * a.n_v;
  GdnChunkScratch s;
  s.W = scratch;
  s.U = s.W + rows * a.D;
  s.P = s.U + rows * a.D;
  s.fac = s.P + rows * kGdnChunk;
  s.n_chunks = static_cast<int>(n_chunks);
  gdn_chunk_prep_kernel<<<dim3(static_cast<unsigned>(n_chunks), a.n_v), kGdnThreads, gdn_prep_smem(a.D), stream>>>(
      a, s);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  gdn_chunk_scan_kernel<<<dim3(a.n_v, a.D / kGdnSlice), kGdnThreads, gdn_scan_smem(a.D), stream>>>(a, s);
  return cudaGetLastError();
}

}  // namespace

cudaError_t causal_conv_silu_launch(Mat x, const float* weight, int kernel, float* conv_state, float* capture, Mat y,
                                    cudaStream_t stream) {
  if (kernel < 1 || kernel > kMaxConvKernel) return cudaErrorInvalidValue;
  if (x.rows == 0) return cudaSuccess;
  // Spans run in parallel; in place (y overlaps x) needs one span per channel. Steps of up to 64 tokens
  // (verify) take spans of ~6 (a 17-token step of 8192 channels: 192 blocks walking 6 tokens instead
  // of 64 walking 17), prompts 16 (a 512-token prompt: 2048 blocks). A span is at least K-1 tokens, so
  // only the first reads the old state.
  const bool in_place = y.data < x.data + x.rows * x.stride && x.data < y.data + y.rows * y.stride;
  constexpr int64_t kStepSpan = 6;
  int64_t span = x.rows;
  if (!in_place && x.rows > 64) {
    span = 16;
  } else if (!in_place && x.rows > kStepSpan) {
    const int64_t spans = (x.rows + kStepSpan - 1) / kStepSpan;
    span = (x.rows + spans - 1) / spans;
  }
  span = std::min<int64_t>(x.rows, std::max<int64_t>(span, kernel - 1));
  const dim3 grid(static_cast<unsigned>((x.cols + 127) / 128), static_cast<unsigned>((x.rows + span - 1) / span));
  auto* kernel_fn = x.rows <= 64 || capture ? (kernel == 4 ? conv_kernel<false, 4> : conv_kernel<false>)
                                             : conv_kernel<true>;
  return launch_pdl(kernel_fn, grid, dim3(128), 0, stream, x, weight, kernel, conv_state, capture, y,
                    static_cast<int>(span));
}

bool gdn_head_dim_supported(int d) { return d == 16 || d == 32 || d == 64 || d == 128 || d == 256 || d == 512; }

size_t gdn_scratch_bytes(const GdnParams& p) {
  if (!gdn_uses_chunked(p)) return 0;
  const int64_t n_chunks = (p.q.rows + kGdnChunk - 1) / kGdnChunk, rows = n_chunks * kGdnChunk * p.n_v_heads;
  return static_cast<size_t>(2 * rows * p.head_dim + rows * kGdnChunk + n_chunks * p.n_v_heads * kGdnFacPitch) *
         sizeof(float);
}

cudaError_t gdn_launch(const GdnParams& p, void* scratch, cudaStream_t stream) {
  if (p.q.rows == 0) return cudaSuccess;
  const int D = p.head_dim;
  GdnKArgs a{p.q, p.k, p.v, p.beta_logit, p.alpha, p.out, p.ssm_a, p.dt_bias, p.n_k_heads, p.n_v_heads, D, p.eps,
             p.state, p.capture, p.capture_f16, p.updates, p.update_stride};
  if (gdn_uses_chunked(p)) return gdn_chunked_launch(a, static_cast<float*>(scratch), stream);
  // Tokens staged per chunk: as many as fit in 40 KB (32 for d = 128).
  const size_t per_token = (2 * static_cast<size_t>(gdn_pitch(D)) + 3 * 16 + 2 + 3) * sizeof(float);
  int chunk = 32;
  while (chunk > 1 && chunk * per_token > 40960) chunk /= 2;
  const size_t smem = chunk * per_token;
  const dim3 grid(p.n_v_heads, D / 16);
  auto* kernel = D != 128 ? gdn_kernel<0, true> : p.q.rows > 1 ? gdn_kernel<128, true> : gdn_kernel<128, false>;
  return launch_pdl(kernel, grid, dim3(D), smem, stream, a, chunk);
}

cudaError_t gdn_replay_launch(const GdnReplayList& l, int64_t n_tokens, int n_k_heads, int n_v_heads, int head_dim,
                              int64_t update_stride, cudaStream_t stream) {
  if (l.count <= 0 || n_tokens <= 0) return cudaSuccess;
  if (l.count > kGdnReplayParts || !gdn_head_dim_supported(head_dim)) return cudaErrorInvalidValue;
  const dim3 grid(n_v_heads, head_dim / 16, l.count);
  const size_t smem = kReplayStage * (head_dim + 17) * sizeof(float);  // 34 KB at head_dim 512
  return launch_pdl(gdn_replay_kernel, grid, dim3(head_dim), smem, stream, l, static_cast<int>(n_tokens), n_k_heads,
                    n_v_heads, update_stride);
}

namespace {
__global__ void f16_to_f32_kernel(const __half* __restrict__ src, float* __restrict__ dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = __half2float(src[i]);
}
}  // namespace

namespace {
// Each block moves one kCopyChunk-word slice of one part. Bytes: every part read and written once.
constexpr int kCopyThreads = 256, kCopyChunk = 4 * kCopyThreads;  // 16 KB a block

__global__ void __launch_bounds__(kCopyThreads) copy_many_kernel(CopyList l) {
  pdl_wait();  // the copied states belong to the previous kernels
  pdl_trigger();
  int p = 0;
  while (p + 1 < l.count && blockIdx.x >= l.first_block[p + 1]) ++p;
  const uint4* src = static_cast<const uint4*>(l.src[p]);
  uint4* dst = static_cast<uint4*>(l.dst[p]);
  const size_t words = l.bytes[p] / 16, begin = size_t{blockIdx.x - l.first_block[p]} * kCopyChunk;
  const size_t end = begin + kCopyChunk < words ? begin + kCopyChunk : words;
  uint4 v[kCopyChunk / kCopyThreads];
#pragma unroll
  for (int j = 0; j < kCopyChunk / kCopyThreads; ++j) {  // all loads in flight before the stores
    const size_t i = begin + threadIdx.x + size_t{kCopyThreads} * j;
    if (i < end) v[j] = src[i];
  }
#pragma unroll
  for (int j = 0; j < kCopyChunk / kCopyThreads; ++j) {
    const size_t i = begin + threadIdx.x + size_t{kCopyThreads} * j;
    if (i < end) dst[i] = v[j];
  }
}
}  // namespace

bool copy_many_supported(const void* dst, const void* src, size_t bytes) {
  return (reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | bytes) % 16 == 0;
}

cudaError_t copy_many_launch(CopyList l, cudaStream_t stream) {
  if (l.count <= 0 || l.count > kCopyParts) return l.count == 0 ? cudaSuccess : cudaErrorInvalidValue;
  unsigned blocks = 0;
  for (int p = 0; p < l.count; ++p) {
    l.first_block[p] = blocks;
    blocks += static_cast<unsigned>((l.bytes[p] / 16 + kCopyChunk - 1) / kCopyChunk);
  }
  l.first_block[l.count] = blocks;
  if (blocks == 0) return cudaSuccess;
  return launch_pdl(copy_many_kernel, dim3(blocks), dim3(kCopyThreads), 0, stream, l);
}

cudaError_t f16_to_f32_launch(const uint16_t* src, float* dst, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 2048));
  f16_to_f32_kernel<<<blocks, 256, 0, stream>>>(reinterpret_cast<const __half*>(src), dst, n);
  return cudaGetLastError();
}

}  // namespace hyspec::cuda
