// StepScalars: the small numbers a device stage's step produces — each
// microbatch's loss slots (the task plugin's, task_abi.h) next to the
// engine's checks of its output and loss gradient, each of the stage's
// parameters' gradient sum of squares, and (one-stage jobs) the step's
// totals — kept in one device buffer so that the host reads them with one
// copy and one synchronisation per step (per eval batch for evals).
//
// Layout, in 8-byte words (core/step_totals.h names the microbatch words):
//   [0, P)                              sums of squares, one per parameter
//   [P + m S, P + (m + 1) S)            microbatch m: kCheckWords engine
//                                       checks, then K plugin slots
//                                       (S = kCheckWords + K)
//   [P + M S, P + M S + kTotalsWords)   the totals
//
// Thread safety: used by its stage's thread only.
#ifndef TRAINYARD_ENGINE_STEP_SCALARS_H_
#define TRAINYARD_ENGINE_STEP_SCALARS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/step_totals.h"
#include "core/tensor.h"
#include "kernels/exec_context.h"

namespace trainyard {

class StepScalars {
 public:
  // For `num_params` parameters, up to `max_microbatches` microbatches and
  // `plugin_slots` slots a microbatch (0 without a device loss), on ctx's
  // device (which must outlive this), with its pinned host mirror.
  static absl::StatusOr<StepScalars> Create(const ExecContext* ctx,
                                            int num_params,
                                            int max_microbatches,
                                            int plugin_slots);

  // Starts a step or an eval batch of `num_microbatches`: zeroes the device
  // buffer (queued). InvalidArgument above max_microbatches.
  absl::Status Begin(int num_microbatches);

  // Device pointers into the buffer.
  double* sums_of_squares() { return Device(0); }
  double* microbatch(int m) { return Device(num_params_ + m * stride_); }
  double* totals() { return Device(num_params_ + max_microbatches_ * stride_); }
  // The totals' arguments over this buffer (every pointer device memory).
  DeviceTotalsArgs TotalsArgs(double clip);

  // Queues the copy of the buffer to the host mirror and waits for it: the
  // step's one synchronisation.
  absl::Status Read();

  // The host mirror, valid after Read(): the same layout.
  const double* host_sums_of_squares() const { return Host(0); }
  const double* host_microbatch(int m) const {
    return Host(num_params_ + m * stride_);
  }
  const double* host_totals() const {
    return Host(num_params_ + max_microbatches_ * stride_);
  }

  int num_params() const { return num_params_; }
  int num_microbatches() const { return num_microbatches_; }

 private:
  StepScalars() = default;
  double* Device(int64_t word) {
    return static_cast<double*>(device_.ptr()) + word;
  }
  const double* Host(int64_t word) const {
    return static_cast<const double*>(host_.ptr()) + word;
  }

  const ExecContext* ctx_ = nullptr;
  int num_params_ = 0;
  int max_microbatches_ = 0;
  int stride_ = 0;
  int num_microbatches_ = 0;
  Tensor device_;  // float64 [words] on ctx's device
  Tensor host_;    // float64 [words], pinned
};

}  // namespace trainyard

#endif  // TRAINYARD_ENGINE_STEP_SCALARS_H_
