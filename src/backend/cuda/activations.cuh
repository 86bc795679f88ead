// The scalar arithmetic that ops and the kernels folding them must share bit for bit: the activations
// and a norm's running sum of squares (elementwise.cu, recurrent.cu, matvec_int8.cu's folds).
#pragma once
#include <cuda_runtime.h>

namespace hyspec::cuda {

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// A thread's running sum of squares: the one expression (and so the one FMA contraction) of every norm.
__device__ __forceinline__ float add_square(float ss, float v) { return ss + v * v; }
__device__ __forceinline__ float add_squares(float ss, float4 v) {
  return add_square(add_square(add_square(add_square(ss, v.x), v.y), v.z), v.w);
}

}  // namespace hyspec::cuda
