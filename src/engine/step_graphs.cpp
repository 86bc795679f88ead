#include "engine/step_graphs.h"

#include <algorithm>
#include <chrono>

namespace hyspec {

int64_t recorded_key_bound(int64_t end, int64_t capacity) {
  int64_t bound = 4096;
  while (bound < end && bound < capacity) bound *= 2;
  return std::min(bound, capacity);
}

Status StepGraphs::run(const Key& key, const std::function<Status()>& step) {
  if (!enabled_) return step();
  std::unique_ptr<StepGraph>& graph = graphs_[key];
  if (graph) return graph->replay();
  const auto t0 = std::chrono::steady_clock::now();
  Status ran;
  auto g = be_.capture([&] { ran = step(); });
  if (!g || !ran.is_ok()) {  // a step that cannot be recorded still runs, unrecorded
    enabled_ = false;
    graphs_.clear();
    return step();
  }
  graph = std::move(g).value();
  ++stats_.recorded;
  const Status replayed = graph->replay();
  stats_.record_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return replayed;
}

}  // namespace hyspec
