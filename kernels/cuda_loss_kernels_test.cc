// The device losses against their CPU twins (kernels/losses.h), which the
// plugins' host and simulated-device paths use: the same slots (the
// device's sums in another order: equal to 1e-12 relative) and the same
// weighted gradients (to the rounding of one float32 in the log-sum-exp).
#include <cmath>
#include <cstring>
#include <vector>

#include "core/bfloat16.h"
#include "gtest/gtest.h"
#include "kernels/cuda/loss_kernels.h"
#include "kernels/cuda/test_util.h"
#include "kernels/losses.h"

namespace trainyard {
namespace gpu {
namespace {

using testing::Download;
using testing::Upload;

// ||got - want|| / ||want||; 0 when both are zero.
double NormRel(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

struct Case {
  int64_t rows, cols;
};

// The CPU's weighted gradient of `x` (rounded through dtype) as floats.
std::vector<float> Widen(const std::vector<uint16_t>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = Bf16ToFloat(v[i]);
  return out;
}

// Runs `cpu` on host copies and `gpu_loss` on device copies of logits `x`
// (rounded to dtype) and compares slots and gradients.
template <typename Cpu, typename Gpu>
void Compare(const char* what, DType dtype, int64_t rows, int64_t cols,
             std::vector<float> x, int num_slots, Cpu cpu, Gpu gpu_loss,
             size_t ws_bytes, double grad_tol) {
  SCOPED_TRACE(::testing::Message() << what << " " << DTypeName(dtype) << " "
                                    << rows << "x" << cols);
  const int64_t n = rows * cols;
  if (dtype == DType::kBFloat16) x = testing::RoundToBf16(x);
  // CPU, on the same (rounded) values in the same dtype.
  std::vector<double> want(num_slots);
  std::vector<float> want_grad(n);
  if (dtype == DType::kFloat32) {
    cpu(losses::Output{dtype, rows, cols, x.data(), want_grad.data(), true},
        want.data());
  } else {
    std::vector<uint16_t> xb(n), gb(n);
    for (int64_t i = 0; i < n; ++i) xb[i] = FloatToBf16(x[i]);
    cpu(losses::Output{dtype, rows, cols, xb.data(), gb.data(), true},
        want.data());
    want_grad = Widen(gb);
  }
  DeviceBuffer d_x = Upload(x, dtype);
  DeviceBuffer grad = testing::Poisoned(n, dtype);
  DeviceBuffer ws = *DeviceBuffer::Allocate(0, ws_bytes);
  DeviceBuffer slots = *DeviceBuffer::Allocate(0, num_slots * sizeof(double));
  ASSERT_TRUE(slots.Fill(0).ok());
  ASSERT_TRUE(
      gpu_loss(losses::Output{dtype, rows, cols, d_x.data(), grad.data(), true},
               ws.data(), slots.as<double>())
          .ok());
  std::vector<double> got(num_slots);
  ASSERT_TRUE(slots.CopyToHost(got.data(), num_slots * sizeof(double)).ok());
  for (int k = 0; k < num_slots; ++k) {
    EXPECT_NEAR(got[k], want[k], 1e-12 * (1 + std::fabs(want[k])))
        << "slot " << k;
  }
  EXPECT_LE(NormRel(Download(grad, n, dtype), want_grad), grad_tol);
}

TEST(LossKernelsTest, MseMatchesTheCpu) {
  SKIP_WITHOUT_CUDA_DEVICE();
  Rng rng(31);
  for (Case c : {Case{1, 1}, Case{17, 3}, Case{1009, 5}, Case{64, 4096}}) {
    std::vector<float> o = testing::RandomFloats(&rng, c.rows * c.cols, 1);
    std::vector<float> y = testing::RandomFloats(&rng, c.rows * c.cols, 1);
    DeviceBuffer d_y = Upload(y, DType::kFloat32);
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      Compare(
          "mse", dtype, c.rows, c.cols, o, losses::kMseSlots,
          [&](const losses::Output& out, double* s) {
            losses::Mse(out, y.data(), s);
          },
          [&](const losses::Output& out, void* ws, double* s) {
            return MseLoss(out, d_y.as<float>(), ws, s, nullptr);
          },
          MseWorkspaceBytes(c.rows, c.cols), 0.0);  // elementwise: exact
    }
  }
}

TEST(LossKernelsTest, ClassifiersMatchTheCpu) {
  SKIP_WITHOUT_CUDA_DEVICE();
  Rng rng(32);
  for (Case c : {Case{1, 1}, Case{17, 3}, Case{33, 1009}, Case{4099, 10}}) {
    std::vector<float> x = testing::RandomFloats(&rng, c.rows * c.cols, 3);
    std::vector<float> teacher =
        testing::RandomFloats(&rng, c.rows * c.cols, 3);
    std::vector<int32_t> labels(c.rows);
    for (int64_t i = 0; i < c.rows; ++i) {
      labels[i] = i % 5 == 4 ? -100 : static_cast<int32_t>(rng.Below(c.cols));
    }
    DeviceBuffer d_l = *DeviceBuffer::Allocate(0, c.rows * 4);
    ASSERT_TRUE(d_l.CopyFromHost(labels.data(), c.rows * 4).ok());
    DeviceBuffer d_t = Upload(teacher, DType::kFloat32);
    const losses::Labels l{DType::kInt32, labels.data(), -100};
    const losses::Labels d_labels{DType::kInt32, d_l.data(), -100};
    const size_t ws = ClassifierWorkspaceBytes(c.rows, c.cols);
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      const double tol = dtype == DType::kFloat32 ? 1e-6 : 4e-3;
      Compare(
          "cross_entropy", dtype, c.rows, c.cols, x, losses::kCrossEntropySlots,
          [&](const losses::Output& out, double* s) {
            losses::CrossEntropy(out, l, 0.1, s);
          },
          [&](const losses::Output& out, void* w, double* s) {
            return CrossEntropyLoss(out, d_labels, 0.1, w, s, nullptr);
          },
          ws, tol);
      Compare(
          "distillation", dtype, c.rows, c.cols, x, losses::kDistillationSlots,
          [&](const losses::Output& out, double* s) {
            losses::Distillation(out, teacher.data(), l, 2.0, 0.7, s);
          },
          [&](const losses::Output& out, void* w, double* s) {
            return DistillationLoss(out, d_t.as<float>(), d_labels, 2.0, 0.7, w,
                                    s, nullptr);
          },
          ws, tol);
    }
  }
}

TEST(LossKernelsTest, ABadLabelFillsTheBadSlotsOnly) {
  SKIP_WITHOUT_CUDA_DEVICE();
  std::vector<float> x(4 * 3, 0.5f);
  std::vector<int64_t> labels = {0, 7, 2, -3};
  DeviceBuffer d_x = Upload(x, DType::kFloat32);
  DeviceBuffer d_l = *DeviceBuffer::Allocate(0, 4 * 8);
  ASSERT_TRUE(d_l.CopyFromHost(labels.data(), 4 * 8).ok());
  DeviceBuffer ws = *DeviceBuffer::Allocate(0, ClassifierWorkspaceBytes(4, 3));
  DeviceBuffer slots =
      *DeviceBuffer::Allocate(0, losses::kCrossEntropySlots * sizeof(double));
  ASSERT_TRUE(slots.Fill(0).ok());
  ASSERT_TRUE(CrossEntropyLoss({DType::kFloat32, 4, 3, d_x.data(), nullptr},
                               {DType::kInt64, d_l.data(), -100}, 0.0,
                               ws.data(), slots.as<double>(), nullptr)
                  .ok());
  double got[losses::kCrossEntropySlots];
  ASSERT_TRUE(slots.CopyToHost(got, sizeof(got)).ok());
  EXPECT_EQ(got[2], 2);  // 1 + row 1
  EXPECT_EQ(got[3], 7);
  EXPECT_EQ(got[0], 0);
  EXPECT_EQ(got[1], 0);
}

}  // namespace
}  // namespace gpu
}  // namespace trainyard
