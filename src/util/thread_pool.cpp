#include "util/thread_pool.h"

#include <algorithm>
#include <chrono>

namespace hyspec {

namespace {

// Parts per thread: more than one, so that when a thread is slow (preempted, or its parts cost
// more, as in causal attention) the others take over its share; few, because each claim is an
// atomic on a shared cache line (~100 ns).
constexpr int64_t kPartsPerThread = 4;
// How long an idle worker spins before it sleeps, and the caller before it blocks waiting for the
// last parts. Spinning buys latency only while a core is free: with the machine shared, all threads
// of a process share one scheduler group (autogroup), so a spinning thread takes its time from the
// thread doing the work. Measured on the 2-vCPU dev box under load ~4: workers spinning 200 µs made
// 2 threads 30% slower than 1 on pp512; sleeping at once made them equal or faster. 30 µs covers
// the gaps between parallel ops of a prompt pass (the small ops between them run on the caller);
// longer idle stretches (a decode step's serial ops) end in a futex sleep.
constexpr auto kWorkerSpin = std::chrono::microseconds(30);
constexpr auto kCallerSpin = std::chrono::microseconds(10);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
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
    stop_.store(true);
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::parallel_for(int64_t n, const RangeFn& fn, int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t units = (n + grain - 1) / grain;
  if (n_threads_ == 1 || units < 2) {
    fn(0, n, 0);
    return;
  }
  const int64_t want = std::min<int64_t>(units, n_threads_ * kPartsPerThread);
  const int64_t part_len = (units + want - 1) / want * grain;
  const auto parts = static_cast<uint32_t>((n + part_len - 1) / part_len);
  const uint32_t gen = ++generation_;
  Job& job = jobs_[gen & 1];
  job.fn.store(&fn, std::memory_order_relaxed);
  job.n.store(n, std::memory_order_relaxed);
  job.part_len.store(part_len, std::memory_order_relaxed);
  job.parts.store(parts, std::memory_order_relaxed);
  done_.store(0, std::memory_order_relaxed);
  // seq_cst store and load: either a worker about to sleep sees this job, or we see it sleeping.
  claim_.store(static_cast<uint64_t>(gen) << 32, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }
  run_parts(gen, 0);
  // Every part is claimed; wait for the ones other threads are still running.
  const auto spin_until = std::chrono::steady_clock::now() + kCallerSpin;
  for (int spins = 0; done_.load(std::memory_order_acquire) != parts; ++spins) {
    cpu_relax();
    if ((spins & 63) == 63 && std::chrono::steady_clock::now() > spin_until) break;
  }
  if (done_.load(std::memory_order_acquire) != parts) {
    // seq_cst flag, then re-read done_: either we see the last part finish, or its thread sees us.
    caller_waiting_.store(true, std::memory_order_seq_cst);
    for (uint32_t d; (d = done_.load(std::memory_order_seq_cst)) != parts;) done_.wait(d, std::memory_order_acquire);
    caller_waiting_.store(false, std::memory_order_relaxed);
  }
}

void ThreadPool::run_parts(uint32_t gen, int thread) {
  uint64_t c = claim_.load(std::memory_order_acquire);
  if (static_cast<uint32_t>(c >> 32) != gen) return;
  const Job& job = jobs_[gen & 1];
  const RangeFn* fn = job.fn.load(std::memory_order_relaxed);
  const int64_t n = job.n.load(std::memory_order_relaxed);
  const int64_t part_len = job.part_len.load(std::memory_order_relaxed);
  const uint32_t parts = job.parts.load(std::memory_order_relaxed);
  for (;;) {
    if (static_cast<uint32_t>(c >> 32) != gen) return;
    const auto part = static_cast<uint32_t>(c);
    if (part >= parts) return;
    // Success proves job `gen` was still live, so the fields read above were its own.
    if (!claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
    const int64_t b = part * part_len;
    (*fn)(b, std::min(n, b + part_len), thread);
    if (done_.fetch_add(1, std::memory_order_seq_cst) + 1 == parts && thread != 0 &&
        caller_waiting_.load(std::memory_order_seq_cst))
      done_.notify_all();
    c = claim_.load(std::memory_order_acquire);
  }
}

void ThreadPool::worker(int index) {
  uint32_t seen = 0;
  for (;;) {
    auto fresh = [&] { return static_cast<uint32_t>(claim_.load(std::memory_order_acquire) >> 32) != seen; };
    const auto spin_until = std::chrono::steady_clock::now() + kWorkerSpin;
    for (int spins = 0; !fresh(); ++spins) {
      cpu_relax();
      if ((spins & 255) == 255 && std::chrono::steady_clock::now() > spin_until) break;
    }
    if (!fresh()) {
      std::unique_lock<std::mutex> lock(mu_);
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      cv_.wait(lock, [&] { return stop_.load() || fresh(); });
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
    }
    if (stop_.load()) return;
    seen = static_cast<uint32_t>(claim_.load(std::memory_order_acquire) >> 32);
    run_parts(seen, index);
  }
}

}  // namespace hyspec
