#include "engine/loss_head.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "core/step_totals.h"
#include "kernels/device_ops.h"

namespace trainyard {
namespace {

absl::Status Diverged(int64_t step, int microbatch, double value) {
  return absl::FailedPreconditionError(
      absl::StrCat("step ", step + 1, ": the model's output for microbatch ",
                   microbatch, " is not finite (", value,
                   "): the training diverged; lower optimizer.lr or set "
                   "optimizer.clip_grad"));
}

}  // namespace

void LossHead::Add(const LossResult& loss) {
  weight_sum_ += loss.weight;
  loss_sum_ += loss.weighted_loss;
  terms_.push_back(loss.weight);
  terms_.push_back(loss.weighted_loss);
}

absl::StatusOr<Tensor> LossHead::Compute(const Tensor& output,
                                         const NamedTensors& state,
                                         int64_t step, int microbatch,
                                         int num_microbatches, int slot,
                                         bool is_eval) {
  if (scalars_ != nullptr) {
    double* words = scalars_->microbatch(slot);
    RETURN_IF_ERROR(FindNonFinite(*ctx_, output, words + kCheckOutput));
    NamedTensors on_device;
    for (const auto& [name, t] : state) {
      ASSIGN_OR_RETURN(Tensor d, ctx_->ToDevice(t));
      on_device.push_back({name, d});
    }
    Tensor grad;
    if (!is_eval) {
      ASSIGN_OR_RETURN(grad, ctx_->Empty(output.dtype(), output.shape()));
    }
    const int64_t need = static_cast<int64_t>(
        task_->DeviceLossWorkspaceBytes(output.dim(0), output.dim(1)));
    if (workspace_.numel() < need) {
      ASSIGN_OR_RETURN(workspace_, ctx_->Empty(DType::kUInt8, {need}));
    }
    RETURN_IF_ERROR(task_->ComputeLossDevice(
        ctx_->device(), ctx_->stream(), output, on_device,
        is_eval ? nullptr : &grad, words + kCheckWords, workspace_, step,
        microbatch, num_microbatches, is_eval));
    if (!is_eval) {
      RETURN_IF_ERROR(FindNonFinite(*ctx_, grad, words + kCheckGrad));
    }
    if (out_cols_.size() <= static_cast<size_t>(slot)) {
      out_cols_.resize(slot + 1);
    }
    out_cols_[slot] = output.dim(1);
    return grad;
  }

  ASSIGN_OR_RETURN(Tensor wide, ctx_->Cast(output, DType::kFloat32));
  ASSIGN_OR_RETURN(Tensor host, ctx_->ToHost(wide));
  const float* o = host.data<float>();
  for (int64_t i = 0, n = host.numel(); i < n; ++i) {
    if (!std::isfinite(o[i])) return Diverged(step, microbatch, o[i]);
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
  Add(loss);
  if (is_eval) return Tensor();
  const float w = static_cast<float>(loss.weight);
  float* g = grad.data<float>();
  for (int64_t i = 0, n = grad.numel(); i < n; ++i) g[i] *= w;
  ASSIGN_OR_RETURN(Tensor on_device, ctx_->ToDevice(grad));
  return ctx_->Cast(on_device, ctx_->activation_dtype());
}

absl::Status LossHead::Finish(int64_t step, int first_microbatch, int count,
                              int num_microbatches, bool is_eval) {
  if (scalars_ == nullptr) {
    return absl::FailedPreconditionError("LossHead::Finish of a host loss");
  }
  for (int m = 0; m < count; ++m) {
    const int microbatch = first_microbatch + m;
    const double* words = scalars_->host_microbatch(m);
    const NonFinite out = DecodeNonFinite(words + kCheckOutput);
    if (out.found) return Diverged(step, microbatch, out.value);
    ASSIGN_OR_RETURN(LossResult loss,
                     task_->FinishLoss(words + kCheckWords, step, microbatch,
                                       num_microbatches, is_eval));
    const NonFinite grad = DecodeNonFinite(words + kCheckGrad);
    if (!is_eval && grad.found) {
      const int64_t cols = m < static_cast<int>(out_cols_.size())
                               ? std::max<int64_t>(out_cols_[m], 1)
                               : 1;
      return absl::InternalError(absl::StrCat(
          "plugin \"", task_->plugin().name(), "\": compute_loss_device: step ",
          step, " microbatch ", microbatch, ": grad_output[", grad.index / cols,
          ", ", grad.index % cols, "] is not finite: ", grad.value));
    }
    Add(loss);
  }
  return absl::OkStatus();
}

}  // namespace trainyard
