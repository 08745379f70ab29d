// The wiring of one stage of a gang: the failure status the other stages
// hear, which replica writes checkpoints, the stage options of a gang rank,
// and the replica group its copies join.
#include "engine/stage_wiring.h"

#include <memory>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kernels/exec_context.h"
#include "plan/job_plan.h"
#include "transport/rendezvous.h"

namespace trainyard {
namespace {

// 2 stages x 3 replicas: gang rank 5 is stage 1 of replica 2.
constexpr Gang kGang{2, 3};

TEST(StageFailureTest, NamesTheStageAndKeepsTheCode) {
  const absl::Status failure =
      StageFailure(kGang, 5, absl::DeadlineExceededError("no neighbour"),
                   /*name_replica=*/false);
  EXPECT_EQ(failure.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(failure.message(), "stage 1 failed: no neighbour");
}

TEST(StageFailureTest, NamesTheReplicaWhenAsked) {
  const absl::Status failure =
      StageFailure(kGang, 5, absl::InternalError("boom"),
                   /*name_replica=*/true);
  EXPECT_EQ(failure.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(failure.message(), "replica 2 stage 1 failed: boom");
}

TEST(GangRunOptionsTest, OnlyTheFirstReplicaWritesCheckpoints) {
  for (int rank = 0; rank < kGang.size(); ++rank) {
    const StageRunOptions run = GangRunOptions(kGang, rank, absl::Seconds(7));
    EXPECT_EQ(run.timeout, absl::Seconds(7));
    EXPECT_EQ(run.write_checkpoints, rank < kGang.stages) << "rank " << rank;
  }
}

TEST(GangStageOptionsTest, SetsTheReplicaItsGroupAndContext) {
  absl::StatusOr<std::unique_ptr<ExecContext>> exec =
      ExecContext::Create(Device::Cpu(), Precision::kFp32);
  ASSERT_TRUE(exec.ok()) << exec.status();
  StageOptions base;
  base.plugin_dir = "/plugins";
  base.timeout = absl::Seconds(3);
  const StageOptions options =
      GangStageOptions(base, kGang, 3, exec->get(), nullptr);
  EXPECT_EQ(options.plugin_dir, "/plugins");
  EXPECT_EQ(options.timeout, absl::Seconds(3));
  EXPECT_EQ(options.exec, exec->get());
  EXPECT_EQ(options.replica, 1);
  EXPECT_EQ(options.replica_group, nullptr);
}

TEST(JoinStageReplicasTest, OneReplicaHasNoGroup) {
  absl::StatusOr<std::unique_ptr<ReplicaGroup>> group =
      JoinStageReplicas(/*rendezvous=*/nullptr, Gang{2, 1}, 1, "job",
                        "127.0.0.1", absl::Seconds(5));
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_EQ(*group, nullptr);
}

TEST(JoinStageReplicasTest, TheCopiesOfAStageFormOneGroup) {
  // Stage 1 of replicas 0 and 1 of a 2 x 2 gang: ranks 1 and 3.
  const Gang gang{2, 2};
  InProcessRendezvous rendezvous;
  absl::StatusOr<std::unique_ptr<ReplicaGroup>> second;
  std::thread joiner([&] {
    second = JoinStageReplicas(&rendezvous, gang, 3, "job", "127.0.0.1",
                               absl::Seconds(20));
  });
  absl::StatusOr<std::unique_ptr<ReplicaGroup>> first = JoinStageReplicas(
      &rendezvous, gang, 1, "job", "127.0.0.1", absl::Seconds(20));
  joiner.join();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ((*first)->rank(), 0);
  EXPECT_EQ((*second)->rank(), 1);
  EXPECT_EQ((*first)->size(), 2);
  EXPECT_EQ((*second)->size(), 2);
}

}  // namespace
}  // namespace trainyard
