// ThreadPool's contract (util/thread_pool.h): every index exactly once, parts of `grain`, the
// thread index names the running thread (never shared by two parts running at once), and the caller
// finishes even when the pool has more threads than the machine has cores.
#include "util/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace hyspec {
namespace {

TEST(ThreadPool, ThreadIndexNamesOneRunningThreadAtATime) {
  ThreadPool pool(4);
  std::vector<std::atomic<int>> busy(pool.size());
  std::atomic<int> overlaps{0}, out_of_range{0};
  for (int rep = 0; rep < 200; ++rep)
    pool.parallel_for(64, [&](int64_t, int64_t, int thread) {
      if (thread < 0 || thread >= pool.size()) {
        ++out_of_range;
        return;
      }
      if (busy[thread].fetch_add(1) != 0) ++overlaps;
      std::this_thread::yield();  // stay inside the part a little
      busy[thread].fetch_sub(1);
    });
  EXPECT_EQ(out_of_range.load(), 0);
  EXPECT_EQ(overlaps.load(), 0);
}

TEST(ThreadPool, PartsAreWholeGrainsExceptTheLast) {
  ThreadPool pool(3);
  for (int64_t n : {5, 17, 100, 1001}) {
    std::vector<std::atomic<int>> hits(n);
    std::atomic<int> bad{0};
    pool.parallel_for(
        n,
        [&](int64_t b, int64_t e, int) {
          if (b % 4 != 0 || (e % 4 != 0 && e != n)) ++bad;
          for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
        },
        4);
    EXPECT_EQ(bad.load(), 0) << n;
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << n << " " << i;
  }
}

TEST(ThreadPool, OneThreadRunsEverythingOnTheCaller) {
  ThreadPool pool(1);
  const auto caller = std::this_thread::get_id();
  int calls = 0;
  pool.parallel_for(1000, [&](int64_t b, int64_t e, int thread) {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    EXPECT_EQ(thread, 0);
    EXPECT_EQ(b, 0);
    EXPECT_EQ(e, 1000);
    ++calls;
  });
  EXPECT_EQ(calls, 1);
}

// More workers than cores, back-to-back tiny jobs, and jobs after the workers fell asleep: nothing
// is lost or run twice.
TEST(ThreadPool, OversubscribedPoolCompletesEveryJobExactlyOnce) {
  ThreadPool pool(static_cast<int>(std::thread::hardware_concurrency()) * 4);
  std::atomic<int64_t> sum{0};
  int64_t want = 0;
  for (int rep = 0; rep < 2000; ++rep) {
    const int64_t n = 1 + rep % 37;
    pool.parallel_for(n, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) sum.fetch_add(i + 1);
    });
    want += n * (n + 1) / 2;
    if (rep % 500 == 499) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // workers go to sleep
  }
  EXPECT_EQ(sum.load(), want);
}

}  // namespace
}  // namespace hyspec
