// The problems PlanJob finds in a spec's model: block widths and kinds,
// the output width against the targets, and the initial weights.
#include <string>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "plan/job_plan.h"
#include "plan/plan_test_util.h"

namespace trainyard {
namespace plan_test {
namespace {

using trainyard::v1::JobSpec;

TEST(PlanJobErrorsTest, BlockWidths) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_model()->mutable_blocks(2)->set_ffn_hidden_size(-4);
  spec.mutable_model()->mutable_blocks(0)->set_out_features(0);
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ExpectProblem(plan, "model.blocks[2].ffn_hidden_size: must be > 0, got -4");
  ExpectProblem(plan, "model.blocks[0].out_features: must be > 0, got 0");
}

TEST(PlanJobErrorsTest, NoBlocks) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_model()->clear_blocks();
  ExpectProblem(PlanJob(spec, Options(dir)),
                "model.blocks: must have at least one block");
}

TEST(PlanJobErrorsTest, InFeaturesMismatch) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_model()->mutable_blocks(0)->set_in_features(5);
  spec.mutable_model()->mutable_blocks(2)->set_in_features(32);
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ExpectProblem(plan,
                "model.blocks[0].in_features: must match the data's feature "
                "count (8), got 5");
  ExpectProblem(plan,
                "model.blocks[2].in_features: must match "
                "model.blocks[1].out_features (16), got 32");
}

TEST(PlanJobErrorsTest, ActivationAndNormNames) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_model()->mutable_blocks(1)->set_activation("tanh");
  spec.mutable_model()->mutable_blocks(2)->set_norm("batchnorm");
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ExpectProblem(plan,
                "model.blocks[1].activation: must be one of \"relu\", "
                "\"gelu\", \"gelu_tanh\", \"swiglu\", got \"tanh\"");
  ExpectProblem(plan,
                "model.blocks[2].norm: must be one of \"none\", "
                "\"layernorm\", \"rmsnorm\", got \"batchnorm\"");
}

TEST(PlanJobErrorsTest, ResidualNeedsEqualWidths) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_model()->mutable_blocks(0)->set_residual(true);
  ExpectProblem(PlanJob(spec, Options(dir)),
                "model.blocks[0].residual: needs in_features == "
                "out_features, got 8 and 16");
}

TEST(PlanJobErrorsTest, LastBlockMustMatchTargets) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_model()->mutable_blocks(2)->set_out_features(5);
  ExpectProblem(PlanJob(spec, Options(dir)),
                "model.blocks[2].out_features: must equal the width K of "
                "data.train's targets (3), got 5");
}

TEST(PlanJobErrorsTest, InitSafetensorsMissing) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_model()->mutable_init()->set_safetensors("/nonexistent/w.st");
  ExpectProblem(PlanJob(spec, Options(dir)),
                "model.init.safetensors: /nonexistent/w.st: no such file");
}

TEST(PlanJobTest, UncheckedFilesNeedExplicitInputWidth) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_data()->mutable_train()->mutable_npy()->set_features(
      "not/here.npy");
  PlanOptions options = Options(dir);
  options.check_files = false;
  ExpectProblem(PlanJob(spec, options),
                "model.blocks[0].in_features: cannot be inferred: the data's "
                "feature count is unknown (files not checked); set it");
  spec.mutable_model()->mutable_blocks(0)->set_in_features(8);
  absl::StatusOr<JobPlan> plan = PlanJob(spec, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->feature_dim, 8);
  EXPECT_EQ(plan->spec.data().train().npy().features(), dir + "/not/here.npy");
}

}  // namespace
}  // namespace plan_test
}  // namespace trainyard
