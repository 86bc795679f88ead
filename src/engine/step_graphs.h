// Steps recorded once as backend graphs and replayed (CUDA graphs; per-step values live in backend
// memory the graph reads), keyed by what shapes their launches: widths, and the buffers a step reads
// when those vary. A step that cannot be recorded runs unrecorded, and so does every later one.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>

#include "backend/backend.h"

namespace hyspec {

class StepGraphs {
 public:
  using Key = std::array<int64_t, 5>;
  // enabled: record at all (the caller's --no-graphs); only backends that replay graphs (CUDA) do.
  StepGraphs(Backend& be, bool enabled) : be_(be), enabled_(enabled && be.kind() == BackendKind::Cuda) {}

  // Run `step` as the graph recorded for `key` (recording it first).
  Status run(const Key& key, const std::function<Status()>& step);
  void clear() { graphs_.clear(); }
  int64_t recordings() const { return recordings_; }  // graphs recorded so far (a round that did is not timed)

 private:
  Backend& be_;
  bool enabled_;
  int64_t recordings_ = 0;
  std::map<Key, std::unique_ptr<StepGraph>> graphs_;
};

}  // namespace hyspec
