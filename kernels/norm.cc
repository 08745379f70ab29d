#include "kernels/norm.h"

#include <cmath>
#include <vector>

#include "kernels/fast_math.h"
#include "kernels/parallel.h"

namespace trainyard {
namespace {

constexpr int kLanes = 16;

// Sum of f(i) for i in [0, n): lane l accumulates i = l (mod kLanes) in
// order, then lanes combine in a fixed tree. Same order on every ISA.
template <typename F>
inline __attribute__((always_inline)) float LaneSum(int64_t n, F f) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[l] += f(i + l);
  }
  for (int l = 0; i + l < n; ++l) acc[l] += f(i + l);
  for (int width = kLanes / 2; width > 0; width /= 2) {
    for (int l = 0; l < width; ++l) acc[l] += acc[l + width];
  }
  return acc[0];
}

// out[c] (+)= sum over rows of f(r, c), rows in order, for c in
// [begin, end).
template <typename F>
inline __attribute__((always_inline)) void RowSumsInto(
    int64_t rows, int64_t begin, int64_t end, bool accumulate,
    float* __restrict out, F f) {
  std::vector<float> sum(end - begin, 0.0f);
  float* __restrict s = sum.data();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = begin; c < end; ++c) s[c - begin] += f(r, c);
  }
  if (accumulate) {
    for (int64_t c = begin; c < end; ++c) out[c] += s[c - begin];
  } else {
    for (int64_t c = begin; c < end; ++c) out[c] = s[c - begin];
  }
}

// Row r of dx [rows, cols] for a backward-input pass: dx[r][c] = v(c),
// plus residual[r][c] (a skip connection's gradient) when `residual` is not
// null.
template <typename F>
inline __attribute__((always_inline)) void StoreDxRow(int64_t r, int64_t cols,
                                                      const float* residual,
                                                      float* dx, F v) {
  float* __restrict out = dx + r * cols;
  if (residual != nullptr) {
    const float* __restrict res = residual + r * cols;
    for (int64_t c = 0; c < cols; ++c) out[c] = v(c) + res[c];
  } else {
    for (int64_t c = 0; c < cols; ++c) out[c] = v(c);
  }
}

}  // namespace

TY_VECTOR_CLONES
void LayerNormForward(int64_t rows, int64_t cols, const float* x,
                      const float* weight, const float* bias, float eps,
                      float* y, float* mean, float* rstd) {
  const float inv_n = 1.0f / static_cast<float>(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict xr = x + r * cols;
    float* __restrict yr = y + r * cols;
    const float* __restrict w = weight;
    const float m = LaneSum(cols, [xr](int64_t i) { return xr[i]; }) * inv_n;
    const float var = LaneSum(cols,
                              [xr, m](int64_t i) {
                                const float d = xr[i] - m;
                                return d * d;
                              }) *
                      inv_n;
    const float rs = 1.0f / std::sqrt(var + eps);
    mean[r] = m;
    rstd[r] = rs;
    if (bias != nullptr) {
      const float* __restrict b = bias;
      for (int64_t c = 0; c < cols; ++c) yr[c] = (xr[c] - m) * rs * w[c] + b[c];
    } else {
      for (int64_t c = 0; c < cols; ++c) yr[c] = (xr[c] - m) * rs * w[c];
    }
  }
}

TY_VECTOR_CLONES
void LayerNormBackwardInput(int64_t rows, int64_t cols, const float* x,
                            const float* weight, const float* mean,
                            const float* rstd, const float* dy,
                            const float* residual, float* dx) {
  const float inv_n = 1.0f / static_cast<float>(cols);
  const float* __restrict w = weight;
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict xr = x + r * cols;
    const float* __restrict g = dy + r * cols;
    const float m = mean[r];
    const float rs = rstd[r];
    const float mean_g =
        LaneSum(cols, [g, w](int64_t i) { return g[i] * w[i]; }) * inv_n;
    const float mean_gx =
        LaneSum(cols,
                [=](int64_t i) { return g[i] * w[i] * ((xr[i] - m) * rs); }) *
        inv_n;
    StoreDxRow(r, cols, residual, dx, [=](int64_t c) {
      const float xhat = (xr[c] - m) * rs;
      return (g[c] * w[c] - mean_g - xhat * mean_gx) * rs;
    });
  }
}

namespace {

// LayerNormBackwardParams over columns [begin, end).
TY_VECTOR_CLONES
void LayerNormParamsRange(int64_t rows, int64_t cols, int64_t begin,
                          int64_t end, const float* x, const float* mean,
                          const float* rstd, const float* dy, bool accumulate,
                          float* d_weight, float* d_bias) {
  const float* __restrict xp = x;
  const float* __restrict g = dy;
  RowSumsInto(
      rows, begin, end, accumulate, d_weight, [=](int64_t r, int64_t c) {
        return g[r * cols + c] * ((xp[r * cols + c] - mean[r]) * rstd[r]);
      });
  if (d_bias != nullptr) {
    RowSumsInto(rows, begin, end, accumulate, d_bias,
                [=](int64_t r, int64_t c) { return g[r * cols + c]; });
  }
}

// RmsNormBackwardParams over columns [begin, end).
TY_VECTOR_CLONES
void RmsNormParamsRange(int64_t rows, int64_t cols, int64_t begin, int64_t end,
                        const float* x, const float* rstd, const float* dy,
                        bool accumulate, float* d_weight) {
  const float* __restrict xp = x;
  const float* __restrict g = dy;
  RowSumsInto(rows, begin, end, accumulate, d_weight,
              [=](int64_t r, int64_t c) {
                return g[r * cols + c] * (xp[r * cols + c] * rstd[r]);
              });
}

}  // namespace

void LayerNormBackwardParams(int64_t rows, int64_t cols, const float* x,
                             const float* mean, const float* rstd,
                             const float* dy, bool accumulate, float* d_weight,
                             float* d_bias) {
  ParallelColumns(cols, [&](int64_t begin, int64_t end) {
    LayerNormParamsRange(rows, cols, begin, end, x, mean, rstd, dy, accumulate,
                         d_weight, d_bias);
  });
}

TY_VECTOR_CLONES
void RmsNormForward(int64_t rows, int64_t cols, const float* x,
                    const float* weight, float eps, float* y, float* rstd) {
  const float inv_n = 1.0f / static_cast<float>(cols);
  const float* __restrict w = weight;
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict xr = x + r * cols;
    float* __restrict yr = y + r * cols;
    const float ms =
        LaneSum(cols, [xr](int64_t i) { return xr[i] * xr[i]; }) * inv_n;
    const float rs = 1.0f / std::sqrt(ms + eps);
    rstd[r] = rs;
    for (int64_t c = 0; c < cols; ++c) yr[c] = xr[c] * rs * w[c];
  }
}

TY_VECTOR_CLONES
void RmsNormBackwardInput(int64_t rows, int64_t cols, const float* x,
                          const float* weight, const float* rstd,
                          const float* dy, const float* residual, float* dx) {
  const float inv_n = 1.0f / static_cast<float>(cols);
  const float* __restrict w = weight;
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict xr = x + r * cols;
    const float* __restrict g = dy + r * cols;
    const float rs = rstd[r];
    const float mean_gx =
        LaneSum(cols, [=](int64_t i) { return g[i] * w[i] * (xr[i] * rs); }) *
        inv_n;
    StoreDxRow(r, cols, residual, dx, [=](int64_t c) {
      return (g[c] * w[c] - (xr[c] * rs) * mean_gx) * rs;
    });
  }
}

void RmsNormBackwardParams(int64_t rows, int64_t cols, const float* x,
                           const float* rstd, const float* dy, bool accumulate,
                           float* d_weight) {
  ParallelColumns(cols, [&](int64_t begin, int64_t end) {
    RmsNormParamsRange(rows, cols, begin, end, x, rstd, dy, accumulate,
                       d_weight);
  });
}

}  // namespace trainyard
