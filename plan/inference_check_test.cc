// The problems PlanJob finds in an infer or eval job's spec: its kind, its
// model source and outputs, and what only a training job gives.
#include <string>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "plan/job_plan.h"
#include "plan/plan_test_util.h"

namespace trainyard {
namespace plan_test {
namespace {

using trainyard::v1::JobSpec;

// ValidNpySpec as an inference job from a checkpoint folder.
JobSpec InferSpec(const std::string& dir) {
  JobSpec spec = ValidNpySpec(dir);
  spec.set_kind("infer");
  spec.clear_steps();
  spec.clear_optimizer();
  spec.clear_checkpoint();
  spec.mutable_data()->set_shuffle(false);
  spec.mutable_data()->set_eval_every(0);
  spec.mutable_inference()->set_checkpoint_dir("ckpt");
  spec.mutable_inference()->set_output_dir("out");
  return spec;
}

TEST(InferenceCheckTest, AValidInferenceJobGetsItsDefaults) {
  const std::string dir = TestDir();
  absl::StatusOr<JobPlan> plan = PlanJob(InferSpec(dir), Options(dir));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->kind, JobKind::kInfer);
  EXPECT_FALSE(plan->trains());
  EXPECT_EQ(plan->spec.inference().shard_rows(), kDefaultShardRows);
  EXPECT_EQ(plan->spec.inference().checkpoint_dir(), dir + "/ckpt");
  EXPECT_EQ(plan->spec.inference().output_dir(), dir + "/out");
  // No optimizer state in a forward-only job's estimate.
  EXPECT_EQ(plan->memory.grads, 0u);
  EXPECT_EQ(plan->memory.optimizer_state, 0u);
  EXPECT_EQ(plan->memory.state_copies, 0u);
}

TEST(InferenceCheckTest, KindIsOneOfThree) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.set_kind("predict");
  ExpectProblem(PlanJob(spec, Options(dir)),
                "kind: must be one of \"train\", \"infer\", \"eval\", got "
                "\"predict\"");
  spec.set_kind("");
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->spec.kind(), "train");
  EXPECT_TRUE(plan->trains());
}

TEST(InferenceCheckTest, TrainingFieldsAreRefused) {
  const std::string dir = TestDir();
  JobSpec spec = InferSpec(dir);
  spec.set_steps(10);
  spec.mutable_optimizer()->set_lr(0.1);
  spec.mutable_checkpoint()->set_dir("c");
  spec.mutable_data()->set_shuffle(true);
  spec.mutable_data()->set_eval_every(5);
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  const std::string why = "only for kind \"train\", got kind \"infer\"";
  ExpectProblem(plan, "steps: " + why);
  ExpectProblem(plan, "optimizer: " + why);
  ExpectProblem(plan, "checkpoint: " + why +
                          " (the model's checkpoint is "
                          "inference.checkpoint_dir)");
  ExpectProblem(plan, "data.shuffle: " + why + " (rows are read in order)");
  ExpectProblem(plan, "data.eval_every: " + why);
}

TEST(InferenceCheckTest, TheModelComesFromExactlyOneSource) {
  const std::string dir = TestDir();
  JobSpec spec = InferSpec(dir);
  spec.mutable_inference()->clear_checkpoint_dir();
  ExpectProblem(PlanJob(spec, Options(dir)),
                "inference.checkpoint_dir: an infer job needs a trained model: "
                "inference.checkpoint_dir or model.init.safetensors");
  spec.mutable_inference()->set_checkpoint_step(3);
  ExpectProblem(PlanJob(spec, Options(dir)),
                "inference.checkpoint_step: needs inference.checkpoint_dir");
  spec = InferSpec(dir);
  spec.mutable_model()->mutable_init()->set_safetensors("m.safetensors");
  ExpectProblem(PlanJob(spec, Options(dir)),
                "inference.checkpoint_dir: give either "
                "inference.checkpoint_dir or model.init.safetensors, not both");
  spec = InferSpec(dir);
  spec.mutable_inference()->set_checkpoint_step(-1);
  ExpectProblem(PlanJob(spec, Options(dir)),
                "inference.checkpoint_step: must be >= 0 (0: the newest), got "
                "-1");
}

TEST(InferenceCheckTest, OutputsBelongToInferenceJobs) {
  const std::string dir = TestDir();
  JobSpec spec = InferSpec(dir);
  spec.mutable_inference()->clear_output_dir();
  spec.mutable_inference()->set_shard_rows(-4);
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ExpectProblem(plan, "inference.output_dir: required for kind \"infer\"");
  ExpectProblem(plan, "inference.shard_rows: must be > 0, got -4");

  spec = InferSpec(dir);
  spec.set_kind("eval");
  ExpectProblem(PlanJob(spec, Options(dir)),
                "inference.output_dir: only for kind \"infer\", got kind "
                "\"eval\"");
  spec.mutable_inference()->clear_output_dir();
  absl::StatusOr<JobPlan> eval = PlanJob(spec, Options(dir));
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_EQ(eval->kind, JobKind::kEval);

  JobSpec train = ValidNpySpec(dir);
  train.mutable_inference()->set_output_dir("out");
  ExpectProblem(PlanJob(train, Options(dir)),
                "inference: only for kind \"infer\" or \"eval\"");
}

TEST(InferenceCheckTest, PathsStayInsideTheDataFolder) {
  const std::string dir = TestDir();
  JobSpec spec = InferSpec(dir);
  spec.mutable_inference()->set_output_dir("/elsewhere/out");
  PlanOptions options = Options(dir);
  options.confine_to = dir;
  absl::StatusOr<JobPlan> plan = PlanJob(spec, options);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("inference.output_dir:"),
            std::string::npos)
      << plan.status();
}

TEST(InferenceCheckTest, ReplicasNeedNoPowerOfTwoShare) {
  const std::string dir = TestDir();
  JobSpec spec = InferSpec(dir);
  spec.mutable_parallelism()->set_microbatches(3);
  spec.mutable_parallelism()->set_replicas(2);
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  EXPECT_TRUE(plan.ok()) << plan.status();
}

}  // namespace
}  // namespace plan_test
}  // namespace trainyard
