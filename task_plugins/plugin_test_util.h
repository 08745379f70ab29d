// Test helpers: where the plugin .so files are in a test's runfiles, and
// small tensor builders. Test-only.
#ifndef TRAINYARD_TASK_PLUGINS_PLUGIN_TEST_UTIL_H_
#define TRAINYARD_TASK_PLUGINS_PLUGIN_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "engine/task_loader.h"

namespace trainyard {
namespace testing {

// $TEST_SRCDIR/$TEST_WORKSPACE/task_plugins (or the relative path when not
// run by `bazel test`), and its testdata/ subfolder.
std::string PluginDir();
std::string TestdataPluginDir();
// A fresh scratch folder for files a test writes.
std::string TempDir();

// Loads a plugin or fails the test (returns null then).
std::shared_ptr<const TaskPlugin> LoadPlugin(const std::string& dir,
                                             const std::string& name);

// Runs compute_loss over `output` split along dim 0 into `num_microbatches`
// pieces (sizes differ by at most 1) and combines them like the engine:
// loss = sum(w_i loss_i) / sum(w_i), grad rows = w_i grad_i / sum(w_i).
struct Combined {
  double loss = 0;
  double weight = 0;  // sum(w_i)
  Tensor grad;        // like output
};
absl::StatusOr<Combined> RunMicrobatches(Task* task, const Tensor& output,
                                         const NamedTensors& state,
                                         int num_microbatches, int64_t step);

// Expects what InferOutputs returned to be one float32 tensor named `name`,
// equal to `expected` bit for bit.
void ExpectOneOutputEqualTo(const absl::StatusOr<NamedTensors>& outputs,
                            const std::string& name, const Tensor& expected);

Tensor Int64Tensor(const std::vector<int64_t>& values);
Tensor Int32Tensor(const std::vector<int32_t>& values);
// Deterministic pseudo-random float32 values in [-scale, scale).
Tensor RandomFloats(Shape shape, uint64_t seed, float scale = 2.0f);

}  // namespace testing
}  // namespace trainyard

#endif  // TRAINYARD_TASK_PLUGINS_PLUGIN_TEST_UTIL_H_
