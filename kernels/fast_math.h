// Branch-free float32 exp/erf/sigmoid for the element-wise kernels.
//
// Plain IEEE float operations in a fixed order (no FMA, no libm calls), so
// GCC vectorises loops that use them and every vector width (SSE2, AVX2,
// AVX-512, scalar) gives bitwise the same results: kernel outputs do not
// depend on the machine's ISA. Accuracy (checked in activation_test.cc):
// Exp within 2 ulp on [-87, 88] (clamped outside); Erf within 5e-7
// absolute (Eigen/XLA's rational approximation).
//
// Header-only, stateless, thread-safe. Internal to //kernels.
#ifndef TRAINYARD_KERNELS_FAST_MATH_H_
#define TRAINYARD_KERNELS_FAST_MATH_H_

#include <cstdint>
#include <cstring>

// Compiles a loop kernel for AVX-512, AVX2 and the baseline, picked at load
// time (ifunc). Results are identical across the clones (see above).
#define TY_VECTOR_CLONES \
  __attribute__((target_clones("avx512f", "avx2", "default")))

namespace trainyard {
namespace fast_math {

inline float Clamp(float x, float lo, float hi) {
  x = x < lo ? lo : x;
  return x > hi ? hi : x;
}

// e^x (Cephes expf polynomial). Clamped to [-87, 88]: e^-87 ~ 1.6e-38
// stands in for underflow, e^88 ~ 1.7e38 for overflow.
inline float Exp(float x) {
  x = Clamp(x, -87.0f, 88.0f);
  // Round x*log2(e) to nearest with the 1.5*2^23 trick (no floor/round call).
  const float kRound = 12582912.0f;
  const float n = (x * 1.44269504088896341f + kRound) - kRound;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  const float z = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * z + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// 1 / (1 + e^-x).
inline float Sigmoid(float x) { return 1.0f / (1.0f + Exp(-x)); }

// erf(x): odd rational approximation on [-4, 4], +-1 outside.
inline float Erf(float x) {
  x = Clamp(x, -4.0f, 4.0f);
  const float x2 = x * x;
  float p = -2.72614225801306e-10f;
  p = p * x2 + 2.77068142495902e-08f;
  p = p * x2 + -2.10102402082508e-06f;
  p = p * x2 + -5.69250639462346e-05f;
  p = p * x2 + -7.34990630326855e-04f;
  p = p * x2 + -2.95459980854025e-03f;
  p = p * x2 + -1.60960333262415e-02f;
  float q = -1.45660718464996e-05f;
  q = q * x2 + -2.13374055278905e-04f;
  q = q * x2 + -1.68282697438203e-03f;
  q = q * x2 + -7.37332916720468e-03f;
  q = q * x2 + -1.42647390514189e-02f;
  return x * p / q;
}

}  // namespace fast_math
}  // namespace trainyard

#endif  // TRAINYARD_KERNELS_FAST_MATH_H_
