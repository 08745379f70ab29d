#include "engine/lr_schedule.h"

#include <cmath>

#include "gtest/gtest.h"

namespace trainyard {
namespace {

trainyard::v1::OptimizerSpec Opt(const std::string& type, double lr,
                                 int64_t warmup, double min_lr, int64_t total) {
  trainyard::v1::OptimizerSpec opt;
  opt.set_lr(lr);
  opt.mutable_schedule()->set_type(type);
  opt.mutable_schedule()->set_warmup_steps(warmup);
  opt.mutable_schedule()->set_min_lr(min_lr);
  opt.mutable_schedule()->set_total_steps(total);
  return opt;
}

TEST(LearningRateTest, ConstantWithoutWarmupIsLr) {
  auto opt = Opt("constant", 0.1, 0, 0, 100);
  for (int64_t s : {0, 1, 50, 99, 500})
    EXPECT_DOUBLE_EQ(LearningRate(opt, s), 0.1);
  EXPECT_DOUBLE_EQ(LearningRate(Opt("", 0.3, 0, 0, 0), 7), 0.3);
}

TEST(LearningRateTest, WarmupIsLinearFromZeroAndReachesLrOnLastWarmupStep) {
  auto opt = Opt("constant", 0.2, 4, 0, 100);
  EXPECT_DOUBLE_EQ(LearningRate(opt, 0), 0.05);
  EXPECT_DOUBLE_EQ(LearningRate(opt, 1), 0.1);
  EXPECT_DOUBLE_EQ(LearningRate(opt, 2), 0.15);
  EXPECT_DOUBLE_EQ(LearningRate(opt, 3), 0.2);
  EXPECT_DOUBLE_EQ(LearningRate(opt, 4), 0.2);
}

TEST(LearningRateTest, CosineStartsAtLrPassesMidpointAndEndsAtMinLr) {
  // W = 2, T = 12: decay over steps 2..12, p = (s - 2) / 10.
  auto opt = Opt("cosine", 1.0, 2, 0.1, 12);
  EXPECT_DOUBLE_EQ(LearningRate(opt, 0), 0.5);
  EXPECT_DOUBLE_EQ(LearningRate(opt, 2), 1.0);
  EXPECT_NEAR(LearningRate(opt, 7), 0.55, 1e-12);  // p = 0.5
  EXPECT_NEAR(LearningRate(opt, 4),
              0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 0.2)), 1e-12);
  EXPECT_NEAR(LearningRate(opt, 12), 0.1, 1e-12);
  EXPECT_NEAR(LearningRate(opt, 1000), 0.1, 1e-12);  // clamped past T
}

TEST(LearningRateTest, LinearDecaysToMinLr) {
  auto opt = Opt("linear", 1.0, 0, 0.2, 8);
  EXPECT_DOUBLE_EQ(LearningRate(opt, 0), 1.0);
  EXPECT_NEAR(LearningRate(opt, 2), 0.8, 1e-12);  // p = 0.25
  EXPECT_NEAR(LearningRate(opt, 4), 0.6, 1e-12);
  EXPECT_NEAR(LearningRate(opt, 8), 0.2, 1e-12);
  EXPECT_NEAR(LearningRate(opt, 9), 0.2, 1e-12);
}

TEST(LearningRateTest, DecayHorizonEqualToWarmupUsesDenominatorOne) {
  // T - W = 0: max(1, T - W) = 1, so the first post-warmup step is p = 0
  // and the next is fully decayed.
  auto opt = Opt("linear", 1.0, 3, 0.0, 3);
  EXPECT_DOUBLE_EQ(LearningRate(opt, 3), 1.0);
  EXPECT_DOUBLE_EQ(LearningRate(opt, 4), 0.0);
}

}  // namespace
}  // namespace trainyard
