// The KV cache's types on the device (backend.h: KvLayer, kv_head_bytes): float, __half, __nv_bfloat16,
// and Q8Slot for Q8_0 (per kv head: head_dim int8 codes, one f16 scale per 32 after them, padding to 16
// bytes). Values are stored rounded as the CPU backend stores them (fp32_to_fp16 / fp32_to_bf16, ggml's
// q8_0 reference) and widened exactly.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "format/ggml_types.h"

namespace hyspec::cuda {

// The element tag of a Q8_0 cache: one byte per value (the code), its scale elsewhere in the slot.
struct Q8Slot {
  uint8_t code;
};
template <typename C>
constexpr bool kIsQ8 = std::is_same_v<C, Q8Slot>;
// Bytes of a Q8_0 slot of head_dim D (backend.h kv_head_bytes): D codes, D / 32 f16 scales, padding to 16.
constexpr int q8_slot_bytes(int D) { return (D + D / 16 + 15) / 16 * 16; }
// Bytes of one kv head's slot of a cache of element type C.
template <typename C, int D>
constexpr int slot_bytes() {
  if constexpr (kIsQ8<C>) {
    return q8_slot_bytes(D);
  } else {
    return D * static_cast<int>(sizeof(C));
  }
}

// f(C{}) for the element type C of a supported cache type; cudaErrorInvalidValue for any other.
template <class F>
cudaError_t with_cache_type(GgmlType type, F&& f) {
  switch (type) {
    case GgmlType::F32: return f(float{});
    case GgmlType::F16: return f(__half{});
    case GgmlType::BF16: return f(__nv_bfloat16{});
    case GgmlType::Q8_0: return f(Q8Slot{});
    default: return cudaErrorInvalidValue;
  }
}

template <typename C>
__device__ __forceinline__ C to_cache(float v) {
  if constexpr (std::is_same_v<C, __half>) {
    return __float2half_rn(v);
  } else if constexpr (std::is_same_v<C, __nv_bfloat16>) {
    return __float2bfloat16_rn(v);
  } else {
    return v;
  }
}

// Two consecutive 16-bit elements (one 32-bit word, the first in the low half) as f32.
template <typename C>
__device__ __forceinline__ float2 widen_pair(uint32_t u) {
  static_assert(sizeof(C) == 2);
  if constexpr (std::is_same_v<C, __half>) {
    __half2 h;
    __builtin_memcpy(&h, &u, 4);
    return __half22float2(h);
  } else {  // bf16: the high 16 bits of an f32
    return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
  }
}

// The largest |x| of each of the first n of N Q8_0 blocks, a warp's 32 values each (x[i]: this lane's value
// of block i): the same xor tree in every lane, the blocks' trees interleaved (one after the other, each
// block's store waited on its own 5-shuffle chain).
template <int N>
__device__ __forceinline__ void q8_block_amax(const float (&x)[N], float (&amax)[N], int n = N) {
#pragma unroll
  for (int i = 0; i < N; ++i) amax[i] = fabsf(x[i]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
#pragma unroll
    for (int i = 0; i < N; ++i)
      if (i < n) amax[i] = fmaxf(amax[i], __shfl_xor_sync(0xffffffffu, amax[i], o));
}

// Stores value x of dim 32 * block + lane of a Q8_0 slot (head_dim D), the 32 lanes of a warp together,
// amax from q8_block_amax: ggml's q8_0 block (d = max|x| / 127 and code = round(x / d) in f32, half away
// from zero; d stored as f16), the same bits as the CPU's format/quants. Block 0's warp also zeroes the
// slot's padding.
__device__ __forceinline__ void store_q8_block(uint8_t* slot, int D, int block, float x, float amax, int lane) {
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  slot[32 * block + lane] = static_cast<uint8_t>(static_cast<int8_t>(roundf(x * id)));
  if (lane == 0) reinterpret_cast<__half*>(slot + D)[block] = __float2half_rn(d);
  const int pad_from = D + D / 16, pad = (pad_from + 15) / 16 * 16 - pad_from;
  if (block == 0 && lane < pad) slot[pad_from + lane] = 0;
}

// Four int8 codes (a word, the first in the low byte) as two f16 pairs, exactly: the byte b = code + 128
// is put under the exponent of 1024 (f16 ulp 1 there), then 1024 + 128 is taken off.
__device__ __forceinline__ void codes_to_half2(uint32_t w, uint32_t& lo, uint32_t& hi) {
  const uint32_t b = w ^ 0x80808080u;
  lo = __byte_perm(b, 0x64646464u, 0x4140);
  hi = __byte_perm(b, 0x64646464u, 0x4342);
  const __half2 bias = __halves2half2(__ushort_as_half(0x6480), __ushort_as_half(0x6480));
  __half2 l, h;
  __builtin_memcpy(&l, &lo, 4);
  __builtin_memcpy(&h, &hi, 4);
  l = __hsub2(l, bias);
  h = __hsub2(h, bias);
  __builtin_memcpy(&lo, &l, 4);
  __builtin_memcpy(&hi, &h, 4);
}

// Byte i of a word of Q8_0 codes as f32.
__device__ __forceinline__ float code_at(uint32_t w, int i) {
  return static_cast<float>(static_cast<int8_t>(w >> (8 * i)));
}

// The f16 scale of block `block` of a Q8_0 slot (shared or global memory) as f32.
__device__ __forceinline__ float q8_scale(const uint8_t* slot, int D, int block) {
  return __half2float(reinterpret_cast<const __half*>(slot + D)[block]);
}

}  // namespace hyspec::cuda
