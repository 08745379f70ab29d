// norm_kernels.h without a CUDA toolkit: every launcher fails cleanly.
#include "kernels/cuda/no_cuda.h"
#include "kernels/cuda/norm_kernels.h"

namespace trainyard {
namespace gpu {
absl::Status LayerNormForward(DType dtype, int64_t rows, int64_t cols,
                              const void* x, const float* weight,
                              const float* bias, float eps, void* y,
                              float* mean, float* rstd, Stream stream) {
  return NoCuda("LayerNormForward");
}

absl::Status LayerNormBackwardInput(DType dtype, int64_t rows, int64_t cols,
                                    const void* x, const float* weight,
                                    const float* mean, const float* rstd,
                                    const void* dy, const void* residual,
                                    void* dx, Stream stream) {
  return NoCuda("LayerNormBackwardInput");
}

size_t NormParamsWorkspaceBytes(int64_t, int64_t) { return 0; }

absl::Status LayerNormBackwardParams(DType dtype, int64_t rows, int64_t cols,
                                     const void* x, const float* mean,
                                     const float* rstd, const void* dy,
                                     bool accumulate, float* d_weight,
                                     float* d_bias, void* workspace,
                                     Stream stream) {
  return NoCuda("LayerNormBackwardParams");
}

absl::Status RmsNormForward(DType dtype, int64_t rows, int64_t cols,
                            const void* x, const float* weight, float eps,
                            void* y, float* rstd, Stream stream) {
  return NoCuda("RmsNormForward");
}

absl::Status RmsNormBackwardInput(DType dtype, int64_t rows, int64_t cols,
                                  const void* x, const float* weight,
                                  const float* rstd, const void* dy,
                                  const void* residual, void* dx,
                                  Stream stream) {
  return NoCuda("RmsNormBackwardInput");
}

absl::Status RmsNormBackwardParams(DType dtype, int64_t rows, int64_t cols,
                                   const void* x, const float* rstd,
                                   const void* dy, bool accumulate,
                                   float* d_weight, void* workspace,
                                   Stream stream) {
  return NoCuda("RmsNormBackwardParams");
}

}  // namespace gpu
}  // namespace trainyard
