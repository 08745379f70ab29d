// Host side of the task plugin ABI (task_abi.h, docs/PLUGIN_ABI.md).
//
// TaskPlugin loads lib<name>.so from a plugin folder and validates its
// TrainyardTaskV1 table, and its TrainyardTaskV2 table (the loss on the
// device) when it exports one; Task wraps one task handle created from it
// and turns every call into Status/StatusOr over trainyard::Tensor. The host
// checks everything a plugin returns (names, dtypes, shapes, finiteness,
// weights, use of the sink) and reports violations as errors naming the plugin
// and the call, so a plugin that breaks the contract through anything the ABI
// can express cannot corrupt or crash the host. What cannot be contained
// in-process: crashes inside plugin code (segfault, abort, stack overflow),
// writes through wild pointers, infinite loops, and a plugin writing past the
// end of a buffer the host gave it.
//
// Implementation: task_loader.cc loads and validates a library (its ELF
// export check in engine/plugin_elf.h); task.cc makes Task's calls, with
// the tensors marshalled by engine/plugin_tensors.h, each call run by
// engine/plugin_call.h and its result checked by engine/plugin_checks.h.
//
// Ownership: a TaskPlugin owns its dlopen handle (dlclose on destruction;
// the library is opened with RTLD_NODELETE, so its code stays mapped for
// threads or TLS destructors the plugin may have left behind).
// Each Task holds a shared_ptr to its TaskPlugin, so the library stays mapped
// until the last Task created from it is destroyed. Tensors returned by Task
// methods are host-owned copies; nothing returned points into plugin memory.
//
// Thread safety: TaskPlugin is immutable after Load and may be shared across
// threads. A Task must be called from one thread at a time (the ABI allows
// the plugin to assume so); distinct Tasks may run on distinct threads.
#ifndef TRAINYARD_ENGINE_TASK_LOADER_H_
#define TRAINYARD_ENGINE_TASK_LOADER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/tensor.h"
#include "task_plugins/task_abi.h"

namespace trainyard {

// Where the shipped task plugins are, seen from the running binary: the
// nearest "task_plugins" (Bazel: bazel-bin/task_plugins beside
// bazel-bin/<package>/<binary>) or "plugins" (the GPU bundle: plugins/
// beside bin/) folder holding libmse.so, looking up to three folders up;
// else <binary's folder>/../task_plugins.
std::string DefaultPluginDir();

// What checking a config without a task found, when the config is valid.
enum class ConfigCheck {
  kValid,       // the plugin's validate_config accepted it
  kNotChecked,  // the plugin has no validate_config: only create checks it
};

// A loaded, validated plugin library. Immutable after Load.
class TaskPlugin {
 public:
  // Loads <plugin_dir>/lib<name>.so. `name` must match [A-Za-z0-9_]+.
  // Errors (each naming the plugin, the file and the reason):
  //   InvalidArgument     bad name or empty plugin_dir
  //   NotFound            no such file, or no trainyard_task_v1 symbol
  //   FailedPrecondition  dlopen failed (dlerror() text included), the entry
  //                       returned NULL, wrong abi_version, a struct_size
  //                       other than TRAINYARD_TASK_V1_SIZE_BASE,
  //                       TRAINYARD_TASK_V1_SIZE_CONFINED or
  //                       TRAINYARD_TASK_V1_SIZE_CURRENT, NULL name or NULL
  //                       required function; for an exported
  //                       trainyard_task_v2: a NULL table, another
  //                       abi_version or struct_size, a v1 field that is not
  //                       the v1 table, num_slots outside [4, 64], unknown
  //                       flags or a NULL required function
  static absl::StatusOr<std::unique_ptr<TaskPlugin>> Load(
      const std::string& plugin_dir, const std::string& name);

  ~TaskPlugin();
  TaskPlugin(const TaskPlugin&) = delete;
  TaskPlugin& operator=(const TaskPlugin&) = delete;

  const std::string& name() const { return name_; }  // as passed to Load
  const std::string& path() const { return path_; }  // the .so loaded
  // The table's own name field, e.g. "cross_entropy".
  std::string table_name() const { return table_.name; }
  // The plugin's table in the current layout: a copy of its first
  // struct_size bytes, with the fields it does not cover NULL.
  const TrainyardTaskV1& table() const { return table_; }
  // The plugin's struct_size (TRAINYARD_TASK_V1_SIZE_BASE for a plugin built
  // before validate_config, TRAINYARD_TASK_V1_SIZE_CONFINED for one built
  // before infer_outputs).
  uint32_t struct_size() const { return table_.struct_size; }
  // Whether the plugin can run inference jobs: its table has infer_outputs.
  bool has_infer_outputs() const { return table_.infer_outputs != nullptr; }
  // Whether the plugin exports a valid TrainyardTaskV2 (its loss runs on the
  // device), and that table (zeroed when not).
  bool has_device_loss() const { return has_v2_; }
  const TrainyardTaskV2& device_table() const { return v2_; }
  // TRAINYARD_V2_PASSTHROUGH_INPUTS: on device stages the host gathers the
  // rows itself and skips build_forward_inputs.
  bool passes_inputs_through() const {
    return has_v2_ && (v2_.flags & TRAINYARD_V2_PASSTHROUGH_INPUTS) != 0;
  }

  // Checks `config_json` ("{}" if empty) with the plugin's validate_config,
  // which touches no files or devices. Thread-safe. Returns kNotChecked when
  // the plugin has none. Errors:
  //   InvalidArgument  the plugin refused the config: the plugin's message,
  //                    prefixed "task.config: " unless it already names a
  //                    field under task.config, at most 1 KiB
  //   Internal         validate_config threw across the ABI
  absl::StatusOr<ConfigCheck> ValidateConfig(
      const std::string& config_json) const;

 private:
  // Validates and copies the table the v2 entry point `entry` returns.
  absl::Status LoadDeviceTable(void* entry, const TrainyardTaskV1* v1);

  TaskPlugin(std::string name, std::string path, void* handle,
             const TrainyardTaskV1& table)
      : name_(std::move(name)),
        path_(std::move(path)),
        handle_(handle),
        table_(table) {}

  std::string name_;
  std::string path_;
  void* handle_;           // from dlopen; dlclose'd in the destructor
  TrainyardTaskV1 table_;  // copied at Load; see table()
  bool has_v2_ = false;
  TrainyardTaskV2 v2_ = {};  // copied at Load when exported
};

// Checks a job's task config without creating a task, e.g. on the
// controller at submit: loads <plugin_dir>/lib<plugin_name>.so with
// TaskPlugin::Load's checks (nothing else in the folder is loaded) and runs
// TaskPlugin::ValidateConfig. The library is closed before returning, so a
// call per submit holds nothing (the code stays mapped, RTLD_NODELETE, once
// per file). Thread-safe. Errors: TaskPlugin::Load's, then ValidateConfig's.
absl::StatusOr<ConfigCheck> ValidateTaskConfig(const std::string& plugin_dir,
                                               const std::string& plugin_name,
                                               const std::string& config_json);

// What build_forward_inputs produced for one step.
struct ForwardInputs {
  Tensor inputs;       // float32 [B, D]
  NamedTensors state;  // per-sample tensors, dim 0 == B, in the plugin's order
};

// What compute_loss produced for one microbatch.
struct LossResult {
  double loss = 0;
  double weight = 0;  // >= 0; 0 only when the microbatch contributes nothing
  // weight * loss as the engine sums it: computed on the host from v1's
  // result, the device's own product for v2 (its TRAINYARD_SLOT_WEIGHTED_LOSS).
  double weighted_loss = 0;
  std::vector<std::pair<std::string, double>> metrics;  // per microbatch
};

using Metrics = std::vector<std::pair<std::string, double>>;

// One task handle created by a plugin. Methods follow the ABI lifecycle:
//   Create -> { BuildForwardInputs -> ComputeLoss x M -> UpdateMetrics }*
//          -> Finalize -> (destructor calls destroy)
// and, in an inference job,
//   Create -> { BuildForwardInputs(is_eval) -> InferOutputs x M }*
//          -> Finalize -> (destructor calls destroy)
// Errors the plugin reports are InvalidArgument; contract violations the host
// detects in what the plugin returned are Internal; misuse by the caller
// (wrong tensors passed in, calls after Finalize) is InvalidArgument or
// FailedPrecondition. Every message starts with `plugin "<name>": <call>:`.
class Task {
 public:
  // Creates a task from `config_json` ("{}" if empty).
  //
  // `data_dir` empty: calls create(config_json); file paths in the config
  // are not confined.
  // `data_dir` set (the worker's --data_dir): every file path in the config
  // must resolve, symlinks included, inside that folder. Calls
  // create_confined(config_json, real path of data_dir); a path outside is
  // InvalidArgument naming task.config.<key> and the folder. A plugin
  // without create_confined (built before it, or an SDK plugin whose Create
  // takes no CreateContext) gets only an empty config ("{}"); any other is
  // FailedPrecondition, since its paths could not be confined.
  // Other errors: InvalidArgument when the plugin refuses the config;
  // FailedPrecondition when data_dir is not an existing folder.
  static absl::StatusOr<std::unique_ptr<Task>> Create(
      std::shared_ptr<const TaskPlugin> plugin, const std::string& config_json,
      const std::string& data_dir = "");

  ~Task();  // destroy(handle)
  Task(const Task&) = delete;
  Task& operator=(const Task&) = delete;

  const TaskPlugin& plugin() const { return *plugin_; }

  // First stage. `batch` holds the raw batch tensors (CPU, float32/int32/
  // int64, rank >= 1, equal dim 0 = B), e.g. "features" [B, D] and
  // "targets" [B] or [B, K]. Returns "inputs" (float32 [B, D'] ) and the
  // state tensors (dim 0 == B).
  absl::StatusOr<ForwardInputs> BuildForwardInputs(const NamedTensors& batch,
                                                   int64_t step, bool is_eval);

  // Last stage, one microbatch. `output` is float32 [b, out]; `state` is
  // this microbatch's slice of every state tensor (dim 0 == b);
  // `grad_output` must be a float32 tensor shaped like `output` unless
  // is_eval (then it may be undefined and is not written). The host zeroes
  // it and the plugin writes dLoss/dOutput of the returned loss into it.
  absl::StatusOr<LossResult> ComputeLoss(
      const Tensor& output, const NamedTensors& state, Tensor* grad_output,
      int64_t step, int32_t microbatch, int32_t num_microbatches, bool is_eval);

  // ---- ABI v2: the loss on the device (plugin().has_device_loss()).
  //
  // Device bytes of workspace ComputeLossDevice needs for an output of
  // rows x cols.
  size_t DeviceLossWorkspaceBytes(int64_t rows, int64_t cols);
  // Enqueues the loss of one microbatch on `device` (CUDA or simulated)
  // and `stream` (CUDA's cudaStream_t; null on the simulated device).
  // `output` is float32 or bfloat16 [b, out] on `device`; `state` the
  // microbatch's state tensors on `device` (dim 0 == b); `grad_output`
  // (unless is_eval) a tensor like `output` that the plugin fills with
  // w dLoss/dOutput; `slots` num_slots device doubles, zeroed by the
  // caller; `workspace` at least DeviceLossWorkspaceBytes (may be
  // undefined when that is 0). Nothing is waited for. Errors: the
  // arguments (InvalidArgument), the plugin's refusal (InvalidArgument),
  // as for ComputeLoss.
  absl::Status ComputeLossDevice(Device device, void* stream,
                                 const Tensor& output,
                                 const NamedTensors& state, Tensor* grad_output,
                                 double* slots, const Tensor& workspace,
                                 int64_t step, int32_t microbatch,
                                 int32_t num_microbatches, bool is_eval);
  // After the host read the microbatch's slots (num_slots host doubles):
  // checks them and lets the plugin check its bad-input marker and
  // accumulate its metric partials. Returns the microbatch's loss and
  // weight (loss = w L / w, or 0 for w = 0), with the checks of
  // ComputeLoss (non-finite loss, negative weight, weight 0 with a loss):
  // Internal; the plugin's refusal (a bad label): InvalidArgument.
  absl::StatusOr<LossResult> FinishLoss(const double* slots, int64_t step,
                                        int32_t microbatch,
                                        int32_t num_microbatches, bool is_eval);

  // ---- Inference jobs (plugin().has_infer_outputs()).
  //
  // Last stage of an inference job, one microbatch: the plugin's named
  // outputs (host tensors, dim 0 == output.dim(0)), in the order added.
  // `output` is float32 [b, out] on the host; `state` the microbatch's state
  // tensors (dim 0 == b); its first row is data row `row_offset` (>= 0);
  // `output_dir` is the job's output folder (absolute, existing).
  // Errors:
  //   FailedPrecondition  the plugin has no infer_outputs (`plugin "x"
  //                       cannot run inference jobs: ...`); after Finalize;
  //                       output_dir is not an existing folder
  //   InvalidArgument     the arguments (output, state rows, microbatch,
  //                       row_offset, a relative output_dir); the plugin's
  //                       refusal, prefixed `plugin "x": infer_outputs: `
  //   Internal            what the plugin added breaks the contract: no
  //                       tensor, a name outside [A-Za-z0-9_]+, a dtype
  //                       other than float32/int32/int64, rank 0, dim 0 !=
  //                       b, or names, dtypes or trailing dims that differ
  //                       from this Task's first successful call
  absl::StatusOr<NamedTensors> InferOutputs(const Tensor& output,
                                            const NamedTensors& state,
                                            int64_t row_offset,
                                            const std::string& output_dir,
                                            int32_t microbatch,
                                            int32_t num_microbatches);

  // Metrics accumulated since the previous call with the same is_eval.
  absl::StatusOr<Metrics> UpdateMetrics(bool is_eval);

  // Opaque task state for checkpoints ("" for stateless plugins).
  absl::StatusOr<std::string> StateDict();
  // Restores StateDict's bytes. A stateless plugin accepts only "".
  absl::Status LoadStateDict(const std::string& bytes);

  // Lifecycle notification; a no-op when the plugin has no hook.
  absl::Status OnEvent(TrainyardEventKind kind, int64_t step,
                       const std::string& detail);

  // Called once when the job ends; later calls of any method fail with
  // FailedPrecondition.
  absl::Status Finalize();

 private:
  Task(std::shared_ptr<const TaskPlugin> plugin, void* handle)
      : plugin_(std::move(plugin)), handle_(handle) {}

  // Fails after Finalize.
  absl::Status CheckUsable(const char* call) const;

  std::shared_ptr<const TaskPlugin> plugin_;
  void* handle_;  // the plugin's, until destroy()
  bool finalized_ = false;
  // The output folder InferOutputs last found to be a folder.
  std::string checked_output_dir_;
  // The outputs of the first successful InferOutputs call with zero rows:
  // their names, dtypes and trailing dims, which every later call repeats.
  NamedTensors infer_layout_;
};

}  // namespace trainyard

#endif  // TRAINYARD_ENGINE_TASK_LOADER_H_
