// The per-block timelines of the trace builds (HYSPEC_ATTN_TRACE, HYSPEC_GDN_TRACE): thread 0 of each block
// stores %globaltimer at a kernel's marks into a __device__ BlockTimeline, the last launch's values kept, and
// the host prints each mark's spread over the blocks.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

namespace hyspec::cuda {

template <int kBlocks, int kMarks>
struct BlockTimeline {
  unsigned long long t[kBlocks * kMarks];  // [block][mark], 0 where never stored
};

// The GPU's nanosecond clock (the same on every SM).
__device__ __forceinline__ unsigned long long globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

template <int kBlocks, int kMarks>
__device__ __forceinline__ void timeline_mark(BlockTimeline<kBlocks, kMarks>& tl, unsigned block, int mark) {
  if (threadIdx.x != 0 || block >= kBlocks) return;
  tl.t[block * kMarks + mark] = globaltimer();
}

// Each mark's min / median / max in us from the first block's start (mark 0) of the latest launch (marks
// older than that start are an earlier launch's), to stdout; then the timeline is cleared.
template <int kBlocks, int kMarks>
void timeline_report(const BlockTimeline<kBlocks, kMarks>& symbol, const char* const (&names)[kMarks],
                     const char* label) {
  static BlockTimeline<kBlocks, kMarks> h;
  cudaDeviceSynchronize();
  cudaMemcpyFromSymbol(&h, symbol, sizeof(h));
  unsigned long long t0 = ~0ull;
  int n = 0;
  for (int b = 0; b < kBlocks; ++b)
    if (h.t[b * kMarks]) t0 = std::min(t0, h.t[b * kMarks]), ++n;
  std::printf("TRACE %s: %d blocks (us from the first start: min / median / max)\n", label, n);
  for (int m = 0; n > 0 && m < kMarks; ++m) {
    std::vector<double> v;
    for (int b = 0; b < kBlocks; ++b)
      if (h.t[b * kMarks + m] >= t0) v.push_back(1e-3 * static_cast<double>(h.t[b * kMarks + m] - t0));
    if (v.empty()) continue;
    std::sort(v.begin(), v.end());
    std::printf("TRACE   %-14s n=%4zu %8.2f %8.2f %8.2f\n", names[m], v.size(), v.front(), v[v.size() / 2], v.back());
  }
  // Each block's time between consecutive marks it stored (whether the late blocks started late or ran long).
  for (int m = 1; n > 0 && m < kMarks; ++m) {
    std::vector<double> d;
    for (int b = 0; b < kBlocks; ++b) {
      const unsigned long long a = h.t[b * kMarks + m - 1], z = h.t[b * kMarks + m];
      if (a >= t0 && z >= a) d.push_back(1e-3 * static_cast<double>(z - a));
    }
    if (d.empty()) continue;
    std::sort(d.begin(), d.end());
    std::printf("TRACE   %-14s <- previous mark, n=%4zu %8.2f %8.2f %8.2f\n", names[m], d.size(), d.front(),
                d[d.size() / 2], d.back());
  }
  std::memset(&h, 0, sizeof(h));
  cudaMemcpyToSymbol(symbol, &h, sizeof(h));
}

}  // namespace hyspec::cuda
