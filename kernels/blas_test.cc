#include "kernels/blas.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "core/random.h"
#include "gtest/gtest.h"
#include "kernels/cpu_kind.h"
#include "kernels/reference.h"

namespace trainyard {
namespace {

using reference::AllClose;
using reference::Vec;

struct GemmCase {
  bool ta, tb;
  int64_t m, n, k;
};

// Copies a [rows, cols] matrix into a buffer with leading dimension ld,
// padding with NaN so reads outside the matrix would show.
std::vector<float> Padded(const Vec& v, int64_t rows, int64_t cols,
                          int64_t ld) {
  std::vector<float> out(rows * ld, std::numeric_limits<float>::quiet_NaN());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) out[r * ld + c] = v[r * cols + c];
  }
  return out;
}

TEST(SgemmTest, MatchesFloat64ReferenceOnOddShapes) {
  Rng rng(1);
  const std::vector<GemmCase> cases = {
      {false, false, 1, 1, 1},
      {false, true, 3, 17, 5},
      {true, false, 17, 3, 1009},
      {true, true, 1009, 3, 17},
      {false, true, 5, 1009, 3},
      {true, false, 1, 17, 3},
      {false, false, 17, 33, 1009},
      {true, true, 3, 1, 64},
      // Several tiles (GemmTiles), so each operand's per-tile offset is
      // checked: rows of a transposed A, columns of a transposed B.
      {true, false, 600, 200, 100},
      {false, true, 200, 600, 100},
      {true, true, 600, 200, 100},
      {false, false, 200, 600, 100},
  };
  ASSERT_EQ(GemmTiles(600, 200, 100).size(), 2u);
  ASSERT_EQ(GemmTiles(200, 600, 100).size(), 2u);
  for (const GemmCase& gc : cases) {
    const int64_t a_rows = gc.ta ? gc.k : gc.m, a_cols = gc.ta ? gc.m : gc.k;
    const int64_t b_rows = gc.tb ? gc.n : gc.k, b_cols = gc.tb ? gc.k : gc.n;
    const Vec a = reference::RandomVec(&rng, a_rows * a_cols, 1.0);
    const Vec b = reference::RandomVec(&rng, b_rows * b_cols, 1.0);
    const Vec c0 = reference::RandomVec(&rng, gc.m * gc.n, 1.0);
    const float alpha = 0.75f, beta = 0.5f;
    // Leading dimensions larger than the rows to exercise lda/ldb/ldc.
    const int64_t lda = a_cols + 3, ldb = b_cols + 1, ldc = gc.n + 2;
    std::vector<float> fa = Padded(a, a_rows, a_cols, lda);
    std::vector<float> fb = Padded(b, b_rows, b_cols, ldb);
    std::vector<float> fc = Padded(c0, gc.m, gc.n, ldc);
    ASSERT_TRUE(Sgemm(gc.ta, gc.tb, gc.m, gc.n, gc.k, alpha, fa.data(), lda,
                      fb.data(), ldb, beta, fc.data(), ldc)
                    .ok());
    Vec expected = reference::Gemm(gc.ta, gc.tb, gc.m, gc.n, gc.k, a, b);
    std::vector<float> got(gc.m * gc.n);
    for (int64_t i = 0; i < gc.m * gc.n; ++i) {
      expected[i] = alpha * expected[i] + beta * c0[i];
      got[i] = fc[(i / gc.n) * ldc + i % gc.n];
    }
    const std::string what =
        "C for ta=" + std::to_string(gc.ta) + " tb=" + std::to_string(gc.tb) +
        " m=" + std::to_string(gc.m) + " n=" + std::to_string(gc.n) +
        " k=" + std::to_string(gc.k);
    // float32 accumulation over k terms of size ~1: error ~ sqrt(k) eps.
    EXPECT_TRUE(AllClose(what.c_str(), got.data(), expected, 1e-5,
                         2e-6 * std::sqrt(static_cast<double>(gc.k))));
    // The padding of C must be untouched.
    for (int64_t r = 0; r < gc.m; ++r) {
      for (int64_t c = gc.n; c < ldc; ++c) {
        ASSERT_TRUE(std::isnan(fc[r * ldc + c])) << what;
      }
    }
  }
}

TEST(SgemmTest, BetaZeroOverwritesNaN) {
  std::vector<float> a = {1, 2, 3, 4}, b = {1, 0, 0, 1};
  std::vector<float> c(4, std::numeric_limits<float>::quiet_NaN());
  ASSERT_TRUE(Sgemm(false, false, 2, 2, 2, 1.0f, a.data(), 2, b.data(), 2, 0.0f,
                    c.data(), 2)
                  .ok());
  EXPECT_EQ(c, a);
}

TEST(SgemmTest, ZeroInnerDimensionScalesC) {
  std::vector<float> c = {1, 2, 3, 4};
  ASSERT_TRUE(Sgemm(false, false, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 2.0f,
                    c.data(), 2)
                  .ok());
  EXPECT_EQ(c, (std::vector<float>{2, 4, 6, 8}));
  ASSERT_TRUE(Sgemm(false, false, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.0f,
                    c.data(), 2)
                  .ok());
  EXPECT_EQ(c, (std::vector<float>{0, 0, 0, 0}));
}

TEST(SgemmTest, RejectsBadLeadingDimension) {
  std::vector<float> a(6), b(6), c(4);
  const absl::Status s = Sgemm(false, false, 2, 2, 3, 1.0f, a.data(), 2,
                               b.data(), 2, 0.0f, c.data(), 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("lda=2"), std::string::npos) << s;
  EXPECT_EQ(Sgemm(false, false, -1, 2, 3, 1.0f, a.data(), 3, b.data(), 2, 0.0f,
                  c.data(), 2)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// OPENBLAS_CORETYPE, as captured before the first BLAS call (the test
// environment may preset it, which Sgemm must respect).
const char* const kCoreTypeAtStart = [] {
  const char* env = std::getenv("OPENBLAS_CORETYPE");
  return env == nullptr ? nullptr : strdup(env);
}();

TEST(BlasTest, PicksCoreTypeFromCpuid) {
  ASSERT_TRUE(BlasStatus().ok()) << BlasStatus();
  const std::string desc = BlasDescription();
  std::cout << "BlasDescription: " << desc << std::endl;
  EXPECT_EQ(desc.rfind("OpenBLAS ", 0), 0u) << desc;
  const char* env = std::getenv("OPENBLAS_CORETYPE");
  const bool full_avx512 = CpuHasAvx512() && !CpuHasHalfWidthAvx512();
  if (kCoreTypeAtStart != nullptr) {
    ASSERT_NE(env, nullptr);
    EXPECT_STREQ(env, kCoreTypeAtStart) << "a preset value must be kept";
  } else if (CpuHasAvx512() || CpuHasAvx2Fma()) {
    ASSERT_NE(env, nullptr) << "Sgemm must set OPENBLAS_CORETYPE when unset";
    EXPECT_STREQ(env, full_avx512 ? "SkylakeX" : "Haswell");
  }
  if (env != nullptr) {
    // OpenBLAS reports the core it runs on: the one we asked for.
    EXPECT_NE(desc.find(env), std::string::npos) << desc;
  }
}

TEST(BlasTest, SetBlasThreadsTakesEffect) {
  SetBlasThreads(0);
  EXPECT_EQ(BlasThreads(), 1);
  EXPECT_NE(BlasDescription().find(", 1 thread"), std::string::npos)
      << BlasDescription();
  SetBlasThreads(2);
  EXPECT_EQ(BlasThreads(), 2);
  EXPECT_NE(BlasDescription().find(", 2 threads"), std::string::npos);
}

// Determinism is a product feature: the same inputs must give the same bits
// whatever the thread count. Shapes are the benchmark's MLP block GEMMs, on
// which OpenBLAS's own threading differs between 1 and 2 threads with its
// Haswell kernels, and an odd one where it differs with SkylakeX kernels.
TEST(SgemmTest, BitwiseIdenticalAcrossThreadCounts) {
  Rng rng(7);
  const int64_t b = 256, h = 1024, f = 4096;
  const std::vector<GemmCase> cases = {
      {false, true, b, f, h},   // fc1 forward
      {false, true, b, h, f},   // fc2 forward
      {false, false, b, f, h},  // d_act
      {true, false, h, f, b},   // fc2 weight grad
      {true, false, f, h, b},   // fc1 weight grad
      {false, true, 17, 1009, 1009}, {false, false, 3, 17, 1009},
  };
  for (const GemmCase& gc : cases) {
    std::vector<float> a =
        reference::ToFloat(reference::RandomVec(&rng, gc.m * gc.k, 1.0));
    std::vector<float> bm =
        reference::ToFloat(reference::RandomVec(&rng, gc.k * gc.n, 1.0));
    const int64_t lda = gc.ta ? gc.m : gc.k, ldb = gc.tb ? gc.k : gc.n;
    std::vector<std::vector<float>> results;
    for (int threads : {1, 2, 3, 2}) {
      SetBlasThreads(threads);
      std::vector<float> c(gc.m * gc.n, 0.5f);
      ASSERT_TRUE(Sgemm(gc.ta, gc.tb, gc.m, gc.n, gc.k, 1.0f, a.data(), lda,
                        bm.data(), ldb, 1.0f, c.data(), gc.n)
                      .ok());
      results.push_back(c);
    }
    for (size_t i = 1; i < results.size(); ++i) {
      EXPECT_EQ(0, std::memcmp(results[0].data(), results[i].data(),
                               results[0].size() * sizeof(float)))
          << "m=" << gc.m << " n=" << gc.n << " k=" << gc.k << " run " << i;
    }
  }
  SetBlasThreads(2);
}

// The epilogue sees each element of C exactly once, after the GEMM wrote
// it (it reads the finished values), on shapes that split C by rows, by
// columns, not at all, and with k = 0; the blocks are the same on 1 and 2
// threads.
TEST(SgemmTest, EpilogueBlocksPartitionCAfterTheGemm) {
  struct Case {
    int64_t m, n, k;
  };
  for (const Case& t : std::vector<Case>{
           {200, 1000, 300}, {1000, 200, 300}, {7, 9, 5}, {300, 500, 0}}) {
    std::vector<std::vector<int64_t>> blocks_by_threads;
    for (int threads : {1, 2}) {
      SetBlasThreads(threads);
      std::vector<float> a(t.m * std::max<int64_t>(t.k, 1), 1.0f);
      std::vector<float> b(std::max<int64_t>(t.k, 1) * t.n, 1.0f);
      std::vector<float> c(t.m * t.n, 0.5f);
      std::vector<int> seen(t.m * t.n, 0);
      std::mutex mu;
      std::vector<int64_t> blocks;
      bool finished_values = true;
      ASSERT_TRUE(
          Sgemm(false, false, t.m, t.n, t.k, 1.0f, a.data(),
                std::max<int64_t>(t.k, 1), b.data(), t.n, 0.0f, c.data(), t.n,
                [&](int64_t row, int64_t rows, int64_t col, int64_t cols) {
                  std::lock_guard<std::mutex> lock(mu);
                  blocks.insert(blocks.end(), {row, rows, col, cols});
                  for (int64_t i = row; i < row + rows; ++i) {
                    for (int64_t j = col; j < col + cols; ++j) {
                      ++seen[i * t.n + j];
                      if (c[i * t.n + j] != static_cast<float>(t.k)) {
                        finished_values = false;
                      }
                    }
                  }
                })
              .ok());
      EXPECT_TRUE(finished_values) << t.m << "x" << t.n << "x" << t.k;
      EXPECT_EQ(std::count(seen.begin(), seen.end(), 1),
                static_cast<int64_t>(seen.size()))
          << t.m << "x" << t.n << "x" << t.k;
      std::sort(blocks.begin(), blocks.end());
      blocks_by_threads.push_back(blocks);
    }
    EXPECT_EQ(blocks_by_threads[0], blocks_by_threads[1]);
  }
  SetBlasThreads(2);
}

// GemmTiles is the tiling Sgemm runs (its epilogue sees exactly those
// blocks), cut along C's larger side.
TEST(GemmTilesTest, AreSgemmsBlocksAlongTheLargerSide) {
  // The block's forward at 256 rows: 8 column tiles of 512.
  GemmTileList fwd = GemmTiles(256, 4096, 1024);
  ASSERT_EQ(fwd.size(), 8u);
  for (size_t i = 0; i < fwd.size(); ++i) {
    EXPECT_EQ(fwd[i].row, 0);
    EXPECT_EQ(fwd[i].rows, 256);
    EXPECT_EQ(fwd[i].col, 512 * static_cast<int64_t>(i));
    EXPECT_EQ(fwd[i].cols, 512);
  }
  // Taller than wide: rows; the last tile takes the rest.
  GemmTileList tall = GemmTiles(1000, 200, 300);
  ASSERT_FALSE(tall.empty());
  int64_t next = 0;
  for (const GemmTile& t : tall) {
    EXPECT_EQ(t.row, next);
    EXPECT_EQ(t.col, 0);
    EXPECT_EQ(t.cols, 200);
    next += t.rows;
  }
  EXPECT_EQ(next, 1000);
  ASSERT_EQ(tall.size(), 8u);  // 128 rows each (125 rounded up to 16)
  EXPECT_EQ(tall.back().rows, 1000 - 7 * 128);
  EXPECT_EQ(GemmTiles(7, 9, 5).size(), 1u);
  EXPECT_TRUE(GemmTiles(0, 9, 5).empty());

  for (const auto& [m, n, k] :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{{200, 1000, 300},
                                                          {1000, 200, 300}}) {
    std::vector<std::vector<int64_t>> seen;
    std::mutex mu;
    std::vector<float> a(m * k, 1.0f), b(k * n, 1.0f), c(m * n);
    ASSERT_TRUE(
        Sgemm(false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f,
              c.data(), n,
              [&](int64_t row, int64_t rows, int64_t col, int64_t cols) {
                std::lock_guard<std::mutex> lock(mu);
                seen.push_back({row, rows, col, cols});
              })
            .ok());
    std::vector<std::vector<int64_t>> want;
    for (const GemmTile& t : GemmTiles(m, n, k)) {
      want.push_back({t.row, t.rows, t.col, t.cols});
    }
    std::sort(seen.begin(), seen.end());
    EXPECT_EQ(seen, want) << m << "x" << n << "x" << k;
  }
}

// Two threads calling Sgemm at once (one finds the pool busy and runs its
// tiles itself) get the same bits as a lone call.
TEST(SgemmTest, ConcurrentCallersGetSameBits) {
  Rng rng(8);
  const int64_t m = 128, n = 1024, k = 512;
  const std::vector<float> a =
      reference::ToFloat(reference::RandomVec(&rng, m * k, 1.0));
  const std::vector<float> b =
      reference::ToFloat(reference::RandomVec(&rng, k * n, 1.0));
  SetBlasThreads(2);
  std::vector<float> want(m * n);
  ASSERT_TRUE(Sgemm(false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f,
                    want.data(), n)
                  .ok());
  std::vector<std::vector<float>> got(2, std::vector<float>(m * n));
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 5; ++rep) {
        std::fill(got[t].begin(), got[t].end(), 0.0f);
        ASSERT_TRUE(Sgemm(false, false, m, n, k, 1.0f, a.data(), k, b.data(), n,
                          0.0f, got[t].data(), n)
                        .ok());
        ASSERT_EQ(0, std::memcmp(want.data(), got[t].data(),
                                 want.size() * sizeof(float)));
      }
    });
  }
  for (std::thread& t : threads) t.join();
}

}  // namespace
}  // namespace trainyard
