// LayerNorm and RMSNorm over the last dimension, forward and backward, in
// float32, like torch.nn.LayerNorm (weight and optional bias, biased
// variance) and torch.nn.RMSNorm (weight only, y = x rsqrt(mean(x^2)+eps) w).
//
// Row reductions use 16 interleaved partial sums combined in a fixed tree,
// so they vectorise and give the same bits on every ISA and run. Parameter
// gradients sum over rows in row order, threaded over ranges of columns
// (kernels/parallel.h; the same bits on any thread count); the other
// kernels run on the calling thread (the MLP block threads them over
// rows). Stateless, thread-safe. Pointers must not overlap.
#ifndef TRAINYARD_KERNELS_NORM_H_
#define TRAINYARD_KERNELS_NORM_H_

#include <cstdint>

namespace trainyard {

// y [rows, cols] = (x - mean) * rstd * weight + bias (bias may be null);
// writes mean [rows] and rstd [rows] = 1/sqrt(var + eps).
void LayerNormForward(int64_t rows, int64_t cols, const float* x,
                      const float* weight, const float* bias, float eps,
                      float* y, float* mean, float* rstd);

// dx [rows, cols] = dL/dx from dy (plus residual [rows, cols] when non-null,
// which fuses a skip connection's gradient into the same pass).
void LayerNormBackwardInput(int64_t rows, int64_t cols, const float* x,
                            const float* weight, const float* mean,
                            const float* rstd, const float* dy,
                            const float* residual, float* dx);

// d_weight [cols] (and d_bias [cols] when non-null) = sums over rows of
// dy * xhat (and dy); added to the existing values when accumulate.
void LayerNormBackwardParams(int64_t rows, int64_t cols, const float* x,
                             const float* mean, const float* rstd,
                             const float* dy, bool accumulate, float* d_weight,
                             float* d_bias);

// y [rows, cols] = x * rstd * weight; rstd [rows] = 1/sqrt(mean(x^2) + eps).
void RmsNormForward(int64_t rows, int64_t cols, const float* x,
                    const float* weight, float eps, float* y, float* rstd);

void RmsNormBackwardInput(int64_t rows, int64_t cols, const float* x,
                          const float* weight, const float* rstd,
                          const float* dy, const float* residual, float* dx);

void RmsNormBackwardParams(int64_t rows, int64_t cols, const float* x,
                           const float* rstd, const float* dy, bool accumulate,
                           float* d_weight);

}  // namespace trainyard

#endif  // TRAINYARD_KERNELS_NORM_H_
