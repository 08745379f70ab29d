#include "task_plugins/plugin_losses.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "task_plugins/plugin_sdk.h"

namespace trainyard {
namespace plugin {

absl::StatusOr<const TrainyardTensor*> FindState(const TrainyardLossArgs& args,
                                                 const std::string& name) {
  return FindTensor(args.state, args.num_state, name);
}

absl::StatusOr<const TrainyardTensor*> FindState(
    const TrainyardDeviceLossArgs& args, const std::string& name) {
  return FindTensor(args.state, args.num_state, name);
}

losses::Output HostOutput(const TrainyardLossArgs& args, int64_t rows,
                          int64_t cols) {
  return {DType::kFloat32,
          rows,
          cols,
          args.output->data,
          args.is_eval ? nullptr : args.grad_output->data,
          false};
}

namespace {

losses::Labels LabelsOf(const TrainyardTensor& t, int64_t ignore_index) {
  return {t.dtype == TRAINYARD_INT32 ? DType::kInt32 : DType::kInt64, t.data,
          ignore_index};
}

}  // namespace

absl::StatusOr<losses::Labels> HostLabels(const TrainyardLossArgs& args,
                                          const TrainyardTensor& t,
                                          int64_t rows, int64_t ignore_index) {
  if (!IsLabelTensor(t) || t.shape[0] != rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "microbatch ", args.microbatch, ": \"labels\" must be int [", rows,
        "], got ", DTypeString(t.dtype), " ", ShapeString(t)));
  }
  return LabelsOf(t, ignore_index);
}

absl::StatusOr<losses::Output> CheckDeviceOutput(
    const TrainyardDeviceLossArgs& a) {
  if (a.device_kind != TRAINYARD_DEVICE_CUDA &&
      a.device_kind != TRAINYARD_DEVICE_SIM) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown device kind ", a.device_kind));
  }
  if (a.output == nullptr || a.slots == nullptr) {
    return absl::InvalidArgumentError("no output or no slots");
  }
  const TrainyardTensor& o = *a.output;
  if ((o.dtype != TRAINYARD_FLOAT32 && o.dtype != TRAINYARD_BFLOAT16) ||
      o.ndim != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("the model output must be float32 or bfloat16 [b, out], "
                     "got ",
                     DTypeString(o.dtype), " ", ShapeString(o)));
  }
  losses::Output out;
  out.dtype = o.dtype == TRAINYARD_FLOAT32 ? DType::kFloat32 : DType::kBFloat16;
  out.rows = o.shape[0];
  out.cols = o.shape[1];
  out.data = o.data;
  out.weighted = true;
  if (!a.is_eval) {
    const TrainyardTensor* g = a.grad_output;
    if (g == nullptr || g->dtype != o.dtype || g->ndim != 2 ||
        g->shape[0] != out.rows || g->shape[1] != out.cols ||
        (g->data == nullptr && out.rows * out.cols > 0)) {
      return absl::InvalidArgumentError(
          "grad_output must be a tensor like the output");
    }
    out.grad = g->data;
  }
  return out;
}

absl::StatusOr<losses::Labels> DeviceLabels(const TrainyardTensor& t,
                                            int64_t rows,
                                            int64_t ignore_index) {
  if (!IsLabelTensor(t) || t.shape[0] != rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", t.name, "\" must be class indices int32/int64 [", rows, "], got ",
        DTypeString(t.dtype), " ", ShapeString(t)));
  }
  return LabelsOf(t, ignore_index);
}

absl::StatusOr<const TrainyardTensor*> FindClassTargets(
    const TrainyardBatch& batch, const std::string& plugin) {
  absl::StatusOr<const TrainyardTensor*> targets =
      FindTensor(batch.tensors, batch.num_tensors, "targets");
  if (!targets.ok()) return targets.status();
  const TrainyardTensor& t = **targets;
  if (!IsLabelTensor(t)) {
    return absl::InvalidArgumentError(absl::StrCat(
        plugin, " needs class-index \"targets\" int32/int64 [B], got ",
        DTypeString(t.dtype), " ", ShapeString(t)));
  }
  return &t;
}

absl::Status AddLabels(const TrainyardTensor& targets, int64_t rows,
                       TrainyardSink* out) {
  absl::StatusOr<void*> p = AddTensor(out, "labels", TRAINYARD_INT64, {rows});
  if (!p.ok()) return p.status();
  int64_t* labels = static_cast<int64_t*>(*p);
  for (int64_t i = 0; i < rows; ++i) labels[i] = LabelAt(targets, i);
  return absl::OkStatus();
}

absl::Status CheckLabelSlots(const double* slots, int32_t microbatch,
                             int32_t num_microbatches, int64_t classes,
                             int64_t ignore_index) {
  if (slots[2] == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("microbatch ", microbatch, " of ", num_microbatches,
                   ", row ", static_cast<int64_t>(slots[2]) - 1, ": label ",
                   static_cast<int64_t>(slots[3]), " outside [0, ", classes,
                   ") and not ignore_index ", ignore_index));
}

MetricSums::MetricSums(std::vector<std::string> names)
    : names_(std::move(names)) {
  for (Phase& p : phases_) p.sums.assign(names_.size(), 0.0);
}

void MetricSums::Add(bool is_eval, int64_t count,
                     const std::vector<double>& sums) {
  Phase& p = phases_[is_eval ? 1 : 0];
  p.count += count;
  for (size_t i = 0; i < names_.size(); ++i) p.sums[i] += sums[i];
}

void MetricSums::Report(bool is_eval, TrainyardSink* out) {
  Phase& p = phases_[is_eval ? 1 : 0];
  if (p.count > 0) {
    const double n = static_cast<double>(p.count);
    for (size_t i = 0; i < names_.size(); ++i) {
      out->add_metric(out->ctx, names_[i].c_str(), p.sums[i] / n);
    }
  }
  p.count = 0;
  p.sums.assign(names_.size(), 0.0);
}

ClassifierTask::ClassifierTask(int64_t ignore_index,
                               std::vector<std::string> metric_names)
    : ignore_index_(ignore_index), metrics_(std::move(metric_names)) {}

absl::Status ClassifierTask::FinishLoss(const double* slots, int32_t microbatch,
                                        int32_t num_microbatches, bool is_eval,
                                        TrainyardSink*) {
  RETURN_IF_ERROR(CheckLabelSlots(slots, microbatch, num_microbatches, classes_,
                                  ignore_index_));
  Accumulate(is_eval, slots);
  return absl::OkStatus();
}

absl::Status ClassifierTask::UpdateMetrics(bool is_eval, TrainyardSink* out) {
  metrics_.Report(is_eval, out);
  return absl::OkStatus();
}

}  // namespace plugin
}  // namespace trainyard
