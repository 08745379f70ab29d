#include "kernels/reference.h"

#include <cmath>

namespace trainyard {
namespace reference {
namespace {

constexpr double kPi = 3.14159265358979323846;

double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Row r's mean and 1 / sqrt(var + eps) (biased variance) for LayerNorm.
struct RowStats {
  double mean, rstd;
};
RowStats LayerNormStats(const Vec& x, int64_t r, int64_t cols, double eps) {
  double mean = 0.0, var = 0.0;
  for (int64_t c = 0; c < cols; ++c) mean += x[r * cols + c];
  mean /= cols;
  for (int64_t c = 0; c < cols; ++c) {
    const double d = x[r * cols + c] - mean;
    var += d * d;
  }
  var /= cols;
  return {mean, 1.0 / std::sqrt(var + eps)};
}

// Row r's 1 / sqrt(mean(x^2) + eps) for RMSNorm.
double RmsNormRstd(const Vec& x, int64_t r, int64_t cols, double eps) {
  double ms = 0.0;
  for (int64_t c = 0; c < cols; ++c) ms += x[r * cols + c] * x[r * cols + c];
  return 1.0 / std::sqrt(ms / cols + eps);
}

}  // namespace

const char* ActivationName(Activation act) {
  switch (act) {
    case Activation::kRelu:
      return "relu";
    case Activation::kGelu:
      return "gelu";
    case Activation::kGeluTanh:
      return "gelu_tanh";
    case Activation::kSwiglu:
      return "swiglu";
  }
  return "?";
}

const char* NormName(NormType norm) {
  switch (norm) {
    case NormType::kNone:
      return "none";
    case NormType::kLayerNorm:
      return "layernorm";
    case NormType::kRmsNorm:
      return "rmsnorm";
  }
  return "?";
}

Vec Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
         const Vec& a, const Vec& b) {
  Vec c(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (int64_t l = 0; l < k; ++l) {
        const double av = trans_a ? a[l * m + i] : a[i * k + l];
        const double bv = trans_b ? b[j * k + l] : b[l * n + j];
        s += av * bv;
      }
      c[i * n + j] = s;
    }
  }
  return c;
}

double Act(Activation act, double x) {
  switch (act) {
    case Activation::kRelu:
      return x > 0 ? x : 0.0;
    case Activation::kGelu:
      return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case Activation::kGeluTanh:
      return 0.5 * x *
             (1.0 +
              std::tanh(std::sqrt(2.0 / kPi) * (x + 0.044715 * x * x * x)));
    case Activation::kSwiglu:
      break;
  }
  return std::nan("");
}

double ActGrad(Activation act, double x) {
  switch (act) {
    case Activation::kRelu:
      return x > 0 ? 1.0 : 0.0;
    case Activation::kGelu:
      return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))) +
             x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * kPi);
    case Activation::kGeluTanh: {
      const double u = std::sqrt(2.0 / kPi) * (x + 0.044715 * x * x * x);
      const double du = std::sqrt(2.0 / kPi) * (1.0 + 3.0 * 0.044715 * x * x);
      const double t = std::tanh(u);
      return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du;
    }
    case Activation::kSwiglu:
      break;
  }
  return std::nan("");
}

double Silu(double x) { return x * Sigmoid(x); }
double SiluGrad(double x) {
  const double s = Sigmoid(x);
  return s * (1.0 + x * (1.0 - s));
}

Vec LayerNorm(int64_t rows, int64_t cols, const Vec& x, const Vec& w,
              const Vec& b, double eps) {
  Vec y(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    const auto [mean, rstd] = LayerNormStats(x, r, cols, eps);
    for (int64_t c = 0; c < cols; ++c) {
      y[r * cols + c] =
          (x[r * cols + c] - mean) * rstd * w[c] + (b.empty() ? 0.0 : b[c]);
    }
  }
  return y;
}

void LayerNormBackward(int64_t rows, int64_t cols, const Vec& x, const Vec& w,
                       double eps, const Vec& dy, Vec* dx, Vec* dw, Vec* db) {
  dx->assign(rows * cols, 0.0);
  dw->assign(cols, 0.0);
  db->assign(cols, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const auto [mean, rstd] = LayerNormStats(x, r, cols, eps);
    double mean_g = 0.0, mean_gx = 0.0;
    for (int64_t c = 0; c < cols; ++c) {
      const double xhat = (x[r * cols + c] - mean) * rstd;
      const double g = dy[r * cols + c] * w[c];
      mean_g += g;
      mean_gx += g * xhat;
      (*dw)[c] += dy[r * cols + c] * xhat;
      (*db)[c] += dy[r * cols + c];
    }
    mean_g /= cols;
    mean_gx /= cols;
    for (int64_t c = 0; c < cols; ++c) {
      const double xhat = (x[r * cols + c] - mean) * rstd;
      const double g = dy[r * cols + c] * w[c];
      (*dx)[r * cols + c] = (g - mean_g - xhat * mean_gx) * rstd;
    }
  }
}

Vec RmsNorm(int64_t rows, int64_t cols, const Vec& x, const Vec& w,
            double eps) {
  Vec y(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    const double rstd = RmsNormRstd(x, r, cols, eps);
    for (int64_t c = 0; c < cols; ++c) {
      y[r * cols + c] = x[r * cols + c] * rstd * w[c];
    }
  }
  return y;
}

void RmsNormBackward(int64_t rows, int64_t cols, const Vec& x, const Vec& w,
                     double eps, const Vec& dy, Vec* dx, Vec* dw) {
  dx->assign(rows * cols, 0.0);
  dw->assign(cols, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const double rstd = RmsNormRstd(x, r, cols, eps);
    double mean_gx = 0.0;
    for (int64_t c = 0; c < cols; ++c) {
      const double xhat = x[r * cols + c] * rstd;
      mean_gx += dy[r * cols + c] * w[c] * xhat;
      (*dw)[c] += dy[r * cols + c] * xhat;
    }
    mean_gx /= cols;
    for (int64_t c = 0; c < cols; ++c) {
      const double xhat = x[r * cols + c] * rstd;
      (*dx)[r * cols + c] = (dy[r * cols + c] * w[c] - xhat * mean_gx) * rstd;
    }
  }
}

namespace {

struct Intermediates {
  Vec norm_out, pre, act;
};

// The activation of pre-activation i ([b, ffn] index), or its derivative,
// with relu decided by `mask` when given.
double Activate(const MlpBlockConfig& c, const ReluMask* mask, int64_t i,
                double x, bool derivative) {
  if (c.activation == Activation::kRelu && mask != nullptr) {
    return (*mask)[i] ? (derivative ? 1.0 : x) : 0.0;
  }
  return derivative ? ActGrad(c.activation, x) : Act(c.activation, x);
}

Vec Forward(const MlpBlockConfig& c, const BlockParams& p, int64_t b,
            const Vec& x, Intermediates* t, const ReluMask* mask) {
  const int64_t in = c.in_features, out = c.out_features,
                ffn = c.ffn_hidden_size, f1 = c.fc1_out();
  switch (c.norm) {
    case NormType::kNone:
      t->norm_out = x;
      break;
    case NormType::kLayerNorm:
      t->norm_out = LayerNorm(b, in, x, p.norm_weight, p.norm_bias, c.norm_eps);
      break;
    case NormType::kRmsNorm:
      t->norm_out = RmsNorm(b, in, x, p.norm_weight, c.norm_eps);
      break;
  }
  t->pre = Gemm(false, true, b, f1, in, t->norm_out, p.fc1_weight);
  if (c.bias) {
    for (int64_t i = 0; i < b * f1; ++i) t->pre[i] += p.fc1_bias[i % f1];
  }
  t->act.assign(b * ffn, 0.0);
  for (int64_t r = 0; r < b; ++r) {
    for (int64_t j = 0; j < ffn; ++j) {
      t->act[r * ffn + j] =
          c.activation == Activation::kSwiglu
              ? Silu(t->pre[r * f1 + j]) * t->pre[r * f1 + ffn + j]
              : Activate(c, mask, r * ffn + j, t->pre[r * f1 + j], false);
    }
  }
  Vec y = Gemm(false, true, b, out, ffn, t->act, p.fc2_weight);
  for (int64_t i = 0; i < b * out; ++i) {
    if (c.bias) y[i] += p.fc2_bias[i % out];
    if (c.residual) y[i] += x[i];
  }
  return y;
}

Vec ColSums(int64_t rows, int64_t cols, const Vec& g) {
  Vec s(cols, 0.0);
  for (int64_t i = 0; i < rows * cols; ++i) s[i % cols] += g[i];
  return s;
}

}  // namespace

Vec BlockForward(const MlpBlockConfig& c, const BlockParams& p, int64_t b,
                 const Vec& x, const ReluMask* relu_mask) {
  Intermediates t;
  return Forward(c, p, b, x, &t, relu_mask);
}

void BlockBackward(const MlpBlockConfig& c, const BlockParams& p, int64_t b,
                   const Vec& x, const Vec& dy, Vec* dx, BlockParams* g,
                   const ReluMask* relu_mask) {
  const int64_t in = c.in_features, out = c.out_features,
                ffn = c.ffn_hidden_size, f1 = c.fc1_out();
  Intermediates t;
  Forward(c, p, b, x, &t, relu_mask);
  *g = BlockParams();
  g->fc2_weight = Gemm(true, false, out, ffn, b, dy, t.act);
  if (c.bias) g->fc2_bias = ColSums(b, out, dy);
  const Vec d_act = Gemm(false, false, b, ffn, out, dy, p.fc2_weight);
  Vec d_pre(b * f1, 0.0);
  for (int64_t r = 0; r < b; ++r) {
    for (int64_t j = 0; j < ffn; ++j) {
      const double g_act = d_act[r * ffn + j];
      if (c.activation == Activation::kSwiglu) {
        const double a = t.pre[r * f1 + j], bb = t.pre[r * f1 + ffn + j];
        d_pre[r * f1 + j] = g_act * bb * SiluGrad(a);
        d_pre[r * f1 + ffn + j] = g_act * Silu(a);
      } else {
        d_pre[r * f1 + j] = g_act * Activate(c, relu_mask, r * ffn + j,
                                             t.pre[r * f1 + j], true);
      }
    }
  }
  g->fc1_weight = Gemm(true, false, f1, in, b, d_pre, t.norm_out);
  if (c.bias) g->fc1_bias = ColSums(b, f1, d_pre);
  const Vec d_norm_out = Gemm(false, false, b, in, f1, d_pre, p.fc1_weight);
  switch (c.norm) {
    case NormType::kNone:
      *dx = d_norm_out;
      break;
    case NormType::kLayerNorm:
      LayerNormBackward(b, in, x, p.norm_weight, c.norm_eps, d_norm_out, dx,
                        &g->norm_weight, &g->norm_bias);
      break;
    case NormType::kRmsNorm:
      RmsNormBackward(b, in, x, p.norm_weight, c.norm_eps, d_norm_out, dx,
                      &g->norm_weight);
      break;
  }
  if (c.residual) {
    for (int64_t i = 0; i < b * in; ++i) (*dx)[i] += dy[i];
  }
}

Vec RandomVec(Rng* rng, int64_t n, double scale) {
  Vec v(n);
  for (double& x : v) x = static_cast<float>(rng->Normal() * scale);
  return v;
}

std::vector<float> ToFloat(const Vec& v) {
  return std::vector<float>(v.begin(), v.end());
}

double NormRel(const float* actual, const Vec& expected) {
  double num = 0, den = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double d = actual[i] - expected[i];
    num += d * d;
    den += expected[i] * expected[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

::testing::AssertionResult NormRelClose(const char* what, const float* actual,
                                        const Vec& expected, double tol) {
  const double r = NormRel(actual, expected);
  if (r <= tol) return ::testing::AssertionSuccess();
  size_t worst = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (!(std::fabs(actual[i] - expected[i]) <=
          std::fabs(actual[worst] - expected[worst]))) {
      worst = i;
    }
  }
  return ::testing::AssertionFailure()
         << what << ": ||got - want|| / ||want|| = " << r << " > " << tol
         << " over " << expected.size() << " elements; worst [" << worst
         << "] = " << actual[worst] << ", expected " << expected[worst];
}

::testing::AssertionResult AllClose(const char* what, const float* actual,
                                    const Vec& expected, double rtol,
                                    double atol) {
  int64_t worst = -1;
  double worst_ratio = 0.0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double err = std::fabs(actual[i] - expected[i]);
    const double ratio = err / (atol + rtol * std::fabs(expected[i]));
    if (!(ratio <= worst_ratio)) {  // also catches NaN
      worst_ratio = ratio;
      worst = static_cast<int64_t>(i);
    }
    if (std::isnan(ratio)) break;
  }
  if (worst < 0 || worst_ratio <= 1.0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << "[" << worst << "] = " << actual[worst] << ", expected "
         << expected[worst] << " (error " << worst_ratio
         << "x the tolerance rtol=" << rtol << " atol=" << atol << ", "
         << expected.size() << " elements)";
}

}  // namespace reference
}  // namespace trainyard
