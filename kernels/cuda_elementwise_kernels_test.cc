// Device element-wise kernels against the CPU kernels (kernels/activation.h,
// kernels/linear.h) on random odd sizes, and the float16 casts against the
// host's conversions on every bit pattern; outputs poisoned with NaN first.
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/npy.h"
#include "gtest/gtest.h"
#include "kernels/activation.h"
#include "kernels/cuda/elementwise_kernels.h"
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

void CpuBiasAct(Activation a, int64_t r, int64_t c, const float* bias,
                float* pre, float* out) {
  if (a == Activation::kRelu) BiasReluForward(r, c, bias, pre, out);
  if (a == Activation::kGelu) BiasGeluForward(r, c, bias, pre, out);
  if (a == Activation::kGeluTanh) BiasGeluTanhForward(r, c, bias, pre, out);
}
void CpuActBack(Activation a, int64_t n, const float* pre, float* g) {
  if (a == Activation::kRelu) ReluBackward(n, pre, g);
  if (a == Activation::kGelu) GeluBackward(n, pre, g);
  if (a == Activation::kGeluTanh) GeluTanhBackward(n, pre, g);
}

TEST(ElementwiseKernelsTest, BiasActivationForwardAndBackwardMatchCpu) {
  SKIP_WITHOUT_CUDA_DEVICE();
  Rng rng(7);
  for (DType t : {DType::kFloat32, DType::kBFloat16}) {
    const double tol =
        t == DType::kFloat32 ? testing::kFp32Tol : testing::kBf16Tol;
    for (Activation a :
         {Activation::kRelu, Activation::kGelu, Activation::kGeluTanh}) {
      for (auto [rows, cols] :
           {std::pair<int64_t, int64_t>{1, 1}, {3, 17}, {17, 1009}}) {
        SCOPED_TRACE(::testing::Message()
                     << "act " << static_cast<int>(a) << " " << DTypeName(t)
                     << " " << rows << "x" << cols);
        std::vector<float> pre = testing::RandomFloats(&rng, rows * cols, 2);
        std::vector<float> bias = testing::RandomFloats(&rng, cols, 1);
        std::vector<float> dout = testing::RandomFloats(&rng, rows * cols, 1);
        if (t == DType::kBFloat16) {
          pre = testing::RoundToBf16(pre);
          dout = testing::RoundToBf16(dout);
        }
        DeviceBuffer d_pre = Upload(pre, t);
        DeviceBuffer d_bias = Upload(bias, DType::kFloat32);
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
    DeviceBuffer d_pre = Upload(pre, DType::kFloat32);
    DeviceBuffer d_bias = Upload(bias, DType::kFloat32);
    DeviceBuffer d_out = Poisoned(rows * ffn, DType::kFloat32);
    ASSERT_TRUE(BiasSwigluForward(DType::kFloat32, rows, ffn,
                                  d_bias.as<float>(), d_pre.data(),
                                  d_out.data(), nullptr)
                    .ok());
    std::vector<float> cpu_pre = pre, cpu_out(rows * ffn);
    ::trainyard::BiasSwigluForward(rows, ffn, bias.data(), cpu_pre.data(),
                                   cpu_out.data());
    EXPECT_TRUE(testing::AllClose(
        "swiglu out", Download(d_out, rows * ffn, DType::kFloat32), D(cpu_out),
        testing::kFp32Tol, testing::kFp32Tol));
    DeviceBuffer d_g = Upload(dout, DType::kFloat32);
    DeviceBuffer d_dpre = Poisoned(rows * 2 * ffn, DType::kFloat32);
    ASSERT_TRUE(SwigluBackward(DType::kFloat32, rows, ffn, d_pre.data(),
                               d_g.data(), d_dpre.data(), nullptr)
                    .ok());
    std::vector<float> cpu_dpre(rows * 2 * ffn);
    ::trainyard::SwigluBackward(rows, ffn, cpu_pre.data(), dout.data(),
                                cpu_dpre.data());
    EXPECT_TRUE(testing::AllClose(
        "swiglu d_pre", Download(d_dpre, rows * 2 * ffn, DType::kFloat32),
        D(cpu_dpre), testing::kFp32Tol, testing::kFp32Tol));
  }
}

TEST(ElementwiseKernelsTest, ColumnSumsAccumulateInDouble) {
  SKIP_WITHOUT_CUDA_DEVICE();
  Rng rng(9);
  const int64_t rows = 1009, cols = 17;
  std::vector<float> x = testing::RandomFloats(&rng, rows * cols, 1);
  std::vector<float> init = testing::RandomFloats(&rng, cols, 1);
  DeviceBuffer d_x = Upload(x, DType::kFloat32);
  DeviceBuffer d_out = Upload(init, DType::kFloat32);
  ASSERT_TRUE(ColumnSums(DType::kFloat32, rows, cols, d_x.data(), true,
                         d_out.as<float>(), nullptr)
                  .ok());
  std::vector<double> ref(cols);
  for (int64_t c = 0; c < cols; ++c) {
    ref[c] = init[c];
    for (int64_t r = 0; r < rows; ++r) ref[c] += x[r * cols + c];
  }
  EXPECT_TRUE(testing::AllClose("colsum",
                                Download(d_out, cols, DType::kFloat32), ref,
                                testing::kFp32Tol, 1e-5));
}

// Many rows (16 lanes x 512 rows each), columns spanning several 32-wide
// tiles with a partial last one, both dtypes: the double sums round once to
// float32, and a second run gives the same bits.
TEST(ElementwiseKernelsTest, ColumnSumsOfManyRowsAreExactAndReproducible) {
  SKIP_WITHOUT_CUDA_DEVICE();
  Rng rng(10);
  const int64_t rows = 8193, cols = 1000;
  for (DType t : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(DTypeName(t));
    std::vector<float> x = testing::RandomFloats(&rng, rows * cols, 1);
    if (t == DType::kBFloat16) x = testing::RoundToBf16(x);
    DeviceBuffer d_x = Upload(x, t);
    std::vector<double> ref(cols, 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) ref[c] += x[r * cols + c];
    }
    std::vector<float> got[2];
    for (int run = 0; run < 2; ++run) {
      DeviceBuffer d_out = Poisoned(cols, DType::kFloat32);
      ASSERT_TRUE(ColumnSums(t, rows, cols, d_x.data(), false,
                             d_out.as<float>(), nullptr)
                      .ok());
      got[run] = Download(d_out, cols, DType::kFloat32);
    }
    // Sums of 8193 N(0, 1) values are O(100); float32 rounding of the
    // double sum is 2^-24 relative.
    EXPECT_TRUE(testing::AllClose("colsum", got[0], ref, 1e-6, 1e-9));
    EXPECT_EQ(std::memcmp(got[0].data(), got[1].data(), cols * sizeof(float)),
              0);
  }
}

TEST(ElementwiseKernelsTest, ColumnSumsOfNoRowsKeepOrZero) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const std::vector<float> init = {1.5f, -2.0f, 3.0f};
  DeviceBuffer d_out = Upload(init, DType::kFloat32);
  ASSERT_TRUE(ColumnSums(DType::kFloat32, 0, 3, nullptr, true,
                         d_out.as<float>(), nullptr)
                  .ok());
  EXPECT_EQ(Download(d_out, 3, DType::kFloat32), init);
  ASSERT_TRUE(ColumnSums(DType::kFloat32, 0, 3, nullptr, false,
                         d_out.as<float>(), nullptr)
                  .ok());
  EXPECT_EQ(Download(d_out, 3, DType::kFloat32), (std::vector<float>{0, 0, 0}));
}

// Every float16 bit pattern widened by the kernels: float32 as the host's
// Float16ToFloat gives it (a NaN only needs to stay NaN), bfloat16 as
// FloatToBf16 of that float32, bit for bit.
TEST(ElementwiseKernelsTest, Float16CastsMatchTheHostBitwise) {
  SKIP_WITHOUT_CUDA_DEVICE();
  constexpr int64_t n = 1 << 16;
  std::vector<uint16_t> half(n);
  std::iota(half.begin(), half.end(), uint16_t{0});
  absl::StatusOr<DeviceBuffer> d_half = DeviceBuffer::Allocate(0, n * 2);
  ASSERT_TRUE(d_half.ok()) << d_half.status();
  ASSERT_TRUE(d_half->CopyFromHost(half.data(), n * 2).ok());
  DeviceBuffer d_wide = Poisoned(n, DType::kFloat32);
  DeviceBuffer d_bf16 = Poisoned(n, DType::kBFloat16);
  absl::Status s =
      CastFloat16ToFloat(n, d_half->data(), d_wide.as<float>(), nullptr);
  ASSERT_TRUE(s.ok()) << s;
  s = CastFloat16ToBf16(n, d_half->data(), d_bf16.data(), nullptr);
  ASSERT_TRUE(s.ok()) << s;
  std::vector<uint32_t> wide(n);
  std::vector<uint16_t> bf16(n);
  ASSERT_TRUE(d_wide.CopyToHost(wide.data(), n * 4).ok());
  ASSERT_TRUE(d_bf16.CopyToHost(bf16.data(), n * 2).ok());
  int64_t wrong_wide = 0, wrong_bf16 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float want = Float16ToFloat(half[i]);
    uint32_t want_bits;
    std::memcpy(&want_bits, &want, 4);
    const bool got_nan = (wide[i] & 0x7FFFFFFFu) > 0x7F800000u;
    if (std::isnan(want) ? !got_nan : wide[i] != want_bits) {
      if (++wrong_wide <= 5) ADD_FAILURE() << "float16 0x" << std::hex << i;
    }
    if (bf16[i] != testing::FloatToBf16(want) && ++wrong_bf16 <= 5) {
      ADD_FAILURE() << "float16 0x" << std::hex << i << " -> bfloat16 0x"
                    << bf16[i];
    }
  }
  EXPECT_EQ(wrong_wide, 0) << "float16 -> float32 differing from the host";
  EXPECT_EQ(wrong_bf16, 0) << "float16 -> bfloat16 differing from the host";
}

}  // namespace
}  // namespace gpu
}  // namespace trainyard
