// Selection in a warp: the argmax order (larger value, then smaller index) and the MoE router's top-k,
// shared by the argmax and route kernels (elementwise.cu) and the expert matvecs that route in-block
// (matvec_int8.cu), so that every producer of a step's expert ids and weights gives the same bits.
#pragma once
#include <cfloat>
#include <cstdint>

namespace hyspec::cuda {

constexpr int kNoIndex = 0x7fffffff;

// Better of (v, i) and (ov, oi): larger value, then smaller index.
__device__ __forceinline__ void arg_better(float& v, int& i, float ov, int oi) {
  if (ov > v || (ov == v && oi < i)) v = ov, i = oi;
}

__device__ __forceinline__ void warp_arg_best(float& v, int& i) {
  for (int o = 16; o > 0; o >>= 1) arg_better(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
}

// One token's route, by a whole warp: p_e = exp(l_e - max) over the n logits l (the softmax normaliser
// cancels in the renormalisation), top_k (<= 32) rounds of argmax (first index on ties), ids[s] and
// weights[s] = p_sel / sum(p_sel). p: n floats of scratch (shared memory); ids and weights may be
// shared or global memory. The warp's lanes all return after the weights are written.
__device__ __forceinline__ void route_top_k(const float* __restrict__ l, int n, int top_k, float* p, int32_t* ids,
                                            float* weights) {
  const int lane = threadIdx.x & 31;
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
    if (idx == kNoIndex) idx = 0, v = 0.0f;  // NaN logits: no winner (the NaNs reach the output anyway)
    total += v;
    if (lane == 0) {
      ids[s] = idx;
      weights[s] = v;
      p[idx] = -2.0f;
    }
    __syncwarp();
  }
  if (lane < top_k) weights[lane] /= total;
  __syncwarp();
}

}  // namespace hyspec::cuda
