#include "kernels/packed_gemm.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/allocator.h"
#include "core/status_macros.h"
#include "kernels/packed_gemm_internal.h"
#include "kernels/parallel.h"

namespace trainyard {

namespace packed_internal {

namespace {

// dst[q * 16 + j] = src[j * ld + q] for j < 8 (one 8 x 8 block).
__attribute__((target("avx2"))) void Transpose8x8(const float* src, int64_t ld,
                                                  float* dst) {
  __m256 r[8], t[8], u[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * ld);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(dst + i * kNr,
                     _mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
    _mm256_storeu_ps(dst + (i + 4) * kNr,
                     _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
  }
}

}  // namespace

void PackTransposed(const float* src, int64_t ld, int64_t kb, int64_t cols,
                    float* dst) {
  int64_t q0 = 0;
  if (cols == kNr && UseAvx2Helpers()) {
    for (; q0 + 8 <= kb; q0 += 8) {
      Transpose8x8(src + q0, ld, dst + q0 * kNr);
      Transpose8x8(src + 8 * ld + q0, ld, dst + q0 * kNr + 8);
    }
  }
  for (int64_t q = q0; q < kb; ++q) {
    for (int64_t j = 0; j < kNr; ++j) {
      dst[q * kNr + j] = j < cols ? src[j * ld + q] : 0.0f;
    }
  }
}

}  // namespace packed_internal

namespace {

using packed_internal::ForEachRowPanel;
using packed_internal::kKc;
using packed_internal::kMaxMr;
using packed_internal::kNoPrefetch;
using packed_internal::kNr;
using packed_internal::PackTransposed;
using packed_internal::Panel;
using packed_internal::PanelRows;
using packed_internal::Panels;
using packed_internal::Prefetch;
using packed_internal::RowPanels;
using packed_internal::UseAvx2Helpers;

constexpr int64_t kMc = 256;  // rows of A in a row block

// Rows of A per row block: m cut into ceil(m / kMc) near-equal blocks (a
// batch of 256 is one block, 300 rows two of 150, not 256 and 44).
int64_t RowBlock(int64_t m) {
  const int64_t blocks = (m + kMc - 1) / kMc;
  return (m + blocks - 1) / blocks;
}

// Panel() on a rows x cols block of C, cols <= 16: the last panel of C,
// narrower than 16, goes through a full-width tile.
void PanelOfC(int64_t rows, int64_t cols, int64_t kb, const float* ap,
              const float* bp, float* c, int64_t ldc, bool load,
              const Prefetch& prefetch) {
  if (cols == kNr) {
    Panel(static_cast<int>(rows), kb, ap, bp, c, ldc, load, prefetch);
    return;
  }
  alignas(64) float tile[kMaxMr * kNr] = {};
  for (int64_t i = 0; i < rows; ++i) {
    if (load) std::memcpy(tile + i * kNr, c + i * ldc, cols * sizeof(float));
  }
  Panel(static_cast<int>(rows), kb, ap, bp, tile, kNr, load, prefetch);
  for (int64_t i = 0; i < rows; ++i) {
    std::memcpy(c + i * ldc, tile + i * kNr, cols * sizeof(float));
  }
}

// Where A [m, k] comes from: row-major a (lda >= k), or, when t_rows is
// set, A = t^T with t's row q at t_rows[q] (a weight gradient's dy^T).
struct ASource {
  const float* a = nullptr;
  int64_t lda = 0;
  const float* const* t_rows = nullptr;
};

// Rows [i0, i0 + rows) x k [k0, k0 + kb) of A into row panels, each
// [k][its rows].
void PackABlock(const ASource& a, int64_t i0, int64_t rows, int64_t k0,
                int64_t kb, float* ap) {
  ForEachRowPanel(rows, [&](int64_t r0, int64_t n) {
    float* dst = ap + r0 * kb;
    if (a.t_rows != nullptr) {
      for (int64_t k = 0; k < kb; ++k) {
        std::memcpy(dst + k * n, a.t_rows[k0 + k] + i0 + r0, n * sizeof(float));
      }
      return;
    }
    const float* src = a.a + (i0 + r0) * a.lda + k0;
    for (int64_t k = 0; k < kb; ++k) {
      for (int64_t i = 0; i < n; ++i) dst[k * n + i] = src[i * a.lda + k];
    }
  });
}

// All of A [m, k], once for every column block: the (k block at k0, row
// block at i0) piece at ap + k0 * m + i0 * kb.
void PackA(int64_t m, int64_t k, const ASource& a, float* ap) {
  const int64_t kblocks = (k + kKc - 1) / kKc;
  const int64_t rows = RowBlock(m);
  const int64_t mblocks = (m + rows - 1) / rows;
  ParallelFor(static_cast<int>(kblocks * mblocks), [&](int t) {
    const int64_t k0 = t / mblocks * kKc, i0 = t % mblocks * rows;
    const int64_t kb = std::min(kKc, k - k0), mb = std::min(rows, m - i0);
    PackABlock(a, i0, mb, k0, kb, ap + k0 * m + i0 * kb);
  });
}

// One panel from kb rows of op(B) as they are stored: row q's columns
// [col, col + cols) start at row(q); cols <= 16, zero-padded.
template <typename Row>
void CopyPanelRows(int64_t kb, int64_t cols, float* dst, Row row) {
  if (cols < kNr) std::memset(dst, 0, kb * kNr * sizeof(float));
  for (int64_t q = 0; q < kb; ++q) {
    std::memcpy(dst + q * kNr, row(q), cols * sizeof(float));
  }
}

// One panel of op(B) [k, n], rows [k0, k0 + kb) and columns [col, col +
// cols), cols <= 16, into dst [kb][16], zero-padded: from b [n, k] (trans)
// or [k, n].
void PackPanel(bool trans, const float* b, int64_t ldb, int64_t k0, int64_t kb,
               int64_t col, int64_t cols, float* dst) {
  if (trans) {
    PackTransposed(b + col * ldb + k0, ldb, kb, cols, dst);
    return;
  }
  CopyPanelRows(kb, cols, dst,
                [&](int64_t q) { return b + (k0 + q) * ldb + col; });
}

// OK when op(B) [k, n] can be read from b with leading dimension ldb
// ([n, k] when trans, else [k, n]); `what` names the caller.
absl::Status CheckB(const char* what, bool trans, int64_t k, int64_t n,
                    int64_t ldb) {
  if (k < 0 || n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": negative size k=", k, " n=", n));
  }
  const int64_t b_cols = trans ? k : n;
  if (ldb < std::max<int64_t>(1, b_cols)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ldb=", ldb, " needs >= ", b_cols));
  }
  return absl::OkStatus();
}

// Where the GEMM's op(B) comes from: a PackedMatrix, or a row-major matrix
// packed panel by panel as the GEMM reaches it.
struct BSource {
  const float* packed = nullptr;  // PackedMatrix::data(), or null
  bool trans = false;             // else: b [n, k] (trans) or [k, n]
  const float* b = nullptr;
  int64_t ldb = 0;
  float* keep = nullptr;  // where to leave the packed panels, or null
  // Packed only: each row panel of A sweeps a run of B panels that stays
  // in L2 (C walked along its rows), instead of each B panel sweeping the
  // rows (C walked down its columns). For a weight gradient, whose C is
  // big and k short.
  bool rows_outer = false;
};

// Each tile of C that RunRowsOuter accumulates into comes from memory (a
// weight gradient is far bigger than the caches) and is needed after only
// kb k steps: with one microbatch's 32 or 64 rows, fewer cycles than a
// miss takes. So the tile kCAhead panels on (in the sweep, into the next
// row panel) is prefetched: one microbatch's weight gradients
// (packed_gemm_benchmark --weight_gradients --per_microbatch, 2 threads,
// the binaries before and after alternating, 4 runs each) went from
// 1.16-1.41 to 1.04-1.10 times OpenBLAS's time at 32 rows and from
// 1.08-1.14 to 1.04-1.06 at 64; chained, no change beyond the noise.
constexpr int64_t kCAhead = 2;

// The first line of each of `rows` rows, `ld` floats apart.
void PrefetchRows(const float* first, int64_t ld, int64_t rows) {
  for (int64_t i = 0; i < rows; ++i) {
    _mm_prefetch(reinterpret_cast<const char*>(first + i * ld), _MM_HINT_T0);
  }
}

// RunColumnPanels with source.rows_outer, on rows [r_lo, r_hi) (whole row
// blocks) and every column: with k = 32, one microbatch's weight gradient
// ran at 2.3 times OpenBLAS's time with the columns outer and 1.2 times
// with the rows outer; with k = 256 the two orders ran alike
// (packed_gemm_benchmark --weight_gradients).
void RunRowsOuter(int64_t m, int64_t n, int64_t k, const float* a_packed,
                  const float* b_packed, bool accumulate, float* c, int64_t ldc,
                  int64_t r_lo, int64_t r_hi) {
  const int64_t panels = Panels(n);
  for (int64_t k0 = 0; k0 < k; k0 += kKc) {
    const int64_t kb = std::min(kKc, k - k0);
    const bool load = accumulate || k0 > 0;
    // Runs of B panels of at most 128 KiB.
    const int64_t run =
        std::max<int64_t>(1, (int64_t{128} << 10) / (kb * kNr * 4));
    for (int64_t q0 = 0; q0 < panels; q0 += run) {
      const int64_t q1 = std::min(panels, q0 + run);
      for (int64_t i0 = r_lo, rows = RowBlock(m); i0 < r_hi; i0 += rows) {
        const int64_t mb = std::min(rows, m - i0);
        const float* ap = a_packed + k0 * m + i0 * kb;
        ForEachRowPanel(mb, [&](int64_t r0, int64_t rows) {
          for (int64_t p = q0; p < q1; ++p) {
            const int64_t col = p * kNr;
            const int64_t cols = std::min(kNr, n - col);
            const float* bp = b_packed + k0 * panels * kNr + p * kb * kNr;
            if (load) {
              // C's tile kCAhead panels on in this sweep (or the next row
              // panel's): the same number of rows, within the row block.
              const int64_t ahead = p + kCAhead;
              const int64_t r = ahead < q1 ? r0 : r0 + rows;
              const int64_t pc = ahead < q1 ? ahead : q0 + ahead - q1;
              if (pc < q1 && r < mb) {
                PrefetchRows(c + (i0 + r) * ldc + pc * kNr, ldc,
                             std::min(rows, mb - r));
              }
            }
            PanelOfC(rows, cols, kb, ap + r0 * kb, bp,
                     c + (i0 + r0) * ldc + col, ldc, load, kNoPrefetch);
          }
        });
      }
    }
  }
}

// Copies a packed panel (kb x 16 floats, 64-byte aligned at both ends) to
// dst without reading dst's lines into the cache first (streaming stores,
// weakly ordered: the caller fences before another thread may read dst).
__attribute__((target("avx"))) void StreamPanelAvx(const float* src, int64_t kb,
                                                   float* dst) {
  for (int64_t i = 0; i < kb * kNr; i += 8) {
    _mm256_stream_ps(dst + i, _mm256_load_ps(src + i));
  }
}

void StreamPanel(const float* src, int64_t kb, float* dst) {
  if (UseAvx2Helpers()) {
    StreamPanelAvx(src, kb, dst);
  } else {
    std::memcpy(dst, src, kb * kNr * sizeof(float));
  }
}

// Columns [p0, p1) panels of C [m, n] for all rows, from A packed by PackA.
void RunColumnPanels(int64_t m, int64_t n, int64_t k, const float* a_packed,
                     const BSource& source, bool accumulate, float* c,
                     int64_t ldc, int64_t p0, int64_t p1) {
  const int64_t panels = Panels(n);
  alignas(64) thread_local float panel[kKc * kNr];
  bool streamed = false;  // panels written to source.keep
  for (int64_t k0 = 0; k0 < k; k0 += kKc) {
    const int64_t kb = std::min(kKc, k - k0);
    const bool load = accumulate || k0 > 0;
    for (int64_t i0 = 0, rows = RowBlock(m); i0 < m; i0 += rows) {
      const int64_t mb = std::min(rows, m - i0);
      const float* ap = a_packed + k0 * m + i0 * kb;
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t col = p * kNr;
        const int64_t cols = std::min(kNr, n - col);
        // The panel's place in a packed matrix.
        const int64_t offset = k0 * panels * kNr + p * kb * kNr;
        const float* bp = panel;
        Prefetch next;
        const bool last = p + 1 == p1;
        if (source.packed != nullptr || (source.keep != nullptr && i0 > 0)) {
          bp =
              (source.packed != nullptr ? source.packed : source.keep) + offset;
          if (!last) next.base = bp + kb * kNr;
        } else {
          // Packed here, into the buffer the kernels then read; the next
          // panel's source lines are fetched meanwhile. With `keep`, the
          // first row block also copies the panel to its place in the kept
          // matrix, with streaming stores: written in place with ordinary
          // stores, each of its lines was first read from memory, and at
          // 32 rows that traffic held back the GEMM. Measured on AMD Zen 4
          // (a scratch program: a microbatch's 8 packing GEMMs and then 8
          // reading the packs, both ways alternating in one process, 11 and
          // 15 rounds): 0.918 and 0.894 of the time at 32 rows, 0.995 and
          // 0.945 at 64, 0.995 and 0.978 at 128.
          PackPanel(source.trans, source.b, source.ldb, k0, kb, col, cols,
                    panel);
          if (source.keep != nullptr) {
            StreamPanel(panel, kb, source.keep + offset);
            streamed = true;
          }
          if (!last && source.trans) {
            next = {source.b + (col + kNr) * source.ldb + k0, 16, kNr,
                    source.ldb};
          } else if (!last) {
            next.base = source.b + k0 * source.ldb + col + kNr;
            next.step = source.ldb;
          }
        }
        // The next panel's kb lines are shared out over the row panels,
        // a slice each: from the first kernel alone, 16 KiB were asked for
        // at once and the other kernels asked for nothing. Measured
        // (packed_gemm_benchmark, 2 threads, AVX2, before and after
        // alternating, 3 runs): packed / OpenBLAS with every weight packed
        // beforehand 0.85-0.87 -> 0.80-0.81 at 64 rows and 0.77-0.83 ->
        // 0.69-0.78 at 32; packing in the first microbatch as the step
        // does, 0.92-0.99 -> 0.90-0.95 and 0.89-0.90 -> 0.79-0.81.
        const int64_t row_panels = RowPanels(mb);
        int64_t panel_index = 0;
        ForEachRowPanel(mb, [&](int64_t r0, int64_t rows) {
          float* cp = c + (i0 + r0) * ldc + col;
          Prefetch pf = next;
          pf.first = kb * panel_index / row_panels;
          pf.count = kb * (panel_index + 1) / row_panels - pf.first;
          ++panel_index;
          if (load) {
            // C's next tile in this sweep (the next row panel's, or the
            // next B panel's first), a row panel ahead: C is revisited once
            // a k block, after all this column block's B panels streamed
            // through the cache. With every weight packed beforehand
            // (packed_gemm_benchmark --prepacked, 3 alternating pairs) the
            // forward and input-gradient GEMMs went from 0.76-0.83 to
            // 0.72-0.80 times OpenBLAS's time at 32 rows and from 0.85-0.89
            // to 0.83-0.85 at 64.
            if (r0 + rows < mb) {
              PrefetchRows(cp + rows * ldc, ldc,
                           std::min(rows, mb - r0 - rows));
            } else if (!last) {
              PrefetchRows(c + i0 * ldc + col + kNr, ldc,
                           std::min(PanelRows(), mb));
            }
          }
          PanelOfC(rows, cols, kb, ap + r0 * kb, bp, cp, ldc, load, pf);
        });
      }
    }
  }
  // The streamed panels are in memory before the pool's join publishes them.
  if (streamed) _mm_sfence();
}

}  // namespace

void PackedMatrix::Free::operator()(float* p) const { std::free(p); }

absl::Status PackedMatrix::Reserve(int64_t k, int64_t n) {
  if (k < 0 || n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("PackedMatrix: negative size k=", k, " n=", n));
  }
  const int64_t need = k * Panels(n) * kNr;
  if (need > capacity_) {
    const int64_t bytes = (need * 4 + 63) / 64 * 64;
    float* p = static_cast<float*>(AllocateHostBlock(bytes));
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("PackedMatrix: cannot allocate ", bytes,
                       " bytes for a [", k, ", ", n, "] operand"));
    }
    data_.reset(p);
    capacity_ = need;
  }
  k_ = k;
  n_ = n;
  return absl::OkStatus();
}

namespace {

// Fills `out` (sized for op(B) [k, n] by Reserve) panel by panel:
// fill(k0, kb, col, cols, dst) packs one. Groups of 16 panels (256
// columns) and 256 rows of k, threaded: a group reads 1 KiB a row (or, for
// b^T, 256 of k along 16 rows) and writes 16 panels.
template <typename Fill>
void PackPanels(int64_t k, int64_t n, float* out, Fill fill) {
  const int64_t panels = Panels(n);
  constexpr int64_t kGroup = 16;
  const int64_t groups = (panels + kGroup - 1) / kGroup;
  const int64_t kblocks = (k + kKc - 1) / kKc;
  ParallelFor(static_cast<int>(groups * kblocks), [&](int t) {
    const int64_t k0 = t / groups * kKc, g = t % groups;
    const int64_t kb = std::min(kKc, k - k0);
    const int64_t p_end = std::min(panels, (g + 1) * kGroup);
    for (int64_t p = g * kGroup; p < p_end; ++p) {
      const int64_t col = p * kNr;
      fill(k0, kb, col, std::min(kNr, n - col),
           out + k0 * panels * kNr + p * kb * kNr);
    }
  });
}

}  // namespace

absl::Status PackedMatrix::Pack(bool trans, int64_t k, int64_t n,
                                const float* b, int64_t ldb) {
  RETURN_IF_ERROR(CheckB("PackedMatrix::Pack", trans, k, n, ldb));
  RETURN_IF_ERROR(Reserve(k, n));
  PackPanels(
      k, n, data_.get(),
      [&](int64_t k0, int64_t kb, int64_t col, int64_t cols, float* dst) {
        PackPanel(trans, b, ldb, k0, kb, col, cols, dst);
      });
  return absl::OkStatus();
}

namespace {

absl::Status Run(int64_t m, int64_t n, int64_t k, const ASource& a,
                 const BSource& source, bool accumulate, float* c, int64_t ldc,
                 const GemmEpilogue& epilogue) {
  if (m < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("SgemmPacked: negative m=", m));
  }
  const int64_t lda = a.t_rows != nullptr ? std::max<int64_t>(1, k) : a.lda;
  if (lda < std::max<int64_t>(1, k) || ldc < std::max<int64_t>(1, n)) {
    return absl::InvalidArgumentError(
        absl::StrCat("SgemmPacked: leading dimension too small: lda=", lda,
                     " (needs >= ", k, "), ldc=", ldc, " (needs >= ", n, ")"));
  }
  if (m == 0 || n == 0) return absl::OkStatus();
  // Blocks of C cut by the shape only (at most 8, each at least 4M
  // multiply-adds), so any thread count gives the same blocks: whole column
  // panels, or, rows_outer, whole row blocks (each thread then walks C
  // along whole rows: long runs of lines for the hardware prefetcher. One
  // microbatch's weight gradients at 64 and 32 rows went from 1.03-1.10
  // and 1.13-1.17 of OpenBLAS's time with column blocks to 0.94-1.02 and
  // 0.98-1.01: packed_gemm_benchmark --weight_gradients --per_microbatch,
  // three alternating runs, AMD Zen 4).
  const int64_t panels = Panels(n);
  const int64_t work = m * n * std::max<int64_t>(k, 1);
  const int64_t row_block = RowBlock(m);
  const int64_t units =
      source.rows_outer ? (m + row_block - 1) / row_block : panels;
  const int64_t want = std::max<int64_t>(
      1, std::min<int64_t>({8, units, work / (int64_t{1} << 22)}));
  const int64_t per = (units + want - 1) / want;
  const int tiles = static_cast<int>((units + per - 1) / per);
  // A packed once, into this thread's buffer (the pool's threads read it
  // through the pointer: a thread_local named in the lambda would be
  // theirs).
  thread_local std::vector<float> a_buffer;
  const float* a_packed = nullptr;
  if (k > 0) {
    a_buffer.resize(m * k);
    PackA(m, k, a, a_buffer.data());
    a_packed = a_buffer.data();
  }
  ParallelFor(tiles, [&](int t) {
    // This block: rows [r0, r1) x panels [p0, p1).
    const int64_t u0 = t * per, u1 = std::min(units, u0 + per);
    int64_t r0 = 0, r1 = m, p0 = u0, p1 = u1;
    if (source.rows_outer) {
      r0 = u0 * row_block;
      r1 = std::min(m, u1 * row_block);
      p0 = 0;
      p1 = panels;
    }
    const int64_t col = p0 * kNr, cols = std::min(n, p1 * kNr) - col;
    if (k == 0) {
      for (int64_t i = r0; i < r1 && !accumulate; ++i) {
        std::fill(c + i * ldc + col, c + i * ldc + col + cols, 0.0f);
      }
    } else if (source.rows_outer) {
      RunRowsOuter(m, n, k, a_packed, source.packed, accumulate, c, ldc, r0,
                   r1);
    } else {
      RunColumnPanels(m, n, k, a_packed, source, accumulate, c, ldc, p0, p1);
    }
    if (epilogue) epilogue(r0, r1 - r0, col, cols);
  });
  return absl::OkStatus();
}

}  // namespace

absl::Status SgemmPacked(int64_t m, const float* a, int64_t lda,
                         const PackedMatrix& b, bool accumulate, float* c,
                         int64_t ldc, const GemmEpilogue& epilogue) {
  BSource source;
  source.packed = b.data();
  return Run(m, b.n(), b.k(), ASource{a, lda}, source, accumulate, c, ldc,
             epilogue);
}

absl::Status SgemmPacking(int64_t m, int64_t n, int64_t k, const float* a,
                          int64_t lda, bool trans_b, const float* b,
                          int64_t ldb, bool accumulate, float* c, int64_t ldc,
                          const GemmEpilogue& epilogue, PackedMatrix* keep) {
  RETURN_IF_ERROR(CheckB("SgemmPacking", trans_b, k, n, ldb));
  BSource source;
  source.trans = trans_b;
  source.b = b;
  source.ldb = ldb;
  if (keep != nullptr) {
    RETURN_IF_ERROR(keep->Reserve(k, n));
    // With no rows the panels would not be packed.
    if (m == 0) return keep->Pack(trans_b, k, n, b, ldb);
    source.keep = keep->mutable_data();
  }
  return Run(m, n, k, ASource{a, lda}, source, accumulate, c, ldc, epilogue);
}

absl::Status SgemmWeightGradient(int64_t m, int64_t n,
                                 absl::Span<const GradientRows> parts,
                                 bool accumulate, float* c, int64_t ldc) {
  if (m < 0 || n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("SgemmWeightGradient: negative size m=", m, " n=", n));
  }
  int64_t k = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const GradientRows& p = parts[i];
    const auto bad = [&](const auto&... what) {
      return absl::InvalidArgumentError(
          absl::StrCat("SgemmWeightGradient: part ", i, ": ", what...));
    };
    if (p.rows < 0) return bad("negative rows=", p.rows);
    if (p.rows == 0) continue;
    if (p.dy == nullptr || p.x == nullptr) return bad("null dy or x");
    if (p.ld_dy < std::max<int64_t>(1, m) || p.ld_x < std::max<int64_t>(1, n)) {
      return bad("leading dimension too small: ld_dy=", p.ld_dy,
                 " (needs >= ", m, "), ld_x=", p.ld_x, " (needs >= ", n, ")");
    }
    k += p.rows;
  }
  if (ldc < std::max<int64_t>(1, n)) {
    return absl::InvalidArgumentError(
        absl::StrCat("SgemmWeightGradient: ldc=", ldc, " needs >= ", n));
  }
  if (k == 0 || m == 0 || n == 0) {
    for (int64_t i = 0; i < m && !accumulate; ++i) {
      std::fill(c + i * ldc, c + i * ldc + n, 0.0f);
    }
    return absl::OkStatus();
  }
  // The parts' rows in order: dy's (A^T) then x's (B).
  thread_local std::vector<const float*> rows;
  rows.clear();
  for (const GradientRows& p : parts) {
    for (int64_t r = 0; r < p.rows; ++r) rows.push_back(p.dy + r * p.ld_dy);
  }
  for (const GradientRows& p : parts) {
    for (int64_t r = 0; r < p.rows; ++r) rows.push_back(p.x + r * p.ld_x);
  }
  const float* const* x_rows = rows.data() + k;
  // B = x is packed whole first (k x n floats: a few MiB), then read by
  // every row block of A.
  thread_local PackedMatrix x_packed;
  RETURN_IF_ERROR(x_packed.Reserve(k, n));
  PackPanels(
      k, n, x_packed.mutable_data(),
      [&](int64_t k0, int64_t kb, int64_t col, int64_t cols, float* dst) {
        CopyPanelRows(kb, cols, dst,
                      [&](int64_t q) { return x_rows[k0 + q] + col; });
      });
  ASource a;
  a.t_rows = rows.data();
  BSource source;
  source.packed = x_packed.data();
  source.rows_outer = true;
  return Run(m, n, k, a, source, accumulate, c, ldc, GemmEpilogue());
}

}  // namespace trainyard
