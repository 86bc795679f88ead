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
// cancels in the renormalisation), top_k (<= 32) rounds of argmax (first index on ties; a round without
// a winner, NaN logits, takes expert 0 with weight 0), ids[s] and weights[s] = p_sel / sum(p_sel). ids
// and weights may be shared or global memory; the warp's lanes all return after they are written.
// Up to kRouteRegExperts logits sit in registers, loaded at once (one round trip; a round is then
// compares and 10 shuffles); more take the n floats of scratch p (shared memory). Either way the same
// values: the winner does not depend on the order of comparisons (value, then index, is a total order).
constexpr int kRouteRegExperts = 512;
__device__ __forceinline__ void route_top_k(const float* __restrict__ l, int n, int top_k, float* p, int32_t* ids,
                                            float* weights) {
  const int lane = threadIdx.x & 31;
  auto pick = [&](int s, float& total, float v, int idx) {
    warp_arg_best(v, idx);
    if (idx == kNoIndex) idx = 0, v = 0.0f;
    total += v;
    if (lane == 0) ids[s] = idx, weights[s] = v;
    return idx;
  };
  float m = -FLT_MAX, total = 0.0f;
  if (n <= kRouteRegExperts) {
    constexpr int kPer = kRouteRegExperts / 32;
    float r[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) r[j] = lane + 32 * j < n ? l[lane + 32 * j] : -FLT_MAX;
#pragma unroll
    for (int j = 0; j < kPer; ++j) m = fmaxf(m, r[j]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
#pragma unroll
    for (int j = 0; j < kPer; ++j) r[j] = lane + 32 * j < n ? expf(r[j] - m) : -2.0f;
    for (int s = 0; s < top_k; ++s) {
      float v = -1.0f;
      int idx = kNoIndex;
#pragma unroll
      for (int j = 0; j < kPer; ++j) arg_better(v, idx, r[j], lane + 32 * j);
      idx = pick(s, total, v, idx);
#pragma unroll
      for (int j = 0; j < kPer; ++j)
        if (lane + 32 * j == idx) r[j] = -2.0f;
    }
  } else {
    for (int e = lane; e < n; e += 32) m = fmaxf(m, l[e]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    for (int e = lane; e < n; e += 32) p[e] = expf(l[e] - m);
    __syncwarp();
    for (int s = 0; s < top_k; ++s) {
      float v = -1.0f;
      int idx = kNoIndex;
      for (int e = lane; e < n; e += 32) arg_better(v, idx, p[e], e);
      idx = pick(s, total, v, idx);
      if (lane == 0) p[idx] = -2.0f;
      __syncwarp();
    }
  }
  __syncwarp();
  if (lane < top_k) weights[lane] /= total;
  __syncwarp();
}

}  // namespace hyspec::cuda
