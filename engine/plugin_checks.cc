#include "engine/plugin_checks.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"

namespace trainyard {
namespace {

// An inference output's dtype and shape with dim 0 left open: "float32 [b, 3]".
std::string LayoutString(const Tensor& t) {
  std::vector<std::string> dims = {"b"};
  for (int i = 1; i < t.ndim(); ++i) dims.push_back(absl::StrCat(t.dim(i)));
  return absl::StrCat(DTypeName(t.dtype()), " [", absl::StrJoin(dims, ", "),
                      "]");
}

// `tensors` as "\"a\" float32 [b, 3], \"b\" int64 [b]".
std::string LayoutsString(const NamedTensors& tensors) {
  std::vector<std::string> parts;
  for (const auto& [name, t] : tensors) {
    parts.push_back(absl::StrCat("\"", name, "\" ", LayoutString(t)));
  }
  return absl::StrJoin(parts, ", ");
}

// One inference output on its own: a plain name, rank >= 1, `rows` rows.
absl::Status CheckInferOutput(const std::string& prefix, int64_t rows,
                              const std::string& name, const Tensor& t) {
  if (!IsPlainName(name)) {
    return absl::InternalError(absl::StrCat(
        prefix, "output \"", name,
        "\": its name must match [A-Za-z0-9_]+ (it names the output's files)"));
  }
  if (t.ndim() < 1 || t.dim(0) != rows) {
    return absl::InternalError(
        absl::StrCat(prefix, "output \"", name, "\" is ", DTypeName(t.dtype()),
                     " ", ShapeToString(t.shape()),
                     ": dim 0 must be the microbatch's ", rows, " rows"));
  }
  return absl::OkStatus();
}

// Whether `tensors` has the names, dtypes and trailing dims of `layout`.
bool SameLayout(const NamedTensors& tensors, const NamedTensors& layout) {
  if (tensors.size() != layout.size()) return false;
  for (const auto& [name, t] : tensors) {
    bool found = false;
    for (const auto& [first_name, first] : layout) {
      if (first_name != name) continue;
      found = first.dtype() == t.dtype() &&
              Shape(first.shape().begin() + 1, first.shape().end()) ==
                  Shape(t.shape().begin() + 1, t.shape().end());
    }
    if (!found) return false;
  }
  return true;
}

}  // namespace

bool IsPlainName(const std::string& name) {
  if (name.empty()) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '_';
    if (!ok) return false;
  }
  return true;
}

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

absl::Status CheckInferOutputs(const std::string& prefix, int64_t rows,
                               const NamedTensors& tensors,
                               NamedTensors* layout) {
  if (tensors.empty()) {
    return absl::InternalError(absl::StrCat(
        prefix, "added no outputs; it must add at least one tensor"));
  }
  for (const auto& [name, t] : tensors) {
    RETURN_IF_ERROR(CheckInferOutput(prefix, rows, name, t));
  }
  if (layout->empty()) {
    for (const auto& [name, t] : tensors) {
      Shape shape = t.shape();
      shape[0] = 0;
      layout->emplace_back(name, Tensor::Zeros(t.dtype(), shape));
    }
    return absl::OkStatus();
  }
  if (!SameLayout(tensors, *layout)) {
    return absl::InternalError(absl::StrCat(
        prefix, "added ", LayoutsString(tensors), "; its first call added ",
        LayoutsString(*layout),
        " (every call must add the same names with the same dtypes and "
        "trailing dims)"));
  }
  return absl::OkStatus();
}

}  // namespace trainyard
