#include "kernels/linear.h"

#include <vector>

#include "kernels/fast_math.h"
#include "kernels/parallel.h"

namespace trainyard {

TY_VECTOR_CLONES
void AddBiasResidual(int64_t rows, int64_t cols, const float* bias,
                     const float* residual, float* y) {
  const float* __restrict b = bias;
  for (int64_t r = 0; r < rows; ++r) {
    float* __restrict yr = y + r * cols;
    if (bias != nullptr && residual != nullptr) {
      const float* __restrict res = residual + r * cols;
      for (int64_t c = 0; c < cols; ++c) yr[c] = yr[c] + b[c] + res[c];
    } else if (bias != nullptr) {
      for (int64_t c = 0; c < cols; ++c) yr[c] += b[c];
    } else if (residual != nullptr) {
      const float* __restrict res = residual + r * cols;
      for (int64_t c = 0; c < cols; ++c) yr[c] += res[c];
    }
  }
}

namespace {

// ColumnSums over columns [0, cols) of g, whose rows are `ld` apart.
TY_VECTOR_CLONES
void ColumnSumsBlock(int64_t rows, int64_t cols, int64_t ld, const float* g,
                     bool accumulate, float* out) {
  // Sum into a zeroed row first so that accumulate and overwrite give the
  // same sums (out + sum versus 0 + sum).
  std::vector<float> sum(cols, 0.0f);
  float* __restrict s = sum.data();
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict gr = g + r * ld;
    for (int64_t c = 0; c < cols; ++c) s[c] += gr[c];
  }
  float* __restrict o = out;
  if (accumulate) {
    for (int64_t c = 0; c < cols; ++c) o[c] += s[c];
  } else {
    for (int64_t c = 0; c < cols; ++c) o[c] = s[c];
  }
}

}  // namespace

void ColumnSums(int64_t rows, int64_t cols, const float* g, bool accumulate,
                float* out) {
  // Each column is summed over the rows in row order, whichever range of
  // columns it falls in: the same bits for any cut and thread count.
  ParallelColumns(cols, [&](int64_t begin, int64_t end) {
    ColumnSumsBlock(rows, end - begin, cols, g + begin, accumulate,
                    out + begin);
  });
}

}  // namespace trainyard
