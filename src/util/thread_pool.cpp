#include "util/thread_pool.h"

#include <algorithm>

namespace hyspec {

namespace {
void part_bounds(int64_t n, int64_t grain, int parts, int i, int64_t& b, int64_t& e) {
  const int64_t units = (n + grain - 1) / grain;
  const int64_t per = units / parts, extra = units % parts;
  const int64_t ub = i * per + std::min<int64_t>(i, extra);
  const int64_t ue = ub + per + (i < extra ? 1 : 0);
  b = std::min(n, ub * grain);
  e = std::min(n, ue * grain);
}
}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  n_threads_ = n_threads;
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::parallel_for(int64_t n, const RangeFn& fn, int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (n_threads_ == 1 || n <= grain) {
    fn(0, n, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    job_n_ = n;
    job_grain_ = grain;
    pending_.store(n_threads_ - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  if (sleepers_.load(std::memory_order_acquire) > 0) cv_.notify_all();
  int64_t b, e;
  part_bounds(n, grain, n_threads_, 0, b, e);
  if (b < e) fn(b, e, 0);
  // Spin briefly (ops are short), then yield.
  for (int spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins)
    if (spins > 2000) std::this_thread::yield();
}

void ThreadPool::worker(int index) {
  uint64_t seen = 0;
  for (;;) {
    const RangeFn* job;
    int64_t n, grain;
    // Spin a little first: ops arrive back to back during a forward pass, and a condition
    // variable wake-up costs more than most ops.
    for (int spins = 0; spins < 4000 && generation_.load(std::memory_order_acquire) == seen; ++spins) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
    {
      std::unique_lock<std::mutex> lock(mu_);
      sleepers_.fetch_add(1, std::memory_order_acq_rel);
      cv_.wait(lock, [&] { return stop_ || generation_.load(std::memory_order_acquire) != seen; });
      sleepers_.fetch_sub(1, std::memory_order_acq_rel);
      if (stop_) return;
      seen = generation_.load(std::memory_order_acquire);
      job = job_;
      n = job_n_;
      grain = job_grain_;
    }
    int64_t b, e;
    part_bounds(n, grain, n_threads_, index, b, e);
    if (b < e) (*job)(b, e, index);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace hyspec
