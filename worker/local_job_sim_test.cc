// Whole jobs on the simulated device (sim:0, core/sim_device.h): memory the
// engine must treat as device memory, the CPU's kernels, every host<->device
// copy and synchronisation counted. It checks what a GPU step moves between
// host and device, on machines without a GPU.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/test_jobs.h"
#include "worker/test_paths.h"

namespace trainyard {
namespace {

using testing::ClassificationSpec;
using testing::PluginDir;
using testing::RunJob;
using testing::RunResult;
using testing::WithPipeline;

const Device kSim = Device::Sim(0);

// With a v1 (host) plugin the simulated device computes exactly what the
// CPU does: the same kernels on the same values, whatever the split.
TEST(LocalJobSimTest, Fp32WithAHostPluginIsTheCpuBitForBit) {
  for (int stages : {1, 2, 4}) {
    SCOPED_TRACE(::testing::Message() << "S=" << stages);
    const auto spec = WithPipeline(ClassificationSpec(), stages, 4, "1f1b");
    RunResult cpu = RunJob(spec);
    ASSERT_TRUE(cpu.status.ok()) << cpu.status;
    RunResult sim = RunJob(spec, 0, PluginDir(), kSim);
    ASSERT_TRUE(sim.status.ok()) << sim.status;
    EXPECT_EQ(sim.losses, cpu.losses);
    EXPECT_EQ(sim.grad_norms, cpu.grad_norms);
    EXPECT_EQ(sim.eval_loss, cpu.eval_loss);
    EXPECT_EQ(sim.params, cpu.params);
    // And it did count what a GPU would move: the CPU moves nothing.
    ASSERT_EQ(cpu.traffic.size(), static_cast<size_t>(stages));
    EXPECT_EQ(cpu.traffic[0][0].h2d_copies + cpu.traffic[0][0].syncs, 0);
    EXPECT_GT(sim.traffic[0][0].h2d_copies, 0);
  }
}

}  // namespace
}  // namespace trainyard
