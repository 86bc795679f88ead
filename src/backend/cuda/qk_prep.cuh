// qk_prep's arithmetic for one head, shared by qk_prep_kernel (elementwise.cu) and the decode attention that
// runs it in its own blocks (attention.cu, kPrep): the same code, so a query or key gets the same bits either
// way, and a verify row (qk_prep, then the attention) keeps a decode step's.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/activations.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_cache.cuh"

namespace hyspec::cuda {
namespace {

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
// The loops over a lane's elements of a head (and its RoPE pairs, half as many): kD / 32 with the head dim
// as a constant, else kQkPrepMaxHeadDim / 32, predicated.
template <int kD>
constexpr int qk_prep_per_lane() {
  return (kD ? kD : kQkPrepMaxHeadDim) / 32;
}

// One head of QkPrepParams, by one warp: the norm as rms_norm_kernel's warp form computes it (tpg = 32: the
// same lane split and order, so the same bits) times w, staged in hs (D floats of shared memory: RoPE's pairs
// sit 16..32 lanes apart), RoPE with the lane's angles ang (see qk_prep_per_lane), then written to y (hs itself
// where no one reads it) and left in hs. store (a key head): its K (the result) and V (the row v) into the cache
// slots at kc + slot and vc + slot. vec4: the norm's float4 form (norm_vec4's choice), or 0. Every global load of the warp comes first (x,
// w, v): one round trip.
template <typename C, int kD>
__device__ __forceinline__ void qk_prep_head(const float* x, const float* w, int vec4, float* y, float* hs,
                                             bool store, const float* v, uint8_t* kc, uint8_t* vc, int64_t slot, int D, int half, float eps,
                                             const RopeAngle (&ang)[qk_prep_per_lane<kD>() / 2], int lane) {
  constexpr int kMaxPer = qk_prep_per_lane<kD>();
  constexpr int kVec4 = kD ? kD / 128 : kNormMaxVec4;  // the float4s of a lane (vec4 form)
  float vr[kMaxPer];
  if (store) {
#pragma unroll
    for (int e = 0; e < kMaxPer; ++e)
      if (lane + 32 * e < D) vr[e] = v[lane + 32 * e];
  }
  float ss = 0.0f;
  if (vec4 > 0) {  // lane owns float4s lane, lane + 32, ...
    float4 xv[kVec4], wv[kVec4];
#pragma unroll
    for (int k = 0; k < kVec4; ++k)
      if (k < vec4) {
        xv[k] = reinterpret_cast<const float4*>(x)[k * 32 + lane];
        if (w) wv[k] = reinterpret_cast<const float4*>(w)[k * 32 + lane];
      }
#pragma unroll
    for (int k = 0; k < kVec4; ++k)
      if (k < vec4) ss = add_squares(ss, xv[k]);
    const float inv = group_inv_rms(ss, 32, nullptr, D, eps);
#pragma unroll
    for (int k = 0; k < kVec4; ++k) {
      if (k >= vec4) break;
      const int c = (k * 32 + lane) * 4;
      float o[4] = {xv[k].x * inv, xv[k].y * inv, xv[k].z * inv, xv[k].w * inv};
      if (w) o[0] *= wv[k].x, o[1] *= wv[k].y, o[2] *= wv[k].z, o[3] *= wv[k].w;
      *reinterpret_cast<float4*>(hs + c) = make_float4(o[0], o[1], o[2], o[3]);
    }
  } else {  // lane owns elements lane, lane + 32, ...
    for (int c = lane; c < D; c += 32) ss = add_square(ss, x[c]);
    const float inv = group_inv_rms(ss, 32, nullptr, D, eps);
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
  if (!store) return;
  uint8_t* const kslot = kc + slot;
  uint8_t* const vslot = vc + slot;
  if constexpr (kIsQ8<C>) {  // D % 32 == 0: element e of the lane is in block e
    // The maxima of four K and four V blocks at a time (K block e0 + i at 2i, V at 2i + 1), then their
    // stores; block by block, each store had waited on its own 5-shuffle chain (H100, 9B Q4_K_M with a
    // Q8_0 cache: decode 2.606 -> 2.599 ms).
    constexpr int kAtOnce = 4;
#pragma unroll
    for (int e0 = 0; e0 < kMaxPer; e0 += kAtOnce) {
      if (32 * e0 >= D) break;
      float xs[2 * kAtOnce], amax[2 * kAtOnce];
#pragma unroll
      for (int i = 0; i < kAtOnce; ++i) {
        const bool in = 32 * (e0 + i) < D;
        xs[2 * i] = in ? hs[lane + 32 * (e0 + i)] : 0.0f, xs[2 * i + 1] = in ? vr[e0 + i] : 0.0f;
      }
      q8_block_amax(xs, amax, 2 * min(kAtOnce, D / 32 - e0));
#pragma unroll
      for (int i = 0; i < kAtOnce; ++i) {
        if (32 * (e0 + i) >= D) break;
        store_q8_block(kslot, D, e0 + i, xs[2 * i], amax[2 * i], lane);
        store_q8_block(vslot, D, e0 + i, xs[2 * i + 1], amax[2 * i + 1], lane);
      }
    }
  } else {
    C* kd = reinterpret_cast<C*>(kslot);
    C* vd = reinterpret_cast<C*>(vslot);
#pragma unroll
    for (int e = 0; e < kMaxPer; ++e) {
      const int c = lane + 32 * e;
      if (c >= D) break;
      kd[c] = to_cache<C>(hs[c]);
      vd[c] = to_cache<C>(vr[e]);
    }
  }
}

}  // namespace
}  // namespace hyspec::cuda
