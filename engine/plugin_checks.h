// Checks of what a task plugin returned, beyond what its sink refused
// during the call (engine/plugin_tensors.h): a result that breaks the ABI's
// contract is an Internal error naming the plugin, the call and the fault.
#ifndef TRAINYARD_ENGINE_PLUGIN_CHECKS_H_
#define TRAINYARD_ENGINE_PLUGIN_CHECKS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "core/tensor.h"

namespace trainyard {

// Whether `name` matches [A-Za-z0-9_]+: a plugin's name, or an output's
// (used as a file name).
bool IsPlainName(const std::string& name);

// build_forward_inputs' tensors for a batch of `rows` rows: "inputs"
// (float32 [rows, D]) into *inputs, and the others, state tensors with dim
// 0 == rows, appended to *state in order. Errors start with `prefix`.
absl::Status TakeForwardOutputs(const std::string& prefix, int64_t rows,
                                const NamedTensors& tensors, Tensor* inputs,
                                NamedTensors* state);

// The index of a microbatch a loss call gets: in [0, num_microbatches).
// Errors: InvalidArgument starting with `prefix`.
absl::Status CheckMicrobatch(const std::string& prefix, int32_t microbatch,
                             int32_t num_microbatches);

// A microbatch's loss weight: finite and >= 0. Errors start with `where`
// (the plugin, the call, the step and the microbatch).
absl::Status CheckLossWeight(const std::string& where, double weight);

// A microbatch's loss and weight: the loss finite, the weight as
// CheckLossWeight wants, and a weight of 0 only with a loss of 0.
absl::Status CheckLoss(const std::string& where, double loss, double weight);

// The host loss's gradient (float32 [b, out]): finite, and all zero when
// the weight is 0.
absl::Status CheckGradOutput(const std::string& where, const Tensor& grad,
                             double weight);

// infer_outputs' tensors for a microbatch of `rows` rows: at least one,
// each named [A-Za-z0-9_]+, of rank >= 1 with dim 0 == rows (the sink
// refuses dtypes other than float32/int32/int64 during the call). When
// *layout is not empty (the outputs of the task's first call, with zero
// rows) the tensors must have its names, dtypes and trailing dims; when it
// is empty and the tensors pass, it is set from them. Internal errors
// starting with `prefix`.
absl::Status CheckInferOutputs(const std::string& prefix, int64_t rows,
                               const NamedTensors& tensors,
                               NamedTensors* layout);

}  // namespace trainyard

#endif  // TRAINYARD_ENGINE_PLUGIN_CHECKS_H_
