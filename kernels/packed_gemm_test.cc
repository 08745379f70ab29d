#include "kernels/packed_gemm.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <vector>

#include "core/random.h"
#include "gtest/gtest.h"
#include "kernels/parallel.h"

namespace trainyard {
namespace {

// Values spread over 2^-8 .. 2^8 with both signs, so a sum in any other
// order than the documented one rounds differently.
std::vector<float> Values(Rng& rng, int64_t n) {
  std::vector<float> v(n);
  for (float& x : v) {
    x = std::ldexp(rng.Uniform(-1.0f, 1.0f),
                   static_cast<int>(rng.Uniform(-8, 8)));
  }
  return v;
}

// The definition in packed_gemm.h, one element at a time over the unpacked
// operands: b is [n, k] (trans) or [k, n].
std::vector<float> Reference(int64_t m, int64_t n, int64_t k,
                             const std::vector<float>& a, int64_t lda,
                             bool trans, const std::vector<float>& b,
                             int64_t ldb, bool accumulate, std::vector<float> c,
                             int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float acc = accumulate ? c[i * ldc + j] : 0.0f;
      for (int64_t q = 0; q < k; ++q) {
        const float bv = trans ? b[j * ldb + q] : b[q * ldb + j];
        acc = std::fma(a[i * lda + q], bv, acc);
      }
      c[i * ldc + j] = acc;
    }
  }
  return c;
}

struct Case {
  int64_t m, n, k;
};

// Shapes across every edge of the blocking: rows around the 6- and 12-row
// panels (AVX2's and AVX-512's) and the 256-row blocks, columns around the
// 16-column panels, k around the 256-row blocks (and k = 0).
const Case kCases[] = {
    {1, 1, 1},     {5, 15, 7},    {7, 16, 256},   {31, 17, 257}, {32, 40, 255},
    {64, 33, 600}, {250, 48, 31}, {481, 20, 300}, {13, 300, 64}, {2, 5, 0},
    {300, 1, 513}, {12, 20, 100}, {25, 17, 40},   {11, 64, 9},
};

// Which GEMM computes C = A op(B) from b: SgemmPacked on op(B) packed
// (and SgemmPacking on the fly), or SgemmPackedTransposed on op(B)^T
// packed (an input gradient read from the forward's pack).
enum class Path { kPacked, kTransposed };

void ExpectMatchesReference(const Case& cs, bool trans, bool accumulate,
                            Path path = Path::kPacked) {
  Rng rng(cs.m * 1000003 + cs.n * 1009 + cs.k * 7 + trans * 2 + accumulate +
          (path == Path::kTransposed ? 17 : 0));
  const int64_t lda = cs.k + 3, ldc = cs.n + 5;
  const int64_t ldb = (trans ? cs.k : cs.n) + 2;
  const std::vector<float> a = Values(rng, cs.m * lda);
  const std::vector<float> b = Values(rng, (trans ? cs.n : cs.k) * ldb);
  const std::vector<float> c0 = Values(rng, cs.m * ldc);
  PackedMatrix packed;
  std::vector<float> got = c0;
  if (path == Path::kPacked) {
    ASSERT_TRUE(packed.Pack(trans, cs.k, cs.n, b.data(), ldb).ok());
    ASSERT_TRUE(
        SgemmPacked(cs.m, a.data(), lda, packed, accumulate, got.data(), ldc)
            .ok());
  } else {
    // op(B)^T [n, k] is b read the other way.
    ASSERT_TRUE(packed.Pack(!trans, cs.n, cs.k, b.data(), ldb).ok());
    ASSERT_TRUE(SgemmPackedTransposed(cs.m, a.data(), lda, packed, accumulate,
                                      got.data(), ldc)
                    .ok());
  }
  const std::vector<float> want =
      Reference(cs.m, cs.n, cs.k, a, lda, trans, b, ldb, accumulate, c0, ldc);
  // Bitwise, padding between rows of C included (it must stay untouched).
  ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * 4))
      << "m=" << cs.m << " n=" << cs.n << " k=" << cs.k << " trans=" << trans
      << " accumulate=" << accumulate
      << (path == Path::kTransposed ? " transposed" : "");
  if (path == Path::kTransposed) return;
  // Packed on the fly: the same bits.
  std::vector<float> fly = c0;
  ASSERT_TRUE(SgemmPacking(cs.m, cs.n, cs.k, a.data(), lda, trans, b.data(),
                           ldb, accumulate, fly.data(), ldc)
                  .ok());
  ASSERT_EQ(0, std::memcmp(fly.data(), want.data(), fly.size() * 4))
      << "on the fly: m=" << cs.m << " n=" << cs.n << " k=" << cs.k
      << " trans=" << trans << " accumulate=" << accumulate;
}

// Packed first or on the fly, every element is the header's chain.
TEST(SgemmPackedTest, EveryElementIsTheDocumentedFmaChain) {
  for (const Case& cs : kCases) {
    for (bool trans : {false, true}) {
      for (bool accumulate : {false, true}) {
        ExpectMatchesReference(cs, trans, accumulate);
      }
    }
  }
}

// Every kernel this CPU can run, in turn (the default one last).
const PackedKernel kKernels[] = {PackedKernel::kPortable, PackedKernel::kAvx2,
                                 PackedKernel::kAvx512};

// Runs fn() with each kernel this CPU can run; the default one again after.
// A kernel the CPU lacks is named on stdout, so a log shows what ran.
void ForEachKernel(const std::function<void()>& fn) {
  for (PackedKernel kernel : kKernels) {
    if (!PackedKernelSupported(kernel)) {
      std::printf("this CPU cannot run the %s kernel: not tested here\n",
                  PackedKernelName(kernel));
      continue;
    }
    SCOPED_TRACE(PackedKernelName(kernel));
    SetPackedKernelForTesting(kernel);
    fn();
  }
  SetPackedKernelForTesting(std::nullopt);
}

TEST(SgemmPackedTest, EveryKernelGivesTheSameBits) {
  ForEachKernel([] {
    for (const Case& cs : kCases) {
      for (bool trans : {false, true}) {
        for (bool accumulate : {false, true}) {
          ExpectMatchesReference(cs, trans, accumulate);
        }
      }
    }
  });
}

// A row's result does not depend on which call, how many rows or how many
// threads computed it: a microbatch's rows are the full batch's rows.
TEST(SgemmPackedTest, RowsAreTheSameInAnyBatchAndThreadCount) {
  const int64_t m = 97, n = 70, k = 530;
  Rng rng(5);
  const std::vector<float> a = Values(rng, m * k);
  const std::vector<float> w = Values(rng, n * k);
  PackedMatrix packed;
  ASSERT_TRUE(packed.Pack(true, k, n, w.data(), k).ok());
  const int threads = ComputeThreads();
  std::vector<float> whole(m * n);
  SetComputeThreads(3);
  ASSERT_TRUE(SgemmPacked(m, a.data(), k, packed, false, whole.data(), n).ok());
  SetComputeThreads(1);
  for (int64_t begin = 0; begin < m; begin += 11) {
    const int64_t rows = std::min<int64_t>(11, m - begin);
    std::vector<float> part(rows * n);
    ASSERT_TRUE(SgemmPacked(rows, a.data() + begin * k, k, packed, false,
                            part.data(), n)
                    .ok());
    EXPECT_EQ(
        0, std::memcmp(part.data(), whole.data() + begin * n, part.size() * 4))
        << "rows from " << begin;
  }
  SetComputeThreads(threads);
}

// Runs gemm(c, epilogue) on C [m, n] (NaN before) and checks that the
// epilogue's blocks partition C, more than one, each seen once and only
// after it holds its final values `want`.
void ExpectEpilogueSeesFinishedBlocks(
    int64_t m, int64_t n, const std::vector<float>& want,
    const std::function<absl::Status(float*, const GemmEpilogue&)>& gemm) {
  std::vector<float> c(m * n, std::numeric_limits<float>::quiet_NaN());
  std::vector<int> seen(m * n, 0);
  int blocks = 0;
  std::mutex mu;
  ASSERT_TRUE(
      gemm(c.data(), [&](int64_t row, int64_t rows, int64_t col, int64_t cols) {
        std::lock_guard<std::mutex> lock(mu);
        ++blocks;
        for (int64_t i = row; i < row + rows; ++i) {
          for (int64_t j = col; j < col + cols; ++j) {
            ++seen[i * n + j];
            EXPECT_EQ(c[i * n + j], want[i * n + j]);
          }
        }
      }).ok());
  EXPECT_GT(blocks, 1);
  for (int s : seen) ASSERT_EQ(s, 1);
}

// The epilogue sees each block of C once, after it is final.
TEST(SgemmPackedTest, EpilogueBlocksPartitionFinishedC) {
  const int64_t m = 40, n = 1000, k = 300;
  Rng rng(9);
  const std::vector<float> a = Values(rng, m * k);
  const std::vector<float> w = Values(rng, k * n);
  PackedMatrix packed;
  ASSERT_TRUE(packed.Pack(false, k, n, w.data(), n).ok());
  const std::vector<float> want = Reference(m, n, k, a, k, false, w, n, false,
                                            std::vector<float>(m * n), n);
  ExpectEpilogueSeesFinishedBlocks(
      m, n, want, [&](float* c, const GemmEpilogue& epilogue) {
        return SgemmPacked(m, a.data(), k, packed, false, c, n, epilogue);
      });
}

TEST(SgemmPackedTest, RepackingReusesOrGrowsTheBuffer) {
  Rng rng(3);
  PackedMatrix packed;
  for (const Case& cs :
       {Case{9, 100, 700}, Case{9, 20, 30}, Case{9, 400, 900}}) {
    const std::vector<float> a = Values(rng, cs.m * cs.k);
    const std::vector<float> w = Values(rng, cs.n * cs.k);
    ASSERT_TRUE(packed.Pack(true, cs.k, cs.n, w.data(), cs.k).ok());
    EXPECT_EQ(packed.k(), cs.k);
    EXPECT_EQ(packed.n(), cs.n);
    std::vector<float> c(cs.m * cs.n);
    ASSERT_TRUE(
        SgemmPacked(cs.m, a.data(), cs.k, packed, false, c.data(), cs.n).ok());
    EXPECT_EQ(c, Reference(cs.m, cs.n, cs.k, a, cs.k, true, w, cs.k, false,
                           std::vector<float>(cs.m * cs.n), cs.n));
  }
  EXPECT_GE(packed.bytes(), 900 * 400 * 4);
}

TEST(SgemmPackedTest, RejectsBadArguments) {
  PackedMatrix packed;
  std::vector<float> w(64, 1.0f), c(64);
  EXPECT_EQ(packed.Pack(true, -1, 4, w.data(), 4).code(),
            absl::StatusCode::kInvalidArgument);
  absl::Status st = packed.Pack(true, 8, 4, w.data(), 4);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("ldb=4 needs >= 8"), std::string::npos)
      << st.message();
  ASSERT_TRUE(packed.Pack(false, 4, 8, w.data(), 8).ok());
  EXPECT_EQ(SgemmPacked(-1, w.data(), 4, packed, false, c.data(), 8).code(),
            absl::StatusCode::kInvalidArgument);
  st = SgemmPacked(2, w.data(), 3, packed, false, c.data(), 8);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("lda=3 (needs >= 4)"), std::string::npos)
      << st.message();
  st =
      SgemmPacking(2, 8, 4, w.data(), 4, true, w.data(), 3, false, c.data(), 8);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("ldb=3 needs >= 4"), std::string::npos)
      << st.message();
}

// SgemmPackedTransposed: every element is the chain of SgemmPacked on the
// pack's op(B)^T.
TEST(SgemmPackedTransposedTest, EveryElementIsTheDocumentedFmaChain) {
  for (const Case& cs : kCases) {
    for (bool trans : {false, true}) {
      for (bool accumulate : {false, true}) {
        ExpectMatchesReference(cs, trans, accumulate, Path::kTransposed);
      }
    }
  }
  // Long products (several groups of 16 panels, a short last panel) and
  // several k blocks of the pack cut into column blocks.
  ExpectMatchesReference({37, 700, 1000}, false, false, Path::kTransposed);
  ExpectMatchesReference({64, 1030, 4100}, false, true, Path::kTransposed);
}

TEST(SgemmPackedTransposedTest, EveryKernelGivesTheSameBits) {
  ForEachKernel([] {
    for (const Case& cs : kCases) {
      for (bool trans : {false, true}) {
        for (bool accumulate : {false, true}) {
          ExpectMatchesReference(cs, trans, accumulate, Path::kTransposed);
        }
      }
    }
    ExpectMatchesReference({37, 700, 1000}, false, false, Path::kTransposed);
  });
}

// The forward's pack of a weight W [n, k] (op(B) = W^T) gives the input
// gradient dy W with the bits of SgemmPacked on W packed as is, on any
// number of threads.
TEST(SgemmPackedTransposedTest, ForwardPackGivesTheInputGradientsBits) {
  const int64_t m = 45, n = 300, k = 530;  // W [k, n]: out k, in n
  Rng rng(12);
  const std::vector<float> dy = Values(rng, m * k);
  const std::vector<float> w = Values(rng, k * n);
  PackedMatrix forward, input_grad;
  ASSERT_TRUE(forward.Pack(true, n, k, w.data(), n).ok());
  ASSERT_TRUE(input_grad.Pack(false, k, n, w.data(), n).ok());
  std::vector<float> want(m * n);
  ASSERT_TRUE(
      SgemmPacked(m, dy.data(), k, input_grad, false, want.data(), n).ok());
  const int threads = ComputeThreads();
  for (int t : {1, 3}) {
    SetComputeThreads(t);
    std::vector<float> got(m * n);
    ASSERT_TRUE(
        SgemmPackedTransposed(m, dy.data(), k, forward, false, got.data(), n)
            .ok());
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * 4))
        << t << " threads";
  }
  SetComputeThreads(threads);
}

TEST(SgemmPackedTransposedTest, EpilogueBlocksPartitionFinishedC) {
  const int64_t m = 40, n = 1000, k = 300;
  Rng rng(19);
  const std::vector<float> a = Values(rng, m * k);
  const std::vector<float> w = Values(rng, k * n);  // op(B) = w^T [n, k]
  PackedMatrix packed;
  ASSERT_TRUE(packed.Pack(true, n, k, w.data(), n).ok());
  const std::vector<float> want = Reference(m, n, k, a, k, false, w, n, false,
                                            std::vector<float>(m * n), n);
  ExpectEpilogueSeesFinishedBlocks(
      m, n, want, [&](float* c, const GemmEpilogue& epilogue) {
        return SgemmPackedTransposed(m, a.data(), k, packed, false, c, n,
                                     epilogue);
      });
}

TEST(SgemmPackedTransposedTest, RejectsBadArguments) {
  PackedMatrix packed;
  std::vector<float> w(64, 1.0f), c(64);
  ASSERT_TRUE(packed.Pack(false, 4, 8, w.data(), 8).ok());  // op(B) [4, 8]
  EXPECT_EQ(
      SgemmPackedTransposed(-1, w.data(), 8, packed, false, c.data(), 4).code(),
      absl::StatusCode::kInvalidArgument);
  absl::Status st =
      SgemmPackedTransposed(2, w.data(), 7, packed, false, c.data(), 4);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("lda=7 (needs >= 8)"), std::string::npos)
      << st.message();
  st = SgemmPackedTransposed(2, w.data(), 8, packed, false, c.data(), 3);
  EXPECT_NE(st.message().find("ldc=3 (needs >= 4)"), std::string::npos)
      << st.message();
}

// A weight gradient dy^T x over parts (microbatches) of `rows` rows each:
// every element is the header's chain over all the parts' rows in order,
// and one call over all parts gives the bits of one call per part.
TEST(SgemmWeightGradientTest, PartsChainIntoOneFmaChain) {
  struct GradCase {
    int64_t m, n;
    std::vector<int64_t> rows;
  };
  // Around the 6-row panels and 256-row blocks of A (here m), the
  // 16-column panels (n) and the 256-row k blocks, which the parts cross;
  // the last one big enough (8.8M multiply-adds) to be cut into two blocks
  // of C, of 3 and 2 row blocks of 220 rows.
  const GradCase cases[] = {
      {1, 1, {1}},
      {7, 17, {3, 0, 5}},
      {300, 33, {32, 32, 32}},
      {40, 257, {100, 200}},
      {13, 16, {256, 1, 255, 7}},
      {258, 5, {64, 64, 64, 64, 1}},
      {1100, 100, {40, 40}},
  };
  ForEachKernel([&] {
    for (const GradCase& cs : cases) {
      for (bool accumulate : {false, true}) {
        Rng rng(cs.m * 31 + cs.n * 7 + cs.rows.size() + accumulate);
        const int64_t ld_dy = cs.m + 3, ld_x = cs.n + 1, ldc = cs.n + 2;
        std::vector<std::vector<float>> dy, x;
        std::vector<GradientRows> parts;
        // The parts stacked, for the reference: A = dy^T [m, k], B = x [k, n].
        int64_t k = 0;
        for (int64_t r : cs.rows) k += r;
        std::vector<float> a(cs.m * k), b(k * cs.n);
        int64_t q = 0;
        for (int64_t r : cs.rows) {
          dy.push_back(Values(rng, std::max<int64_t>(1, r * ld_dy)));
          x.push_back(Values(rng, std::max<int64_t>(1, r * ld_x)));
          parts.push_back({r, dy.back().data(), ld_dy, x.back().data(), ld_x});
          for (int64_t i = 0; i < r; ++i, ++q) {
            for (int64_t j = 0; j < cs.m; ++j) {
              a[j * k + q] = dy.back()[i * ld_dy + j];
            }
            for (int64_t j = 0; j < cs.n; ++j) {
              b[q * cs.n + j] = x.back()[i * ld_x + j];
            }
          }
        }
        const std::vector<float> c0 = Values(rng, cs.m * ldc);
        const std::vector<float> want =
            Reference(cs.m, cs.n, k, a, k, false, b, cs.n, accumulate, c0, ldc);
        std::vector<float> chained = c0;
        ASSERT_TRUE(SgemmWeightGradient(cs.m, cs.n, parts, accumulate,
                                        chained.data(), ldc)
                        .ok());
        // Bitwise, padding between rows of C included.
        ASSERT_EQ(0, std::memcmp(chained.data(), want.data(), want.size() * 4))
            << "m=" << cs.m << " n=" << cs.n << " parts=" << parts.size()
            << " accumulate=" << accumulate;
        std::vector<float> one_by_one = c0;
        for (size_t i = 0; i < parts.size(); ++i) {
          ASSERT_TRUE(SgemmWeightGradient(cs.m, cs.n, {parts[i]},
                                          accumulate || i > 0,
                                          one_by_one.data(), ldc)
                          .ok());
        }
        ASSERT_EQ(0,
                  std::memcmp(one_by_one.data(), want.data(), want.size() * 4))
            << "one part a call: m=" << cs.m << " n=" << cs.n;
      }
    }
  });
}

TEST(SgemmWeightGradientTest, RejectsBadParts) {
  std::vector<float> v(64, 1.0f), c(64);
  GradientRows good{2, v.data(), 4, v.data(), 8};
  absl::Status st = SgemmWeightGradient(4, 8, {good, {-1}}, false, c.data(), 8);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("part 1: negative rows=-1"), std::string::npos)
      << st.message();
  st = SgemmWeightGradient(4, 8, {{2, v.data(), 3, v.data(), 8}}, false,
                           c.data(), 8);
  EXPECT_NE(st.message().find("part 0: leading dimension too small: ld_dy=3"),
            std::string::npos)
      << st.message();
  st = SgemmWeightGradient(4, 8, {{2, nullptr, 4, v.data(), 8}}, false,
                           c.data(), 8);
  EXPECT_NE(st.message().find("part 0: null dy or x"), std::string::npos)
      << st.message();
  st = SgemmWeightGradient(4, 8, {good}, false, c.data(), 7);
  EXPECT_NE(st.message().find("ldc=7 needs >= 8"), std::string::npos)
      << st.message();
  // No rows: C is zeroed, or kept when accumulating.
  std::fill(c.begin(), c.end(), 2.0f);
  ASSERT_TRUE(SgemmWeightGradient(4, 8, {}, true, c.data(), 8).ok());
  EXPECT_EQ(c[31], 2.0f);
  ASSERT_TRUE(SgemmWeightGradient(4, 8, {}, false, c.data(), 8).ok());
  EXPECT_EQ(c[31], 0.0f);
}

}  // namespace
}  // namespace trainyard
