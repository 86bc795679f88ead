// The scalar arithmetic that ops and the kernels folding them must share bit for bit: the activations
// and a norm's running sum of squares (elementwise.cu, recurrent.cu, matvec_int8.cu's folds).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace hyspec::cuda {

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// A thread's running sum of squares: the one expression (and so the one FMA contraction) of every norm.
__device__ __forceinline__ float add_square(float ss, float v) { return ss + v * v; }
__device__ __forceinline__ float add_squares(float ss, float4 v) {
  return add_square(add_square(add_square(add_square(ss, v.x), v.y), v.z), v.w);
}

// 1 / sqrt(mean of squares + eps) of a group from the warp sums of its tpg threads (tpg / 32 of them, 8 or
// 16: tpg 256 or 512), in `partial` (shared memory, 16-byte aligned): read as float4s in one round trip
// (the loop of scalar loads: 9B Q4_K_M decode +0.5%, H200, session 43), then added in warp order.
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

}  // namespace hyspec::cuda
