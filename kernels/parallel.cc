#include "kernels/parallel.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace trainyard {
namespace {

// How long a pool thread spins for its next loop, or a caller for its
// helpers, before blocking. Waking a blocked thread took 8-29 us on the
// 2-vCPU VM (scratch program, 2000 calls of ParallelFor(2 tasks of 20 us)
// back to back or 200 us apart: 37 and 53 us a call blocking, 21 and 28
// spinning); a step's forward and input-gradient GEMMs took 0.98-0.99 of
// their time at 32 rows and 0.99-1.00 at 64 (docs/BENCHMARKS.md). 100 us
// of spinning after a loop is all an idle pool costs.
constexpr int64_t kSpinMicros = 100;

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// Runs fn(0..tasks-1) on the caller plus up to threads-1 persistent
// workers. Which thread runs a task never changes a result: tasks write
// disjoint outputs. A caller that finds the pool busy (another thread's
// GEMM) runs its tasks inline.
class Pool {
 public:
  void SetThreads(int n) {
    absl::MutexLock lock(&mu_);
    threads_ = n;
    while (static_cast<int>(workers_.size()) < n - 1) {
      const int index = static_cast<int>(workers_.size());
      workers_.emplace_back([this, index] { WorkerLoop(index); });
      workers_.back().detach();  // the pool lives as long as the process
    }
  }

  int threads() {
    absl::MutexLock lock(&mu_);
    return threads_;
  }

  void Run(int tasks, const std::function<void(int)>& fn) {
    int helpers = 0;
    {
      absl::MutexLock lock(&mu_);
      if (!busy_ && tasks > 1 && threads_ > 1) {
        helpers = std::min(threads_ - 1, tasks - 1);
        busy_ = true;
        job_ = &fn;
        tasks_ = tasks;
        next_.store(0);
        helpers_ = helpers;
        pending_.store(helpers);
        ++generation_;
        published_.store(generation_, std::memory_order_release);
        work_cv_.SignalAll();
      }
    }
    if (helpers == 0) {
      for (int t = 0; t < tasks; ++t) fn(t);
      return;
    }
    Work(fn, tasks);
    SpinWhile([this] { return pending_.load(std::memory_order_acquire) > 0; });
    absl::MutexLock lock(&mu_);
    while (pending_.load() > 0) done_cv_.Wait(&mu_);
    job_ = nullptr;
    busy_ = false;
  }

 private:
  void Work(const std::function<void(int)>& fn, int tasks) {
    for (int t = next_.fetch_add(1); t < tasks; t = next_.fetch_add(1)) fn(t);
  }

  void WorkerLoop(int index) {
    uint64_t seen = 0;
    for (;;) {
      SpinWhile(
          [&] { return published_.load(std::memory_order_acquire) == seen; });
      const std::function<void(int)>* job;
      int tasks;
      {
        absl::MutexLock lock(&mu_);
        while (generation_ == seen) work_cv_.Wait(&mu_);
        seen = generation_;
        if (index >= helpers_) continue;
        job = job_;
        tasks = tasks_;
      }
      Work(*job, tasks);
      absl::MutexLock lock(&mu_);
      if (pending_.fetch_sub(1) == 1) done_cv_.Signal();
    }
  }

  // Spins while wait() holds, for at most kSpinMicros, before the caller
  // blocks on a condition variable: a step's loops follow each other
  // within microseconds. Only a shortcut: the blocking wait that follows
  // decides.
  template <typename Wait>
  static void SpinWhile(Wait wait) {
    const auto limit = std::chrono::steady_clock::now() +
                       std::chrono::microseconds(kSpinMicros);
    while (wait()) {
      for (int i = 0; i < 16; ++i) CpuRelax();
      if (std::chrono::steady_clock::now() >= limit) return;
    }
  }

  absl::Mutex mu_;
  absl::CondVar work_cv_;
  absl::CondVar done_cv_;
  int threads_ ABSL_GUARDED_BY(mu_) = 1;
  std::vector<std::thread> workers_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  const std::function<void(int)>* job_ ABSL_GUARDED_BY(mu_) = nullptr;
  int tasks_ ABSL_GUARDED_BY(mu_) = 0;
  int helpers_ ABSL_GUARDED_BY(mu_) = 0;
  // Written under mu_; read without it by SpinWhile.
  std::atomic<int> pending_{0};
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  // generation_, for SpinWhile.
  std::atomic<uint64_t> published_{0};
  std::atomic<int> next_{0};
};

Pool& GetPool() {
  static Pool* const pool = [] {
    Pool* p = new Pool();
    const unsigned hw = std::thread::hardware_concurrency();
    p->SetThreads(hw == 0 ? 1 : static_cast<int>(hw));
    return p;
  }();
  return *pool;
}

}  // namespace

void ParallelFor(int tasks, const std::function<void(int)>& fn) {
  GetPool().Run(tasks, fn);
}

void ParallelRanges(int64_t n, int64_t grain,
                    const std::function<void(int64_t, int64_t)>& fn) {
  constexpr int64_t kMaxRanges = 8;
  if (n <= 0) return;
  const int64_t ranges = std::max<int64_t>(
      1, std::min(kMaxRanges, n / std::max<int64_t>(grain, 1)));
  const int64_t size = (n + ranges - 1) / ranges;
  const int tasks = static_cast<int>((n + size - 1) / size);
  if (tasks == 1) {
    fn(0, n);
    return;
  }
  ParallelFor(tasks, [&](int t) {
    const int64_t begin = t * size;
    fn(begin, std::min(n, begin + size));
  });
}

void ParallelRows(int64_t rows, int64_t cols,
                  const std::function<void(int64_t, int64_t)>& fn) {
  constexpr int64_t kElementsPerRange = int64_t{1} << 16;
  const int64_t grain =
      std::max<int64_t>(1, kElementsPerRange / std::max<int64_t>(cols, 1));
  ParallelRanges(rows, grain,
                 [&](int64_t begin, int64_t end) { fn(begin, end - begin); });
}

void ParallelColumns(int64_t cols,
                     const std::function<void(int64_t, int64_t)>& fn) {
  constexpr int64_t kColumnsPerRange = 128;
  ParallelRanges(cols, kColumnsPerRange, fn);
}

void SetComputeThreads(int n) { GetPool().SetThreads(std::max(n, 1)); }

int ComputeThreads() { return GetPool().threads(); }

}  // namespace trainyard
