// The shipped task plugins' losses on the CPU, one microbatch at a time:
// MSE (task_plugins/mse.cc), softmax cross-entropy (cross_entropy.cc) and
// logit distillation (logit_distillation.cc). The plugins call these for
// their host loss (task ABI v1) and for their device loss on the simulated
// device (ABI v2); kernels/cuda/loss_kernels.h computes the same
// quantities on a GPU. Both take kernels/cuda/loss_args.h's arguments and
// fill its slot layout; each loss's partials are listed below.
// Sums are double, accumulated in row (element) order, so the results do
// not depend on anything but the inputs.
//
// Gradients (when Output::grad is set) are dLoss/dOutput rounded to
// float32: as it is (v1: what a plugin returns; the engine then multiplies
// it by float32(w)), or, with Output::weighted, that float32 times
// float32(w) rounded again and stored in the output's dtype: exactly what
// the engine makes of a v1 gradient, so a plugin's two halves give the
// same bits.
//
// Thread safety: pure functions.
#ifndef TRAINYARD_KERNELS_LOSSES_H_
#define TRAINYARD_KERNELS_LOSSES_H_

#include <cstdint>

#include "core/tensor.h"
#include "kernels/cuda/loss_args.h"

namespace trainyard {
namespace losses {

// The label of `row`.
int64_t LabelAt(const Labels& labels, int64_t row);

// torch.nn.MSELoss (mean over every element) against float32 targets
// [rows, cols]: w = rows; grad = 2 (out - target) / (rows cols).
// Partials: [4] sum of squared differences, [5] elements.
void Mse(const Output& out, const float* target, double* slots);

// torch.nn.CrossEntropyLoss with ignore_index and label smoothing eps:
// loss_i = (1 - eps) (-log p[y_i]) + eps mean_c(-log p[c]); w = rows whose
// label is not ignore_index; loss = mean loss_i over them; grad row i =
// (softmax - target) / w (zero for ignored rows). A label outside
// [0, cols) that is not ignore_index fills [2] and [3] and nothing else.
// Partials: [4] sum of loss_i, [5] rows whose argmax (first maximum)
// equals the label.
void CrossEntropy(const Output& out, const Labels& labels,
                  double label_smoothing, double* slots);

// Hinton distillation with hard labels over the non-ignored rows:
// loss = alpha T^2 KL(softmax(teacher/T) || softmax(out/T))
//        + (1 - alpha) CE(out, labels), each the mean over those rows
// (KLDivLoss "batchmean"); w = their count; teacher float32 [rows, cols].
// Bad labels as for CrossEntropy. Partials: [4] sum of KL, [5] sum of CE,
// [6] correct.
void Distillation(const Output& out, const float* teacher, const Labels& labels,
                  double temperature, double alpha, double* slots);

// Numerically stable log-softmax of n logits scaled by `scale`, in double:
// out[c] = scale x[c] - logsumexp(scale x).
void LogSoftmaxRow(const float* x, int64_t n, double scale, double* out);

}  // namespace losses
}  // namespace trainyard

#endif  // TRAINYARD_KERNELS_LOSSES_H_
