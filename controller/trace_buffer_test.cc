#include "controller/trace_buffer.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;

v1::StageTrace Trace(int stage, int spans, int64_t step_us = 1000) {
  v1::StageTrace t;
  t.set_stage(stage);
  t.set_step_us(step_us);
  for (int i = 0; i < spans; ++i) {
    v1::StageSpan* s = t.add_spans();
    s->set_kind(v1::SPAN_FORWARD);
    s->set_microbatch(i);
    s->set_start_us(10 * i);
    s->set_end_us(10 * i + 5);
  }
  return t;
}

TEST(TraceBufferTest, ReturnsEveryStageOfTheStep) {
  TraceBuffer b(2);
  b.AddStep(1, 0, Trace(1, 3));
  b.AddStep(1, 0, Trace(0, 2));
  auto got = b.Get("job-1", 1);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->stages_size(), 2);
  EXPECT_EQ(got->stages(0).stage(), 0);
  EXPECT_EQ(got->stages(0).spans_size(), 2);
  EXPECT_EQ(got->stages(1).spans_size(), 3);
  EXPECT_EQ(got->num_stages(), 2);
}

TEST(TraceBufferTest, StepZeroIsTheNewestCompleteStep) {
  TraceBuffer b(2);
  b.AddStep(4, 0, Trace(0, 1));
  b.AddStep(4, 0, Trace(1, 1));
  b.AddStep(5, 0, Trace(0, 1));  // stage 1 has not reported step 5 yet
  auto got = b.Get("job-1", 0);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->step(), 4);
  EXPECT_EQ(got->newest_step(), 5);
}

TEST(TraceBufferTest, KeepsOnlyTheNewestSteps) {
  TraceLimits limits;
  limits.max_steps = 3;
  TraceBuffer b(1, limits);
  for (int64_t step = 1; step <= 10; ++step) b.AddStep(step, 0, Trace(0, 1));
  EXPECT_EQ(b.steps(), 3);
  auto gone = b.Get("job-7", 2);
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(gone.status().message(), HasSubstr("job job-7: step 2"));
  EXPECT_THAT(gone.status().message(), HasSubstr("steps 8..10"));
  EXPECT_TRUE(b.Get("job-7", 8).ok());
}

TEST(TraceBufferTest, StaysWithinItsByteLimit) {
  TraceLimits limits;
  limits.max_bytes = 4096;
  TraceBuffer b(1, limits);
  for (int64_t step = 1; step <= 100; ++step) {
    b.AddStep(step, 0, Trace(0, 40));
    EXPECT_LE(b.bytes(), limits.max_bytes);
  }
  EXPECT_GT(b.steps(), 0);
  EXPECT_LT(b.steps(), 100);
  EXPECT_TRUE(b.Get("job-1", 100).ok());
}

TEST(TraceBufferTest, CutsAStageTraceAtTheSpanLimit) {
  TraceLimits limits;
  limits.max_spans = 10;
  TraceBuffer b(1, limits);
  b.AddStep(1, 0, Trace(0, 25));
  auto got = b.Get("job-1", 1);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->stages(0).spans_size(), 10);
  EXPECT_TRUE(got->stages(0).truncated());
}

TEST(TraceBufferTest, DropsMalformedSpansAndStages) {
  TraceBuffer b(2);
  v1::StageTrace t = Trace(0, 2);
  t.mutable_spans(0)->set_end_us(-1);
  b.AddStep(1, 0, t);
  b.AddStep(1, 0, Trace(5, 2));  // no such stage
  b.AddStep(0, 0, Trace(1, 2));  // no such step
  auto got = b.Get("job-1", 1);
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->stages_size(), 1);
  EXPECT_EQ(got->stages(0).spans_size(), 1);
}

TEST(TraceBufferTest, ANewerAttemptReplacesTheStep) {
  TraceBuffer b(2);
  b.AddStep(3, 0, Trace(0, 1));
  b.AddStep(3, 0, Trace(1, 1));
  b.AddStep(3, 1, Trace(1, 4));  // the restarted gang recomputed step 3
  b.AddStep(3, 0, Trace(0, 9));  // a late report of the old gang
  auto got = b.Get("job-1", 3);
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->stages_size(), 1);
  EXPECT_EQ(got->stages(0).stage(), 1);
  EXPECT_EQ(got->stages(0).spans_size(), 4);
}

TEST(TraceBufferTest, EvalSpansJoinTheirStep) {
  TraceBuffer b(1);
  b.AddStep(4, 0, Trace(0, 2));
  v1::StageTrace eval;
  eval.set_stage(0);
  v1::StageSpan* s = eval.add_spans();
  s->set_kind(v1::SPAN_EVAL);
  s->set_microbatch(-1);
  s->set_start_us(1100);
  s->set_end_us(1500);
  b.AddEval(4, 0, eval);
  b.AddEval(9, 0, eval);  // not held: ignored
  auto got = b.Get("job-1", 4);
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->stages(0).spans_size(), 3);
  EXPECT_EQ(got->stages(0).spans(2).kind(), v1::SPAN_EVAL);
  EXPECT_EQ(b.steps(), 1);
}

TEST(TraceBufferTest, EmptyBufferSaysWhy) {
  TraceBuffer b(2);
  auto got = b.Get("job-3", 0);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(got.status().message(), HasSubstr("job job-3: no step traces"));
}

}  // namespace
}  // namespace trainyard
