// The problems PlanJob finds in a spec's parallelism: stages,
// microbatches, the schedule and its chunks, and the split.
#include <string>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "plan/job_plan.h"
#include "plan/plan_test_util.h"

namespace trainyard {
namespace plan_test {
namespace {

using trainyard::v1::JobSpec;

TEST(PlanJobErrorsTest, StagesAndMicrobatches) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_parallelism()->set_stages(4);
  spec.mutable_parallelism()->set_microbatches(5);
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ExpectProblem(plan,
                "parallelism.stages: must be <= the number of blocks (3), "
                "got 4");
  ExpectProblem(plan,
                "parallelism.microbatches: must be <= data.batch_size (4), "
                "got 5");
  spec.mutable_parallelism()->set_stages(-1);
  spec.mutable_parallelism()->set_microbatches(-2);
  plan = PlanJob(spec, Options(dir));
  ExpectProblem(plan, "parallelism.stages: must be >= 1, got -1");
  ExpectProblem(plan, "parallelism.microbatches: must be >= 1, got -2");
}

TEST(PlanJobErrorsTest, ScheduleName) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_parallelism()->set_schedule("zb");
  ExpectProblem(PlanJob(spec, Options(dir)),
                "parallelism.schedule: must be one of \"gpipe\", \"1f1b\", "
                "\"zbh1\", \"interleaved\", \"zbv\", got \"zb\"");
}

TEST(PlanJobErrorsTest, Split) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  for (int n : {1, 0, 1}) spec.mutable_parallelism()->add_split(n);
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ExpectProblem(plan,
                "parallelism.split: must have one entry per stage (2), got 3");
  ExpectProblem(plan, "parallelism.split[1]: must be >= 1, got 0");
  spec.mutable_parallelism()->clear_split();
  spec.mutable_parallelism()->add_split(1);
  spec.mutable_parallelism()->add_split(1);
  ExpectProblem(PlanJob(spec, Options(dir)),
                "parallelism.split: must sum to the number of blocks (3), "
                "got 2");
}

TEST(PlanJobErrorsTest, Chunks) {
  const std::string dir = TestDir();
  JobSpec spec = FourBlockSpec(dir);
  spec.mutable_parallelism()->set_chunks(2);
  ExpectProblem(PlanJob(spec, Options(dir)),
                "parallelism.chunks: schedule \"1f1b\" takes 1 chunk per stage "
                "(only \"interleaved\" and \"zbv\" take more), got 2");
  spec.mutable_parallelism()->set_schedule("zbv");
  spec.mutable_parallelism()->set_chunks(3);
  ExpectProblem(PlanJob(spec, Options(dir)),
                "parallelism.chunks: schedule \"zbv\" takes exactly 2 chunks "
                "per stage, got 3");
  spec.mutable_parallelism()->set_schedule("interleaved");
  spec.mutable_parallelism()->set_chunks(3);
  ExpectProblem(PlanJob(spec, Options(dir)),
                "parallelism.chunks: stages x chunks (2 x 3 virtual stages) "
                "must be <= the number of blocks (4)");
  spec.mutable_parallelism()->set_chunks(2);
  spec.mutable_parallelism()->set_microbatches(3);
  ExpectProblem(PlanJob(spec, Options(dir)),
                "parallelism.microbatches: schedule \"interleaved\" runs "
                "microbatches in groups of one per stage: microbatches per "
                "replica must be a multiple of stages (2), got 3");
  spec.mutable_parallelism()->set_microbatches(2);
  for (int n : {2, 2}) spec.mutable_parallelism()->add_split(n);
  ExpectProblem(PlanJob(spec, Options(dir)),
                "parallelism.split: must have one entry per virtual stage (2 "
                "stages x 2 chunks = 4), got 2");
  spec.mutable_parallelism()->clear_split();
  EXPECT_TRUE(PlanJob(spec, Options(dir)).ok());
}

}  // namespace
}  // namespace plan_test
}  // namespace trainyard
