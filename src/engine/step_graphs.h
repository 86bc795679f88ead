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

// The key bound (AttentionArgs::max_keys) of a recorded step whose rows end before position `end`, in a
// cache of `capacity` positions: a power of two of at least 4096, at most the capacity. A session then
// records at most log2(capacity / 4096) + 1 graphs of each step shape, and a step's attention lays its
// splits over at most twice its keys, not the capacity. Rows get the same bits only in steps of the same
// bound: a session's verify steps stay within the bound of the plain step at their first position.
int64_t recorded_key_bound(int64_t end, int64_t capacity);

// What step graphs have cost so far.
struct GraphStats {
  int64_t recorded = 0;  // graphs recorded (a round that recorded one timed the recording, not the step)
  double record_s = 0;   // host time spent recording them (capture, instantiation, first replay enqueued)
  GraphStats& operator+=(const GraphStats& o) {
    recorded += o.recorded, record_s += o.record_s;
    return *this;
  }
};

class StepGraphs {
 public:
  using Key = std::array<int64_t, 7>;
  // enabled: record at all (the caller's --no-graphs); only backends that replay graphs (CUDA) do.
  StepGraphs(Backend& be, bool enabled) : be_(be), enabled_(enabled && be.kind() == BackendKind::Cuda) {}

  // Run `step` as the graph recorded for `key` (recording it first).
  Status run(const Key& key, const std::function<Status()>& step);
  void clear() { graphs_.clear(); }
  bool enabled() const { return enabled_; }  // steps are recorded and replayed
  const GraphStats& stats() const { return stats_; }

 private:
  Backend& be_;
  bool enabled_;
  GraphStats stats_;
  std::map<Key, std::unique_ptr<StepGraph>> graphs_;
};

}  // namespace hyspec
