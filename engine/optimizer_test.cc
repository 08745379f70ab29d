#include "engine/optimizer.h"

#include <cmath>
#include <cstring>

#include "core/random.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/parallel.h"

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

// Segments over several of the optimizer's 65536-element chunks, with sizes
// that are not multiples of a chunk, a vector or a prefetch block.
std::vector<ParamSegment> ChunkedSegments(int64_t* total) {
  ParamSegment w{"blocks.0.fc1.weight", {3, 70001}, 0, true};
  ParamSegment b{"blocks.0.fc1.bias", {77}, w.size(), false};
  ParamSegment w2{"blocks.0.fc2.weight", {65536}, b.offset + 77, true};
  *total = w2.offset + w2.size();
  return {w, b, w2};
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Parameters and state after `steps` updates on `threads` compute threads.
std::vector<float> RunSteps(const trainyard::v1::OptimizerSpec& spec,
                            int threads, int steps) {
  const int saved = ComputeThreads();
  SetComputeThreads(threads);
  int64_t n = 0;
  std::vector<ParamSegment> segs = ChunkedSegments(&n);
  auto opt = StageOptimizer::Create(spec, std::move(segs), n);
  EXPECT_TRUE(opt.ok()) << opt.status();
  std::vector<float> p = Random(n, 7);
  for (int t = 0; t < steps; ++t) {
    opt->Step(p.data(), Random(n, 70 + t).data(), 1e-2, 0.75);
  }
  for (auto& [name, state] : opt->StateTensors()) {
    p.insert(p.end(), state.data<float>(), state.data<float>() + state.numel());
  }
  SetComputeThreads(saved);
  return p;
}

TEST(StageOptimizerTest, AdamWSameBitsOnOneAndTwoThreads) {
  EXPECT_TRUE(SameBits(RunSteps(AdamW(1e-2, 0.1), 1, 3),
                       RunSteps(AdamW(1e-2, 0.1), 2, 3)));
}

TEST(StageOptimizerTest, SgdSameBitsOnOneAndTwoThreads) {
  trainyard::v1::OptimizerSpec s;
  s.set_type("sgd");
  s.set_momentum(0.9);
  s.set_dampening(0.1);
  s.set_weight_decay(0.01);
  EXPECT_TRUE(SameBits(RunSteps(s, 1, 3), RunSteps(s, 2, 3)));
}

// The vectorised, prefetching update is bit for bit the scalar float
// formula in torch's operation order.
TEST(StageOptimizerTest, AdamWBitwiseScalarFormula) {
  const double lr = 1e-2, wd = 0.1, b1 = 0.9, b2 = 0.999;
  const float eps = 1e-8f;
  int64_t n = 0;
  const std::vector<ParamSegment> segs = ChunkedSegments(&n);
  auto opt = StageOptimizer::Create(AdamW(lr, wd), segs, n);
  ASSERT_TRUE(opt.ok()) << opt.status();
  std::vector<float> p = Random(n, 8), want = p, m(n, 0), v(n, 0);
  for (int t = 1; t <= 2; ++t) {
    const std::vector<float> g = Random(n, 80 + t);
    opt->Step(p.data(), g.data(), lr, 0.5);
    const float step = static_cast<float>(-(lr / (1.0 - std::pow(b1, t))));
    const float bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(b2, t)));
    for (const ParamSegment& s : segs) {
      const float decay = static_cast<float>(1.0 - lr * (s.decay ? wd : 0.0));
      for (int64_t i = s.offset; i < s.offset + s.size(); ++i) {
        const float gi = g[i] * 0.5f;
        const float pi = want[i] * decay;
        m[i] =
            m[i] * static_cast<float>(b1) + static_cast<float>(1.0 - b1) * gi;
        v[i] = v[i] * static_cast<float>(b2) +
               (static_cast<float>(1.0 - b2) * gi) * gi;
        const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
        want[i] = pi + (step * m[i]) / denom;
      }
    }
  }
  EXPECT_TRUE(SameBits(p, want));
}

// The documented reduction: per segment, chunks of 65536 elements, each
// summed in 8 double lanes (tail to lane 0, lanes added in order), chunks
// added in order.
double PinnedSumOfSquares(const float* x, int64_t n) {
  double total = 0;
  for (int64_t c = 0; c < n; c += 65536) {
    const int64_t len = std::min<int64_t>(65536, n - c);
    double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t i = 0; i < len; ++i) {
      const double xi = x[c + i];
      lanes[i < len / 8 * 8 ? i % 8 : 0] += xi * xi;
    }
    double chunk = 0;
    for (double l : lanes) chunk += l;
    total += chunk;
  }
  return total;
}

TEST(StageOptimizerTest, GradSumsOfSquaresPinnedOrderOnOneAndTwoThreads) {
  int64_t n = 0;
  const std::vector<ParamSegment> segs = ChunkedSegments(&n);
  auto opt = StageOptimizer::Create(AdamW(1e-3, 0.0), segs, n);
  ASSERT_TRUE(opt.ok()) << opt.status();
  // Each lane and each element at its own scale, so that any other order of
  // the additions rounds differently.
  std::vector<float> g = Random(n, 9);
  for (int64_t i = 0; i < n; ++i) {
    g[i] = std::ldexp(g[i], static_cast<int>(i % 8 * 4 + i * 7919 % 9) - 20);
  }
  const int saved = ComputeThreads();
  for (int threads : {1, 2}) {
    SetComputeThreads(threads);
    const std::vector<double> sums = opt->GradSumsOfSquares(g.data());
    ASSERT_EQ(sums.size(), segs.size());
    for (size_t i = 0; i < segs.size(); ++i) {
      const double want =
          PinnedSumOfSquares(g.data() + segs[i].offset, segs[i].size());
      EXPECT_EQ(std::memcmp(&sums[i], &want, sizeof(double)), 0)
          << segs[i].name << " on " << threads << " threads: " << sums[i]
          << " vs " << want;
    }
  }
  SetComputeThreads(saved);
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
