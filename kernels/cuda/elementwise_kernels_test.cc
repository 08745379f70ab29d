// Device element-wise kernels against the CPU kernels (kernels/activation.h,
// kernels/linear.h) on random odd sizes, outputs poisoned with NaN first.
#include "kernels/cuda/elementwise_kernels.h"

#include "gtest/gtest.h"
#include "kernels/activation.h"
#include "kernels/cuda/test_util.h"

namespace trainyard {
namespace gpu {
namespace {

using testing::Download;
using testing::Poisoned;
using testing::Upload;

std::vector<double> D(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

void CpuBiasAct(ActKind a, int64_t r, int64_t c, const float* bias, float* pre,
                float* out) {
  if (a == ActKind::kRelu) BiasReluForward(r, c, bias, pre, out);
  if (a == ActKind::kGelu) BiasGeluForward(r, c, bias, pre, out);
  if (a == ActKind::kGeluTanh) BiasGeluTanhForward(r, c, bias, pre, out);
}
void CpuActBack(ActKind a, int64_t n, const float* pre, float* g) {
  if (a == ActKind::kRelu) ReluBackward(n, pre, g);
  if (a == ActKind::kGelu) GeluBackward(n, pre, g);
  if (a == ActKind::kGeluTanh) GeluTanhBackward(n, pre, g);
}

TEST(ElementwiseKernelsTest, BiasActivationForwardAndBackwardMatchCpu) {
  SKIP_WITHOUT_CUDA_DEVICE();
  Rng rng(7);
  for (DataType t : {DataType::kFloat32, DataType::kBFloat16}) {
    const double tol =
        t == DataType::kFloat32 ? testing::kFp32Tol : testing::kBf16Tol;
    for (ActKind a : {ActKind::kRelu, ActKind::kGelu, ActKind::kGeluTanh}) {
      for (auto [rows, cols] :
           {std::pair<int64_t, int64_t>{1, 1}, {3, 17}, {17, 1009}}) {
        SCOPED_TRACE(::testing::Message()
                     << "act " << static_cast<int>(a) << " " << DataTypeName(t)
                     << " " << rows << "x" << cols);
        std::vector<float> pre = testing::RandomFloats(&rng, rows * cols, 2);
        std::vector<float> bias = testing::RandomFloats(&rng, cols, 1);
        std::vector<float> dout = testing::RandomFloats(&rng, rows * cols, 1);
        if (t == DataType::kBFloat16) {
          pre = testing::RoundToBf16(pre);
          dout = testing::RoundToBf16(dout);
        }
        DeviceBuffer d_pre = Upload(pre, t);
        DeviceBuffer d_bias = Upload(bias, DataType::kFloat32);
        DeviceBuffer d_out = Poisoned(rows * cols, t);
        ASSERT_TRUE(BiasActivationForward(a, t, rows, cols, d_bias.as<float>(),
                                          d_pre.data(), d_out.data(), nullptr)
                        .ok());
        std::vector<float> cpu_pre = pre, cpu_out(rows * cols);
        CpuBiasAct(a, rows, cols, bias.data(), cpu_pre.data(), cpu_out.data());
        EXPECT_TRUE(testing::AllClose("pre", Download(d_pre, rows * cols, t),
                                      D(cpu_pre), tol, tol));
        EXPECT_TRUE(testing::AllClose("out", Download(d_out, rows * cols, t),
                                      D(cpu_out), tol, tol));
        // Backward from the device's stored pre-activation.
        std::vector<float> dev_pre = Download(d_pre, rows * cols, t);
        DeviceBuffer d_g = Upload(dout, t);
        DeviceBuffer d_dpre = Poisoned(rows * cols, t);
        ASSERT_TRUE(ActivationBackward(a, t, rows * cols, d_pre.data(),
                                       d_g.data(), d_dpre.data(), nullptr)
                        .ok());
        std::vector<float> cpu_g = dout;
        CpuActBack(a, rows * cols, dev_pre.data(), cpu_g.data());
        EXPECT_TRUE(testing::AllClose("d_pre", Download(d_dpre, rows * cols, t),
                                      D(cpu_g), tol, tol));
      }
    }
  }
}

TEST(ElementwiseKernelsTest, SwigluMatchesCpu) {
  SKIP_WITHOUT_CUDA_DEVICE();
  Rng rng(8);
  for (auto [rows, ffn] : {std::pair<int64_t, int64_t>{1, 1}, {17, 1009}}) {
    std::vector<float> pre = testing::RandomFloats(&rng, rows * 2 * ffn, 2);
    std::vector<float> bias = testing::RandomFloats(&rng, 2 * ffn, 1);
    std::vector<float> dout = testing::RandomFloats(&rng, rows * ffn, 1);
    DeviceBuffer d_pre = Upload(pre, DataType::kFloat32);
    DeviceBuffer d_bias = Upload(bias, DataType::kFloat32);
    DeviceBuffer d_out = Poisoned(rows * ffn, DataType::kFloat32);
    ASSERT_TRUE(BiasSwigluForward(DataType::kFloat32, rows, ffn,
                                  d_bias.as<float>(), d_pre.data(),
                                  d_out.data(), nullptr)
                    .ok());
    std::vector<float> cpu_pre = pre, cpu_out(rows * ffn);
    ::trainyard::BiasSwigluForward(rows, ffn, bias.data(), cpu_pre.data(),
                                   cpu_out.data());
    EXPECT_TRUE(testing::AllClose(
        "swiglu out", Download(d_out, rows * ffn, DataType::kFloat32),
        D(cpu_out), testing::kFp32Tol, testing::kFp32Tol));
    DeviceBuffer d_g = Upload(dout, DataType::kFloat32);
    DeviceBuffer d_dpre = Poisoned(rows * 2 * ffn, DataType::kFloat32);
    ASSERT_TRUE(SwigluBackward(DataType::kFloat32, rows, ffn, d_pre.data(),
                               d_g.data(), d_dpre.data(), nullptr)
                    .ok());
    std::vector<float> cpu_dpre(rows * 2 * ffn);
    ::trainyard::SwigluBackward(rows, ffn, cpu_pre.data(), dout.data(),
                                cpu_dpre.data());
    EXPECT_TRUE(testing::AllClose(
        "swiglu d_pre", Download(d_dpre, rows * 2 * ffn, DataType::kFloat32),
        D(cpu_dpre), testing::kFp32Tol, testing::kFp32Tol));
  }
}

TEST(ElementwiseKernelsTest, ColumnSumsAccumulateInDouble) {
  SKIP_WITHOUT_CUDA_DEVICE();
  Rng rng(9);
  const int64_t rows = 1009, cols = 17;
  std::vector<float> x = testing::RandomFloats(&rng, rows * cols, 1);
  std::vector<float> init = testing::RandomFloats(&rng, cols, 1);
  DeviceBuffer d_x = Upload(x, DataType::kFloat32);
  DeviceBuffer d_out = Upload(init, DataType::kFloat32);
  ASSERT_TRUE(ColumnSums(DataType::kFloat32, rows, cols, d_x.data(), true,
                         d_out.as<float>(), nullptr)
                  .ok());
  std::vector<double> ref(cols);
  for (int64_t c = 0; c < cols; ++c) {
    ref[c] = init[c];
    for (int64_t r = 0; r < rows; ++r) ref[c] += x[r * cols + c];
  }
  EXPECT_TRUE(testing::AllClose("colsum",
                                Download(d_out, cols, DataType::kFloat32), ref,
                                testing::kFp32Tol, 1e-5));
}

}  // namespace
}  // namespace gpu
}  // namespace trainyard
