// The packed GEMM's layout and the pieces its two source files share
// (packed_gemm.cc: SgemmPacked, SgemmPacking, SgemmWeightGradient;
// packed_gemm_transposed.cc: SgemmPackedTransposed). Internal to the
// packed_gemm library.
#ifndef TRAINYARD_KERNELS_PACKED_GEMM_INTERNAL_H_
#define TRAINYARD_KERNELS_PACKED_GEMM_INTERNAL_H_

#include <immintrin.h>

#include <array>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "kernels/packed_gemm.h"

namespace trainyard {
namespace packed_internal {

// The loop nest (BLIS's, for a small A): k in blocks of kKc; within a
// block, rows of A in blocks of at most kMc (256, packed_gemm.cc) packed
// into panels of at most PanelRows() rows ([k][row] interleaved, <= 256
// KiB: the core's L2); for each 16-column panel of B (16 KiB: L1) every row
// panel runs the micro-kernel (its rows x 16) over the block's k. Each
// element of C stays one fma chain in ascending k whatever the blocking: a
// block starts from C's value as the previous block left it.
constexpr int64_t kNr = 16;
constexpr int64_t kKc = 256;
// The AVX2 kernel's rows (12 ymm accumulators), which also sets shape-only
// cuts that must not depend on the kernel (SgemmPackedTransposed's column
// blocks).
constexpr int64_t kMr = 6;
// The AVX-512 kernel's rows (12 zmm accumulators): the most of any kernel.
constexpr int64_t kMaxMr = 12;

// Which micro-kernels run: the CPU's choice or TRAINYARD_PACKED_GEMM's
// (packed_gemm_kernels.cc), or a test's. All give the same bits.
using Kernel = PackedKernel;
Kernel ActiveKernel();

// Rows in a row panel of A for the active kernel.
inline int64_t PanelRows() {
  return ActiveKernel() == Kernel::kAvx512 ? kMaxMr : kMr;
}

// Panels of kNr columns for n columns.
inline int64_t Panels(int64_t n) { return (n + kNr - 1) / kNr; }

// How many row panels ForEachRowPanel cuts `rows` into.
inline int64_t RowPanels(int64_t rows) {
  const int64_t mr = PanelRows();
  return (rows + mr - 1) / mr;
}

// Cuts `rows` into RowPanels(rows) panels of near-equal size (5 and 6
// rows rather than 6s and a last 2, which would run at a third of the
// speed). fn(first row, rows).
template <typename F>
void ForEachRowPanel(int64_t rows, F fn) {
  const int64_t panels = RowPanels(rows);
  const int64_t base = rows / panels, extra = rows % panels;
  int64_t r = 0;
  for (int64_t q = 0; q < panels; ++q) {
    const int64_t n = base + (q < extra ? 1 : 0);
    fn(r, n);
    r += n;
  }
}

// What the micro-kernel prefetches while it runs, one cache line a k step:
// runs of `run` lines `step` floats apart, the runs `stride` apart (line q
// at base + (q / run) * stride + (q % run) * step). The next packed panel
// is one run of 16-float lines; the next panel still to be packed is 16
// lines of each of 16 rows of b (runs of 16) or one line of each of kb
// rows (one run, step ldb).
struct Prefetch {
  const float* base = nullptr;
  int64_t run = int64_t{1} << 40;
  int64_t step = kNr;
  int64_t stride = 0;
  // This kernel's share of the lines: [first, first + count), one a k
  // step from the kernel's first.
  int64_t first = 0;
  int64_t count = int64_t{1} << 40;
};

// Passed by reference: a Prefetch built on the stack and passed by value
// to every kernel call was copied with stores and loads of different
// widths, which the CPU cannot forward from its store buffer: 8% of a
// weight gradient's time on AMD Zen 4 (docs/BENCHMARKS.md, "A packed GEMM
// for small microbatches").
inline constexpr Prefetch kNoPrefetch{};

// rows x 16 of C (row stride ldc; rows <= PanelRows()) from `rows`
// interleaved rows of A (ap[k * rows + i]) and one panel of B (bp[k * 16 +
// j]) over kb k steps, starting from C (load) or zero, on the active kernel;
// fetching `prefetch`'s lines meanwhile (ignored by the portable kernel).
void Panel(int rows, int64_t kb, const float* ap, const float* bp, float* c,
           int64_t ldc, bool load, const Prefetch& prefetch);

// A micro-kernel family's instantiations for 1..N rows, indexed by a row
// panel's rows minus one: RowTable<N>([](auto r) { return &Kernel<r()>; }).
template <int N, typename Get, int... R>
constexpr auto RowTableOf(Get get, std::integer_sequence<int, R...>) {
  return std::array{get(std::integral_constant<int, R + 1>())...};
}
template <int N, typename Get>
constexpr auto RowTable(Get get) {
  return RowTableOf<N>(get, std::make_integer_sequence<int, N>());
}

// The AVX2 micro-kernels' R x 16 accumulator tile (lo: columns 0-7, hi:
// 8-15): loaded from C (rows ldc apart) or zero, and stored back.
template <int R>
__attribute__((target("avx2,fma"), always_inline)) inline void Avx2LoadTile(
    const float* c, int64_t ldc, bool load, __m256* lo, __m256* hi) {
#pragma GCC unroll 6
  for (int i = 0; i < R; ++i) {
    if (load) {
      lo[i] = _mm256_loadu_ps(c + i * ldc);
      hi[i] = _mm256_loadu_ps(c + i * ldc + 8);
    } else {
      lo[i] = _mm256_setzero_ps();
      hi[i] = _mm256_setzero_ps();
    }
  }
}

template <int R>
__attribute__((target("avx2,fma"), always_inline)) inline void Avx2StoreTile(
    const __m256* lo, const __m256* hi, float* c, int64_t ldc) {
#pragma GCC unroll 6
  for (int i = 0; i < R; ++i) {
    _mm256_storeu_ps(c + i * ldc, lo[i]);
    _mm256_storeu_ps(c + i * ldc + 8, hi[i]);
  }
}

// The AVX-512 micro-kernels' R x 16 tile, one zmm a row.
template <int R>
__attribute__((target("avx512f"), always_inline)) inline void Avx512LoadTile(
    const float* c, int64_t ldc, bool load, __m512* acc) {
#pragma GCC unroll 12
  for (int i = 0; i < R; ++i) {
    acc[i] = load ? _mm512_loadu_ps(c + i * ldc) : _mm512_setzero_ps();
  }
}

template <int R>
__attribute__((target("avx512f"), always_inline)) inline void Avx512StoreTile(
    const __m512* acc, float* c, int64_t ldc) {
#pragma GCC unroll 12
  for (int i = 0; i < R; ++i) _mm512_storeu_ps(c + i * ldc, acc[i]);
}

// Whether the vector helpers (PackTransposed's 8 x 8 transposes, streaming
// stores) may use AVX2: any kernel but the portable one.
inline bool UseAvx2Helpers() { return ActiveKernel() != Kernel::kPortable; }

// One panel of op(B) = b^T: dst[q * 16 + j] = src[j * ld + q] for q < kb,
// j < cols (16 rows of b read along k), zeros for j >= cols.
void PackTransposed(const float* src, int64_t ld, int64_t kb, int64_t cols,
                    float* dst);

}  // namespace packed_internal
}  // namespace trainyard

#endif  // TRAINYARD_KERNELS_PACKED_GEMM_INTERNAL_H_
