// Activations quantized to int8 per 256 elements for the int8 matvecs (matvec_int8.cu), as llama.cpp's
// CPU q8_K: q = round(x * 127 / max|x|), d = max|x| / 127 per block, plus the exact sum of every 16 codes. The
// matvec's own quantize kernels and the norms that quantize their output (elementwise.cu) share the
// lane arithmetic below, so every producer gives the same bits.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

namespace hyspec::cuda {

// Quantized rows, stored by 256-block in step-major order: block (s, t) (elements 256s.. of row t) is
// block s * P + t, P the pitch (the rows rounded up to whole 8-token tiles, padded_tokens, in global
// buffers; the row count in the dp4a kernel's shared copy), so that a step's tokens are adjacent and
// the tensor-core kernels address them by one pointer and constant offsets. q: 256 int8 codes per
// block, d: one f32 scale per block, bs: 16 f16 sums of 16 consecutive codes per block (|sum| <= 2032:
// exact in f16).
struct Q8K {
  int8_t* q;
  float* d;
  __half* bs;
};

// The order of a 256-block's codes in q: natural for the dp4a kernels, or permuted so that a
// tensor-core lane's B fragments of a half super-block are two 16-byte pieces, and the four lanes t of
// a token read 64 contiguous bytes with each of their two loads (whole 32-byte sectors; lanes 32 bytes
// apart used half of each sector per load, and L1 wavefronts were the kernels' busiest memory pipe).
// d and bs do not depend on the order.
enum class XOrder : int {
  kNatural,  // element o at o
  kFragQ4,   // o = 32i + 8t + e (sub-block i, lane t's 8 codes) at 64(i / 2) + 16t + 8(i % 2) + e
  kFragQ6,   // o = 128h + 16j + 4t + e (half h, sub-block j, lane t's 4 codes) at 128h + 64(j / 4) + 16t + 4(j % 4) + e
};

// One 256-element block as a warp holds it: lane l quantizes elements 8l..8l+7 (v).
struct Q8KLane {
  uint32_t codes[2];  // the 8 int8 codes, packed
  int pair_sum;       // sum of the 16 codes of lanes l & ~1 and l | 1
  float d;
};

// Every lane of the warp calls it (shuffles).
__device__ __forceinline__ Q8KLane quantize_lane(const float (&v)[8]) {
  float amax = 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(v[e]));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  // q = round(v * (127 / amax)): one division per block, not one per element (|v| <= amax keeps
  // |q| <= 127); the 16-code sums are exact whatever the codes.
  Q8KLane r{{0u, 0u}, 0, amax / 127.0f};
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const int qv = __float2int_rn(v[e] * inv);
    r.pair_sum += qv;
    r.codes[e / 4] |= (static_cast<uint32_t>(qv) & 0xffu) << (8 * (e % 4));
  }
  r.pair_sum += __shfl_xor_sync(0xffffffffu, r.pair_sum, 1);
  return r;
}

// Lane's codes into the block's q (256 bytes) in `order`.
__device__ __forceinline__ void store_codes(const Q8KLane& r, int lane, int8_t* q, XOrder order) {
  if (order == XOrder::kNatural) {
    *reinterpret_cast<uint2*>(q + 8 * lane) = make_uint2(r.codes[0], r.codes[1]);
  } else if (order == XOrder::kFragQ4) {  // i = lane / 4, t = lane % 4
    const int i = lane >> 2;
    *reinterpret_cast<uint2*>(q + 64 * (i >> 1) + 16 * (lane & 3) + 8 * (i & 1)) = make_uint2(r.codes[0], r.codes[1]);
  } else {  // h = lane / 16, j = (lane % 16) / 2, t = 2 (lane % 2) and t + 1
    const int j = (lane & 15) >> 1;
    int8_t* p = q + 128 * (lane >> 4) + 64 * (j >> 2) + 32 * (lane & 1) + 4 * (j & 3);
    *reinterpret_cast<uint32_t*>(p) = r.codes[0];
    *reinterpret_cast<uint32_t*>(p + 16) = r.codes[1];
  }
}

// The block's 16 sums (bs, 16 halves) and scale.
__device__ __forceinline__ void store_sums(const Q8KLane& r, int lane, __half* bs, float* d) {
  if ((lane & 1) == 0) bs[lane / 2] = __int2half_rn(r.pair_sum);
  if (lane == 0) *d = r.d;
}

}  // namespace hyspec::cuda
