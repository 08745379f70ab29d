#include "kernels/norm.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/random.h"
#include "gtest/gtest.h"
#include "kernels/reference.h"

namespace trainyard {
namespace {

using reference::AllClose;
using reference::Vec;

constexpr double kEps = 1e-5;
constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-5;

struct Shape2 {
  int64_t rows, cols;
};
const Shape2 kShapes[] = {{1, 17}, {3, 1009}, {17, 3}, {5, 1}, {2, 64}};

double Dot(const Vec& a, const Vec& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Central difference of loss(v) = sum(f(v) * dy) at v[i].
template <typename F>
double FiniteDiff(Vec v, int64_t i, const Vec& dy, F f) {
  const double h = 1e-6;
  const double orig = v[i];
  v[i] = orig + h;
  const double plus = Dot(f(v), dy);
  v[i] = orig - h;
  const double minus = Dot(f(v), dy);
  return (plus - minus) / (2 * h);
}

TEST(NormReferenceTest, LayerNormGradientsMatchFiniteDifferences) {
  Rng rng(21);
  const int64_t rows = 3, cols = 17;
  const Vec x = reference::RandomVec(&rng, rows * cols, 1.5);
  const Vec w = reference::RandomVec(&rng, cols, 1.0);
  const Vec b = reference::RandomVec(&rng, cols, 1.0);
  const Vec dy = reference::RandomVec(&rng, rows * cols, 1.0);
  Vec dx, dw, db;
  reference::LayerNormBackward(rows, cols, x, w, kEps, dy, &dx, &dw, &db);
  for (int64_t i = 0; i < rows * cols; i += 5) {
    EXPECT_NEAR(dx[i],
                FiniteDiff(x, i, dy,
                           [&](const Vec& v) {
                             return reference::LayerNorm(rows, cols, v, w, b,
                                                         kEps);
                           }),
                1e-6);
  }
  for (int64_t i = 0; i < cols; i += 3) {
    EXPECT_NEAR(dw[i],
                FiniteDiff(w, i, dy,
                           [&](const Vec& v) {
                             return reference::LayerNorm(rows, cols, x, v, b,
                                                         kEps);
                           }),
                1e-6);
    EXPECT_NEAR(db[i],
                FiniteDiff(b, i, dy,
                           [&](const Vec& v) {
                             return reference::LayerNorm(rows, cols, x, w, v,
                                                         kEps);
                           }),
                1e-6);
  }
}

TEST(NormReferenceTest, RmsNormGradientsMatchFiniteDifferences) {
  Rng rng(22);
  const int64_t rows = 3, cols = 17;
  const Vec x = reference::RandomVec(&rng, rows * cols, 1.5);
  const Vec w = reference::RandomVec(&rng, cols, 1.0);
  const Vec dy = reference::RandomVec(&rng, rows * cols, 1.0);
  Vec dx, dw;
  reference::RmsNormBackward(rows, cols, x, w, kEps, dy, &dx, &dw);
  for (int64_t i = 0; i < rows * cols; i += 5) {
    EXPECT_NEAR(dx[i],
                FiniteDiff(x, i, dy,
                           [&](const Vec& v) {
                             return reference::RmsNorm(rows, cols, v, w, kEps);
                           }),
                1e-6);
  }
  for (int64_t i = 0; i < cols; i += 3) {
    EXPECT_NEAR(dw[i],
                FiniteDiff(w, i, dy,
                           [&](const Vec& v) {
                             return reference::RmsNorm(rows, cols, x, v, kEps);
                           }),
                1e-6);
  }
}

TEST(NormTest, LayerNormMatchesFloat64) {
  Rng rng(23);
  for (const Shape2& s : kShapes) {
    for (bool with_bias : {false, true}) {
      const int64_t n = s.rows * s.cols;
      // An offset mean tests the two-pass variance.
      Vec x = reference::RandomVec(&rng, n, 1.5);
      for (double& v : x) v = static_cast<float>(v + 3.0);
      const Vec w = reference::RandomVec(&rng, s.cols, 1.0);
      const Vec b = with_bias ? reference::RandomVec(&rng, s.cols, 1.0) : Vec();
      const Vec dy = reference::RandomVec(&rng, n, 1.0);
      const Vec res = reference::RandomVec(&rng, n, 1.0);
      const std::vector<float> fx = reference::ToFloat(x),
                               fw = reference::ToFloat(w),
                               fb = reference::ToFloat(b),
                               fdy = reference::ToFloat(dy),
                               fres = reference::ToFloat(res);
      std::vector<float> y(n), mean(s.rows), rstd(s.rows), dx(n), dx_res(n);
      LayerNormForward(s.rows, s.cols, fx.data(), fw.data(),
                       with_bias ? fb.data() : nullptr, kEps, y.data(),
                       mean.data(), rstd.data());
      LayerNormBackwardInput(s.rows, s.cols, fx.data(), fw.data(), mean.data(),
                             rstd.data(), fdy.data(), nullptr, dx.data());
      LayerNormBackwardInput(s.rows, s.cols, fx.data(), fw.data(), mean.data(),
                             rstd.data(), fdy.data(), fres.data(),
                             dx_res.data());
      std::vector<float> dw(s.cols, 7.0f), db(s.cols, 7.0f);
      LayerNormBackwardParams(s.rows, s.cols, fx.data(), mean.data(),
                              rstd.data(), fdy.data(), /*accumulate=*/false,
                              dw.data(), db.data());
      std::vector<float> dw_acc(s.cols, 0.25f), db_acc(s.cols, -0.5f);
      LayerNormBackwardParams(s.rows, s.cols, fx.data(), mean.data(),
                              rstd.data(), fdy.data(), /*accumulate=*/true,
                              dw_acc.data(), db_acc.data());

      Vec want_dx, want_dw, want_db;
      reference::LayerNormBackward(s.rows, s.cols, x, w, kEps, dy, &want_dx,
                                   &want_dw, &want_db);
      Vec want_dx_res = want_dx, want_dw_acc = want_dw, want_db_acc = want_db;
      for (int64_t i = 0; i < n; ++i) want_dx_res[i] += res[i];
      for (int64_t c = 0; c < s.cols; ++c) {
        want_dw_acc[c] += 0.25;
        want_db_acc[c] -= 0.5;
      }
      const std::string what =
          std::to_string(s.rows) + "x" + std::to_string(s.cols);
      EXPECT_TRUE(AllClose(("layernorm y " + what).c_str(), y.data(),
                           reference::LayerNorm(s.rows, s.cols, x, w, b, kEps),
                           kRtol, kAtol));
      EXPECT_TRUE(AllClose(("layernorm dx " + what).c_str(), dx.data(), want_dx,
                           kRtol, kAtol));
      EXPECT_TRUE(AllClose(("layernorm dx+residual " + what).c_str(),
                           dx_res.data(), want_dx_res, kRtol, kAtol));
      EXPECT_TRUE(AllClose(("layernorm dw " + what).c_str(), dw.data(), want_dw,
                           kRtol, kAtol));
      EXPECT_TRUE(AllClose(("layernorm db " + what).c_str(), db.data(), want_db,
                           kRtol, kAtol));
      EXPECT_TRUE(AllClose(("layernorm dw accumulated " + what).c_str(),
                           dw_acc.data(), want_dw_acc, kRtol, kAtol));
      EXPECT_TRUE(AllClose(("layernorm db accumulated " + what).c_str(),
                           db_acc.data(), want_db_acc, kRtol, kAtol));
    }
  }
}

TEST(NormTest, RmsNormMatchesFloat64) {
  Rng rng(24);
  for (const Shape2& s : kShapes) {
    const int64_t n = s.rows * s.cols;
    const Vec x = reference::RandomVec(&rng, n, 1.5);
    const Vec w = reference::RandomVec(&rng, s.cols, 1.0);
    const Vec dy = reference::RandomVec(&rng, n, 1.0);
    const Vec res = reference::RandomVec(&rng, n, 1.0);
    const std::vector<float> fx = reference::ToFloat(x),
                             fw = reference::ToFloat(w),
                             fdy = reference::ToFloat(dy),
                             fres = reference::ToFloat(res);
    std::vector<float> y(n), rstd(s.rows), dx(n), dx_res(n);
    RmsNormForward(s.rows, s.cols, fx.data(), fw.data(), kEps, y.data(),
                   rstd.data());
    RmsNormBackwardInput(s.rows, s.cols, fx.data(), fw.data(), rstd.data(),
                         fdy.data(), nullptr, dx.data());
    RmsNormBackwardInput(s.rows, s.cols, fx.data(), fw.data(), rstd.data(),
                         fdy.data(), fres.data(), dx_res.data());
    std::vector<float> dw(s.cols, 7.0f), dw_acc(s.cols, 0.25f);
    RmsNormBackwardParams(s.rows, s.cols, fx.data(), rstd.data(), fdy.data(),
                          false, dw.data());
    RmsNormBackwardParams(s.rows, s.cols, fx.data(), rstd.data(), fdy.data(),
                          true, dw_acc.data());
    Vec want_dx, want_dw;
    reference::RmsNormBackward(s.rows, s.cols, x, w, kEps, dy, &want_dx,
                               &want_dw);
    Vec want_dx_res = want_dx, want_dw_acc = want_dw;
    for (int64_t i = 0; i < n; ++i) want_dx_res[i] += res[i];
    for (double& v : want_dw_acc) v += 0.25;
    const std::string what =
        std::to_string(s.rows) + "x" + std::to_string(s.cols);
    EXPECT_TRUE(AllClose(("rmsnorm y " + what).c_str(), y.data(),
                         reference::RmsNorm(s.rows, s.cols, x, w, kEps), kRtol,
                         kAtol));
    EXPECT_TRUE(AllClose(("rmsnorm dx " + what).c_str(), dx.data(), want_dx,
                         kRtol, kAtol));
    EXPECT_TRUE(AllClose(("rmsnorm dx+residual " + what).c_str(), dx_res.data(),
                         want_dx_res, kRtol, kAtol));
    EXPECT_TRUE(AllClose(("rmsnorm dw " + what).c_str(), dw.data(), want_dw,
                         kRtol, kAtol));
    EXPECT_TRUE(AllClose(("rmsnorm dw accumulated " + what).c_str(),
                         dw_acc.data(), want_dw_acc, kRtol, kAtol));
  }
}

// A row's statistics must not depend on which other rows are in the batch
// (no cross-row state), and repeated runs give the same bits.
TEST(NormTest, RowResultsIndependentOfBatchBitwise) {
  Rng rng(25);
  const int64_t rows = 4, cols = 1009;
  const std::vector<float> x =
      reference::ToFloat(reference::RandomVec(&rng, rows * cols, 1.0));
  const std::vector<float> w =
      reference::ToFloat(reference::RandomVec(&rng, cols, 1.0));
  std::vector<float> y(rows * cols), mean(rows), rstd(rows);
  LayerNormForward(rows, cols, x.data(), w.data(), nullptr, kEps, y.data(),
                   mean.data(), rstd.data());
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<float> y1(cols);
    float m1, s1;
    LayerNormForward(1, cols, x.data() + r * cols, w.data(), nullptr, kEps,
                     y1.data(), &m1, &s1);
    EXPECT_EQ(
        0, std::memcmp(y1.data(), y.data() + r * cols, cols * sizeof(float)));
    EXPECT_EQ(m1, mean[r]);
    EXPECT_EQ(s1, rstd[r]);
  }
}

}  // namespace
}  // namespace trainyard
