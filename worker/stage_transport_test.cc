// The transport of a multi-stage assignment: the choice from its
// placements (ChooseAssignmentTransport), and a worker daemon against a
// fake controller taking the TCP path, refusing a placement that is not its
// device, and failing an NCCL stage without a GPU clearly.
#include "worker/stage_transport.h"

#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/trainyard.pb.h"
#include "transport/nccl_transport.h"
#include "transport/transport_select.h"
#include "worker/fake_controller.h"
#include "worker/worker_daemon.h"
#include "worker/worker_test_util.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;
using ::trainyard::testing::Assign;
using ::trainyard::testing::CudaDeviceUsable;
using ::trainyard::testing::GpuOptions;
using ::trainyard::testing::SetPlacements;
using ::trainyard::testing::SmallSpec;
using ::trainyard::testing::TestOptions;
using ::trainyard::testing::TransportReports;
using ::trainyard::testing::WorkerDaemonTest;
using ::trainyard::v1::ControllerMessage;
using ::trainyard::v1::JobSpec;

v1::StageAssignment AssignmentOn(const std::vector<StagePlacement>& stages) {
  v1::StageAssignment a;
  for (const StagePlacement& p : stages) {
    auto* out = a.add_placements();
    out->set_host(p.host);
    out->set_device(p.device);
  }
  return a;
}

TEST(ChooseAssignmentTransportTest, CpuStagesUseTcp) {
  auto choice = ChooseAssignmentTransport(
      AssignmentOn({{"a", "cpu"}, {"b", "cpu"}}), 2, /*nccl_built=*/true);
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_EQ(choice->kind, TransportKind::kTcp);
  EXPECT_EQ(choice->reason, "every stage is on cpu: using TCP");
}

TEST(ChooseAssignmentTransportTest, DistinctGpusOfOneHostUseNcclWhenBuilt) {
  const v1::StageAssignment a =
      AssignmentOn({{"a", "cuda:0"}, {"a", "cuda:1"}});
  auto nccl = ChooseAssignmentTransport(a, 2, /*nccl_built=*/true);
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  EXPECT_EQ(nccl->kind, TransportKind::kNccl);
  EXPECT_EQ(nccl->reason, "all 2 stages are on distinct GPUs: using NCCL");
  auto tcp = ChooseAssignmentTransport(a, 2, /*nccl_built=*/false);
  ASSERT_TRUE(tcp.ok()) << tcp.status();
  EXPECT_EQ(tcp->kind, TransportKind::kTcp);
  EXPECT_THAT(tcp->reason, HasSubstr("this build has no NCCL"));
  // This build: NCCL exactly when the CUDA toolkit was there.
  auto here = ChooseAssignmentTransport(a, 2, NcclTransportBuilt());
  ASSERT_TRUE(here.ok());
  EXPECT_EQ(here->kind,
            NcclTransportBuilt() ? TransportKind::kNccl : TransportKind::kTcp);
}

TEST(ChooseAssignmentTransportTest, SharedGpuUsesTcp) {
  auto choice = ChooseAssignmentTransport(
      AssignmentOn({{"a", "cuda:0"}, {"a", "cuda:0"}}), 2, true);
  ASSERT_TRUE(choice.ok());
  EXPECT_EQ(choice->kind, TransportKind::kTcp);
  EXPECT_EQ(choice->reason,
            "stages 0 and 1 share cuda:0 on host a: using TCP with host "
            "staging");
}

TEST(ChooseAssignmentTransportTest, NoPlacementsFromAnOlderControllerIsTcp) {
  auto choice = ChooseAssignmentTransport(v1::StageAssignment(), 2, true);
  ASSERT_TRUE(choice.ok());
  EXPECT_EQ(choice->kind, TransportKind::kTcp);
  EXPECT_THAT(choice->reason, HasSubstr("names no stage placements"));
}

TEST(ChooseAssignmentTransportTest, BadPlacementsAreNamed) {
  auto count = ChooseAssignmentTransport(AssignmentOn({{"a", "cpu"}}), 2, true);
  EXPECT_EQ(count.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(count.status().message(),
            "StageAssignment.placements: the job has 2 stages, got 1 "
            "placements");
  auto device = ChooseAssignmentTransport(
      AssignmentOn({{"a", "cpu"}, {"a", "cuda"}}), 2, true);
  EXPECT_EQ(device.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(device.status().message(),
              HasSubstr("StageAssignment.placements: transport choice: "
                        "stage 1"));
}

TEST_F(WorkerDaemonTest, CpuPlacementsUseTheTcpPathAndReportTheChoice) {
  auto worker = StartWorker(TestOptions(controller_->address()));
  ASSERT_NE(worker, nullptr);
  const std::string id = controller_->WaitForRegistration(1);
  JobSpec spec = SmallSpec(2);
  spec.mutable_parallelism()->set_stages(2);
  ControllerMessage m = Assign("cpu-pair", spec, 0, {"x:1", "y:2"});
  SetPlacements(&m, {"cpu", "cpu"});
  ASSERT_TRUE(controller_->Send(id, m));
  auto done = controller_->WaitForDone("cpu-pair");
  ASSERT_TRUE(done.has_value());
  // The injected TCP seam was used.
  EXPECT_THAT(done->error(), HasSubstr("no transport in this test"));
  auto reports = TransportReports(*controller_, "cpu-pair");
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].stage(), 0);
  EXPECT_EQ(reports[0].kind(), "tcp");
  EXPECT_EQ(reports[0].reason(), "every stage is on cpu: using TCP");
}

TEST_F(WorkerDaemonTest, PlacementThatIsNotThisWorkersDeviceIsRefused) {
  auto worker = StartWorker(TestOptions(controller_->address()));
  ASSERT_NE(worker, nullptr);
  const std::string id = controller_->WaitForRegistration(1);
  JobSpec spec = SmallSpec(2);
  spec.mutable_parallelism()->set_stages(2);
  ControllerMessage m = Assign("elsewhere", spec, 0, {"x:1", "y:2"});
  SetPlacements(&m, {"cuda:0", "cuda:1"});
  ASSERT_TRUE(controller_->Send(id, m));
  auto done = controller_->WaitForDone("elsewhere");
  ASSERT_TRUE(done.has_value());
  EXPECT_FALSE(done->ok());
  EXPECT_THAT(done->error(),
              HasSubstr("StageAssignment.placements[0].device: \"cuda:0\", "
                        "but this worker runs on cpu"));
}

// On this machine (CUDA toolkit, no GPU) two stages on cuda:0 and cuda:1
// choose NCCL, and the real CreateNcclTransport fails at once, naming NCCL
// and the device: the stage reports it instead of waiting for its peer.
TEST_F(WorkerDaemonTest, NcclWithoutADeviceFailsTheStageClearly) {
  if (CudaDeviceUsable()) {
    GTEST_SKIP() << "cuda:0 is usable here; this test needs a machine "
                    "without a GPU";
  }
  auto worker = StartWorker(GpuOptions(controller_->address(), 1));
  ASSERT_NE(worker, nullptr);
  const std::string id = controller_->WaitForRegistration(1);
  EXPECT_EQ(controller_->registered().at(0).capabilities().device(), "cuda:1");
  JobSpec spec = SmallSpec(2);
  spec.mutable_parallelism()->set_stages(2);
  spec.set_device("cuda");
  ControllerMessage m = Assign("nccl", spec, 1, {"x:1", "y:2"});
  SetPlacements(&m, {"cuda:0", "cuda:1"});
  const absl::Time start = absl::Now();
  ASSERT_TRUE(controller_->Send(id, m));
  auto done = controller_->WaitForDone("nccl", absl::Seconds(10));
  ASSERT_TRUE(done.has_value()) << "no StageDone within 10 s";
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_FALSE(done->ok());
  EXPECT_FALSE(done->cancelled());
  auto reports = TransportReports(*controller_, "nccl");
  ASSERT_EQ(reports.size(), 1u);
  if (NcclTransportBuilt()) {
    EXPECT_EQ(reports[0].kind(), "nccl");
    EXPECT_EQ(reports[0].reason(),
              "all 2 stages are on distinct GPUs: using NCCL");
    EXPECT_THAT(done->error(),
                HasSubstr("creating the NCCL transport to the other stages: "
                          "nccl transport (job \"nccl\", rank 1, cuda:1): "
                          "no CUDA device"));
  } else {
    EXPECT_EQ(reports[0].kind(), "tcp");
    EXPECT_THAT(reports[0].reason(), HasSubstr("this build has no NCCL"));
    EXPECT_THAT(done->error(), HasSubstr("no transport in this test"));
  }
  EXPECT_FALSE(worker->busy());
}

}  // namespace
}  // namespace trainyard
