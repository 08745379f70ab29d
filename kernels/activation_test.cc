#include "kernels/activation.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/random.h"
#include "gtest/gtest.h"
#include "kernels/fast_math.h"
#include "kernels/reference.h"

namespace trainyard {
namespace {

using reference::AllClose;
using reference::Vec;

// float32 against float64: a few ulp relative, plus an absolute term for
// the erf approximation (5e-7) times |x| <= ~8 where GELU's output is small.
constexpr double kRtol = 2e-6;
constexpr double kAtol = 4e-6;

struct Shape2 {
  int64_t rows, cols;
};
const Shape2 kShapes[] = {{1, 1}, {3, 17}, {1, 1009}, {17, 3}, {2, 64}};

TEST(FastMathTest, ExpWithinTwoUlp) {
  double worst = 0.0;
  for (double x = -87.0; x <= 88.0; x += 1.0 / 1024 + 1e-7) {
    const float xf = static_cast<float>(x);
    const double e = std::exp(static_cast<double>(xf));
    worst = std::max(worst, std::fabs(fast_math::Exp(xf) - e) / e);
  }
  EXPECT_LE(worst, 2 * 5.97e-8);
  EXPECT_GT(fast_math::Exp(200.0f), 1e38f);  // clamped, not inf/NaN
  EXPECT_LT(fast_math::Exp(-200.0f), 1e-37f);
  EXPECT_EQ(fast_math::Exp(0.0f), 1.0f);
}

TEST(FastMathTest, ErfWithinFiveTimesTenToTheMinusSeven) {
  double worst = 0.0;
  for (double x = -6.0; x <= 6.0; x += 1.0 / 4096 + 1e-7) {
    const float xf = static_cast<float>(x);
    worst = std::max(worst, std::fabs(fast_math::Erf(xf) -
                                      std::erf(static_cast<double>(xf))));
  }
  EXPECT_LE(worst, 5e-7);
  EXPECT_EQ(fast_math::Erf(100.0f), 1.0f);
  EXPECT_EQ(fast_math::Erf(-100.0f), -1.0f);
}

// The float64 reference derivatives agree with central differences of the
// float64 reference functions.
TEST(ActivationReferenceTest, DerivativesMatchFiniteDifferences) {
  Rng rng(3);
  for (Activation act :
       {Activation::kRelu, Activation::kGelu, Activation::kGeluTanh}) {
    for (int i = 0; i < 200; ++i) {
      double x = rng.Normal() * 3.0;
      if (act == Activation::kRelu && std::fabs(x) < 1e-3) x = 0.5;
      const double h = 1e-5;
      const double fd =
          (reference::Act(act, x + h) - reference::Act(act, x - h)) / (2 * h);
      EXPECT_NEAR(reference::ActGrad(act, x), fd, 1e-7) << "x=" << x;
    }
  }
  for (int i = 0; i < 200; ++i) {
    const double x = rng.Normal() * 3.0, h = 1e-5;
    const double fd =
        (reference::Silu(x + h) - reference::Silu(x - h)) / (2 * h);
    EXPECT_NEAR(reference::SiluGrad(x), fd, 1e-7) << "x=" << x;
  }
}

using ForwardFn = void (*)(int64_t, int64_t, const float*, float*, float*);
using BackwardFn = void (*)(int64_t, const float*, float*);

struct Elementwise {
  const char* name;
  Activation act;
  ForwardFn forward;
  BackwardFn backward;
};
const Elementwise kElementwise[] = {
    {"relu", Activation::kRelu, BiasReluForward, ReluBackward},
    {"gelu", Activation::kGelu, BiasGeluForward, GeluBackward},
    {"gelu_tanh", Activation::kGeluTanh, BiasGeluTanhForward, GeluTanhBackward},
};

// As in PyTorch, a NaN input stays NaN through every activation (ReLU
// included: torch.relu(nan) is nan), so a bad input row cannot come out as
// finite numbers.
TEST(ActivationTest, NanPassesThrough) {
  for (const Elementwise& e : kElementwise) {
    std::vector<float> pre = {std::numeric_limits<float>::quiet_NaN(), 1.0f,
                              -1.0f};
    std::vector<float> out(3);
    e.forward(1, 3, nullptr, pre.data(), out.data());
    EXPECT_TRUE(std::isnan(out[0])) << e.name;
    EXPECT_FALSE(std::isnan(out[1])) << e.name;
    EXPECT_FALSE(std::isnan(out[2])) << e.name;
  }
}

TEST(ActivationTest, ForwardAndBackwardMatchFloat64) {
  Rng rng(11);
  for (const Elementwise& e : kElementwise) {
    for (const Shape2& s : kShapes) {
      for (bool with_bias : {false, true}) {
        const int64_t n = s.rows * s.cols;
        const Vec x = reference::RandomVec(&rng, n, 2.5);
        const Vec bias = reference::RandomVec(&rng, s.cols, 0.5);
        const Vec g = reference::RandomVec(&rng, n, 1.0);
        std::vector<float> pre = reference::ToFloat(x);
        std::vector<float> fbias = reference::ToFloat(bias);
        std::vector<float> out(n), grad = reference::ToFloat(g);
        e.forward(s.rows, s.cols, with_bias ? fbias.data() : nullptr,
                  pre.data(), out.data());
        Vec want_out(n), want_grad(n);
        for (int64_t i = 0; i < n; ++i) {
          const float p = with_bias ? static_cast<float>(x[i]) +
                                          static_cast<float>(bias[i % s.cols])
                                    : static_cast<float>(x[i]);
          ASSERT_EQ(pre[i], p) << e.name << " pre-activation " << i;
          want_out[i] = reference::Act(e.act, p);
          want_grad[i] = g[i] * reference::ActGrad(e.act, p);
        }
        const std::string what = std::string(e.name) + " " +
                                 std::to_string(s.rows) + "x" +
                                 std::to_string(s.cols);
        EXPECT_TRUE(AllClose((what + " forward").c_str(), out.data(), want_out,
                             kRtol, kAtol));
        e.backward(n, pre.data(), grad.data());
        EXPECT_TRUE(AllClose((what + " backward").c_str(), grad.data(),
                             want_grad, kRtol, kAtol));
      }
    }
  }
}

TEST(ActivationTest, SwigluForwardAndBackwardMatchFloat64) {
  Rng rng(12);
  for (const Shape2& s : kShapes) {
    for (bool with_bias : {false, true}) {
      const int64_t ffn = s.cols, f1 = 2 * ffn;
      const Vec x = reference::RandomVec(&rng, s.rows * f1, 2.5);
      const Vec bias = reference::RandomVec(&rng, f1, 0.5);
      const Vec g = reference::RandomVec(&rng, s.rows * ffn, 1.0);
      std::vector<float> pre = reference::ToFloat(x);
      std::vector<float> fbias = reference::ToFloat(bias);
      std::vector<float> out(s.rows * ffn), fg = reference::ToFloat(g);
      std::vector<float> d_pre(s.rows * f1);
      BiasSwigluForward(s.rows, ffn, with_bias ? fbias.data() : nullptr,
                        pre.data(), out.data());
      SwigluBackward(s.rows, ffn, pre.data(), fg.data(), d_pre.data());
      Vec want_out(s.rows * ffn), want_d(s.rows * f1);
      for (int64_t r = 0; r < s.rows; ++r) {
        for (int64_t j = 0; j < ffn; ++j) {
          float pa = static_cast<float>(x[r * f1 + j]);
          float pb = static_cast<float>(x[r * f1 + ffn + j]);
          if (with_bias) {
            pa += static_cast<float>(bias[j]);
            pb += static_cast<float>(bias[ffn + j]);
          }
          ASSERT_EQ(pre[r * f1 + j], pa);
          ASSERT_EQ(pre[r * f1 + ffn + j], pb);
          want_out[r * ffn + j] = reference::Silu(pa) * pb;
          want_d[r * f1 + j] = g[r * ffn + j] * pb * reference::SiluGrad(pa);
          want_d[r * f1 + ffn + j] = g[r * ffn + j] * reference::Silu(pa);
        }
      }
      const std::string what =
          "swiglu " + std::to_string(s.rows) + "x" + std::to_string(ffn);
      EXPECT_TRUE(AllClose((what + " forward").c_str(), out.data(), want_out,
                           kRtol, kAtol));
      EXPECT_TRUE(AllClose((what + " backward").c_str(), d_pre.data(), want_d,
                           kRtol, kAtol));
    }
  }
}

// Central differences of the float32 forward kernel itself agree with the
// float32 backward kernel (step 1e-2 in float32: truncation error ~h^2).
TEST(ActivationTest, BackwardMatchesFiniteDifferencesOfForward) {
  Rng rng(13);
  for (const Elementwise& e : kElementwise) {
    for (int i = 0; i < 100; ++i) {
      float x = static_cast<float>(rng.Normal() * 2.0);
      if (e.act == Activation::kRelu && std::fabs(x) < 0.05f) x = 0.5f;
      const float h = 1e-2f;
      float p[3] = {x + h, x - h, x}, o[3];
      e.forward(1, 3, nullptr, p, o);
      const double fd = (static_cast<double>(o[0]) - o[1]) / (2.0 * h);
      float grad = 1.0f;
      e.backward(1, &p[2], &grad);
      EXPECT_NEAR(grad, fd, 2e-4) << e.name << " x=" << x;
    }
  }
}

// The vectorised main loop and the scalar remainder loop give the same bits
// (the same operations in the same order), so outputs do not depend on
// where an element falls in a row or on the vector width.
TEST(ActivationTest, VectorAndScalarPathsAgreeBitwise) {
  Rng rng(14);
  const int64_t n = 1009;
  const std::vector<float> x =
      reference::ToFloat(reference::RandomVec(&rng, n, 4.0));
  for (const Elementwise& e : kElementwise) {
    std::vector<float> pre = x, out(n), grad(n, 1.0f);
    e.forward(1, n, nullptr, pre.data(), out.data());
    e.backward(n, pre.data(), grad.data());
    for (int64_t i = 0; i < n; ++i) {
      float p = x[i], o, gr = 1.0f;
      e.forward(1, 1, nullptr, &p, &o);
      e.backward(1, &p, &gr);
      ASSERT_EQ(0, std::memcmp(&o, &out[i], sizeof(float))) << e.name << i;
      ASSERT_EQ(0, std::memcmp(&gr, &grad[i], sizeof(float))) << e.name << i;
    }
  }
  std::vector<float> pre2 =
      reference::ToFloat(reference::RandomVec(&rng, 2 * n, 4.0));
  std::vector<float> out(n), g(n, 1.0f), d(2 * n);
  BiasSwigluForward(1, n, nullptr, pre2.data(), out.data());
  SwigluBackward(1, n, pre2.data(), g.data(), d.data());
  for (int64_t i = 0; i < n; ++i) {
    float p[2] = {pre2[i], pre2[n + i]}, o, one = 1.0f, dp[2];
    BiasSwigluForward(1, 1, nullptr, p, &o);
    SwigluBackward(1, 1, p, &one, dp);
    ASSERT_EQ(0, std::memcmp(&o, &out[i], sizeof(float))) << i;
    ASSERT_EQ(0, std::memcmp(&dp[0], &d[i], sizeof(float))) << i;
    ASSERT_EQ(0, std::memcmp(&dp[1], &d[n + i], sizeof(float))) << i;
  }
}

}  // namespace
}  // namespace trainyard
