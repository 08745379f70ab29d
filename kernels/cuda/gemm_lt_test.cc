// GemmLt against a float64 reference, every precision and transpose, odd
// sizes, with the bias and gelu_tanh-aux epilogues.
#include "kernels/cuda/gemm_lt.h"

#include <cmath>

#include "gtest/gtest.h"
#include "kernels/cuda/test_util.h"

namespace trainyard {
namespace gpu {
namespace {

using testing::Download;
using testing::Upload;

std::vector<double> RefGemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                            const std::vector<float>& a,
                            const std::vector<float>& b) {
  std::vector<double> c(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) {
        s += static_cast<double>(ta ? a[p * m + i] : a[i * k + p]) *
             (tb ? b[j * k + p] : b[p * n + j]);
      }
      c[i * n + j] = s;
    }
  }
  return c;
}

TEST(GemmLtTest, AllPrecisionsAndTransposesMatchReference) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto gemm = GemmLt::Create(0);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  Rng rng(41);
  for (GemmPrecision prec : {GemmPrecision::kFloat32, GemmPrecision::kTf32,
                             GemmPrecision::kBFloat16}) {
    const DataType in_t = prec == GemmPrecision::kBFloat16 ? DataType::kBFloat16
                                                           : DataType::kFloat32;
    const double tol = prec == GemmPrecision::kFloat32 ? testing::kFp32Tol
                       : prec == GemmPrecision::kTf32  ? testing::kTf32Tol
                                                       : testing::kBf16Tol;
    for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1},
                           {3, 17, 5},
                           {17, 33, 1009}}) {
      for (bool ta : {false, true}) {
        for (bool tb : {false, true}) {
          SCOPED_TRACE(::testing::Message()
                       << GemmPrecisionName(prec) << " " << m << "x" << n << "x"
                       << k << " ta=" << ta << " tb=" << tb);
          std::vector<float> a = testing::RandomFloats(&rng, m * k, 1);
          std::vector<float> b = testing::RandomFloats(&rng, k * n, 1);
          if (in_t == DataType::kBFloat16) {
            a = testing::RoundToBf16(a);
            b = testing::RoundToBf16(b);
          }
          DeviceBuffer da = Upload(a, in_t), db = Upload(b, in_t);
          DeviceBuffer dd = testing::Poisoned(m * n, DataType::kFloat32);
          GemmArgs g;
          g.trans_a = ta;
          g.trans_b = tb;
          g.m = m;
          g.n = n;
          g.k = k;
          g.precision = prec;
          g.a = da.data();
          g.lda = ta ? m : k;
          g.b = db.data();
          g.ldb = tb ? k : n;
          g.d = dd.data();
          g.ldd = n;
          absl::Status s = (*gemm)->Run(g, nullptr);
          ASSERT_TRUE(s.ok()) << s;
          // Error scale: sqrt(k) * |a||b| ~ sqrt(k); tolerance relative to it.
          EXPECT_TRUE(
              testing::AllClose("d", Download(dd, m * n, DataType::kFloat32),
                                RefGemm(ta, tb, m, n, k, a, b), tol,
                                tol * std::sqrt(static_cast<double>(k))));
        }
      }
    }
  }
}

TEST(GemmLtTest, GeluTanhAuxBiasEpilogueKeepsPreActivation) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto gemm = GemmLt::Create(0);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  Rng rng(42);
  const int64_t m = 17, n = 64, k = 32;  // aux ld must be a multiple of 8
  std::vector<float> a = testing::RandomFloats(&rng, m * k, 1);
  std::vector<float> b = testing::RandomFloats(&rng, n * k, 1);  // [n, k]
  std::vector<float> bias = testing::RandomFloats(&rng, n, 1);
  DeviceBuffer da = Upload(a, DataType::kFloat32),
               db = Upload(b, DataType::kFloat32),
               dbias = Upload(bias, DataType::kFloat32);
  DeviceBuffer dd = testing::Poisoned(m * n, DataType::kFloat32);
  DeviceBuffer aux = testing::Poisoned(m * n, DataType::kFloat32);
  GemmArgs g;
  g.trans_b = true;
  g.m = m;
  g.n = n;
  g.k = k;
  g.a = da.data();
  g.lda = k;
  g.b = db.data();
  g.ldb = k;
  g.d = dd.data();
  g.ldd = n;
  g.epilogue = GemmEpilogue::kGeluTanhAuxBias;
  g.bias = dbias.as<float>();
  g.aux = aux.data();
  g.ld_aux = n;
  absl::Status s = (*gemm)->Run(g, nullptr);
  ASSERT_TRUE(s.ok()) << s;
  std::vector<double> pre = RefGemm(false, true, m, n, k, a, b), act(m * n);
  for (int64_t i = 0; i < m * n; ++i) {
    pre[i] += bias[i % n];
    const double x = pre[i];
    act[i] = 0.5 * x *
             (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
  }
  EXPECT_TRUE(testing::AllClose("aux", Download(aux, m * n, DataType::kFloat32),
                                pre, 1e-5, 1e-5));
  EXPECT_TRUE(testing::AllClose("d", Download(dd, m * n, DataType::kFloat32),
                                act, 1e-4, 1e-5));
  EXPECT_EQ((*gemm)->cached_plans(), 1);
}

TEST(GemmLtTest, RejectsBadLeadingDimensionNamingIt) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto gemm = GemmLt::Create(0);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  DeviceBuffer buf = testing::Poisoned(64, DataType::kFloat32);
  GemmArgs g;
  g.m = g.n = g.k = 4;
  g.a = g.b = g.d = buf.data();
  g.lda = 2;
  g.ldb = g.ldd = 4;
  absl::Status s = (*gemm)->Run(g, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("lda"), std::string::npos) << s;
}

}  // namespace
}  // namespace gpu
}  // namespace trainyard
