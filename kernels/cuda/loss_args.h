// The arguments of the shipped task plugins' losses, one microbatch at a
// time, and the slots they fill: the same on every device. kernels/losses.h
// computes the losses on the CPU (the plugins' host loss and the simulated
// device's), kernels/cuda/loss_kernels.h on a GPU.
//
// Results go to `slots` in the ABI v2 layout (task_plugins/task_abi.h):
//   [0] loss weight w   [1] w * loss   [2] 0, or 1 + the first bad row
//   [3] that row's label   [4...] each loss's partials (kernels/losses.h).
//
// Header only, no CUDA: the CPU losses include it too.
#ifndef TRAINYARD_KERNELS_CUDA_LOSS_ARGS_H_
#define TRAINYARD_KERNELS_CUDA_LOSS_ARGS_H_

#include <cstdint>

#include "core/tensor.h"

namespace trainyard {
namespace losses {

// One microbatch's model output [rows, cols] and where its gradient goes.
struct Output {
  DType dtype = DType::kFloat32;  // float32 or bfloat16
  int64_t rows = 0;
  int64_t cols = 0;
  const void* data = nullptr;
  void* grad = nullptr;  // [rows, cols]: float32 (unweighted) or dtype
  // The gradient is w times dLoss/dOutput in the output's dtype (the device
  // half of a plugin); otherwise dLoss/dOutput in float32 (the host half).
  bool weighted = false;
};

// Class-index labels, int32 or int64 [rows].
struct Labels {
  DType dtype = DType::kInt64;
  const void* data = nullptr;
  int64_t ignore_index = -100;
};

// How many slots each loss fills (kernels/losses.h lists the partials).
inline constexpr int kMseSlots = 6;
inline constexpr int kCrossEntropySlots = 6;
inline constexpr int kDistillationSlots = 7;

}  // namespace losses
}  // namespace trainyard

#endif  // TRAINYARD_KERNELS_CUDA_LOSS_ARGS_H_
