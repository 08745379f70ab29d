// Task: one task handle of a loaded plugin (engine/task_loader.h). Each
// method marshals its arguments (engine/plugin_tensors.h), makes one plugin
// call (engine/plugin_call.h) and checks what came back
// (engine/plugin_checks.h).
#include <sys/stat.h>

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "engine/plugin_call.h"
#include "engine/plugin_checks.h"
#include "engine/plugin_tensors.h"
#include "engine/task_loader.h"

namespace trainyard {
namespace {

// Whether `json` is "{}" give or take whitespace: a config that cannot hold
// a file path.
bool IsEmptyJsonObject(const std::string& json) {
  std::string compact;
  for (char c : json) {
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') compact += c;
  }
  return compact == "{}";
}

// The real path (absolute, symlinks resolved) of the existing folder `dir`.
absl::StatusOr<std::string> RealFolder(const std::string& dir) {
  char buf[PATH_MAX];
  if (realpath(dir.c_str(), buf) == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("data folder ", dir, ": ", std::strerror(errno)));
  }
  struct stat st;
  if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("data folder ", dir, ": not a directory"));
  }
  return std::string(buf);
}

// The real path of `data_dir` for create_confined ("" when `data_dir` is
// empty). A plugin that cannot confine paths to it gets only an empty
// config. Errors start with `prefix`.
absl::StatusOr<std::string> ConfinedDataDir(const std::string& prefix,
                                            const TrainyardTaskV1& table,
                                            const std::string& config,
                                            const std::string& data_dir) {
  if (data_dir.empty()) return std::string();
  absl::StatusOr<std::string> real = RealFolder(data_dir);
  if (!real.ok()) return Prefixed(real.status(), prefix);
  if (table.create_confined == nullptr && !IsEmptyJsonObject(config)) {
    return absl::FailedPreconditionError(absl::StrCat(
        prefix, "the plugin cannot confine file ",
        "paths in task.config to the data folder ", *real,
        " (its table has no create_confined: built before it, or from an ",
        "SDK plugin whose Create takes no CreateContext), so it accepts ",
        "only an empty task.config here"));
  }
  return *std::move(real);
}

// The microbatch's loss and weight as the engine sums them, with the
// metrics the plugin added to `sink` during the call.
LossResult PluginLoss(double loss, double weight, double weighted_loss,
                      HostSink* sink) {
  LossResult result;
  result.loss = loss;
  result.weight = weight;
  result.weighted_loss = weighted_loss;
  result.metrics = std::move(sink->metrics());
  return result;
}

// What starts the messages about the loss call `call` returned for
// one microbatch.
std::string LossWhere(const std::string& plugin, const char* call, int64_t step,
                      int32_t microbatch) {
  return absl::StrCat(PluginCallPrefix(plugin, call), "step ", step,
                      " microbatch ", microbatch, ": ");
}

// FailedPrecondition for `call` when `plugin` has no device loss.
absl::Status CheckHasDeviceLoss(const TaskPlugin& plugin, const char* call) {
  if (plugin.has_device_loss()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      PluginCallPrefix(plugin.name(), call),
      "the plugin has no device loss (no ", TRAINYARD_TASK_SYMBOL_V2, ")"));
}

// compute_loss_device's arguments but its tensors: where the loss runs,
// its slots and its `need` bytes of `workspace`.
TrainyardDeviceLossArgs DeviceLossArgs(Device device, void* stream,
                                       double* slots, const Tensor& workspace,
                                       size_t need) {
  TrainyardDeviceLossArgs args;
  std::memset(&args, 0, sizeof(args));
  args.device_kind =
      device.is_cuda() ? TRAINYARD_DEVICE_CUDA : TRAINYARD_DEVICE_SIM;
  args.device_index = device.index;
  args.stream = stream;
  args.slots = slots;
  args.workspace = need > 0 ? const_cast<void*>(workspace.ptr()) : nullptr;
  args.workspace_bytes = need;
  return args;
}

// The model output a host call gets, float32 [b, out], and its microbatch
// index. Errors: InvalidArgument starting with `prefix`.
absl::Status CheckHostOutput(const std::string& prefix, const Tensor& output,
                             int32_t microbatch, int32_t num_microbatches) {
  if (output.dtype() != DType::kFloat32 || output.ndim() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "output must be float32 [b, out], got ",
        DTypeName(output.dtype()), " ", ShapeToString(output.shape())));
  }
  return CheckMicrobatch(prefix, microbatch, num_microbatches);
}

// FailedPrecondition when `plugin` has no infer_outputs, saying why.
absl::Status CheckHasInferOutputs(const TaskPlugin& plugin) {
  if (plugin.has_infer_outputs()) return absl::OkStatus();
  const std::string why =
      plugin.struct_size() < TRAINYARD_TASK_V1_SIZE_CURRENT
          ? absl::StrCat("its TrainyardTaskV1 has struct_size ",
                         plugin.struct_size(),
                         ", a layout from before infer_outputs")
          : std::string("TrainyardTaskV1.infer_outputs is NULL");
  return absl::FailedPreconditionError(
      absl::StrCat("plugin \"", plugin.name(),
                   "\" cannot run inference jobs: it has no infer_outputs "
                   "(task ABI v1: ",
                   why, ")"));
}

// infer_outputs' arguments but the tensors: the data row of the first row
// (>= 0) and the output folder (absolute; with `check_folder`, an existing
// folder).
absl::Status CheckInferArgs(const std::string& prefix, int64_t row_offset,
                            const std::string& output_dir, bool check_folder) {
  if (row_offset < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "row_offset must be >= 0, got ", row_offset));
  }
  if (output_dir.empty() || output_dir[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "output folder \"", output_dir, "\" is not an absolute path"));
  }
  if (!check_folder) return absl::OkStatus();
  struct stat st;
  if (stat(output_dir.c_str(), &st) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        prefix, "output folder ", output_dir, ": ", std::strerror(errno)));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        prefix, "output folder ", output_dir, ": not a directory"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Task>> Task::Create(
    std::shared_ptr<const TaskPlugin> plugin, const std::string& config_json,
    const std::string& data_dir) {
  if (plugin == nullptr) {
    return absl::InvalidArgumentError("Task::Create: null plugin");
  }
  const std::string config = config_json.empty() ? "{}" : config_json;
  const TrainyardTaskV1& t = plugin->table();
  ASSIGN_OR_RETURN(const std::string real_data_dir,
                   ConfinedDataDir(PluginCallPrefix(plugin->name(), "create"),
                                   t, config, data_dir));
  void* handle = nullptr;
  RETURN_IF_ERROR(
      CallPlugin(plugin->name(), "create", nullptr, [&](TrainyardError* err) {
        handle =
            real_data_dir.empty() || t.create_confined == nullptr
                ? t.create(config.c_str(), err)
                : t.create_confined(config.c_str(), real_data_dir.c_str(), err);
        if (handle == nullptr) {
          if (err->message[0] == '\0') {
            std::snprintf(err->message, sizeof(err->message),
                          "returned NULL without a message");
          }
          return 1;
        }
        return 0;
      }));
  return std::unique_ptr<Task>(new Task(std::move(plugin), handle));
}

Task::~Task() {
  if (handle_ == nullptr) return;
  try {
    plugin_->table().destroy(handle_);
  } catch (...) {
    // destroy must not throw; nothing sensible to do in a destructor.
  }
}

absl::Status Task::CheckUsable(const char* call) const {
  if (finalized_) {
    return absl::FailedPreconditionError(absl::StrCat(
        PluginCallPrefix(plugin_->name(), call), "called after finalize"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ForwardInputs> Task::BuildForwardInputs(
    const NamedTensors& batch, int64_t step, bool is_eval) {
  constexpr const char* kCall = "build_forward_inputs";
  RETURN_IF_ERROR(CheckUsable(kCall));
  const std::string prefix = PluginCallPrefix(plugin_->name(), kCall);
  AbiTensors in;
  ASSIGN_OR_RETURN(const int64_t rows, AddBatchTensors(prefix, batch, &in));
  TrainyardBatch abi_batch;
  abi_batch.tensors = in.data();
  abi_batch.num_tensors = in.size();
  abi_batch.step = step;
  abi_batch.is_eval = is_eval ? 1 : 0;
  HostSink sink(/*tensors=*/true, /*metrics=*/false, /*bytes=*/false);
  RETURN_IF_ERROR(
      CallPlugin(plugin_->name(), kCall, &sink, [&](TrainyardError* err) {
        return plugin_->table().build_forward_inputs(handle_, &abi_batch,
                                                     sink.abi(), err);
      }));
  ForwardInputs result;
  RETURN_IF_ERROR(TakeForwardOutputs(prefix, rows, sink.tensors(),
                                     &result.inputs, &result.state));
  return result;
}

absl::StatusOr<LossResult> Task::ComputeLoss(
    const Tensor& output, const NamedTensors& state, Tensor* grad_output,
    int64_t step, int32_t microbatch, int32_t num_microbatches, bool is_eval) {
  constexpr const char* kCall = "compute_loss";
  RETURN_IF_ERROR(CheckUsable(kCall));
  const std::string prefix = PluginCallPrefix(plugin_->name(), kCall);
  RETURN_IF_ERROR(
      CheckHostOutput(prefix, output, microbatch, num_microbatches));
  LossTensors tensors;
  RETURN_IF_ERROR(tensors.AddOutputAndState(prefix, output, state, nullptr));
  const bool want_grad = !is_eval;
  const bool have_grad = grad_output != nullptr && grad_output->defined();
  if (want_grad || have_grad) {
    if (!have_grad || grad_output->dtype() != DType::kFloat32 ||
        grad_output->shape() != output.shape() ||
        !grad_output->device().is_cpu()) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "grad_output must be a host float32 tensor shaped ",
          ShapeToString(output.shape())));
    }
    grad_output->Fill(0.0f);
  }
  RETURN_IF_ERROR(
      tensors.AddGradOutput(prefix, have_grad ? grad_output : nullptr, output));
  TrainyardLossArgs args;
  tensors.Fill(step, microbatch, num_microbatches, is_eval, &args);
  TrainyardLossResult res;
  res.loss = std::nan("");
  res.loss_weight = std::nan("");
  HostSink sink(/*tensors=*/false, /*metrics=*/true, /*bytes=*/false);
  RETURN_IF_ERROR(
      CallPlugin(plugin_->name(), kCall, &sink, [&](TrainyardError* err) {
        return plugin_->table().compute_loss(handle_, &args, &res, sink.abi(),
                                             err);
      }));
  const std::string where = LossWhere(plugin_->name(), kCall, step, microbatch);
  RETURN_IF_ERROR(CheckLoss(where, res.loss, res.loss_weight));
  if (want_grad) {
    RETURN_IF_ERROR(CheckGradOutput(where, *grad_output, res.loss_weight));
  }
  return PluginLoss(res.loss, res.loss_weight, res.loss_weight * res.loss,
                    &sink);
}

size_t Task::DeviceLossWorkspaceBytes(int64_t rows, int64_t cols) {
  if (!plugin_->has_device_loss()) return 0;
  try {
    return plugin_->device_table().workspace_bytes(handle_, rows, cols);
  } catch (...) {
    return 0;  // compute_loss_device will then refuse the missing workspace
  }
}

absl::Status Task::ComputeLossDevice(Device device, void* stream,
                                     const Tensor& output,
                                     const NamedTensors& state,
                                     Tensor* grad_output, double* slots,
                                     const Tensor& workspace, int64_t step,
                                     int32_t microbatch,
                                     int32_t num_microbatches, bool is_eval) {
  constexpr const char* kCall = "compute_loss_device";
  RETURN_IF_ERROR(CheckUsable(kCall));
  const std::string prefix = PluginCallPrefix(plugin_->name(), kCall);
  RETURN_IF_ERROR(CheckHasDeviceLoss(*plugin_, kCall));
  if (device.is_cpu()) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "needs a device (CUDA or simulated), got cpu"));
  }
  if ((output.dtype() != DType::kFloat32 &&
       output.dtype() != DType::kBFloat16) ||
      output.ndim() != 2 || output.device() != device) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "output must be float32 or bfloat16 [b, out] on ",
        device.ToString(), ", got ", DTypeName(output.dtype()), " ",
        ShapeToString(output.shape()), " on ", output.device().ToString()));
  }
  RETURN_IF_ERROR(CheckMicrobatch(prefix, microbatch, num_microbatches));
  if (slots == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "no slots"));
  }
  const size_t need = DeviceLossWorkspaceBytes(output.dim(0), output.dim(1));
  if (need > 0 && (!workspace.defined() || workspace.nbytes() < need ||
                   workspace.device() != device)) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "needs ", need, " bytes of workspace on ",
                     device.ToString(), ", got ", workspace.nbytes()));
  }
  LossTensors tensors;
  RETURN_IF_ERROR(tensors.AddOutputAndState(prefix, output, state, &device));
  if (!is_eval &&
      (grad_output == nullptr || grad_output->dtype() != output.dtype() ||
       grad_output->shape() != output.shape() ||
       grad_output->device() != device)) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "grad_output must be ", DTypeName(output.dtype()),
                     ShapeToString(output.shape()), " on ", device.ToString()));
  }
  RETURN_IF_ERROR(
      tensors.AddGradOutput(prefix, is_eval ? nullptr : grad_output, output));
  TrainyardDeviceLossArgs args =
      DeviceLossArgs(device, stream, slots, workspace, need);
  tensors.Fill(step, microbatch, num_microbatches, is_eval, &args);
  return CallPlugin(plugin_->name(), kCall, nullptr, [&](TrainyardError* err) {
    return plugin_->device_table().compute_loss_device(handle_, &args, err);
  });
}

absl::StatusOr<LossResult> Task::FinishLoss(const double* slots, int64_t step,
                                            int32_t microbatch,
                                            int32_t num_microbatches,
                                            bool is_eval) {
  constexpr const char* kCall = "finish_loss";
  RETURN_IF_ERROR(CheckUsable(kCall));
  RETURN_IF_ERROR(CheckHasDeviceLoss(*plugin_, kCall));
  HostSink sink(/*tensors=*/false, /*metrics=*/true, /*bytes=*/false);
  RETURN_IF_ERROR(
      CallPlugin(plugin_->name(), kCall, &sink, [&](TrainyardError* err) {
        return plugin_->device_table().finish_loss(
            handle_, slots, step, microbatch, num_microbatches, is_eval ? 1 : 0,
            sink.abi(), err);
      }));
  // The checks ComputeLoss makes of a host result, on the slots, in the
  // messages of the loss call.
  const std::string where =
      LossWhere(plugin_->name(), "compute_loss_device", step, microbatch);
  const double w = slots[TRAINYARD_SLOT_WEIGHT];
  const double wl = slots[TRAINYARD_SLOT_WEIGHTED_LOSS];
  RETURN_IF_ERROR(CheckLossWeight(where, w));
  const double loss = w > 0 ? wl / w : wl;
  RETURN_IF_ERROR(CheckLoss(where, loss, w));
  return PluginLoss(loss, w, wl, &sink);
}

absl::StatusOr<NamedTensors> Task::InferOutputs(const Tensor& output,
                                                const NamedTensors& state,
                                                int64_t row_offset,
                                                const std::string& output_dir,
                                                int32_t microbatch,
                                                int32_t num_microbatches) {
  constexpr const char* kCall = "infer_outputs";
  RETURN_IF_ERROR(CheckUsable(kCall));
  RETURN_IF_ERROR(CheckHasInferOutputs(*plugin_));
  const std::string prefix = PluginCallPrefix(plugin_->name(), kCall);
  RETURN_IF_ERROR(
      CheckHostOutput(prefix, output, microbatch, num_microbatches));
  // The folder is looked at once per task, not once per microbatch.
  const bool new_folder = output_dir != checked_output_dir_;
  RETURN_IF_ERROR(CheckInferArgs(prefix, row_offset, output_dir, new_folder));
  if (new_folder) checked_output_dir_ = output_dir;
  LossTensors tensors;
  RETURN_IF_ERROR(tensors.AddOutputAndState(prefix, output, state, nullptr));
  TrainyardInferArgs args;
  std::memset(&args, 0, sizeof(args));
  tensors.FillOutputAndState(&args);
  args.row_offset = row_offset;
  args.output_dir = output_dir.c_str();
  args.microbatch = microbatch;
  args.num_microbatches = num_microbatches;
  HostSink sink(/*tensors=*/true, /*metrics=*/false, /*bytes=*/false);
  RETURN_IF_ERROR(
      CallPlugin(plugin_->name(), kCall, &sink, [&](TrainyardError* err) {
        return plugin_->table().infer_outputs(handle_, &args, sink.abi(), err);
      }));
  const int64_t rows = output.dim(0);
  RETURN_IF_ERROR(CheckInferOutputs(
      absl::StrCat(prefix, "microbatch ", microbatch, " (data rows ",
                   row_offset, " to ", row_offset + rows - 1, "): "),
      rows, sink.tensors(), &infer_layout_));
  return std::move(sink.tensors());
}

absl::StatusOr<Metrics> Task::UpdateMetrics(bool is_eval) {
  constexpr const char* kCall = "update_metrics";
  RETURN_IF_ERROR(CheckUsable(kCall));
  HostSink sink(/*tensors=*/false, /*metrics=*/true, /*bytes=*/false);
  RETURN_IF_ERROR(
      CallPlugin(plugin_->name(), kCall, &sink, [&](TrainyardError* err) {
        return plugin_->table().update_metrics(handle_, is_eval ? 1 : 0,
                                               sink.abi(), err);
      }));
  return std::move(sink.metrics());
}

absl::StatusOr<std::string> Task::StateDict() {
  constexpr const char* kCall = "state_dict";
  RETURN_IF_ERROR(CheckUsable(kCall));
  if (plugin_->table().state_dict == nullptr) return std::string();
  HostSink sink(/*tensors=*/false, /*metrics=*/false, /*bytes=*/true);
  RETURN_IF_ERROR(
      CallPlugin(plugin_->name(), kCall, &sink, [&](TrainyardError* err) {
        return plugin_->table().state_dict(handle_, sink.abi(), err);
      }));
  return std::move(sink.bytes());
}

absl::Status Task::LoadStateDict(const std::string& bytes) {
  constexpr const char* kCall = "load_state_dict";
  RETURN_IF_ERROR(CheckUsable(kCall));
  if (plugin_->table().load_state_dict == nullptr) {
    if (bytes.empty()) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        PluginCallPrefix(plugin_->name(), kCall),
        "the plugin is stateless but got ", bytes.size(), " bytes of state"));
  }
  return CallPlugin(plugin_->name(), kCall, nullptr, [&](TrainyardError* err) {
    return plugin_->table().load_state_dict(handle_, bytes.data(), bytes.size(),
                                            err);
  });
}

absl::Status Task::OnEvent(TrainyardEventKind kind, int64_t step,
                           const std::string& detail) {
  constexpr const char* kCall = "on_event";
  RETURN_IF_ERROR(CheckUsable(kCall));
  if (kind < TRAINYARD_EVENT_STEP_BEGIN || kind > TRAINYARD_EVENT_JOB_END) {
    return absl::InvalidArgumentError(absl::StrCat(
        PluginCallPrefix(plugin_->name(), kCall), "unknown event kind ", kind));
  }
  if (plugin_->table().on_event == nullptr) return absl::OkStatus();
  TrainyardEvent event;
  event.kind = kind;
  event.step = step;
  event.detail = detail.c_str();
  return CallPlugin(plugin_->name(), kCall, nullptr, [&](TrainyardError* err) {
    return plugin_->table().on_event(handle_, &event, err);
  });
}

absl::Status Task::Finalize() {
  constexpr const char* kCall = "finalize";
  RETURN_IF_ERROR(CheckUsable(kCall));
  finalized_ = true;
  if (plugin_->table().finalize == nullptr) return absl::OkStatus();
  return CallPlugin(plugin_->name(), kCall, nullptr, [&](TrainyardError* err) {
    return plugin_->table().finalize(handle_, err);
  });
}

}  // namespace trainyard
