// Warp-level tensor-core helpers (sm_80+): the f16 (and bf16) mma.m16n8k16 with f32 accumulation and the
// ldmatrix loads that feed it from shared memory. Fragment layout (lane = 4g + t): A rows g and
// g+8, columns 2t, 2t+1 (a0, a1) and 2t+8, 2t+9 (a2, a3); B (k x n, "col") rows 2t, 2t+1 (b0) and
// 2t+8, 2t+9 (b1) of column g; C rows g (c0, c1) and g+8 (c2, c3), columns 2t, 2t+1.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace hyspec::cuda {

__device__ __forceinline__ half2 as_half2(uint32_t u) {
  half2 h;
  static_assert(sizeof(h) == 4);
  __builtin_memcpy(&h, &u, 4);
  return h;
}
__device__ __forceinline__ uint32_t as_u32(half2 h) {
  uint32_t u;
  __builtin_memcpy(&u, &h, 4);
  return u;
}

// D += A.B on f16 operands (T = __half) or bf16 ones (T = __nv_bfloat16), same fragment layout.
template <typename T = __half>
__device__ __forceinline__ void mma_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint32_t b0, uint32_t b1) {
  static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>, "f16 or bf16 operands");
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// The int8 product m16n8k32 with s32 results (not accumulated: d = A.B). Fragments (lane = 4g + t):
// A rows g (a0, a2) and g+8 (a1, a3), columns 4t..4t+3 (a0, a1) and 16+4t..16+4t+3 (a2, a3), a byte per
// element in column order; B rows 4t..4t+3 (b0) and 16+4t.. (b1) of column g; C as above.
__device__ __forceinline__ void mma_s8(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
}

// Four 8x8 f16 matrices; lane l gives the address of row l%8 of matrix l/8 (16 bytes each). Lane
// (g, t) receives row g, columns 2t, 2t+1 of each matrix, or with _trans rows 2t, 2t+1 of column g.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem_row) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

}  // namespace hyspec::cuda
