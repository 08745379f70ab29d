// Task plugin "cross_entropy": torch.nn.CrossEntropyLoss with class-index
// targets, ignore_index and label_smoothing, reduction "mean".
//
// Config: {"ignore_index": -100, "label_smoothing": 0.0} (both optional).
// Targets: int32/int64 [B], passed to compute_loss as "labels" int64 [B].
// Per sample (PyTorch's formula), with log p = log_softmax(logits), C
// classes and eps = label_smoothing:
//   loss_i = (1 - eps) * -log p[y_i] + eps * mean_c(-log p[c])
// loss = mean of loss_i over non-ignored samples; loss_weight = their count,
// so the engine's weighted combination gives the full-batch loss.
// Metrics per step (update_metrics): "loss" and "accuracy" over non-ignored
// samples (argmax, first maximum on ties), when there were any.
// Inference outputs: "probabilities" float32 [b, C], the softmax of the
// logits (in double per row, max-subtracted, rounded to float), and
// "predicted_class" int64 [b], their argmax (the lowest index on ties).
//
// The loss is kernels/losses.h's CrossEntropy on the host (ABI v1) and the
// simulated device, kernels/cuda/loss_kernels.h's on a GPU (ABI v2). On
// device stages the inputs pass through: the state is the batch's
// "targets" (int32/int64 [B]); a label out of range fails the step in
// finish_loss with the message compute_loss gives.
#include <cmath>
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

// softmax(x[0, n)) into p, in double with the maximum subtracted, rounded to
// float; returns the index of the first maximum. x is finite and n >= 1.
int64_t SoftmaxRow(const float* x, int64_t n, float* p) {
  int64_t best = 0;
  for (int64_t c = 1; c < n; ++c) {
    if (x[c] > x[best]) best = c;
  }
  const double max = x[best];
  double sum = 0;
  for (int64_t c = 0; c < n; ++c) sum += std::exp(x[c] - max);
  for (int64_t c = 0; c < n; ++c) {
    p[c] = static_cast<float>(std::exp(x[c] - max) / sum);
  }
  return best;
}

// OK when the logits x[0, n) of data row `data_row` are finite, else
// InvalidArgument naming the data row and the class.
absl::Status CheckFiniteLogits(const float* x, int64_t n, int64_t data_row) {
  for (int64_t c = 0; c < n; ++c) {
    if (!std::isfinite(x[c])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data row ", data_row, ": logit ", c, " is not finite (", x[c], ")"));
    }
  }
  return absl::OkStatus();
}

class CrossEntropyTask : public ClassifierTask {
 public:
  static constexpr uint32_t kNumSlots = losses::kCrossEntropySlots;
  static constexpr uint32_t kV2Flags = TRAINYARD_V2_PASSTHROUGH_INPUTS;
  static std::set<std::string> ConfigKeys() {
    return {"ignore_index", "label_smoothing"};
  }

  // Touches nothing: the same call serves validate_config.
  static absl::StatusOr<std::unique_ptr<PluginTask>> Create(
      const nlohmann::json& config, const CreateContext&) {
    ASSIGN_OR_RETURN(const int64_t ignore,
                     GetInt(config, "ignore_index", -100));
    ASSIGN_OR_RETURN(const double eps,
                     GetNumber(config, "label_smoothing", 0.0));
    if (eps < 0 || eps > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "task.config.label_smoothing: must be in [0, 1], got ", eps));
    }
    return std::unique_ptr<PluginTask>(new CrossEntropyTask(ignore, eps));
  }

  absl::Status BuildForwardInputs(const TrainyardBatch& batch,
                                  TrainyardSink* out) override {
    RETURN_IF_ERROR(CopyFeaturesToInputs(batch, out).status());
    ASSIGN_OR_RETURN(const TrainyardTensor* targets,
                     FindClassTargets(batch, "cross_entropy"));
    return AddLabels(*targets, targets->shape[0], out);
  }

  absl::Status ComputeLoss(const TrainyardLossArgs& args,
                           TrainyardLossResult* result,
                           TrainyardSink* metrics) override {
    const int64_t b = args.output->shape[0];
    const int64_t c = args.output->shape[1];
    ASSIGN_OR_RETURN(const TrainyardTensor* found, FindState(args, "labels"));
    ASSIGN_OR_RETURN(const losses::Labels labels,
                     HostLabels(args, *found, b, ignore_index_));
    double slots[kNumSlots];
    losses::CrossEntropy(HostOutput(args, b, c), labels, eps_, slots);
    RETURN_IF_ERROR(CheckLabelSlots(slots, args.microbatch,
                                    args.num_microbatches, c, ignore_index_));
    result->loss = slots[0] > 0 ? slots[4] / slots[0] : 0.0;
    result->loss_weight = slots[0];
    Accumulate(args.is_eval, slots);
    return absl::OkStatus();
  }

  size_t DeviceWorkspaceBytes(int64_t rows, int64_t cols) override {
    return gpu::ClassifierWorkspaceBytes(rows, cols);
  }

  absl::Status ComputeLossDevice(const TrainyardDeviceLossArgs& a) override {
    ASSIGN_OR_RETURN(const losses::Output out, CheckDeviceOutput(a));
    ASSIGN_OR_RETURN(const TrainyardTensor* targets, FindState(a, "targets"));
    ASSIGN_OR_RETURN(const losses::Labels labels,
                     DeviceLabels(*targets, out.rows, ignore_index_));
    classes_ = out.cols;
    if (a.device_kind == TRAINYARD_DEVICE_SIM) {
      losses::CrossEntropy(out, labels, eps_, a.slots);
      return absl::OkStatus();
    }
    return gpu::CrossEntropyLoss(out, labels, eps_, a.workspace, a.slots,
                                 static_cast<gpu::Stream>(a.stream));
  }

  // Inference: "probabilities" and "predicted_class" per row.
  absl::Status InferOutputs(const TrainyardInferArgs& args,
                            TrainyardSink* out) override {
    const int64_t b = args.output->shape[0];
    const int64_t c = args.output->shape[1];
    if (c < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the model output ", ShapeString(*args.output), " has no classes"));
    }
    ASSIGN_OR_RETURN(void* probabilities, AddTensor(out, "probabilities",
                                                    TRAINYARD_FLOAT32, {b, c}));
    ASSIGN_OR_RETURN(void* predicted,
                     AddTensor(out, "predicted_class", TRAINYARD_INT64, {b}));
    const float* logits = static_cast<const float*>(args.output->data);
    for (int64_t i = 0; i < b; ++i) {
      RETURN_IF_ERROR(
          CheckFiniteLogits(logits + i * c, c, args.row_offset + i));
      static_cast<int64_t*>(predicted)[i] = SoftmaxRow(
          logits + i * c, c, static_cast<float*>(probabilities) + i * c);
    }
    return absl::OkStatus();
  }

 private:
  CrossEntropyTask(int64_t ignore_index, double eps)
      : ClassifierTask(ignore_index, {"loss", "accuracy"}), eps_(eps) {}

  // Slots [0] rows, [4] sum of their losses, [5] rows classified correctly.
  void Accumulate(bool is_eval, const double* slots) override {
    metrics_.Add(is_eval, static_cast<int64_t>(slots[0]), {slots[4], slots[5]});
  }

  const double eps_;
};

}  // namespace
}  // namespace plugin
}  // namespace trainyard

TRAINYARD_EXPORT_DEVICE_TASK_PLUGIN(trainyard::plugin::CrossEntropyTask,
                                    "cross_entropy")
