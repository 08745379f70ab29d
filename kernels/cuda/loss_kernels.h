// The shipped task plugins' losses on a GPU: the device half (task ABI v2)
// of task_plugins/mse.cc, cross_entropy.cc and logit_distillation.cc, with
// the arguments and the slot layout of kernels/cuda/loss_args.h and the
// semantics of their CPU twins in kernels/losses.h (which the plugins use
// on the host and on the simulated device). The gradient written is the
// weighted one (w times dLoss/dOutput, rounded as losses.h's
// Output::weighted), in the output's dtype: Output::weighted must be set
// when Output::grad is.
//
// Outputs are float32 or bfloat16; sums are double over fixed grids and
// fixed reduction trees (no atomics on floats): the same bits on every run
// on a given GPU model; they differ from the CPU's row-order sums in the
// last bits. Launchers enqueue on `stream`, never wait, and check their
// arguments and the launch; the slots must be zeroed by the caller (the
// task host does). Thread-safe.
#ifndef TRAINYARD_KERNELS_CUDA_LOSS_KERNELS_H_
#define TRAINYARD_KERNELS_CUDA_LOSS_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/loss_args.h"
#include "kernels/cuda/runtime.h"

namespace trainyard {
namespace gpu {

// Device workspace for MseLoss and for the two classifier losses.
size_t MseWorkspaceBytes(int64_t rows, int64_t cols);
size_t ClassifierWorkspaceBytes(int64_t rows, int64_t cols);

// MSE against float32 targets [rows, cols] (losses::Mse).
absl::Status MseLoss(const losses::Output& out, const float* target,
                     void* workspace, double* slots, Stream stream);

// Softmax cross-entropy against class-index labels [rows]
// (losses::CrossEntropy).
absl::Status CrossEntropyLoss(const losses::Output& out,
                              const losses::Labels& labels,
                              double label_smoothing, void* workspace,
                              double* slots, Stream stream);

// Logit distillation against a float32 teacher [rows, cols] and hard
// labels (losses::Distillation).
absl::Status DistillationLoss(const losses::Output& out, const float* teacher,
                              const losses::Labels& labels, double temperature,
                              double alpha, void* workspace, double* slots,
                              Stream stream);

}  // namespace gpu
}  // namespace trainyard

#endif  // TRAINYARD_KERNELS_CUDA_LOSS_KERNELS_H_
