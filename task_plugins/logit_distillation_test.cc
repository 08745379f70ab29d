// liblogit_distillation.so through the loader: teacher forward, loss and
// dLoss/dOutput against float64 references and finite differences,
// microbatch invariance, metrics, teacher loading errors, validate_config
// and the teacher path confined to a data folder; the inference outputs.
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/safetensors.h"
#include "core/tensor.h"
#include "engine/task_loader.h"
#include "gtest/gtest.h"
#include "task_plugins/plugin_test_util.h"

namespace trainyard {
namespace {

using testing::Int64Tensor;
using testing::LoadPlugin;
using testing::PluginDir;
using testing::RandomFloats;

constexpr int64_t kB = 7;
constexpr int64_t kD = 6;
constexpr int64_t kC = 4;

// Teacher: block 0 relu 6 -> 8 -> 7 with biases, block 1 gelu 7 -> 5 -> 4
// without biases.
SafetensorsFile TeacherFile() {
  SafetensorsFile f;
  f.tensors = {
      {"blocks.0.fc1.weight", RandomFloats({8, kD}, 101, 0.6f)},
      {"blocks.0.fc1.bias", RandomFloats({8}, 102, 0.3f)},
      {"blocks.0.fc2.weight", RandomFloats({7, 8}, 103, 0.6f)},
      {"blocks.0.fc2.bias", RandomFloats({7}, 104, 0.3f)},
      {"blocks.1.fc1.weight", RandomFloats({5, 7}, 105, 0.6f)},
      {"blocks.1.fc2.weight", RandomFloats({kC, 5}, 106, 0.9f)},
  };
  return f;
}

constexpr char kBlocks[] =
    R"("teacher_blocks": [{"activation": "relu"}, {"activation": "gelu"}])";

std::string WriteTeacher(const SafetensorsFile& f, const std::string& name) {
  const std::string path = testing::TempDir() + "/" + name;
  absl::Status s = WriteSafetensors(path, f);
  EXPECT_TRUE(s.ok()) << s;
  return path;
}

absl::StatusOr<std::unique_ptr<Task>> Create(const std::string& config) {
  auto plugin = LoadPlugin(PluginDir(), "logit_distillation");
  if (plugin == nullptr) return absl::InternalError("load failed");
  return Task::Create(plugin, config);
}

std::unique_ptr<Task> MakeTask(const std::string& extra = "") {
  const std::string path = WriteTeacher(TeacherFile(), "teacher.safetensors");
  auto task = Create(
      absl::StrCat(R"({"teacher": ")", path, R"(", )", kBlocks, extra, "}"));
  EXPECT_TRUE(task.ok()) << task.status();
  return task.ok() ? std::move(*task) : nullptr;
}

// float64 y = x W^T + b.
std::vector<double> Linear(const std::vector<double>& x, int64_t rows,
                           const Tensor& w, const Tensor* b) {
  const int64_t out = w.dim(0), in = w.dim(1);
  std::vector<double> y(rows * out);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      double acc = b != nullptr ? b->data<float>()[o] : 0.0;
      for (int64_t i = 0; i < in; ++i) {
        acc += x[r * in + i] * w.data<float>()[o * in + i];
      }
      y[r * out + o] = acc;
    }
  }
  return y;
}

std::vector<double> TeacherReference(const Tensor& features) {
  SafetensorsFile f = TeacherFile();
  auto get = [&](const std::string& n) { return *f.Get(n); };
  std::vector<double> x(features.data<float>(),
                        features.data<float>() + features.numel());
  const int64_t b = features.dim(0);
  Tensor b1 = get("blocks.0.fc1.bias"), b2 = get("blocks.0.fc2.bias");
  std::vector<double> h = Linear(x, b, get("blocks.0.fc1.weight"), &b1);
  for (double& v : h) v = v > 0 ? v : 0;
  x = Linear(h, b, get("blocks.0.fc2.weight"), &b2);
  h = Linear(x, b, get("blocks.1.fc1.weight"), nullptr);
  for (double& v : h) v = 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
  return Linear(h, b, get("blocks.1.fc2.weight"), nullptr);
}

std::vector<double> LogSoftmax(const float* x, int64_t c, double scale) {
  double z = 0;
  for (int64_t k = 0; k < c; ++k) z += std::exp(scale * x[k]);
  std::vector<double> out(c);
  for (int64_t k = 0; k < c; ++k) out[k] = scale * x[k] - std::log(z);
  return out;
}

// float64 alpha T^2 KLDivLoss(batchmean) + (1 - alpha) CrossEntropy over
// non-ignored rows, and its gradient.
double Reference(const Tensor& student, const Tensor& teacher,
                 const std::vector<int64_t>& labels, double t, double alpha,
                 std::vector<double>* grad) {
  const int64_t b = student.dim(0), c = student.dim(1);
  int64_t n = 0;
  for (int64_t y : labels) n += (y != -100);
  grad->assign(b * c, 0.0);
  double kl = 0, ce = 0;
  for (int64_t i = 0; i < b; ++i) {
    if (labels[i] == -100) continue;
    auto lq = LogSoftmax(student.data<float>() + i * c, c, 1 / t);
    auto lp = LogSoftmax(teacher.data<float>() + i * c, c, 1 / t);
    auto ls = LogSoftmax(student.data<float>() + i * c, c, 1.0);
    for (int64_t k = 0; k < c; ++k) {
      kl += std::exp(lp[k]) * (lp[k] - lq[k]);
      (*grad)[i * c + k] =
          (alpha * t * t * (std::exp(lq[k]) - std::exp(lp[k])) / t +
           (1 - alpha) * (std::exp(ls[k]) - (k == labels[i]))) /
          n;
    }
    ce -= ls[labels[i]];
  }
  return alpha * t * t * kl / n + (1 - alpha) * ce / n;
}

struct Step {
  Tensor teacher_logits;
  Tensor labels;
};

Step Forward(Task* task, const Tensor& features,
             const std::vector<int64_t>& labels) {
  auto fwd = task->BuildForwardInputs(
      {{"features", features}, {"targets", Int64Tensor(labels)}}, 0, false);
  EXPECT_TRUE(fwd.ok()) << fwd.status();
  if (!fwd.ok()) return {};
  EXPECT_EQ(fwd->state.size(), 2u);
  EXPECT_EQ(fwd->state[0].first, "teacher_logits");
  EXPECT_EQ(fwd->state[1].first, "labels");
  return {fwd->state[0].second, fwd->state[1].second};
}

TEST(LogitDistillationTest, TeacherForwardMatchesFloat64Reference) {
  auto task = MakeTask();
  ASSERT_NE(task, nullptr);
  Tensor features = RandomFloats({kB, kD}, 1);
  auto fwd = task->BuildForwardInputs(
      {{"features", features}, {"targets", Int64Tensor({0, 1, 2, 3, 0, 1, 2})}},
      0, false);
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  EXPECT_EQ(fwd->inputs.shape(), features.shape());
  EXPECT_EQ(fwd->inputs.data<float>()[5], features.data<float>()[5]);
  ASSERT_EQ(fwd->state.size(), 2u);
  const Tensor& logits = fwd->state[0].second;
  ASSERT_EQ(logits.shape(), (Shape{kB, kC}));
  std::vector<double> ref = TeacherReference(features);
  for (int64_t i = 0; i < kB * kC; ++i) {
    EXPECT_NEAR(logits.data<float>()[i], ref[i], 1e-5 + 1e-5 * std::abs(ref[i]))
        << i;
  }
  EXPECT_EQ(fwd->state[1].second.data<int64_t>()[3], 3);
}

TEST(LogitDistillationTest, LossAndGradientMatchFloat64Reference) {
  for (const auto& [t, alpha] : {std::pair<double, double>{2.0, 0.5},
                                 {1.0, 0.0},
                                 {3.5, 1.0},
                                 {0.7, 0.3}}) {
    auto task = MakeTask(
        absl::StrCat(R"(, "temperature": )", t, R"(, "alpha": )", alpha));
    ASSERT_NE(task, nullptr);
    const std::vector<int64_t> labels = {0, -100, 2, 3, 1, -100, 3};
    Step step = Forward(task.get(), RandomFloats({kB, kD}, 2), labels);
    Tensor student = RandomFloats({kB, kC}, 3, 3.0f);
    Tensor grad = Tensor::Zeros(DType::kFloat32, {kB, kC});
    auto r = task->ComputeLoss(
        student,
        {{"teacher_logits", step.teacher_logits}, {"labels", step.labels}},
        &grad, 0, 0, 1, false);
    ASSERT_TRUE(r.ok()) << r.status();
    std::vector<double> ref_grad;
    const double ref =
        Reference(student, step.teacher_logits, labels, t, alpha, &ref_grad);
    EXPECT_NEAR(r->loss, ref, 1e-10 * std::abs(ref)) << "T=" << t;
    EXPECT_EQ(r->weight, 5);
    for (int64_t i = 0; i < kB * kC; ++i) {
      EXPECT_NEAR(grad.data<float>()[i], ref_grad[i],
                  1e-6 * std::abs(ref_grad[i]) + 1e-9)
          << "T=" << t << " alpha=" << alpha << " i=" << i;
    }
  }
}

TEST(LogitDistillationTest, GradientMatchesFiniteDifferences) {
  auto task = MakeTask(R"(, "temperature": 1.5, "alpha": 0.6)");
  ASSERT_NE(task, nullptr);
  const std::vector<int64_t> labels = {1, -100, 0, 3};
  Step step = Forward(task.get(), RandomFloats({4, kD}, 4), labels);
  Tensor student = RandomFloats({4, kC}, 5, 2.0f);
  NamedTensors state = {{"teacher_logits", step.teacher_logits},
                        {"labels", step.labels}};
  Tensor grad = Tensor::Zeros(DType::kFloat32, {4, kC});
  ASSERT_TRUE(task->ComputeLoss(student, state, &grad, 0, 0, 1, false).ok());
  for (int64_t i = 0; i < student.numel(); ++i) {
    Tensor plus = student.Clone();
    Tensor minus = student.Clone();
    plus.data<float>()[i] += 1e-2f;
    minus.data<float>()[i] -= 1e-2f;
    const double h =
        static_cast<double>(plus.data<float>()[i]) - minus.data<float>()[i];
    auto lp = task->ComputeLoss(plus, state, nullptr, 0, 0, 1, true);
    auto lm = task->ComputeLoss(minus, state, nullptr, 0, 0, 1, true);
    ASSERT_TRUE(lp.ok() && lm.ok());
    EXPECT_NEAR(grad.data<float>()[i], (lp->loss - lm->loss) / h, 5e-5) << i;
  }
}

TEST(LogitDistillationTest, MicrobatchSplitGivesFullBatchLossAndGradient) {
  auto task = MakeTask(R"(, "temperature": 2.0, "alpha": 0.4)");
  ASSERT_NE(task, nullptr);
  const std::vector<int64_t> labels = {-100, -100, -100, 2, 0, 1, -100};
  Step step = Forward(task.get(), RandomFloats({kB, kD}, 6), labels);
  Tensor student = RandomFloats({kB, kC}, 7, 3.0f);
  NamedTensors state = {{"teacher_logits", step.teacher_logits},
                        {"labels", step.labels}};
  auto full = testing::RunMicrobatches(task.get(), student, state, 1, 0);
  ASSERT_TRUE(full.ok()) << full.status();
  for (int m : {2, 3, 5, 7}) {
    auto split = testing::RunMicrobatches(task.get(), student, state, m, 0);
    ASSERT_TRUE(split.ok()) << split.status();
    EXPECT_NEAR(split->loss, full->loss, 1e-6 * full->loss) << m;
    for (int64_t i = 0; i < student.numel(); ++i) {
      const float a = split->grad.data<float>()[i];
      const float b = full->grad.data<float>()[i];
      EXPECT_NEAR(a, b, 1e-6 * std::abs(b) + 1e-12) << "m=" << m << " i=" << i;
    }
  }
}

TEST(LogitDistillationTest, StepMetrics) {
  auto task = MakeTask(R"(, "alpha": 1.0, "temperature": 1.0)");
  ASSERT_NE(task, nullptr);
  const std::vector<int64_t> labels = {0, 1, 2, 3};
  Step step = Forward(task.get(), RandomFloats({4, kD}, 8), labels);
  // Student == teacher: KL is 0; alpha = 1 makes the loss 0 too.
  auto split = testing::RunMicrobatches(
      task.get(), step.teacher_logits,
      {{"teacher_logits", step.teacher_logits}, {"labels", step.labels}}, 2, 0);
  ASSERT_TRUE(split.ok()) << split.status();
  auto metrics = task->UpdateMetrics(false);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  ASSERT_EQ(metrics->size(), 4u);
  EXPECT_EQ((*metrics)[0].first, "loss");
  EXPECT_NEAR((*metrics)[0].second, 0.0, 1e-12);
  EXPECT_EQ((*metrics)[1].first, "kl");
  EXPECT_NEAR((*metrics)[1].second, 0.0, 1e-12);
  EXPECT_EQ((*metrics)[2].first, "ce");
  std::vector<double> unused;
  const double ce = Reference(step.teacher_logits, step.teacher_logits, labels,
                              1.0, 0.0, &unused);
  EXPECT_NEAR((*metrics)[2].second, ce, 1e-9);
  EXPECT_EQ((*metrics)[3].first, "accuracy");
  int correct = 0;
  for (int i = 0; i < 4; ++i) {
    const float* row = step.teacher_logits.data<float>() + i * kC;
    int best = 0;
    for (int k = 1; k < kC; ++k) best = row[k] > row[best] ? k : best;
    correct += best == labels[i];
  }
  EXPECT_DOUBLE_EQ((*metrics)[3].second, correct / 4.0);
}

TEST(LogitDistillationTest, RelativeTeacherPathUsesBaseDir) {
  WriteTeacher(TeacherFile(), "relative.safetensors");
  auto task = Create(absl::StrCat(R"({"teacher": "relative.safetensors", )",
                                  R"("base_dir": ")", testing::TempDir(),
                                  R"(", "activation": "gelu"})"));
  // A single activation for both blocks is accepted (numbers differ from
  // the relu/gelu teacher, which the forward test covers).
  EXPECT_TRUE(task.ok()) << task.status();
}

TEST(LogitDistillationTest, MissingTeacherFileNamesIt) {
  auto task = Create(R"({"teacher": "/nonexistent/t.safetensors"})");
  ASSERT_FALSE(task.ok());
  EXPECT_NE(task.status().message().find(
                "plugin \"logit_distillation\": create: task.config.teacher: "),
            absl::string_view::npos)
      << task.status();
  EXPECT_NE(task.status().message().find("/nonexistent/t.safetensors"),
            absl::string_view::npos)
      << task.status();
}

TEST(LogitDistillationTest, MissingTensorIsNamed) {
  SafetensorsFile f = TeacherFile();
  f.tensors.erase(f.tensors.begin() + 5);  // blocks.1.fc2.weight
  const std::string path = WriteTeacher(f, "missing.safetensors");
  auto task = Create(absl::StrCat(R"({"teacher": ")", path, R"("})"));
  ASSERT_FALSE(task.ok());
  EXPECT_EQ(task.status().message(),
            absl::StrCat("plugin \"logit_distillation\": create: teacher ",
                         path, ": missing tensor blocks.1.fc2.weight"));
}

TEST(LogitDistillationTest, BiasShapeMismatchIsNamed) {
  SafetensorsFile f = TeacherFile();
  f.tensors[1].second = RandomFloats({9}, 1);  // blocks.0.fc1.bias
  const std::string path = WriteTeacher(f, "badbias.safetensors");
  auto task = Create(absl::StrCat(R"({"teacher": ")", path, R"("})"));
  ASSERT_FALSE(task.ok());
  EXPECT_EQ(
      task.status().message(),
      absl::StrCat("plugin \"logit_distillation\": create: teacher ", path,
                   ": tensor blocks.0.fc1.bias: expected shape [8], got "
                   "[9]"));
}

TEST(LogitDistillationTest, NormConfigMustMatchFile) {
  const std::string path = WriteTeacher(TeacherFile(), "teacher.safetensors");
  auto task = Create(
      absl::StrCat(R"({"teacher": ")", path, R"(", "norm": "layernorm"})"));
  ASSERT_FALSE(task.ok());
  EXPECT_EQ(
      task.status().message(),
      absl::StrCat("plugin \"logit_distillation\": create: teacher ", path,
                   ": missing tensor blocks.0.norm.weight (block 0: norm "
                   "\"layernorm\", activation \"gelu\", bias yes)"));
  SafetensorsFile f = TeacherFile();
  f.tensors.push_back({"blocks.1.norm.weight", RandomFloats({7}, 1)});
  const std::string extra = WriteTeacher(f, "extra.safetensors");
  auto task2 = Create(absl::StrCat(R"({"teacher": ")", extra, R"("})"));
  ASSERT_FALSE(task2.ok());
  EXPECT_EQ(
      task2.status().message(),
      absl::StrCat("plugin \"logit_distillation\": create: teacher ", extra,
                   ": unexpected tensor blocks.1.norm.weight (not used "
                   "by the configured teacher blocks; check "
                   "teacher_blocks / norm / bias)"));
}

TEST(LogitDistillationTest, BlockCountMustMatchTeacherBlocks) {
  const std::string path = WriteTeacher(TeacherFile(), "teacher.safetensors");
  auto task = Create(
      absl::StrCat(R"({"teacher": ")", path, R"(", "teacher_blocks": [{}]})"));
  ASSERT_FALSE(task.ok());
  EXPECT_EQ(
      task.status().message(),
      absl::StrCat("plugin \"logit_distillation\": create: teacher ", path,
                   ": has 2 blocks (blocks.0 .. blocks.1) but "
                   "task.config.teacher_blocks lists 1"));
}

TEST(LogitDistillationTest, FeatureWidthMismatchNamesTensor) {
  auto task = MakeTask();
  ASSERT_NE(task, nullptr);
  auto r = task->BuildForwardInputs({{"features", RandomFloats({3, 5}, 1)},
                                     {"targets", Int64Tensor({0, 1, 2})}},
                                    0, false);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            absl::StrCat("plugin \"logit_distillation\": build_forward_inputs: "
                         "teacher ",
                         testing::TempDir(),
                         "/teacher.safetensors: tensor blocks.0.fc1.weight "
                         "expects 6 input features, but \"features\" is [3, "
                         "5]"));
}

TEST(LogitDistillationTest, StudentClassCountMustMatchTeacher) {
  auto task = MakeTask();
  ASSERT_NE(task, nullptr);
  Step step = Forward(task.get(), RandomFloats({3, kD}, 1), {0, 1, 2});
  Tensor grad = Tensor::Zeros(DType::kFloat32, {3, 5});
  auto r = task->ComputeLoss(
      RandomFloats({3, 5}, 2),
      {{"teacher_logits", step.teacher_logits}, {"labels", step.labels}}, &grad,
      0, 0, 1, false);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            absl::StrCat("plugin \"logit_distillation\": compute_loss: "
                         "teacher ",
                         testing::TempDir(),
                         "/teacher.safetensors: teacher_logits [3, 4] (tensor "
                         "blocks.1.fc2.weight gives 4 classes) do not match "
                         "the student output [3, 5]"));
}

// --- validate_config --------------------------------------------------------

TEST(LogitDistillationTest, ValidateConfigOpensNoFile) {
  // Neither teacher exists; paths are checked for their type only (the
  // controller does not know the worker's data folder).
  for (const std::string& config :
       {absl::StrCat(R"({"teacher": "/nonexistent/t.safetensors", )", kBlocks,
                     "}"),
        std::string(R"({"teacher": "../../t.safetensors", "base_dir": "/x",)"
                    R"( "norm": "layernorm", "temperature": 0.5,)"
                    R"( "alpha": 1, "ignore_index": 0})")}) {
    auto r = ValidateTaskConfig(PluginDir(), "logit_distillation", config);
    ASSERT_TRUE(r.ok()) << config << ": " << r.status();
    EXPECT_EQ(*r, ConfigCheck::kValid);
  }
}

TEST(LogitDistillationTest, ValidateConfigRefusesBadShape) {
  const std::pair<std::string, std::string> cases[] = {
      {"{}",
       "task.config.teacher: required (path to the teacher's safetensors "
       "file)"},
      {R"({"teacher": 3})", "task.config.teacher: must be a string, got 3"},
      {R"({"teacher": "t", "base_dir": false})",
       "task.config.base_dir: must be a string, got false"},
      {R"({"teacher": "t", "alpha": 2})",
       "task.config.alpha: must be in [0, 1], got 2"},
      {R"({"teacher": "t", "temperature": 0})",
       "task.config.temperature: must be > 0, got 0"},
      {R"({"teacher": "t", "activation": "tanh"})",
       "task.config.activation: unknown activation \"tanh\" (expected relu, "
       "gelu, gelu_tanh or swiglu)"},
      {R"({"teacher": "t", "residual": "yes"})",
       "task.config.residual: must be a boolean, got \"yes\""},
      {R"({"teacher": "t", "teacher_blocks": {}})",
       "task.config.teacher_blocks: must be a list of objects"},
      {R"({"teacher": "t", "teacher_blocks": [{}, 1]})",
       "task.config.teacher_blocks[1]: must be an object, got 1"},
      {R"({"teacher": "t", "teacher_blocks": [{"norm": "batchnorm"}]})",
       "task.config.teacher_blocks[0].norm: unknown norm \"batchnorm\" "
       "(expected none, layernorm or rmsnorm)"},
      {R"({"teacher": "t", "teacher_blocks": [{"act": "relu"}]})",
       "task.config.teacher_blocks[0].act: unknown key (allowed: activation, "
       "norm, residual)"},
      {R"({"teacher": "t", "teacher_blocks": [], "norm": "none"})",
       "task.config: give either teacher_blocks or a top-level "
       "activation/norm/residual, not both"},
      {R"({"teacher": "t", "teachr": "u"})",
       "task.config: unknown key \"teachr\" (allowed: activation, alpha, "
       "base_dir, ignore_index, norm, residual, teacher, teacher_blocks, "
       "temperature)"},
  };
  for (const auto& [config, message] : cases) {
    auto r = ValidateTaskConfig(PluginDir(), "logit_distillation", config);
    ASSERT_FALSE(r.ok()) << config;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().message(), message);
  }
}

// --- Paths confined to a data folder ----------------------------------------

// <scratch>/<name>/data holding teacher.safetensors and
// sub/teacher.safetensors, and outside it <scratch>/<name>/outside.safetensors
// (a valid teacher too) and secret.txt. All paths are real (symlinks resolved).
struct Folders {
  std::string root;  // <scratch>/<name>
  std::string data;  // root/data
};

Folders MakeFolders(const std::string& name) {
  char buf[PATH_MAX];
  EXPECT_NE(realpath(testing::TempDir().c_str(), buf), nullptr);
  Folders f;
  f.root = absl::StrCat(buf, "/", name);
  f.data = f.root + "/data";
  for (const std::string& dir : {f.root, f.data, f.data + "/sub"}) {
    EXPECT_EQ(mkdir(dir.c_str(), 0755), 0) << dir;
  }
  for (const std::string& file :
       {f.data + "/teacher.safetensors", f.data + "/sub/teacher.safetensors",
        f.root + "/outside.safetensors"}) {
    absl::Status s = WriteSafetensors(file, TeacherFile());
    EXPECT_TRUE(s.ok()) << s;
  }
  std::ofstream(f.root + "/secret.txt") << "TOP-SECRET-BYTES";
  return f;
}

absl::StatusOr<std::unique_ptr<Task>> CreateIn(const std::string& data_dir,
                                               const std::string& fields) {
  auto plugin = LoadPlugin(PluginDir(), "logit_distillation");
  if (plugin == nullptr) return absl::InternalError("load failed");
  return Task::Create(plugin, absl::StrCat("{", fields, ", ", kBlocks, "}"),
                      data_dir);
}

std::string Outside(const std::string& written, const std::string& real,
                    const Folders& f) {
  return absl::StrCat(
      "plugin \"logit_distillation\": create: task.config.teacher: \"", written,
      "\" resolves to \"", real, "\", outside the data folder ", f.data,
      ": file paths in task.config must stay inside it");
}

TEST(LogitDistillationTest, ConfinedTeacherInsideTheDataFolderLoads) {
  const Folders f = MakeFolders("confined_inside");
  for (const std::string& fields :
       {std::string(R"("teacher": "teacher.safetensors")"),
        std::string(R"("teacher": "./sub/../teacher.safetensors")"),
        std::string(R"("teacher": "teacher.safetensors", "base_dir": "sub")"),
        absl::StrCat(R"("teacher": ")", f.data, R"(/sub/teacher.safetensors")"),
        absl::StrCat(R"("teacher": "teacher.safetensors", "base_dir": ")",
                     f.data, R"(")")}) {
    auto task = CreateIn(f.data, fields);
    ASSERT_TRUE(task.ok()) << fields << ": " << task.status();
    Step step = Forward(task->get(), RandomFloats({3, kD}, 1), {0, 1, 2});
    EXPECT_EQ(step.teacher_logits.shape(), (Shape{3, kC})) << fields;
  }
}

TEST(LogitDistillationTest, ConfinedTeacherOutsideTheDataFolderIsRefused) {
  const Folders f = MakeFolders("confined_outside");
  const std::string outside = f.root + "/outside.safetensors";
  for (const std::string& written :
       {std::string("../outside.safetensors"),
        std::string("sub/../../outside.safetensors"), outside}) {
    auto task =
        CreateIn(f.data, absl::StrCat(R"("teacher": ")", written, R"(")"));
    ASSERT_FALSE(task.ok()) << written;
    EXPECT_EQ(task.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(task.status().message(), Outside(written, outside, f));
  }
  // The same file loads when nothing is confined.
  auto free =
      Create(absl::StrCat(R"({"teacher": ")", outside, R"(", )", kBlocks, "}"));
  EXPECT_TRUE(free.ok()) << free.status();
}

TEST(LogitDistillationTest, ConfinedBaseDirCannotLeadOutside) {
  const Folders f = MakeFolders("confined_base_dir");
  const std::string outside = f.root + "/outside.safetensors";
  for (const std::string& base : {std::string(".."), f.root}) {
    auto task =
        CreateIn(f.data, absl::StrCat(R"("teacher": "outside.safetensors", )",
                                      R"("base_dir": ")", base, R"(")"));
    ASSERT_FALSE(task.ok()) << base;
    EXPECT_EQ(task.status().message(),
              Outside("outside.safetensors", outside, f));
  }
}

TEST(LogitDistillationTest, ConfinedSymlinkPointingOutsideIsRefused) {
  const Folders f = MakeFolders("confined_symlink");
  const std::string outside = f.root + "/outside.safetensors";
  ASSERT_EQ(symlink(outside.c_str(), (f.data + "/link.safetensors").c_str()),
            0);
  ASSERT_EQ(symlink("..", (f.data + "/up").c_str()), 0);
  for (const std::string written :
       {"link.safetensors", "up/outside.safetensors"}) {
    auto task =
        CreateIn(f.data, absl::StrCat(R"("teacher": ")", written, R"(")"));
    ASSERT_FALSE(task.ok()) << written;
    EXPECT_EQ(task.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(task.status().message(), Outside(written, outside, f));
  }
}

TEST(LogitDistillationTest, ConfinedSymlinkStayingInsideIsAccepted) {
  const Folders f = MakeFolders("confined_symlink_inside");
  ASSERT_EQ(symlink("sub/teacher.safetensors",
                    (f.data + "/alias.safetensors").c_str()),
            0);
  auto task = CreateIn(f.data, R"("teacher": "alias.safetensors")");
  EXPECT_TRUE(task.ok()) << task.status();
  // The data folder itself may be reached through a symlink.
  const std::string link = f.root + "/data_link";
  ASSERT_EQ(symlink(f.data.c_str(), link.c_str()), 0);
  auto via_link = CreateIn(link, R"("teacher": "teacher.safetensors")");
  EXPECT_TRUE(via_link.ok()) << via_link.status();
}

TEST(LogitDistillationTest, ConfinedDanglingSymlinkIsRefused) {
  const Folders f = MakeFolders("confined_dangling");
  ASSERT_EQ(symlink("/nonexistent/t.safetensors",
                    (f.data + "/dangling.safetensors").c_str()),
            0);
  auto task = CreateIn(f.data, R"("teacher": "dangling.safetensors")");
  ASSERT_FALSE(task.ok());
  EXPECT_EQ(task.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(task.status().message(),
            absl::StrCat("plugin \"logit_distillation\": create: "
                         "task.config.teacher: \"dangling.safetensors\" "
                         "cannot be shown to stay inside the data folder ",
                         f.data, ": \"", f.data,
                         "/dangling.safetensors\" is a symbolic link that "
                         "does not resolve (No such file or directory)"));
}

TEST(LogitDistillationTest, ConfinedRefusalShowsNoFileBytes) {
  const Folders f = MakeFolders("confined_secret");
  auto task = CreateIn(f.data, R"("teacher": "../secret.txt")");
  ASSERT_FALSE(task.ok());
  EXPECT_EQ(task.status().message(),
            Outside("../secret.txt", f.root + "/secret.txt", f));
  EXPECT_EQ(task.status().message().find("TOP-SECRET"),
            absl::string_view::npos);
}

// --- Inference -------------------------------------------------------------

TEST(LogitDistillationTest, InferOutputsAreTheStudentsOutputs) {
  auto task = MakeTask();
  ASSERT_NE(task, nullptr);
  ASSERT_TRUE(task->plugin().has_infer_outputs());
  // The first stage runs the teacher as in training; its state travels on.
  auto fwd = task->BuildForwardInputs(
      {{"features", RandomFloats({kB, kD}, 41)},
       {"targets", Int64Tensor({0, 1, 2, 3, 0, 1, 2})}},
      0, /*is_eval=*/true);
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  Tensor student = RandomFloats({kB, kC}, 42, 3.0f);
  testing::ExpectOneOutputEqualTo(
      task->InferOutputs(student, fwd->state, 0, testing::TempDir(), 0, 1),
      "outputs", student);
}

}  // namespace
}  // namespace trainyard
