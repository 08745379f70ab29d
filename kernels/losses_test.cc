#include "kernels/losses.h"

#include <cmath>
#include <vector>

#include "core/bfloat16.h"
#include "core/random.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace losses {
namespace {

std::vector<float> Random(Rng* rng, int64_t n, float scale) {
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(rng->Normal() * scale);
  return v;
}

std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = FloatToBf16(v[i]);
  return out;
}

TEST(LossesTest, MseSlotsAndGradientMatchTheFormula) {
  Rng rng(1);
  const int64_t rows = 7, cols = 5, n = rows * cols;
  std::vector<float> o = Random(&rng, n, 1), y = Random(&rng, n, 1);
  std::vector<float> g(n);
  Output out{DType::kFloat32, rows, cols, o.data(), g.data(), false};
  double slots[kMseSlots];
  Mse(out, y.data(), slots);
  long double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    const long double d = static_cast<long double>(o[i]) - y[i];
    sum += d * d;
    EXPECT_EQ(g[i], static_cast<float>(2.0 * static_cast<double>(d) / n));
  }
  EXPECT_EQ(slots[0], rows);
  EXPECT_NEAR(slots[1], rows * static_cast<double>(sum) / n, 1e-12);
  EXPECT_EQ(slots[2], 0);
  EXPECT_NEAR(slots[4], static_cast<double>(sum), 1e-12);
  EXPECT_EQ(slots[5], n);
}

// A v2 gradient is the v1 gradient as the engine scales and casts it.
TEST(LossesTest, WeightedGradientIsTheEnginesScalingOfTheHostGradient) {
  Rng rng(2);
  const int64_t rows = 9, classes = 4, n = rows * classes;
  std::vector<float> x = Random(&rng, n, 2);
  std::vector<int64_t> labels = {0, 1, 2, 3, -100, 1, 0, 3, 2};
  Labels l{DType::kInt64, labels.data(), -100};
  std::vector<float> host(n);
  double s1[kCrossEntropySlots], s2[kCrossEntropySlots];
  CrossEntropy({DType::kFloat32, rows, classes, x.data(), host.data(), false},
               l, 0.1, s1);
  std::vector<uint16_t> xb = ToBf16(x);
  std::vector<float> x_rounded(n);
  for (int64_t i = 0; i < n; ++i) x_rounded[i] = Bf16ToFloat(xb[i]);
  // The host gradient of the bf16 logits, and the weighted bf16 one.
  CrossEntropy(
      {DType::kFloat32, rows, classes, x_rounded.data(), host.data(), false}, l,
      0.1, s1);
  std::vector<uint16_t> dev(n);
  CrossEntropy({DType::kBFloat16, rows, classes, xb.data(), dev.data(), true},
               l, 0.1, s2);
  const float w = static_cast<float>(s1[0]);
  EXPECT_EQ(w, 8.0f);  // one row ignored
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(dev[i], FloatToBf16(host[i] * w)) << i;
  }
  for (int k = 0; k < kCrossEntropySlots; ++k) EXPECT_EQ(s1[k], s2[k]) << k;
  // The ignored row's gradient is zero.
  for (int64_t k = 0; k < classes; ++k) EXPECT_EQ(dev[4 * classes + k], 0);
}

TEST(LossesTest, CrossEntropyGradientIsTheLossDerivative) {
  Rng rng(3);
  const int64_t rows = 3, classes = 6;
  std::vector<float> x = Random(&rng, rows * classes, 1);
  std::vector<int32_t> labels = {2, 5, 0};
  Labels l{DType::kInt32, labels.data(), -100};
  std::vector<float> g(rows * classes);
  double slots[kCrossEntropySlots];
  CrossEntropy({DType::kFloat32, rows, classes, x.data(), g.data(), false}, l,
               0.2, slots);
  auto loss_at = [&](int64_t i, float delta) {
    std::vector<float> p = x;
    p[i] += delta;
    double s[kCrossEntropySlots];
    CrossEntropy({DType::kFloat32, rows, classes, p.data(), nullptr, false}, l,
                 0.2, s);
    return s[1] / s[0];
  };
  for (int64_t i : {0, 7, 17}) {
    const float h = 1e-2f;
    const double fd = (loss_at(i, h) - loss_at(i, -h)) / (2 * h);
    EXPECT_NEAR(g[i], fd, 1e-4) << i;
  }
  EXPECT_EQ(slots[0], 3);
}

TEST(LossesTest, ABadLabelIsReportedInTheSlotsAndStopsTheLoss) {
  std::vector<float> x(4 * 3, 0.5f);
  std::vector<int64_t> labels = {1, -100, 3, 7};
  Labels l{DType::kInt64, labels.data(), -100};
  double slots[kDistillationSlots];
  Distillation({DType::kFloat32, 4, 3, x.data(), nullptr, false}, x.data(), l,
               2.0, 0.5, slots);
  EXPECT_EQ(slots[2], 3);  // 1 + row 2
  EXPECT_EQ(slots[3], 3);  // its label
  EXPECT_EQ(slots[0], 0);
  EXPECT_EQ(slots[1], 0);
}

TEST(LossesTest, DistillationAgainstItselfLeavesOnlyTheHardLabelLoss) {
  Rng rng(4);
  const int64_t rows = 5, classes = 7;
  std::vector<float> x = Random(&rng, rows * classes, 1);
  std::vector<int64_t> labels = {0, 6, 3, 3, 1};
  Labels l{DType::kInt64, labels.data(), -100};
  double d[kDistillationSlots], ce[kCrossEntropySlots];
  Distillation({DType::kFloat32, rows, classes, x.data(), nullptr, false},
               x.data(), l, 3.0, 0.25, d);
  CrossEntropy({DType::kFloat32, rows, classes, x.data(), nullptr, false}, l,
               0.0, ce);
  EXPECT_NEAR(d[4], 0.0, 1e-12);  // KL(p || p)
  EXPECT_NEAR(d[5], ce[4], 1e-12);
  EXPECT_NEAR(d[1], 0.75 * ce[1], 1e-12);
  EXPECT_EQ(d[6], ce[5]);
}

}  // namespace
}  // namespace losses
}  // namespace trainyard
