#include "worker/loss_head.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace trainyard {

absl::StatusOr<Tensor> LossHead::Compute(const Tensor& output,
                                         const NamedTensors& state,
                                         int64_t step, int microbatch,
                                         int num_microbatches, bool is_eval) {
  ASSIGN_OR_RETURN(Tensor wide, ctx_->Cast(output, DType::kFloat32));
  ASSIGN_OR_RETURN(Tensor host, ctx_->ToHost(wide));
  const float* o = host.data<float>();
  for (int64_t i = 0, n = host.numel(); i < n; ++i) {
    if (!std::isfinite(o[i])) {
      return absl::FailedPreconditionError(absl::StrCat(
          "step ", step + 1, ": the model's output for microbatch ", microbatch,
          " is not finite (", o[i],
          "): the training diverged; lower optimizer.lr or set "
          "optimizer.clip_grad"));
    }
  }
  Tensor grad;
  if (!is_eval) {
    ASSIGN_OR_RETURN(grad, Tensor::Create(DType::kFloat32, host.shape()));
    std::memset(grad.raw_data(), 0, grad.nbytes());
  }
  ASSIGN_OR_RETURN(
      LossResult loss,
      task_->ComputeLoss(host, state, is_eval ? nullptr : &grad, step,
                         microbatch, num_microbatches, is_eval));
  weight_sum_ += loss.weight;
  loss_sum_ += loss.weighted_loss;
  terms_.push_back(loss.weight);
  terms_.push_back(loss.weighted_loss);
  if (is_eval) return Tensor();
  const float w = static_cast<float>(loss.weight);
  float* g = grad.data<float>();
  for (int64_t i = 0, n = grad.numel(); i < n; ++i) g[i] *= w;
  ASSIGN_OR_RETURN(Tensor on_device, ctx_->ToDevice(grad));
  return ctx_->Cast(on_device, ctx_->activation_dtype());
}

}  // namespace trainyard
