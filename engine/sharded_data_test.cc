// Jobs over a sharded source (npy_shards): the same rows as one .npy pair
// give bitwise the same training, whatever the shard sizes; and the
// source's problems are named at plan time.
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/file_util.h"
#include "core/npy.h"
#include "engine/dataset.h"
#include "engine/test_jobs.h"
#include "engine/test_paths.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/job_plan.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;
using trainyard::v1::JobSpec;

std::string FreshDir(const std::string& name) {
  const std::string dir = JoinPath(testing::TempDir(), name);
  std::filesystem::remove_all(dir);
  EXPECT_TRUE(CreateDirectories(dir).ok());
  return dir;
}

// ClassificationSpec's rows, written as one .npy pair and as shards of
// `sizes` rows; returns the folder.
std::string WriteData(const std::string& name, const std::vector<int>& sizes) {
  const JobSpec spec = testing::ClassificationSpec();
  absl::StatusOr<Dataset> data =
      LoadDataSource(spec.data().train(), "", spec.seed());
  EXPECT_TRUE(data.ok()) << data.status();
  const std::string dir = FreshDir(name);
  EXPECT_TRUE(WriteNpy(JoinPath(dir, "x.npy"), data->features).ok());
  EXPECT_TRUE(WriteNpy(JoinPath(dir, "y.npy"), data->targets).ok());
  int64_t row = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    const int64_t end = row + sizes[k];
    EXPECT_TRUE(WriteNpy(JoinPath(dir, absl::StrCat("x-", k, ".npy")),
                         data->features.Rows(row, end).Clone())
                    .ok());
    EXPECT_TRUE(WriteNpy(JoinPath(dir, absl::StrCat("y-", k, ".npy")),
                         data->targets.Rows(row, end).Clone())
                    .ok());
    row = end;
  }
  EXPECT_EQ(row, data->num_rows());
  return dir;
}

JobSpec WithNpy(JobSpec spec, const std::string& dir) {
  auto* npy = spec.mutable_data()->mutable_train()->mutable_npy();
  npy->set_features(JoinPath(dir, "x.npy"));
  npy->set_targets(JoinPath(dir, "y.npy"));
  return spec;
}

JobSpec WithShards(JobSpec spec, const std::string& dir) {
  auto* shards = spec.mutable_data()->mutable_train()->mutable_npy_shards();
  shards->add_features(JoinPath(dir, "x-*.npy"));
  shards->add_targets(JoinPath(dir, "y-*.npy"));
  return spec;
}

TEST(ShardedDataTest, ShardsTrainBitwiseAsOnePair) {
  const std::string dir = WriteData("shards", {137, 63, 200});
  for (bool shuffle : {false, true}) {
    JobSpec spec =
        testing::WithPipeline(testing::ClassificationSpec(), 2, 4, "1f1b");
    spec.set_steps(12);
    spec.mutable_data()->set_eval_every(6);
    spec.mutable_data()->set_shuffle(shuffle);
    testing::RunResult one = testing::RunJob(WithNpy(spec, dir));
    testing::RunResult sharded = testing::RunJob(WithShards(spec, dir));
    ASSERT_TRUE(one.status.ok()) << one.status;
    ASSERT_TRUE(sharded.status.ok()) << sharded.status;
    ASSERT_EQ(one.losses.size(), 12u);
    EXPECT_EQ(sharded.losses, one.losses) << "shuffle " << shuffle;
    EXPECT_EQ(sharded.eval_loss, one.eval_loss);  // the held-out tail
    EXPECT_EQ(sharded.params, one.params);
  }
}

// Shuffled, stopped at step 7 on 2 stages x 1 replica and resumed from its
// checkpoint on 4 stages x 2 replicas: bitwise the uninterrupted run (the
// resumed run computes its rows from the step, replaying nothing).
// Half-width features (float16, bfloat16 words) widened on the host train
// bitwise as the same values stored as float32, through the read-ahead.
TEST(ShardedDataTest, HalfWidthShardsTrainBitwiseAsFloat32) {
  for (DType half : {DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(DTypeName(half));
    const std::string dir = FreshDir(absl::StrCat("half-", DTypeName(half)));
    testing::WriteHalfWidthData(dir, half, 300, 16, 3, 70);
    JobSpec spec =
        testing::WithPipeline(testing::WideRegressionSpec(2), 2, 4, "1f1b");
    spec.set_precision("fp32");
    spec.mutable_model()->mutable_blocks(0)->set_out_features(16);
    spec.mutable_model()->mutable_blocks(3)->set_out_features(3);
    for (int b = 0; b < 4; ++b) {
      spec.mutable_model()->mutable_blocks(b)->set_ffn_hidden_size(16);
      if (b < 3) spec.mutable_model()->mutable_blocks(b)->set_out_features(16);
    }
    testing::RunResult pair =
        testing::RunJob(testing::WithFloat32Pair(spec, dir));
    testing::RunResult shards =
        testing::RunJob(testing::WithHalfWidthShards(spec, dir, half));
    ASSERT_TRUE(pair.status.ok()) << pair.status;
    ASSERT_TRUE(shards.status.ok()) << shards.status;
    EXPECT_EQ(shards.losses, pair.losses);
    EXPECT_EQ(shards.params, pair.params);
    ASSERT_FALSE(shards.losses.empty());
  }
}

TEST(ShardedDataTest, ResumeWithAnotherLayoutIsBitwise) {
  const std::string dir = WriteData("resume-shards", {90, 110, 200});
  JobSpec spec = WithShards(
      testing::WithPipeline(testing::ClassificationSpec(), 2, 8, "1f1b"), dir);
  spec.set_steps(14);
  spec.mutable_parallelism()->set_accumulation("tree");
  testing::RunResult full = testing::RunJob(spec);
  ASSERT_TRUE(full.status.ok()) << full.status;

  spec.mutable_checkpoint()->set_dir(FreshDir("resume-ckpt"));
  spec.mutable_checkpoint()->set_every(7);
  spec.mutable_checkpoint()->set_resume("latest");
  testing::RunResult first = testing::RunJob(spec, /*stop_after=*/7);
  ASSERT_TRUE(first.status.ok()) << first.status;
  JobSpec wider = testing::WithPipeline(spec, 4, 8, "zbh1");
  wider.mutable_parallelism()->set_replicas(2);
  testing::RunResult second = testing::RunJob(wider);
  ASSERT_TRUE(second.status.ok()) << second.status;
  std::vector<double> joined = first.losses;
  joined.insert(joined.end(), second.losses.begin(), second.losses.end());
  EXPECT_EQ(joined, full.losses);
  EXPECT_EQ(second.params, full.params);
}

TEST(ShardedDataTest, ProblemsAreNamedWhenPlanning) {
  const std::string dir = WriteData("bad-shards", {200, 200});
  JobSpec spec = WithShards(testing::ClassificationSpec(), dir);
  spec.mutable_data()->mutable_train()->mutable_npy_shards()->set_features(
      0, JoinPath(dir, "nothing-*.npy"));
  absl::StatusOr<JobPlan> plan = PlanJob(spec, PlanOptions());
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(std::string(plan.status().message()),
              HasSubstr("data.train.npy_shards.features[0]: \""));
  EXPECT_THAT(std::string(plan.status().message()),
              HasSubstr(": names no file"));

  // One features file more than targets: the pairs do not line up.
  spec = WithShards(testing::ClassificationSpec(), dir);
  spec.mutable_data()->mutable_train()->mutable_npy_shards()->add_features(
      JoinPath(dir, "x.npy"));
  plan = PlanJob(spec, PlanOptions());
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(std::string(plan.status().message()),
              HasSubstr("data.train.npy_shards: features name 3 files but "
                        "targets name 2"));

  // A pair whose row counts differ: named by its files.
  spec = WithShards(testing::ClassificationSpec(), dir);
  auto* shards = spec.mutable_data()->mutable_train()->mutable_npy_shards();
  shards->clear_targets();
  shards->add_targets(JoinPath(dir, "y-1.npy"));
  shards->add_targets(JoinPath(dir, "y.npy"));
  plan = PlanJob(spec, PlanOptions());
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(std::string(plan.status().message()),
              HasSubstr("data.train.npy_shards: "));
  EXPECT_THAT(std::string(plan.status().message()), HasSubstr("y.npy"));
}

TEST(ShardedDataTest, PathsStayInsideTheDataFolder) {
  const std::string dir = WriteData("confined-shards", {400});
  JobSpec spec = WithShards(testing::ClassificationSpec(), dir);
  PlanOptions options;
  options.confine_to = FreshDir("elsewhere");
  absl::StatusOr<JobPlan> plan = PlanJob(spec, options);
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(std::string(plan.status().message()),
              HasSubstr("data.train.npy_shards.features[0]: "));
  EXPECT_THAT(std::string(plan.status().message()),
              HasSubstr("outside the data folder"));
}

}  // namespace
}  // namespace trainyard
