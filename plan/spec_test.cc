// Reading a spec: JSON parsing and files, the size limits, how problems
// are listed and quoted, and paths confined to the data folder.
#include <unistd.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/job_plan.h"
#include "plan/plan_test_util.h"

namespace trainyard {
namespace plan_test {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using trainyard::v1::JobSpec;

TEST(PlanJobTest, SpecsOverTheSizeLimitsAreRefusedNamingFieldAndLimit) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.set_name(std::string(300, 'n'));
  spec.mutable_checkpoint()->set_dir(std::string(5000, 'd'));
  for (int i = 0; i < 2000; ++i) {
    *spec.mutable_model()->add_blocks() = spec.model().blocks(0);
  }
  spec.mutable_optimizer()->add_no_decay(std::string(1000, 'x'));
  google::protobuf::Struct* config = spec.mutable_task()->mutable_config();
  for (int i = 0; i < 20; ++i) {
    config = (*config->mutable_fields())["deeper"].mutable_struct_value();
  }
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string msg(plan.status().message());
  for (const char* part :
       {"name: 300 bytes, limit 256", "checkpoint.dir: 5000 bytes, limit 4096",
        "model.blocks: 2003 blocks, limit 1024",
        "optimizer.no_decay[0]: 1000 bytes, limit 256",
        "task.config: nested 21 levels deep, limit 16"}) {
    EXPECT_THAT(msg, HasSubstr(part)) << msg;
  }
  // Nothing long is echoed back.
  EXPECT_LT(msg.size(), 1000u) << msg;

  // A whole spec over 1 MiB.
  JobSpec big = ValidNpySpec(dir);
  (*big.mutable_task()->mutable_config()->mutable_fields())["blob"]
      .set_string_value(std::string(2 << 20, 'b'));
  plan = PlanJob(big, Options(dir));
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.status().message(), HasSubstr("(spec): "));
  EXPECT_THAT(plan.status().message(), HasSubstr("limit 1048576"));
  EXPECT_LT(plan.status().message().size(), 1000u);
}

TEST(PlanJobTest, ErrorsQuoteOnlyAShortPrefixAndListAtMost50Problems) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  spec.set_precision(std::string(200, 'p'));
  absl::StatusOr<JobPlan> plan = PlanJob(spec, Options(dir));
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.status().message(),
              HasSubstr("\"" + std::string(64, 'p') + "...\" (200 bytes)"));
  EXPECT_LT(plan.status().message().size(), 600u);

  JobSpec many = ValidNpySpec(dir);
  for (int i = 0; i < 200; ++i) {
    auto* b = many.mutable_model()->add_blocks();
    b->set_out_features(-1);
  }
  plan = PlanJob(many, Options(dir));
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.status().message(), HasSubstr("... and "));
  EXPECT_THAT(plan.status().message(), HasSubstr(" more"));
  EXPECT_LT(plan.status().message().size(), 8000u);
}

TEST(PlanJobTest, ConfinedPathsMustStayInsideTheDataFolder) {
  const std::string dir = TestDir();
  JobSpec spec = ValidNpySpec(dir);
  PlanOptions options = Options(dir);
  options.confine_to = dir;
  // Inside: accepted (relative, absolute, a checkpoint folder not yet made).
  spec.mutable_checkpoint()->set_dir("ckpt/new");
  ASSERT_TRUE(PlanJob(spec, options).ok());
  spec.mutable_data()->mutable_train()->mutable_npy()->set_features(
      dir + "/data/x.npy");
  ASSERT_TRUE(PlanJob(spec, options).ok());

  // Escapes: "..", an absolute path elsewhere, a symlink pointing out.
  ASSERT_EQ(symlink("/etc", (dir + "/data/etc").c_str()), 0);
  spec.mutable_data()->mutable_train()->mutable_npy()->set_features(
      "../outside.npy");
  spec.mutable_data()->mutable_train()->mutable_npy()->set_targets(
      "data/etc/passwd");
  spec.mutable_model()->mutable_init()->set_safetensors("/etc/passwd");
  spec.mutable_checkpoint()->set_dir("/tmp/elsewhere");
  absl::StatusOr<JobPlan> plan = PlanJob(spec, options);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string msg(plan.status().message());
  for (const char* field :
       {"data.train.npy.features: \"../outside.npy\" resolves to",
        "data.train.npy.targets: \"data/etc/passwd\" resolves to "
        "\"/etc/passwd\"",
        "model.init.safetensors: \"/etc/passwd\" resolves to",
        "checkpoint.dir: \"/tmp/elsewhere\" resolves to"}) {
    EXPECT_THAT(msg, HasSubstr(field)) << msg;
  }
  EXPECT_THAT(msg, HasSubstr("outside the data folder"));
  // Nothing of /etc/passwd was read: no header complaint.
  EXPECT_THAT(msg, Not(HasSubstr("header"))) << msg;

  // Without confine_to (trainyard train), the same spec is only checked.
  options.confine_to.clear();
  plan = PlanJob(spec, options);
  EXPECT_THAT(std::string(plan.status().message()),
              Not(HasSubstr("outside the data folder")));
}

TEST(ParseJobSpecTest, UnknownFieldNamesTheSource) {
  absl::StatusOr<JobSpec> spec =
      LoadJobSpecFile("plan/testdata/bad_unknown_field.json");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()),
              HasSubstr("plan/testdata/bad_unknown_field.json: invalid "
                        "job spec JSON: "));
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("activaton"));
}

TEST(ParseJobSpecTest, WrongTypeAndBadJson) {
  absl::StatusOr<JobSpec> spec =
      ParseJobSpecJson(R"({"steps": "many"})", "inline.json");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()),
              HasSubstr("inline.json: invalid job spec JSON: "));
  spec = ParseJobSpecJson("{\"steps\": 3", "cut.json");
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("cut.json: "));
}

TEST(ParseJobSpecTest, AcceptsBothFieldNameStyles) {
  absl::StatusOr<JobSpec> spec =
      ParseJobSpecJson(R"({"data": {"batch_size": 3, "evalEvery": 2}})", "x");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->data().batch_size(), 3);
  EXPECT_EQ(spec->data().eval_every(), 2);
}

TEST(ParseJobSpecTest, MissingFileIsNotFound) {
  absl::StatusOr<JobSpec> spec = LoadJobSpecFile("/nonexistent/spec.json");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(spec.status().message()),
              HasSubstr("/nonexistent/spec.json"));
}

}  // namespace
}  // namespace plan_test
}  // namespace trainyard
