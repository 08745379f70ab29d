#include "task_plugins/plugin_test_util.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "core/random.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace testing {

std::string PluginDir() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr || workspace == nullptr) return "task_plugins";
  return absl::StrCat(srcdir, "/", workspace, "/task_plugins");
}

std::string TestdataPluginDir() { return PluginDir() + "/testdata"; }

std::string TempDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return tmp != nullptr ? std::string(tmp) : std::string("/tmp");
}

std::shared_ptr<const TaskPlugin> LoadPlugin(const std::string& dir,
                                             const std::string& name) {
  absl::StatusOr<std::unique_ptr<TaskPlugin>> p = TaskPlugin::Load(dir, name);
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return nullptr;
  return std::shared_ptr<const TaskPlugin>(std::move(*p));
}

void ExpectOneOutputEqualTo(const absl::StatusOr<NamedTensors>& outputs,
                            const std::string& name, const Tensor& expected) {
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  ASSERT_EQ(outputs->size(), 1u);
  EXPECT_EQ((*outputs)[0].first, name);
  const Tensor& got = (*outputs)[0].second;
  ASSERT_EQ(got.dtype(), DType::kFloat32);
  ASSERT_EQ(got.shape(), expected.shape());
  for (int64_t i = 0; i < expected.numel(); ++i) {
    EXPECT_EQ(got.data<float>()[i], expected.data<float>()[i]) << name << i;
  }
}

absl::StatusOr<Combined> RunMicrobatches(Task* task, const Tensor& output,
                                         const NamedTensors& state,
                                         int num_microbatches, int64_t step) {
  const int64_t b = output.dim(0);
  const int64_t cols = output.dim(1);
  Combined c;
  c.grad = Tensor::Zeros(DType::kFloat32, output.shape());
  std::vector<double> grad(output.numel(), 0.0);
  double weighted = 0;
  int64_t begin = 0;
  for (int m = 0; m < num_microbatches; ++m) {
    const int64_t rows = b / num_microbatches + (m < b % num_microbatches);
    const int64_t end = begin + rows;
    NamedTensors mb_state;
    for (const auto& [name, t] : state) {
      mb_state.emplace_back(name, t.Rows(begin, end));
    }
    Tensor g = Tensor::Zeros(DType::kFloat32, {rows, cols});
    absl::StatusOr<LossResult> r =
        task->ComputeLoss(output.Rows(begin, end), mb_state, &g, step, m,
                          num_microbatches, /*is_eval=*/false);
    if (!r.ok()) return r.status();
    weighted += r->weight * r->loss;
    c.weight += r->weight;
    for (int64_t i = 0; i < rows * cols; ++i) {
      grad[begin * cols + i] += r->weight * g.data<float>()[i];
    }
    begin = end;
  }
  if (c.weight > 0) {
    c.loss = weighted / c.weight;
    for (size_t i = 0; i < grad.size(); ++i) {
      c.grad.data<float>()[i] = static_cast<float>(grad[i] / c.weight);
    }
  }
  return c;
}

Tensor Int64Tensor(const std::vector<int64_t>& values) {
  Tensor t =
      Tensor::Empty(DType::kInt64, {static_cast<int64_t>(values.size())});
  for (size_t i = 0; i < values.size(); ++i) t.data<int64_t>()[i] = values[i];
  return t;
}

Tensor Int32Tensor(const std::vector<int32_t>& values) {
  Tensor t =
      Tensor::Empty(DType::kInt32, {static_cast<int64_t>(values.size())});
  for (size_t i = 0; i < values.size(); ++i) t.data<int32_t>()[i] = values[i];
  return t;
}

Tensor RandomFloats(Shape shape, uint64_t seed, float scale) {
  Tensor t = Tensor::Empty(DType::kFloat32, shape);
  Rng rng(seed);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = rng.Uniform(-scale, scale);
  return t;
}

}  // namespace testing
}  // namespace trainyard
