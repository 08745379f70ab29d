#include "engine/gradient_tree.h"

#include <algorithm>
#include <functional>
#include <vector>

#include "engine/test_gradients.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

constexpr int64_t kN = 257;

std::vector<Tensor> RandomGradients(int count, uint32_t seed) {
  return testing::RandomGradients(count, kN, seed);
}

using testing::Values;

// The documented order, written out: an aligned block of 2^k microbatches
// is (left half) + (right half); the blocks of M's binary decomposition,
// largest (earliest) first, are folded left to right.
std::vector<float> ReferenceTree(const std::vector<Tensor>& g) {
  std::function<std::vector<float>(int, int)> block = [&](int first, int n) {
    if (n == 1) return Values(g[first]);
    std::vector<float> a = block(first, n / 2), b = block(first + n / 2, n / 2);
    for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
    return a;
  };
  const int m = static_cast<int>(g.size());
  std::vector<float> acc;
  int first = 0;
  for (int bit = 30; bit >= 0; --bit) {
    const int n = 1 << bit;
    if ((m & n) == 0) continue;
    std::vector<float> b = block(first, n);
    if (acc.empty()) {
      acc = b;
    } else {
      for (size_t i = 0; i < acc.size(); ++i) acc[i] += b[i];
    }
    first += n;
  }
  return acc;
}

std::vector<float> TreeSum(const ExecContext* ctx, const std::vector<Tensor>& g,
                           int* buffers) {
  GradientTree tree(ctx, kN);
  for (const Tensor& t : g) EXPECT_TRUE(tree.Add(t).ok());
  if (buffers != nullptr) *buffers = tree.buffers();
  Tensor out = Tensor::Empty(DType::kFloat32, {kN});
  EXPECT_TRUE(tree.Finish(&out).ok());
  return Values(out);
}

class GradientTreeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto ctx = ExecContext::Create(Device::Cpu(), Precision::kFp32);
    ASSERT_TRUE(ctx.ok()) << ctx.status();
    ctx_ = *std::move(ctx);
  }
  std::unique_ptr<ExecContext> ctx_;
};

TEST_F(GradientTreeTest, SumsInTheDocumentedTreeOrder) {
  for (int m = 1; m <= 17; ++m) {
    const std::vector<Tensor> g = RandomGradients(m, 100 + m);
    int buffers = 0;
    EXPECT_EQ(TreeSum(ctx_.get(), g, &buffers), ReferenceTree(g)) << "M=" << m;
    int levels = 0;
    while ((2 << levels) <= m) ++levels;
    EXPECT_EQ(buffers, levels + 1) << "M=" << m;  // floor(log2 M) + 1
  }
}

TEST_F(GradientTreeTest, OrderDiffersFromASequentialSum) {
  // The tree is a real reassociation: for this data, not the bits of
  // ((g0 + g1) + g2) + g3.
  const std::vector<Tensor> g = RandomGradients(4, 7);
  std::vector<float> seq = Values(g[0]);
  for (int m = 1; m < 4; ++m) {
    for (int64_t i = 0; i < kN; ++i) seq[i] += g[m].data<float>()[i];
  }
  EXPECT_NE(TreeSum(ctx_.get(), g, nullptr), seq);
}

// Replicas holding aligned blocks of 2^k microbatches each, whose subtrees
// are then added in the same counter order, give R = 1's bits.
TEST_F(GradientTreeTest, ReplicaSubtreesReproduceOneReplica) {
  struct Case {
    int m, r;
  };
  for (Case c : {Case{8, 1}, Case{8, 2}, Case{8, 4}, Case{16, 4}, Case{12, 3},
                 Case{4, 4}, Case{24, 3}}) {
    const std::vector<Tensor> g = RandomGradients(c.m, 1000 + c.m);
    const std::vector<float> one = TreeSum(ctx_.get(), g, nullptr);
    const int per = c.m / c.r;
    std::vector<Tensor> subtrees;
    for (int r = 0; r < c.r; ++r) {
      std::vector<Tensor> mine(g.begin() + r * per, g.begin() + (r + 1) * per);
      subtrees.push_back(
          Tensor::FromVector(TreeSum(ctx_.get(), mine, nullptr), {kN}));
    }
    EXPECT_EQ(TreeSum(ctx_.get(), subtrees, nullptr), one)
        << "M=" << c.m << " R=" << c.r;
  }
}

// Writing the first of each pair into Leaf() instead of adding it gives
// Add's bits, and Leaf() is offered exactly when level 0 is empty.
TEST_F(GradientTreeTest, LeafTakesTheFirstOfEachPairWithAddsBits) {
  for (int m = 1; m <= 9; ++m) {
    const std::vector<Tensor> g = RandomGradients(m, 300 + m);
    GradientTree tree(ctx_.get(), kN);
    for (int step = 0; step < 2; ++step) {
      for (int i = 0; i < m; ++i) {
        absl::StatusOr<Tensor> leaf = tree.Leaf();
        ASSERT_TRUE(leaf.ok()) << leaf.status();
        ASSERT_EQ(leaf->defined(), i % 2 == 0) << "M=" << m << " i=" << i;
        if (leaf->defined()) {
          ASSERT_EQ(leaf->numel(), kN);
          std::copy_n(g[i].data<float>(), kN, leaf->data<float>());
          tree.AddLeaf();
        } else {
          ASSERT_TRUE(tree.Add(g[i]).ok());
        }
      }
      EXPECT_EQ(tree.added(), m);
      Tensor out = Tensor::Empty(DType::kFloat32, {kN});
      ASSERT_TRUE(tree.Finish(&out).ok());
      EXPECT_EQ(Values(out), TreeSum(ctx_.get(), g, nullptr))
          << "M=" << m << " step " << step;
    }
  }
}

TEST_F(GradientTreeTest, ReusableAcrossStepsAndRefusesMisuse) {
  GradientTree tree(ctx_.get(), kN);
  Tensor out = Tensor::Empty(DType::kFloat32, {kN});
  EXPECT_EQ(tree.Finish(&out).code(), absl::StatusCode::kFailedPrecondition);
  for (int step = 0; step < 3; ++step) {
    const std::vector<Tensor> g = RandomGradients(5, 50 + step);
    for (const Tensor& t : g) ASSERT_TRUE(tree.Add(t).ok());
    ASSERT_TRUE(tree.Finish(&out).ok());
    EXPECT_EQ(Values(out), ReferenceTree(g)) << "step " << step;
  }
  Tensor wrong = Tensor::Empty(DType::kFloat32, {kN + 1});
  EXPECT_EQ(tree.Add(wrong).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trainyard
