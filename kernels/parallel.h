// A process-wide pool of compute threads for data-parallel loops (GEMM
// tiles, optimizer chunks, reductions).
//
// ParallelFor(tasks, fn) runs fn(0) ... fn(tasks - 1) on the caller plus up
// to ComputeThreads() - 1 persistent workers and returns when all are done.
// Which thread runs a task never changes a result as long as tasks write
// disjoint outputs; callers split work by shape only, never by thread count,
// so results are bitwise the same for any thread count.
//
// Thread safety: everything may be called from any thread. A caller that
// finds the pool busy (another thread's loop, e.g. another pipeline stage)
// runs its tasks inline on its own thread.
#ifndef TRAINYARD_KERNELS_PARALLEL_H_
#define TRAINYARD_KERNELS_PARALLEL_H_

#include <cstdint>
#include <functional>

namespace trainyard {

void ParallelFor(int tasks, const std::function<void(int)>& fn);

// Runs fn(begin, end) over [0, n) cut into at most 8 equal ranges of at
// least `grain` each (one range when n < 2 * grain): the cut depends on n
// and grain only, never on the thread count, so a loop whose ranges write
// disjoint outputs gives the same bits on any number of threads.
void ParallelRanges(int64_t n, int64_t grain,
                    const std::function<void(int64_t, int64_t)>& fn);

// The two cuts the element-wise kernels use, on top of ParallelRanges:
// ParallelRows runs fn(first row, rows) over [0, rows) of a [rows, cols]
// matrix in ranges of at least ~64K elements (for row-wise kernels, whose
// rows do not depend on each other); ParallelColumns runs fn(begin, end)
// over [0, cols) in ranges of at least 128 columns (for per-column sums,
// each column summing its rows in order). Both give the same bits as one
// call on the whole matrix, for any thread count.
void ParallelRows(int64_t rows, int64_t cols,
                  const std::function<void(int64_t, int64_t)>& fn);
void ParallelColumns(int64_t cols,
                     const std::function<void(int64_t, int64_t)>& fn);

// Threads ParallelFor uses (default: the hardware concurrency); n < 1
// means 1.
void SetComputeThreads(int n);
int ComputeThreads();

}  // namespace trainyard

#endif  // TRAINYARD_KERNELS_PARALLEL_H_
