// Element-wise activations of the MLP block, forward fused with the fc1
// bias, and their backward passes.
//
// Forward kernels make one pass over fc1's GEMM output: add the bias, keep
// the pre-activation (needed by backward) and write the activation. Formulas
// follow PyTorch: relu; gelu = x/2 (1 + erf(x/sqrt 2)) (F.gelu default);
// gelu_tanh = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (approximate=
// "tanh", computed as x * sigmoid(2u), the same function); swiglu: the
// first half a of each row through SiLU times the second half b, silu(a) * b.
//
// Outputs depend only on the inputs: no threads, and the same bits on every
// ISA (see fast_math.h). Accuracy against float64 is checked in
// activation_test.cc. Pointers must not overlap unless stated. Stateless
// and thread-safe.
#ifndef TRAINYARD_KERNELS_ACTIVATION_H_
#define TRAINYARD_KERNELS_ACTIVATION_H_

#include <cstdint>

namespace trainyard {

// pre [rows, cols] += bias [cols] (skipped when bias is null);
// out [rows, cols] = act(pre).
void BiasReluForward(int64_t rows, int64_t cols, const float* bias, float* pre,
                     float* out);
void BiasGeluForward(int64_t rows, int64_t cols, const float* bias, float* pre,
                     float* out);
void BiasGeluTanhForward(int64_t rows, int64_t cols, const float* bias,
                         float* pre, float* out);
// pre [rows, 2*ffn] += bias [2*ffn] (skipped when null);
// out [rows, ffn] = silu(pre[:, :ffn]) * pre[:, ffn:].
void BiasSwigluForward(int64_t rows, int64_t ffn, const float* bias, float* pre,
                       float* out);

// In place: grad [n] comes in as dL/d(activation output) and leaves as
// dL/d(pre-activation), given pre [n].
void ReluBackward(int64_t n, const float* pre, float* grad);
void GeluBackward(int64_t n, const float* pre, float* grad);
void GeluTanhBackward(int64_t n, const float* pre, float* grad);
// d_pre [rows, 2*ffn] from d_out [rows, ffn] and pre [rows, 2*ffn].
void SwigluBackward(int64_t rows, int64_t ffn, const float* pre,
                    const float* d_out, float* d_pre);

}  // namespace trainyard

#endif  // TRAINYARD_KERNELS_ACTIVATION_H_
