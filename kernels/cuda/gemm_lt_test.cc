// GemmLt against a float64 reference, every precision and transpose, odd
// sizes, with the epilogues CudaMlpBlock uses (gelu_tanh aux, relu bitmask
// and their backward with bias gradient, BGRADB).
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
    const DType in_t =
        prec == GemmPrecision::kBFloat16 ? DType::kBFloat16 : DType::kFloat32;
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
          if (in_t == DType::kBFloat16) {
            a = testing::RoundToBf16(a);
            b = testing::RoundToBf16(b);
          }
          DeviceBuffer da = Upload(a, in_t), db = Upload(b, in_t);
          DeviceBuffer dd = testing::Poisoned(m * n, DType::kFloat32);
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
              testing::AllClose("d", Download(dd, m * n, DType::kFloat32),
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
  DeviceBuffer da = Upload(a, DType::kFloat32), db = Upload(b, DType::kFloat32),
               dbias = Upload(bias, DType::kFloat32);
  DeviceBuffer dd = testing::Poisoned(m * n, DType::kFloat32);
  DeviceBuffer aux = testing::Poisoned(m * n, DType::kFloat32);
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
  EXPECT_TRUE(testing::AllClose("aux", Download(aux, m * n, DType::kFloat32),
                                pre, 1e-5, 1e-5));
  EXPECT_TRUE(testing::AllClose("d", Download(dd, m * n, DType::kFloat32), act,
                                1e-4, 1e-5));
  EXPECT_EQ((*gemm)->cached_plans(), 1);
}

double GeluTanhGrad(double x) {
  const double k = 0.7978845608028654, u = k * (x + 0.044715 * x * x * x);
  const double t = std::tanh(u);
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
}

// Runs `g`; an Unimplemented answer (no algorithm on this GPU) skips the
// test with the reason, since CudaMlpBlock then falls back.
#define RUN_OR_SKIP(gemm, g)                                              \
  do {                                                                    \
    absl::Status _s = (gemm)->Run((g), nullptr);                          \
    if (_s.code() == absl::StatusCode::kUnimplemented) {                  \
      GTEST_SKIP() << "cuBLASLt has no algorithm here: " << _s.message(); \
    }                                                                     \
    ASSERT_TRUE(_s.ok()) << _s;                                           \
  } while (0)

// fc1's backward as CudaMlpBlock issues it: D [m, n] = A [m, k] B [k, n],
// times gelu_tanh'(aux), and the bias gradient = column sums of D.
TEST(GemmLtTest, DGeluTanhBiasGradEpilogueMatchesReference) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto gemm = GemmLt::Create(0);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  Rng rng(43);
  const int64_t m = 64, n = 256, k = 64;
  std::vector<float> a = testing::RandomFloats(&rng, m * k, 1);
  std::vector<float> b = testing::RandomFloats(&rng, k * n, 1);
  std::vector<float> pre = testing::RandomFloats(&rng, m * n, 2);
  DeviceBuffer da = Upload(a, DType::kFloat32), db = Upload(b, DType::kFloat32),
               daux = Upload(pre, DType::kFloat32);
  DeviceBuffer dd = testing::Poisoned(m * n, DType::kFloat32);
  DeviceBuffer dbias = testing::Poisoned(n, DType::kFloat32);
  GemmArgs g;
  g.m = m;
  g.n = n;
  g.k = k;
  g.a = da.data();
  g.lda = k;
  g.b = db.data();
  g.ldb = n;
  g.d = dd.data();
  g.ldd = n;
  g.epilogue = GemmEpilogue::kDGeluTanhBiasGrad;
  g.aux = daux.data();
  g.ld_aux = n;
  g.bias_grad = dbias.as<float>();
  RUN_OR_SKIP(*gemm, g);
  std::vector<double> d = RefGemm(false, false, m, n, k, a, b), col(n, 0.0);
  for (int64_t i = 0; i < m * n; ++i) {
    d[i] *= GeluTanhGrad(pre[i]);
    col[i % n] += d[i];
  }
  // TF32-level tolerance: cuBLASLt does not document its tanh evaluation.
  EXPECT_TRUE(testing::AllClose("d", Download(dd, m * n, DType::kFloat32), d,
                                testing::kTf32Tol, testing::kTf32Tol * 8));
  EXPECT_TRUE(testing::AllClose("bias_grad",
                                Download(dbias, n, DType::kFloat32), col,
                                testing::kTf32Tol, testing::kTf32Tol * 64));
}

// relu forward keeping cuBLASLt's bitmask, then the backward reading it.
TEST(GemmLtTest, ReluBitmaskRoundTripsThroughDReluBiasGrad) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto gemm = GemmLt::Create(0);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  Rng rng(44);
  const int64_t m = 64, n = 256, k = 64, ld_bits = 256;
  std::vector<float> a = testing::RandomFloats(&rng, m * k, 1);
  std::vector<float> w = testing::RandomFloats(&rng, n * k, 1);  // [n, k]
  std::vector<float> bias = testing::RandomFloats(&rng, n, 1);
  std::vector<float> g_in = testing::RandomFloats(&rng, m * k, 1);
  std::vector<float> w2 = testing::RandomFloats(&rng, k * n, 1);  // [k, n]
  DeviceBuffer da = Upload(a, DType::kFloat32), dw = Upload(w, DType::kFloat32),
               dbias = Upload(bias, DType::kFloat32),
               dg = Upload(g_in, DType::kFloat32),
               dw2 = Upload(w2, DType::kFloat32);
  DeviceBuffer act = testing::Poisoned(m * n, DType::kFloat32);
  absl::StatusOr<DeviceBuffer> mask =
      DeviceBuffer::Allocate(0, m * ld_bits / 8);
  ASSERT_TRUE(mask.ok()) << mask.status();
  GemmArgs f;
  f.trans_b = true;
  f.m = m;
  f.n = n;
  f.k = k;
  f.a = da.data();
  f.lda = k;
  f.b = dw.data();
  f.ldb = k;
  f.d = act.data();
  f.ldd = n;
  f.epilogue = GemmEpilogue::kReluAuxBias;
  f.bias = dbias.as<float>();
  f.aux = mask->data();
  f.ld_aux = ld_bits;
  RUN_OR_SKIP(*gemm, f);
  std::vector<double> pre = RefGemm(false, true, m, n, k, a, w), relu(m * n);
  for (int64_t i = 0; i < m * n; ++i) {
    pre[i] += bias[i % n];
    relu[i] = pre[i] > 0 ? pre[i] : 0;
  }
  const std::vector<float> relu_got = Download(act, m * n, DType::kFloat32);
  EXPECT_TRUE(
      testing::AllClose("relu", relu_got, relu, testing::kFp32Tol, 1e-4));
  DeviceBuffer dd = testing::Poisoned(m * n, DType::kFloat32);
  DeviceBuffer dbg = testing::Poisoned(n, DType::kFloat32);
  GemmArgs bwd;
  bwd.m = m;
  bwd.n = n;
  bwd.k = k;
  bwd.a = dg.data();
  bwd.lda = k;
  bwd.b = dw2.data();
  bwd.ldb = n;
  bwd.d = dd.data();
  bwd.ldd = n;
  bwd.epilogue = GemmEpilogue::kDReluBiasGrad;
  bwd.aux = mask->data();
  bwd.ld_aux = ld_bits;
  bwd.bias_grad = dbg.as<float>();
  RUN_OR_SKIP(*gemm, bwd);
  std::vector<double> d = RefGemm(false, false, m, n, k, g_in, w2), col(n, 0);
  for (int64_t i = 0; i < m * n; ++i) {
    // The mask the forward kept (an element within rounding of 0 may go
    // either way against the float64 reference).
    d[i] = relu_got[i] > 0 ? d[i] : 0;
    col[i % n] += d[i];
  }
  EXPECT_TRUE(testing::AllClose("d", Download(dd, m * n, DType::kFloat32), d,
                                testing::kFp32Tol, 1e-4));
  EXPECT_TRUE(testing::AllClose("bias_grad", Download(dbg, n, DType::kFloat32),
                                col, testing::kFp32Tol, 1e-3));
}

// A weight gradient with its bias gradient (BGRADB), accumulating into the
// weight gradient (beta = 1) as BackwardWeight does.
TEST(GemmLtTest, BiasGradAEpilogueSumsRowsOfA) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto gemm = GemmLt::Create(0);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  Rng rng(45);
  const int64_t m = 64, n = 256, k = 96;  // dW [m, n] = dY^T [m, k] X [k, n]
  std::vector<float> dy = testing::RandomFloats(&rng, k * m, 1);  // [k, m]
  std::vector<float> x = testing::RandomFloats(&rng, k * n, 1);
  std::vector<float> w0 = testing::RandomFloats(&rng, m * n, 1);
  DeviceBuffer ddy = Upload(dy, DType::kFloat32),
               dx = Upload(x, DType::kFloat32),
               dw = Upload(w0, DType::kFloat32);
  DeviceBuffer dbg = testing::Poisoned(m, DType::kFloat32);
  GemmArgs g;
  g.trans_a = true;
  g.m = m;
  g.n = n;
  g.k = k;
  g.a = ddy.data();
  g.lda = m;
  g.b = dx.data();
  g.ldb = n;
  g.beta = 1.0f;
  g.c = dw.data();
  g.ldc = n;
  g.d = dw.data();
  g.ldd = n;
  g.epilogue = GemmEpilogue::kBiasGradA;
  g.bias_grad = dbg.as<float>();
  RUN_OR_SKIP(*gemm, g);
  std::vector<double> want = RefGemm(true, false, m, n, k, dy, x), col(m, 0);
  for (int64_t i = 0; i < m * n; ++i) want[i] += w0[i];
  for (int64_t r = 0; r < k; ++r) {
    for (int64_t j = 0; j < m; ++j) col[j] += dy[r * m + j];
  }
  EXPECT_TRUE(testing::AllClose("d", Download(dw, m * n, DType::kFloat32), want,
                                testing::kFp32Tol, 1e-4));
  EXPECT_TRUE(testing::AllClose("bias_grad", Download(dbg, m, DType::kFloat32),
                                col, testing::kFp32Tol, 1e-4));
}

TEST(GemmLtTest, AuxLdOffTheRuleIsUnimplemented) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto gemm = GemmLt::Create(0);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  DeviceBuffer buf = testing::Poisoned(64 * 64, DType::kFloat32);
  GemmArgs g;
  g.trans_b = true;
  g.m = 4;
  g.n = g.k = 33;
  g.a = g.b = g.d = g.aux = buf.data();
  g.lda = g.ldb = g.ldd = g.ld_aux = 33;
  g.bias = buf.as<float>();
  g.epilogue = GemmEpilogue::kGeluTanhAuxBias;
  absl::Status s = (*gemm)->Run(g, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_NE(s.message().find("multiple of 8"), std::string::npos) << s;
  g.epilogue = GemmEpilogue::kReluAuxBias;
  g.ld_aux = 64;
  s = (*gemm)->Run(g, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_NE(s.message().find("multiple of 128"), std::string::npos) << s;
  EXPECT_EQ((*gemm)->cached_plans(), 0);
}

TEST(GemmLtTest, RejectsUnsupportedOutputDType) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto gemm = GemmLt::Create(0);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  DeviceBuffer buf = testing::Poisoned(64, DType::kFloat32);
  GemmArgs g;
  g.m = g.n = g.k = 4;
  g.a = g.b = g.d = buf.data();
  g.lda = g.ldb = g.ldd = 4;
  g.d_type = DType::kInt32;
  absl::Status s = (*gemm)->Run(g, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("d_type int32 is not supported"),
            std::string::npos)
      << s;
}

TEST(GemmLtTest, RejectsBadLeadingDimensionNamingIt) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto gemm = GemmLt::Create(0);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  DeviceBuffer buf = testing::Poisoned(64, DType::kFloat32);
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
