// The RMS norm arithmetic that rms_norm_kernel (elementwise.cu) and the norm tail of the one-row int8
// matvecs (matvec_int8.cu) share bit for bit: the reduction of a group's sum of squares, the quantized
// store of a normed 256-block, and the tail itself (Int8NormTail: a decode step's residual add + norm run
// by the last block of the matvec that wrote the delta).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/activations.cuh"
#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch_util.h"
#include "backend/cuda/q8k.cuh"

namespace hyspec::cuda {

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// 1 / sqrt(mean of squares + eps) of a group from the warp sums of its tpg threads (tpg / 32 of them,
// in partial, 16-byte aligned; tpg 256 or 512), added in warp order. Read as float4s: one shared-memory
// round trip (the loop of scalar loads: 9B Q4_K_M decode +0.5%, H200, session 43).
__device__ __forceinline__ float inv_rms_of_warp_sums(const float* partial, int tpg, int64_t group, float eps) {
  const int warps = tpg / 32;
  float4 p[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    if (4 * i < warps) p[i] = reinterpret_cast<const float4*>(partial)[i];
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i)
    if (4 * i < warps) ss += p[i].x, ss += p[i].y, ss += p[i].z, ss += p[i].w;
  return 1.0f / sqrtf(ss / static_cast<float>(group) + eps);
}

// 1 / sqrt(mean of squares + eps) of a group from each thread's partial sum of squares: over the warp
// (tpg 32: the group's own), or (tpg 256 or 512) over the block through `partial`. Every thread of the
// block calls it.
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

// The one-row add_rms_norm that follows a one-row matvec, run by the last of its `blocks` blocks to
// finish (every thread of every block calls this after its tiles' outputs are stored): x += delta (the
// matvec's output y), h = x / sqrt(mean(x^2) + eps) * w over the row (one group), h quantized into qx as
// the norm kernel quantizes it. The arithmetic of rms_norm_kernel's one-round-trip form with t.tpg
// threads a group: thread i of this block plays its threads i, i + blockDim.x, ... (the same float4s,
// warp sums and order), so a decode step's rows get the bits of a verify step's norm launch.
// smem: 2 * group + 16 floats, 16-byte aligned; blockDim.x a multiple of 32 dividing t.tpg.
// Cost: a fence and an atomic per block; the last block then one L2 round trip for x and y (cp.async, all
// in flight at once), a block reduction and 1/4 of the norm kernel's quantize work per warp.
__device__ __forceinline__ void residual_norm_tail(const Int8NormTail& t, const float* delta, int64_t group, int blocks,
                                                   float* smem) {
  __shared__ bool is_last;
  __syncthreads();  // every thread's outputs stored; no warp still reads the shared memory
  if (threadIdx.x == 0) {
    // Release the block's outputs, then count it; the last block acquires everyone's (the pattern of
    // cooperative groups' grid sync: the barrier orders the block's stores before thread 0's fence).
    __threadfence();
    is_last = atomicAdd(t.counter, 1u) == static_cast<unsigned>(blocks - 1);
    if (is_last) {
      __threadfence();
      *t.counter = 0u;  // ready for the next launch (stream order)
    }
  }
  __syncthreads();
  if (!is_last) return;  // (the blocks that exit let the next kernel start, as a pdl_trigger would)
  // The next kernel starts now: its weight copies go out while this block norms. Not earlier: its blocks'
  // copies in flight beside this launch's tiles slowed a 9B decode step 11% (session 44).
  pdl_trigger();
  const int threads = static_cast<int>(blockDim.x), plays = t.tpg / threads, n4 = static_cast<int>(group / 4);
  float* sx = smem + 16;  // x, then x + delta, then h
  float* sd = sx + group;
  float* partial = smem;
  for (int i = threadIdx.x; i < n4; i += threads) {  // cp.async.cg: from the L2, where the other blocks' y is
    cp_async16(sx + 4 * i, t.x + 4 * i);
    cp_async16(sd + 4 * i, delta + 4 * i);
  }
  cp_async_commit();
  float4 wv[kNormTailMaxVec4];  // the weights meanwhile (thread-owned float4s, as the norm kernel's)
#pragma unroll
  for (int p = 0; p < kNormTailMaxVec4; ++p) {
    const int j = p / t.vec4, k = p % t.vec4;
    if (j >= plays) break;
    if (t.w) wv[p] = __ldg(reinterpret_cast<const float4*>(t.w) + k * t.tpg + j * threads + threadIdx.x);
  }
  cp_async_wait<0>();
  __syncthreads();
  // Virtual thread lt = j * threads + threadIdx.x owns float4s k * tpg + lt (k < vec4), as in the kernel.
  float ss[2];  // (plays <= 2)
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    if (j >= plays) break;
    ss[j] = 0.0f;
    for (int k = 0; k < t.vec4; ++k) {
      const int i = k * t.tpg + j * threads + threadIdx.x;
      float4 v = reinterpret_cast<const float4*>(sx)[i];
      const float4 d = reinterpret_cast<const float4*>(sd)[i];
      v.x += d.x, v.y += d.y, v.z += d.z, v.w += d.w;
      reinterpret_cast<float4*>(t.x)[i] = v;
      reinterpret_cast<float4*>(sx)[i] = v;
      ss[j] = add_squares(ss[j], v);
    }
  }
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    if (j >= plays) break;
    const float s = warp_sum(ss[j]);
    if ((threadIdx.x & 31) == 0) partial[(j * threads + threadIdx.x) >> 5] = s;
  }
  __syncthreads();
  const float inv = inv_rms_of_warp_sums(partial, t.tpg, group, t.eps);
#pragma unroll
  for (int p = 0; p < kNormTailMaxVec4; ++p) {
    const int j = p / t.vec4, k = p % t.vec4;
    if (j >= plays) break;
    const int i = k * t.tpg + j * threads + threadIdx.x;
    const float4 v = reinterpret_cast<const float4*>(sx)[i];
    float o[4] = {v.x * inv, v.y * inv, v.z * inv, v.w * inv};
    if (t.w) o[0] *= wv[p].x, o[1] *= wv[p].y, o[2] *= wv[p].z, o[3] *= wv[p].w;
    const float4 h = make_float4(o[0], o[1], o[2], o[3]);
    reinterpret_cast<float4*>(t.h)[i] = h;
    reinterpret_cast<float4*>(sx)[i] = h;
  }
  if (!t.qx.d) return;
  __syncthreads();
  // Each 256-block of h by a warp, as the norm kernel's quantize_span (one row: pitch padded_tokens(1)).
  const int lane = threadIdx.x & 31;
  for (int b = threadIdx.x >> 5; b < group / 256; b += threads / 32) {
    const float4 v0 = reinterpret_cast<const float4*>(sx + 256 * b)[2 * lane];
    const float4 v1 = reinterpret_cast<const float4*>(sx + 256 * b)[2 * lane + 1];
    const float v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
    store_quantized_x(quantize_lane(v), lane, t.qx, b * padded_tokens(1));
  }
}

}  // namespace hyspec::cuda
