// The KV cache's element types on the device (kv_element_bytes, backend.h): float, __half, __nv_bfloat16.
// Rows are stored rounded to nearest even (the CPU backend's fp32_to_fp16 / fp32_to_bf16) and widened
// exactly.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "format/ggml_types.h"

namespace hyspec::cuda {

// f(C{}) for the element type C of a supported cache type; cudaErrorInvalidValue for any other.
template <class F>
cudaError_t with_cache_type(GgmlType type, F&& f) {
  switch (type) {
    case GgmlType::F32: return f(float{});
    case GgmlType::F16: return f(__half{});
    case GgmlType::BF16: return f(__nv_bfloat16{});
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

}  // namespace hyspec::cuda
