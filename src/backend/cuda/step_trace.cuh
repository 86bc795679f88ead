// The device side of the step trace (step_trace.h): each .cu file's pointer to the buffer and its binder.
#pragma once
#ifdef HYSPEC_STEP_TRACE
#include "backend/cuda/step_trace.h"
#include "backend/cuda/timeline.cuh"

namespace hyspec::cuda {
namespace {
__device__ StepTraceBuf* g_step_trace = nullptr;
void bind_step_trace(void* p) { cudaMemcpyToSymbol(g_step_trace, &p, sizeof p); }
[[maybe_unused]] const bool g_step_trace_bound = (step_trace_host().binders.push_back(&bind_step_trace), true);
}  // namespace
}  // namespace hyspec::cuda
#endif
