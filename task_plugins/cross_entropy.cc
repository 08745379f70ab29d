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
//
// The loss is kernels/losses.h's CrossEntropy on the host (ABI v1) and the
// simulated device, kernels/cuda/loss_kernels.h's on a GPU (ABI v2). On
// device stages the inputs pass through: the state is the batch's
// "targets" (int32/int64 [B]); a label out of range fails the step in
// finish_loss with the message compute_loss gives.
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/loss_kernels.h"
#include "kernels/losses.h"
#include "task_plugins/plugin_sdk.h"

namespace trainyard {
namespace plugin {
namespace {

class CrossEntropyTask : public DevicePluginTask {
 public:
  static constexpr uint32_t kNumSlots = losses::kCrossEntropySlots;
  static constexpr uint32_t kV2Flags = TRAINYARD_V2_PASSTHROUGH_INPUTS;
  static std::set<std::string> ConfigKeys() {
    return {"ignore_index", "label_smoothing"};
  }

  // Touches nothing: the same call serves validate_config.
  static absl::StatusOr<std::unique_ptr<PluginTask>> Create(
      const nlohmann::json& config, const CreateContext&) {
    absl::StatusOr<int64_t> ignore = GetInt(config, "ignore_index", -100);
    if (!ignore.ok()) return ignore.status();
    absl::StatusOr<double> eps = GetNumber(config, "label_smoothing", 0.0);
    if (!eps.ok()) return eps.status();
    if (*eps < 0 || *eps > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "task.config.label_smoothing: must be in [0, 1], got ", *eps));
    }
    return std::unique_ptr<PluginTask>(new CrossEntropyTask(*ignore, *eps));
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
    if (!IsLabelTensor(t)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cross_entropy needs class-index \"targets\" int32/int64 [B], got ",
          DTypeString(t.dtype), " ", ShapeString(t)));
    }
    absl::StatusOr<void*> p =
        AddTensor(out, "labels", TRAINYARD_INT64, {t.shape[0]});
    if (!p.ok()) return p.status();
    int64_t* labels = static_cast<int64_t*>(*p);
    for (int64_t i = 0; i < t.shape[0]; ++i) labels[i] = LabelAt(t, i);
    return absl::OkStatus();
  }

  absl::Status ComputeLoss(const TrainyardLossArgs& args,
                           TrainyardLossResult* result,
                           TrainyardSink* metrics) override {
    const TrainyardTensor& out = *args.output;
    absl::StatusOr<const TrainyardTensor*> found =
        FindTensor(args.state, args.num_state, "labels");
    if (!found.ok()) return found.status();
    const TrainyardTensor& labels = **found;
    if (!IsLabelTensor(labels) || labels.shape[0] != out.shape[0]) {
      return absl::InvalidArgumentError(
          absl::StrCat("microbatch ", args.microbatch,
                       ": \"labels\" must be int [", out.shape[0], "], got ",
                       DTypeString(labels.dtype), " ", ShapeString(labels)));
    }
    const int64_t b = out.shape[0];
    const int64_t c = out.shape[1];
    double slots[kNumSlots];
    losses::CrossEntropy(
        {DType::kFloat32, b, c, out.data,
         args.is_eval ? nullptr : args.grad_output->data, false},
        {labels.dtype == TRAINYARD_INT32 ? DType::kInt32 : DType::kInt64,
         labels.data, ignore_index_},
        eps_, slots);
    if (slots[2] != 0) {
      return BadLabel(slots, args.microbatch, args.num_microbatches, c);
    }
    result->loss = slots[0] > 0 ? slots[4] / slots[0] : 0.0;
    result->loss_weight = slots[0];
    Accumulate(args.is_eval, slots);
    return absl::OkStatus();
  }

  size_t DeviceWorkspaceBytes(int64_t rows, int64_t cols) override {
    return gpu::ClassifierWorkspaceBytes(rows, cols);
  }

  absl::Status ComputeLossDevice(const TrainyardDeviceLossArgs& a) override {
    absl::StatusOr<DeviceOutput> out = CheckDeviceOutput(a);
    if (!out.ok()) return out.status();
    absl::StatusOr<const TrainyardTensor*> targets =
        FindTensor(a.state, a.num_state, "targets");
    if (!targets.ok()) return targets.status();
    absl::StatusOr<DType> label_dtype = LabelDType(**targets, out->rows);
    if (!label_dtype.ok()) return label_dtype.status();
    classes_ = out->cols;
    const void* labels = (*targets)->data;
    if (a.device_kind == TRAINYARD_DEVICE_SIM) {
      losses::CrossEntropy(
          {out->dtype, out->rows, out->cols, out->data, out->grad, true},
          {*label_dtype, labels, ignore_index_}, eps_, a.slots);
      return absl::OkStatus();
    }
    return gpu::CrossEntropyLoss(
        {out->dtype, out->rows, out->cols, out->data, out->grad}, *label_dtype,
        labels, ignore_index_, eps_, a.workspace, a.slots,
        static_cast<gpu::Stream>(a.stream));
  }

  absl::Status FinishLoss(const double* slots, int32_t microbatch,
                          int32_t num_microbatches, bool is_eval,
                          TrainyardSink*) override {
    if (slots[2] != 0) {
      return BadLabel(slots, microbatch, num_microbatches, classes_);
    }
    Accumulate(is_eval, slots);
    return absl::OkStatus();
  }

  absl::Status UpdateMetrics(bool is_eval, TrainyardSink* out) override {
    Accum& a = accum_[is_eval ? 1 : 0];
    if (a.count > 0) {
      out->add_metric(out->ctx, "loss", a.loss_sum / a.count);
      out->add_metric(out->ctx, "accuracy",
                      static_cast<double>(a.correct) / a.count);
    }
    a = Accum();
    return absl::OkStatus();
  }

 private:
  CrossEntropyTask(int64_t ignore_index, double eps)
      : ignore_index_(ignore_index), eps_(eps) {}

  struct Accum {
    double loss_sum = 0;
    int64_t correct = 0;
    int64_t count = 0;
  };
  void Accumulate(bool is_eval, const double* slots) {
    Accum& a = accum_[is_eval ? 1 : 0];
    a.loss_sum += slots[4];
    a.correct += static_cast<int64_t>(slots[5]);
    a.count += static_cast<int64_t>(slots[0]);
  }
  absl::Status BadLabel(const double* slots, int32_t microbatch,
                        int32_t num_microbatches, int64_t classes) const {
    return absl::InvalidArgumentError(BadLabelMessage(
        microbatch, num_microbatches, static_cast<int64_t>(slots[2]) - 1,
        static_cast<int64_t>(slots[3]), classes, ignore_index_));
  }
  const int64_t ignore_index_;
  const double eps_;
  int64_t classes_ = 0;  // of the last device microbatch, for its message
  Accum accum_[2];       // [train, eval]
};

}  // namespace
}  // namespace plugin
}  // namespace trainyard

TRAINYARD_EXPORT_DEVICE_TASK_PLUGIN(trainyard::plugin::CrossEntropyTask,
                                    "cross_entropy")
