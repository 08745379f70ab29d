#include "cli/job_format.h"

#include <string>

#include "gtest/gtest.h"
#include "proto/trainyard.pb.h"

namespace trainyard {
namespace {

TEST(FormatEtaTest, MinutesHoursAndUnknown) {
  EXPECT_EQ(FormatEta(0), "0:00");
  EXPECT_EQ(FormatEta(59.4), "0:59");
  EXPECT_EQ(FormatEta(59.5), "1:00");
  EXPECT_EQ(FormatEta(3599), "59:59");
  EXPECT_EQ(FormatEta(3600), "1:00:00");
  EXPECT_EQ(FormatEta(90061), "25:01:01");
  EXPECT_EQ(FormatEta(-1), "--:--");
  EXPECT_EQ(FormatEta(0.0 / 0.0), "--:--");
  EXPECT_EQ(FormatEta(2e7), "--:--");
}

TEST(FormatMetricsTest, SortedWithPrefixAndLossOnce) {
  google::protobuf::Map<std::string, double> m;
  m["loss"] = 0.5;
  m["accuracy"] = 0.875;
  m["b"] = 1.0 / 3;
  EXPECT_EQ(FormatMetrics(m, "eval_", 0.5),
            " eval_accuracy=0.875 eval_b=0.333333");
  // A "loss" metric that differs from the loss printed is kept.
  EXPECT_EQ(FormatMetrics(m, "", 0.25), " accuracy=0.875 b=0.333333 loss=0.5");
  EXPECT_EQ(FormatMetrics({}, "", 0), "");
}

TEST(FormatLogLineTest, StageWorkerSeverityAndText) {
  v1::LogLine l;
  l.set_stage(1);
  l.set_worker_id("w-3");
  l.set_worker_name("worker-1");
  l.set_time_ms(1234);
  l.set_text("hello");
  const std::string plain = FormatLogLine(l);
  EXPECT_EQ(plain.rfind("[stage 1 w-3 worker-1] ", 0), 0u) << plain;
  EXPECT_EQ(plain.substr(plain.size() - 13), ":01.234 hello") << plain;

  l.set_severity(v1::LOG_SEVERITY_WARNING);
  EXPECT_NE(FormatLogLine(l).find(".234 WARNING: hello"), std::string::npos);
  l.set_severity(v1::LOG_SEVERITY_ERROR);
  EXPECT_NE(FormatLogLine(l).find(".234 ERROR: hello"), std::string::npos);
}

TEST(FormatProgressTest, StepsRowsOrEvalByKind) {
  v1::Job job;
  job.mutable_spec()->set_steps(300);
  job.set_steps_completed(12);
  EXPECT_EQ(FormatProgress(job), "12/300");
  job.mutable_spec()->set_kind("train");
  EXPECT_EQ(FormatProgress(job), "12/300");
  job.mutable_spec()->set_kind("infer");
  job.mutable_progress()->set_rows_done(640);
  job.mutable_progress()->set_rows_total(1000);
  EXPECT_EQ(FormatProgress(job), "rows 640/1000");
  job.mutable_spec()->set_kind("eval");
  EXPECT_EQ(FormatProgress(job), "eval");
  job.mutable_last_eval()->set_loss(0.5);
  EXPECT_EQ(FormatProgress(job), "eval done");
}

TEST(ToJsonTest, IndentedWithProtoFieldNames) {
  v1::Job job;
  job.set_job_id("job-1");
  job.set_steps_completed(3);
  const std::string json = ToJson(job);
  EXPECT_NE(json.find("\"job_id\": \"job-1\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"steps_completed\": \"3\""), std::string::npos) << json;
  EXPECT_NE(json.find('\n'), std::string::npos) << json;
}

}  // namespace
}  // namespace trainyard
