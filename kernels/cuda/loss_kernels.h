// The built-in task plugins' losses on the device, with the semantics of
// task_plugins/mse.cc and task_plugins/cross_entropy.cc:
// - MSE: torch.nn.MSELoss (mean over every element); loss_weight = rows;
//   grad = 2 (out - target) / n.
// - Softmax cross-entropy with class-index labels, ignore_index and label
//   smoothing eps: loss_i = (1 - eps) (-log p[y_i]) + eps mean_c(-log p[c]),
//   loss = mean over non-ignored rows, loss_weight = their count,
//   grad = (softmax - target) / count (zero rows for ignored samples),
//   correct = rows whose argmax (first maximum on ties) equals the label.
// Logits, targets and gradients are float32; sums are double with fixed
// reduction trees (deterministic). Results land in a device LossResult;
// copy it to the host after the stream is done. A label outside
// [0, classes) that is not ignore_index sets bad_row (the smallest such
// row) and the caller must reject the microbatch, as the CPU plugin does.
// Launchers enqueue on `stream`; thread-safe.
#ifndef TRAINYARD_KERNELS_CUDA_LOSS_KERNELS_H_
#define TRAINYARD_KERNELS_CUDA_LOSS_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/device.h"

namespace trainyard {
namespace gpu {

struct LossResult {
  double loss = 0;         // mean loss
  double loss_weight = 0;  // rows (MSE) or non-ignored rows (cross-entropy)
  double loss_sum = 0;     // loss * count (for metrics)
  int64_t correct = 0;     // cross-entropy only
  int64_t bad_row = -1;    // first row with an invalid label, or -1
};

// Bytes of device workspace for `rows` rows.
size_t LossWorkspaceBytes(int64_t rows);

// out, target [rows, cols]; grad [rows, cols] may be null (eval).
absl::Status MseLoss(int64_t rows, int64_t cols, const float* out,
                     const float* target, float* grad, void* workspace,
                     LossResult* result, Stream stream);

// logits [rows, classes], labels int64 [rows]; grad may be null (eval).
absl::Status SoftmaxCrossEntropyLoss(int64_t rows, int64_t classes,
                                     const float* logits, const int64_t* labels,
                                     int64_t ignore_index,
                                     double label_smoothing, float* grad,
                                     void* workspace, LossResult* result,
                                     Stream stream);

}  // namespace gpu
}  // namespace trainyard

#endif  // TRAINYARD_KERNELS_CUDA_LOSS_KERNELS_H_
