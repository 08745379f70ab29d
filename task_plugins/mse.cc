// Task plugin "mse": torch.nn.MSELoss() (reduction "mean" over every
// element) against float32 [B, K] targets.
//
// Config: {} or {"reduction": "mean"}.
// State passed to compute_loss: "targets" float32 [B, K].
// loss_weight = rows in the microbatch, so the engine's weighted combination
// of microbatch means is the full-batch mean. Metrics per step: "loss".
//
// The loss is kernels/losses.h's Mse on the host (ABI v1) and the simulated
// device, kernels/cuda/loss_kernels.h's on a GPU (ABI v2). On device stages
// the inputs pass through: the state is the batch's "targets".
#include <cmath>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/loss_kernels.h"
#include "kernels/losses.h"
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
    absl::StatusOr<std::string> reduction =
        GetString(config, "reduction", "mean");
    if (!reduction.ok()) return reduction.status();
    if (*reduction != "mean") {
      return absl::InvalidArgumentError(absl::StrCat(
          "task.config.reduction: only \"mean\" is supported, got \"",
          *reduction, "\""));
    }
    return std::unique_ptr<PluginTask>(new MseTask());
  }

  absl::Status BuildForwardInputs(const TrainyardBatch& batch,
                                  TrainyardSink* out) override {
    absl::StatusOr<const TrainyardTensor*> features =
        CopyFeaturesToInputs(batch, out);
    if (!features.ok()) return features.status();
    absl::StatusOr<const TrainyardTensor*> targets =
        FindTensor(batch.tensors, batch.num_tensors, "targets");
    if (!targets.ok()) return targets.status();
    const TrainyardTensor& t = **targets;
    if (t.dtype != TRAINYARD_FLOAT32 || t.ndim != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("mse needs float32 [B, K] \"targets\", got ",
                       DTypeString(t.dtype), " ", ShapeString(t)));
    }
    absl::StatusOr<void*> p =
        AddTensor(out, "targets", TRAINYARD_FLOAT32, {t.shape[0], t.shape[1]});
    if (!p.ok()) return p.status();
    const int64_t n = NumElements(t);
    if (n > 0) std::memcpy(*p, t.data, n * sizeof(float));
    return absl::OkStatus();
  }

  absl::Status ComputeLoss(const TrainyardLossArgs& args,
                           TrainyardLossResult* result,
                           TrainyardSink* metrics) override {
    const TrainyardTensor& out = *args.output;
    absl::StatusOr<const TrainyardTensor*> targets =
        FindTensor(args.state, args.num_state, "targets");
    if (!targets.ok()) return targets.status();
    const TrainyardTensor& t = **targets;
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
    losses::Mse({DType::kFloat32, rows, n / rows, out.data,
                 args.is_eval ? nullptr : args.grad_output->data, false},
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
    absl::StatusOr<DeviceOutput> out = CheckDeviceOutput(a);
    if (!out.ok()) return out.status();
    absl::StatusOr<const TrainyardTensor*> targets =
        FindTensor(a.state, a.num_state, "targets");
    if (!targets.ok()) return targets.status();
    const TrainyardTensor& t = **targets;
    if (t.dtype != TRAINYARD_FLOAT32 || t.ndim != 2 ||
        t.shape[0] != out->rows || t.shape[1] != out->cols) {
      return absl::InvalidArgumentError(absl::StrCat(
          "microbatch ", a.microbatch, ": targets ", DTypeString(t.dtype), " ",
          ShapeString(t), " do not match the model output ",
          ShapeString(*a.output)));
    }
    const float* target = static_cast<const float*>(t.data);
    if (a.device_kind == TRAINYARD_DEVICE_SIM) {
      losses::Mse(
          {out->dtype, out->rows, out->cols, out->data, out->grad, true},
          target, a.slots);
      return absl::OkStatus();
    }
    return gpu::MseLoss(
        {out->dtype, out->rows, out->cols, out->data, out->grad}, target,
        a.workspace, a.slots, static_cast<gpu::Stream>(a.stream));
  }

  absl::Status FinishLoss(const double* slots, int32_t, int32_t, bool is_eval,
                          TrainyardSink*) override {
    Accumulate(is_eval, slots);
    return absl::OkStatus();
  }

  absl::Status UpdateMetrics(bool is_eval, TrainyardSink* out) override {
    Accum& a = accum_[is_eval ? 1 : 0];
    if (a.count > 0) out->add_metric(out->ctx, "loss", a.sum_sq / a.count);
    a = Accum();
    return absl::OkStatus();
  }

 private:
  struct Accum {
    double sum_sq = 0;
    int64_t count = 0;
  };
  void Accumulate(bool is_eval, const double* slots) {
    Accum& a = accum_[is_eval ? 1 : 0];
    a.sum_sq += slots[4];
    a.count += static_cast<int64_t>(slots[5]);
  }
  Accum accum_[2];  // [train, eval]
};

}  // namespace
}  // namespace plugin
}  // namespace trainyard

TRAINYARD_EXPORT_DEVICE_TASK_PLUGIN(trainyard::plugin::MseTask, "mse")
