// ParamStore: one pipeline stage's parameters and their gradients — two
// flat float32 buffers on the stage's device, cut into one segment per
// parameter (global name, shape, offset, weight-decay flag) — and the
// per-block views the block kernels take. It initialises the parameters
// (seeded nn.Linear init, one RNG stream per global parameter so values do
// not depend on the stage split, or model.init.safetensors) and moves them
// to and from the host by name (checkpoints, final weights).
//
// Thread safety: used by its stage's thread only.
#ifndef TRAINYARD_ENGINE_PARAM_STORE_H_
#define TRAINYARD_ENGINE_PARAM_STORE_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "engine/optimizer.h"
#include "kernels/exec_context.h"
#include "kernels/mlp_block.h"
#include "plan/job_plan.h"

namespace trainyard {

class ParamStore {
 public:
  // Lays out stage `stage` of `plan` on ctx's device, its chunks' blocks
  // one after another (contents uninitialised). Errors: allocation failure
  // (ResourceExhausted naming the size), a plan inconsistent with its blocks
  // (Internal).
  static absl::StatusOr<ParamStore> Create(const JobPlan& plan, int stage,
                                           const ExecContext* ctx);

  const std::vector<ParamSegment>& segments() const { return segments_; }
  // Index into plan.params of local parameter i.
  int global_index(int i) const { return global_index_[i]; }
  int64_t total() const { return params_.numel(); }

  Tensor& params() { return params_; }  // [total]
  const Tensor& params() const { return params_; }
  Tensor& grads() { return grads_; }  // [total]; undefined unless it trains
  // bf16 on a GPU: the parameters rounded to bfloat16 [total], which the
  // blocks read for their GEMMs and the optimizer rewrites with each update;
  // undefined otherwise.
  Tensor& params_bf16() { return params_bf16_; }
  MlpBlockParams& block_params(int b) { return block_params_[b]; }
  MlpBlockParams& block_grads(int b) { return block_grads_[b]; }
  // Block b's views of a flat buffer holding elements [base, base +
  // flat.numel()) of the parameters' layout (a chunk's part of a
  // gradient, say), as block_grads(b) are views of grads().
  MlpBlockParams BlockViewsOf(int b, const Tensor& flat, int64_t base) const;

  // The parameters as views of the flat buffer (on the device).
  NamedTensors Named() const;
  // Any flat [total] tensor laid out like the parameters (a host copy of
  // them, say), cut into named views.
  NamedTensors Slice(const Tensor& flat) const;
  // Host copies of the parameters (the views themselves on the CPU).
  absl::StatusOr<NamedTensors> NamedOnHost() const;

  // Seeded init or model.init.safetensors (plan.spec.model.init).
  absl::Status Init(const JobPlan& plan);

  // Copies every parameter from `tensors` (found by name; float32, same
  // shape). Errors, prefixed with `where`: NotFound for a missing one,
  // InvalidArgument for a wrong dtype or shape.
  absl::Status Load(const std::map<std::string, Tensor>& tensors,
                    const std::string& where);

 private:
  ParamStore() = default;
  const ExecContext* ctx_ = nullptr;
  std::vector<ParamSegment> segments_;
  std::vector<int> global_index_;
  // After params_ changed outside the optimizer (init, restore).
  absl::Status RefreshLowPrecisionCopy();

  Tensor params_, grads_, params_bf16_;
  std::vector<MlpBlockParams> block_params_, block_grads_;
  std::vector<MlpBlockConfig> block_configs_;
  std::vector<size_t> block_first_segment_;  // index into segments_
};

}  // namespace trainyard

#endif  // TRAINYARD_ENGINE_PARAM_STORE_H_
