// StageOptimizer: the stage-local optimizer step (after eformer's
// stage-local optimizer). Each pipeline stage updates only its own
// parameters, segment by segment over the stage's flat parameter buffer;
// the only cross-stage input is the global gradient scale (loss-weight
// normalisation times the clip coefficient), computed from a small
// all-reduce by the caller.
//
// Semantics follow PyTorch, in float32, in the same operation order:
// - AdamW = torch.optim.AdamW (decoupled decay p *= 1 - lr*wd; bias-corrected
//   moments; p += -lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps)).
// - SGD = torch.optim.SGD (wd added to the gradient; momentum buffer
//   initialised to the first gradient; dampening; nesterov).
// The effective gradient is grad * grad_scale, as if the caller had scaled
// the gradients in place (torch.nn.utils.clip_grad_norm_ does that).
//
// Device: the state lives on the ExecContext's device. On the CPU the
// update runs on our thread pool; on a GPU the fused multi-tensor kernels
// of kernels/cuda/optimizer_kernels.h apply the same formulas bit for bit
// (same float32 operation order, no FMA contraction). The gradient sums of
// squares use a fixed reduction order on each device; the CPU's and the
// GPU's orders differ, so their norms may differ in the last bits.
//
// Not thread-safe; one per stage.
#ifndef TRAINYARD_ENGINE_OPTIMIZER_H_
#define TRAINYARD_ENGINE_OPTIMIZER_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/param_segment.h"
#include "core/tensor.h"
#include "kernels/exec_context.h"
#include "proto/job_spec.pb.h"

namespace trainyard {

class StageOptimizer {
 public:
  // `spec` must be normalized (defaults filled in, see plan/job_plan.h).
  // Fails for an optimizer type it does not know.
  // State is allocated through `ctx` (null: the host); ctx must outlive
  // the optimizer.
  static absl::StatusOr<StageOptimizer> Create(
      const trainyard::v1::OptimizerSpec& spec,
      std::vector<ParamSegment> segments, int64_t total_size,
      const ExecContext* ctx = nullptr);

  // One update of `params` [total_size] from raw `grads` [total_size], both
  // on the optimizer's device: effective gradient = grads * grad_scale,
  // learning rate `lr`. Errors: the tensors do not fit; a CUDA failure.
  // `params_bf16` (GPU only; may be null or undefined) receives the
  // updated parameters rounded to bfloat16.
  absl::Status Step(Tensor* params, const Tensor& grads, double lr,
                    double grad_scale, Tensor* params_bf16 = nullptr);
  // Sum of squares of each segment of `grads` (on the optimizer's device),
  // in segment order, in double; waits for the device.
  absl::StatusOr<std::vector<double>> GradSumsOfSquares(
      const Tensor& grads) const;

  // Device optimizers (CUDA or simulated): the same sums, queued on the
  // device into `out` (device memory, one double per segment); nothing
  // waits.
  absl::Status GradSumsOfSquaresOnDevice(const Tensor& grads,
                                         double* out) const;
  // Device optimizers: one update with the gradient scale a device step
  // computed: `totals` is device memory laid out as core/step_totals.h's
  // DeviceTotalsArgs::totals; when its skip word is set the update leaves
  // parameters and state unchanged (step_count() still advances: the step
  // fails and its stage is not used again). Nothing waits.
  absl::Status StepWithDeviceTotals(Tensor* params, const Tensor& grads,
                                    double lr, const double* totals,
                                    Tensor* params_bf16 = nullptr);

  // The host update and sums on raw buffers (CPU optimizers only).
  void Step(float* params, const float* grads, double lr, double grad_scale);

  // Sum of squares of each segment's raw gradient, in segment order, in
  // double. Chunked by a fixed size and reduced in chunk order, so the
  // result does not depend on the thread count.
  std::vector<double> GradSumsOfSquares(const float* grads) const;

  // Updates taken so far (torch's state["step"]).
  int64_t step_count() const { return step_count_; }

  // State tensors for checkpoints, named optimizer.<param>.exp_avg and
  // .exp_avg_sq (AdamW) or .momentum_buffer (SGD with momentum). They
  // alias the optimizer's buffers (on its device).
  NamedTensors StateTensors() const;

  // Restores state saved by StateTensors from `tensors` (host or device;
  // looked up by name; shapes must match) and the step count. Errors name
  // the missing or mismatched tensor.
  absl::Status LoadState(const std::map<std::string, Tensor>& tensors,
                         int64_t step_count);

 private:
  StageOptimizer() = default;
  absl::Status CheckFlat(const char* what, const Tensor& t) const;
  // `totals` null: grad_scale; else the scale and skip of a device step.
  absl::Status StepOnDevice(Tensor* params, const Tensor& grads, double lr,
                            double grad_scale, void* params_bf16,
                            const double* totals = nullptr);
  // params_bf16's device pointer, checked (null when it is undefined).
  absl::StatusOr<void*> LowPrecisionCopy(Tensor* params_bf16) const;

  trainyard::v1::OptimizerSpec spec_;
  const ExecContext* ctx_ = nullptr;  // null: the host
  bool adamw_ = true;
  std::vector<ParamSegment> segments_;
  int64_t total_size_ = 0;
  int64_t step_count_ = 0;
  // Fixed-size pieces of the segments, the unit of parallel work.
  struct Chunk {
    int segment;
    int64_t begin, end;  // elements into the flat buffer
  };
  std::vector<Chunk> chunks_;
  Tensor state1_;  // [total] exp_avg or momentum_buffer
  Tensor state2_;  // [total] exp_avg_sq
  // GPU scratch of the sums of squares, allocated at first use.
  mutable Tensor norm_workspace_;
};

}  // namespace trainyard

#endif  // TRAINYARD_ENGINE_OPTIMIZER_H_
