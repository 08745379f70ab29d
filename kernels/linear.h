// The element-wise parts of nn.Linear around its GEMM: adding the bias (and
// a skip connection) to the output, and the bias gradient.
//
// Column sums add rows in row order, threaded over ranges of columns
// (kernels/parallel.h): results are the same bits on every run, thread
// count and ISA. Stateless, thread-safe. Pointers must not overlap.
#ifndef TRAINYARD_KERNELS_LINEAR_H_
#define TRAINYARD_KERNELS_LINEAR_H_

#include <cstdint>

namespace trainyard {

// y [rows, cols] += bias [cols] + residual [rows, cols], in one pass; either
// may be null (both null: no-op).
void AddBiasResidual(int64_t rows, int64_t cols, const float* bias,
                     const float* residual, float* y);

// out [cols] = column sums of g [rows, cols] (the bias gradient), or
// out += those sums when accumulate.
void ColumnSums(int64_t rows, int64_t cols, const float* g, bool accumulate,
                float* out);

}  // namespace trainyard

#endif  // TRAINYARD_KERNELS_LINEAR_H_
