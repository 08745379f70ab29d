// The compute pool: every task of every loop runs exactly once, whether the
// pool's threads are spinning for the next loop or asleep, on any thread
// count, and when two callers share the pool.
#include "kernels/parallel.h"

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

// Runs `loops` loops of 1..9 tasks, `gap` apart, and checks each task's
// count after each loop.
void ExpectEveryTaskOnce(int loops, absl::Duration gap) {
  for (int loop = 0; loop < loops; ++loop) {
    const int tasks = 1 + loop % 9;
    std::vector<std::atomic<int>> runs(tasks);
    ParallelFor(tasks, [&](int t) { runs[t].fetch_add(1); });
    for (int t = 0; t < tasks; ++t) {
      ASSERT_EQ(runs[t].load(), 1) << "loop " << loop << " task " << t;
    }
    if (gap > absl::ZeroDuration()) absl::SleepFor(gap);
  }
}

TEST(ParallelForTest, EveryTaskOnceBackToBackAndAfterTheThreadsSleep) {
  for (int threads : {1, 2, 3}) {
    SetComputeThreads(threads);
    ASSERT_EQ(ComputeThreads(), threads);
    // Back to back: the threads are still spinning for the next loop.
    ExpectEveryTaskOnce(2000, absl::ZeroDuration());
    // Longer apart than they spin: they have gone to sleep.
    ExpectEveryTaskOnce(20, absl::Milliseconds(2));
  }
  SetComputeThreads(2);
}

TEST(ParallelForTest, TwoCallersShareThePool) {
  SetComputeThreads(2);
  std::atomic<int64_t> sum[2] = {0, 0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 2; ++c) {
    callers.emplace_back([&, c] {
      for (int loop = 0; loop < 500; ++loop) {
        ParallelFor(8, [&](int t) { sum[c].fetch_add(t + 1); });
      }
    });
  }
  for (std::thread& t : callers) t.join();
  // 1 + ... + 8 = 36 a loop.
  EXPECT_EQ(sum[0].load(), 500 * 36);
  EXPECT_EQ(sum[1].load(), 500 * 36);
}

TEST(ParallelRangesTest, RangesCoverEachIndexOnceWhateverTheThreads) {
  for (int threads : {1, 3}) {
    SetComputeThreads(threads);
    for (int64_t n : {1, 7, 100, 1000, 4097}) {
      std::vector<std::atomic<int>> hits(n);
      ParallelRanges(n, 64, [&](int64_t begin, int64_t end) {
        ASSERT_LE(0, begin);
        ASSERT_LT(begin, end);
        ASSERT_LE(end, n);
        for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(hits[i].load(), 1) << "n " << n << " index " << i;
      }
    }
  }
  SetComputeThreads(2);
}

}  // namespace
}  // namespace trainyard
