#include "engine/optimizer.h"

#include <cmath>

#include "core/random.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;

trainyard::v1::OptimizerSpec AdamW(double lr, double wd) {
  trainyard::v1::OptimizerSpec s;
  s.set_type("adamw");
  s.set_lr(lr);
  s.set_beta1(0.9);
  s.set_beta2(0.999);
  s.set_eps(1e-8);
  s.set_weight_decay(wd);
  return s;
}

std::vector<ParamSegment> TwoSegments() {
  ParamSegment w{"blocks.0.fc1.weight", {3, 5}, 0, true};
  ParamSegment b{"blocks.0.fc1.bias", {3}, 15, false};
  return {w, b};
}

std::vector<float> Random(int n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = rng.Uniform(-1, 1);
  return v;
}

// torch.optim.AdamW's update, in double.
TEST(StageOptimizerTest, AdamWMatchesTorchFormula) {
  const double lr = 1e-2, wd = 0.1, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  auto opt = StageOptimizer::Create(AdamW(lr, wd), TwoSegments(), 18);
  ASSERT_TRUE(opt.ok()) << opt.status();
  std::vector<float> p = Random(18, 1);
  std::vector<double> ref_p(p.begin(), p.end()), m(18, 0), v(18, 0);
  const double scale = 0.5;
  for (int t = 1; t <= 5; ++t) {
    std::vector<float> g = Random(18, 100 + t);
    opt->Step(p.data(), g.data(), lr, scale);
    for (int i = 0; i < 18; ++i) {
      const double gi = double(g[i]) * scale;
      const double decay = i < 15 ? wd : 0.0;
      ref_p[i] *= 1 - lr * decay;
      m[i] = b1 * m[i] + (1 - b1) * gi;
      v[i] = b2 * v[i] + (1 - b2) * gi * gi;
      const double mhat = m[i] / (1 - std::pow(b1, t));
      const double denom =
          std::sqrt(v[i]) / std::sqrt(1 - std::pow(b2, t)) + eps;
      ref_p[i] -= lr * mhat / denom;
    }
  }
  for (int i = 0; i < 18; ++i) {
    EXPECT_NEAR(p[i], ref_p[i], 1e-6 * std::max(1.0, std::abs(ref_p[i]))) << i;
  }
  EXPECT_EQ(opt->step_count(), 5);
}

TEST(StageOptimizerTest, SgdNesterovMatchesTorchFormula) {
  trainyard::v1::OptimizerSpec s;
  s.set_type("sgd");
  s.set_lr(0.1);
  s.set_momentum(0.9);
  s.set_nesterov(true);
  s.set_weight_decay(0.01);
  auto opt = StageOptimizer::Create(s, TwoSegments(), 18);
  ASSERT_TRUE(opt.ok());
  std::vector<float> p = Random(18, 2);
  std::vector<double> ref(p.begin(), p.end()), buf(18, 0);
  for (int t = 1; t <= 4; ++t) {
    std::vector<float> g = Random(18, 200 + t);
    opt->Step(p.data(), g.data(), 0.1, 1.0);
    for (int i = 0; i < 18; ++i) {
      double gi = g[i] + (i < 15 ? 0.01 * ref[i] : 0.0);
      buf[i] = t == 1 ? gi : 0.9 * buf[i] + gi;  // torch: first step buf = g
      gi = gi + 0.9 * buf[i];
      ref[i] -= 0.1 * gi;
    }
  }
  for (int i = 0; i < 18; ++i) EXPECT_NEAR(p[i], ref[i], 1e-5) << i;
}

TEST(StageOptimizerTest, PlainSgdHasNoState) {
  trainyard::v1::OptimizerSpec s;
  s.set_type("sgd");
  s.set_lr(0.5);
  auto opt = StageOptimizer::Create(s, TwoSegments(), 18);
  ASSERT_TRUE(opt.ok());
  EXPECT_TRUE(opt->StateTensors().empty());
  std::vector<float> p(18, 1.0f), g(18, 2.0f);
  opt->Step(p.data(), g.data(), 0.5, 0.25);
  for (float x : p) EXPECT_FLOAT_EQ(x, 1.0f - 0.5f * 0.5f);
}

TEST(StageOptimizerTest, StateRoundTripContinuesBitwise) {
  auto a = StageOptimizer::Create(AdamW(1e-3, 0.01), TwoSegments(), 18);
  ASSERT_TRUE(a.ok());
  std::vector<float> pa = Random(18, 3);
  for (int t = 0; t < 3; ++t)
    a->Step(pa.data(), Random(18, 300 + t).data(), 1e-3, 1.0);
  // Save into a map the way a checkpoint would, restore into a fresh one.
  std::map<std::string, Tensor> saved;
  for (auto& [name, t] : a->StateTensors()) saved[name] = t.Clone();
  auto b = StageOptimizer::Create(AdamW(1e-3, 0.01), TwoSegments(), 18);
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(b->LoadState(saved, a->step_count()).ok());
  std::vector<float> pb = pa;
  auto g = Random(18, 999);
  a->Step(pa.data(), g.data(), 1e-3, 1.0);
  b->Step(pb.data(), g.data(), 1e-3, 1.0);
  EXPECT_EQ(pa, pb);
}

TEST(StageOptimizerTest, LoadStateNamesMissingTensor) {
  auto a = StageOptimizer::Create(AdamW(1e-3, 0.0), TwoSegments(), 18);
  ASSERT_TRUE(a.ok());
  absl::Status st = a->LoadState({}, 1);
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(st.message(),
              HasSubstr("optimizer.blocks.0.fc1.weight.exp_avg is missing"));
}

TEST(StageOptimizerTest, UnknownTypeFails) {
  trainyard::v1::OptimizerSpec s;
  s.set_type("lion");
  auto opt = StageOptimizer::Create(s, TwoSegments(), 18);
  EXPECT_EQ(opt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(opt.status().message(), HasSubstr("\"lion\""));
}

}  // namespace
}  // namespace trainyard
