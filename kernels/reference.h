// Float64 reference implementations of the kernels in this folder, written
// for clarity (straight from the formulas, no fusion), for tests only.
// Matrices are row-major std::vector<double>. Stateless, thread-safe.
#ifndef TRAINYARD_KERNELS_REFERENCE_H_
#define TRAINYARD_KERNELS_REFERENCE_H_

#include <cstdint>
#include <vector>

#include "core/random.h"
#include "gtest/gtest.h"
#include "kernels/mlp_block.h"

namespace trainyard {
namespace reference {

using Vec = std::vector<double>;

// C [m, n] = op(A) [m, k] @ op(B) [k, n] (row-major, op = transpose when set).
Vec Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
         const Vec& a, const Vec& b);

// "relu", "gelu", "gelu_tanh", "swiglu"; "none", "layernorm", "rmsnorm":
// the names tests give their cases.
const char* ActivationName(Activation act);
const char* NormName(NormType norm);

// Element-wise activations (not SwiGLU) and their derivatives.
double Act(Activation act, double x);
double ActGrad(Activation act, double x);
double Silu(double x);
double SiluGrad(double x);

// LayerNorm (bias may be empty) / RMSNorm over rows of x [rows, cols].
Vec LayerNorm(int64_t rows, int64_t cols, const Vec& x, const Vec& w,
              const Vec& b, double eps);
// Gradients for the loss sum(y * dy): dx [rows, cols], dw [cols], db [cols].
void LayerNormBackward(int64_t rows, int64_t cols, const Vec& x, const Vec& w,
                       double eps, const Vec& dy, Vec* dx, Vec* dw, Vec* db);
Vec RmsNorm(int64_t rows, int64_t cols, const Vec& x, const Vec& w, double eps);
void RmsNormBackward(int64_t rows, int64_t cols, const Vec& x, const Vec& w,
                     double eps, const Vec& dy, Vec* dx, Vec* dw);

// One MlpBlock's parameters (or gradients); unused ones stay empty.
struct BlockParams {
  Vec norm_weight, norm_bias, fc1_weight, fc1_bias, fc2_weight, fc2_bias;
};

// Which pre-activations [b, ffn] count as positive for relu, when given:
// another implementation's own decisions (its pre-activations within
// rounding of 0 may fall on the other side of the mask than ours).
using ReluMask = std::vector<uint8_t>;

// y [b, out] = block(x [b, in]).
Vec BlockForward(const MlpBlockConfig& c, const BlockParams& p, int64_t b,
                 const Vec& x, const ReluMask* relu_mask = nullptr);
// dx [b, in] and parameter gradients for the loss sum(y * dy).
void BlockBackward(const MlpBlockConfig& c, const BlockParams& p, int64_t b,
                   const Vec& x, const Vec& dy, Vec* dx, BlockParams* grads,
                   const ReluMask* relu_mask = nullptr);

// n standard normals times `scale`, rounded to float so that the float32
// kernels and the float64 reference see exactly the same inputs.
Vec RandomVec(Rng* rng, int64_t n, double scale);
std::vector<float> ToFloat(const Vec& v);

// ||actual - expected|| / ||expected|| (Euclidean; 0 when both are 0).
double NormRel(const float* actual, const Vec& expected);
// Success when NormRel <= tol: the way to judge a result whose error grows
// with the reduction length (GEMMs), against this file's float64 results;
// otherwise names `what`, the ratio and the worst element.
::testing::AssertionResult NormRelClose(const char* what, const float* actual,
                                        const Vec& expected, double tol);

// Success when every |actual[i] - expected[i]| <= atol + rtol*|expected[i]|;
// otherwise names `what` and the worst element.
::testing::AssertionResult AllClose(const char* what, const float* actual,
                                    const Vec& expected, double rtol,
                                    double atol);

}  // namespace reference
}  // namespace trainyard

#endif  // TRAINYARD_KERNELS_REFERENCE_H_
