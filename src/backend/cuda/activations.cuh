// The scalar arithmetic that ops and the kernels folding them must share bit for bit: the activations
// and a norm's sums of squares (elementwise.cu, recurrent.cu, matvec_int8.cu's folds, attention.cu's qk_prep).
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

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// 1 / sqrt(mean of squares + eps) of a group from each thread's partial sum of squares: over the warp,
// or (tpg > 32) over the block through `partial`, in a fixed order. Every thread of the block calls it.
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

constexpr int kNormMaxVec4 = 8;  // float4s per thread in a norm's one-round-trip form

}  // namespace hyspec::cuda
