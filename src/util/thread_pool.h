// A fixed pool of worker threads for data-parallel loops (the CPU backend's ops).
// parallel_for(n, fn, grain) splits [0, n) into contiguous parts (a few per thread, each a multiple
// of `grain` indices where possible) and runs fn(begin, end, thread) once per part, on the workers
// and the caller; it returns when every part is done. Parts are claimed, not assigned: a worker
// that is asleep or descheduled (the machine may be oversubscribed) never holds the caller up, who
// runs every part no worker has taken. `thread` (0 = the caller, < size()) names the thread that
// runs the part, so per-thread scratch indexed by it is never shared. Not reentrant; one caller.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace hyspec {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);  // n_threads <= 0: hardware concurrency
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  using RangeFn = std::function<void(int64_t begin, int64_t end, int thread)>;
  void parallel_for(int64_t n, const RangeFn& fn, int64_t grain = 1);

 private:
  void worker(int index);
  // Claim and run parts of job `generation` until none is left (or a newer job replaced it).
  void run_parts(uint32_t generation, int thread);

  int n_threads_;
  std::vector<std::thread> workers_;
  // Job descriptors, double-buffered by generation parity: the caller writes generation g's into
  // jobs_[g & 1] before publishing g in claim_. A worker still holding an old claim word may read a
  // slot only while its generation is live: the slot of g is rewritten for g + 2, which is only
  // prepared after g + 1 was published, so the worker's claim of a part of g then fails and it
  // never runs a part with another job's fields (a single slot allowed exactly that: a part of the
  // next job run early under the old claim, then again).
  struct Job {
    std::atomic<const RangeFn*> fn{nullptr};
    std::atomic<int64_t> n{0}, part_len{1};
    std::atomic<uint32_t> parts{0};
  };
  Job jobs_[2];
  std::atomic<uint64_t> claim_{0};  // generation << 32 | next unclaimed part
  std::atomic<uint32_t> done_{0};   // parts of the current job finished
  std::atomic<bool> caller_waiting_{false};  // the caller blocks on done_ (after a short spin)
  uint32_t generation_ = 0;         // the caller's copy of the newest generation
  // Sleeping workers (after a spell of spinning with nothing to do) wait on cv_.
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace hyspec
