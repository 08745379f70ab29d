#include "engine/step_reducer.h"

#include <cmath>
#include <string>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/in_process_transport.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;

// Three parameters: two on stage 0, one on stage 1.
JobPlan ThreeParams(double clip) {
  JobPlan plan;
  for (int p = 0; p < 3; ++p) {
    JobPlan::ParamSpec ps;
    ps.name = "blocks." + std::to_string(p) + ".fc1.weight";
    ps.stage = p < 2 ? 0 : 1;
    plan.params.push_back(ps);
  }
  plan.spec.mutable_optimizer()->set_clip_grad(clip);
  return plan;
}

TEST(StepReducerTest, OneStageCombinesLossNormAndScale) {
  JobPlan plan = ThreeParams(0);
  StepContributions mine;
  mine.params = {0, 1, 2};
  mine.sums_of_squares = {4.0, 9.0, 3.0};  // total 16
  mine.is_last = true;
  mine.weight_sum = 8;
  mine.loss_sum = 12;
  double comm = 0;
  auto t =
      ReduceStep(plan, mine, nullptr, absl::Seconds(1), 0, "stage 0", &comm);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->loss, 1.5);
  EXPECT_EQ(t->grad_norm, 0.5);  // sqrt(16) / 8
  EXPECT_EQ(t->grad_scale, 0.125);
}

TEST(StepReducerTest, ClipScalesDownOnlyAboveTheLimit) {
  StepContributions mine;
  mine.params = {0, 1, 2};
  mine.sums_of_squares = {4.0, 9.0, 3.0};
  mine.is_last = true;
  mine.weight_sum = 1;
  mine.loss_sum = 1;
  double comm = 0;
  auto clipped = ReduceStep(ThreeParams(2.0), mine, nullptr, absl::Seconds(1),
                            0, "stage 0", &comm);
  ASSERT_TRUE(clipped.ok());
  EXPECT_DOUBLE_EQ(clipped->grad_scale, 2.0 / (4.0 + 1e-6));
  auto unclipped = ReduceStep(ThreeParams(10.0), mine, nullptr,
                              absl::Seconds(1), 0, "stage 0", &comm);
  ASSERT_TRUE(unclipped.ok());
  EXPECT_EQ(unclipped->grad_scale, 1.0);
}

TEST(StepReducerTest, RefusesAStepWithoutLossWeight) {
  StepContributions mine;
  mine.params = {0, 1, 2};
  mine.sums_of_squares = {1, 1, 1};
  mine.is_last = true;
  double comm = 0;
  auto t = ReduceStep(ThreeParams(0), mine, nullptr, absl::Seconds(1), 6,
                      "stage 0", &comm);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(t.status().message(),
              HasSubstr("step 7: total loss weight is 0"));
}

TEST(StepReducerTest, NamesTheParameterWithANonFiniteGradient) {
  StepContributions mine;
  mine.params = {0, 1, 2};
  mine.sums_of_squares = {1, NAN, 1};
  mine.is_last = true;
  mine.weight_sum = 1;
  double comm = 0;
  auto t = ReduceStep(ThreeParams(0), mine, nullptr, absl::Seconds(1), 0,
                      "stage 0", &comm);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(),
              HasSubstr("stage 0 parameter blocks.1.fc1.weight has a "
                        "non-finite gradient"));
}

// Two stages as threads: each contributes its own slots; both agree bit
// for bit with the one-stage result.
TEST(StepReducerTest, TwoStagesAgreeWithOne) {
  JobPlan plan = ThreeParams(1.0);
  InProcessHub hub(2);
  StepContributions s0, s1;
  s0.params = {0, 1};
  s0.sums_of_squares = {0.25, 0.5};
  s1.params = {2};
  s1.sums_of_squares = {0.125};
  s1.is_last = true;
  s1.weight_sum = 3;
  s1.loss_sum = 2;
  absl::StatusOr<StepTotals> r0, r1;
  double c0 = 0, c1 = 0;
  std::thread t1([&] {
    r1 = ReduceStep(plan, s1, hub.rank(1), absl::Seconds(5), 0, "stage 1", &c1);
  });
  r0 = ReduceStep(plan, s0, hub.rank(0), absl::Seconds(5), 0, "stage 0", &c0);
  t1.join();
  ASSERT_TRUE(r0.ok()) << r0.status();
  ASSERT_TRUE(r1.ok()) << r1.status();
  StepContributions all;
  all.params = {0, 1, 2};
  all.sums_of_squares = {0.25, 0.5, 0.125};
  all.is_last = true;
  all.weight_sum = 3;
  all.loss_sum = 2;
  double c = 0;
  auto one = ReduceStep(plan, all, nullptr, absl::Seconds(1), 0, "stage 0", &c);
  ASSERT_TRUE(one.ok());
  for (const auto* r : {&*r0, &*r1}) {
    EXPECT_EQ(r->loss, one->loss);
    EXPECT_EQ(r->grad_norm, one->grad_norm);
    EXPECT_EQ(r->grad_scale, one->grad_scale);
  }
}

}  // namespace
}  // namespace trainyard
