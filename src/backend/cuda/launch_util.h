// Host-side helpers shared by the kernel launchers: the current device's SM count and integer
// environment knobs (benchmark switches, read once by their callers).
#pragma once
#include <cuda_runtime.h>

#include <cstdlib>

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

inline int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

}  // namespace hyspec::cuda
