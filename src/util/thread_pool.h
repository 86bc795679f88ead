// A fixed pool of worker threads for data-parallel loops (the CPU backend's ops).
// parallel_for(n, fn) runs fn(begin, end, thread_index) over a static split of [0, n) on all
// threads including the caller, and returns when every part is done. Not reentrant.
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
  // Split [0, n) into size() contiguous parts (each a multiple of `grain` where possible).
  void parallel_for(int64_t n, const RangeFn& fn, int64_t grain = 1);

 private:
  void worker(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  const RangeFn* job_ = nullptr;
  int64_t job_n_ = 0, job_grain_ = 1;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<int> pending_{0};
  bool stop_ = false;
};

}  // namespace hyspec
