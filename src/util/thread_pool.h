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
  // The current job. Written by the caller before it publishes the job in claim_; a worker reads
  // them and then validates what it read by claiming a part (a job cannot change while one of its
  // parts is unclaimed). Atomics only so that a stale read is not a data race.
  std::atomic<const RangeFn*> job_fn_{nullptr};
  std::atomic<int64_t> job_n_{0}, job_part_len_{1};
  std::atomic<uint32_t> job_parts_{0};
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
