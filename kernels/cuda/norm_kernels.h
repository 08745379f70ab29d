// LayerNorm and RMSNorm on the device, forward and backward, with the
// semantics of kernels/norm.h (torch.nn.LayerNorm with biased variance,
// torch.nn.RMSNorm). One warp per row; statistics and sums in float32
// (rows) or double (parameter gradients: a two-stage column reduction over
// chunks of rows in a fixed order, deterministic, with a workspace of
// NormParamsWorkspaceBytes). x, y, dy, dx, residual are `dtype`
// (DType::kFloat32 or DType::kBFloat16; any other is InvalidArgument naming
// it); weight, bias, mean, rstd and parameter gradients are float32.
// Launchers enqueue on `stream` and return InvalidArgument for bad
// arguments, the CUDA error for a failed launch. Thread-safe.
#ifndef TRAINYARD_KERNELS_CUDA_NORM_KERNELS_H_
#define TRAINYARD_KERNELS_CUDA_NORM_KERNELS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "core/tensor.h"
#include "kernels/cuda/runtime.h"

namespace trainyard {
namespace gpu {

// y [rows, cols] = (x - mean) * rstd * weight + bias (bias may be null);
// mean [rows], rstd [rows] = 1/sqrt(var + eps).
absl::Status LayerNormForward(DType dtype, int64_t rows, int64_t cols,
                              const void* x, const float* weight,
                              const float* bias, float eps, void* y,
                              float* mean, float* rstd, Stream stream);

// dx [rows, cols] = dL/dx from dy (+ residual [rows, cols] when non-null).
absl::Status LayerNormBackwardInput(DType dtype, int64_t rows, int64_t cols,
                                    const void* x, const float* weight,
                                    const float* mean, const float* rstd,
                                    const void* dy, const void* residual,
                                    void* dx, Stream stream);

// Device bytes of the parameter-gradient launchers' workspace.
size_t NormParamsWorkspaceBytes(int64_t rows, int64_t cols);

// d_weight [cols] (+)= sum_rows dy * xhat; d_bias [cols] (+)= sum_rows dy
// (d_bias may be null). `workspace`: NormParamsWorkspaceBytes(rows, cols).
absl::Status LayerNormBackwardParams(DType dtype, int64_t rows, int64_t cols,
                                     const void* x, const float* mean,
                                     const float* rstd, const void* dy,
                                     bool accumulate, float* d_weight,
                                     float* d_bias, void* workspace,
                                     Stream stream);

// y [rows, cols] = x * rstd * weight; rstd [rows] = 1/sqrt(mean(x^2) + eps).
absl::Status RmsNormForward(DType dtype, int64_t rows, int64_t cols,
                            const void* x, const float* weight, float eps,
                            void* y, float* rstd, Stream stream);

absl::Status RmsNormBackwardInput(DType dtype, int64_t rows, int64_t cols,
                                  const void* x, const float* weight,
                                  const float* rstd, const void* dy,
                                  const void* residual, void* dx,
                                  Stream stream);

absl::Status RmsNormBackwardParams(DType dtype, int64_t rows, int64_t cols,
                                   const void* x, const float* rstd,
                                   const void* dy, bool accumulate,
                                   float* d_weight, void* workspace,
                                   Stream stream);

}  // namespace gpu
}  // namespace trainyard

#endif  // TRAINYARD_KERNELS_CUDA_NORM_KERNELS_H_
