// The problems PlanJob finds in a spec's data: .npy files, synthetic
// generators, eval data and the batch settings.
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/file_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/job_plan.h"
#include "plan/plan_test_util.h"

namespace trainyard {
namespace plan_test {
namespace {

using ::testing::HasSubstr;
using trainyard::v1::JobSpec;

TEST(PlanJobErrorsTest, SyntheticLimitsAndEvalClassCount) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  auto* syn = spec.mutable_data()->mutable_train()->mutable_synthetic();
  syn->set_kind("gaussian_blobs");
  syn->set_num_samples(1);
  syn->set_num_features(1 << 24);
  syn->set_num_outputs(1 << 24);
  syn->set_noise(1);
  // 2^48 class-center values would not fit; a plan must not promise them.
  ExpectProblem(PlanJob(spec, Options(dir)),
                "data.train.synthetic.num_outputs: num_outputs * num_features "
                "must be <= 2^30, got 281474976710656");
  syn->set_num_features(7);
  syn->set_num_outputs(3);
  syn->set_num_samples(200);
  auto* eval = spec.mutable_data()->mutable_eval()->mutable_synthetic();
  *eval = *syn;
  eval->set_num_outputs(10);
  ExpectProblem(PlanJob(spec, Options(dir)),
                "data.eval.synthetic: has 10 classes but data.train has 3");
}

TEST(PlanJobErrorsTest, MissingDataSource) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_data()->clear_train();
  ExpectProblem(PlanJob(spec, Options(dir)),
                "data.train: required (npy, npy_shards or synthetic)");
  spec.mutable_data()->mutable_train();  // present but empty oneof
  ExpectProblem(PlanJob(spec, Options(dir)),
                "data.train: needs a source: npy, npy_shards or synthetic");
}

TEST(PlanJobErrorsTest, NpyFileMissing) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_data()->mutable_train()->mutable_npy()->set_features(
      "data/nope.npy");
  ExpectProblem(PlanJob(spec, Options(dir)),
                absl::StrCat("data.train.npy.features: data/nope.npy (", dir,
                             "/data/nope.npy): no such file"));
}

TEST(PlanJobErrorsTest, NpyDtypesAndShapes) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  WriteRawNpy(JoinPath(dir, "data/xi.npy"), "<i8", {10, 8}, 8);
  WriteRawNpy(JoinPath(dir, "data/y2i.npy"), "<i4", {10, 2}, 4);
  auto* npy = spec.mutable_data()->mutable_train()->mutable_npy();
  npy->set_features("data/xi.npy");
  npy->set_targets("data/y2i.npy");
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ExpectProblem(plan,
                "data.train.npy.features: data/xi.npy: must be float32 "
                "[N, D], got int64 [10, 8]");
  ExpectProblem(plan,
                "data.train.npy.targets: data/y2i.npy: must be int32/int64 "
                "[N] (class ids) or float32 [N, K] (K >= 1), got int32 "
                "[10, 2]");
  // A dtype the .npy reader itself refuses: its message, under the field.
  WriteRawNpy(JoinPath(dir, "data/x8.npy"), "<f8", {10, 8}, 8);
  npy->set_features("data/x8.npy");
  plan = PlanJob(spec, Options(dir));
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(std::string(plan.status().message()),
              HasSubstr("\ndata.train.npy.features: "));
  EXPECT_THAT(std::string(plan.status().message()), HasSubstr("x8.npy"));
}

TEST(PlanJobErrorsTest, NpyRowCountsDiffer) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  WriteRawNpy(JoinPath(dir, "data/y9.npy"), "<i8", {9}, 8);
  spec.mutable_data()->mutable_train()->mutable_npy()->set_targets(
      "data/y9.npy");
  ExpectProblem(PlanJob(spec, Options(dir)),
                "data.train.npy.targets: data/y9.npy: has 9 rows but features "
                "have 10");
}

// ValidNpySpec's data as one npy_shards pair whose features are stored as
// `descr` (2 or 4 bytes an element).
JobSpec ShardsSpec(const std::string& dir, const std::string& descr) {
  JobSpec spec = ValidNpySpec(dir);
  WriteRawNpy(JoinPath(dir, "data/x-0.npy"), descr, {10, 8},
              descr == "<f4" ? 4 : 2);
  WriteRawNpy(JoinPath(dir, "data/y-0.npy"), "<f4", {10, 3}, 4);
  auto* shards = spec.mutable_data()->mutable_train()->mutable_npy_shards();
  shards->add_features("data/x-*.npy");
  shards->add_targets("data/y-*.npy");
  return spec;
}

TEST(PlanJobErrorsTest, ShardsFeaturesDtype) {
  const std::string dir = TestDir();
  JobSpec spec = ShardsSpec(dir, "<u2");
  auto* shards = spec.mutable_data()->mutable_train()->mutable_npy_shards();
  shards->set_features_dtype("float8");
  ExpectProblem(PlanJob(spec, Options(dir)),
                "data.train.npy_shards.features_dtype: must be one of \"\", "
                "\"bfloat16\", got \"float8\"");
  // 2-byte words need the bfloat16 promise...
  shards->set_features_dtype("");
  ExpectProblem(PlanJob(spec, Options(dir)),
                absl::StrCat("data.train.npy_shards: ", dir,
                             "/data/x-0.npy: dtype '<u2' holds 2-byte words: "
                             "bfloat16 features need features_dtype "
                             "\"bfloat16\"; otherwise features are float32 "
                             "or float16"));
  // ... and with it plan like any features of their width.
  shards->set_features_dtype("bfloat16");
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->feature_dim, 8);
  EXPECT_EQ(plan->train_rows, 10);
  // ml_dtypes' '|V2' too; float32 features are not bfloat16.
  spec = ShardsSpec(dir, "|V2");
  spec.mutable_data()
      ->mutable_train()
      ->mutable_npy_shards()
      ->set_features_dtype("bfloat16");
  EXPECT_TRUE(PlanJob(spec, Options(dir)).ok());
  spec = ShardsSpec(dir, "<f4");
  spec.mutable_data()
      ->mutable_train()
      ->mutable_npy_shards()
      ->set_features_dtype("bfloat16");
  ExpectProblem(PlanJob(spec, Options(dir)),
                absl::StrCat("data.train.npy_shards: ", dir,
                             "/data/x-0.npy: dtype '<f4', but features_dtype "
                             "is bfloat16 (expected '<u2' or '|V2')"));
}

TEST(PlanJobErrorsTest, Synthetic) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  auto* syn = spec.mutable_data()->mutable_train()->mutable_synthetic();
  syn->set_kind("spirals");
  syn->set_num_samples(0);
  syn->set_num_features(8);
  syn->set_num_outputs(3);
  syn->set_noise(-1);
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ExpectProblem(plan,
                "data.train.synthetic.kind: must be one of "
                "\"teacher_regression\", \"gaussian_blobs\", got \"spirals\"");
  ExpectProblem(plan, "data.train.synthetic.num_samples: must be > 0, got 0");
  ExpectProblem(plan,
                "data.train.synthetic.noise: must be >= 0 and finite, got -1");
  syn->set_kind("gaussian_blobs");
  syn->set_num_samples(100);
  syn->set_noise(0.1);
  syn->set_num_outputs(1);
  ExpectProblem(PlanJob(spec, Options(dir)),
                "data.train.synthetic.num_outputs: must be in [2, 16777216] "
                "(number of classes), got 1");
  // A valid blobs source: the last block must output one logit per class.
  syn->set_num_outputs(4);
  ExpectProblem(PlanJob(spec, Options(dir)),
                "model.blocks[2].out_features: must equal the number of "
                "classes of data.train (4), got 3");
}

TEST(PlanJobErrorsTest, EvalData) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  WriteRawNpy(JoinPath(dir, "data/ex.npy"), "<f4", {4, 7}, 4);
  WriteRawNpy(JoinPath(dir, "data/ey.npy"), "<f4", {4, 3}, 4);
  auto* npy = spec.mutable_data()->mutable_eval()->mutable_npy();
  npy->set_features("data/ex.npy");
  npy->set_targets("data/ey.npy");
  spec.mutable_data()->set_eval_fraction(0.5);
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ExpectProblem(plan, "data.eval.npy: has 7 features but data.train has 8");
  ExpectProblem(plan,
                "data.eval_fraction: must be 0 when data.eval is given, got "
                "0.5");
  spec.mutable_data()->clear_eval();
  spec.mutable_data()->set_eval_fraction(1.0);
  ExpectProblem(PlanJob(spec, Options(dir)),
                "data.eval_fraction: must be in [0, 1), got 1");
  spec.mutable_data()->set_eval_fraction(0.05);  // floor(10 * 0.05) = 0
  ExpectProblem(PlanJob(spec, Options(dir)),
                "data.eval_fraction: holds out 0 of data.train's 10 rows; "
                "need at least 1 eval and 1 train row");
}

TEST(PlanJobErrorsTest, BatchSizeAndEvalEvery) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.mutable_data()->set_batch_size(0);
  spec.mutable_data()->set_eval_every(10);
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ExpectProblem(plan, "data.batch_size: must be > 0, got 0");
  ExpectProblem(plan,
                "data.eval_every: needs eval data: data.eval or "
                "data.eval_fraction > 0");
  spec.mutable_data()->set_eval_every(-1);
  ExpectProblem(PlanJob(spec, Options(dir)),
                "data.eval_every: must be >= 0, got -1");
}

}  // namespace
}  // namespace plan_test
}  // namespace trainyard
