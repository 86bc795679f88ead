// Device helpers for streaming global memory into shared memory: 16-byte cp.async copies in
// commit groups, and programmatic dependent launch (sm_90). Used by the matvec, GEMM, attention and
// chunked GDN kernels.
#pragma once
#include <cstdint>

#include "backend/cuda/step_trace.cuh"

namespace hyspec::cuda {

// The shared-space address of a pointer into shared memory (what the instructions below take).
__device__ __forceinline__ uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// Every copy hints the L2 to fetch the 128-byte block around it (.L2::128B): these copies stream rows
// (weight tiles of the matvec rings and GEMMs, K/V steps, the chunked GDN's rows) whose neighbours the
// next copies want. 9B Q4_K_M decode on an H100: 2.555 -> 2.501 ms (.L2::64B: 2.567, as no hint), verify-15
// 3.50 -> 3.44; on an H200 2.201 -> 2.152 (.L2::256B: 2.227, slower than no hint).
__device__ __forceinline__ void cp_async16(void* smem_dst, const void* gmem_src) {
  const uint32_t d = smem_addr(smem_dst);
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n" ::"r"(d), "l"(gmem_src) : "memory");
}
// The same, issued only where pred holds: a predicated instruction, so a warp whose lanes differ does
// not branch around it (an `if` around the asm compiled to a divergent branch and reconvergence per copy).
__device__ __forceinline__ void cp_async16_if(bool pred, void* smem_dst, const void* gmem_src) {
  const uint32_t d = smem_addr(smem_dst);
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n @p cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n}\n"
      ::"r"(d), "l"(gmem_src), "r"(static_cast<int>(pred))
      : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// At most n groups of this thread still pending (n = stages - 2, 0..6).
__device__ __forceinline__ void cp_async_wait_upto(int n) {
  switch (n) {
    case 6: cp_async_wait<6>(); break;
    case 5: cp_async_wait<5>(); break;
    case 4: cp_async_wait<4>(); break;
    case 3: cp_async_wait<3>(); break;
    case 2: cp_async_wait<2>(); break;
    case 1: cp_async_wait<1>(); break;
    default: cp_async_wait<0>(); break;
  }
}
// A 16-byte shared-memory load (p 16-byte aligned) kept whole and in place: LLVM splits a uint4 load
// whose words feed different branches and sinks the parts into them.
__device__ __forceinline__ uint4 lds128(const void* p) {
  const uint32_t a = smem_addr(p);
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a) : "memory");
  return v;
}
// sm_90 tensor-map (TMA) copies completing on a shared-memory mbarrier (shared-space addresses: smem_addr).
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}
// Before an mbarrier's location is used again, even for another mbarrier (PTX).
__device__ __forceinline__ void mbar_inval(uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
#endif
}
// After mbar_init, before the barriers' first use by the copy engine.
__device__ __forceinline__ void mbar_init_fence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 1;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
               : "=r"(done) : "r"(bar), "r"(parity) : "memory");
#endif
  return done != 0;
}
// The thread's earlier generic-proxy accesses of shared memory ordered before its later async-proxy ones
// (a TMA copy into a slot the warp has just read).
__device__ __forceinline__ void fence_proxy_async_smem() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Box {c0, c1} of the 2D tensor map (a __grid_constant__ parameter's address) into shared memory at dst, its
// bytes counted on bar.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void* map, int c0, int c1, uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
#endif
}
// Box {c0, c1, c2} of the 3D tensor map (a __grid_constant__ parameter's address) into shared memory at
// dst, its bytes counted on bar.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void* map, int c0, int c1, int c2, uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
#endif
}

// Programmatic dependent launch (sm_90): wait for the previous kernel's results; let the next
// kernel's blocks start (they wait for ours before reading what we write). No-ops when the kernel
// was launched without the attribute.
__device__ __forceinline__ void pdl_wait() {
#ifdef HYSPEC_STEP_TRACE
  const bool mark = threadIdx.x == 0 && (blockIdx.x | blockIdx.y | blockIdx.z) == 0 && g_step_trace;
  const unsigned long long enter = mark ? globaltimer() : 0;
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
#ifdef HYSPEC_STEP_TRACE
  if (mark) {
    const unsigned i = atomicAdd(&g_step_trace->seq, 1u) % kStepTraceCap;
    g_step_trace->rec[i] = StepTraceRec{enter, globaltimer(), {gridDim.x, gridDim.y, gridDim.z}, blockDim.x};
  }
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

}  // namespace hyspec::cuda
