// Host-side helpers shared by the kernel launchers: the current device's SM count, scratch alignment
// and integer environment knobs (benchmark switches, read once by their callers).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <utility>

#include "backend/cuda/step_trace.h"

namespace hyspec::cuda {

inline int sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
    return v > 0 ? v : 1;
  }();
  return n;
}

inline size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

// Tokens rounded up to whole 8-token n-tiles of the tensor-core matvecs.
__host__ __device__ constexpr int64_t padded_tokens(int64_t n) { return (n + 7) / 8 * 8; }

inline int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

// Programmatic dependent launch for the decode/verify kernels (HYSPEC_PDL=0 turns it off, to measure).
inline bool use_pdl() {
  static const bool on = env_int("HYSPEC_PDL", 1) != 0;
  return on;
}

// Set while an op whose launches HYSPEC_PROFILE_SKIP drops is enqueued (cuda_backend.cpp): timing only.
inline bool& skip_launches() {
  static bool s = false;
  return s;
}

// Launch allowing programmatic dependent launch unless HYSPEC_PDL=0 (the kernel waits with pdl_wait
// before it reads what earlier kernels wrote, and may start its own prologue while they finish).
template <typename... KernelArgs, typename... Args>
cudaError_t launch_pdl(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                       Args&&... args) {
  if (skip_launches()) return cudaSuccess;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = use_pdl() ? 1 : 0;
#ifdef HYSPEC_STEP_TRACE
  if (step_trace_host().logging)
    step_trace_host().launches.push_back({reinterpret_cast<const void*>(kernel), grid, block});
#endif
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace hyspec::cuda
