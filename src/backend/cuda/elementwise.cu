// Row-wise and elementwise ops: rms norms, binary ops, RoPE, KV store, argmax, MoE routing.
// All are memory-bound single passes (each input read once, each output written once).
#include <cuda_fp16.h>

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cstdint>

#include "backend/cuda/activations.cuh"
#include "backend/cuda/async_copy.cuh"
#include "backend/logit_summary.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_cache.cuh"
#include "backend/cuda/launch_util.h"
#include "backend/cuda/q8k.cuh"
#ifdef HYSPEC_STEP_TRACE
#include "backend/cuda/timeline.cuh"
#endif

namespace hyspec::cuda {

// ---- The look-ahead draws' timelines (HYSPEC_STEP_TRACE builds; compiled out otherwise) ----
// Thread 0 of each block stores %globaltimer at the phases below, the last launch's values kept
// (draw_trace_report): where a draw kernel's time goes after its PDL wait, beside the step trace's totals.
enum DrawMark {
  kDrawStart, kDrawWaited, kDrawPassed, kDrawCounted, kDrawStaged, kDrawSummed, kDrawPicked, kDrawScanned, kDrawEnd,
  kDrawMarks
};
enum class DrawKernel { kToken, kBins, kTopK };
#ifdef HYSPEC_STEP_TRACE
__device__ BlockTimeline<128, kDrawMarks> g_draw_trace, g_bins_trace, g_top_k_trace;
__device__ __forceinline__ void draw_mark(DrawKernel k, DrawMark m) {
  timeline_mark(k == DrawKernel::kToken ? g_draw_trace : k == DrawKernel::kBins ? g_bins_trace : g_top_k_trace,
                blockIdx.x, m);
}
void draw_trace_report() {
  const char* const names[kDrawMarks] = {"start",  "waited", "first pass", "last counted",
                                         "staged", "summed", "picked",     "scanned", "end"};
  timeline_report(g_draw_trace, names, "draw_token_kernel's last launch");
  timeline_report(g_bins_trace, names, "top_k_bins_kernel's last launch");
  timeline_report(g_top_k_trace, names, "top_k_draw_kernel's last launch");
}
#else
__device__ __forceinline__ void draw_mark(DrawKernel, DrawMark) {}
#endif

namespace {

unsigned grid_for(int64_t n, int threads, int64_t cap = 1 << 20) {
  int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > cap ? cap : b));
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

enum class NormKind { Plain, Gated, AddResidual };

struct NormArgs {
  Mat x, y;
  const float* z;  // Gated: the gate; AddResidual: the delta added to x (in place) before the norm
  int64_t z_stride;
  const float* w;
  int64_t group, groups_per_row;
  float eps;
  int tpg;  // threads per group: 32 (a warp per group) or blockDim.x (a block per group), from group only
  int vec4;  // > 0: every thread's elements as `vec4` float4s, all loaded at once (see the kernel)
  QuantizedX qx;  // qx.d set: also quantize y for the int8 matvecs (vec4 form; see norm_launch)
};
constexpr int kNormMaxVec4 = 8;  // float4s per thread in the one-round-trip form

// y = x / sqrt(mean(x^2) + eps) * w  [* silu(z)] over each group of columns; 2 reads + 1 write.
// AddResidual first stores x += z (the add of binary_kernel, element by element) and norms the sum:
// 3 reads + 2 writes, with the arithmetic of an add followed by a plain norm. A group's arithmetic
// (lane split, reduction order) depends on the group size only, never on the number of rows.
// 1 / sqrt(mean of squares + eps) of a group from each thread's partial sum of squares: over the warp,
// or (tpg > 32) over the block through `partial`, in a fixed order. Every thread of the block calls it.
// tpg is 32, 256 or 512 (norm_threads_per_group): the block form reads its 8 or 16 warp sums as float4s,
// so `partial` is 16-byte aligned and holds at most 16 of them.
__device__ __forceinline__ float group_inv_rms(float ss, int tpg, float* partial, int64_t group, float eps) {
  ss = warp_sum(ss);
  if (tpg == 32) return 1.0f / sqrtf(ss / static_cast<float>(group) + eps);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = ss;
  __syncthreads();
  return inv_rms_of_warp_sums(partial, tpg, group, eps);
}

// A warp's quantized 256-block (quantize_lane) into block b of the Q8K rows qx, in every XOrder.
__device__ __forceinline__ void store_quantized_x(const Q8KLane& q, int lane, const QuantizedX& qx, int64_t b) {
#pragma unroll
  for (int o = 0; o < 3; ++o) store_codes(q, lane, qx.q[o] + b * 256, static_cast<XOrder>(o));
  store_sums(q, lane, reinterpret_cast<__half*>(qx.bs) + b * 16, qx.d + b);
}

// The block's groups (whole 256-blocks of one row, staged in span[] by the norm) -> Q8K rows of qx in
// every XOrder, a warp per 256-block: the codes quantize_q8k_kernel would make of the stored y.
__device__ void quantize_span(const NormArgs& a, const float* span) {
  __syncthreads();  // span[] is complete
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t groups = blockDim.x / a.tpg, g0 = blockIdx.x * groups;
  const int64_t r = g0 / a.groups_per_row, c0 = g0 % a.groups_per_row * a.group;
  for (int64_t j = warp; j < groups * a.group / 256; j += blockDim.x / 32) {
    const float4 v0 = reinterpret_cast<const float4*>(span + 256 * j)[2 * lane];
    const float4 v1 = reinterpret_cast<const float4*>(span + 256 * j)[2 * lane + 1];
    const float v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
    const Q8KLane q = quantize_lane(v);
    store_quantized_x(q, lane, a.qx, (c0 / 256 + j) * padded_tokens(a.x.rows) + r);  // (its 256-block of the rows)
  }
}

template <NormKind kKind>
__global__ void rms_norm_kernel(NormArgs a) {
  __shared__ __align__(16) float partial[32];
  extern __shared__ __align__(16) float span[];  // quantizing: the block's y values
  const int tpg = a.tpg, lt = threadIdx.x % tpg;
  const int64_t gidx = blockIdx.x * int64_t(blockDim.x / tpg) + threadIdx.x / tpg;
  const bool valid = gidx < a.x.rows * a.groups_per_row;
  const int64_t r = valid ? gidx / a.groups_per_row : 0, gc = valid ? gidx % a.groups_per_row * a.group : 0;
  // The weights (model constants no kernel writes) are in flight before the wait: the round trip after
  // it then waits on x (just written, in L2) alone, not also on w (likely evicted from L2 by the step's
  // weight stream). 9B Q4_K_M decode -1.1%, verify-15 -1.0% (H200, session 43).
  float4 wv[kNormMaxVec4];
#pragma unroll
  for (int k = 0; k < kNormMaxVec4; ++k) {
    if (k >= a.vec4 || !valid || !a.w) break;
    wv[k] = __ldg(reinterpret_cast<const float4*>(a.w + (int64_t{k} * tpg + lt) * 4));
  }
  pdl_wait();  // (launched with PDL: the next matvec streams its weights meanwhile)
  pdl_trigger();
  float* xr = a.x.data + r * a.x.stride + gc;
  const float* zr = a.z ? a.z + r * a.z_stride + gc : nullptr;
  float ss = 0.0f;
  if (a.vec4 > 0) {
    // One round trip: thread lt owns float4s lt, lt + tpg, ... of the group; x and z are all loaded
    // before anything is stored or reduced (a decode step's hidden-size norm is one block, and this
    // form replaced 5-6 dependent global round trips). The lane split depends on the group size only.
    float4 v[kNormMaxVec4], d[kNormMaxVec4];
#pragma unroll
    for (int k = 0; k < kNormMaxVec4; ++k) {
      if (k >= a.vec4 || !valid) break;
      const int64_t c = (int64_t{k} * tpg + lt) * 4;
      v[k] = *reinterpret_cast<const float4*>(xr + c);
      if (zr) d[k] = *reinterpret_cast<const float4*>(zr + c);
    }
#pragma unroll
    for (int k = 0; k < kNormMaxVec4; ++k) {
      if (k >= a.vec4 || !valid) break;
      if constexpr (kKind == NormKind::AddResidual) {
        v[k].x += d[k].x, v[k].y += d[k].y, v[k].z += d[k].z, v[k].w += d[k].w;
        *reinterpret_cast<float4*>(xr + (int64_t{k} * tpg + lt) * 4) = v[k];
      }
      ss = add_squares(ss, v[k]);
    }
    const float inv = group_inv_rms(ss, tpg, partial, a.group, a.eps);
    if (!valid) return;
    float* yr = a.y.data + r * a.y.stride + gc;
#pragma unroll
    for (int k = 0; k < kNormMaxVec4; ++k) {
      if (k >= a.vec4) break;
      float o[4] = {v[k].x * inv, v[k].y * inv, v[k].z * inv, v[k].w * inv};
      const float wk[4] = {wv[k].x, wv[k].y, wv[k].z, wv[k].w}, zk[4] = {d[k].x, d[k].y, d[k].z, d[k].w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (a.w) o[e] *= wk[e];
        if constexpr (kKind == NormKind::Gated) o[e] *= silu(zk[e]);
      }
      *reinterpret_cast<float4*>(yr + (int64_t{k} * tpg + lt) * 4) = make_float4(o[0], o[1], o[2], o[3]);
      if (a.qx.d)
        reinterpret_cast<float4*>(span + threadIdx.x / tpg * a.group)[k * tpg + lt] =
            make_float4(o[0], o[1], o[2], o[3]);
    }
    if (a.qx.d) quantize_span(a, span);  // every group of the block is valid (norm_launch)
    return;
  }
  if (valid) {
    // Four elements per round, loaded before any is stored: the store to x would otherwise order
    // each later load behind it (x and z may alias as far as the compiler knows). Same summation
    // order as one element per round.
    for (int64_t c0 = lt; c0 < a.group; c0 += 4 * int64_t{tpg}) {
      float v[4], d[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int64_t c = c0 + k * int64_t{tpg};
        v[k] = c < a.group ? xr[c] : 0.0f;
        if constexpr (kKind == NormKind::AddResidual) d[k] = c < a.group ? zr[c] : 0.0f;
      }
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int64_t c = c0 + k * int64_t{tpg};
        if (c >= a.group) break;
        if constexpr (kKind == NormKind::AddResidual) {
          v[k] = v[k] + d[k];
          xr[c] = v[k];  // read back below by this same thread
        }
        ss = add_square(ss, v[k]);
      }
    }
  }
  const float inv = group_inv_rms(ss, tpg, partial, a.group, a.eps);
  if (!valid) return;
  float* yr = a.y.data + r * a.y.stride + gc;
  for (int64_t c = lt; c < a.group; c += tpg) {
    float v = xr[c] * inv;
    if (a.w) v *= a.w[c];
    if constexpr (kKind == NormKind::Gated) v *= silu(zr[c]);
    yr[c] = v;
  }
}

template <int V>
__device__ __forceinline__ void binary_apply(Binary op, const float* a, const float* b, float* y) {
#pragma unroll
  for (int e = 0; e < V; ++e) {
    switch (op) {
      case Binary::Add: y[e] = a[e] + b[e]; break;
      case Binary::SwiGlu: y[e] = silu(a[e]) * b[e]; break;
      case Binary::SigmoidMul: y[e] = a[e] * sigmoid(b[e]); break;
      case Binary::AddSigmoidScaled: y[e] += sigmoid(b[0]) * a[e]; break;
    }
  }
}

// Blocks walk rows (grid.y) and V-element pieces of a row (grid.x): no division per element (the
// flat index's 64-bit div/mod made a prompt step's SwiGLU compute-bound: 20 us for 256 x 12288 on
// the H200). V = 4 when the rows are 16-byte aligned (float4 loads and stores); AddSigmoidScaled's b
// is one value per row.
template <int V>
__global__ void binary_kernel(Binary op, Mat a, Mat b, Mat y) {
  pdl_wait();
  pdl_trigger();
  const int64_t pieces = y.cols / V;
  for (int64_t r = blockIdx.y; r < y.rows; r += gridDim.y) {
    const float* ar = a.data + r * a.stride;
    const float* br = b.data + r * b.stride;
    float* yr = y.data + r * y.stride;
    for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < pieces; p += int64_t(gridDim.x) * blockDim.x) {
      float av[V], bv[V], yv[V];
      const int64_t c = p * V;
      if constexpr (V == 4) {
        *reinterpret_cast<float4*>(av) = *reinterpret_cast<const float4*>(ar + c);
        if (op == Binary::AddSigmoidScaled) {
          bv[0] = br[0];
          *reinterpret_cast<float4*>(yv) = *reinterpret_cast<const float4*>(yr + c);
        } else {
          *reinterpret_cast<float4*>(bv) = *reinterpret_cast<const float4*>(br + c);
        }
      } else {
        av[0] = ar[c];
        bv[0] = op == Binary::AddSigmoidScaled ? br[0] : br[c];
        if (op == Binary::AddSigmoidScaled) yv[0] = yr[c];
      }
      binary_apply<V>(op, av, bv, yv);
      if constexpr (V == 4) {
        *reinterpret_cast<float4*>(yr + c) = *reinterpret_cast<const float4*>(yv);
      } else {
        yr[c] = yv[0];
      }
    }
  }
}

// NeoX RoPE: the pair (x0, x1) = (i, i + n_rot/2) of a head rotated by pos * base^(-2i/n_rot). As the
// CPU backend: inv_freq rounded to f32, the angle and its sin/cos in double (positions reach 1e5+, where
// an f32 angle would be off by ~1e-2 rad).
struct RopeAngle {
  double c, s;
};
__device__ __forceinline__ RopeAngle rope_angle(int32_t pos, int i, int n_rot, float freq_base) {
  const double inv_freq = static_cast<float>(pow(static_cast<double>(freq_base), -2.0 * i / n_rot));
  RopeAngle r;
  sincos(static_cast<double>(pos) * inv_freq, &r.s, &r.c);
  return r;
}
// rope_angle as one function of its own: qk_prep_kernel's unrolled pairs had each inlined the double pow and
// sincos; computed before its PDL wait, the calls cost it nothing there (inlined, a Q8_0-cache decode step
// took 2.171 ms against 2.162, session 36).
__device__ __noinline__ RopeAngle rope_angle_call(int32_t pos, int i, int n_rot, float freq_base) {
  return rope_angle(pos, i, n_rot, freq_base);
}
__device__ __forceinline__ void rope_apply(float& x0, float& x1, RopeAngle r) {
  const float a = x0, b = x1;
  x0 = static_cast<float>(a * r.c - b * r.s);
  x1 = static_cast<float>(a * r.s + b * r.c);
}
__device__ __forceinline__ void rope_rotate(float& x0, float& x1, int32_t pos, int i, int n_rot, float freq_base) {
  rope_apply(x0, x1, rope_angle(pos, i, n_rot, freq_base));
}

__global__ void rope_neox_kernel(Mat x, int head_dim, int n_rot, const int32_t* __restrict__ positions,
                                 float freq_base) {
  pdl_wait();
  pdl_trigger();
  const int half = n_rot / 2;
  const int64_t heads = x.cols / head_dim, total = x.rows * heads * half;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(idx % half);
    const int64_t h = idx / half % heads, r = idx / half / heads;
    float* p = x.data + r * x.stride + h * head_dim;
    rope_rotate(p[i], p[i + half], positions[r], i, n_rot, freq_base);
  }
}

// 16-bit and f32 caches: a thread per value.
template <typename C>
__global__ void kv_store_kernel(Mat k, Mat v, uint8_t* __restrict__ kc, uint8_t* __restrict__ vc, KvGeometry g,
                                const int32_t* __restrict__ positions) {
  pdl_wait();
  pdl_trigger();
  const int64_t width = k.cols, total = k.rows * width;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / width, c = i % width, pos = positions[t];
    if (pos < 0 || pos >= g.capacity) continue;
    const int64_t dst = pos * g.row_bytes + c / g.head_dim * g.head_bytes + c % g.head_dim * int64_t{sizeof(C)};
    *reinterpret_cast<C*>(kc + dst) = to_cache<C>(k.data[t * k.stride + c]);
    *reinterpret_cast<C*>(vc + dst) = to_cache<C>(v.data[t * v.stride + c]);
  }
}

// Q8_0 caches: a warp per (token, block of 32 values), lane = value (store_q8_block).
__global__ void kv_store_q8_kernel(Mat k, Mat v, uint8_t* __restrict__ kc, uint8_t* __restrict__ vc, KvGeometry g,
                                   const int32_t* __restrict__ positions) {
  pdl_wait();
  pdl_trigger();
  const int lane = threadIdx.x & 31, D = g.head_dim;
  const int64_t blocks = k.cols / 32, total = k.rows * blocks;
  for (int64_t w = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5; w < total;
       w += (int64_t(gridDim.x) * blockDim.x) >> 5) {
    const int64_t t = w / blocks, b = w % blocks, pos = positions[t];  // warp-uniform
    if (pos < 0 || pos >= g.capacity) continue;
    const int64_t c = 32 * b + lane, slot = pos * g.row_bytes + c / D * g.head_bytes;
    const int block = static_cast<int>(c % D / 32);
    const float x[2] = {k.data[t * k.stride + c], v.data[t * v.stride + c]};
    float amax[2];
    q8_block_amax(x, amax);
    store_q8_block(kc + slot, D, block, x[0], amax[0], lane);
    store_q8_block(vc + slot, D, block, x[1], amax[1], lane);
  }
}

// QkPrepArgs (backend.h) in one kernel, a warp per (token, head): the norm as rms_norm_kernel's warp
// form computes it (tpg = 32: the same lane split and order, so the same bits), the head staged in
// shared memory for RoPE (its pairs sit 16..32 lanes apart), then q or k written and, for a key head,
// k and v into the cache. Replaces five launches (two norms, two RoPEs, the store); bytes: q, k, v read
// once, q, k and the cache rows written once. Latency: one global round trip (every load first), the
// RoPE angles (double pow and sincos) computed while the previous kernel finishes.
// kD: the head dim as a constant (256: the Qwen3.5 attention's), or 0: a.head_dim. The loops over a lane's
// elements then unroll to the head's 8 instead of kQkPrepMaxHeadDim's 16 predicated ones (the Q8_0 form 115 ->
// 47 KB of SASS): a Q8_0-cache decode step -0.9% (session 36).
template <typename C, int kD>
__global__ void __launch_bounds__(kQkPrepWarps * 32) qk_prep_kernel(QkPrepParams a, uint8_t* __restrict__ kc,
                                                                     uint8_t* __restrict__ vc) {
  __shared__ __align__(16) float head_s[kQkPrepWarps][kQkPrepMaxHeadDim];
  constexpr int kMaxPer = (kD ? kD : kQkPrepMaxHeadDim) / 32;  // a lane's elements of a head (and RoPE pairs, half)
  constexpr int kVec4 = kD ? kD / 128 : kNormMaxVec4;           // the float4s of a lane (vec4 form)
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, D = kD ? kD : a.head_dim;
  const int heads = a.n_head + a.n_kv_head;
  const int64_t item = blockIdx.x * int64_t{kQkPrepWarps} + warp;
  const bool valid = item < a.k.rows * heads;
  const int64_t t = valid ? item / heads : 0;
  // The position is a step input (an upload no kernel writes): it and the RoPE angles of the lane's
  // pairs are computed before waiting on the previous kernel.
  const int32_t pos = valid ? a.positions[t] : 0;
  const int half = a.n_rot / 2;
  RopeAngle ang[kMaxPer / 2];
#pragma unroll
  for (int p = 0; p < kMaxPer / 2; ++p)
    if (lane + 32 * p < half) ang[p] = rope_angle_call(pos, lane + 32 * p, a.n_rot, a.freq_base);
  const int j = static_cast<int>(item - t * heads);
  const bool is_q = j < a.n_head;
  const int kh = j - a.n_head;
  const float* w = is_q ? a.q_norm : a.k_norm;
  const int vec4 = is_q ? a.vec4_q : a.vec4_k;
  // The norm weights too (model constants): the round trip after the wait is then x's and v's alone.
  float4 wv[kVec4];
#pragma unroll
  for (int k = 0; k < kVec4; ++k)
    if (valid && w && k < vec4) wv[k] = __ldg(reinterpret_cast<const float4*>(w) + k * 32 + lane);
  pdl_wait();
  pdl_trigger();
  if (!valid) return;
  const float* x = is_q ? a.q_in.data + t * a.q_in.stride + j * a.q_pitch : a.k.data + t * a.k.stride + kh * D;
  float* y = is_q ? a.q.data + t * a.q.stride + j * D : a.k.data + t * a.k.stride + kh * D;
  const bool store_kv = !is_q && pos >= 0 && pos < a.kv.capacity;
  // Every global load of the warp first (x, the norm weights, a key head's v row): one round trip.
  float vr[kMaxPer];
  if (store_kv) {
    const float* v = a.v.data + t * a.v.stride + kh * D;
#pragma unroll
    for (int e = 0; e < kMaxPer; ++e)
      if (lane + 32 * e < D) vr[e] = v[lane + 32 * e];
  }
  float* hs = head_s[warp];
  float ss = 0.0f;
  if (vec4 > 0) {  // lane owns float4s lane, lane + 32, ...
    float4 v[kVec4];
#pragma unroll
    for (int k = 0; k < kVec4; ++k)
      if (k < vec4) v[k] = reinterpret_cast<const float4*>(x)[k * 32 + lane];
#pragma unroll
    for (int k = 0; k < kVec4; ++k)
      if (k < vec4) ss = add_squares(ss, v[k]);
    const float inv = group_inv_rms(ss, 32, nullptr, D, a.eps);
#pragma unroll
    for (int k = 0; k < kVec4; ++k) {
      if (k >= vec4) break;
      const int c = (k * 32 + lane) * 4;
      float o[4] = {v[k].x * inv, v[k].y * inv, v[k].z * inv, v[k].w * inv};
      if (w) o[0] *= wv[k].x, o[1] *= wv[k].y, o[2] *= wv[k].z, o[3] *= wv[k].w;
      *reinterpret_cast<float4*>(hs + c) = make_float4(o[0], o[1], o[2], o[3]);
    }
  } else {  // lane owns elements lane, lane + 32, ...
    for (int c = lane; c < D; c += 32) ss = add_square(ss, x[c]);
    const float inv = group_inv_rms(ss, 32, nullptr, D, a.eps);
    for (int c = lane; c < D; c += 32) {
      float o = x[c] * inv;
      if (w) o *= w[c];
      hs[c] = o;
    }
  }
  __syncwarp();
#pragma unroll
  for (int p = 0; p < kMaxPer / 2; ++p)
    if (lane + 32 * p < half) rope_apply(hs[lane + 32 * p], hs[lane + 32 * p + half], ang[p]);
  __syncwarp();
  for (int c = lane; c < D; c += 32) y[c] = hs[c];
  if (!store_kv) return;
  const int64_t slot = pos * a.kv.row_bytes + kh * a.kv.head_bytes;
  if constexpr (kIsQ8<C>) {  // D % 32 == 0: element e of the lane is in block e
    // The maxima of four K and four V blocks at a time (K block e0 + i at 2i, V at 2i + 1), then their
    // stores; block by block, each store had waited on its own 5-shuffle chain (H100, 9B Q4_K_M with a
    // Q8_0 cache: decode 2.606 -> 2.599 ms).
    constexpr int kAtOnce = 4;
#pragma unroll
    for (int e0 = 0; e0 < kMaxPer; e0 += kAtOnce) {
      if (32 * e0 >= D) break;
      float x[2 * kAtOnce], amax[2 * kAtOnce];
#pragma unroll
      for (int i = 0; i < kAtOnce; ++i) {
        const bool in = 32 * (e0 + i) < D;
        x[2 * i] = in ? hs[lane + 32 * (e0 + i)] : 0.0f, x[2 * i + 1] = in ? vr[e0 + i] : 0.0f;
      }
      q8_block_amax(x, amax, 2 * min(kAtOnce, D / 32 - e0));
#pragma unroll
      for (int i = 0; i < kAtOnce; ++i) {
        if (32 * (e0 + i) >= D) break;
        store_q8_block(kc + slot, D, e0 + i, x[2 * i], amax[2 * i], lane);
        store_q8_block(vc + slot, D, e0 + i, x[2 * i + 1], amax[2 * i + 1], lane);
      }
    }
  } else {
    C* kd = reinterpret_cast<C*>(kc + slot);
    C* vd = reinterpret_cast<C*>(vc + slot);
#pragma unroll
    for (int e = 0; e < kMaxPer; ++e) {
      const int c = lane + 32 * e;
      if (c >= D) break;
      kd[c] = to_cache<C>(hs[c]);
      vd[c] = to_cache<C>(vr[e]);
    }
  }
}

// Better of (v, i) and (ov, oi): larger value, then smaller index.
__device__ __forceinline__ void arg_better(float& v, int& i, float ov, int oi) {
  if (ov > v || (ov == v && oi < i)) v = ov, i = oi;
}

// Argmax of each row (first index on ties; NaN never wins; a row without a winner gives 0) in two
// passes, so that a 248K-logit row is read by ~60 SMs instead of one (one block per row took 50 us on
// an H100): argmax_chunks_kernel takes kArgmaxChunk logits per block, 16 per thread, all loaded before
// the comparisons (one round trip); argmax_merge_kernel takes a row's chunk winners in a warp. The
// winner does not depend on the order of comparisons (value, then index, is a total order).
// Bytes: the logits once (4 per element), 8 per chunk written and read back; no FLOPs to speak of.
constexpr int kArgmaxThreads = 256, kArgmaxPerThread = 16, kArgmaxChunk = kArgmaxThreads * kArgmaxPerThread;
constexpr int kNoIndex = 0x7fffffff;

__device__ __forceinline__ void warp_arg_best(float& v, int& i) {
  for (int o = 16; o > 0; o >>= 1) arg_better(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
}

// The column of a thread's j-th logit in its block's chunk (blockIdx.x), and the chunk of row `row`
// loaded (all loads before any use: one round trip), `pad` past the row's end.
__device__ __forceinline__ int64_t chunk_col(int j) {
  return int64_t{blockIdx.x} * kArgmaxChunk + threadIdx.x + int64_t{kArgmaxThreads} * j;
}
__device__ __forceinline__ void load_chunk(const Mat& x, int64_t row, float pad, float (&v)[kArgmaxPerThread]) {
  const float* r = x.data + row * x.stride;
#pragma unroll
  for (int j = 0; j < kArgmaxPerThread; ++j) v[j] = chunk_col(j) < x.cols ? r[chunk_col(j)] : pad;
}

__global__ void __launch_bounds__(kArgmaxThreads) argmax_chunks_kernel(Mat x, float* part_v, int* part_i) {
  pdl_wait();  // the logits belong to the previous kernel
  pdl_trigger();
  __shared__ float sv[kArgmaxThreads / 32];
  __shared__ int si[kArgmaxThreads / 32];
  float e[kArgmaxPerThread];
  load_chunk(x, blockIdx.y, __int_as_float(0x7fffffff), e);  // NaN: never the winner
  float v = -FLT_MAX;
  int idx = kNoIndex;
#pragma unroll
  for (int j = 0; j < kArgmaxPerThread; ++j) arg_better(v, idx, e[j], static_cast<int>(chunk_col(j)));
  warp_arg_best(v, idx);
  if ((threadIdx.x & 31) == 0) sv[threadIdx.x >> 5] = v, si[threadIdx.x >> 5] = idx;
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < kArgmaxThreads / 32; ++w) arg_better(v, idx, sv[w], si[w]);
  const int64_t slot = static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x;
  part_v[slot] = v, part_i[slot] = idx;
}

// Over a row's chunks (one warp, each lane the same result): its argmax from the chunks' winners (0 for a row
// without a winner), and its max.
__device__ __forceinline__ int argmax_of_chunks(const float* part_v, const int* part_i, int chunks) {
  float v = -FLT_MAX;
  int idx = kNoIndex;
  for (int c = threadIdx.x & 31; c < chunks; c += 32) arg_better(v, idx, part_v[c], part_i[c]);
  warp_arg_best(v, idx);
  return idx == kNoIndex ? 0 : idx;
}
__device__ __forceinline__ float row_max_of_chunks(const float* part_v, int chunks) {
  float m = -FLT_MAX;
  for (int c = threadIdx.x & 31; c < chunks; c += 32) m = fmaxf(m, part_v[c]);
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  return m;
}

// Whether this block is the grid's last to arrive at `done` (after its writes); the last one resets it.
__device__ __forceinline__ bool last_block_of(unsigned* done) {
  __shared__ int last;
  __threadfence();  // every thread's writes before the count
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(done, 1u) == gridDim.x - 1;
    if (last) *done = 0;
  }
  __syncthreads();
  if (last) __threadfence();
  return last;
}

__global__ void argmax_merge_kernel(const float* part_v, const int* part_i, int chunks, int32_t* out) {
  pdl_wait();
  pdl_trigger();
  const int64_t base = static_cast<int64_t>(blockIdx.x) * chunks;
  const int idx = argmax_of_chunks(part_v + base, part_i + base, chunks);
  if (threadIdx.x == 0) out[blockIdx.x] = idx;
}

// The sampler's row summaries (backend/logit_summary.h), after argmax_chunks_kernel has left each
// kArgmaxChunk-token chunk's largest logit in part_v (LogitSummary::kChunk is the same span): one block
// per chunk takes the row's max from those, sums its chunk's exp((l - m) * inv_t) in a fixed order, and
// adds its bucket histogram (shared-memory atomics) to the row's, which the launcher zeroed. Bytes: the
// logits once; per block up to 2 x 512 global atomics (the buckets it touched).
static_assert(LogitSummary::kChunk == kArgmaxChunk, "one chunk per argmax_chunks_kernel block");
constexpr int kSumBuckets = static_cast<int>(LogitSummary::kBuckets);

__global__ void __launch_bounds__(kArgmaxThreads)
    logit_summary_kernel(Mat x, const float* part_v, float inv_t, float scale, float* out, int64_t out_stride) {
  pdl_wait();
  pdl_trigger();
  __shared__ float count[kSumBuckets], mass[kSumBuckets], warp_sum[kArgmaxThreads / 32];
  __shared__ float row_max;
  const int chunks = gridDim.x;
  for (int b = threadIdx.x; b < kSumBuckets; b += kArgmaxThreads) count[b] = 0.0f, mass[b] = 0.0f;
  if (threadIdx.x < 32) {
    const float m = row_max_of_chunks(part_v + static_cast<int64_t>(blockIdx.y) * chunks, chunks);
    if (threadIdx.x == 0) row_max = m;
  }
  __syncthreads();
  const float m = row_max;
  float l[kArgmaxPerThread];
  load_chunk(x, blockIdx.y, -INFINITY, l);
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < kArgmaxPerThread; ++j) {
    if (!(l[j] > -INFINITY)) continue;  // NaN, -inf, past the row
    const float e = expf((l[j] - m) * inv_t), d = (m - l[j]) * scale;
    const int b = d < static_cast<float>(kSumBuckets) ? static_cast<int>(d) : kSumBuckets - 1;
    sum += e;
    atomicAdd(&count[b], 1.0f);
    atomicAdd(&mass[b], e);
  }
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if ((threadIdx.x & 31) == 0) warp_sum[threadIdx.x >> 5] = sum;
  __syncthreads();
  float* o = out + static_cast<int64_t>(blockIdx.y) * out_stride;
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int w = 0; w < kArgmaxThreads / 32; ++w) total += warp_sum[w];
    o[LogitSummary::chunk_at() + blockIdx.x] = total;
    if (blockIdx.x == 0) o[0] = m;
  }
  float* o_count = o + 1 + chunks;
  for (int b = threadIdx.x; b < kSumBuckets; b += kArgmaxThreads) {
    if (count[b] == 0.0f) continue;
    atomicAdd(&o_count[b], count[b]);
    atomicAdd(&o_count[kSumBuckets + b], mass[b]);
  }
}

// Eight values from 16-byte aligned shared memory, in two vector loads.
template <typename T, typename V4>
__device__ __forceinline__ void load8(const T* p, T (&v)[8]) {
  const V4 a = *reinterpret_cast<const V4*>(p), b = *reinterpret_cast<const V4*>(p + 4);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

// One thread's walk over a list in order (step(i, value) returns false to stop), its values loaded a batch
// ahead of the steps that use them: one round trip a batch instead of one a step (a chain of double adds must
// stay in order for the host's bits, but its loads need not wait for it).
constexpr int kWalkBatch = 8;
template <typename Load, typename Step>
__device__ __forceinline__ void walk_in_order(int n, Load load, Step step) {
  for (int i0 = 0; i0 < n; i0 += kWalkBatch) {
    float v[kWalkBatch];
#pragma unroll
    for (int i = 0; i < kWalkBatch; ++i) v[i] = i0 + i < n ? load(i0 + i) : 0.0f;
#pragma unroll
    for (int i = 0; i < kWalkBatch; ++i)
      if (i0 + i < n && !step(i0 + i, v[i])) return;
  }
}

// chunk_draw.h's chunk_token_mass: exp((l - m) / t) of the f32 argument x <= 0, rounded to f32, computed in double
// as 2^(k/32) (`pow2_32ths`, which the block fills) times a degree-5 polynomial of x - k ln2/32 (|r| <= ln2/64):
// relative error < 2^-48 (its f32 rounding matched glibc's double exp's for each of 40M arguments in a one-off
// check on the CPU). libdevice's double exp (~25 chained double ops) took the last block's 4096 exps ~2.5-3.4 us
// in a microbenchmark (9 chained here).
__device__ __forceinline__ double chunk_token_mass(float l, float m, float t, const double* pow2_32ths) {
  const double x = (l - m) / t;
  if (!(l > -INFINITY) || !(x >= -200.0)) return 0.0;  // (below e^-104 the f32 is 0)
  constexpr double k32OverLn2 = 46.16624130844683, kLn2Over32Hi = 0x1.62e42fefa39efp-6,
                   kLn2Over32Lo = 0x1.abc9e3b39803fp-61;
  const double kd = rint(x * k32OverLn2);
  const int k = static_cast<int>(kd);
  const double r = fma(-kd, kLn2Over32Lo, fma(-kd, kLn2Over32Hi, x));
  double p = fma(r, 1.0 / 120, 1.0 / 24);
  p = fma(p, r, 1.0 / 6);
  p = fma(p, r, 0.5);
  p = fma(p, r, 1.0);
  p = fma(p, r, 1.0);
  const double scale = __longlong_as_double(static_cast<long long>(1023 + (k >> 5)) << 52);
  return static_cast<double>(static_cast<float>(pow2_32ths[k & 31] * p * scale));
}

// Look-ahead sampling's draw (Backend::draw_token), after argmax_chunks_kernel on the row: each block sums
// its chunk's exp((l - m) * inv_t) as logit_summary_kernel does (the same bits: the masses the host path
// draws with), and the last block to finish draws as backend/chunk_draw.h does: the chunk by the masses
// with the host's double steps in one thread, then the token by the chunk's exps in double, 16 consecutive
// tokens a thread and prefix sums over the threads (the host walks them one by one: the sums differ only
// in rounding). The temperature and uniform lie in mapped host memory: one thread a block reads them before
// the wait (each read crosses PCIe; the draw kernels read their inputs so). Bytes: the logits once, the drawn
// chunk again (16 KB, from L2); 16 double exps a thread in the last block.
__global__ void __launch_bounds__(kArgmaxThreads) draw_token_kernel(Mat x, const float* part_v, const int* part_i,
                                                                     float* mass, unsigned* done, TokenDraw* draw) {
  draw_mark(DrawKernel::kToken, kDrawStart);
  constexpr int kWarps = kArgmaxThreads / 32;
  __shared__ float warp_sum[kWarps], row_max, temperature_in;
  __shared__ double warp_total[kWarps], target, chunk_sum, uniform_in;
  if (threadIdx.x == 0) temperature_in = draw->temperature, uniform_in = draw->uniform;  // mapped memory
  pdl_wait();
  pdl_trigger();
  draw_mark(DrawKernel::kToken, kDrawWaited);
  __shared__ int warp_pick[kWarps], warp_last[kWarps], chunk;
  const int chunks = gridDim.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (threadIdx.x < 32) {
    const float m = row_max_of_chunks(part_v, chunks);
    if (lane == 0) row_max = m;
  }
  __syncthreads();
  const float m = row_max, temperature = temperature_in;
  const double uniform = uniform_in;
  const float inv_t = 1.0f / temperature;
  float l[kArgmaxPerThread];
  load_chunk(x, 0, -INFINITY, l);
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < kArgmaxPerThread; ++j)
    if (l[j] > -INFINITY) sum += expf((l[j] - m) * inv_t);
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (lane == 0) warp_sum[warp] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int w = 0; w < kWarps; ++w) total += warp_sum[w];
    mass[blockIdx.x] = total;
  }
  draw_mark(DrawKernel::kToken, kDrawPassed);
  if (!last_block_of(done)) return;
  draw_mark(DrawKernel::kToken, kDrawCounted);
  // The chunk, by chunk_draw.h's double steps in one thread over the masses, staged by all threads in shared
  // memory (zeros up to whole batches of 8, which change neither walk). The steps are selects, not branches: a
  // double compare and branch a chunk made the walk ~70 cycles a chunk (~4.4 us of a 9B's draw), the adds alone
  // take ~16 (the chain of double adds must stay in order for the host's bits).
  constexpr int kStaged = 1024;  // a 4M-token vocabulary; larger ones walk the masses from L2
  __shared__ __align__(16) float staged[kStaged];
  const int padded = (chunks + 7) / 8 * 8;
  const bool in_shared = padded <= kStaged;
  for (int c = threadIdx.x; in_shared && c < padded; c += kArgmaxThreads)
    staged[c] = c < chunks ? __ldcg(mass + c) : 0.0f;
  __syncthreads();
  draw_mark(DrawKernel::kToken, kDrawStaged);
  __shared__ double pow2_32ths[32];  // chunk_token_mass's table, by the second warp while the first walks
  if (threadIdx.x >= 32 && threadIdx.x < 64) pow2_32ths[threadIdx.x - 32] = exp2((threadIdx.x - 32) / 32.0);
  if (threadIdx.x == 0) {
    const auto masses = [&](int c0, float (&v)[8]) {
      if (in_shared) {
        load8<float, float4>(staged + c0, v);
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = c0 + j < chunks ? __ldcg(mass + c0 + j) : 0.0f;
      }
    };
    double z = 0;  // chunk_total's sum
    for (int c0 = 0; c0 < padded; c0 += 8) {
      float v[8];
      masses(c0, v);
#pragma unroll
      for (int j = 0; j < 8; ++j) z += v[j];
    }
    draw_mark(DrawKernel::kToken, kDrawSummed);
    // draw_by_chunks' walk: past the chunks of no mass, t -= s until t < s, where it stops.
    int pick = -1, last = -1;
    double t = 0, s_last = 0;
    if (isfinite(m) && isfinite(z) && z > 0) {
      double walk = uniform * z;
      for (int c0 = 0; c0 < padded && pick < 0; c0 += 8) {
        float v[8];
        masses(c0, v);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const double s = v[j];
          const bool live = pick < 0 && s > 0, stop = live && walk < s;
          last = live ? c0 + j : last;
          s_last = live ? s : s_last;
          pick = stop ? c0 + j : pick;
          t = stop ? walk : t;
          walk = live && !stop ? walk - s : walk;
        }
      }
      if (pick < 0 && last >= 0) pick = last, t = s_last;  // past the end by rounding
    }
    chunk = pick, target = t, chunk_sum = s_last;
  }
  __syncthreads();
  draw_mark(DrawKernel::kToken, kDrawPicked);
  int token = -1;
  if (chunk >= 0) {  // the token: the first whose prefix sum passes the chunk's share of the target
    const int64_t first = int64_t{chunk} * kArgmaxChunk + threadIdx.x * kArgmaxPerThread;
    double e[kArgmaxPerThread], own = 0;
#pragma unroll
    for (int j = 0; j < kArgmaxPerThread; ++j) {
      e[j] = chunk_token_mass(first + j < x.cols ? x.data[first + j] : -INFINITY, m, temperature, pow2_32ths);
      own += e[j];
    }
    double incl = own;
    for (int o = 1; o < 32; o <<= 1) {
      const double y = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += y;
    }
    double run = __shfl_up_sync(0xffffffffu, incl, 1);
    if (lane == 0) run = 0;
    if (lane == 31) warp_total[warp] = incl;
    __syncthreads();
    draw_mark(DrawKernel::kToken, kDrawScanned);
    double block_total = 0;
    for (int w = 0; w < kWarps; ++w) {
      if (w == warp) run += block_total;
      block_total += warp_total[w];
    }
    const double t = target / chunk_sum * block_total;
    int pick = INT_MAX, last = -1;
#pragma unroll
    for (int j = 0; j < kArgmaxPerThread; ++j) {
      if (!(e[j] > 0)) continue;
      last = static_cast<int>(first + j);
      run += e[j];
      if (pick == INT_MAX && run > t) pick = last;
    }
    for (int o = 16; o > 0; o >>= 1) {
      pick = min(pick, __shfl_xor_sync(0xffffffffu, pick, o));
      last = max(last, __shfl_xor_sync(0xffffffffu, last, o));
    }
    if (lane == 0) warp_pick[warp] = pick, warp_last[warp] = last;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 0; w < kWarps; ++w) pick = min(pick, warp_pick[w]), last = max(last, warp_last[w]);
      token = pick != INT_MAX ? pick : last;
    }
  }
  if (threadIdx.x >= 32) return;
  token = __shfl_sync(0xffffffffu, token, 0);
  if (token >= 0) {
    if (lane == 0) draw->token = token, draw->status = TokenDraw::kDrawn;
    draw_mark(DrawKernel::kToken, kDrawEnd);
    return;
  }
  const int idx = argmax_of_chunks(part_v, part_i, chunks);  // nothing to draw from: the row's argmax
  if (lane == 0) draw->token = idx, draw->status = TokenDraw::kNoMass;
}

// Look-ahead sampling's draw under a top-k cut (Backend::draw_top_k), after argmax_chunks_kernel on the row, in
// two more passes: top_k_bins_kernel counts the row's tokens by how far below the max they lie (log-spaced bins
// of m - l: 64 an octave from 2^-8 to 2^8 nats, so that ties near the max stay apart), each block its bins
// down to its own k-th best, and its last block finds the bin of the row's k-th best; top_k_draw_kernel
// gathers the tokens of that bin and better ones (k to a few k where logits do not tie), and its last block
// ranks them (logit descending, ties by id), then takes the sampler's float and double steps
// (backend/sampling_cut.h: the softmax of the k best at the temperature, min-p, top-p, the inverse CDF at the
// host's uniform; the sums and cuts in order in one thread). More candidates than fit (hundreds of
// tokens at one logit) take k passes over the row in the last block instead: slow, and exact. Bytes: the
// logits three times (1 MB for 248K, from L2 after the first), 8 a candidate; per block, a global atomic for
// each bin it holds down to its k-th best.
constexpr int kTopKBins = 1024, kTopKCandidates = 2048, kTopKMax = TokenDraw::kMaxTopK;

struct TopKDrawState {  // zeroed once; each draw leaves it zeroed but for `bin`
  unsigned bins_done, draw_done;
  int count;  // candidates gathered
  int bin;    // the bin of the k-th best token
  int bins[kTopKBins];
};

// The bin of a token l below the row's max m (l <= m; NaN is never binned): the top bits of the float m - l.
__device__ __forceinline__ int top_k_bin(float l, float m) {
  constexpr unsigned kFirst = (127u - 8u) << 6;  // m - l < 2^-8: bin 0
  const unsigned bits = __float_as_uint(m - l) >> 17;
  return bits < kFirst ? 0 : static_cast<int>(min(bits - kFirst, static_cast<unsigned>(kTopKBins - 1)));
}

// Whether the row can be drawn from at all, by its max.
__device__ __forceinline__ bool drawable_max(float m) { return isfinite(m) && m > -FLT_MAX; }

// The first bin where the count from bin 0 reaches k (kTopKBins - 1 where none does), over the block: `own`
// holds this thread's kTopKPerThread consecutive bins.
constexpr int kTopKPerThread = kTopKBins / kArgmaxThreads;
__device__ int bin_of_kth(const int (&own)[kTopKPerThread], int k) {
  __shared__ int warp_sum[kArgmaxThreads / 32], found;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int total = 0;
#pragma unroll
  for (int i = 0; i < kTopKPerThread; ++i) total += own[i];
  int incl = total;
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  __syncthreads();  // the shared words' previous use
  if (lane == 31) warp_sum[warp] = incl;
  if (threadIdx.x == 0) found = kTopKBins - 1;
  __syncthreads();
  int before = incl - total;
  for (int w = 0; w < warp; ++w) before += warp_sum[w];
#pragma unroll
  for (int i = 0; i < kTopKPerThread; ++i) {
    if (before < k && before + own[i] >= k) found = threadIdx.x * kTopKPerThread + i;
    before += own[i];
  }
  __syncthreads();
  return found;
}

// A block adds to the row's bins only its own bins up to its k-th best token's: a token below a block's k best
// is not among the row's, and the row's k-th best falls in the same bin either way (where a block left bins
// out, its own count up to them reaches k already).
__global__ void __launch_bounds__(kArgmaxThreads) top_k_bins_kernel(Mat x, const float* part_v, TopKDrawState* st,
                                                                     const TokenDraw* draw) {
  draw_mark(DrawKernel::kBins, kDrawStart);
  __shared__ int bins[kTopKBins], k_in;
  __shared__ float row_max;
  if (threadIdx.x == 0) k_in = min(max(draw->top_k, 1), kTopKMax);  // mapped memory: one read a block
  pdl_wait();
  pdl_trigger();
  draw_mark(DrawKernel::kBins, kDrawWaited);
  for (int b = threadIdx.x; b < kTopKBins; b += kArgmaxThreads) bins[b] = 0;
  if (threadIdx.x < 32) {
    const float m = row_max_of_chunks(part_v, gridDim.x);
    if (threadIdx.x == 0) row_max = m;
  }
  __syncthreads();
  const float m = row_max;
  const int k = k_in;
  int own[kTopKPerThread];
  if (drawable_max(m)) {
    float l[kArgmaxPerThread];
    load_chunk(x, 0, __int_as_float(0x7fffffff), l);  // NaN past the row: never binned
#pragma unroll
    for (int j = 0; j < kArgmaxPerThread; ++j)
      if (!isnan(l[j])) atomicAdd(&bins[top_k_bin(l[j], m)], 1);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kTopKPerThread; ++i) own[i] = bins[threadIdx.x * kTopKPerThread + i];
    const int last = bin_of_kth(own, k);
    for (int b = threadIdx.x; b <= last; b += kArgmaxThreads)
      if (bins[b] != 0) atomicAdd(&st->bins[b], bins[b]);
  }
  draw_mark(DrawKernel::kBins, kDrawPassed);
  if (!last_block_of(&st->bins_done)) return;
  draw_mark(DrawKernel::kBins, kDrawCounted);
#pragma unroll
  for (int i = 0; i < kTopKPerThread; ++i) {
    own[i] = __ldcg(&st->bins[threadIdx.x * kTopKPerThread + i]);
    st->bins[threadIdx.x * kTopKPerThread + i] = 0;  // for the next draw
  }
  const int bin = bin_of_kth(own, k);
  if (threadIdx.x == 0) st->bin = bin;
  draw_mark(DrawKernel::kBins, kDrawEnd);
}

__device__ __forceinline__ bool token_before(float la, int ia, float lb, int ib) {
  return la > lb || (la == lb && ia < ib);
}

__global__ void __launch_bounds__(kArgmaxThreads)
    top_k_draw_kernel(Mat x, const float* part_v, const int* part_i, TopKDrawState* st, SelectedLogit* cand,
                      TokenDraw* draw) {
  draw_mark(DrawKernel::kTopK, kDrawStart);
  __shared__ TokenDraw in;
  if (threadIdx.x == 0) in = *draw;  // mapped memory: one read a block
  pdl_wait();
  pdl_trigger();
  draw_mark(DrawKernel::kTopK, kDrawWaited);
  constexpr int kWarps = kArgmaxThreads / 32;
  __shared__ float row_max, best_l[kTopKMax], best_p[kTopKMax];
  __shared__ __align__(16) float cand_l[kTopKCandidates];
  __shared__ __align__(16) int cand_id[kTopKCandidates];
  __shared__ int best_id[kTopKMax], n_best, warp_i[kWarps];
  __shared__ float warp_v[kWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (threadIdx.x < 32) {
    const float m = row_max_of_chunks(part_v, gridDim.x);
    if (lane == 0) row_max = m;
  }
  __syncthreads();
  const float m = row_max;
  const bool ok = drawable_max(m);
  const int k = min(max(in.top_k, 1), kTopKMax);
  const float temperature = in.temperature, top_p = in.top_p, min_p = in.min_p;
  const double uniform = in.uniform;
  if (ok) {  // gather the tokens of the k-th best's bin and better ones, by warp: one atomic a warp
    const int bin = __ldcg(&st->bin);
    float l[kArgmaxPerThread];
    load_chunk(x, 0, __int_as_float(0x7fffffff), l);
#pragma unroll
    for (int j = 0; j < kArgmaxPerThread; ++j) {
      const bool keep = !isnan(l[j]) && top_k_bin(l[j], m) <= bin;
      const unsigned ballot = __ballot_sync(0xffffffffu, keep);
      if (ballot == 0) continue;
      int base = 0;
      if (lane == 0) base = atomicAdd(&st->count, __popc(ballot));
      base = __shfl_sync(0xffffffffu, base, 0);
      const int slot = base + __popc(ballot & ((1u << lane) - 1u));
      if (keep && slot < kTopKCandidates) cand[slot] = {static_cast<int32_t>(chunk_col(j)), l[j]};
    }
  }
  draw_mark(DrawKernel::kTopK, kDrawPassed);
  if (!last_block_of(&st->draw_done)) return;
  draw_mark(DrawKernel::kTopK, kDrawCounted);
  if (!ok) {  // nothing to draw from: the row's argmax, as argmax_merge_kernel takes it
    if (threadIdx.x >= 32) return;
    const int idx = argmax_of_chunks(part_v, part_i, gridDim.x);
    if (lane == 0) draw->token = idx, draw->status = TokenDraw::kNoMass, st->count = 0;
    return;
  }
  const int n = __ldcg(&st->count);
  if (n <= kTopKCandidates) {  // rank the candidates: a candidate's rank is how many come before it
    // (Padded to whole batches of 8 with NaNs, which come before nothing; a batch's 8 compares are selects: a
    // compare and branch a candidate made the ranking ~50 cycles a candidate.)
    const int padded = (n + 7) / 8 * 8;
    for (int i = threadIdx.x; i < padded; i += kArgmaxThreads) {
      cand_id[i] = i < n ? __ldcg(&cand[i].id) : INT_MAX;
      cand_l[i] = i < n ? __ldcg(&cand[i].logit) : __int_as_float(0x7fffffff);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += kArgmaxThreads) {
      const float li = cand_l[i];
      const int ii = cand_id[i];
      int rank = 0;
      for (int j0 = 0; j0 < padded && rank < k; j0 += 8) {
        float lj[8];
        int ij[8];
        load8<float, float4>(cand_l + j0, lj);
        load8<int, int4>(cand_id + j0, ij);
#pragma unroll
        for (int j = 0; j < 8; ++j) rank += token_before(lj[j], ij[j], li, ii);
      }
      if (rank < k) best_id[rank] = ii, best_l[rank] = li;
    }
    if (threadIdx.x == 0) n_best = min(n, k);
  } else {  // too many ties to hold: the k best one by one, each the best after the previous
    float prev_l = 0.0f;
    int prev_i = -1;
    int found = 0;
    for (; found < k; ++found) {
      float v = -INFINITY;
      int idx = kNoIndex;
      for (int64_t c = threadIdx.x; c < x.cols; c += kArgmaxThreads) {
        const float lc = x.data[c];
        if (isnan(lc) || (prev_i >= 0 && !token_before(prev_l, prev_i, lc, static_cast<int>(c)))) continue;
        arg_better(v, idx, lc, static_cast<int>(c));
      }
      warp_arg_best(v, idx);
      if (lane == 0) warp_v[warp] = v, warp_i[warp] = idx;
      __syncthreads();
      v = warp_v[0], idx = warp_i[0];
      for (int w = 1; w < kWarps; ++w) arg_better(v, idx, warp_v[w], warp_i[w]);
      __syncthreads();
      if (idx == kNoIndex) break;
      if (threadIdx.x == 0) best_id[found] = idx, best_l[found] = v;
      prev_l = v, prev_i = idx;
    }
    if (threadIdx.x == 0) n_best = found;
  }
  __syncthreads();
  draw_mark(DrawKernel::kTopK, kDrawPicked);
  const int kept = n_best;
  // The softmax's exps at the temperature, as the host's std::exp of the float argument rounds them.
  for (int i = threadIdx.x; i < kept; i += kArgmaxThreads)
    best_p[i] = static_cast<float>(exp(static_cast<double>((best_l[i] - best_l[0]) / temperature)));
  __syncthreads();
  // cut_distribution's steps on the best-first list, then draw_at's: the sums and the cuts in order in one
  // thread (walks a batch of loads ahead), the divisions by the sums (a double division is ~100 cycles) over
  // the threads. The p fall along the list (exps of falling logits over one sum), so min-p's cut, and the
  // host's erasing of p = 0 after the last division, keep a prefix.
  __shared__ double sum_of;
  __shared__ int size_of;
  const auto p_at = [&](int i) { return best_p[i]; };
  if (threadIdx.x == 0) {
    double sum = 0;
    walk_in_order(kept, p_at, [&](int, float p) {
      sum += p;
      return true;
    });
    sum_of = sum;
  }
  __syncthreads();
  const double sum = sum_of;
  for (int i = threadIdx.x; i < kept; i += kArgmaxThreads) best_p[i] = static_cast<float>(best_p[i] / sum);
  __syncthreads();
  draw_mark(DrawKernel::kTopK, kDrawScanned);
  if (threadIdx.x == 0) {
    st->count = 0;  // for the next draw
    int size = kept;
    if (min_p > 0.0f) {
      const float best = static_cast<float>(1.0 / sum), floor_p = fminf(best, min_p * best);
      walk_in_order(size, p_at, [&](int i, float p) {
        if (p < floor_p) size = i;
        return !(p < floor_p);
      });
    }
    if (top_p < 1.0f) {
      double cum = 0;
      walk_in_order(size, p_at, [&](int i, float p) {
        cum += p;
        if (cum >= top_p) size = i + 1;
        return !(cum >= top_p);
      });
    }
    double total = 0;
    walk_in_order(size, p_at, [&](int, float p) {
      total += p;
      return true;
    });
    sum_of = total, size_of = size;
  }
  __syncthreads();
  const double total = sum_of;
  for (int i = threadIdx.x; i < size_of; i += kArgmaxThreads) best_p[i] = static_cast<float>(best_p[i] / total);
  __syncthreads();
  if (threadIdx.x != 0) return;
  int size = size_of;
  walk_in_order(size, p_at, [&](int i, float p) {
    if (!(p > 0.0f)) size = i;
    return p > 0.0f;
  });
  int token = best_id[0];  // no token left (cannot happen: the best one's p is 1 / sum)
  if (size > 0) {
    double t = 0;
    walk_in_order(size, p_at, [&](int, float p) {
      t += p;
      return true;
    });
    double u = uniform * t;
    token = best_id[size - 1];
    walk_in_order(size, p_at, [&](int i, float p) {
      u -= p;
      if (u < 0) token = best_id[i];
      return !(u < 0);
    });
  }
  draw->token = token;
  draw->status = TokenDraw::kDrawn;
  draw_mark(DrawKernel::kTopK, kDrawEnd);
}

// Row `row`'s logits >= threshold, compacted by warp: one atomic per warp for its slots. Bytes: the row
// once, 8 per selected token.
__global__ void __launch_bounds__(kArgmaxThreads)
    select_logits_kernel(Mat x, int64_t row, float threshold, int32_t cap, int32_t* count, SelectedLogit* picked) {
  pdl_wait();
  pdl_trigger();
  const int lane = threadIdx.x & 31;
  float l[kArgmaxPerThread];
  load_chunk(x, row, -INFINITY, l);
#pragma unroll
  for (int j = 0; j < kArgmaxPerThread; ++j) {
    const int64_t c = chunk_col(j);
    const bool keep = c < x.cols && l[j] >= threshold;
    const unsigned ballot = __ballot_sync(0xffffffffu, keep);
    if (ballot == 0) continue;
    int base = 0;
    if (lane == 0) base = atomicAdd(count, __popc(ballot));
    base = __shfl_sync(0xffffffffu, base, 0);
    const int slot = base + __popc(ballot & ((1u << lane) - 1u));
    if (keep && slot < cap) picked[slot] = {static_cast<int32_t>(c), l[j]};
  }
}

// One warp per token: p_e = exp(l_e - max) (the softmax normaliser cancels in the renormalisation),
// k rounds of argmax (first index on ties), weights p_sel / sum(p_sel).
__global__ void moe_route_kernel(Mat logits, int top_k, int32_t* ids, float* weights) {
  extern __shared__ float p[];
  pdl_wait();  // the router's logits
  pdl_trigger();
  const int lane = threadIdx.x;
  const float* l = logits.data + blockIdx.x * logits.stride;
  const int n = static_cast<int>(logits.cols);
  float m = -FLT_MAX;
  for (int e = lane; e < n; e += 32) m = fmaxf(m, l[e]);
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  for (int e = lane; e < n; e += 32) p[e] = expf(l[e] - m);
  __syncwarp();
  float total = 0.0f;
  for (int s = 0; s < top_k; ++s) {
    float v = -1.0f;
    int idx = kNoIndex;
    for (int e = lane; e < n; e += 32) arg_better(v, idx, p[e], e);
    warp_arg_best(v, idx);
    if (idx == kNoIndex) idx = 0, v = 0.0f;  // NaN logits: no winner (and no write past p)
    total += v;
    if (lane == 0) {
      ids[blockIdx.x * top_k + s] = idx;
      weights[blockIdx.x * top_k + s] = v;
      p[idx] = -2.0f;
    }
    __syncwarp();
  }
  if (lane < top_k) weights[blockIdx.x * top_k + lane] /= total;
}

__global__ void moe_combine_kernel(Mat eo, const int32_t* __restrict__ pos, const float* __restrict__ w, int top_k,
                                   Mat out) {
  pdl_wait();  // the experts' outputs
  pdl_trigger();
  const int64_t total = out.rows * out.cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / out.cols, c = i % out.cols;
    float s = 0.0f;
    for (int k = 0; k < top_k; ++k) {
      const int64_t slot = t * top_k + k, row = pos ? pos[slot] : slot;
      s += w[slot] * eo.data[row * eo.stride + c];
    }
    out.data[t * out.stride + c] = s;
  }
}

// One block of 1024 threads; shared memory: a counter per expert.
__global__ void moe_group_kernel(const int32_t* __restrict__ ids, int64_t n_slots, int n_experts, int32_t* offsets,
                                 int32_t* order, int32_t* pos) {
  extern __shared__ int cursor[];
  pdl_wait();  // the route's ids
  pdl_trigger();
  const int tid = threadIdx.x, lane = tid & 31;
  for (int e = tid; e < n_experts; e += blockDim.x) cursor[e] = 0;
  __syncthreads();
  for (int64_t i = tid; i < n_slots; i += blockDim.x) atomicAdd(&cursor[ids[i]], 1);
  __syncthreads();
  if (tid < 32) {  // exclusive scan of the counts, 32 experts per round
    int carry = 0;
    for (int base = 0; base < n_experts; base += 32) {
      const int e = base + lane, v = e < n_experts ? cursor[e] : 0;
      int incl = v;
      for (int o = 1; o < 32; o <<= 1) {
        const int up = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += up;
      }
      if (e < n_experts) offsets[e] = cursor[e] = carry + incl - v;
      carry += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (lane == 0) offsets[n_experts] = carry;
  }
  __syncthreads();
  for (int64_t i = tid; i < n_slots; i += blockDim.x) {
    const int p = atomicAdd(&cursor[ids[i]], 1);
    order[p] = static_cast<int32_t>(i);
    pos[i] = p;
  }
}

__global__ void gather_rows_kernel(Mat x, const int32_t* __restrict__ order, int x_div, Mat y) {
  pdl_wait();  // the group's order
  pdl_trigger();
  const int64_t total = y.rows * y.cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = i / y.cols, c = i % y.cols;
    y.data[j * y.stride + c] = x.data[(order[j] / x_div) * x.stride + c];
  }
}

}  // namespace

// A warp per head-sized group, a block per larger one. Rows of a multiple of 2048 (a step's hidden-size
// norms, where each thread then takes whole float4s) take 512 threads: each warp quantizes one 256-block
// of a 4096 row for the int8 matvecs instead of two (9B Q4_K_M, H100, session 24: verify-16 4.335 ->
// 4.256 ms, decode 2.794 -> 2.785). HYSPEC_NORM_THREADS=256 for the former split.
int norm_threads_per_group(int64_t group) {
  static const int wide = env_int("HYSPEC_NORM_THREADS", 512) == 256 ? 256 : 512;
  return group > 2048 && group % 2048 == 0 ? wide : group > 512 ? 256 : 32;
}

namespace {

// The one-round-trip form's float4s per thread where every row, group and vector is whole, 16-byte
// aligned float4s (else 0).
int norm_vec4(Mat x, Mat y, const float* z, int64_t z_stride, const float* w, int64_t group) {
  auto aligned = [](const void* p, int64_t stride) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0 && stride % 4 == 0; };
  const int tpg = norm_threads_per_group(group);
  if (group % (4 * tpg) == 0 && group / (4 * tpg) <= kNormMaxVec4 && aligned(x.data, x.stride) &&
      aligned(y.data, y.stride) && (!z || aligned(z, z_stride)) && (!w || aligned(w, 4)))
    return static_cast<int>(group / (4 * tpg));
  return 0;
}

template <NormKind kKind>
cudaError_t norm_launch(Mat x, const float* z, int64_t z_stride, const float* w, int64_t group, float eps, Mat y,
                        cudaStream_t stream, const QuantizedX* qx, bool* quantized) {
  if (x.rows == 0) return cudaSuccess;
  NormArgs a{x, y, z, z_stride, w, group, x.cols / group, eps, norm_threads_per_group(group), 0, QuantizedX{}};
  a.vec4 = norm_vec4(x, y, z, z_stride, w, group);
  const int threads = std::max(256, a.tpg);
  const int64_t groups = x.rows * a.groups_per_row, groups_per_block = threads / a.tpg;
  // Quantizing for the int8 matvecs: a block's groups must be whole 256-blocks of one row (a warp
  // per group: 8 groups to a block, in one row), and the rows few enough for the matvecs.
  const int64_t span = groups_per_block * group;
  const bool quantize = qx && a.vec4 > 0 && x.rows <= kInt8MvMaxWidth && x.cols % 256 == 0 &&
                        x.cols <= kQuantizedXMaxK && span % 256 == 0 && a.groups_per_row % groups_per_block == 0;
  if (quantized) *quantized = quantize;
  if (quantize) a.qx = *qx;
  const unsigned blocks = a.tpg == 32 ? grid_for(groups, 8) : static_cast<unsigned>(groups);
  const size_t smem = quantize ? static_cast<size_t>(span) * sizeof(float) : 0;
  return launch_pdl(rms_norm_kernel<kKind>, dim3(blocks), dim3(threads), smem, stream, a);
}

}  // namespace

cudaError_t rms_norm_launch(Mat x, const float* z, int64_t z_stride, const float* w, int64_t group, float eps, Mat y,
                            cudaStream_t stream, const QuantizedX* qx, bool* quantized) {
  if (z) return norm_launch<NormKind::Gated>(x, z, z_stride, w, group, eps, y, stream, qx, quantized);
  return norm_launch<NormKind::Plain>(x, nullptr, 0, w, group, eps, y, stream, qx, quantized);
}

cudaError_t add_rms_norm_launch(Mat x, Mat delta, const float* w, int64_t group, float eps, Mat h,
                                cudaStream_t stream, const QuantizedX* qx, bool* quantized) {
  return norm_launch<NormKind::AddResidual>(x, delta.data, delta.stride, w, group, eps, h, stream, qx, quantized);
}

cudaError_t binary_launch(Binary op, Mat a, Mat b, Mat y, cudaStream_t stream) {
  if (y.rows == 0 || y.cols == 0) return cudaSuccess;
  auto aligned = [](const Mat& m, bool per_row_scalar) {
    return per_row_scalar || (reinterpret_cast<uintptr_t>(m.data) % 16 == 0 && m.stride % 4 == 0);
  };
  const bool vec = y.cols % 4 == 0 && aligned(a, false) && aligned(y, false) && aligned(b, op == Binary::AddSigmoidScaled);
  const int v = vec ? 4 : 1;
  // About 2048 threads per SM's worth of blocks: columns across grid.x, rows across grid.y.
  const unsigned gx = grid_for(y.cols / v, 256, 65535);
  const unsigned gy = static_cast<unsigned>(std::min<int64_t>(y.rows, std::max<int64_t>(1, 4096 / gx)));
  return vec ? launch_pdl(binary_kernel<4>, dim3(gx, gy), dim3(256), 0, stream, op, a, b, y)
             : launch_pdl(binary_kernel<1>, dim3(gx, gy), dim3(256), 0, stream, op, a, b, y);
}

namespace {
// A warp per (row, 256-block): its 8 values a lane as binary_kernel's SigmoidMul computes them, stored, then
// quantized as quantize_span does (so the codes quantize_q8k_kernel would make of the stored y). Bytes: x,
// the gate and y once, the Q8K rows once.
__global__ void sigmoid_gate_quantize_kernel(const float* __restrict__ x, const float* __restrict__ gate, int64_t group,
                                             int64_t gate_stride, float* __restrict__ y, int64_t n, int64_t K,
                                             QuantizedX qx) {
  pdl_wait();
  pdl_trigger();
  const int lane = threadIdx.x & 31;
  const int64_t w = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) >> 5, blocks = K / 256;
  if (w >= n * blocks) return;
  const int64_t r = w / blocks, j = w - r * blocks, f = r * K + 256 * j + 8 * lane;
  const float* g = gate + f / group * gate_stride + f % group;  // (8 values of one gate row: group % 8 == 0)
  const float4 x0 = reinterpret_cast<const float4*>(x + f)[0], x1 = reinterpret_cast<const float4*>(x + f)[1];
  const float4 g0 = reinterpret_cast<const float4*>(g)[0], g1 = reinterpret_cast<const float4*>(g)[1];
  const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
  const float gv[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
  float v[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) v[e] = xv[e] * sigmoid(gv[e]);
  reinterpret_cast<float4*>(y + f)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(y + f)[1] = make_float4(v[4], v[5], v[6], v[7]);
  const Q8KLane q = quantize_lane(v);
  store_quantized_x(q, lane, qx, j * padded_tokens(n) + r);  // (its 256-block of the rows)
}
}  // namespace

cudaError_t sigmoid_gate_quantize_launch(const float* x, const float* gate, int64_t group, int64_t gate_stride, float* y,
                                         int64_t n, int64_t K, const QuantizedX& qx, cudaStream_t stream) {
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (n == 0) return cudaSuccess;
  if (n > kInt8MvMaxWidth || K % 256 != 0 || K > kQuantizedXMaxK || group % 8 != 0 || gate_stride % 4 != 0 ||
      !aligned(x) || !aligned(gate) || !aligned(y) || !qx.d)
    return cudaErrorInvalidValue;
  const int64_t warps = n * (K / 256);
  return launch_pdl(sigmoid_gate_quantize_kernel, dim3(static_cast<unsigned>((warps + 7) / 8)), dim3(256), 0, stream, x,
                    gate, group, gate_stride, y, n, K, qx);
}

cudaError_t rope_neox_launch(Mat x, int head_dim, int n_rot, const int32_t* positions, float freq_base,
                             cudaStream_t stream) {
  const int64_t total = x.rows * (x.cols / head_dim) * (n_rot / 2);
  if (total == 0) return cudaSuccess;
  return launch_pdl(rope_neox_kernel, dim3(grid_for(total, 256, 65535)), dim3(256), 0, stream, x, head_dim, n_rot,
                    positions, freq_base);
}

cudaError_t kv_store_launch(Mat k, Mat v, void* k_cache, void* v_cache, const KvGeometry& kv, const int32_t* positions,
                            cudaStream_t stream) {
  if (k.rows == 0) return cudaSuccess;
  auto* kc = static_cast<uint8_t*>(k_cache);
  auto* vc = static_cast<uint8_t*>(v_cache);
  const unsigned blocks = grid_for(k.rows * k.cols, 256, 65535);  // a thread per value (Q8_0: a warp per 32)
  return with_cache_type(kv.type, [&](auto c) {
    using C = decltype(c);
    if constexpr (kIsQ8<C>) {
      if (kv.head_dim % 32 != 0) return cudaErrorInvalidValue;
      return launch_pdl(kv_store_q8_kernel, dim3(blocks), dim3(256), 0, stream, k, v, kc, vc, kv, positions);
    } else {
      return launch_pdl(kv_store_kernel<C>, dim3(blocks), dim3(256), 0, stream, k, v, kc, vc, kv, positions);
    }
  });
}

cudaError_t qk_prep_launch(QkPrepParams p, void* k_cache, void* v_cache, cudaStream_t stream) {
  const int64_t D = p.head_dim, n = p.k.rows;
  if (n == 0) return cudaSuccess;
  if (!qk_prep_supported(static_cast<int>(D)) || (p.kv.type == GgmlType::Q8_0 && D % 32 != 0))
    return cudaErrorInvalidValue;
  // The vec4 choice of rms_norm_launch for the same views ([n * heads, D] rows), so the same bits.
  p.vec4_q = p.n_head ? norm_vec4(Mat{p.q_in.data, n * p.n_head, D, p.q_pitch}, Mat{p.q.data, n * p.n_head, D, D},
                                  nullptr, 0, p.q_norm, D)
                      : 0;
  p.vec4_k = norm_vec4(Mat{p.k.data, n * p.n_kv_head, D, D}, Mat{p.k.data, n * p.n_kv_head, D, D}, nullptr, 0,
                       p.k_norm, D);
  const unsigned blocks = static_cast<unsigned>((n * (p.n_head + p.n_kv_head) + kQkPrepWarps - 1) / kQkPrepWarps);
  return with_cache_type(p.kv.type, [&](auto c) {
    using C = decltype(c);
    return launch_pdl(D == 256 ? qk_prep_kernel<C, 256> : qk_prep_kernel<C, 0>, dim3(blocks), dim3(kQkPrepWarps * 32),
                      0, stream, p, static_cast<uint8_t*>(k_cache), static_cast<uint8_t*>(v_cache));
  });
}

size_t argmax_scratch_bytes(int64_t rows, int64_t cols) {
  return static_cast<size_t>(rows * ((cols + kArgmaxChunk - 1) / kArgmaxChunk)) * (sizeof(float) + sizeof(int));
}

cudaError_t argmax_launch(Mat x, int32_t* out, void* scratch, cudaStream_t stream) {
  if (x.rows == 0) return cudaSuccess;
  if (x.rows > 65535 || x.cols >= kNoIndex) return cudaErrorInvalidValue;
  const int chunks = static_cast<int>((x.cols + kArgmaxChunk - 1) / kArgmaxChunk);
  float* part_v = static_cast<float*>(scratch);
  int* part_i = reinterpret_cast<int*>(part_v + x.rows * chunks);
  cudaError_t e = launch_pdl(argmax_chunks_kernel, dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(x.rows)),
                             dim3(kArgmaxThreads), 0, stream, x, part_v, part_i);
  if (e != cudaSuccess) return e;
  return launch_pdl(argmax_merge_kernel, dim3(static_cast<unsigned>(x.rows)), dim3(32), 0, stream,
                    static_cast<const float*>(part_v), static_cast<const int*>(part_i), chunks, out);
}

// One thread: a one-token step's input from the previous step's argmax (look-ahead decoding), which may
// lie in mapped host memory (one bus round trip). 16 bytes.
__global__ void feed_token_kernel(const int32_t* token, int32_t* tokens, int32_t* positions, int32_t* counter) {
  pdl_wait();  // the token is the previous kernel's
  pdl_trigger();
  const int32_t position = *counter + 1;
  *counter = position;
  tokens[0] = *token;
  positions[0] = position;
}

cudaError_t feed_token_launch(const int32_t* token, int32_t* tokens, int32_t* positions, int32_t* position_counter,
                              cudaStream_t stream) {
  return launch_pdl(feed_token_kernel, dim3(1), dim3(1), 0, stream, token, tokens, positions, position_counter);
}

// One row (a hidden state: 16 KB on a 9B) into the ring slot of the step's position, which the feed wrote on
// the device. Bytes: the row read and written once.
__global__ void copy_row_to_ring_kernel(const float* src, int64_t cols, float* ring, int64_t ring_rows,
                                        const int32_t* position) {
  pdl_wait();  // the row and the position are earlier kernels'
  pdl_trigger();
  const int64_t slot = ((*position % ring_rows) + ring_rows) % ring_rows;
  float* dst = ring + slot * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < cols; i += int64_t{gridDim.x} * blockDim.x)
    dst[i] = src[i];
}

cudaError_t copy_row_to_ring_launch(const float* src, int64_t cols, float* ring, int64_t ring_rows,
                                    const int32_t* position, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(64, (cols + 255) / 256));
  return launch_pdl(copy_row_to_ring_kernel, dim3(std::max(1u, blocks)), dim3(256), 0, stream, src, cols, ring,
                    ring_rows, position);
}

cudaError_t logit_summary_launch(Mat x, float inv_t, float* out, void* scratch, cudaStream_t stream) {
  if (x.rows == 0) return cudaSuccess;
  if (x.rows > 65535 || x.cols >= kNoIndex) return cudaErrorInvalidValue;
  const int chunks = static_cast<int>((x.cols + kArgmaxChunk - 1) / kArgmaxChunk);
  const int64_t per_row = LogitSummary::floats(x.cols);
  float* part_v = static_cast<float*>(scratch);
  int* part_i = reinterpret_cast<int*>(part_v + x.rows * chunks);
  cudaError_t e = cudaMemsetAsync(out, 0, static_cast<size_t>(x.rows * per_row) * sizeof(float), stream);
  if (e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>(chunks), static_cast<unsigned>(x.rows));
  e = launch_pdl(argmax_chunks_kernel, grid, dim3(kArgmaxThreads), 0, stream, x, part_v, part_i);
  if (e != cudaSuccess) return e;
  return launch_pdl(logit_summary_kernel, grid, dim3(kArgmaxThreads), 0, stream, x, static_cast<const float*>(part_v),
                    inv_t, inv_t * LogitSummary::kPerNat, out, per_row);
}

size_t draw_token_scratch_bytes(int64_t cols) {
  return argmax_scratch_bytes(1, cols) + static_cast<size_t>((cols + kArgmaxChunk - 1) / kArgmaxChunk) * sizeof(float);
}

cudaError_t draw_token_launch(Mat x, TokenDraw* draw, void* scratch, unsigned* done, cudaStream_t stream) {
  if (x.rows == 0 || x.cols == 0 || x.cols >= kNoIndex) return cudaErrorInvalidValue;
  x.rows = 1;
  const int chunks = static_cast<int>((x.cols + kArgmaxChunk - 1) / kArgmaxChunk);
  float* part_v = static_cast<float*>(scratch);
  int* part_i = reinterpret_cast<int*>(part_v + chunks);
  float* mass = reinterpret_cast<float*>(part_i + chunks);
  cudaError_t e = launch_pdl(argmax_chunks_kernel, dim3(static_cast<unsigned>(chunks)), dim3(kArgmaxThreads), 0, stream,
                             x, part_v, part_i);
  if (e != cudaSuccess) return e;
  return launch_pdl(draw_token_kernel, dim3(static_cast<unsigned>(chunks)), dim3(kArgmaxThreads), 0, stream, x,
                    static_cast<const float*>(part_v), static_cast<const int*>(part_i), mass, done, draw);
}

size_t draw_top_k_scratch_bytes(int64_t cols) {
  return argmax_scratch_bytes(1, cols) + kTopKCandidates * sizeof(SelectedLogit);
}
size_t draw_top_k_state_bytes() { return sizeof(TopKDrawState); }

cudaError_t draw_top_k_launch(Mat x, TokenDraw* draw, void* scratch, void* state, cudaStream_t stream) {
  if (x.rows == 0 || x.cols == 0 || x.cols >= kNoIndex) return cudaErrorInvalidValue;
  x.rows = 1;
  const int chunks = static_cast<int>((x.cols + kArgmaxChunk - 1) / kArgmaxChunk);
  float* part_v = static_cast<float*>(scratch);
  int* part_i = reinterpret_cast<int*>(part_v + chunks);
  auto* cand = reinterpret_cast<SelectedLogit*>(static_cast<char*>(scratch) + argmax_scratch_bytes(1, x.cols));
  auto* st = static_cast<TopKDrawState*>(state);
  const dim3 grid(static_cast<unsigned>(chunks)), block(kArgmaxThreads);
  cudaError_t e = launch_pdl(argmax_chunks_kernel, grid, block, 0, stream, x, part_v, part_i);
  if (e == cudaSuccess)
    e = launch_pdl(top_k_bins_kernel, grid, block, 0, stream, x, static_cast<const float*>(part_v), st,
                   static_cast<const TokenDraw*>(draw));
  if (e != cudaSuccess) return e;
  return launch_pdl(top_k_draw_kernel, grid, block, 0, stream, x, static_cast<const float*>(part_v),
                    static_cast<const int*>(part_i), st, cand, draw);
}

cudaError_t select_logits_launch(Mat x, int64_t row, float threshold, int32_t cap, int32_t* count,
                                 SelectedLogit* picked, cudaStream_t stream) {
  if (x.cols == 0) return cudaMemsetAsync(count, 0, sizeof(int32_t), stream);
  if (x.cols >= kNoIndex) return cudaErrorInvalidValue;
  cudaError_t e = cudaMemsetAsync(count, 0, sizeof(int32_t), stream);
  if (e != cudaSuccess) return e;
  const unsigned chunks = static_cast<unsigned>((x.cols + kArgmaxChunk - 1) / kArgmaxChunk);
  return launch_pdl(select_logits_kernel, dim3(chunks), dim3(kArgmaxThreads), 0, stream, x, row, threshold, cap, count,
                    picked);
}

cudaError_t moe_route_launch(Mat logits, int top_k, int32_t* ids, float* weights, cudaStream_t stream) {
  if (logits.rows == 0) return cudaSuccess;
  return launch_pdl(moe_route_kernel, dim3(static_cast<unsigned>(logits.rows)), dim3(32), logits.cols * sizeof(float),
                    stream, logits, top_k, ids, weights);
}

cudaError_t moe_combine_launch(Mat expert_out, const int32_t* pos, const float* weights, int top_k, Mat out,
                               cudaStream_t stream) {
  if (out.rows == 0) return cudaSuccess;
  return launch_pdl(moe_combine_kernel, dim3(grid_for(out.rows * out.cols, 256, 65535)), dim3(256), 0, stream,
                    expert_out, pos, weights, top_k, out);
}

cudaError_t moe_group_launch(const int32_t* ids, int64_t n_slots, int n_experts, int32_t* offsets, int32_t* order,
                             int32_t* pos, cudaStream_t stream) {
  if (n_experts < 1 || n_experts > 8192) return cudaErrorInvalidValue;
  return launch_pdl(moe_group_kernel, dim3(1), dim3(1024), n_experts * sizeof(int), stream, ids, n_slots, n_experts,
                    offsets, order, pos);
}

cudaError_t gather_rows_launch(Mat x, const int32_t* order, int x_div, Mat y, cudaStream_t stream) {
  if (y.rows == 0) return cudaSuccess;
  return launch_pdl(gather_rows_kernel, dim3(grid_for(y.rows * y.cols, 256, 65535)), dim3(256), 0, stream, x, order,
                    x_div, y);
}

}  // namespace hyspec::cuda
