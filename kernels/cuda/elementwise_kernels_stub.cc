// elementwise_kernels.h without a CUDA toolkit: every launcher fails cleanly.
#include "kernels/cuda/elementwise_kernels.h"
#include "kernels/cuda/no_cuda.h"

namespace trainyard {
namespace gpu {
absl::Status BiasActivationForward(Activation act, DType dtype, int64_t rows,
                                   int64_t cols, const float* bias, void* pre,
                                   void* out, Stream stream) {
  return NoCuda("BiasActivationForward");
}

absl::Status ActivationBackward(Activation act, DType dtype, int64_t n,
                                const void* pre, const void* d_out, void* d_pre,
                                Stream stream) {
  return NoCuda("ActivationBackward");
}

absl::Status BiasSwigluForward(DType dtype, int64_t rows, int64_t ffn,
                               const float* bias, void* pre, void* out,
                               Stream stream) {
  return NoCuda("BiasSwigluForward");
}

absl::Status SwigluBackward(DType dtype, int64_t rows, int64_t ffn,
                            const void* pre, const void* d_out, void* d_pre,
                            Stream stream) {
  return NoCuda("SwigluBackward");
}

absl::Status AddBiasResidual(DType dtype, int64_t rows, int64_t cols,
                             const float* bias, const void* residual, void* y,
                             Stream stream) {
  return NoCuda("AddBiasResidual");
}

absl::Status ColumnSums(DType dtype, int64_t rows, int64_t cols, const void* x,
                        bool accumulate, float* out, Stream stream) {
  return NoCuda("ColumnSums");
}

absl::Status CastFloatToBf16(int64_t n, const float* src, void* dst,
                             Stream stream) {
  return NoCuda("CastFloatToBf16");
}

absl::Status CastBf16ToFloat(int64_t n, const void* src, float* dst,
                             Stream stream) {
  return NoCuda("CastBf16ToFloat");
}

absl::Status CastFloat16ToFloat(int64_t n, const void* src, float* dst,
                                Stream stream) {
  return NoCuda("CastFloat16ToFloat");
}

absl::Status CastFloat16ToBf16(int64_t n, const void* src, void* dst,
                               Stream stream) {
  return NoCuda("CastFloat16ToBf16");
}

}  // namespace gpu
}  // namespace trainyard
