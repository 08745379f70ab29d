// libcross_entropy.so through the loader: loss and dLoss/dOutput against a
// float64 reference of torch.nn.CrossEntropyLoss (ignore_index, label
// smoothing) and finite differences, microbatch invariance, metrics, errors;
// the inference outputs (softmax and argmax) against a plain reference.
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/tensor.h"
#include "engine/task_loader.h"
#include "gtest/gtest.h"
#include "task_plugins/plugin_test_util.h"

namespace trainyard {
namespace {

using testing::Int32Tensor;
using testing::Int64Tensor;
using testing::LoadPlugin;
using testing::PluginDir;
using testing::RandomFloats;

constexpr int64_t kB = 7;
constexpr int64_t kC = 5;

std::unique_ptr<Task> MakeTask(const std::string& config = "{}") {
  auto plugin = LoadPlugin(PluginDir(), "cross_entropy");
  if (plugin == nullptr) return nullptr;
  auto task = Task::Create(plugin, config);
  EXPECT_TRUE(task.ok()) << task.status();
  return task.ok() ? std::move(*task) : nullptr;
}

// float64 torch.nn.CrossEntropyLoss(ignore_index, label_smoothing), written
// independently of the plugin: softmax by definition (no max shift needed at
// these magnitudes), loss and its analytic gradient.
double Reference(const Tensor& logits, const std::vector<int64_t>& labels,
                 int64_t ignore, double eps, std::vector<double>* grad) {
  const int64_t b = logits.dim(0), c = logits.dim(1);
  grad->assign(b * c, 0.0);
  int64_t n = 0;
  for (int64_t y : labels) n += (y != ignore);
  double total = 0;
  for (int64_t i = 0; i < b; ++i) {
    if (labels[i] == ignore) continue;
    double z = 0;
    for (int64_t k = 0; k < c; ++k) {
      z += std::exp(static_cast<double>(logits.data<float>()[i * c + k]));
    }
    double nll = 0, smooth = 0;
    for (int64_t k = 0; k < c; ++k) {
      const double logp = logits.data<float>()[i * c + k] - std::log(z);
      if (k == labels[i]) nll = -logp;
      smooth += -logp / c;
      const double q = (k == labels[i]) * (1 - eps) + eps / c;
      (*grad)[i * c + k] = (std::exp(logp) - q) / n;
    }
    total += (1 - eps) * nll + eps * smooth;
  }
  return total / n;
}

void ExpectMatchesReference(const std::string& config,
                            const std::vector<int64_t>& labels, int64_t ignore,
                            double eps) {
  auto task = MakeTask(config);
  ASSERT_NE(task, nullptr);
  Tensor logits = RandomFloats({kB, kC}, 11, 3.0f);
  Tensor grad = Tensor::Zeros(DType::kFloat32, {kB, kC});
  auto r = task->ComputeLoss(logits, {{"labels", Int64Tensor(labels)}}, &grad,
                             0, 0, 1, false);
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<double> ref_grad;
  const double ref = Reference(logits, labels, ignore, eps, &ref_grad);
  int64_t n = 0;
  for (int64_t y : labels) n += (y != ignore);
  EXPECT_NEAR(r->loss, ref, 1e-12 * ref);
  EXPECT_EQ(r->weight, n);
  for (int64_t i = 0; i < kB * kC; ++i) {
    EXPECT_NEAR(grad.data<float>()[i], ref_grad[i],
                1e-6 * std::abs(ref_grad[i]) + 1e-9)
        << i;
  }
}

TEST(CrossEntropyTest, MatchesReferenceWithoutSmoothing) {
  ExpectMatchesReference("{}", {0, 4, 2, 1, 3, 3, 0}, -100, 0.0);
}

TEST(CrossEntropyTest, MatchesReferenceWithIgnoreIndexAndSmoothing) {
  ExpectMatchesReference(R"({"label_smoothing": 0.1})",
                         {0, -100, 2, 1, -100, 3, 4}, -100, 0.1);
}

TEST(CrossEntropyTest, CustomIgnoreIndexInsideClassRange) {
  ExpectMatchesReference(R"({"ignore_index": 3, "label_smoothing": 0.25})",
                         {0, 3, 2, 1, 3, 4, 4}, 3, 0.25);
}

TEST(CrossEntropyTest, GradientMatchesFiniteDifferences) {
  auto task = MakeTask(R"({"label_smoothing": 0.2})");
  ASSERT_NE(task, nullptr);
  const std::vector<int64_t> labels = {2, -100, 0, 1};
  Tensor labels_t = Int64Tensor(labels);
  Tensor logits = RandomFloats({4, 3}, 12, 2.0f);
  Tensor grad = Tensor::Zeros(DType::kFloat32, {4, 3});
  ASSERT_TRUE(
      task->ComputeLoss(logits, {{"labels", labels_t}}, &grad, 0, 0, 1, false)
          .ok());
  for (int64_t i = 0; i < logits.numel(); ++i) {
    Tensor plus = logits.Clone();
    Tensor minus = logits.Clone();
    plus.data<float>()[i] += 1e-2f;
    minus.data<float>()[i] -= 1e-2f;
    const double h =
        static_cast<double>(plus.data<float>()[i]) - minus.data<float>()[i];
    auto lp =
        task->ComputeLoss(plus, {{"labels", labels_t}}, nullptr, 0, 0, 1, true);
    auto lm = task->ComputeLoss(minus, {{"labels", labels_t}}, nullptr, 0, 0, 1,
                                true);
    ASSERT_TRUE(lp.ok() && lm.ok());
    const double fd = (lp->loss - lm->loss) / h;
    // Central differences on a smooth function: error O(h^2) ~ 1e-5.
    EXPECT_NEAR(grad.data<float>()[i], fd, 5e-5) << i;
  }
  // Ignored row 1 gets no gradient.
  for (int k = 0; k < 3; ++k) EXPECT_EQ(grad.data<float>()[3 + k], 0.0f);
}

TEST(CrossEntropyTest, MicrobatchSplitGivesFullBatchLossAndGradient) {
  auto task = MakeTask(R"({"label_smoothing": 0.1})");
  ASSERT_NE(task, nullptr);
  // With 3 microbatches the first (rows 0-2) is entirely ignored: weight 0.
  Tensor labels = Int64Tensor({-100, -100, -100, 1, 4, -100, 2});
  Tensor logits = RandomFloats({kB, kC}, 13, 3.0f);
  auto full =
      testing::RunMicrobatches(task.get(), logits, {{"labels", labels}}, 1, 0);
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(full->weight, 3);
  for (int m : {2, 3, 4, 7}) {
    auto split = testing::RunMicrobatches(task.get(), logits,
                                          {{"labels", labels}}, m, 0);
    ASSERT_TRUE(split.ok()) << split.status();
    EXPECT_EQ(split->weight, 3);
    EXPECT_NEAR(split->loss, full->loss, 1e-6 * full->loss) << m;
    for (int64_t i = 0; i < logits.numel(); ++i) {
      const float a = split->grad.data<float>()[i];
      const float b = full->grad.data<float>()[i];
      EXPECT_NEAR(a, b, 1e-6 * std::abs(b) + 1e-12) << "m=" << m << " i=" << i;
    }
  }
}

TEST(CrossEntropyTest, AllIgnoredMicrobatchHasZeroWeight) {
  auto task = MakeTask();
  ASSERT_NE(task, nullptr);
  Tensor grad = Tensor::Zeros(DType::kFloat32, {2, kC});
  auto r = task->ComputeLoss(RandomFloats({2, kC}, 1),
                             {{"labels", Int64Tensor({-100, -100})}}, &grad, 0,
                             0, 1, false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->loss, 0);
  EXPECT_EQ(r->weight, 0);
}

TEST(CrossEntropyTest, BuildAcceptsInt32AndInt64Targets) {
  auto task = MakeTask();
  ASSERT_NE(task, nullptr);
  for (const Tensor& targets :
       {Int32Tensor({2, 0, -100}), Int64Tensor({2, 0, -100})}) {
    auto fwd = task->BuildForwardInputs(
        {{"features", RandomFloats({3, 4}, 1)}, {"targets", targets}}, 0,
        false);
    ASSERT_TRUE(fwd.ok()) << fwd.status();
    ASSERT_EQ(fwd->state.size(), 1u);
    EXPECT_EQ(fwd->state[0].first, "labels");
    const Tensor& labels = fwd->state[0].second;
    ASSERT_EQ(labels.dtype(), DType::kInt64);
    EXPECT_EQ(labels.data<int64_t>()[0], 2);
    EXPECT_EQ(labels.data<int64_t>()[2], -100);
  }
}

TEST(CrossEntropyTest, FloatTargetsAreRefused) {
  auto task = MakeTask();
  ASSERT_NE(task, nullptr);
  auto r = task->BuildForwardInputs({{"features", RandomFloats({3, 4}, 1)},
                                     {"targets", RandomFloats({3, 2}, 2)}},
                                    0, false);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "plugin \"cross_entropy\": build_forward_inputs: cross_entropy "
            "needs class-index \"targets\" int32/int64 [B], got float32 [3, "
            "2]");
}

TEST(CrossEntropyTest, OutOfRangeLabelNamesMicrobatchRowAndValue) {
  auto task = MakeTask();
  ASSERT_NE(task, nullptr);
  for (int64_t bad : {int64_t{5}, int64_t{-1}}) {
    Tensor grad = Tensor::Zeros(DType::kFloat32, {3, kC});
    auto r = task->ComputeLoss(RandomFloats({3, kC}, 1),
                               {{"labels", Int64Tensor({0, 1, bad})}}, &grad, 4,
                               1, 2, false);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().message(),
              absl::StrCat("plugin \"cross_entropy\": compute_loss: "
                           "microbatch 1 of 2, row 2: label ",
                           bad, " outside [0, 5) and not ignore_index -100"));
  }
}

TEST(CrossEntropyTest, StepMetricsAreAccuracyAndLossOverNonIgnored) {
  auto task = MakeTask();
  ASSERT_NE(task, nullptr);
  // Logits whose argmax is row-known: row i peaks at class i % kC.
  Tensor logits = Tensor::Zeros(DType::kFloat32, {6, kC});
  for (int i = 0; i < 6; ++i) logits.data<float>()[i * kC + i % kC] = 3.0f;
  // Correct: rows 0, 1, 4; wrong: rows 2, 5; ignored: row 3.
  Tensor labels = Int64Tensor({0, 1, 0, -100, 4, 2});
  auto split =
      testing::RunMicrobatches(task.get(), logits, {{"labels", labels}}, 2, 0);
  ASSERT_TRUE(split.ok()) << split.status();
  // Eval metrics are kept apart from training metrics.
  Tensor eval_labels = Int64Tensor({1, 1, 1, 1, 1, 1});
  ASSERT_TRUE(task->ComputeLoss(logits, {{"labels", eval_labels}}, nullptr, 0,
                                0, 1, true)
                  .ok());
  auto metrics = task->UpdateMetrics(false);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  ASSERT_EQ(metrics->size(), 2u);
  EXPECT_EQ((*metrics)[0].first, "loss");
  EXPECT_NEAR((*metrics)[0].second, split->loss, 1e-12);
  EXPECT_EQ((*metrics)[1].first, "accuracy");
  EXPECT_DOUBLE_EQ((*metrics)[1].second, 3.0 / 5.0);
  auto eval = task->UpdateMetrics(true);
  ASSERT_TRUE(eval.ok());
  ASSERT_EQ(eval->size(), 2u);
  EXPECT_DOUBLE_EQ((*eval)[1].second, 1.0 / 6.0);
  auto reset = task->UpdateMetrics(false);
  ASSERT_TRUE(reset.ok());
  EXPECT_TRUE(reset->empty());
}

TEST(CrossEntropyTest, BadConfigIsRefused) {
  auto plugin = LoadPlugin(PluginDir(), "cross_entropy");
  ASSERT_NE(plugin, nullptr);
  auto a = Task::Create(plugin, R"({"label_smoothing": 1.5})");
  EXPECT_EQ(
      a.status().message(),
      "plugin \"cross_entropy\": create: task.config.label_smoothing: must be "
      "in [0, 1], got 1.5");
  auto b = Task::Create(plugin, R"({"ignore_index": "x"})");
  EXPECT_EQ(
      b.status().message(),
      "plugin \"cross_entropy\": create: task.config.ignore_index: must be an "
      "integer, got \"x\"");
  auto c = Task::Create(plugin, "[1]");
  EXPECT_EQ(
      c.status().message(),
      "plugin \"cross_entropy\": create: task.config must be a JSON object, "
      "got [1]");
}

TEST(CrossEntropyTest, ValidateConfigAcceptsWhatCreateAccepts) {
  for (const std::string config :
       {"{}", R"({"ignore_index": 3, "label_smoothing": 0.1})",
        R"({"label_smoothing": 1})"}) {
    auto r = ValidateTaskConfig(PluginDir(), "cross_entropy", config);
    ASSERT_TRUE(r.ok()) << config << ": " << r.status();
    EXPECT_EQ(*r, ConfigCheck::kValid);
  }
}

TEST(CrossEntropyTest, ValidateConfigRefusesWhatCreateRefuses) {
  const std::pair<std::string, std::string> cases[] = {
      {R"({"label_smoothing": 1.5})",
       "task.config.label_smoothing: must be in [0, 1], got 1.5"},
      {R"({"label_smoothing": -0.1})",
       "task.config.label_smoothing: must be in [0, 1], got -0.1"},
      {R"({"ignore_index": "x"})",
       "task.config.ignore_index: must be an integer, got \"x\""},
      {R"({"ignore_index": 1.5})",
       "task.config.ignore_index: must be an integer, got 1.5"},
      {"[1]", "task.config must be a JSON object, got [1]"},
      {R"({"smoothing": 0.1})",
       "task.config: unknown key \"smoothing\" (allowed: ignore_index, "
       "label_smoothing)"},
  };
  for (const auto& [config, message] : cases) {
    auto r = ValidateTaskConfig(PluginDir(), "cross_entropy", config);
    ASSERT_FALSE(r.ok()) << config;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().message(), message);
  }
}

// --- Inference -------------------------------------------------------------

// The plain reference of the inference outputs: softmax by definition in
// double (no max shift), and the first index of the largest logit.
void ReferenceInference(const Tensor& logits, std::vector<double>* p,
                        std::vector<int64_t>* argmax) {
  const int64_t b = logits.dim(0), c = logits.dim(1);
  const float* x = logits.data<float>();
  p->assign(b * c, 0.0);
  argmax->assign(b, 0);
  for (int64_t i = 0; i < b; ++i) {
    double z = 0;
    for (int64_t k = 0; k < c; ++k) z += std::exp(double{x[i * c + k]});
    for (int64_t k = 0; k < c; ++k) {
      (*p)[i * c + k] = std::exp(double{x[i * c + k]}) / z;
      if (x[i * c + k] > x[i * c + (*argmax)[i]]) (*argmax)[i] = k;
    }
  }
}

absl::StatusOr<NamedTensors> Infer(Task* task, const Tensor& logits,
                                   int64_t row_offset = 0) {
  return task->InferOutputs(logits, {}, row_offset, testing::TempDir(), 0, 1);
}

TEST(CrossEntropyTest, InferOutputsAreSoftmaxAndFirstArgmax) {
  auto task = MakeTask();
  ASSERT_NE(task, nullptr);
  ASSERT_TRUE(task->plugin().has_infer_outputs());
  Tensor logits = RandomFloats({kB, kC}, 31, 3.0f);
  // Row 2 has two largest logits (classes 1 and 3): the first wins.
  float* x = logits.data<float>();
  x[2 * kC + 1] = x[2 * kC + 3] = 3.5f;
  // Labels of an inference batch travel as state, as in training.
  auto fwd = task->BuildForwardInputs(
      {{"features", RandomFloats({kB, 2}, 32)},
       {"targets", Int64Tensor({0, 1, 2, 3, 4, 0, 1})}},
      0, /*is_eval=*/true);
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  auto r = task->InferOutputs(logits, fwd->state, 0, testing::TempDir(), 0, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[0].first, "probabilities");
  EXPECT_EQ((*r)[1].first, "predicted_class");
  const Tensor& p = (*r)[0].second;
  const Tensor& k = (*r)[1].second;
  ASSERT_EQ(p.dtype(), DType::kFloat32);
  ASSERT_EQ(p.shape(), (Shape{kB, kC}));
  ASSERT_EQ(k.dtype(), DType::kInt64);
  ASSERT_EQ(k.shape(), (Shape{kB}));
  std::vector<double> ref_p;
  std::vector<int64_t> ref_k;
  ReferenceInference(logits, &ref_p, &ref_k);
  for (int64_t i = 0; i < kB * kC; ++i) {
    // float32 rounding of the same double value, up to one ulp.
    EXPECT_NEAR(p.data<float>()[i], ref_p[i], 1.2e-7 * ref_p[i]) << i;
  }
  for (int64_t i = 0; i < kB; ++i) {
    EXPECT_EQ(k.data<int64_t>()[i], ref_k[i]) << i;
  }
  EXPECT_EQ(k.data<int64_t>()[2], 1);
}

TEST(CrossEntropyTest, InferProbabilitiesOfLargeLogitsStayFinite) {
  auto task = MakeTask();
  ASSERT_NE(task, nullptr);
  // exp(1000) overflows a double: only a max-subtracted softmax gives
  // softmax([1, 2, 0]).
  Tensor logits =
      Tensor::FromVector({1000, 1001, 999, -1000, -999, -1001}, {2, 3});
  auto r = Infer(task.get(), logits);
  ASSERT_TRUE(r.ok()) << r.status();
  const float* p = (*r)[0].second.data<float>();
  const double z = std::exp(1.0) + std::exp(2.0) + 1;
  const double ref[] = {std::exp(1.0) / z, std::exp(2.0) / z, 1 / z,
                        std::exp(1.0) / z, std::exp(2.0) / z, 1 / z};
  for (int i = 0; i < 6; ++i) {
    EXPECT_NEAR(p[i], ref[i], 1.2e-7 * ref[i]) << i;
  }
  EXPECT_EQ((*r)[1].second.data<int64_t>()[0], 1);
  EXPECT_EQ((*r)[1].second.data<int64_t>()[1], 1);
}

TEST(CrossEntropyTest, InferRefusesANonFiniteLogitNamingTheDataRow) {
  auto task = MakeTask();
  ASSERT_NE(task, nullptr);
  Tensor logits = RandomFloats({4, kC}, 33);
  logits.data<float>()[2 * kC + 1] = std::nanf("");
  auto r = Infer(task.get(), logits, /*row_offset=*/50);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "plugin \"cross_entropy\": infer_outputs: data row 52: logit 1 is "
            "not finite (nan)");
}

}  // namespace
}  // namespace trainyard
