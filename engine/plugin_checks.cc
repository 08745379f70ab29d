#include "engine/plugin_checks.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace trainyard {

absl::Status TakeForwardOutputs(const std::string& prefix, int64_t rows,
                                const NamedTensors& tensors, Tensor* inputs,
                                NamedTensors* state) {
  bool have_inputs = false;
  for (const auto& [name, t] : tensors) {
    if (name == "inputs") {
      if (t.dtype() != DType::kFloat32 || t.ndim() != 2) {
        return absl::InternalError(
            absl::StrCat(prefix, "\"inputs\" must be float32 [B, D], got ",
                         DTypeName(t.dtype()), " ", ShapeToString(t.shape())));
      }
      if (t.dim(0) != rows) {
        return absl::InternalError(absl::StrCat(prefix, "\"inputs\" has ",
                                                t.dim(0),
                                                " rows, the batch has ", rows));
      }
      *inputs = t;
      have_inputs = true;
      continue;
    }
    if (t.ndim() < 1 || t.dim(0) != rows) {
      return absl::InternalError(
          absl::StrCat(prefix, "state tensor \"", name, "\" has shape ",
                       ShapeToString(t.shape()),
                       "; dim 0 must equal the batch size ", rows));
    }
    state->emplace_back(name, t);
  }
  if (!have_inputs) {
    return absl::InternalError(
        absl::StrCat(prefix, "did not add the required tensor \"inputs\""));
  }
  return absl::OkStatus();
}

absl::Status CheckMicrobatch(const std::string& prefix, int32_t microbatch,
                             int32_t num_microbatches) {
  if (num_microbatches < 1 || microbatch < 0 ||
      microbatch >= num_microbatches) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "microbatch ",
                                                   microbatch, " outside [0, ",
                                                   num_microbatches, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckLossWeight(const std::string& where, double weight) {
  if (!std::isfinite(weight) || weight < 0) {
    return absl::InternalError(absl::StrCat(
        where, "loss_weight must be finite and >= 0, got ", weight));
  }
  return absl::OkStatus();
}

absl::Status CheckLoss(const std::string& where, double loss, double weight) {
  if (!std::isfinite(loss)) {
    return absl::InternalError(
        absl::StrCat(where, "loss is not finite: ", loss));
  }
  RETURN_IF_ERROR(CheckLossWeight(where, weight));
  if (weight == 0 && loss != 0) {
    return absl::InternalError(
        absl::StrCat(where, "loss_weight is 0 but loss is ", loss,
                     " (a microbatch that contributes nothing has loss 0)"));
  }
  return absl::OkStatus();
}

absl::Status CheckGradOutput(const std::string& where, const Tensor& grad,
                             double weight) {
  const float* g = grad.data<float>();
  const int64_t n = grad.numel();
  const int64_t cols = grad.dim(1);
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(g[i])) {
      return absl::InternalError(absl::StrCat(where, "grad_output[", i / cols,
                                              ", ", i % cols,
                                              "] is not finite: ", g[i]));
    }
    if (weight == 0 && g[i] != 0) {
      return absl::InternalError(
          absl::StrCat(where, "loss_weight is 0 but grad_output[", i / cols,
                       ", ", i % cols, "] is ", g[i]));
    }
  }
  return absl::OkStatus();
}

}  // namespace trainyard
