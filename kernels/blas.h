// Row-major single-precision GEMM over the system's OpenBLAS, with results
// that do not depend on the thread count.
//
// OpenBLAS is not linked: it is dlopen()ed on first use, after setting
// OPENBLAS_CORETYPE from CPUID when the environment has not set it. OpenBLAS
// 0.3.21 does not recognise newer CPUs (e.g. AMD Zen 5 with AVX-512) and
// otherwise falls back to its slowest kernels; it reads OPENBLAS_CORETYPE
// only when the library loads. Nothing in the process may link libopenblas
// directly, or it loads before we can set the variable.
//
// Determinism: OpenBLAS's own threading gives different bits for 1 and 2
// threads on many shapes (measured on 0.3.21, Haswell and SkylakeX kernels).
// So OpenBLAS always runs single-threaded, and Sgemm splits C into a tiling
// that depends only on (m, n, k); each tile is one OpenBLAS call over the
// full k, run on a small process-wide thread pool. Same inputs, same bits,
// for any thread count (blas_test.cc checks it). Results may still differ
// between OpenBLAS core types (OPENBLAS_CORETYPE).
//
// Thread safety: all functions may be called from any thread. The thread
// count is process-wide; concurrent Sgemm calls share the pool (a call that
// finds it busy runs its tiles on its own thread).
#ifndef TRAINYARD_KERNELS_BLAS_H_
#define TRAINYARD_KERNELS_BLAS_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"

namespace trainyard {

// C [m, n] = alpha * op(A) [m, k] * op(B) [k, n] + beta * C, all row-major,
// op(X) = X^T when trans_x. A is [m, k] (lda >= k), or [k, m] (lda >= m)
// when trans_a; likewise B is [k, n] (ldb >= n) or [n, k] (ldb >= k).
// With beta == 0, C is overwritten (NaNs in C do not propagate).
// Errors: FailedPrecondition if libopenblas cannot be loaded (the message
// names the library and dlerror()), InvalidArgument for negative sizes,
// leading dimensions too small, or sizes beyond OpenBLAS's 32-bit ints.
absl::Status Sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                   float alpha, const float* a, int64_t lda, const float* b,
                   int64_t ldb, float beta, float* c, int64_t ldc);

// Runs on a block of C right after Sgemm computed it, on the thread that
// computed it (while the block is still in that core's cache): rows
// [row, row + rows) and columns [col, col + cols) of C. The blocks
// partition C and depend only on (m, n, k), so an element-wise epilogue
// gives the same bits as a separate pass after the GEMM.
using GemmEpilogue =
    std::function<void(int64_t row, int64_t rows, int64_t col, int64_t cols)>;

// Sgemm, then `epilogue` on each block of C (see GemmEpilogue): e.g. a
// bias and activation fused into the GEMM's output pass, and threaded with
// it.
absl::Status Sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                   float alpha, const float* a, int64_t lda, const float* b,
                   int64_t ldb, float beta, float* c, int64_t ldc,
                   const GemmEpilogue& epilogue);

// A block of C [m, n]: rows [row, row + rows), columns [col, col + cols).
struct GemmTile {
  int64_t row, rows, col, cols;
};
using GemmTileList = absl::InlinedVector<GemmTile, 8>;

// The tiles Sgemm cuts C into, in order: C's larger side (its columns when
// n >= m) cut into at most 8 near-equal pieces, a multiple of 16 each but
// the last; fewer for small shapes (a piece of at least 64 and 4M
// multiply-adds before the rounding to 16). They depend on (m, n, k) only,
// never on the thread count; empty when m or n is 0. Other GEMM libraries
// can run on the same tiling (tools/gemm_libs).
GemmTileList GemmTiles(int64_t m, int64_t n, int64_t k);

// Sets the number of threads Sgemm uses (process-wide; default: the
// hardware concurrency). n < 1 means 1. Never changes results.
void SetBlasThreads(int n);

// The number of threads Sgemm uses.
int BlasThreads();

// Loads OpenBLAS if needed; OK when it is usable.
absl::Status BlasStatus();

// E.g. "OpenBLAS SkylakeX, 2 threads" (loads the library), or
// "OpenBLAS unavailable: <reason>".
std::string BlasDescription();

}  // namespace trainyard

#endif  // TRAINYARD_KERNELS_BLAS_H_
