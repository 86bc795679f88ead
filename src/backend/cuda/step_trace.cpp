// The host side of the step trace (step_trace.h).
#ifdef HYSPEC_STEP_TRACE
#include "backend/cuda/step_trace.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace hyspec::cuda {

StepTraceBuf* step_trace_start() {
  const char* on = std::getenv("HYSPEC_STEP_TRACE");
  if (!on || !*on || *on == '0') return nullptr;
  void* p = nullptr;
  if (cudaMalloc(&p, sizeof(StepTraceBuf)) != cudaSuccess) return nullptr;
  cudaMemset(p, 0, sizeof(StepTraceBuf));
  for (auto bind : step_trace_host().binders) bind(p);
  return static_cast<StepTraceBuf*>(p);
}

namespace {
std::string kernel_name(const void* f) {
  const char* mangled = nullptr;
  if (cudaFuncGetName(&mangled, f) != cudaSuccess || !mangled) return "?";
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  std::string s = status == 0 && d ? d.get() : mangled;
  // "void hyspec::cuda::(anonymous namespace)::name<args>(params)" -> "name<args>"
  if (const auto paren = s.rfind('('); paren != std::string::npos) s.resize(paren);
  if (s.rfind("void ", 0) == 0) s.erase(0, 5);
  for (const std::string drop : {"hyspec::cuda::", "(anonymous namespace)::"})
    for (size_t at; (at = s.find(drop)) != std::string::npos;) s.erase(at, drop.size());
  return s.size() > 90 ? s.substr(0, 90) : s;
}
}  // namespace

void step_trace_report(StepTraceBuf* buf, int steps) {
  if (!buf) return;
  cudaDeviceSynchronize();
  static StepTraceBuf h;
  cudaMemcpy(&h, buf, sizeof h, cudaMemcpyDeviceToHost);
  const auto& launches = step_trace_host().launches;
  const long n_dev = std::min<long>(h.seq, kStepTraceCap), per_step = static_cast<long>(launches.size());
  std::printf("STEP trace: %u waits recorded, %ld launches in the last capture\n", h.seq, per_step);
  if (per_step == 0 || n_dev < per_step) return;
  const long want = std::min<long>(n_dev, per_step * std::max(steps, 1));
  const auto rec = [&](long i) -> const StepTraceRec& {  // i-th of the last `want` records
    return h.rec[(h.seq - want + i) % kStepTraceCap];
  };
  // The host's launches and the device's waits, aligned from the end by their grids and blocks.
  std::vector<std::string> names(want, "?");
  long li = per_step - 1;
  int mismatches = 0;
  for (long i = want - 1; i >= 0; --i) {
    const StepTraceRec& r = rec(i);
    const auto same = [&](const StepLaunch& l) {
      return l.grid.x == r.grid[0] && l.grid.y == r.grid[1] && l.grid.z == r.grid[2] && l.block.x == r.block;
    };
    long tries = 0;
    while (tries < per_step && !same(launches[li])) li = (li + per_step - 1) % per_step, ++tries;
    if (tries == per_step) { ++mismatches; continue; }
    if (tries) ++mismatches;
    names[i] = kernel_name(launches[li].kernel);
    li = (li + per_step - 1) % per_step;
  }
  std::printf("STEP %d unaligned records\n", mismatches);
  std::printf("STEP | # | kernel | grid | block | waited us | holds us |\n");
  std::map<std::string, std::pair<int, double>> by_name;
  const unsigned long long t0 = rec(0).exit;
  for (long i = 0; i + 1 < want; ++i) {
    const StepTraceRec& r = rec(i);
    const double held = 1e-3 * static_cast<double>(rec(i + 1).exit - r.exit);
    const double waited = 1e-3 * static_cast<double>(r.exit - r.enter);
    std::printf("STEP | %ld | %s | %ux%ux%u | %u | %.2f | %.2f | @%.2f\n", i, names[i].c_str(), r.grid[0], r.grid[1],
                r.grid[2], r.block, waited, held, 1e-3 * static_cast<double>(r.exit - t0));
    auto& b = by_name[names[i] + " " + std::to_string(r.grid[0]) + "x" + std::to_string(r.grid[1])];
    ++b.first, b.second += held;
  }
  std::printf("STEP total %.2f us over %ld kernels\n", 1e-3 * static_cast<double>(rec(want - 1).exit - t0), want - 1);
  for (const auto& [name, v] : by_name)
    std::printf("STEPSUM | %s | %d | %.2f | %.2f |\n", name.c_str(), v.first, v.second, v.second / v.first);
}

}  // namespace hyspec::cuda
#endif
