#include "kernels/losses.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/bfloat16.h"

namespace trainyard {
namespace losses {
namespace {

// Row r of the output as float32 (a pointer into it, or `scratch` widened
// from bfloat16).
const float* RowAt(const Output& out, int64_t r, std::vector<float>* scratch) {
  if (out.dtype == DType::kFloat32) {
    return static_cast<const float*>(out.data) + r * out.cols;
  }
  scratch->resize(out.cols);
  const uint16_t* row = static_cast<const uint16_t*>(out.data) + r * out.cols;
  for (int64_t c = 0; c < out.cols; ++c) (*scratch)[c] = Bf16ToFloat(row[c]);
  return scratch->data();
}

float ValueAt(const Output& out, int64_t i) {
  return out.dtype == DType::kFloat32
             ? static_cast<const float*>(out.data)[i]
             : Bf16ToFloat(static_cast<const uint16_t*>(out.data)[i]);
}

// Stores gradient element i: `g` is dLoss/dOutput in float32; `w` the
// loss weight (see the file comment).
void StoreGrad(const Output& out, int64_t i, float g, float w) {
  if (!out.weighted) {
    static_cast<float*>(out.grad)[i] = g;
    return;
  }
  const float v = g * w;
  if (out.dtype == DType::kFloat32) {
    static_cast<float*>(out.grad)[i] = v;
  } else {
    static_cast<uint16_t*>(out.grad)[i] = FloatToBf16(v);
  }
}

void ZeroGradRow(const Output& out, int64_t r) {
  for (int64_t c = 0; c < out.cols; ++c) StoreGrad(out, r * out.cols + c, 0, 1);
}

// Rows whose label is not ignored, or -1 after recording the first label
// outside [0, classes) in slots[2], slots[3].
int64_t CountValid(const Labels& labels, int64_t rows, int64_t classes,
                   double* slots) {
  int64_t n = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t y = LabelAt(labels, r);
    if (y == labels.ignore_index) continue;
    if (y < 0 || y >= classes) {
      slots[2] = static_cast<double>(r + 1);
      slots[3] = static_cast<double>(y);
      return -1;
    }
    ++n;
  }
  return n;
}

// CountValid over out's rows; when every label is ignored the gradient is
// zero (a classifier with nothing to learn from contributes nothing).
int64_t CountValidRows(const Output& out, const Labels& labels, double* slots) {
  const int64_t n = CountValid(labels, out.rows, out.cols, slots);
  if (n == 0 && out.grad != nullptr) {
    for (int64_t r = 0; r < out.rows; ++r) ZeroGradRow(out, r);
  }
  return n;
}

// Calls row(i, y) for each row i whose label y is not ignored, in row
// order; zeroes the gradient of the ignored rows.
template <typename F>
void ForEachLabeledRow(const Output& out, const Labels& labels, F row) {
  for (int64_t i = 0; i < out.rows; ++i) {
    const int64_t y = LabelAt(labels, i);
    if (y == labels.ignore_index) {
      if (out.grad != nullptr) ZeroGradRow(out, i);
      continue;
    }
    row(i, y);
  }
}

// slots[0] = w and slots[1] = w * loss.
void SetWeightedLoss(double w, double loss, double* slots) {
  slots[0] = w;
  slots[1] = slots[0] * loss;
}

// The first maximum of row[0, n).
int64_t ArgMax(const float* row, int64_t n) {
  int64_t best = 0;
  for (int64_t k = 1; k < n; ++k) {
    if (row[k] > row[best]) best = k;
  }
  return best;
}

}  // namespace

int64_t LabelAt(const Labels& labels, int64_t row) {
  return labels.dtype == DType::kInt32
             ? static_cast<const int32_t*>(labels.data)[row]
             : static_cast<const int64_t*>(labels.data)[row];
}

void LogSoftmaxRow(const float* x, int64_t n, double scale, double* out) {
  double m = -INFINITY;
  for (int64_t c = 0; c < n; ++c) m = std::max(m, scale * x[c]);
  double sum = 0;
  for (int64_t c = 0; c < n; ++c) sum += std::exp(scale * x[c] - m);
  const double lse = m + std::log(sum);
  for (int64_t c = 0; c < n; ++c) out[c] = scale * x[c] - lse;
}

void Mse(const Output& out, const float* target, double* slots) {
  std::fill(slots, slots + kMseSlots, 0.0);
  const int64_t n = out.rows * out.cols;
  if (n == 0) return;
  const float w = static_cast<float>(out.rows);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(ValueAt(out, i)) - target[i];
    sum += d * d;
    if (out.grad != nullptr) {
      StoreGrad(out, i, static_cast<float>(2.0 * d / n), w);
    }
  }
  SetWeightedLoss(static_cast<double>(out.rows), sum / n, slots);
  slots[4] = sum;
  slots[5] = static_cast<double>(n);
}

void CrossEntropy(const Output& out, const Labels& labels, double eps,
                  double* slots) {
  std::fill(slots, slots + kCrossEntropySlots, 0.0);
  const int64_t c = out.cols;
  const int64_t n = CountValidRows(out, labels, slots);
  if (n <= 0) return;
  const float w = static_cast<float>(n);
  std::vector<double> logp(c);
  std::vector<float> scratch;
  double sum = 0;
  int64_t correct = 0;
  ForEachLabeledRow(out, labels, [&](int64_t i, int64_t y) {
    const float* row = RowAt(out, i, &scratch);
    LogSoftmaxRow(row, c, 1.0, logp.data());
    double smooth = 0;
    for (int64_t k = 0; k < c; ++k) smooth -= logp[k];
    sum += (1 - eps) * -logp[y] + eps * smooth / c;
    if (ArgMax(row, c) == y) ++correct;
    if (out.grad != nullptr) {
      for (int64_t k = 0; k < c; ++k) {
        const double target = (k == y ? 1 - eps : 0.0) + eps / c;
        StoreGrad(out, i * c + k,
                  static_cast<float>((std::exp(logp[k]) - target) / n), w);
      }
    }
  });
  SetWeightedLoss(static_cast<double>(n), sum / n, slots);
  slots[4] = sum;
  slots[5] = static_cast<double>(correct);
}

void Distillation(const Output& out, const float* teacher, const Labels& labels,
                  double temperature, double alpha, double* slots) {
  std::fill(slots, slots + kDistillationSlots, 0.0);
  const int64_t c = out.cols;
  const int64_t n = CountValidRows(out, labels, slots);
  if (n <= 0) return;
  const double t = temperature;
  const float w = static_cast<float>(n);
  std::vector<double> log_q(c), log_p(c), log_s(c);
  std::vector<float> scratch;
  double kl_sum = 0, ce_sum = 0;
  int64_t correct = 0;
  ForEachLabeledRow(out, labels, [&](int64_t i, int64_t y) {
    const float* s = RowAt(out, i, &scratch);
    const float* z = teacher + i * c;
    LogSoftmaxRow(s, c, 1.0 / t, log_q.data());
    LogSoftmaxRow(z, c, 1.0 / t, log_p.data());
    LogSoftmaxRow(s, c, 1.0, log_s.data());
    double kl = 0;
    for (int64_t k = 0; k < c; ++k) {
      const double p = std::exp(log_p[k]);
      if (p > 0) kl += p * (log_p[k] - log_q[k]);  // xlogy: 0 log 0 = 0
    }
    kl_sum += kl;
    ce_sum += -log_s[y];
    correct += ArgMax(s, c) == y;
    if (out.grad != nullptr) {
      // d/ds [alpha T^2 KL] = alpha T (q - p); d/ds CE = softmax(s) - 1_y.
      for (int64_t k = 0; k < c; ++k) {
        const double dkl =
            alpha * t * (std::exp(log_q[k]) - std::exp(log_p[k]));
        const double dce = (1 - alpha) * (std::exp(log_s[k]) - (k == y));
        StoreGrad(out, i * c + k, static_cast<float>((dkl + dce) / n), w);
      }
    }
  });
  SetWeightedLoss(static_cast<double>(n),
                  alpha * t * t * kl_sum / n + (1 - alpha) * ce_sum / n, slots);
  slots[4] = kl_sum;
  slots[5] = ce_sum;
  slots[6] = static_cast<double>(correct);
}

}  // namespace losses
}  // namespace trainyard
