#include "kernels/activation.h"

#include "kernels/fast_math.h"

namespace trainyard {
namespace {

using fast_math::Erf;
using fast_math::Exp;
using fast_math::Sigmoid;

constexpr float kSqrtHalf = 0.70710678118654752f;     // 1/sqrt(2)
constexpr float kInvSqrt2Pi = 0.39894228040143268f;   // 1/sqrt(2 pi)
constexpr float kSqrt2OverPi = 0.79788456080286536f;  // sqrt(2/pi)
constexpr float kGeluTanhCubic = 0.044715f;

// A NaN passes through, as in torch.relu (a NaN input must not turn into
// finite outputs downstream, where nothing would notice it).
inline float Relu(float x) { return x <= 0.0f ? 0.0f : x; }

inline float Gelu(float x) { return x * 0.5f * (1.0f + Erf(x * kSqrtHalf)); }

inline float GeluGrad(float x) {
  const float cdf = 0.5f * (1.0f + Erf(x * kSqrtHalf));
  const float pdf = Exp(-0.5f * x * x) * kInvSqrt2Pi;
  return cdf + x * pdf;
}

// 0.5 (1 + tanh(u)) == sigmoid(2u).
inline float GeluTanh(float x) {
  const float u = kSqrt2OverPi * (x + kGeluTanhCubic * x * x * x);
  return x * Sigmoid(2.0f * u);
}

inline float GeluTanhGrad(float x) {
  const float u = kSqrt2OverPi * (x + kGeluTanhCubic * x * x * x);
  const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluTanhCubic * x * x);
  const float s = Sigmoid(2.0f * u);
  return s + x * (2.0f * s * (1.0f - s)) * du;
}

// One pass: pre += bias, out = f(pre). Inlined into each ISA clone.
template <typename F>
inline __attribute__((always_inline)) void BiasAct(int64_t rows, int64_t cols,
                                                   const float* __restrict bias,
                                                   float* __restrict pre,
                                                   float* __restrict out, F f) {
  for (int64_t r = 0; r < rows; ++r) {
    float* __restrict p = pre + r * cols;
    float* __restrict o = out + r * cols;
    if (bias != nullptr) {
      for (int64_t c = 0; c < cols; ++c) {
        const float v = p[c] + bias[c];
        p[c] = v;
        o[c] = f(v);
      }
    } else {
      for (int64_t c = 0; c < cols; ++c) o[c] = f(p[c]);
    }
  }
}

template <typename F>
inline __attribute__((always_inline)) void ScaleByGrad(
    int64_t n, const float* __restrict pre, float* __restrict grad, F df) {
  for (int64_t i = 0; i < n; ++i) grad[i] = grad[i] * df(pre[i]);
}

struct ReluF {
  float operator()(float x) const { return Relu(x); }
};
struct GeluF {
  float operator()(float x) const { return Gelu(x); }
};
struct GeluTanhF {
  float operator()(float x) const { return GeluTanh(x); }
};
struct GeluGradF {
  float operator()(float x) const { return GeluGrad(x); }
};
struct GeluTanhGradF {
  float operator()(float x) const { return GeluTanhGrad(x); }
};

}  // namespace

TY_VECTOR_CLONES
void BiasReluForward(int64_t rows, int64_t cols, const float* bias, float* pre,
                     float* out) {
  BiasAct(rows, cols, bias, pre, out, ReluF());
}

TY_VECTOR_CLONES
void BiasGeluForward(int64_t rows, int64_t cols, const float* bias, float* pre,
                     float* out) {
  BiasAct(rows, cols, bias, pre, out, GeluF());
}

TY_VECTOR_CLONES
void BiasGeluTanhForward(int64_t rows, int64_t cols, const float* bias,
                         float* pre, float* out) {
  BiasAct(rows, cols, bias, pre, out, GeluTanhF());
}

TY_VECTOR_CLONES
void BiasSwigluForward(int64_t rows, int64_t ffn, const float* bias, float* pre,
                       float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    float* __restrict a = pre + r * 2 * ffn;
    float* __restrict b = a + ffn;
    float* __restrict o = out + r * ffn;
    if (bias != nullptr) {
      const float* __restrict bias_a = bias;
      const float* __restrict bias_b = bias + ffn;
      for (int64_t c = 0; c < ffn; ++c) {
        const float va = a[c] + bias_a[c];
        const float vb = b[c] + bias_b[c];
        a[c] = va;
        b[c] = vb;
        o[c] = va * Sigmoid(va) * vb;
      }
    } else {
      for (int64_t c = 0; c < ffn; ++c) o[c] = a[c] * Sigmoid(a[c]) * b[c];
    }
  }
}

TY_VECTOR_CLONES
void ReluBackward(int64_t n, const float* pre, float* grad) {
  // Like torch's threshold_backward: the gradient passes where pre > 0.
  const float* __restrict p = pre;
  float* __restrict g = grad;
  for (int64_t i = 0; i < n; ++i) g[i] = p[i] > 0.0f ? g[i] : 0.0f;
}

TY_VECTOR_CLONES
void GeluBackward(int64_t n, const float* pre, float* grad) {
  ScaleByGrad(n, pre, grad, GeluGradF());
}

TY_VECTOR_CLONES
void GeluTanhBackward(int64_t n, const float* pre, float* grad) {
  ScaleByGrad(n, pre, grad, GeluTanhGradF());
}

TY_VECTOR_CLONES
void SwigluBackward(int64_t rows, int64_t ffn, const float* pre,
                    const float* d_out, float* d_pre) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict a = pre + r * 2 * ffn;
    const float* __restrict b = a + ffn;
    const float* __restrict g = d_out + r * ffn;
    float* __restrict da = d_pre + r * 2 * ffn;
    float* __restrict db = da + ffn;
    for (int64_t c = 0; c < ffn; ++c) {
      const float s = Sigmoid(a[c]);
      const float silu = a[c] * s;
      da[c] = g[c] * b[c] * (s * (1.0f + a[c] * (1.0f - s)));
      db[c] = g[c] * silu;
    }
  }
}

}  // namespace trainyard
