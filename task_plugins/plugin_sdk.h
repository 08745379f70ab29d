// Plugin-side helpers for writing a task plugin in C++ (the host never
// includes this). A plugin derives from PluginTask, implements
//   static std::set<std::string> ConfigKeys();
//   static absl::StatusOr<std::unique_ptr<PluginTask>> Create(
//       const nlohmann::json& config, const CreateContext& ctx);
// and exports its table with TRAINYARD_EXPORT_TASK_PLUGIN(Class, "name").
// A task that can run inference jobs also overrides InferOutputs; the
// table of one that does not has no infer_outputs.
// The adapter parses the config (unknown keys are errors), turns
// absl::Status into the ABI's int + TrainyardError, and catches every
// exception so none crosses the C boundary.
//
// From that one Create the adapter fills three ABI entries: create,
// create_confined (ctx.data_dir set) and validate_config (ctx.validate_only:
// Create checks the config and returns before opening anything). A plugin
// whose Create takes only the config still builds; its table then has no
// validate_config and no create_confined (a host with a data folder gives it
// only an empty config).
//
// Ownership: the task handle is the PluginTask*, deleted by destroy().
// Thread safety: the ABI calls one handle from one thread at a time.
#ifndef TRAINYARD_TASK_PLUGINS_PLUGIN_SDK_H_
#define TRAINYARD_TASK_PLUGINS_PLUGIN_SDK_H_

#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "task_plugins/task_abi.h"

namespace trainyard {
namespace plugin {

class PluginTask {
 public:
  virtual ~PluginTask() = default;
  virtual absl::Status BuildForwardInputs(const TrainyardBatch& batch,
                                          TrainyardSink* out) = 0;
  virtual absl::Status ComputeLoss(const TrainyardLossArgs& args,
                                   TrainyardLossResult* result,
                                   TrainyardSink* metrics) = 0;
  virtual absl::Status UpdateMetrics(bool is_eval, TrainyardSink* out) = 0;
  // One microbatch of an inference job (task_abi.h, infer_outputs): adds
  // the microbatch's named outputs to `out`. Only a class that overrides
  // it gets infer_outputs in its table; this default is never called
  // through the ABI.
  virtual absl::Status InferOutputs(const TrainyardInferArgs& args,
                                    TrainyardSink* out) {
    return absl::UnimplementedError("this task cannot run inference jobs");
  }
};

// A task whose loss also runs on the device (task ABI v2) derives from
// DevicePluginTask and is exported with TRAINYARD_EXPORT_DEVICE_TASK_PLUGIN;
// the class also declares
//   static constexpr uint32_t kNumSlots;  // TrainyardTaskV2.num_slots
//   static constexpr uint32_t kV2Flags;   // TRAINYARD_V2_* flags
class DevicePluginTask : public PluginTask {
 public:
  // Device bytes ComputeLossDevice needs for an output of rows x cols.
  virtual size_t DeviceWorkspaceBytes(int64_t rows, int64_t cols) { return 0; }
  // Enqueues one microbatch's loss (task_abi.h, compute_loss_device).
  virtual absl::Status ComputeLossDevice(
      const TrainyardDeviceLossArgs& args) = 0;
  // One microbatch's slots, read back by the host (finish_loss).
  virtual absl::Status FinishLoss(const double* slots, int32_t microbatch,
                                  int32_t num_microbatches, bool is_eval,
                                  TrainyardSink* metrics) = 0;
};

// What the host tells Create besides the config.
struct CreateContext {
  // The folder every file path in the config must stay inside, symlinks
  // included (the worker's --data_dir): absolute, symlinks resolved; empty
  // when the host has none. Open a path key only through ResolveDataPath.
  std::string data_dir;
  // Set when the host only checks the config (validate_config, e.g. on the
  // controller at submit, where the job's files may not exist): Create must
  // check keys, types and ranges and then return without opening files or
  // touching devices. It returns nullptr, or a task when making one touches
  // nothing (the SDK deletes it at once).
  bool validate_only = false;
};

// Writes `message` (truncated) into err.
void SetError(TrainyardError* err, const std::string& message);

// Runs f (returning absl::Status) and maps it onto the ABI's 0 / non-zero.
template <typename F>
int Guard(TrainyardError* err, F&& f) {
  try {
    absl::Status s = f();
    if (s.ok()) return 0;
    SetError(err, std::string(s.message()));
  } catch (const std::exception& e) {
    SetError(err, std::string("internal error: ") + e.what());
  } catch (...) {
    SetError(err, "internal error: unknown exception");
  }
  return 1;
}

// Parses a JSON object and refuses keys outside `allowed`.
absl::StatusOr<nlohmann::json> ParseConfig(
    const char* text, const std::set<std::string>& allowed);
// Typed optional fields; errors name the key and the expected type.
absl::StatusOr<double> GetNumber(const nlohmann::json& config,
                                 const std::string& key, double fallback);
absl::StatusOr<int64_t> GetInt(const nlohmann::json& config,
                               const std::string& key, int64_t fallback);
absl::StatusOr<std::string> GetString(const nlohmann::json& config,
                                      const std::string& key,
                                      const std::string& fallback);

// The file named by config key `key` (value `path`), ready to open. A
// relative path resolves against `base_dir` when it is not empty, else
// against ctx.data_dir; a relative base_dir resolves against ctx.data_dir.
// Without ctx.data_dir, returns that join as it is (the current folder is the
// base of what stays relative). With it, ".." and symlinks are resolved and
// the result must lie inside ctx.data_dir: returns its real path (open that,
// not `path`), or InvalidArgument
//   task.config.<key>: "<path>" resolves to "<real path>", outside the data
//   folder <data_dir>: file paths in task.config must stay inside it
// (also for a dangling symlink on the way). Never opens the file.
absl::StatusOr<std::string> ResolveDataPath(const CreateContext& ctx,
                                            const std::string& key,
                                            const std::string& path,
                                            const std::string& base_dir = "");

// "[2, 3]" for an ABI tensor; "float32"/"int32"/"int64" for a dtype.
std::string ShapeString(const TrainyardTensor& t);
std::string DTypeString(int32_t dtype);
int64_t NumElements(const TrainyardTensor& t);

// The tensor called `name`, or NotFound listing what there is.
absl::StatusOr<const TrainyardTensor*> FindTensor(
    const TrainyardTensor* tensors, int32_t n, const std::string& name);

// Class-index labels: int32/int64 of rank 1.
bool IsLabelTensor(const TrainyardTensor& t);
int64_t LabelAt(const TrainyardTensor& t, int64_t i);

// The batch's "features" (float32 [B, D]) copied to "inputs"; returns it.
absl::StatusOr<const TrainyardTensor*> CopyFeaturesToInputs(
    const TrainyardBatch& batch, TrainyardSink* out);

// Allocates through the sink; an error naming the tensor if the host refuses.
absl::StatusOr<void*> AddTensor(TrainyardSink* sink, const std::string& name,
                                int32_t dtype,
                                const std::vector<int64_t>& shape);

// Adds a copy of `t`, float32 [rows, cols], to the sink as `name`.
absl::Status AddFloat32Copy(TrainyardSink* sink, const std::string& name,
                            const TrainyardTensor& t);

// Whether T::Create takes a CreateContext.
template <typename T, typename = void>
struct TakesCreateContext : std::false_type {};
template <typename T>
struct TakesCreateContext<
    T, std::void_t<decltype(T::Create(std::declval<const nlohmann::json&>(),
                                      std::declval<const CreateContext&>()))>>
    : std::true_type {};

// Whether T overrides PluginTask::InferOutputs (then &T::InferOutputs is a
// member of T or of a class between it and PluginTask).
template <typename T>
constexpr bool OverridesInferOutputs() {
  return !std::is_same<decltype(&T::InferOutputs),
                       absl::Status (PluginTask::*)(const TrainyardInferArgs&,
                                                    TrainyardSink*)>::value;
}

template <typename T>
struct TableAdapter {
  // Parses the config and runs T::Create; the task it made, or an error.
  static absl::StatusOr<std::unique_ptr<PluginTask>> Run(
      const char* config_json, const CreateContext& ctx) {
    absl::StatusOr<nlohmann::json> config =
        ParseConfig(config_json, T::ConfigKeys());
    if (!config.ok()) return config.status();
    if constexpr (TakesCreateContext<T>::value) {
      return T::Create(*config, ctx);
    } else {
      return T::Create(*config);
    }
  }
  static void* CreateWith(const char* config_json, const CreateContext& ctx,
                          TrainyardError* err) {
    void* handle = nullptr;
    Guard(err, [&]() -> absl::Status {
      absl::StatusOr<std::unique_ptr<PluginTask>> task = Run(config_json, ctx);
      if (!task.ok()) return task.status();
      if (*task == nullptr) {
        return absl::InternalError("Create returned OK without a task");
      }
      handle = task->release();
      return absl::OkStatus();
    });
    return handle;
  }
  static void* Create(const char* config_json, TrainyardError* err) {
    return CreateWith(config_json, CreateContext(), err);
  }
  static void* CreateConfined(const char* config_json, const char* data_dir,
                              TrainyardError* err) {
    if (data_dir == nullptr || data_dir[0] == '\0') {
      SetError(err, "create_confined: no data folder given");
      return nullptr;
    }
    CreateContext ctx;
    ctx.data_dir = data_dir;
    return CreateWith(config_json, ctx, err);
  }
  static int Validate(const char* config_json, TrainyardError* err) {
    return Guard(err, [&]() -> absl::Status {
      CreateContext ctx;
      ctx.validate_only = true;
      return Run(config_json, ctx).status();  // a task made is deleted here
    });
  }
  static int Build(void* task, const TrainyardBatch* batch, TrainyardSink* out,
                   TrainyardError* err) {
    return Guard(err, [&] {
      return static_cast<PluginTask*>(task)->BuildForwardInputs(*batch, out);
    });
  }
  static int Loss(void* task, const TrainyardLossArgs* args,
                  TrainyardLossResult* result, TrainyardSink* metrics,
                  TrainyardError* err) {
    return Guard(err, [&] {
      return static_cast<PluginTask*>(task)->ComputeLoss(*args, result,
                                                         metrics);
    });
  }
  static int Metrics(void* task, int32_t is_eval, TrainyardSink* out,
                     TrainyardError* err) {
    return Guard(err, [&] {
      return static_cast<PluginTask*>(task)->UpdateMetrics(is_eval != 0, out);
    });
  }
  static int Infer(void* task, const TrainyardInferArgs* args,
                   TrainyardSink* out, TrainyardError* err) {
    return Guard(err, [&] {
      return static_cast<PluginTask*>(task)->InferOutputs(*args, out);
    });
  }
  static void Destroy(void* task) { delete static_cast<PluginTask*>(task); }

  // The device half (T derives from DevicePluginTask).
  static size_t WorkspaceBytes(void* task, int64_t rows, int64_t cols) {
    try {
      return static_cast<T*>(static_cast<PluginTask*>(task))
          ->DeviceWorkspaceBytes(rows, cols);
    } catch (...) {
      return 0;
    }
  }
  static int LossDevice(void* task, const TrainyardDeviceLossArgs* args,
                        TrainyardError* err) {
    return Guard(err, [&] {
      return static_cast<T*>(static_cast<PluginTask*>(task))
          ->ComputeLossDevice(*args);
    });
  }
  static int Finish(void* task, const double* slots, int64_t /*step*/,
                    int32_t microbatch, int32_t num_microbatches,
                    int32_t is_eval, TrainyardSink* metrics,
                    TrainyardError* err) {
    return Guard(err, [&] {
      return static_cast<T*>(static_cast<PluginTask*>(task))
          ->FinishLoss(slots, microbatch, num_microbatches, is_eval != 0,
                       metrics);
    });
  }

  static const TrainyardTaskV1* V1(const char* name) {
    static const TrainyardTaskV1 table = Make(name);
    return &table;
  }
  static const TrainyardTaskV2* V2(const char* name) {
    static_assert(std::is_base_of<DevicePluginTask, T>::value,
                  "a device task plugin derives from DevicePluginTask");
    static const TrainyardTaskV2 table = [name] {
      TrainyardTaskV2 t;
      std::memset(&t, 0, sizeof(t));
      t.abi_version = TRAINYARD_TASK_ABI_VERSION_2;
      t.struct_size = sizeof(TrainyardTaskV2);
      t.v1 = V1(name);
      t.flags = T::kV2Flags;
      t.num_slots = T::kNumSlots;
      t.workspace_bytes = &WorkspaceBytes;
      t.compute_loss_device = &LossDevice;
      t.finish_loss = &Finish;
      return t;
    }();
    return &table;
  }

  static TrainyardTaskV1 Make(const char* name) {
    TrainyardTaskV1 t;
    std::memset(&t, 0, sizeof(t));
    t.abi_version = TRAINYARD_TASK_ABI_VERSION;
    t.struct_size = TRAINYARD_TASK_V1_SIZE_CURRENT;
    t.name = name;
    t.create = &Create;
    t.build_forward_inputs = &Build;
    t.compute_loss = &Loss;
    t.update_metrics = &Metrics;
    t.destroy = &Destroy;
    if constexpr (TakesCreateContext<T>::value) {
      t.validate_config = &Validate;
      t.create_confined = &CreateConfined;
    }
    if constexpr (OverridesInferOutputs<T>()) t.infer_outputs = &Infer;
    return t;
  }
};

}  // namespace plugin
}  // namespace trainyard

// Defines the exported entry point for a PluginTask subclass.
#define TRAINYARD_EXPORT_TASK_PLUGIN(Class, name_literal)                  \
  extern "C" __attribute__((visibility("default"))) const TrainyardTaskV1* \
  trainyard_task_v1(void) {                                                \
    return ::trainyard::plugin::TableAdapter<Class>::V1(name_literal);     \
  }

// The same for a DevicePluginTask subclass: both entry points, v1 and v2.
#define TRAINYARD_EXPORT_DEVICE_TASK_PLUGIN(Class, name_literal)           \
  TRAINYARD_EXPORT_TASK_PLUGIN(Class, name_literal)                        \
  extern "C" __attribute__((visibility("default"))) const TrainyardTaskV2* \
  trainyard_task_v2(void) {                                                \
    return ::trainyard::plugin::TableAdapter<Class>::V2(name_literal);     \
  }

#endif  // TRAINYARD_TASK_PLUGINS_PLUGIN_SDK_H_
