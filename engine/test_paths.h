// Paths for tests under `bazel test`: the task plugins in the runfiles and
// the test's scratch folder. Test-only.
#ifndef TRAINYARD_ENGINE_TEST_PATHS_H_
#define TRAINYARD_ENGINE_TEST_PATHS_H_

#include <cstdlib>
#include <string>

namespace trainyard {
namespace testing {

// $TEST_SRCDIR/$TEST_WORKSPACE/task_plugins (or "task_plugins" outside
// `bazel test`).
inline std::string PluginDir() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* ws = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr || ws == nullptr) return "task_plugins";
  return std::string(srcdir) + "/" + ws + "/task_plugins";
}

// $TEST_TMPDIR (or /tmp).
inline std::string TempDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return tmp != nullptr ? tmp : "/tmp";
}

}  // namespace testing
}  // namespace trainyard

#endif  // TRAINYARD_ENGINE_TEST_PATHS_H_
