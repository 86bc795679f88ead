// The arithmetic every RMS norm shares (elementwise.cu's norm kernels, qk_prep_kernel, and the int8
// matvecs that norm their own input): one expression per step, so one FMA contraction and one
// summation order, and the same bits wherever a row is normed.
#pragma once
#include <cstdint>

namespace hyspec::cuda {

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// A thread's running sum of squares.
__device__ __forceinline__ float add_square(float ss, float v) { return ss + v * v; }
__device__ __forceinline__ float add_squares(float ss, float4 v) {
  return add_square(add_square(add_square(add_square(ss, v.x), v.y), v.z), v.w);
}

// 1 / sqrt(mean of squares + eps) of a group from each thread's partial sum of squares: over the warp,
// or (tpg > 32) over the block through `partial` (tpg / 32 floats), in a fixed order. Every thread of
// the block calls it.
__device__ __forceinline__ float group_inv_rms(float ss, int tpg, float* partial, int64_t group, float eps) {
  ss = warp_sum(ss);
  if (tpg > 32) {
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = ss;
    __syncthreads();
    ss = 0.0f;
    for (int i = 0; i < tpg / 32; ++i) ss += partial[i];
  }
  return 1.0f / sqrtf(ss / static_cast<float>(group) + eps);
}

}  // namespace hyspec::cuda
