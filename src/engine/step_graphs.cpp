#include "engine/step_graphs.h"

namespace hyspec {

Status StepGraphs::run(const Key& key, const std::function<Status()>& step) {
  if (!enabled_) return step();
  std::unique_ptr<StepGraph>& graph = graphs_[key];
  if (!graph) {
    Status ran;
    auto g = be_.capture([&] { ran = step(); });
    if (!g || !ran.is_ok()) {  // a step that cannot be recorded still runs, unrecorded
      enabled_ = false;
      graphs_.clear();
      return step();
    }
    graph = std::move(g).value();
    ++recordings_;
  }
  return graph->replay();
}

}  // namespace hyspec
