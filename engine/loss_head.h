// LossHead: the last stage's loss. For each microbatch it takes the model's
// output (on the stage's device, in the activation dtype) and the
// microbatch's task state, and returns w * dLoss/dOutput on the device in
// the activation dtype. It accumulates sum(w) and sum(w L) over a step or
// an eval pass (see engine/stage.h for how they combine). Two ways:
//
// Host loss (task ABI v1; every CPU stage, and device stages whose plugin
// has no device loss): the output is checked to be finite (a non-finite
// output is named as divergence, not as a plugin fault), copied to the
// host as float32, handed to the plugin's compute_loss, and the returned
// gradient scaled by float32(w) and copied back. On a device that is two
// synchronous copies of [rows, out] per microbatch.
//
// Device loss (ABI v2, device stages; with StepScalars): everything is
// queued on the device and nothing waits. The output's finiteness check,
// the plugin's compute_loss_device (its slots) and the gradient's
// finiteness check land in the microbatch's words of the step's
// StepScalars; after the stage has read them (once per step), Finish
// checks them microbatch by microbatch in order, with the host loss's
// messages, and adds up the sums. State tensors that are still on the host
// (a non-passthrough plugin's, or after a TCP hop) are copied to the device
// first.
//
// Thread safety: used by its stage's thread only.
#ifndef TRAINYARD_ENGINE_LOSS_HEAD_H_
#define TRAINYARD_ENGINE_LOSS_HEAD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "engine/step_scalars.h"
#include "engine/task_loader.h"
#include "kernels/exec_context.h"

namespace trainyard {

class LossHead {
 public:
  // `task`, `ctx` and `scalars` must outlive the head. `scalars` null: the
  // host loss; otherwise the device loss (the plugin must have one).
  LossHead(Task* task, const ExecContext* ctx, StepScalars* scalars = nullptr)
      : task_(task), ctx_(ctx), scalars_(scalars) {}

  bool on_device() const { return scalars_ != nullptr; }

  // Starts a step or an eval pass.
  void Reset() {
    weight_sum_ = 0;
    loss_sum_ = 0;
    terms_.clear();
  }

  // The loss of microbatch `microbatch` of step `step` (0-based: the steps
  // completed before it), which is word block `slot` of the step's
  // StepScalars (the device loss). Returns w * dLoss/dOutput on the
  // device, or an undefined tensor for eval.
  absl::StatusOr<Tensor> Compute(const Tensor& output,
                                 const NamedTensors& state, int64_t step,
                                 int microbatch, int num_microbatches, int slot,
                                 bool is_eval);

  // The device loss, after the step's StepScalars were read: checks slots
  // [0, count) in order (slot m is microbatch first_microbatch + m) and adds
  // their weights and losses to the sums. Errors: those the host loss would
  // have returned for the first bad microbatch.
  absl::Status Finish(int64_t step, int first_microbatch, int count,
                      int num_microbatches, bool is_eval);

  double weight_sum() const { return weight_sum_; }
  double loss_sum() const { return loss_sum_; }
  // Each microbatch's (w, w L) since Reset, in microbatch order, flattened:
  // the sums above are these added one after another (replicas gather
  // them).
  const std::vector<double>& terms() const { return terms_; }

 private:
  void Add(const LossResult& loss);

  Task* task_;
  const ExecContext* ctx_;
  StepScalars* scalars_;
  Tensor workspace_;               // the device loss's, grown as needed
  std::vector<int64_t> out_cols_;  // per slot, for gradient messages
  double weight_sum_ = 0;
  double loss_sum_ = 0;
  std::vector<double> terms_;
};

}  // namespace trainyard

#endif  // TRAINYARD_ENGINE_LOSS_HEAD_H_
