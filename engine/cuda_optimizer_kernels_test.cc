// Fused device AdamW/SGD against engine/optimizer.cc's StageOptimizer (bit
// for bit: same operation order, IEEE-rounded, no FMA), and the device sums
// of squares against a float64 reference.
#include <cstring>

#include "engine/optimizer.h"
#include "gtest/gtest.h"
#include "kernels/cuda/optimizer_kernels.h"
#include "kernels/cuda/test_util.h"

namespace trainyard {
namespace gpu {
namespace {

using testing::Download;
using testing::Upload;
constexpr DType kF = DType::kFloat32;

// Offsets that leave every alignment of 4 floats, and a segment large
// enough for several blocks of the sums of squares.
std::vector<ParamSegment> CpuSegments() {
  return {{"a", {1}, 0, true},
          {"b", {17, 3}, 1, false},
          {"c", {5000}, 52, true},
          {"d", {1009}, 5052, false},
          {"e", {100003}, 6061, true}};
}
// The CPU optimizer and the kernels take the same segments.
std::vector<ParamSegment> GpuSegments() { return CpuSegments(); }
constexpr int64_t kTotal = 106064;

void ExpectBitwiseEqual(const char* what, const std::vector<float>& a,
                        const float* b) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], 4) != 0) {
      ADD_FAILURE() << what << "[" << i << "]: device " << a[i] << ", cpu "
                    << b[i];
      return;
    }
  }
}

TEST(OptimizerKernelsTest, AdamWMatchesStageOptimizerBitwise) {
  SKIP_WITHOUT_CUDA_DEVICE();
  trainyard::v1::OptimizerSpec spec;
  spec.set_type("adamw");
  spec.set_lr(3e-3);
  spec.set_beta1(0.9);
  spec.set_beta2(0.95);
  spec.set_eps(1e-8);
  spec.set_weight_decay(0.1);
  absl::StatusOr<StageOptimizer> cpu =
      StageOptimizer::Create(spec, CpuSegments(), kTotal);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  Rng rng(21);
  std::vector<float> p = testing::RandomFloats(&rng, kTotal, 1);
  std::vector<float> zeros(kTotal, 0.0f);
  DeviceBuffer dp = Upload(p, kF), m = Upload(zeros, kF), v = Upload(zeros, kF);
  DeviceBuffer p16 = testing::Poisoned(kTotal, DType::kBFloat16);
  for (int step = 1; step <= 3; ++step) {
    std::vector<float> g = testing::RandomFloats(&rng, kTotal, 1);
    DeviceBuffer dg = Upload(g, kF);
    const double scale = 0.37;
    cpu->Step(p.data(), g.data(), spec.lr(), scale);
    AdamWStep hp;
    hp.lr = spec.lr();
    hp.beta1 = 0.9;
    hp.beta2 = 0.95;
    hp.eps = 1e-8;
    hp.weight_decay = 0.1;
    hp.step = step;
    hp.grad_scale = scale;
    ASSERT_TRUE(FusedAdamW(GpuSegments(), hp, dp.as<float>(), dg.as<float>(),
                           m.as<float>(), v.as<float>(), p16.data(), nullptr)
                    .ok());
  }
  std::vector<float> got = Download(dp, kTotal, kF);
  ExpectBitwiseEqual("params", got, p.data());
  std::vector<float> got16 = Download(p16, kTotal, DType::kBFloat16);
  EXPECT_EQ(got16, testing::RoundToBf16(p));
}

TEST(OptimizerKernelsTest, SgdNesterovMatchesStageOptimizerBitwise) {
  SKIP_WITHOUT_CUDA_DEVICE();
  trainyard::v1::OptimizerSpec spec;
  spec.set_type("sgd");
  spec.set_lr(0.05);
  spec.set_momentum(0.9);
  spec.set_dampening(0.0);
  spec.set_nesterov(true);
  spec.set_weight_decay(1e-3);
  absl::StatusOr<StageOptimizer> cpu =
      StageOptimizer::Create(spec, CpuSegments(), kTotal);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  Rng rng(22);
  std::vector<float> p = testing::RandomFloats(&rng, kTotal, 1);
  DeviceBuffer dp = Upload(p, kF);
  DeviceBuffer buf = testing::Poisoned(kTotal, kF);  // first step overwrites
  for (int step = 1; step <= 3; ++step) {
    std::vector<float> g = testing::RandomFloats(&rng, kTotal, 1);
    DeviceBuffer dg = Upload(g, kF);
    cpu->Step(p.data(), g.data(), spec.lr(), 1.5);
    SgdStep hp;
    hp.lr = 0.05;
    hp.momentum = 0.9;
    hp.nesterov = true;
    hp.weight_decay = 1e-3;
    hp.first_step = step == 1;
    hp.grad_scale = 1.5;
    ASSERT_TRUE(FusedSgd(GpuSegments(), hp, dp.as<float>(), dg.as<float>(),
                         buf.as<float>(), nullptr, nullptr)
                    .ok());
  }
  ExpectBitwiseEqual("params", Download(dp, kTotal, kF), p.data());
}

// The scale a device step computed (core/step_totals.h), read on the
// device: the same update as the scale passed by value; a set skip word
// leaves everything as it was.
TEST(OptimizerKernelsTest, AdamWReadsTheDeviceTotals) {
  SKIP_WITHOUT_CUDA_DEVICE();
  Rng rng(24);
  std::vector<float> p = testing::RandomFloats(&rng, kTotal, 1);
  std::vector<float> g = testing::RandomFloats(&rng, kTotal, 1);
  std::vector<float> zeros(kTotal, 0.0f);
  AdamWStep hp;
  hp.grad_scale = 0.37;
  DeviceBuffer dg = Upload(g, kF);
  DeviceBuffer p1 = Upload(p, kF), m1 = Upload(zeros, kF),
               v1 = Upload(zeros, kF);
  ASSERT_TRUE(FusedAdamW(GpuSegments(), hp, p1.as<float>(), dg.as<float>(),
                         m1.as<float>(), v1.as<float>(), nullptr, nullptr)
                  .ok());
  for (double skip : {0.0, 1.0}) {
    const double totals[4] = {1.5, 2.5, 0.37, skip};
    DeviceBuffer dt = *DeviceBuffer::Allocate(0, sizeof(totals));
    ASSERT_TRUE(dt.CopyFromHost(totals, sizeof(totals)).ok());
    DeviceBuffer p2 = Upload(p, kF), m2 = Upload(zeros, kF),
                 v2 = Upload(zeros, kF);
    AdamWStep other = hp;
    other.grad_scale = 99;  // ignored: the device's scale rules
    ASSERT_TRUE(FusedAdamW(GpuSegments(), other, p2.as<float>(), dg.as<float>(),
                           m2.as<float>(), v2.as<float>(), nullptr, nullptr,
                           dt.as<double>())
                    .ok());
    const std::vector<float> got = Download(p2, kTotal, kF);
    if (skip == 0) {
      ExpectBitwiseEqual("params", got, Download(p1, kTotal, kF).data());
    } else {
      ExpectBitwiseEqual("params", got, p.data());
    }
  }
}

TEST(OptimizerKernelsTest, GradSumsOfSquaresDeterministicAndAccurate) {
  SKIP_WITHOUT_CUDA_DEVICE();
  Rng rng(23);
  std::vector<float> g = testing::RandomFloats(&rng, kTotal, 3);
  DeviceBuffer dg = Upload(g, kF);
  const std::vector<ParamSegment> segs = GpuSegments();
  DeviceBuffer ws =
      *DeviceBuffer::Allocate(0, GradSumsOfSquaresWorkspaceBytes(segs));
  std::vector<double> runs[2];
  for (auto& r : runs) {
    DeviceBuffer out = testing::Poisoned(segs.size() * 2, kF);
    ASSERT_TRUE(GradSumsOfSquares(segs, dg.as<float>(), ws.data(),
                                  out.as<double>(), nullptr)
                    .ok());
    r.resize(segs.size());
    ASSERT_TRUE(out.CopyToHost(r.data(), r.size() * sizeof(double)).ok());
  }
  for (size_t s = 0; s < segs.size(); ++s) {
    double ref = 0;
    for (int64_t i = 0; i < segs[s].size(); ++i) {
      const double x = g[segs[s].offset + i];
      ref += x * x;
    }
    EXPECT_NEAR(runs[0][s], ref, 1e-12 * ref) << "segment " << s;
    EXPECT_EQ(std::memcmp(&runs[0][s], &runs[1][s], 8), 0) << "segment " << s;
  }
}

}  // namespace
}  // namespace gpu
}  // namespace trainyard
