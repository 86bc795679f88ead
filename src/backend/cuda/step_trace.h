// The step trace (cmake -DHYSPEC_STEP_TRACE=ON, run with HYSPEC_STEP_TRACE=1; compiled out otherwise): block 0 of
// every kernel stores %globaltimer as it enters and as it leaves pdl_wait, and the host keeps the kernels the
// last captured graph launched. At the backend's teardown the last step's kernels are printed in order with the
// time from one kernel's wait returning to the next one's: the time each kernel holds the PDL chain (its work
// after its inputs are ready, its tail and the hop to the next), which per-kernel profilers do not see.
#pragma once
#ifdef HYSPEC_STEP_TRACE
#include <cuda_runtime.h>

#include <vector>

namespace hyspec::cuda {

constexpr unsigned kStepTraceCap = 1u << 14;
struct StepTraceRec {
  unsigned long long enter, exit;  // %globaltimer at pdl_wait's entry and return (block 0, thread 0)
  unsigned grid[3], block;
};
struct StepTraceBuf {
  unsigned seq, pad;
  StepTraceRec rec[kStepTraceCap];
};
struct StepLaunch {
  const void* kernel;
  dim3 grid, block;
};
struct StepTraceHost {
  std::vector<void (*)(void*)> binders;  // one per .cu file: points its copy of the device pointer at the buffer
  std::vector<StepLaunch> launches;     // launch_pdl's launches while `logging` (a capture)
  bool logging = false;
};
inline StepTraceHost& step_trace_host() {
  static StepTraceHost h;
  return h;
}
// The buffer, bound in every .cu file (nullptr: HYSPEC_STEP_TRACE is not set).
StepTraceBuf* step_trace_start();
// The last `steps` steps of the last captured graph's launches, to stdout.
void step_trace_report(StepTraceBuf* buf, int steps);
// The look-ahead draw kernels' per-block timelines of their last launches, to stdout (elementwise.cu).
void draw_trace_report();

}  // namespace hyspec::cuda
#endif
