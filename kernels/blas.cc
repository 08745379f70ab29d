#include "kernels/blas.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/status_macros.h"
#include "kernels/cpu_kind.h"
#include "kernels/parallel.h"

namespace trainyard {
namespace {

constexpr char kLibrary[] = "libopenblas.so.0";

// CBLAS enum values (cblas.h), fixed by the CBLAS standard.
constexpr int kCblasRowMajor = 101;
constexpr int kCblasNoTrans = 111;
constexpr int kCblasTrans = 112;

using SgemmFn = void (*)(int order, int trans_a, int trans_b, int m, int n,
                         int k, float alpha, const float* a, int lda,
                         const float* b, int ldb, float beta, float* c,
                         int ldc);
using SetThreadsFn = void (*)(int);
using GetThreadsFn = int (*)();
using CoreNameFn = char* (*)();

struct Blas {
  absl::Status status;
  SgemmFn sgemm = nullptr;
  SetThreadsFn set_num_threads = nullptr;
  GetThreadsFn get_num_threads = nullptr;
  CoreNameFn get_corename = nullptr;
};

// The OPENBLAS_CORETYPE value this CPU's features call for, or null: the
// AVX-512 kernels where the CPU has full-width AVX-512 units, else the AVX2
// ones (kernels/cpu_kind.h).
const char* CoreTypeFromCpuid() {
  if (CpuHasAvx512() && !CpuHasHalfWidthAvx512()) return "SkylakeX";
  if (CpuHasAvx2Fma()) return "Haswell";
  return nullptr;
}

Blas Load() {
  Blas blas;
  const char* env = std::getenv("OPENBLAS_CORETYPE");
  if (env == nullptr || env[0] == '\0') {
    if (const char* core = CoreTypeFromCpuid()) {
      setenv("OPENBLAS_CORETYPE", core, /*overwrite=*/1);
    }
  }
  // Its pool would sit idle (we call it single-threaded).
  setenv("OPENBLAS_NUM_THREADS", "1", /*overwrite=*/0);
  // Never dlclose: OpenBLAS's worker threads live as long as the process.
  void* handle = dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    blas.status = absl::FailedPreconditionError(
        absl::StrCat("cannot load ", kLibrary,
                     " (OpenBLAS, Debian package "
                     "libopenblas0-pthread): ",
                     err ? err : "unknown error"));
    return blas;
  }
  struct Symbol {
    const char* name;
    void** slot;
  };
  const Symbol symbols[] = {
      {"cblas_sgemm", reinterpret_cast<void**>(&blas.sgemm)},
      {"openblas_set_num_threads",
       reinterpret_cast<void**>(&blas.set_num_threads)},
      {"openblas_get_num_threads",
       reinterpret_cast<void**>(&blas.get_num_threads)},
      {"openblas_get_corename", reinterpret_cast<void**>(&blas.get_corename)},
  };
  for (const Symbol& s : symbols) {
    *s.slot = dlsym(handle, s.name);
    if (*s.slot == nullptr) {
      blas.status = absl::FailedPreconditionError(absl::StrCat(
          "symbol ", s.name, " not found in ", kLibrary, " (is it OpenBLAS?)"));
      return blas;
    }
  }
  // Our pool parallelises; OpenBLAS's own threading is not bitwise
  // invariant across thread counts (see blas.h).
  blas.set_num_threads(1);
  return blas;
}

const Blas& GetBlas() {
  static const Blas* const blas = new Blas(Load());
  return *blas;
}

}  // namespace

absl::Status BlasStatus() { return GetBlas().status; }

namespace {

// Sizes and leading dimensions Sgemm accepts (see blas.h).
absl::Status CheckSgemmArgs(bool trans_a, bool trans_b, int64_t m, int64_t n,
                            int64_t k, int64_t lda, int64_t ldb, int64_t ldc) {
  if (m < 0 || n < 0 || k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Sgemm: negative size m=", m, " n=", n, " k=", k));
  }
  const int64_t a_cols = trans_a ? m : k;
  const int64_t b_cols = trans_b ? k : n;
  if (lda < std::max<int64_t>(1, a_cols) ||
      ldb < std::max<int64_t>(1, b_cols) || ldc < std::max<int64_t>(1, n)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Sgemm: leading dimension too small: lda=", lda, " (needs >= ", a_cols,
        "), ldb=", ldb, " (needs >= ", b_cols, "), ldc=", ldc, " (needs >= ", n,
        ")"));
  }
  const int64_t largest = std::max({m, n, k, lda, ldb, ldc});
  if (largest > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Sgemm: size ", largest, " exceeds OpenBLAS's 32-bit int"));
  }
  return absl::OkStatus();
}

// C = beta * C; BLAS semantics: beta == 0 overwrites.
void ScaleC(int64_t m, int64_t n, float beta, float* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    float* row = c + i * ldc;
    for (int64_t j = 0; j < n; ++j)
      row[j] = beta == 0.0f ? 0.0f : beta * row[j];
  }
}

}  // namespace

absl::Status Sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                   float alpha, const float* a, int64_t lda, const float* b,
                   int64_t ldb, float beta, float* c, int64_t ldc) {
  return Sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
               GemmEpilogue());
}

absl::Status Sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                   float alpha, const float* a, int64_t lda, const float* b,
                   int64_t ldb, float beta, float* c, int64_t ldc,
                   const GemmEpilogue& epilogue) {
  RETURN_IF_ERROR(CheckSgemmArgs(trans_a, trans_b, m, n, k, lda, ldb, ldc));
  const Blas& blas = GetBlas();
  if (!blas.status.ok()) return blas.status;
  if (m == 0 || n == 0) return absl::OkStatus();
  const GemmTileList tiles = GemmTiles(m, n, k);
  const int num_tiles = static_cast<int>(tiles.size());
  const auto finish = [&](const GemmTile& t) {
    if (epilogue) epilogue(t.row, t.rows, t.col, t.cols);
  };
  if (k == 0 || alpha == 0.0f) {
    ScaleC(m, n, beta, c, ldc);
    if (epilogue) {
      ParallelFor(num_tiles, [&](int i) { finish(tiles[i]); });
    }
    return absl::OkStatus();
  }
  // A fixed tiling of C that depends only on the shape, each tile one
  // single-threaded OpenBLAS call over the full k (then the epilogue on
  // it): the same bits for any thread count.
  const std::function<void(int)> tile = [&](int i) {
    const GemmTile& t = tiles[i];
    const float* ta = trans_a ? a + t.row : a + t.row * lda;  // rows of op(A)
    const float* tb =
        trans_b ? b + t.col * ldb : b + t.col;  // columns of op(B)
    blas.sgemm(kCblasRowMajor, trans_a ? kCblasTrans : kCblasNoTrans,
               trans_b ? kCblasTrans : kCblasNoTrans, static_cast<int>(t.rows),
               static_cast<int>(t.cols), static_cast<int>(k), alpha, ta,
               static_cast<int>(lda), tb, static_cast<int>(ldb), beta,
               c + t.row * ldc + t.col, static_cast<int>(ldc));
    finish(t);
  };
  ParallelFor(num_tiles, tile);
  return absl::OkStatus();
}

GemmTileList GemmTiles(int64_t m, int64_t n, int64_t k) {
  // Splits the larger of m and n (re-packing the smaller operand per tile
  // is cheap) into at most kMaxTiles tiles of >= kMinTile, each >=
  // kMinTileWork multiply-adds.
  constexpr int64_t kMaxTiles = 8;
  constexpr int64_t kMinTile = 64;
  constexpr int64_t kMinTileWork = int64_t{1} << 22;
  GemmTileList tiles;
  if (m <= 0 || n <= 0) return tiles;
  const bool split_n = n >= m;
  const int64_t dim = split_n ? n : m;
  const int64_t work = m * n * k;
  const int64_t count = std::max<int64_t>(
      1, std::min({kMaxTiles, dim / kMinTile, work / kMinTileWork}));
  // Round the tile up to a multiple of 16 (OpenBLAS's unroll).
  const int64_t size = ((dim + count - 1) / count + 15) / 16 * 16;
  for (int64_t begin = 0; begin < dim; begin += size) {
    const int64_t len = std::min(size, dim - begin);
    tiles.push_back(split_n ? GemmTile{0, m, begin, len}
                            : GemmTile{begin, len, 0, n});
  }
  return tiles;
}

void SetBlasThreads(int n) { SetComputeThreads(n); }

int BlasThreads() { return ComputeThreads(); }

std::string BlasDescription() {
  const Blas& blas = GetBlas();
  if (!blas.status.ok()) {
    return absl::StrCat("OpenBLAS unavailable: ", blas.status.message());
  }
  const char* core = blas.get_corename();
  const int threads = BlasThreads();
  return absl::StrCat("OpenBLAS ", core ? core : "unknown", ", ", threads,
                      threads == 1 ? " thread" : " threads");
}

}  // namespace trainyard
