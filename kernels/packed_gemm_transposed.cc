// SgemmPackedTransposed (packed_gemm.h): an input gradient read from the
// forward's pack.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/packed_gemm.h"
#include "kernels/packed_gemm_internal.h"
#include "kernels/parallel.h"

namespace trainyard {
namespace packed_internal {
namespace {

// SgemmPackedTransposed computes C^T [b.k(), m] = op(B) [b.k(), b.n()] *
// A^T: tiles of R rows of op(B) (R of the pack's k, read along a panel's
// row, 16 floats apart) by 16 rows of A (A^T packed [q][16]), over the
// pack's n.

// Panels of the pack in a group: 256 of the product's k.
constexpr int64_t kGroup = kKc / kNr;

// The next tile's rows of op(B), fetched a panel at a time while this tile
// runs: `rows` lines (of 16 floats) from w, in each of `panels` panels.
struct TPrefetch {
  const float* w = nullptr;
  int64_t rows = 0;
  int64_t panels = 0;
};

// Passed by reference, as packed_gemm.cc's Prefetch.
constexpr TPrefetch kNoTPrefetch{};

// Panel p's lines of `next` (its rows of that panel), with the cache hint
// `Hint` (_MM_HINT_T0 or _MM_HINT_T1: a constant, as _mm_prefetch needs).
template <int Hint>
__attribute__((always_inline)) inline void PrefetchPanel(const TPrefetch& next,
                                                         int64_t p,
                                                         int64_t stride) {
  if (p >= next.panels) return;
  const char* line = reinterpret_cast<const char*>(next.w + p * stride);
  for (int64_t i = 0; i < next.rows; ++i) {
    _mm_prefetch(line + i * kNr * sizeof(float), static_cast<_mm_hint>(Hint));
  }
}

// One k step: op(B)'s value at row i of the tile (wp[i * 16]) times 16
// values of A^T.
template <int R>
__attribute__((target("avx2,fma"), always_inline)) inline void Avx2TStep(
    const float* wp, const float* at, __m256* lo, __m256* hi) {
  const __m256 b0 = _mm256_loadu_ps(at);
  const __m256 b1 = _mm256_loadu_ps(at + 8);
#pragma GCC unroll 6
  for (int i = 0; i < R; ++i) {
    const __m256 w = _mm256_broadcast_ss(wp + i * kNr);
    lo[i] = _mm256_fmadd_ps(w, b0, lo[i]);
    hi[i] = _mm256_fmadd_ps(w, b1, hi[i]);
  }
}

// An R x 16 tile of C^T (rows ldct apart) over `panels` panels of the pack,
// `stride` floats apart, from row w of the first (op(B)[i][p * 16 + j] =
// w[p * stride + i * 16 + j]); the last panel has `last` columns. at: A^T
// for those columns, 16 floats a column.
template <int R>
__attribute__((target("avx2,fma"))) void Avx2TKernel(
    int64_t panels, int64_t last, const float* w, int64_t stride,
    const float* at, float* ct, int64_t ldct, bool load,
    const TPrefetch& next) {
  __m256 lo[R], hi[R];
  Avx2LoadTile<R>(ct, ldct, load, lo, hi);
  for (int64_t p = 0; p < panels; ++p) {
    const float* wp = w + p * stride;
    const float* ap = at + p * kNr * kNr;
    PrefetchPanel<_MM_HINT_T0>(next, p, stride);
    if (p + 1 < panels || last == kNr) {
#pragma GCC unroll 16
      for (int j = 0; j < kNr; ++j) Avx2TStep<R>(wp + j, ap + j * kNr, lo, hi);
    } else {
      for (int64_t j = 0; j < last; ++j) {
        Avx2TStep<R>(wp + j, ap + j * kNr, lo, hi);
      }
    }
  }
  Avx2StoreTile<R>(lo, hi, ct, ldct);
}

void Avx2TPanel(int rows, int64_t panels, int64_t last, const float* w,
                int64_t stride, const float* at, float* ct, int64_t ldct,
                bool load, const TPrefetch& next) {
  static constexpr auto kKernels =
      RowTable<kMr>([](auto r) { return &Avx2TKernel<r()>; });
  kKernels[rows - 1](panels, last, w, stride, at, ct, ldct, load, next);
}

// Avx2TStep with one zmm of A^T: op(B)'s R values broadcast from memory.
template <int R>
__attribute__((target("avx512f"), always_inline)) inline void Avx512TStep(
    const float* wp, const float* at, __m512* acc) {
  const __m512 b = _mm512_loadu_ps(at);
#pragma GCC unroll 12
  for (int i = 0; i < R; ++i) {
    acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(wp[i * kNr]), b, acc[i]);
  }
}

// Avx2TKernel with one zmm a row of C^T, for up to 12 rows. Its prefetch of
// the next row panel goes to L2, not L1: with 12-row panels that is 12
// lines of each of 16 panels (12 KiB) coming in while A^T's panels (16 KiB
// each) are read from a 32 KiB L1. Measured on AMD Zen 4 (a scratch
// program: a step's 8 input-gradient GEMMs from the forward's packs, the
// two hints alternating in one process, 4 runs of 9-11 rounds): the L2
// hint's time was 0.91-0.965 of the L1 hint's at 32 rows and 0.96-1.06 at
// 64. (With the AVX2 kernel's 6-row panels the two hints were even.)
template <int R>
__attribute__((target("avx512f"))) void Avx512TKernel(
    int64_t panels, int64_t last, const float* w, int64_t stride,
    const float* at, float* ct, int64_t ldct, bool load,
    const TPrefetch& next) {
  __m512 acc[R];
  Avx512LoadTile<R>(ct, ldct, load, acc);
  for (int64_t p = 0; p < panels; ++p) {
    const float* wp = w + p * stride;
    const float* ap = at + p * kNr * kNr;
    PrefetchPanel<_MM_HINT_T1>(next, p, stride);
    if (p + 1 < panels || last == kNr) {
#pragma GCC unroll 16
      for (int j = 0; j < kNr; ++j) Avx512TStep<R>(wp + j, ap + j * kNr, acc);
    } else {
      for (int64_t j = 0; j < last; ++j) {
        Avx512TStep<R>(wp + j, ap + j * kNr, acc);
      }
    }
  }
  Avx512StoreTile<R>(acc, ct, ldct);
}

void Avx512TPanel(int rows, int64_t panels, int64_t last, const float* w,
                  int64_t stride, const float* at, float* ct, int64_t ldct,
                  bool load, const TPrefetch& next) {
  static constexpr auto kKernels =
      RowTable<kMaxMr>([](auto r) { return &Avx512TKernel<r()>; });
  kKernels[rows - 1](panels, last, w, stride, at, ct, ldct, load, next);
}

void TPanel(int rows, int64_t panels, int64_t last, const float* w,
            int64_t stride, const float* at, float* ct, int64_t ldct, bool load,
            const TPrefetch& next) {
  if (ActiveKernel() == Kernel::kAvx512) {
    Avx512TPanel(rows, panels, last, w, stride, at, ct, ldct, load, next);
    return;
  }
  if (ActiveKernel() == Kernel::kAvx2) {
    Avx2TPanel(rows, panels, last, w, stride, at, ct, ldct, load, next);
    return;
  }
  for (int i = 0; i < rows; ++i) {
    for (int64_t q = 0; q < kNr; ++q) {
      float acc = load ? ct[i * ldct + q] : 0.0f;
      for (int64_t p = 0; p < panels; ++p) {
        const int64_t cols = p + 1 < panels ? kNr : last;
        for (int64_t j = 0; j < cols; ++j) {
          acc = std::fma(w[p * stride + i * kNr + j],
                         at[(p * kNr + j) * kNr + q], acc);
        }
      }
      ct[i * ldct + q] = acc;
    }
  }
}

// C's columns [col, col + cols) (rows [col, col + cols) of op(B), all in
// one k block of the pack at `block`): C^T built in `ct` over groups of 16
// panels (256 of the product's k; A^T's group is 16 KiB a panel of A's
// rows), then written back to C.
void RunTransposedTile(int64_t m, int64_t kk, const float* at,
                       const float* block, int64_t kb, int64_t row,
                       int64_t rows, bool accumulate, float* c, int64_t ldc,
                       int64_t col) {
  const int64_t a_panels = Panels(m);
  const int64_t panels = Panels(kk), stride = kb * kNr;
  const int64_t ldct = a_panels * kNr;
  thread_local std::vector<float> ct_buffer;
  ct_buffer.resize(rows * ldct);
  float* ct = ct_buffer.data();
  if (accumulate) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < m; ++i) ct[r * ldct + i] = c[i * ldc + col + r];
    }
  }
  // Each row panel's kernel prefetches the next one's lines (the next
  // group's first, after the last). Measured (a scratch program,
  // SgemmPackedTransposed on the forward packs of 8 weights [4096, 1024] or
  // [1024, 4096], 2 threads, with and without, alternating in one process,
  // 15 rounds, 2 runs): the time with it was 0.79-0.93 of the time without
  // at 32 rows and 0.88-0.97 at 64. Row panels shrink by at most one row
  // along the tile, so the next one has at most n rows.
  const int64_t first_rows = (rows + RowPanels(rows) - 1) / RowPanels(rows);
  for (int64_t g = 0; g < panels; g += kGroup) {
    const int64_t gp = std::min(kGroup, panels - g);
    const int64_t last = g + gp == panels ? kk - (panels - 1) * kNr : kNr;
    const bool load = accumulate || g > 0;
    const int64_t next_gp = std::min(kGroup, panels - g - kGroup);
    ForEachRowPanel(rows, [&](int64_t r0, int64_t n) {
      const float* w = block + g * stride + (row + r0) * kNr;
      TPrefetch next;
      if (r0 + n < rows) {
        next = {w + n * kNr, std::min(n, rows - r0 - n), gp};
      } else if (next_gp > 0) {
        next = {block + (g + kGroup) * stride + row * kNr, first_rows, next_gp};
      }
      for (int64_t q = 0; q < a_panels; ++q) {
        TPanel(static_cast<int>(n), gp, last, w, stride,
               at + (q * panels + g) * kNr * kNr, ct + r0 * ldct + q * kNr,
               ldct, load, q == 0 ? next : kNoTPrefetch);
      }
    });
  }
  for (int64_t i = 0; i < m; ++i) {
    float* dst = c + i * ldc + col;
    for (int64_t r = 0; r < rows; ++r) dst[r] = ct[r * ldct + i];
  }
}

}  // namespace

// SgemmPackedTransposed's body, here for the layout's names.
absl::Status TransposedGemm(int64_t m, const float* a, int64_t lda,
                            const PackedMatrix& b, bool accumulate, float* c,
                            int64_t ldc, const GemmEpilogue& epilogue) {
  const int64_t n = b.k(), kk = b.n();
  if (m < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("SgemmPackedTransposed: negative m=", m));
  }
  if (lda < std::max<int64_t>(1, kk) || ldc < std::max<int64_t>(1, n)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SgemmPackedTransposed: leading dimension too small: lda=", lda,
        " (needs >= ", kk, "), ldc=", ldc, " (needs >= ", n, ")"));
  }
  if (m == 0 || n == 0) return absl::OkStatus();
  // A^T, a panel of 16 rows of A at a time: [panels * 16][16], rows of A
  // past m zero.
  const int64_t a_panels = Panels(m);
  const int64_t panels = Panels(kk);
  thread_local std::vector<float> at_buffer;
  at_buffer.resize(a_panels * panels * kNr * kNr);
  float* at = at_buffer.data();
  const int64_t groups = (panels + kGroup - 1) / kGroup;
  ParallelFor(static_cast<int>(a_panels * groups), [&](int t) {
    const int64_t q = t / groups, c0 = t % groups * kKc;
    const int64_t len = std::min(kKc, kk - c0);
    PackTransposed(a + q * kNr * lda + c0, lda, len, std::min(kNr, m - q * kNr),
                   at + (q * panels * kNr + c0) * kNr);
  });
  // Column blocks of C (rows of op(B)) within the pack's k blocks, cut by
  // the shape only: about as many as SgemmPacked's.
  const int64_t kblocks = (n + kKc - 1) / kKc;
  const int64_t work = m * n * std::max<int64_t>(kk, 1);
  const int64_t want =
      std::max<int64_t>(1, std::min<int64_t>(8, work / (int64_t{1} << 22)));
  const int64_t per = std::min<int64_t>((want + kblocks - 1) / kblocks,
                                        (std::min(kKc, n) + kMr - 1) / kMr);
  ParallelFor(static_cast<int>(kblocks * per), [&](int t) {
    const int64_t blk = t / per, piece = t % per;
    const int64_t k0 = blk * kKc, kb = std::min(kKc, n - k0);
    const int64_t r0 = kb * piece / per, r1 = kb * (piece + 1) / per;
    if (r1 == r0) return;
    if (kk == 0) {
      for (int64_t i = 0; i < m && !accumulate; ++i) {
        std::fill(c + i * ldc + k0 + r0, c + i * ldc + k0 + r1, 0.0f);
      }
    } else {
      RunTransposedTile(m, kk, at, b.data() + k0 * panels * kNr, kb, r0,
                        r1 - r0, accumulate, c, ldc, k0 + r0);
    }
    if (epilogue) epilogue(0, m, k0 + r0, r1 - r0);
  });
  return absl::OkStatus();
}

}  // namespace packed_internal

absl::Status SgemmPackedTransposed(int64_t m, const float* a, int64_t lda,
                                   const PackedMatrix& b, bool accumulate,
                                   float* c, int64_t ldc,
                                   const GemmEpilogue& epilogue) {
  return packed_internal::TransposedGemm(m, a, lda, b, accumulate, c, ldc,
                                         epilogue);
}

}  // namespace trainyard
