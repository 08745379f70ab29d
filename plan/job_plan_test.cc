// PlanJob as a whole: a valid spec planned with its defaults, the example
// spec file, the run settings, and every problem in one status.
#include "plan/job_plan.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/plan_test_util.h"

namespace trainyard {
namespace plan_test {
namespace {

using trainyard::v1::JobSpec;

TEST(PlanJobTest, ValidSpecGetsDefaults) {
  const std::string dir = TestDir();
  absl::StatusOr<JobPlan> plan = PlanJob(ValidNpySpec(dir), Options(dir));
  ASSERT_TRUE(plan.ok()) << plan.status();
  const JobSpec& s = plan->spec;

  EXPECT_EQ(plan->feature_dim, 8);
  EXPECT_EQ(plan->output_dim, 3);
  EXPECT_FALSE(plan->class_targets);
  EXPECT_EQ(plan->train_rows, 10);
  ASSERT_EQ(s.model().blocks_size(), 3);
  EXPECT_EQ(s.model().blocks(0).in_features(), 8);
  EXPECT_EQ(s.model().blocks(1).in_features(), 16);
  EXPECT_EQ(s.model().blocks(2).in_features(), 16);
  for (const auto& b : s.model().blocks()) {
    EXPECT_EQ(b.activation(), "gelu");
    EXPECT_TRUE(b.has_bias() && b.bias());
  }
  EXPECT_EQ(s.model().blocks(0).norm(), "none");
  EXPECT_EQ(s.model().blocks(1).norm(), "layernorm");
  ASSERT_EQ(plan->blocks.size(), 3u);
  EXPECT_EQ(plan->blocks[1].norm, NormType::kLayerNorm);
  EXPECT_EQ(plan->blocks[1].activation, Activation::kGelu);
  EXPECT_TRUE(plan->blocks[1].residual);
  EXPECT_EQ(plan->blocks[2].in_features, 16);

  EXPECT_EQ(s.optimizer().type(), "adamw");
  EXPECT_DOUBLE_EQ(s.optimizer().beta1(), 0.9);
  EXPECT_DOUBLE_EQ(s.optimizer().beta2(), 0.999);
  EXPECT_DOUBLE_EQ(s.optimizer().eps(), 1e-8);
  EXPECT_DOUBLE_EQ(s.optimizer().weight_decay(), 0.01);
  EXPECT_EQ(s.optimizer().decay_mask(), "default");
  EXPECT_EQ(s.optimizer().schedule().type(), "constant");
  EXPECT_EQ(s.optimizer().schedule().total_steps(), 100);
  EXPECT_EQ(s.model().init().seed(), 42u);
  EXPECT_EQ(s.data().seed(), 42u);
  EXPECT_EQ(s.device(), "cpu");
  EXPECT_EQ(s.precision(), "fp32");
  EXPECT_EQ(s.checkpoint().resume(), "never");
  EXPECT_EQ(s.data().train().npy().features(), dir + "/data/x.npy");
  EXPECT_EQ(s.data().train().npy().targets(), dir + "/data/y.npy");
}

TEST(PlanJobTest, ValidSpecGetsSplitAndParams) {
  const std::string dir = TestDir();
  absl::StatusOr<JobPlan> plan = PlanJob(ValidNpySpec(dir), Options(dir));
  ASSERT_TRUE(plan.ok()) << plan.status();
  const JobSpec& s = plan->spec;

  EXPECT_EQ(s.parallelism().stages(), 2);
  EXPECT_EQ(s.parallelism().microbatches(), 1);
  EXPECT_EQ(s.parallelism().schedule(), "1f1b");
  // Param counts: block 0 = 32*8+32+16*32+16 = 816, block 1 = 16+16 + 544 +
  // 528 = 1104, block 2 = 8*16+8+3*8+3 = 163. [1, 2] -> max 1267 beats
  // [2, 1] -> max 1920.
  EXPECT_THAT(s.parallelism().split(), ::testing::ElementsAre(1, 2));
  EXPECT_EQ(plan->virtual_stage_begin, (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(plan->num_stages(), 2);

  std::vector<std::string> names;
  for (const auto& p : plan->params) {
    names.push_back(
        absl::StrCat(p.name, p.decay ? "+" : "-", ":", p.block, ":", p.stage));
  }
  EXPECT_EQ(absl::StrJoin(names, " "),
            "blocks.0.fc1.weight+:0:0 blocks.0.fc1.bias-:0:0 "
            "blocks.0.fc2.weight+:0:0 blocks.0.fc2.bias-:0:0 "
            "blocks.1.norm.weight-:1:1 blocks.1.norm.bias-:1:1 "
            "blocks.1.fc1.weight+:1:1 blocks.1.fc1.bias-:1:1 "
            "blocks.1.fc2.weight+:1:1 blocks.1.fc2.bias-:1:1 "
            "blocks.2.fc1.weight+:2:1 blocks.2.fc1.bias-:2:1 "
            "blocks.2.fc2.weight+:2:1 blocks.2.fc2.bias-:2:1");
  EXPECT_EQ(plan->params[2].shape, (Shape{16, 32}));
}

TEST(PlanJobTest, ExampleSpecFileLoadsAndPlans) {
  const std::string dir = TestDir();
  absl::StatusOr<JobSpec> spec =
      LoadJobSpecFile("plan/testdata/good_synthetic.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<JobPlan> plan = PlanJob(*spec, Options(dir));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->class_targets);
  EXPECT_EQ(plan->feature_dim, 16);
  EXPECT_EQ(plan->output_dim, 4);
  EXPECT_EQ(plan->num_stages(), 3);
  EXPECT_EQ(plan->spec.checkpoint().dir(), dir + "/ckpt");
  EXPECT_EQ(plan->spec.data().train().synthetic().seed(), 7u);
  EXPECT_EQ(plan->blocks[1].activation, Activation::kSwiglu);
  EXPECT_FALSE(plan->blocks[3].bias);
  // The task config survives as a Struct.
  EXPECT_TRUE(plan->spec.task().config().fields().count("label_smoothing") ==
              1);
}

TEST(PlanJobErrorsTest, Steps) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.set_steps(0);
  ExpectProblem(PlanJob(spec, Options(dir)), "steps: must be > 0, got 0");
}

TEST(PlanJobErrorsTest, DeviceAndPrecision) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.set_device("cuda");
  spec.set_precision("bf16");
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->spec.device(), "cuda");
  spec.set_precision("");
  plan = PlanJob(spec, Options(dir));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->spec.precision(), "fp32");  // normalized
  spec.set_device("tpu");
  ExpectProblem(PlanJob(spec, Options(dir)),
                "device: must be one of \"cpu\", \"cuda\", \"sim\", got "
                "\"tpu\"");
  spec.set_device("");
  spec.set_precision("bf16");
  ExpectProblem(PlanJob(spec, Options(dir)),
                "precision: bf16 needs device \"cuda\" (or \"sim\"), got "
                "device \"cpu\" (the CPU computes in fp32)");
  spec.set_precision("tf32");
  ExpectProblem(PlanJob(spec, Options(dir)),
                "precision: tf32 needs device \"cuda\", got device \"cpu\" "
                "(the CPU computes in fp32)");
  spec.set_device("sim");
  spec.set_precision("bf16");
  EXPECT_TRUE(PlanJob(spec, Options(dir)).ok());
  spec.set_precision("tf32");
  ExpectProblem(PlanJob(spec, Options(dir)),
                "precision: tf32 needs device \"cuda\", got device \"sim\" "
                "(the CPU computes in fp32)");
  spec.set_precision("fp16");
  ExpectProblem(PlanJob(spec, Options(dir)),
                "precision: must be one of \"fp32\", \"tf32\", \"bf16\", "
                "got \"fp16\"");
}

TEST(PlanJobTest, AllProblemsComeBackInOneStatus) {
  const std::string dir = TestDir();
  absl::StatusOr<JobSpec> spec =
      LoadJobSpecFile("plan/testdata/bad_many_problems.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<JobPlan> plan = PlanJob(*spec, Options(dir));
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      std::string(plan.status().message()),
      "invalid job spec (5 problems):\n"
      "steps: must be > 0, got 0\n"
      "precision: must be one of \"fp32\", \"tf32\", \"bf16\", got \"fp16\"\n"
      "model.blocks[0].ffn_hidden_size: must be > 0, got -4\n"
      "parallelism.schedule: must be one of \"gpipe\", \"1f1b\", \"zbh1\", "
      "\"interleaved\", \"zbv\", got "
      "\"zb\"\n"
      "optimizer.beta1: only for adamw");
}

}  // namespace
}  // namespace plan_test
}  // namespace trainyard
