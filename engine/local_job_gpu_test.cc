// Whole jobs on cuda:0 against the same jobs on the CPU. Tagged gpu: each
// test skips, saying why, without a device (TRAINYARD_REQUIRE_GPU=1 turns
// that into a failure).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/test_jobs.h"
#include "engine/test_paths.h"
#include "gtest/gtest.h"
#include "kernels/cuda/test_util.h"

namespace trainyard {
namespace {

using testing::ClassificationSpec;
using testing::PluginDir;
using testing::RunJob;
using testing::RunResult;
using testing::TempDir;
using testing::WideRegressionSpec;
using testing::WithPipeline;

const Device kGpu = Device::Cuda(0);

double MaxRelativeDifference(const std::vector<double>& a,
                             const std::vector<double>& b) {
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    worst = std::max(worst, std::abs(a[i] - b[i]) / std::abs(b[i]));
  }
  return worst;
}

trainyard::v1::JobSpec WithPrecision(trainyard::v1::JobSpec spec,
                                     const char* precision) {
  spec.set_precision(precision);
  return spec;
}

// The step stays on the GPU (the same budget local_job_sim_test holds the
// simulated device to): no activation-sized copy between host and device,
// one synchronisation per step and stage, for 1 and 4 stages on cuda:0.
TEST(LocalJobGpuTest, StepCopiesNoActivationAndWaitsOnce) {
  SKIP_WITHOUT_CUDA_DEVICE();
  for (int stages : {1, 4}) {
    SCOPED_TRACE(::testing::Message() << "S=" << stages);
    RunResult r = RunJob(WideRegressionSpec(stages), 0, PluginDir(), kGpu);
    ASSERT_TRUE(r.status.ok()) << r.status;
    for (int s = 0; s < stages; ++s) {
      for (const DeviceTraffic& t : r.traffic[s]) {
        EXPECT_EQ(t.syncs, 1);
        EXPECT_EQ(t.h2d_copies, s == 0 ? 1 : 0);
        EXPECT_EQ(t.d2h_copies, 1);
        EXPECT_LT(t.h2d_bytes + t.d2h_bytes, 16 * 128 * 2);
      }
    }
  }
}

// Half-width shards widened on the GPU (float16 / bfloat16 words copied
// as stored from pinned buffers, then cast there) give the same bits as
// the same values held on the GPU as float32, for fp32 and bf16.
TEST(LocalJobGpuTest, HalfWidthShardsWidenOnTheGpuBitwise) {
  SKIP_WITHOUT_CUDA_DEVICE();
  for (DType half : {DType::kFloat16, DType::kBFloat16}) {
    const std::string dir =
        absl::StrCat(TempDir(), "/half-gpu-", DTypeName(half));
    testing::WriteHalfWidthData(dir, half, 300, 128, 32, 70);
    for (const char* precision : {"fp32", "bf16"}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(half) << " " << precision);
      auto spec = WideRegressionSpec(1);
      spec.set_precision(precision);
      const RunResult pair =
          RunJob(testing::WithFloat32Pair(spec, dir), 0, PluginDir(), kGpu);
      const RunResult shards = RunJob(
          testing::WithHalfWidthShards(spec, dir, half), 0, PluginDir(), kGpu);
      ASSERT_TRUE(pair.status.ok()) << pair.status;
      ASSERT_TRUE(shards.status.ok()) << shards.status;
      EXPECT_EQ(shards.losses, pair.losses);
      EXPECT_EQ(shards.params, pair.params);
      for (const DeviceTraffic& t : shards.traffic[0]) {
        EXPECT_EQ(t.h2d_copies, 2);
        EXPECT_EQ(t.h2d_bytes, 64 * (128 * 2 + 32 * 4));
        EXPECT_EQ(t.syncs, 1);
      }
    }
  }
}

// A plugin's device loss (ABI v2, kernels/cuda/loss_kernels) and its host
// loss (v1) on the GPU: the same training within float32 rounding (the
// device sums in another order).
TEST(LocalJobGpuTest, DeviceAndHostLossesAgree) {
  SKIP_WITHOUT_CUDA_DEVICE();
  for (const char* plugin : {"mse", "cross_entropy"}) {
    SCOPED_TRACE(plugin);
    auto spec = plugin == std::string("mse")
                    ? WideRegressionSpec(2)
                    : WithPipeline(ClassificationSpec(), 2, 4, "1f1b");
    spec.set_precision("fp32");
    RunResult v2 = RunJob(spec, 0, PluginDir(), kGpu);
    RunResult v1 = RunJob(spec, 0, PluginDir(), kGpu, /*host_loss=*/true);
    ASSERT_TRUE(v2.status.ok() && v1.status.ok()) << v2.status << v1.status;
    ASSERT_EQ(v2.losses.size(), v1.losses.size());
    EXPECT_LE(MaxRelativeDifference(v2.losses, v1.losses), 1e-5);
  }
}

TEST(LocalJobGpuTest, Fp32FollowsTheCpuWithin1e5) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const auto spec = WithPipeline(ClassificationSpec(), 2, 4, "1f1b");
  RunResult cpu = RunJob(spec);
  ASSERT_TRUE(cpu.status.ok()) << cpu.status;
  RunResult gpu = RunJob(WithPrecision(spec, "fp32"), 0, PluginDir(), kGpu);
  ASSERT_TRUE(gpu.status.ok()) << gpu.status;
  ASSERT_EQ(gpu.losses.size(), cpu.losses.size());
  EXPECT_LE(MaxRelativeDifference(gpu.losses, cpu.losses), 1e-5);
  ASSERT_EQ(gpu.params.size(), cpu.params.size());
}

TEST(LocalJobGpuTest, Bf16AndTf32FollowTheCpuAndLearn) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const auto spec = WithPipeline(ClassificationSpec(), 2, 4, "1f1b");
  RunResult cpu = RunJob(spec);
  ASSERT_TRUE(cpu.status.ok()) << cpu.status;
  for (const char* precision : {"tf32", "bf16"}) {
    SCOPED_TRACE(precision);
    RunResult gpu =
        RunJob(WithPrecision(spec, precision), 0, PluginDir(), kGpu);
    ASSERT_TRUE(gpu.status.ok()) << gpu.status;
    ASSERT_EQ(gpu.losses.size(), cpu.losses.size());
    EXPECT_LE(MaxRelativeDifference(gpu.losses, cpu.losses), 5e-2);
    EXPECT_LT(gpu.losses.back(), gpu.losses.front() / 2);
  }
}

// Same spec and seed on the same GPU: the same bits; and the stage split and
// schedule do not change them (one stream, fixed cuBLASLt algorithms, no
// float atomics).
TEST(LocalJobGpuTest, RerunsSplitsAndSchedulesAreBitwiseOnTheGpu) {
  SKIP_WITHOUT_CUDA_DEVICE();
  for (const char* precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    const auto base = WithPrecision(ClassificationSpec(), precision);
    RunResult ref =
        RunJob(WithPipeline(base, 1, 4, "1f1b"), 0, PluginDir(), kGpu);
    ASSERT_TRUE(ref.status.ok()) << ref.status;
    RunResult again =
        RunJob(WithPipeline(base, 1, 4, "1f1b"), 0, PluginDir(), kGpu);
    EXPECT_EQ(again.losses, ref.losses);
    EXPECT_EQ(again.params, ref.params);
    for (int stages : {2, 4}) {
      for (const char* schedule : {"gpipe", "1f1b", "zbh1"}) {
        SCOPED_TRACE(std::to_string(stages) + " " + schedule);
        RunResult r = RunJob(WithPipeline(base, stages, 4, schedule), 0,
                             PluginDir(), kGpu);
        ASSERT_TRUE(r.status.ok()) << r.status;
        EXPECT_EQ(r.losses, ref.losses);
        EXPECT_EQ(r.params, ref.params);
      }
    }
  }
}

// A checkpoint written on the GPU resumes on the CPU and the other way
// round; the continued run follows the uninterrupted CPU run.
TEST(LocalJobGpuTest, CheckpointsMoveBetweenDevices) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto spec = WithPipeline(ClassificationSpec(), 2, 4, "1f1b");
  spec.set_steps(20);
  RunResult full = RunJob(spec);
  ASSERT_TRUE(full.status.ok()) << full.status;
  for (bool gpu_first : {true, false}) {
    SCOPED_TRACE(gpu_first ? "gpu then cpu" : "cpu then gpu");
    auto s = spec;
    s.mutable_checkpoint()->set_dir(TempDir() + (gpu_first ? "/g2c" : "/c2g"));
    s.mutable_checkpoint()->set_every(10);
    s.mutable_checkpoint()->set_resume("latest");
    RunResult first =
        RunJob(s, 10, PluginDir(), gpu_first ? kGpu : Device::Cpu());
    ASSERT_TRUE(first.status.ok()) << first.status;
    RunResult second =
        RunJob(s, 0, PluginDir(), gpu_first ? Device::Cpu() : kGpu);
    ASSERT_TRUE(second.status.ok()) << second.status;
    ASSERT_EQ(second.losses.size(), 10u);
    std::vector<double> joined = first.losses;
    joined.insert(joined.end(), second.losses.begin(), second.losses.end());
    EXPECT_LE(MaxRelativeDifference(joined, full.losses), 1e-5);
  }
}

}  // namespace
}  // namespace trainyard
