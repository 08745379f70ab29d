// What the shipped task plugins (mse, cross_entropy, logit_distillation)
// share around their losses (kernels/losses.h on the host and the simulated
// device, kernels/cuda/loss_kernels.h on a GPU): the checked arguments of
// both halves, class-index labels and their errors, and the metrics that
// update_metrics reports. Plugin-side, like plugin_sdk.h.
#ifndef TRAINYARD_TASK_PLUGINS_PLUGIN_LOSSES_H_
#define TRAINYARD_TASK_PLUGINS_PLUGIN_LOSSES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/loss_args.h"
#include "task_plugins/plugin_sdk.h"
#include "task_plugins/task_abi.h"

namespace trainyard {
namespace plugin {

// The tensor called `name` among the state a loss gets, or NotFound listing
// what there is (FindTensor).
absl::StatusOr<const TrainyardTensor*> FindState(const TrainyardLossArgs& args,
                                                 const std::string& name);
absl::StatusOr<const TrainyardTensor*> FindState(
    const TrainyardDeviceLossArgs& args, const std::string& name);

// compute_loss's output [rows, cols] and its float32 gradient (none for
// eval), for the host loss: unweighted.
losses::Output HostOutput(const TrainyardLossArgs& args, int64_t rows,
                          int64_t cols);

// `t` as class-index labels of the host loss: int32/int64 [rows], or
// InvalidArgument
//   microbatch 1: "labels" must be int [4], got float32 [4]
absl::StatusOr<losses::Labels> HostLabels(const TrainyardLossArgs& args,
                                          const TrainyardTensor& t,
                                          int64_t rows, int64_t ignore_index);

// compute_loss_device's output, checked: float32 or bfloat16 [rows, cols],
// and (unless is_eval) a gradient of the same dtype and shape; the slots
// and the device kind are checked too. InvalidArgument naming what is off.
// The gradient is the weighted one.
absl::StatusOr<losses::Output> CheckDeviceOutput(
    const TrainyardDeviceLossArgs& args);

// `t` as class-index labels of the device loss: int32/int64 [rows], or
// InvalidArgument naming the tensor, what it is and what was expected.
absl::StatusOr<losses::Labels> DeviceLabels(const TrainyardTensor& t,
                                            int64_t rows, int64_t ignore_index);

// The batch's "targets" as class indices (int32/int64 [B]), or
// InvalidArgument "<plugin> needs class-index "targets" int32/int64 [B],
// got ..." (or FindTensor's NotFound).
absl::StatusOr<const TrainyardTensor*> FindClassTargets(
    const TrainyardBatch& batch, const std::string& plugin);

// Adds "labels" int64 [rows] to `out`: targets[0, rows) widened.
absl::Status AddLabels(const TrainyardTensor& targets, int64_t rows,
                       TrainyardSink* out);

// OK when a classifier's slots (kernels/cuda/loss_args.h) record no bad
// label, else InvalidArgument
//   microbatch 1 of 4, row 3: label 12 outside [0, 10) and not
//   ignore_index -100
absl::Status CheckLabelSlots(const double* slots, int32_t microbatch,
                             int32_t num_microbatches, int64_t classes,
                             int64_t ignore_index);

// What update_metrics reports, per phase (train, eval): each metric's sum
// over the step's microbatches divided by their sample count.
class MetricSums {
 public:
  // The metrics, in the order they are reported.
  explicit MetricSums(std::vector<std::string> names);

  // One microbatch: `count` samples and each metric's sum over them.
  void Add(bool is_eval, int64_t count, const std::vector<double>& sums);

  // Each metric's sum / count to `out` when the count is not 0; then the
  // phase starts over.
  void Report(bool is_eval, TrainyardSink* out);

 private:
  struct Phase {
    int64_t count = 0;
    std::vector<double> sums;
  };
  std::vector<std::string> names_;
  Phase phases_[2];  // [train, eval]
};

// What the class-index plugins (cross_entropy, logit_distillation) do alike
// on the host once a device loss has been read: check its slots for a bad
// label, add them to the metric sums, and report those sums.
class ClassifierTask : public DevicePluginTask {
 public:
  absl::Status FinishLoss(const double* slots, int32_t microbatch,
                          int32_t num_microbatches, bool is_eval,
                          TrainyardSink*) override;
  absl::Status UpdateMetrics(bool is_eval, TrainyardSink* out) override;

 protected:
  ClassifierTask(int64_t ignore_index, std::vector<std::string> metric_names);

  // Adds one microbatch's slots to metrics_.
  virtual void Accumulate(bool is_eval, const double* slots) = 0;

  const int64_t ignore_index_;
  int64_t classes_ = 0;  // of the last device microbatch, for its message
  MetricSums metrics_;
};

}  // namespace plugin
}  // namespace trainyard

#endif  // TRAINYARD_TASK_PLUGINS_PLUGIN_LOSSES_H_
