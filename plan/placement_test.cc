// Placing the blocks: the split (given or balanced), virtual stages of
// chunked schedules, and each parameter's weight-decay flag.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/job_plan.h"
#include "plan/plan_test_util.h"

namespace trainyard {
namespace plan_test {
namespace {

using trainyard::v1::JobSpec;

TEST(PlanJobTest, SgdDefaultsAndPatternDecayMask) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_optimizer()->set_type("sgd");
  spec.mutable_optimizer()->set_momentum(0.9);
  spec.mutable_optimizer()->set_nesterov(true);
  spec.mutable_optimizer()->set_decay_mask("patterns");
  spec.mutable_optimizer()->add_no_decay("blocks.*.fc1.*");
  spec.mutable_optimizer()->add_no_decay("*.norm.bias");
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_DOUBLE_EQ(plan->spec.optimizer().weight_decay(), 0.0);
  EXPECT_FALSE(plan->spec.optimizer().has_beta1());
  std::vector<std::string> no_decay;
  for (const auto& p : plan->params) {
    if (!p.decay) no_decay.push_back(p.name);
  }
  EXPECT_EQ(absl::StrJoin(no_decay, " "),
            "blocks.0.fc1.weight blocks.0.fc1.bias blocks.1.norm.bias "
            "blocks.1.fc1.weight blocks.1.fc1.bias blocks.2.fc1.weight "
            "blocks.2.fc1.bias");
}

TEST(PlanJobTest, DecayMaskAllDecaysEverything) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_optimizer()->set_decay_mask("all");
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const auto& p : plan->params) EXPECT_TRUE(p.decay) << p.name;
}

TEST(PlanJobTest, ExplicitSplitIsKept) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_parallelism()->add_split(2);
  spec.mutable_parallelism()->add_split(1);
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->virtual_stage_begin, (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(plan->params.back().stage, 1);
  EXPECT_EQ(plan->params.front().stage, 0);
}

TEST(BalancedSplitTest, MinimisesLargestStageWithEarlyStagesSmallerOnTies) {
  EXPECT_EQ(BalancedSplit({5, 5, 5, 5}, 3), (std::vector<int>{1, 1, 2}));
  EXPECT_EQ(BalancedSplit({1, 1, 1, 1, 1, 1}, 2), (std::vector<int>{3, 3}));
  EXPECT_EQ(BalancedSplit({10, 1, 1, 1, 10}, 3), (std::vector<int>{1, 3, 1}));
  EXPECT_EQ(BalancedSplit({5, 1, 1, 1, 1, 1, 5}, 3),
            (std::vector<int>{1, 5, 1}));
  // Optimum 9 = [4, 5]; [1, 2] | [3, 4, 5] would be 12.
  EXPECT_EQ(BalancedSplit({1, 2, 3, 4, 5}, 2), (std::vector<int>{3, 2}));
  EXPECT_EQ(BalancedSplit({7}, 1), (std::vector<int>{1}));
  EXPECT_EQ(BalancedSplit({3, 3, 3}, 3), (std::vector<int>{1, 1, 1}));
}

TEST(GlobMatchTest, StarMatchesAnyRunIncludingDots) {
  EXPECT_TRUE(GlobMatch("blocks.*.fc1.bias", "blocks.12.fc1.bias"));
  EXPECT_TRUE(GlobMatch("*bias", "blocks.0.norm.bias"));
  EXPECT_TRUE(GlobMatch("*", "x"));
  EXPECT_TRUE(GlobMatch("blocks.0.*", "blocks.0.fc2.weight"));
  EXPECT_FALSE(GlobMatch("blocks.*.fc1.bias", "blocks.1.fc2.bias"));
  EXPECT_FALSE(GlobMatch("blocks.1.*", "blocks.10.fc1.bias"));
  EXPECT_FALSE(GlobMatch("fc1", "blocks.0.fc1.weight"));
}

TEST(PlanJobTest, ChunkedSchedulesCutTheModelIntoVirtualStages) {
  const std::string dir = TestDir();
  JobSpec spec = FourBlockSpec(dir);
  spec.mutable_parallelism()->set_microbatches(2);
  auto stage_of = [](const JobPlan& plan, int block) {
    for (const JobPlan::ParamSpec& ps : plan.params) {
      if (ps.block == block) return ps.stage;
    }
    return -1;
  };
  // Interleaved: chunk c of stage s is virtual stage 2c + s.
  spec.mutable_parallelism()->set_schedule("interleaved");
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->spec.parallelism().chunks(), 2);  // the default
  EXPECT_THAT(plan->spec.parallelism().split(),
              ::testing::ElementsAre(1, 1, 1, 1));
  EXPECT_EQ(plan->num_chunks, 2);
  EXPECT_EQ(plan->num_stages(), 2);
  EXPECT_EQ(plan->num_virtual_stages(), 4);
  EXPECT_EQ(plan->ChunkBlocks(0, 1), std::make_pair(2, 3));
  EXPECT_EQ(plan->ChunkBlocks(1, 0), std::make_pair(1, 2));
  EXPECT_EQ(stage_of(*plan, 0), 0);
  EXPECT_EQ(stage_of(*plan, 1), 1);
  EXPECT_EQ(stage_of(*plan, 2), 0);
  EXPECT_EQ(stage_of(*plan, 3), 1);
  // ZB-V: stage 0 holds the first and the last virtual stage.
  spec.mutable_parallelism()->set_schedule("zbv");
  plan = PlanJob(spec, Options(dir));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->chunk_layout, ChunkLayout::kV);
  EXPECT_EQ(plan->ChunkBlocks(0, 1), std::make_pair(3, 4));
  EXPECT_EQ(plan->ChunkBlocks(1, 1), std::make_pair(2, 3));
  EXPECT_EQ(stage_of(*plan, 0), 0);
  EXPECT_EQ(stage_of(*plan, 1), 1);
  EXPECT_EQ(stage_of(*plan, 2), 1);
  EXPECT_EQ(stage_of(*plan, 3), 0);
  // The memory estimate counts each stage's peak (microbatch, chunk)
  // activations at its largest chunk: ZB-V, S = 2, M = 2 holds min(2M, 2S)
  // = 4 on each stage. Saved per sample (see the formula test): block 0 88,
  // blocks 1 and 2 114 each, block 3 35; backward scratch 88, 112, 112, 35.
  // b = 2: stage 0 2 * (4 * 88 + 88), stage 1 2 * (4 * 114 + 112).
  EXPECT_EQ(plan->memory.activations,
            4u * (2 * (4 * 88 + 88) + 2 * (4 * 114 + 112)));
  // The tree's partial sums: floor(log2 M) + 1 = 2 more gradient copies.
  const uint64_t grads = plan->memory.grads;
  spec.mutable_parallelism()->set_accumulation("tree");
  plan = PlanJob(spec, Options(dir));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->memory.grads, 3 * grads);
}

}  // namespace
}  // namespace plan_test
}  // namespace trainyard
