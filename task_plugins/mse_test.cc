// libmse.so through the loader: loss and dLoss/dOutput against a float64
// reference and finite differences, microbatch invariance, errors, and the
// inference outputs.
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "engine/task_loader.h"
#include "gtest/gtest.h"
#include "task_plugins/plugin_test_util.h"

namespace trainyard {
namespace {

using testing::LoadPlugin;
using testing::PluginDir;
using testing::RandomFloats;

constexpr int64_t kB = 7;
constexpr int64_t kK = 5;

std::unique_ptr<Task> MakeTask(const std::string& config = "{}") {
  auto plugin = LoadPlugin(PluginDir(), "mse");
  if (plugin == nullptr) return nullptr;
  auto task = Task::Create(plugin, config);
  EXPECT_TRUE(task.ok()) << task.status();
  return task.ok() ? std::move(*task) : nullptr;
}

// float64 torch.nn.MSELoss(): mean((o - t)^2), grad 2 (o - t) / numel.
double ReferenceLoss(const Tensor& o, const Tensor& t, std::vector<double>* g) {
  const int64_t n = o.numel();
  double sum = 0;
  g->assign(n, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const double d =
        static_cast<double>(o.data<float>()[i]) - t.data<float>()[i];
    sum += d * d;
    (*g)[i] = 2 * d / n;
  }
  return sum / n;
}

TEST(MseTest, BuildPassesFeaturesAndTargets) {
  auto task = MakeTask();
  ASSERT_NE(task, nullptr);
  Tensor features = RandomFloats({kB, 3}, 1);
  Tensor targets = RandomFloats({kB, kK}, 2);
  auto fwd = task->BuildForwardInputs(
      {{"features", features}, {"targets", targets}}, 0, false);
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  ASSERT_EQ(fwd->inputs.shape(), features.shape());
  for (int64_t i = 0; i < features.numel(); ++i) {
    EXPECT_EQ(fwd->inputs.data<float>()[i], features.data<float>()[i]);
  }
  ASSERT_EQ(fwd->state.size(), 1u);
  EXPECT_EQ(fwd->state[0].first, "targets");
  EXPECT_EQ(fwd->state[0].second.data<float>()[kB * kK - 1],
            targets.data<float>()[kB * kK - 1]);
}

TEST(MseTest, LossAndGradientMatchFloat64Reference) {
  auto task = MakeTask(R"({"reduction": "mean"})");
  ASSERT_NE(task, nullptr);
  Tensor output = RandomFloats({kB, kK}, 3);
  Tensor targets = RandomFloats({kB, kK}, 4);
  Tensor grad = Tensor::Zeros(DType::kFloat32, {kB, kK});
  auto r =
      task->ComputeLoss(output, {{"targets", targets}}, &grad, 0, 0, 1, false);
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<double> ref_grad;
  const double ref = ReferenceLoss(output, targets, &ref_grad);
  EXPECT_NEAR(r->loss, ref, 1e-12 * ref);
  EXPECT_EQ(r->weight, kB);
  for (int64_t i = 0; i < kB * kK; ++i) {
    EXPECT_NEAR(grad.data<float>()[i], ref_grad[i],
                1e-6 * std::abs(ref_grad[i]))
        << i;
  }
}

TEST(MseTest, GradientMatchesFiniteDifferences) {
  auto task = MakeTask();
  ASSERT_NE(task, nullptr);
  Tensor output = RandomFloats({3, 4}, 5);
  Tensor targets = RandomFloats({3, 4}, 6);
  Tensor grad = Tensor::Zeros(DType::kFloat32, {3, 4});
  ASSERT_TRUE(
      task->ComputeLoss(output, {{"targets", targets}}, &grad, 0, 0, 1, false)
          .ok());
  for (int64_t i = 0; i < output.numel(); ++i) {
    Tensor plus = output.Clone();
    Tensor minus = output.Clone();
    plus.data<float>()[i] += 1e-2f;
    minus.data<float>()[i] -= 1e-2f;
    const double h =
        static_cast<double>(plus.data<float>()[i]) - minus.data<float>()[i];
    auto lp =
        task->ComputeLoss(plus, {{"targets", targets}}, nullptr, 0, 0, 1, true);
    auto lm = task->ComputeLoss(minus, {{"targets", targets}}, nullptr, 0, 0, 1,
                                true);
    ASSERT_TRUE(lp.ok() && lm.ok());
    const double fd = (lp->loss - lm->loss) / h;
    EXPECT_NEAR(grad.data<float>()[i], fd, 1e-5 + 1e-4 * std::abs(fd)) << i;
  }
}

TEST(MseTest, MicrobatchSplitGivesFullBatchLossAndGradient) {
  auto task = MakeTask();
  ASSERT_NE(task, nullptr);
  Tensor output = RandomFloats({kB, kK}, 7);
  Tensor targets = RandomFloats({kB, kK}, 8);
  auto full = testing::RunMicrobatches(task.get(), output,
                                       {{"targets", targets}}, 1, 0);
  ASSERT_TRUE(full.ok()) << full.status();
  for (int m : {2, 3, 7}) {
    auto split = testing::RunMicrobatches(task.get(), output,
                                          {{"targets", targets}}, m, 0);
    ASSERT_TRUE(split.ok()) << split.status();
    EXPECT_NEAR(split->loss, full->loss, 1e-6 * full->loss) << m;
    for (int64_t i = 0; i < output.numel(); ++i) {
      const float a = split->grad.data<float>()[i];
      const float b = full->grad.data<float>()[i];
      EXPECT_NEAR(a, b, 1e-6 * std::abs(b) + 1e-12) << "m=" << m << " i=" << i;
    }
  }
}

TEST(MseTest, StepMetricIsFullBatchLoss) {
  auto task = MakeTask();
  ASSERT_NE(task, nullptr);
  Tensor output = RandomFloats({kB, kK}, 9);
  Tensor targets = RandomFloats({kB, kK}, 10);
  auto split = testing::RunMicrobatches(task.get(), output,
                                        {{"targets", targets}}, 3, 0);
  ASSERT_TRUE(split.ok());
  auto metrics = task->UpdateMetrics(false);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  ASSERT_EQ(metrics->size(), 1u);
  EXPECT_EQ((*metrics)[0].first, "loss");
  EXPECT_NEAR((*metrics)[0].second, split->loss, 1e-9 * split->loss);
  // Reset after reporting; eval accumulates separately.
  auto again = task->UpdateMetrics(false);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->empty());
}

TEST(MseTest, TargetShapeMismatchIsAnError) {
  auto task = MakeTask();
  ASSERT_NE(task, nullptr);
  Tensor grad = Tensor::Zeros(DType::kFloat32, {kB, kK});
  auto r = task->ComputeLoss(RandomFloats({kB, kK}, 1),
                             {{"targets", RandomFloats({kB, 4}, 2)}}, &grad, 0,
                             1, 2, false);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "plugin \"mse\": compute_loss: microbatch 1: targets float32 "
            "[7, 4] do not match the model output float32 [7, 5]");
}

TEST(MseTest, ClassIndexTargetsAreRefused) {
  auto task = MakeTask();
  ASSERT_NE(task, nullptr);
  auto r =
      task->BuildForwardInputs({{"features", RandomFloats({3, 2}, 1)},
                                {"targets", testing::Int64Tensor({0, 1, 2})}},
                               0, false);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "plugin \"mse\": build_forward_inputs: mse needs float32 [B, K] "
            "\"targets\", got int64 [3]");
}

TEST(MseTest, OnlyMeanReduction) {
  auto plugin = LoadPlugin(PluginDir(), "mse");
  ASSERT_NE(plugin, nullptr);
  auto task = Task::Create(plugin, R"({"reduction": "sum"})");
  EXPECT_EQ(task.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(task.status().message(),
            "plugin \"mse\": create: task.config.reduction: only \"mean\" is "
            "supported, got \"sum\"");
}

TEST(MseTest, ValidateConfigAcceptsWhatCreateAccepts) {
  for (const std::string config : {"{}", R"({"reduction": "mean"})"}) {
    auto r = ValidateTaskConfig(PluginDir(), "mse", config);
    ASSERT_TRUE(r.ok()) << config << ": " << r.status();
    EXPECT_EQ(*r, ConfigCheck::kValid);
  }
}

TEST(MseTest, ValidateConfigRefusesWhatCreateRefuses) {
  const std::pair<std::string, std::string> cases[] = {
      {R"({"reduction": "sum"})",
       "task.config.reduction: only \"mean\" is supported, got \"sum\""},
      {R"({"reduction": 1})", "task.config.reduction: must be a string, got 1"},
      {R"({"typo": 1})",
       "task.config: unknown key \"typo\" (allowed: reduction)"},
      {"not json", "task.config is not valid JSON: not json"},
  };
  for (const auto& [config, message] : cases) {
    auto r = ValidateTaskConfig(PluginDir(), "mse", config);
    ASSERT_FALSE(r.ok()) << config;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().message(), message);
  }
}

// --- Inference -------------------------------------------------------------

TEST(MseTest, InferOutputsAreTheModelOutputAsIs) {
  auto task = MakeTask();
  ASSERT_NE(task, nullptr);
  ASSERT_TRUE(task->plugin().has_infer_outputs());
  // An inference batch may still carry targets: they travel as state.
  Tensor features = RandomFloats({kB, 3}, 21);
  auto fwd = task->BuildForwardInputs(
      {{"features", features}, {"targets", RandomFloats({kB, kK}, 22)}}, 0,
      /*is_eval=*/true);
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  Tensor output = RandomFloats({kB, kK}, 23);
  testing::ExpectOneOutputEqualTo(
      task->InferOutputs(output, fwd->state, 30, testing::TempDir(), 0, 1),
      "outputs", output);
  // Another microbatch, without targets, of another size.
  Tensor other = RandomFloats({2, kK}, 24);
  testing::ExpectOneOutputEqualTo(
      task->InferOutputs(other, {}, 37, testing::TempDir(), 1, 2), "outputs",
      other);
}

}  // namespace
}  // namespace trainyard
