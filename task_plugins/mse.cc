// Task plugin "mse": torch.nn.MSELoss() (reduction "mean" over every
// element) against float32 [B, K] targets.
//
// Config: {} or {"reduction": "mean"}.
// State passed to compute_loss: "targets" float32 [B, K].
// loss_weight = rows in the microbatch, so the engine's weighted combination
// of microbatch means is the full-batch mean. Metrics per step: "loss".
// Inference outputs: "outputs" float32 [b, K], the model's output as it is.
//
// The loss is kernels/losses.h's Mse on the host (ABI v1) and the simulated
// device, kernels/cuda/loss_kernels.h's on a GPU (ABI v2). On device stages
// the inputs pass through: the state is the batch's "targets".
#include <cstring>
#include <memory>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/cuda/loss_kernels.h"
#include "kernels/losses.h"
#include "task_plugins/plugin_losses.h"
#include "task_plugins/plugin_sdk.h"

namespace trainyard {
namespace plugin {
namespace {

class MseTask : public DevicePluginTask {
 public:
  static constexpr uint32_t kNumSlots = losses::kMseSlots;
  static constexpr uint32_t kV2Flags = TRAINYARD_V2_PASSTHROUGH_INPUTS;
  static std::set<std::string> ConfigKeys() { return {"reduction"}; }

  // Touches nothing: the same call serves validate_config.
  static absl::StatusOr<std::unique_ptr<PluginTask>> Create(
      const nlohmann::json& config, const CreateContext&) {
    ASSIGN_OR_RETURN(const std::string reduction,
                     GetString(config, "reduction", "mean"));
    if (reduction != "mean") {
      return absl::InvalidArgumentError(absl::StrCat(
          "task.config.reduction: only \"mean\" is supported, got \"",
          reduction, "\""));
    }
    return std::unique_ptr<PluginTask>(new MseTask());
  }

  absl::Status BuildForwardInputs(const TrainyardBatch& batch,
                                  TrainyardSink* out) override {
    RETURN_IF_ERROR(CopyFeaturesToInputs(batch, out).status());
    ASSIGN_OR_RETURN(const TrainyardTensor* targets,
                     FindTensor(batch.tensors, batch.num_tensors, "targets"));
    const TrainyardTensor& t = *targets;
    if (t.dtype != TRAINYARD_FLOAT32 || t.ndim != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("mse needs float32 [B, K] \"targets\", got ",
                       DTypeString(t.dtype), " ", ShapeString(t)));
    }
    return AddFloat32Copy(out, "targets", t);
  }

  absl::Status ComputeLoss(const TrainyardLossArgs& args,
                           TrainyardLossResult* result,
                           TrainyardSink* metrics) override {
    const TrainyardTensor& out = *args.output;
    ASSIGN_OR_RETURN(const TrainyardTensor* targets,
                     FindState(args, "targets"));
    const TrainyardTensor& t = *targets;
    if (t.dtype != TRAINYARD_FLOAT32 || t.ndim != out.ndim ||
        std::memcmp(t.shape, out.shape, sizeof(int64_t) * out.ndim) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "microbatch ", args.microbatch, ": targets ", DTypeString(t.dtype),
          " ", ShapeString(t), " do not match the model output float32 ",
          ShapeString(out)));
    }
    const int64_t rows = out.ndim > 0 ? out.shape[0] : 1;
    const int64_t n = NumElements(out);
    if (n == 0) {
      result->loss = 0;
      result->loss_weight = 0;
      return absl::OkStatus();
    }
    double slots[kNumSlots];
    losses::Mse(HostOutput(args, rows, n / rows),
                static_cast<const float*>(t.data), slots);
    result->loss = slots[4] / slots[5];
    result->loss_weight = slots[0];
    Accumulate(args.is_eval, slots);
    return absl::OkStatus();
  }

  size_t DeviceWorkspaceBytes(int64_t rows, int64_t cols) override {
    return gpu::MseWorkspaceBytes(rows, cols);
  }

  absl::Status ComputeLossDevice(const TrainyardDeviceLossArgs& a) override {
    ASSIGN_OR_RETURN(const losses::Output out, CheckDeviceOutput(a));
    ASSIGN_OR_RETURN(const TrainyardTensor* targets, FindState(a, "targets"));
    const TrainyardTensor& t = *targets;
    if (t.dtype != TRAINYARD_FLOAT32 || t.ndim != 2 || t.shape[0] != out.rows ||
        t.shape[1] != out.cols) {
      return absl::InvalidArgumentError(absl::StrCat(
          "microbatch ", a.microbatch, ": targets ", DTypeString(t.dtype), " ",
          ShapeString(t), " do not match the model output ",
          ShapeString(*a.output)));
    }
    const float* target = static_cast<const float*>(t.data);
    if (a.device_kind == TRAINYARD_DEVICE_SIM) {
      losses::Mse(out, target, a.slots);
      return absl::OkStatus();
    }
    return gpu::MseLoss(out, target, a.workspace, a.slots,
                        static_cast<gpu::Stream>(a.stream));
  }

  absl::Status FinishLoss(const double* slots, int32_t, int32_t, bool is_eval,
                          TrainyardSink*) override {
    Accumulate(is_eval, slots);
    return absl::OkStatus();
  }

  absl::Status UpdateMetrics(bool is_eval, TrainyardSink* out) override {
    metrics_.Report(is_eval, out);
    return absl::OkStatus();
  }

  // Inference: the model's output as it is.
  absl::Status InferOutputs(const TrainyardInferArgs& args,
                            TrainyardSink* out) override {
    return AddFloat32Copy(out, "outputs", *args.output);
  }

 private:
  // Slots [4] the sum of squared differences, [5] the elements.
  void Accumulate(bool is_eval, const double* slots) {
    metrics_.Add(is_eval, static_cast<int64_t>(slots[5]), {slots[4]});
  }

  MetricSums metrics_{{"loss"}};
};

}  // namespace
}  // namespace plugin
}  // namespace trainyard

TRAINYARD_EXPORT_DEVICE_TASK_PLUGIN(trainyard::plugin::MseTask, "mse")
