#include "cli/pass_costs.h"

#include <cstdint>
#include <optional>

#include "gtest/gtest.h"
#include "proto/trainyard.pb.h"
#include "schedule/schedule.h"

namespace trainyard {
namespace {

TEST(ParseCostsTest, ThreeFiniteNonNegativeTimesNotAllZero) {
  std::optional<PassCosts> c = ParseCosts("1,2,0");
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->forward, 1);
  EXPECT_EQ(c->backward_input, 2);
  EXPECT_EQ(c->backward_weight, 0);
  c = ParseCosts("0.5,1.5,2.5");
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->forward, 0.5);
  EXPECT_EQ(c->backward_input, 1.5);
  EXPECT_EQ(c->backward_weight, 2.5);

  for (const char* bad : {"", "1,1", "1,1,1,1", "1,x,1", "-1,1,1", "inf,1,1",
                          "nan,1,1", "0,0,0", "1,,1"}) {
    EXPECT_FALSE(ParseCosts(bad).has_value()) << bad;
  }
}

void AddSpan(v1::StageTrace* stage, v1::SpanKind kind, int microbatch,
             int64_t start_us, int64_t end_us) {
  v1::StageSpan* span = stage->add_spans();
  span->set_kind(kind);
  span->set_microbatch(microbatch);
  span->set_start_us(start_us);
  span->set_end_us(end_us);
}

TEST(MeanPassCostsTest, MillisecondsPerMicrobatchOverStages) {
  v1::GetTraceResponse trace;
  // Stage 0, two chunks: two forward spans of microbatch 0 make one
  // whole-stage forward.
  v1::StageTrace* s0 = trace.add_stages();
  AddSpan(s0, v1::SPAN_FORWARD, 0, 0, 1000);
  AddSpan(s0, v1::SPAN_FORWARD, 0, 1000, 2000);
  AddSpan(s0, v1::SPAN_BACKWARD_INPUT, 0, 2000, 5000);
  AddSpan(s0, v1::SPAN_BACKWARD_WEIGHT, 0, 5000, 6000);
  AddSpan(s0, v1::SPAN_OPTIMIZER, -1, 6000, 9000);  // not a pass
  // Stage 1, one chunk, two microbatches.
  v1::StageTrace* s1 = trace.add_stages();
  AddSpan(s1, v1::SPAN_FORWARD, 0, 0, 4000);
  AddSpan(s1, v1::SPAN_FORWARD, 1, 4000, 8000);
  AddSpan(s1, v1::SPAN_BACKWARD_INPUT, 0, 8000, 11000);
  AddSpan(s1, v1::SPAN_BACKWARD_INPUT, 1, 11000, 14000);
  AddSpan(s1, v1::SPAN_BACKWARD_WEIGHT, 0, 14000, 16000);
  AddSpan(s1, v1::SPAN_BACKWARD_WEIGHT, 1, 16000, 18000);

  std::optional<PassCosts> c = MeanPassCosts(trace);
  ASSERT_TRUE(c.has_value());
  EXPECT_DOUBLE_EQ(c->forward, (2.0 + 8.0) / 3);
  EXPECT_DOUBLE_EQ(c->backward_input, (3.0 + 6.0) / 3);
  EXPECT_DOUBLE_EQ(c->backward_weight, (1.0 + 4.0) / 3);
}

// A stage that chains its weight passes traces them as one span of no
// microbatch (-1): its time is shared by the microbatches run forward.
TEST(MeanPassCostsTest, ChainedWeightPassesCountForEveryMicrobatch) {
  v1::GetTraceResponse trace;
  v1::StageTrace* s0 = trace.add_stages();
  for (int m = 0; m < 4; ++m) {
    AddSpan(s0, v1::SPAN_FORWARD, m, 1000 * m, 1000 * m + 1000);
    AddSpan(s0, v1::SPAN_BACKWARD_INPUT, m, 5000, 6000);
  }
  AddSpan(s0, v1::SPAN_BACKWARD_WEIGHT, -1, 9000, 15000);
  std::optional<PassCosts> c = MeanPassCosts(trace);
  ASSERT_TRUE(c.has_value());
  EXPECT_DOUBLE_EQ(c->backward_weight, 6.0 / 4);
}

TEST(MeanPassCostsTest, NoneWithoutEveryKindOfPass) {
  v1::GetTraceResponse trace;
  EXPECT_FALSE(MeanPassCosts(trace).has_value());
  v1::StageTrace* s0 = trace.add_stages();
  AddSpan(s0, v1::SPAN_FORWARD, 0, 0, 1000);
  AddSpan(s0, v1::SPAN_BACKWARD_INPUT, 0, 1000, 2000);
  EXPECT_FALSE(MeanPassCosts(trace).has_value());
  AddSpan(s0, v1::SPAN_BACKWARD_WEIGHT, 0, 2000, 2500);
  ASSERT_TRUE(MeanPassCosts(trace).has_value());
  EXPECT_DOUBLE_EQ(MeanPassCosts(trace)->backward_weight, 0.5);
}

}  // namespace
}  // namespace trainyard
