#include "kernels/linear.h"

#include <vector>

#include "core/random.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

std::vector<float> Random(Rng* rng, int64_t n) {
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(rng->Normal());
  return v;
}

TEST(LinearTest, AddBiasResidualAllCombinations) {
  Rng rng(31);
  for (int64_t rows : {1, 3, 17}) {
    for (int64_t cols : {1, 17, 1009}) {
      const std::vector<float> y0 = Random(&rng, rows * cols);
      const std::vector<float> bias = Random(&rng, cols);
      const std::vector<float> res = Random(&rng, rows * cols);
      for (int mode = 0; mode < 4; ++mode) {
        const bool use_bias = mode & 1, use_res = mode & 2;
        std::vector<float> y = y0;
        AddBiasResidual(rows, cols, use_bias ? bias.data() : nullptr,
                        use_res ? res.data() : nullptr, y.data());
        for (int64_t i = 0; i < rows * cols; ++i) {
          float want = y0[i];
          if (use_bias) want = want + bias[i % cols];
          if (use_res) want = want + res[i];
          ASSERT_EQ(y[i], want) << "mode " << mode << " element " << i;
        }
      }
    }
  }
}

TEST(LinearTest, ColumnSumsOverwriteAndAccumulate) {
  Rng rng(32);
  for (int64_t rows : {1, 3, 1009}) {
    for (int64_t cols : {1, 17, 64}) {
      const std::vector<float> g = Random(&rng, rows * cols);
      std::vector<double> want(cols, 0.0);
      for (int64_t i = 0; i < rows * cols; ++i) want[i % cols] += g[i];
      std::vector<float> out(cols, 123.0f);
      ColumnSums(rows, cols, g.data(), /*accumulate=*/false, out.data());
      std::vector<float> acc(cols, 2.0f);
      ColumnSums(rows, cols, g.data(), /*accumulate=*/true, acc.data());
      for (int64_t c = 0; c < cols; ++c) {
        EXPECT_NEAR(out[c], want[c], 1e-6 * rows) << rows << "x" << cols;
        // Accumulating adds exactly the same float sum.
        EXPECT_EQ(acc[c], 2.0f + out[c]) << rows << "x" << cols;
      }
    }
  }
}

}  // namespace
}  // namespace trainyard
