// Device MSE and softmax cross-entropy against float64 references written
// from the task plugins' formulas (task_plugins/mse.cc, cross_entropy.cc).
#include "kernels/cuda/loss_kernels.h"

#include <cmath>

#include "gtest/gtest.h"
#include "kernels/cuda/test_util.h"

namespace trainyard {
namespace gpu {
namespace {

using testing::Download;
using testing::Upload;
constexpr DType kF = DType::kFloat32;

TEST(LossKernelsTest, MseMatchesReference) {
  SKIP_WITHOUT_CUDA_DEVICE();
  Rng rng(31);
  for (auto [rows, cols] :
       {std::pair<int64_t, int64_t>{1, 1}, {17, 3}, {1009, 5}}) {
    const int64_t n = rows * cols;
    std::vector<float> o = testing::RandomFloats(&rng, n, 1);
    std::vector<float> y = testing::RandomFloats(&rng, n, 1);
    DeviceBuffer d_o = Upload(o, kF), d_y = Upload(y, kF);
    DeviceBuffer grad = testing::Poisoned(n, kF);
    DeviceBuffer ws = *DeviceBuffer::Allocate(0, LossWorkspaceBytes(rows));
    DeviceBuffer res = *DeviceBuffer::Allocate(0, sizeof(LossResult));
    ASSERT_TRUE(MseLoss(rows, cols, d_o.as<float>(), d_y.as<float>(),
                        grad.as<float>(), ws.data(), res.as<LossResult>(),
                        nullptr)
                    .ok());
    LossResult r;
    ASSERT_TRUE(res.CopyToHost(&r, sizeof(r)).ok());
    double sum = 0;
    std::vector<double> g(n);
    for (int64_t i = 0; i < n; ++i) {
      const double d = static_cast<double>(o[i]) - y[i];
      sum += d * d;
      g[i] = static_cast<float>(2.0 * d / n);
    }
    EXPECT_NEAR(r.loss, sum / n, 1e-12 * sum / n);
    EXPECT_EQ(r.loss_weight, rows);
    EXPECT_TRUE(
        testing::AllClose("mse grad", Download(grad, n, kF), g, 1e-6, 0));
  }
}

TEST(LossKernelsTest, CrossEntropyWithIgnoreAndSmoothingMatchesReference) {
  SKIP_WITHOUT_CUDA_DEVICE();
  Rng rng(32);
  for (auto [rows, classes] :
       {std::pair<int64_t, int64_t>{1, 1}, {17, 3}, {33, 1009}}) {
    for (double eps : {0.0, 0.1}) {
      std::vector<float> x = testing::RandomFloats(&rng, rows * classes, 3);
      std::vector<int64_t> labels(rows);
      for (int64_t i = 0; i < rows; ++i) {
        labels[i] =
            (i % 5 == 4) ? -100 : static_cast<int64_t>(rng.Below(classes));
      }
      DeviceBuffer d_x = Upload(x, kF);
      DeviceBuffer d_l = *DeviceBuffer::Allocate(0, rows * 8);
      ASSERT_TRUE(d_l.CopyFromHost(labels.data(), rows * 8).ok());
      DeviceBuffer grad = testing::Poisoned(rows * classes, kF);
      DeviceBuffer ws = *DeviceBuffer::Allocate(0, LossWorkspaceBytes(rows));
      DeviceBuffer res = *DeviceBuffer::Allocate(0, sizeof(LossResult));
      ASSERT_TRUE(SoftmaxCrossEntropyLoss(rows, classes, d_x.as<float>(),
                                          d_l.as<int64_t>(), -100, eps,
                                          grad.as<float>(), ws.data(),
                                          res.as<LossResult>(), nullptr)
                      .ok());
      LossResult r;
      ASSERT_TRUE(res.CopyToHost(&r, sizeof(r)).ok());
      int64_t n = 0, correct = 0;
      for (int64_t y : labels) n += y != -100;
      double sum = 0;
      std::vector<double> g(rows * classes, 0.0);
      for (int64_t i = 0; i < rows; ++i) {
        if (labels[i] == -100) continue;
        const float* row = x.data() + i * classes;
        double mx = row[0];
        int64_t arg = 0;
        for (int64_t k = 1; k < classes; ++k) {
          if (row[k] > mx) {
            mx = row[k];
            arg = k;
          }
        }
        double se = 0;
        for (int64_t k = 0; k < classes; ++k) se += std::exp(row[k] - mx);
        const double lse = mx + std::log(se);
        double smooth = 0;
        for (int64_t k = 0; k < classes; ++k) smooth += lse - row[k];
        sum += (1 - eps) * (lse - row[labels[i]]) + eps * smooth / classes;
        correct += arg == labels[i];
        for (int64_t k = 0; k < classes; ++k) {
          const double t = (k == labels[i] ? 1 - eps : 0.0) + eps / classes;
          g[i * classes + k] = (std::exp(row[k] - lse) - t) / n;
        }
      }
      EXPECT_EQ(r.loss_weight, n);
      EXPECT_EQ(r.correct, correct);
      EXPECT_EQ(r.bad_row, -1);
      EXPECT_NEAR(r.loss, n ? sum / n : 0.0, 1e-9 * (1 + std::fabs(sum / n)));
      EXPECT_TRUE(testing::AllClose("xent grad",
                                    Download(grad, rows * classes, kF), g,
                                    testing::kFp32Tol, 1e-7));
    }
  }
}

TEST(LossKernelsTest, CrossEntropyReportsFirstBadLabel) {
  SKIP_WITHOUT_CUDA_DEVICE();
  std::vector<float> x(4 * 3, 0.5f);
  std::vector<int64_t> labels = {0, 7, 2, -3};
  DeviceBuffer d_x = Upload(x, kF);
  DeviceBuffer d_l = *DeviceBuffer::Allocate(0, 4 * 8);
  ASSERT_TRUE(d_l.CopyFromHost(labels.data(), 4 * 8).ok());
  DeviceBuffer ws = *DeviceBuffer::Allocate(0, LossWorkspaceBytes(4));
  DeviceBuffer res = *DeviceBuffer::Allocate(0, sizeof(LossResult));
  ASSERT_TRUE(SoftmaxCrossEntropyLoss(4, 3, d_x.as<float>(), d_l.as<int64_t>(),
                                      -100, 0.0, nullptr, ws.data(),
                                      res.as<LossResult>(), nullptr)
                  .ok());
  LossResult r;
  ASSERT_TRUE(res.CopyToHost(&r, sizeof(r)).ok());
  EXPECT_EQ(r.bad_row, 1);
}

}  // namespace
}  // namespace gpu
}  // namespace trainyard
