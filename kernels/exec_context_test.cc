#include "kernels/exec_context.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/bfloat16.h"
#include "core/npy.h"
#include "gtest/gtest.h"
#include "kernels/cuda/test_util.h"

namespace trainyard {
namespace {

constexpr int kPatterns = 1 << 16;

// A host tensor of `dtype` (2 bytes an element) holding every bit pattern.
Tensor AllBitPatterns(DType dtype) {
  Tensor t = Tensor::Empty(dtype, {kPatterns});
  uint16_t* p = static_cast<uint16_t*>(t.raw_data());
  for (int i = 0; i < kPatterns; ++i) p[i] = static_cast<uint16_t>(i);
  return t;
}

uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// `t` (on ctx's device) cast to `dtype` and brought to the host.
Tensor CastToHost(const ExecContext& ctx, const Tensor& t, DType dtype) {
  absl::StatusOr<Tensor> cast = ctx.Cast(t, dtype);
  EXPECT_TRUE(cast.ok()) << cast.status();
  if (!cast.ok()) return Tensor();
  absl::StatusOr<Tensor> host = ctx.ToHost(*cast);
  EXPECT_TRUE(host.ok()) << host.status();
  return host.ok() ? *host : Tensor();
}

// Widens every float16 and bfloat16 bit pattern on ctx's device and
// compares with the host's conversions bit for bit: float16 -> float32 is
// Float16ToFloat (a NaN only needs to stay NaN), float16 -> bfloat16 is
// FloatToBf16(Float16ToFloat(x)), bfloat16 -> float32 is Bf16ToFloat.
void ExpectWideningMatchesTheHost(const ExecContext& ctx) {
  absl::StatusOr<Tensor> half = ctx.ToDevice(AllBitPatterns(DType::kFloat16));
  absl::StatusOr<Tensor> bf16 = ctx.ToDevice(AllBitPatterns(DType::kBFloat16));
  ASSERT_TRUE(half.ok() && bf16.ok()) << half.status() << bf16.status();
  const Tensor half_wide = CastToHost(ctx, *half, DType::kFloat32);
  const Tensor half_bf16 = CastToHost(ctx, *half, DType::kBFloat16);
  const Tensor bf16_wide = CastToHost(ctx, *bf16, DType::kFloat32);
  ASSERT_EQ(half_wide.numel(), kPatterns);
  ASSERT_EQ(half_bf16.numel(), kPatterns);
  ASSERT_EQ(bf16_wide.numel(), kPatterns);
  int wrong = 0;
  const auto expect = [&](bool same, const char* what, int i) {
    if (!same && ++wrong <= 10) {
      ADD_FAILURE() << what << " of bit pattern 0x" << std::hex << i;
    }
  };
  for (int i = 0; i < kPatterns; ++i) {
    const uint16_t x = static_cast<uint16_t>(i);
    const float want = Float16ToFloat(x);
    const float got = half_wide.data<float>()[i];
    expect(
        std::isnan(want) ? std::isnan(got) : FloatBits(got) == FloatBits(want),
        "float16 -> float32", i);
    expect(half_bf16.data<uint16_t>()[i] == FloatToBf16(want),
           "float16 -> bfloat16", i);
    expect(FloatBits(bf16_wide.data<float>()[i]) == FloatBits(Bf16ToFloat(x)),
           "bfloat16 -> float32", i);
  }
  EXPECT_EQ(wrong, 0) << "conversions that differ from the host's on "
                      << ctx.ToString();
}

TEST(ExecContextTest, PrecisionNames) {
  for (Precision p : {Precision::kFp32, Precision::kTf32, Precision::kBf16}) {
    EXPECT_EQ(*PrecisionFromName(PrecisionName(p)), p);
  }
  auto bad = PrecisionFromName("fp16");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("expected \"fp32\", \"tf32\" or "
                                        "\"bf16\""),
            std::string::npos);
}

TEST(ExecContextTest, CpuIsFp32Only) {
  auto ctx = ExecContext::Create(Device::Cpu(), Precision::kBf16);
  ASSERT_FALSE(ctx.ok());
  EXPECT_EQ(ctx.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ctx.status().message().find("bf16 needs a CUDA device"),
            std::string::npos);
}

TEST(ExecContextTest, CpuCopiesAreTheHostTensors) {
  auto ctx = ExecContext::Create(Device::Cpu(), Precision::kFp32);
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  EXPECT_EQ((*ctx)->ToString(), "cpu fp32");
  Tensor t = Tensor::FromVector({1, 2, 3}, {3});
  EXPECT_EQ((*ctx)->ToHost(t)->ptr(), t.ptr());
  EXPECT_EQ((*ctx)->ToDevice(t)->ptr(), t.ptr());
  EXPECT_EQ((*ctx)->Cast(t, DType::kFloat32)->ptr(), t.ptr());
  EXPECT_FALSE((*ctx)->Cast(t, DType::kBFloat16).ok());
  Tensor z = *(*ctx)->Zeros(DType::kFloat32, {2, 2});
  EXPECT_EQ(z.data<float>()[3], 0.0f);
  Tensor dst = Tensor::Empty(DType::kFloat32, {3});
  ASSERT_TRUE((*ctx)->CopyInto(t, &dst).ok());
  EXPECT_EQ(dst.data<float>()[2], 3.0f);
  Tensor wrong = Tensor::Empty(DType::kFloat32, {4});
  EXPECT_EQ((*ctx)->CopyInto(t, &wrong).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ExecContextTest, CpuAddIntoAddsElementwise) {
  auto ctx = ExecContext::Create(Device::Cpu(), Precision::kFp32);
  ASSERT_TRUE(ctx.ok());
  Tensor dst = Tensor::FromVector({1.0f, 0.1f, -3.0f}, {3});
  Tensor src = Tensor::FromVector({2.0f, 0.2f, 3.0f}, {3});
  ASSERT_TRUE((*ctx)->AddInto(src, &dst).ok());
  EXPECT_EQ(dst.data<float>()[0], 3.0f);
  EXPECT_EQ(dst.data<float>()[1], 0.1f + 0.2f);  // one float add, same bits
  EXPECT_EQ(dst.data<float>()[2], 0.0f);
  Tensor wrong = Tensor::Empty(DType::kFloat32, {4});
  EXPECT_EQ((*ctx)->AddInto(src, &wrong).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ExecContextTest, CpuWideningMatchesTheHostBitwise) {
  auto ctx = ExecContext::Create(Device::Cpu(), Precision::kFp32);
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  ExpectWideningMatchesTheHost(**ctx);
}

TEST(ExecContextTest, RefusedCastNamesBothDtypes) {
  auto cpu = ExecContext::Create(Device::Cpu(), Precision::kFp32);
  auto sim = ExecContext::Create(Device::Sim(0), Precision::kBf16);
  ASSERT_TRUE(cpu.ok() && sim.ok());
  struct Refused {
    const ExecContext* ctx;
    DType from, to;
    const char* message;
  };
  for (const Refused& r : {
           Refused{cpu->get(), DType::kFloat32, DType::kFloat16,
                   "cast from float32 to float16 on cpu: only"},
           Refused{sim->get(), DType::kBFloat16, DType::kFloat16,
                   "cast from bfloat16 to float16 on sim:0: only"},
           Refused{sim->get(), DType::kInt32, DType::kFloat32,
                   "cast from int32 to float32 on sim:0: only"},
           Refused{cpu->get(), DType::kFloat32, DType::kBFloat16,
                   "cast from float32 to bfloat16 on cpu: the CPU computes "
                   "in float32"},
       }) {
    Tensor src = *r.ctx->Zeros(r.from, {3});
    absl::StatusOr<Tensor> cast = r.ctx->Cast(src, r.to);
    ASSERT_FALSE(cast.ok()) << r.message;
    EXPECT_EQ(cast.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(cast.status().message().find(r.message), std::string::npos)
        << cast.status();
  }
}

TEST(ExecContextSimTest, CopiesAndSynchronisationsAreCounted) {
  auto ctx = ExecContext::Create(Device::Sim(0), Precision::kFp32);
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  EXPECT_EQ((*ctx)->ToString(), "sim:0 fp32");
  const DeviceTraffic start = (*ctx)->traffic();
  Tensor host = Tensor::FromVector({1, 2, 3, 4}, {4});
  Tensor dev = *(*ctx)->ToDevice(host);
  EXPECT_EQ(dev.device(), Device::Sim(0));
  EXPECT_NE(dev.ptr(), host.ptr());
  Tensor dev2 = *(*ctx)->Zeros(DType::kFloat32, {4});
  ASSERT_TRUE((*ctx)->CopyInto(dev, &dev2).ok());  // device to device
  ASSERT_TRUE((*ctx)->AddInto(dev, &dev2).ok());
  Tensor back = *(*ctx)->ToHost(dev2);
  EXPECT_EQ(back.data<float>()[3], 8.0f);
  ASSERT_TRUE((*ctx)->Synchronize().ok());
  const DeviceTraffic t = (*ctx)->traffic() - start;
  EXPECT_EQ(t.h2d_copies, 1);
  EXPECT_EQ(t.h2d_bytes, 16);
  EXPECT_EQ(t.d2h_copies, 1);
  EXPECT_EQ(t.d2h_bytes, 16);
  EXPECT_EQ(t.syncs, 3);  // each copy waits, and the explicit one
}

TEST(ExecContextSimTest, Bf16CastsRoundToNearestEven) {
  auto ctx = ExecContext::Create(Device::Sim(1), Precision::kBf16);
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  EXPECT_EQ((*ctx)->activation_dtype(), DType::kBFloat16);
  Tensor host = Tensor::FromVector({1.0f, 1.0f + 1.0f / 256, 1.0f / 3}, {3});
  Tensor dev = *(*ctx)->ToDevice(host);
  Tensor low = *(*ctx)->Cast(dev, DType::kBFloat16);
  Tensor wide = *(*ctx)->Cast(low, DType::kFloat32);
  Tensor back = *(*ctx)->ToHost(wide);
  EXPECT_EQ(back.data<float>()[0], 1.0f);
  EXPECT_EQ(back.data<float>()[1], 1.0f);  // a tie rounds to even
  EXPECT_EQ(back.data<float>()[2], 0.333984375f);
}

TEST(ExecContextSimTest, WideningMatchesTheHostBitwiseWithoutTraffic) {
  auto ctx = ExecContext::Create(Device::Sim(0), Precision::kFp32);
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  ExpectWideningMatchesTheHost(**ctx);
  const Tensor half = *(*ctx)->Zeros(DType::kFloat16, {5});
  const DeviceTraffic start = (*ctx)->traffic();
  ASSERT_TRUE((*ctx)->Cast(half, DType::kFloat32).ok());
  ASSERT_TRUE((*ctx)->Cast(half, DType::kBFloat16).ok());
  const DeviceTraffic t = (*ctx)->traffic() - start;
  EXPECT_EQ(t.h2d_copies + t.d2h_copies + t.syncs, 0);
}

TEST(ExecContextSimTest, Tf32IsRefused) {
  auto ctx = ExecContext::Create(Device::Sim(0), Precision::kTf32);
  ASSERT_FALSE(ctx.ok());
  EXPECT_NE(ctx.status().message().find("tf32 needs a CUDA device"),
            std::string::npos)
      << ctx.status();
}

TEST(ExecContextTest, MissingGpuIsAClearError) {
  auto ctx = ExecContext::Create(Device::Cuda(1000), Precision::kFp32);
  ASSERT_FALSE(ctx.ok());
  EXPECT_EQ(ctx.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(ctx.status().message().find("cuda:1000 is not usable"),
            std::string::npos)
      << ctx.status();
}

TEST(ExecContextGpuTest, RoundTripAndCasts) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto ctx = ExecContext::Create(Device::Cuda(0), Precision::kBf16);
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  Tensor host = Tensor::FromVector({1.0f, -2.5f, 3.0f, 1.0f / 3}, {2, 2});
  auto dev = (*ctx)->ToDevice(host);
  ASSERT_TRUE(dev.ok()) << dev.status();
  EXPECT_EQ(dev->device(), Device::Cuda(0));
  auto back = (*ctx)->ToHost(*dev);
  ASSERT_TRUE(back.ok()) << back.status();
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(back->data<float>()[i], host.data<float>()[i]);
  }
  auto bf = (*ctx)->Cast(*dev, DType::kBFloat16);
  ASSERT_TRUE(bf.ok()) << bf.status();
  auto wide = (*ctx)->Cast(*bf, DType::kFloat32);
  ASSERT_TRUE(wide.ok()) << wide.status();
  Tensor w = *(*ctx)->ToHost(*wide);
  EXPECT_EQ(w.data<float>()[0], 1.0f);
  EXPECT_EQ(w.data<float>()[1], -2.5f);
  EXPECT_NEAR(w.data<float>()[3], 1.0f / 3, 1.0f / 3 * 1e-2);
  Tensor z = *(*ctx)->ToHost(*(*ctx)->Zeros(DType::kFloat32, {5}));
  EXPECT_EQ(z.data<float>()[4], 0.0f);
}

TEST(ExecContextGpuTest, WideningMatchesTheHostBitwise) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto ctx = ExecContext::Create(Device::Cuda(0), Precision::kFp32);
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  ExpectWideningMatchesTheHost(**ctx);
}

// The same float adds on the GPU as on the CPU: the same bits.
TEST(ExecContextGpuTest, AddIntoMatchesTheCpuBitwise) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto gpu_ctx = ExecContext::Create(Device::Cuda(0), Precision::kFp32);
  auto cpu_ctx = ExecContext::Create(Device::Cpu(), Precision::kFp32);
  ASSERT_TRUE(gpu_ctx.ok() && cpu_ctx.ok());
  std::vector<float> a(1001), b(1001);
  for (int i = 0; i < 1001; ++i) {
    a[i] = 1.0f / (i + 1);
    b[i] = 3.0f / (i + 7) - 0.25f;
  }
  Tensor ha = Tensor::FromVector(a, {1001}), hb = Tensor::FromVector(b, {1001});
  Tensor da = *(*gpu_ctx)->ToDevice(ha), db = *(*gpu_ctx)->ToDevice(hb);
  ASSERT_TRUE((*gpu_ctx)->AddInto(db, &da).ok());
  ASSERT_TRUE((*cpu_ctx)->AddInto(hb, &ha).ok());
  Tensor back = *(*gpu_ctx)->ToHost(da);
  for (int i = 0; i < 1001; ++i) {
    ASSERT_EQ(back.data<float>()[i], ha.data<float>()[i]) << i;
  }
}

}  // namespace
}  // namespace trainyard
