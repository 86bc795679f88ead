// The stream of one request from the engine thread to the HTTP handler thread that waits on it.
// The engine thread pushes events (text released since the last one, then a final event); the
// handler pops them, and cancels when its client went away. Thread-safe; shared by both sides.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace hyspec::server {

struct StreamEvent {
  std::string text;                       // released since the previous event (never a partial character)
  std::vector<int32_t> tokens;            // the tokens that text came from (no end-of-generation token)
  std::vector<EmittedLogprobs> logprobs;  // one per entry of `tokens`, when the request asked for logprobs
  bool final = false;
  // Final event only:
  FinishReason finish = FinishReason::None;  // Stop (end token or stop string) or Length
  int64_t prompt_tokens = 0, completion_tokens = 0;
  SessionStats stats;
  std::string error;        // non-empty: the request failed, with this HTTP status
  int error_status = 500;
};

class TokenChannel {
 public:
  void push(StreamEvent event) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      events_.push_back(std::move(event));
    }
    cv_.notify_one();
  }
  // Moves the pending events to the end of `out`, waiting up to `timeout` for the first one.
  // Returns false when none arrived in time.
  bool pop(std::vector<StreamEvent>& out, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return false;
    for (auto& e : events_) out.push_back(std::move(e));
    events_.clear();
    return true;
  }
  // The consumer is gone: the engine thread ends the request at its next step.
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<StreamEvent> events_;
  std::atomic<bool> cancelled_{false};
};

}  // namespace hyspec::server
