// Tensors across the task plugin ABI (task_plugins/task_abi.h), both ways:
// AbiTensors views the host's tensors as TrainyardTensors for a call, and
// HostSink receives what a plugin adds through its TrainyardSink (tensors,
// metrics, bytes) into host-owned memory, refusing misuse.
#ifndef TRAINYARD_ENGINE_PLUGIN_TENSORS_H_
#define TRAINYARD_ENGINE_PLUGIN_TENSORS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/tensor.h"
#include "task_plugins/task_abi.h"

namespace trainyard {

// The sink handed to one plugin call. Records the first misuse; the call is
// failed after it returns even if the plugin reports success (CallPlugin).
class HostSink {
 public:
  HostSink(bool allow_tensors, bool allow_metrics, bool allow_bytes);
  HostSink(const HostSink&) = delete;
  HostSink& operator=(const HostSink&) = delete;

  TrainyardSink* abi() { return &abi_; }
  const std::string& violation() const { return violation_; }
  NamedTensors& tensors() { return tensors_; }
  std::vector<std::pair<std::string, double>>& metrics() { return metrics_; }
  std::string& bytes() { return bytes_; }

 private:
  static void* AddTensorThunk(void* ctx, const char* name, int32_t dtype,
                              int32_t ndim, const int64_t* shape);
  static void AddMetricThunk(void* ctx, const char* name, double value);
  static void AddBytesThunk(void* ctx, const void* data, size_t len);

  void Refuse(std::string why) {
    if (violation_.empty()) violation_ = std::move(why);
  }
  void* AddTensor(const char* name, int32_t dtype, int32_t ndim,
                  const int64_t* shape);
  void AddMetric(const char* name, double value);
  void AddBytes(const void* data, size_t len);

  TrainyardSink abi_;
  const bool allow_tensors_;
  const bool allow_metrics_;
  const bool allow_bytes_;
  std::string violation_;
  std::set<std::string> names_;
  int64_t call_bytes_ = 0;
  NamedTensors tensors_;
  std::vector<std::pair<std::string, double>> metrics_;
  std::string bytes_;
};

// Tensors viewed as ABI tensors. Keeps the names alive. Host tensors
// (float32, int32, int64) for the v1 calls; device tensors (those and
// bfloat16) for compute_loss_device.
class AbiTensors {
 public:
  // Errors (InvalidArgument, starting with `prefix`): a tensor on the wrong
  // side, or with a dtype or rank the ABI does not take.
  absl::Status Add(const std::string& name, const Tensor& t,
                   const std::string& prefix, bool on_device = false);
  const TrainyardTensor* data() const { return tensors_.data(); }
  int32_t size() const { return static_cast<int32_t>(tensors_.size()); }
  TrainyardTensor& at(int i) { return tensors_[i]; }

 private:
  std::vector<std::unique_ptr<std::string>> names_;
  std::vector<TrainyardTensor> tensors_;
};

// build_forward_inputs' batch into `abi`: every tensor named once, of rank
// >= 1, all with the same rows. Returns the rows. Errors: InvalidArgument
// starting with `prefix`.
absl::StatusOr<int64_t> AddBatchTensors(const std::string& prefix,
                                        const NamedTensors& batch,
                                        AbiTensors* abi);

// The tensors of one loss call as ABI tensors: compute_loss's on the host,
// or compute_loss_device's on a device; infer_outputs' output and state
// (host) too.
class LossTensors {
 public:
  // Views `output` and the microbatch's `state`, whose tensors must have
  // the output's rows (and be on `device`). `device` null: host tensors.
  // Errors: InvalidArgument starting with `prefix`.
  absl::Status AddOutputAndState(const std::string& prefix,
                                 const Tensor& output,
                                 const NamedTensors& state,
                                 const Device* device);
  // Views `grad_output`; null: a tensor shaped like `output` with NULL data
  // (no gradient wanted).
  absl::Status AddGradOutput(const std::string& prefix,
                             const Tensor* grad_output, const Tensor& output);
  // Sets the output and the state: all infer_outputs takes of them.
  template <typename Args>
  void FillOutputAndState(Args* args) {
    args->output = output_.data();
    args->state = state_.data();
    args->num_state = state_.size();
  }
  // Sets the fields the host and the device loss arguments share.
  template <typename LossArgs>
  void Fill(int64_t step, int32_t microbatch, int32_t num_microbatches,
            bool is_eval, LossArgs* args) {
    FillOutputAndState(args);
    args->grad_output = &grad_.at(0);
    args->step = step;
    args->microbatch = microbatch;
    args->num_microbatches = num_microbatches;
    args->is_eval = is_eval ? 1 : 0;
  }

 private:
  bool on_device_ = false;
  AbiTensors output_, state_, grad_;
};

}  // namespace trainyard

#endif  // TRAINYARD_ENGINE_PLUGIN_TENSORS_H_
