// Whole jobs on the simulated device (sim:0, core/sim_device.h): memory the
// engine must treat as device memory, the CPU's kernels, every host<->device
// copy and synchronisation counted. It checks what a GPU step moves between
// host and device, on machines without a GPU:
// - the step's budget: no activation-sized copy and one synchronisation
//   per step and stage, for 1 and 4 stages on one device;
// - the task plugins' device losses (ABI v2) against their host losses
//   (v1) and against the CPU;
// - half-width features from shards, copied as stored and widened on the
//   device, against the same values held on the device as float32.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/test_jobs.h"
#include "engine/test_paths.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

using testing::ClassificationSpec;
using ::testing::HasSubstr;
using testing::PluginDir;
using testing::RunJob;
using testing::RunResult;
using testing::WideRegressionSpec;
using testing::WithPipeline;

const Device kSim = Device::Sim(0);

void ExpectSameBits(const RunResult& r, const RunResult& ref) {
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.losses, ref.losses);
  EXPECT_EQ(r.grad_norms, ref.grad_norms);
  EXPECT_EQ(r.eval_loss, ref.eval_loss);
  EXPECT_EQ(r.params, ref.params);
}

// One microbatch's activations between blocks: 16 rows x 128 bfloat16.
constexpr int64_t kActivationBytes = 16 * 128 * 2;

void PrintTraffic(const RunResult& r) {
  for (size_t s = 0; s < r.traffic.size(); ++s) {
    const DeviceTraffic& t = r.traffic[s].back();
    std::cout << "stage " << s << " last step: " << t.h2d_copies
              << " copies to the device (" << t.h2d_bytes << " bytes), "
              << t.d2h_copies << " to the host (" << t.d2h_bytes << " bytes), "
              << t.syncs << " synchronisations\n";
  }
}

// What the issue asks of a GPU step, checked per stage and step: no copy
// of an activation between host and device, one synchronisation.
void ExpectStepBudget(const RunResult& r, int stages) {
  ASSERT_TRUE(r.status.ok()) << r.status;
  ASSERT_EQ(r.traffic.size(), static_cast<size_t>(stages));
  PrintTraffic(r);
  for (int s = 0; s < stages; ++s) {
    ASSERT_EQ(r.traffic[s].size(), 6u);
    for (size_t step = 0; step < r.traffic[s].size(); ++step) {
      SCOPED_TRACE(::testing::Message()
                   << "stage " << s << " step " << step + 1);
      const DeviceTraffic& t = r.traffic[s][step];
      EXPECT_EQ(t.syncs, 1);
      // The batch's row indices, on the first stage only.
      EXPECT_EQ(t.h2d_copies, s == 0 ? 1 : 0);
      EXPECT_EQ(t.d2h_copies, 1);  // the step's scalars
      EXPECT_LT(t.h2d_bytes + t.d2h_bytes, kActivationBytes);
    }
  }
}

TEST(LocalJobSimTest, OneStageStepCopiesNoActivationAndWaitsOnce) {
  ExpectStepBudget(RunJob(WideRegressionSpec(1), 0, PluginDir(), kSim), 1);
}

TEST(LocalJobSimTest, FourStagesOnOneDeviceCopyNoActivationAndWaitOnce) {
  ExpectStepBudget(RunJob(WideRegressionSpec(4), 0, PluginDir(), kSim), 4);
}

// The counters see what the budget forbids: the host loss (ABI v1) copies
// each microbatch's output and gradient, and data that does not stay on the
// device is copied with every batch.
TEST(LocalJobSimTest, HostLossAndHostDataAreCountedCopies) {
  const auto spec = WideRegressionSpec(1);
  RunResult host_loss = RunJob(spec, 0, PluginDir(), kSim, /*host_loss=*/true);
  ASSERT_TRUE(host_loss.status.ok()) << host_loss.status;
  PrintTraffic(host_loss);
  const DeviceTraffic& t = host_loss.traffic[0].back();
  EXPECT_GE(t.d2h_copies, 4);  // each microbatch's output
  EXPECT_GE(t.h2d_copies, 4);  // each microbatch's gradient
  EXPECT_GE(t.syncs, 8);
  RunResult host_data = RunJob(spec, 0, PluginDir(), kSim, false,
                               /*device_data_bytes=*/0);
  ASSERT_TRUE(host_data.status.ok()) << host_data.status;
  PrintTraffic(host_data);
  // The batch's features [64, 128] float32 and targets [64, 32].
  EXPECT_GE(host_data.traffic[0].back().h2d_bytes, 64 * (128 + 32) * 4);
  // Where the rows are gathered changes no bit.
  ExpectSameBits(host_data, RunJob(spec, 0, PluginDir(), kSim));
}

// Half-width shards (float16, bfloat16 words) cross to the device at their
// stored width, from the read-ahead's pinned buffers, and are widened
// there: the same bits as the same values as a float32 pair held on the
// device, for fp32 and bf16 activations and 1 or 2 stages, with the
// batch's features copied at 2 bytes an element.
TEST(LocalJobSimTest, HalfWidthShardsWidenOnTheDeviceBitwise) {
  for (DType half : {DType::kFloat16, DType::kBFloat16}) {
    const std::string dir =
        absl::StrCat(testing::TempDir(), "/half-sim-", DTypeName(half));
    testing::WriteHalfWidthData(dir, half, 300, 128, 32, 70);
    for (const char* precision : {"fp32", "bf16"}) {
      for (int stages : {1, 2}) {
        SCOPED_TRACE(::testing::Message()
                     << DTypeName(half) << " " << precision << " S=" << stages);
        auto spec = WideRegressionSpec(stages);
        spec.set_precision(precision);
        const RunResult pair =
            RunJob(testing::WithFloat32Pair(spec, dir), 0, PluginDir(), kSim);
        const RunResult shards =
            RunJob(testing::WithHalfWidthShards(spec, dir, half), 0,
                   PluginDir(), kSim);
        ExpectSameBits(shards, pair);
        for (const DeviceTraffic& t : shards.traffic[0]) {
          EXPECT_EQ(t.h2d_copies, 2);  // features and targets
          EXPECT_EQ(t.h2d_bytes, 64 * (128 * 2 + 32 * 4));
          EXPECT_EQ(t.syncs, 1);
        }
      }
    }
  }
}

// On the simulated device (the CPU's kernels) a plugin's device loss gives
// the CPU's bits: the same loss, the engine's weighting of the gradient.
TEST(LocalJobSimTest, DeviceLossesAreTheCpuBitForBit) {
  for (int stages : {1, 2, 4}) {
    SCOPED_TRACE(::testing::Message() << "S=" << stages);
    const auto spec = WithPipeline(ClassificationSpec(), stages, 4, "1f1b");
    RunResult cpu = RunJob(spec);
    ASSERT_TRUE(cpu.status.ok()) << cpu.status;
    ExpectSameBits(RunJob(spec, 0, PluginDir(), kSim), cpu);
    ExpectSameBits(RunJob(spec, 0, PluginDir(), kSim, /*host_loss=*/true), cpu);
  }
}

// bf16 on the device: the v2 (device) and v1 (host) losses of each plugin
// agree; on the simulated device they agree bit for bit.
TEST(LocalJobSimTest, DeviceAndHostLossesAgreeInBf16) {
  for (int stages : {1, 4}) {
    for (const char* plugin : {"mse", "cross_entropy"}) {
      SCOPED_TRACE(::testing::Message() << plugin << " S=" << stages);
      auto spec = plugin == std::string("mse")
                      ? WideRegressionSpec(stages)
                      : WithPipeline(ClassificationSpec(), stages, 4, "1f1b");
      spec.set_precision("bf16");
      RunResult v2 = RunJob(spec, 0, PluginDir(), kSim);
      RunResult v1 = RunJob(spec, 0, PluginDir(), kSim, /*host_loss=*/true);
      ASSERT_TRUE(v2.status.ok() && v1.status.ok()) << v2.status << v1.status;
      ASSERT_EQ(v2.losses.size(), v1.losses.size());
      double worst = 0;
      for (size_t i = 0; i < v1.losses.size(); ++i) {
        worst = std::max(worst, std::abs(v2.losses[i] - v1.losses[i]) /
                                    std::abs(v1.losses[i]));
      }
      std::cout << plugin << " S=" << stages
                << ": largest relative loss difference, device vs host loss: "
                << worst << "\n";
      EXPECT_LE(worst, 1e-6);
      ExpectSameBits(v2, v1);
    }
  }
}

// Replicas on one device sum their gradients there (worker/
// shared_device_replicas.h): R = 1's bits, and still no gradient-sized copy
// and one synchronisation per step and stage.
TEST(LocalJobSimTest, ReplicasOnOneDeviceSumThereBitForBit) {
  auto base = ClassificationSpec();
  base.mutable_parallelism()->set_accumulation("tree");
  RunResult ref = RunJob(WithPipeline(base, 1, 8, "1f1b"));
  ASSERT_TRUE(ref.status.ok()) << ref.status;
  for (int stages : {1, 2}) {
    for (int replicas : {2, 4}) {
      SCOPED_TRACE(::testing::Message() << "R=" << replicas << " S=" << stages);
      auto spec = WithPipeline(base, stages, 8, "1f1b");
      spec.mutable_parallelism()->set_replicas(replicas);
      RunResult r = RunJob(spec, 0, PluginDir(), kSim);
      ExpectSameBits(r, ref);
      for (int s = 0; s < stages; ++s) {
        for (const DeviceTraffic& t : r.traffic[s]) {
          EXPECT_EQ(t.syncs, 1);
          EXPECT_LE(t.h2d_copies + t.d2h_copies, 2);
          // The whole gradient is 4 KiB here: none of it crosses.
          EXPECT_LT(t.h2d_bytes + t.d2h_bytes, 1024);
        }
      }
    }
  }
}

// Phase times and spans come from the device's stream (host clock marks on
// the simulated device): every span inside its step, in order; a device
// stage of a multi-stage job counts the update it queued after its read in
// the next step's optimizer time.
TEST(LocalJobSimTest, PhaseTimesAndSpansComeFromTheStream) {
  for (int stages : {1, 4}) {
    SCOPED_TRACE(::testing::Message() << "S=" << stages);
    RunResult r = RunJob(WideRegressionSpec(stages), 0, PluginDir(), kSim);
    ASSERT_TRUE(r.status.ok()) << r.status;
    for (int s = 0; s < stages; ++s) {
      for (size_t step = 0; step < r.stage_reports[s].size(); ++step) {
        const StepReport& rep = r.stage_reports[s][step];
        EXPECT_GT(rep.times.forward, 0);
        EXPECT_GT(rep.times.backward, 0);
        int64_t last_end = 0;
        bool optimizer_span = false;
        for (const Span& span : rep.trace.spans) {
          EXPECT_LE(last_end, span.start_us);
          EXPECT_LE(span.start_us, span.end_us);
          last_end = span.end_us;
          optimizer_span |= span.kind == v1::SPAN_OPTIMIZER;
        }
        EXPECT_LE(last_end, rep.trace.step_us);
        EXPECT_TRUE(optimizer_span);  // the sums of squares, before the read
        if (stages > 1 && step > 0) {
          EXPECT_GT(rep.times.optimizer, 0);
        }
      }
    }
  }
}

// A diverging job fails with the host loss's message on the device too.
TEST(LocalJobSimTest, DivergenceIsReportedLikeOnTheCpu) {
  auto spec = WithPipeline(ClassificationSpec(), 1, 4, "1f1b");
  spec.mutable_optimizer()->set_lr(1e12);
  spec.mutable_optimizer()->set_clip_grad(0);
  spec.mutable_optimizer()->mutable_schedule()->set_warmup_steps(0);
  RunResult cpu = RunJob(spec);
  RunResult sim = RunJob(spec, 0, PluginDir(), kSim);
  ASSERT_FALSE(cpu.status.ok());
  ASSERT_FALSE(sim.status.ok());
  // The NaN shows first in the model's output (ReLU passes it on, as
  // torch.relu does).
  EXPECT_THAT(std::string(cpu.status.message()),
              HasSubstr("is not finite (nan): the training diverged"));
  EXPECT_EQ(sim.status.message(), cpu.status.message());
  EXPECT_EQ(sim.losses, cpu.losses);  // the steps before it
}

}  // namespace
}  // namespace trainyard
