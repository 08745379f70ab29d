// Element-wise device kernels of the MLP block: bias + activation forward
// (keeping the pre-activation), their backward passes, SwiGLU, bias +
// residual add, deterministic column sums (bias gradients) and dtype casts
// (float32 <-> bfloat16, float16 -> float32 or bfloat16).
// Formulas are those of kernels/activation.h (PyTorch's): relu; exact gelu
// x/2 (1 + erf(x/sqrt 2)) computed with erff (cuBLASLt has no epilogue for
// it); gelu_tanh; swiglu silu(a) * b over the two halves of each row.
//
// Activations are DType::kFloat32 or DType::kBFloat16 (`dtype`; any other
// DType is InvalidArgument naming it); bfloat16 values are computed in
// float32 and rounded once. Bias vectors and sums are float32. `act` is the
// engine's Activation (core/block_config.h): kRelu, kGelu or kGeluTanh here;
// kSwiglu has its own launchers and is InvalidArgument elsewhere.
// Every launcher enqueues on `stream`, checks its arguments (InvalidArgument
// naming the argument) and the launch (the CUDA error). Thread-safe.
#ifndef TRAINYARD_KERNELS_CUDA_ELEMENTWISE_KERNELS_H_
#define TRAINYARD_KERNELS_CUDA_ELEMENTWISE_KERNELS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "core/block_config.h"
#include "core/tensor.h"
#include "kernels/cuda/runtime.h"

namespace trainyard {
namespace gpu {

// pre [rows, cols] += bias [cols] (skipped when bias is null);
// out [rows, cols] = act(pre).
absl::Status BiasActivationForward(Activation act, DType dtype, int64_t rows,
                                   int64_t cols, const float* bias, void* pre,
                                   void* out, Stream stream);

// d_pre [n] = d_out [n] * act'(pre [n]); d_pre may equal d_out.
absl::Status ActivationBackward(Activation act, DType dtype, int64_t n,
                                const void* pre, const void* d_out, void* d_pre,
                                Stream stream);

// pre [rows, 2*ffn] += bias [2*ffn] (skipped when null);
// out [rows, ffn] = silu(pre[:, :ffn]) * pre[:, ffn:].
absl::Status BiasSwigluForward(DType dtype, int64_t rows, int64_t ffn,
                               const float* bias, void* pre, void* out,
                               Stream stream);

// d_pre [rows, 2*ffn] from d_out [rows, ffn] and pre [rows, 2*ffn].
absl::Status SwigluBackward(DType dtype, int64_t rows, int64_t ffn,
                            const void* pre, const void* d_out, void* d_pre,
                            Stream stream);

// y [rows, cols] += bias [cols] (when non-null) + residual [rows, cols]
// (when non-null).
absl::Status AddBiasResidual(DType dtype, int64_t rows, int64_t cols,
                             const float* bias, const void* residual, void* y,
                             Stream stream);

// out [cols] (+)= sum over rows of x [rows, cols], accumulated in double in
// a fixed order that depends only on `rows` (per column, 16 interleaved
// partial sums over rows r = l, l + 16, ... in increasing order, then added
// in order l = 0..15, then rounded once to float32): the same bits on every
// run and device. One block per 32 columns, reads coalesced across columns.
absl::Status ColumnSums(DType dtype, int64_t rows, int64_t cols, const void* x,
                        bool accumulate, float* out, Stream stream);

// dst [n] = src [n] rounded to bfloat16 (nearest even) / widened to float32.
absl::Status CastFloatToBf16(int64_t n, const float* src, void* dst,
                             Stream stream);
absl::Status CastBf16ToFloat(int64_t n, const void* src, float* dst,
                             Stream stream);

// dst [n] = float16 src [n] widened to float32 (exact; any NaN becomes
// 0x7FFFFFFF) / to float32 and then rounded to bfloat16 (nearest even, any
// NaN -> 0x7FFF): the bits of core/npy.h Float16ToFloat (but for NaN
// payloads, which it keeps) and core/bfloat16.h FloatToBf16 on the host.
absl::Status CastFloat16ToFloat(int64_t n, const void* src, float* dst,
                                Stream stream);
absl::Status CastFloat16ToBf16(int64_t n, const void* src, void* dst,
                               Stream stream);

}  // namespace gpu
}  // namespace trainyard

#endif  // TRAINYARD_KERNELS_CUDA_ELEMENTWISE_KERNELS_H_
