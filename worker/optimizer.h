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
// Not thread-safe; one per stage.
#ifndef TRAINYARD_WORKER_OPTIMIZER_H_
#define TRAINYARD_WORKER_OPTIMIZER_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "proto/job_spec.pb.h"

namespace trainyard {

// One parameter tensor inside a stage's flat buffer.
struct ParamSegment {
  std::string name;  // "blocks.3.fc1.weight"
  Shape shape;
  int64_t offset = 0;  // elements into the flat buffer
  bool decay = true;   // weight decay applies

  int64_t size() const { return NumElements(shape); }
};

class StageOptimizer {
 public:
  // `spec` must be normalized (defaults filled in, see core/job_plan.h).
  // Fails for an optimizer type it does not know.
  static absl::StatusOr<StageOptimizer> Create(
      const trainyard::v1::OptimizerSpec& spec,
      std::vector<ParamSegment> segments, int64_t total_size);

  // One update of `params` [total_size] from raw `grads` [total_size]:
  // effective gradient = grads * grad_scale, learning rate `lr`.
  void Step(float* params, const float* grads, double lr, double grad_scale);

  // Sum of squares of each segment's raw gradient, in segment order, in
  // double. Chunked by a fixed size and reduced in chunk order, so the
  // result does not depend on the thread count.
  std::vector<double> GradSumsOfSquares(const float* grads) const;

  // Updates taken so far (torch's state["step"]).
  int64_t step_count() const { return step_count_; }

  // State tensors for checkpoints, named optimizer.<param>.exp_avg and
  // .exp_avg_sq (AdamW) or .momentum_buffer (SGD with momentum). They
  // alias the optimizer's buffers.
  std::vector<std::pair<std::string, Tensor>> StateTensors() const;

  // Restores state saved by StateTensors from `tensors` (looked up by name;
  // shapes must match) and the step count. Errors name the missing or
  // mismatched tensor.
  absl::Status LoadState(const std::map<std::string, Tensor>& tensors,
                         int64_t step_count);

 private:
  StageOptimizer() = default;

  trainyard::v1::OptimizerSpec spec_;
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
};

}  // namespace trainyard

#endif  // TRAINYARD_WORKER_OPTIMIZER_H_
