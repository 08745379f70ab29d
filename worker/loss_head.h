// LossHead: the last stage's loss. For each microbatch it takes the model's
// output (on the stage's device, in the activation dtype), checks that it is
// finite (a non-finite output is named as divergence, not as a plugin
// fault), hands a float32 host copy and the microbatch's task state to the
// task plugin (plugin ABI v1 is host-only: docs/PLUGIN_ABI.md), scales the
// returned dLoss/dOutput by the loss weight and returns it on the device in
// the activation dtype. It accumulates sum(w) and sum(w L) over a step or
// an eval pass (see worker/stage.h for how they combine).
//
// On a GPU this costs one device-to-host copy of the output and one
// host-to-device copy of its gradient per microbatch: [rows, classes]
// floats, small next to the blocks' work.
//
// Thread safety: used by its stage's thread only.
#ifndef TRAINYARD_WORKER_LOSS_HEAD_H_
#define TRAINYARD_WORKER_LOSS_HEAD_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "kernels/exec_context.h"
#include "task_plugins/task_loader.h"

namespace trainyard {

class LossHead {
 public:
  // `task` and `ctx` must outlive the head.
  LossHead(Task* task, const ExecContext* ctx) : task_(task), ctx_(ctx) {}

  // Starts a step or an eval pass.
  void Reset() {
    weight_sum_ = 0;
    loss_sum_ = 0;
    terms_.clear();
  }

  // The loss of microbatch `microbatch` of step `step` (0-based: the steps
  // completed before it). Returns w * dLoss/dOutput on the device, or an
  // undefined tensor for eval.
  absl::StatusOr<Tensor> Compute(const Tensor& output,
                                 const NamedTensors& state, int64_t step,
                                 int microbatch, int num_microbatches,
                                 bool is_eval);

  double weight_sum() const { return weight_sum_; }
  double loss_sum() const { return loss_sum_; }
  // Each Compute's (w, w L) since Reset, in call order, flattened: the
  // sums above are these added one after another (replicas gather them).
  const std::vector<double>& terms() const { return terms_; }

 private:
  Task* task_;
  const ExecContext* ctx_;
  double weight_sum_ = 0;
  double loss_sum_ = 0;
  std::vector<double> terms_;
};

}  // namespace trainyard

#endif  // TRAINYARD_WORKER_LOSS_HEAD_H_
