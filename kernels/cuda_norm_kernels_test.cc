// Device LayerNorm/RMSNorm against the CPU kernels (kernels/norm.h).
#include "gtest/gtest.h"
#include "kernels/cuda/norm_kernels.h"
#include "kernels/cuda/test_util.h"
#include "kernels/norm.h"

namespace trainyard {
namespace gpu {
namespace {

using testing::Download;
using testing::Poisoned;
using testing::Upload;
constexpr DType kF = DType::kFloat32;

std::vector<double> D(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

TEST(NormKernelsTest, LayerNormAndRmsNormMatchCpu) {
  SKIP_WITHOUT_CUDA_DEVICE();
  Rng rng(11);
  for (DType t : {DType::kFloat32, DType::kBFloat16}) {
    const double tol = t == kF ? testing::kFp32Tol : testing::kBf16Tol;
    for (auto [rows, cols] :
         {std::pair<int64_t, int64_t>{1, 1}, {3, 17}, {17, 1009}}) {
      for (bool rms : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << (rms ? "rms " : "ln ") << DTypeName(t) << " " << rows
                     << "x" << cols);
        std::vector<float> x = testing::RandomFloats(&rng, rows * cols, 1);
        std::vector<float> dy = testing::RandomFloats(&rng, rows * cols, 1);
        if (t != kF) {
          x = testing::RoundToBf16(x);
          dy = testing::RoundToBf16(dy);
        }
        std::vector<float> w = testing::RandomFloats(&rng, cols, 1);
        std::vector<float> b = testing::RandomFloats(&rng, cols, 1);
        std::vector<float> res =
            testing::RoundToBf16(testing::RandomFloats(&rng, rows * cols, 1));
        DeviceBuffer dx_in = Upload(x, t), d_dy = Upload(dy, t),
                     d_w = Upload(w, kF), d_b = Upload(b, kF),
                     d_res = Upload(res, t);
        DeviceBuffer y = Poisoned(rows * cols, t), mean = Poisoned(rows, kF),
                     rstd = Poisoned(rows, kF), dx = Poisoned(rows * cols, t),
                     dw = Poisoned(cols, kF), db = Poisoned(cols, kF);
        std::vector<float> cy(rows * cols), cmean(rows), crstd(rows),
            cdx(rows * cols), cdw(cols), cdb(cols);
        DeviceBuffer ws =
            *DeviceBuffer::Allocate(0, NormParamsWorkspaceBytes(rows, cols));
        if (rms) {
          ASSERT_TRUE(RmsNormForward(t, rows, cols, dx_in.data(),
                                     d_w.as<float>(), 1e-5f, y.data(),
                                     rstd.as<float>(), nullptr)
                          .ok());
          ASSERT_TRUE(RmsNormBackwardInput(t, rows, cols, dx_in.data(),
                                           d_w.as<float>(), rstd.as<float>(),
                                           d_dy.data(), d_res.data(), dx.data(),
                                           nullptr)
                          .ok());
          ASSERT_TRUE(RmsNormBackwardParams(t, rows, cols, dx_in.data(),
                                            rstd.as<float>(), d_dy.data(),
                                            false, dw.as<float>(), ws.data(),
                                            nullptr)
                          .ok());
          ::trainyard::RmsNormForward(rows, cols, x.data(), w.data(), 1e-5f,
                                      cy.data(), crstd.data());
          ::trainyard::RmsNormBackwardInput(rows, cols, x.data(), w.data(),
                                            crstd.data(), dy.data(), res.data(),
                                            cdx.data());
          ::trainyard::RmsNormBackwardParams(rows, cols, x.data(), crstd.data(),
                                             dy.data(), false, cdw.data());
        } else {
          ASSERT_TRUE(LayerNormForward(t, rows, cols, dx_in.data(),
                                       d_w.as<float>(), d_b.as<float>(), 1e-5f,
                                       y.data(), mean.as<float>(),
                                       rstd.as<float>(), nullptr)
                          .ok());
          ASSERT_TRUE(LayerNormBackwardInput(t, rows, cols, dx_in.data(),
                                             d_w.as<float>(), mean.as<float>(),
                                             rstd.as<float>(), d_dy.data(),
                                             d_res.data(), dx.data(), nullptr)
                          .ok());
          ASSERT_TRUE(LayerNormBackwardParams(
                          t, rows, cols, dx_in.data(), mean.as<float>(),
                          rstd.as<float>(), d_dy.data(), false, dw.as<float>(),
                          db.as<float>(), ws.data(), nullptr)
                          .ok());
          ::trainyard::LayerNormForward(rows, cols, x.data(), w.data(),
                                        b.data(), 1e-5f, cy.data(),
                                        cmean.data(), crstd.data());
          ::trainyard::LayerNormBackwardInput(
              rows, cols, x.data(), w.data(), cmean.data(), crstd.data(),
              dy.data(), res.data(), cdx.data());
          ::trainyard::LayerNormBackwardParams(
              rows, cols, x.data(), cmean.data(), crstd.data(), dy.data(),
              false, cdw.data(), cdb.data());
          EXPECT_TRUE(testing::AllClose("db", Download(db, cols, kF), D(cdb),
                                        tol, tol));
        }
        EXPECT_TRUE(testing::AllClose("y", Download(y, rows * cols, t), D(cy),
                                      tol, tol));
        EXPECT_TRUE(testing::AllClose("dx", Download(dx, rows * cols, t),
                                      D(cdx), tol, tol));
        EXPECT_TRUE(
            testing::AllClose("dw", Download(dw, cols, kF), D(cdw), tol, tol));
      }
    }
  }
}

}  // namespace
}  // namespace gpu
}  // namespace trainyard
