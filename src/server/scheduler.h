// The engine thread. The Engine is not thread-safe, so one thread owns it and all its sessions:
// `--parallel` slots, each a Session, stepped round-robin (a prompt chunk or one decoding round per
// turn, so a long prompt is prefilled in n_batch chunks between the other slots' tokens). HTTP
// threads only submit jobs to a bounded queue and read each job's TokenChannel.
#pragma once
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "server/channel.h"
#include "server/metrics.h"
#include "server/text_stream.h"
#include "text/tokenizer.h"

namespace hyspec::server {

struct Job {
  std::vector<int32_t> prompt;
  GenerateOptions options;         // options.stop_tokens end generation without being shown
  std::vector<std::string> stop;   // stop strings
  std::shared_ptr<TokenChannel> channel;
  std::chrono::steady_clock::time_point arrived = std::chrono::steady_clock::now();
};

class Scheduler {
 public:
  // The engine, tokenizer and metrics must outlive the scheduler.
  Scheduler(Engine& engine, const Tokenizer& tokenizer, Metrics& metrics);
  ~Scheduler();  // shutdown(0)

  // Creates `n_slots` sessions and starts the engine thread.
  Status start(int n_slots, int queue_capacity);

  enum class Admission { Accepted, QueueFull, ShuttingDown };
  Admission submit(Job job);

  // Stops admitting; queued jobs fail with 503; running jobs may finish within `grace`, then are
  // cancelled (503). Returns once the engine thread has exited. Idempotent.
  void shutdown(std::chrono::milliseconds grace);

 private:
  struct Slot {
    std::unique_ptr<Session> session;
    std::optional<Job> job;
    std::optional<TextStream> text;
    bool started = false;
    bool first_token = false;
    size_t logprobs_seen = 0;
    int64_t completion_tokens = 0;
    std::chrono::steady_clock::time_point last_output;
  };
  void run();
  void step_slot(Slot& slot);
  void finish_slot(Slot& slot, FinishReason reason, const std::string& error = "", int status = 500);
  void publish_load_locked();

  Engine& engine_;
  const Tokenizer& tokenizer_;
  Metrics& metrics_;
  std::vector<Slot> slots_;
  size_t queue_capacity_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  int64_t active_ = 0;
  bool running_ = false, stopping_ = false;
  std::chrono::steady_clock::time_point deadline_;
  std::mutex join_mu_;
  std::thread thread_;
};

}  // namespace hyspec::server
