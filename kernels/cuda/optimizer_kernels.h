// Fused multi-tensor optimizer steps and the deterministic gradient
// sum-of-squares on the device, with the semantics of engine/optimizer.cc
// (torch.optim.AdamW / SGD in float32, the same operation order, every
// operation IEEE-rounded with no FMA contraction, so results match the CPU
// StageOptimizer bit for bit). The effective gradient is grad * grad_scale
// (clip coefficient and loss-weight normalisation folded in).
//
// Parameters, gradients and state are float32 (master weights) in one flat
// buffer cut into segments; `params_bf16` (optional) receives a bfloat16
// copy of the updated parameters for bfloat16 compute. One launch handles up
// to 48 segments (more are split into several launches).
// Launchers enqueue on `stream`; thread-safe.
#ifndef TRAINYARD_KERNELS_CUDA_OPTIMIZER_KERNELS_H_
#define TRAINYARD_KERNELS_CUDA_OPTIMIZER_KERNELS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "core/param_segment.h"
#include "kernels/cuda/runtime.h"

namespace trainyard {
namespace gpu {

struct AdamWStep {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
  int64_t step = 1;  // torch's state["step"] after this update (>= 1)
  double grad_scale = 1.0;
};

struct SgdStep {
  double lr = 1e-2, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
  bool first_step = true;  // momentum buffer initialised to the gradient
  double grad_scale = 1.0;
};

// params, grads and state must be 16-byte aligned (the flat buffers are):
// the update moves 4 elements at a time with 16-byte loads and stores.
// `device_totals` (optional): device memory holding a step's totals
// (core/step_totals.h: [loss, grad_norm, grad_scale, skip]); the kernels
// then read the gradient scale from it instead of hp.grad_scale, and leave
// everything unchanged when its skip word is set.
absl::Status FusedAdamW(const std::vector<ParamSegment>& segments,
                        const AdamWStep& hp, float* params, const float* grads,
                        float* exp_avg, float* exp_avg_sq, void* params_bf16,
                        Stream stream, const double* device_totals = nullptr);

// momentum_buffer may be null only when hp.momentum == 0.
absl::Status FusedSgd(const std::vector<ParamSegment>& segments,
                      const SgdStep& hp, float* params, const float* grads,
                      float* momentum_buffer, void* params_bf16, Stream stream,
                      const double* device_totals = nullptr);

// Bytes of device workspace GradSumsOfSquares needs for `segments`.
size_t GradSumsOfSquaresWorkspaceBytes(
    const std::vector<ParamSegment>& segments);

// out [segments.size()] (device, double) = sum of squares of each segment
// of the raw gradients (a 16-byte aligned flat buffer). A grid
// proportional to each segment's size, 16-byte loads, double
// accumulation, fixed reduction trees, no atomics: the same bits on every
// run and device.
absl::Status GradSumsOfSquares(const std::vector<ParamSegment>& segments,
                               const float* grads, void* workspace, double* out,
                               Stream stream);

}  // namespace gpu
}  // namespace trainyard

#endif  // TRAINYARD_KERNELS_CUDA_OPTIMIZER_KERNELS_H_
