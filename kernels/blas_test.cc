#include "kernels/blas.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/random.h"
#include "gtest/gtest.h"
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
      {false, false, 1, 1, 1},     {false, true, 3, 17, 5},
      {true, false, 17, 3, 1009},  {true, true, 1009, 3, 17},
      {false, true, 5, 1009, 3},   {true, false, 1, 17, 3},
      {false, false, 17, 33, 1009}, {true, true, 3, 1, 64},
  };
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
    const std::string what = "C for ta=" + std::to_string(gc.ta) +
                             " tb=" + std::to_string(gc.tb) +
                             " m=" + std::to_string(gc.m) +
                             " n=" + std::to_string(gc.n) +
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
  ASSERT_TRUE(Sgemm(false, false, 2, 2, 2, 1.0f, a.data(), 2, b.data(), 2,
                    0.0f, c.data(), 2)
                  .ok());
  EXPECT_EQ(c, a);
}

TEST(SgemmTest, ZeroInnerDimensionScalesC) {
  std::vector<float> c = {1, 2, 3, 4};
  ASSERT_TRUE(
      Sgemm(false, false, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 2.0f, c.data(), 2)
          .ok());
  EXPECT_EQ(c, (std::vector<float>{2, 4, 6, 8}));
  ASSERT_TRUE(
      Sgemm(false, false, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.0f, c.data(), 2)
          .ok());
  EXPECT_EQ(c, (std::vector<float>{0, 0, 0, 0}));
}

TEST(SgemmTest, RejectsBadLeadingDimension) {
  std::vector<float> a(6), b(6), c(4);
  const absl::Status s = Sgemm(false, false, 2, 2, 3, 1.0f, a.data(), 2,
                               b.data(), 2, 0.0f, c.data(), 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("lda=2"), std::string::npos) << s;
  EXPECT_EQ(Sgemm(false, false, -1, 2, 3, 1.0f, a.data(), 3, b.data(), 2,
                  0.0f, c.data(), 2)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(BlasTest, PicksCoreTypeFromCpuid) {
  ASSERT_TRUE(BlasStatus().ok()) << BlasStatus();
  const std::string desc = BlasDescription();
  EXPECT_EQ(desc.rfind("OpenBLAS ", 0), 0u) << desc;
  // Only when the environment did not choose for us.
  const char* env = std::getenv("OPENBLAS_CORETYPE");
  ASSERT_NE(env, nullptr) << "Sgemm must set OPENBLAS_CORETYPE when unset";
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
      std::string(env) == "SkylakeX") {
    EXPECT_NE(desc.find("SkylakeX"), std::string::npos) << desc;
  }
}

TEST(BlasTest, SetBlasThreadsTakesEffect) {
  SetBlasThreads(1);
  EXPECT_EQ(BlasThreads(), 1);
  EXPECT_NE(BlasDescription().find(", 1 thread"), std::string::npos)
      << BlasDescription();
  SetBlasThreads(2);
  EXPECT_EQ(BlasThreads(), 2);
  EXPECT_NE(BlasDescription().find(", 2 threads"), std::string::npos);
}

// Determinism is a product feature: the same inputs must give the same bits
// whatever the thread count. Shapes are the MLP block's GEMMs (batch 64 to
// keep the test fast; the benchmark's shapes are checked in the report).
TEST(SgemmTest, BitwiseIdenticalAcrossThreadCounts) {
  Rng rng(7);
  const int64_t b = 64, h = 256, f = 1024;
  const std::vector<GemmCase> cases = {
      {false, true, b, f, h},   // fc1 forward
      {false, true, b, h, f},   // fc2 forward
      {false, false, b, f, h},  // d_act
      {true, false, h, f, b},   // fc2 weight grad
      {true, false, f, h, b},   // fc1 weight grad
      {false, false, 3, 17, 1009},
  };
  for (const GemmCase& gc : cases) {
    std::vector<float> a = reference::ToFloat(
        reference::RandomVec(&rng, gc.m * gc.k, 1.0));
    std::vector<float> bm = reference::ToFloat(
        reference::RandomVec(&rng, gc.k * gc.n, 1.0));
    const int64_t lda = gc.ta ? gc.m : gc.k, ldb = gc.tb ? gc.k : gc.n;
    std::vector<std::vector<float>> results;
    for (int threads : {1, 2, 1, 2}) {
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

}  // namespace
}  // namespace trainyard
