#include "kernels/device_ops.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/sim_device.h"
#include "gtest/gtest.h"
#include "kernels/cuda/test_util.h"

namespace trainyard {
namespace {

// The same checks on the simulated device and, where there is one, a GPU:
// the device's results read back through the context.
std::vector<Device> Devices() {
  std::vector<Device> d = {Device::Sim(0)};
  if (gpu::CheckDevice(0).ok()) d.push_back(Device::Cuda(0));
  return d;
}

std::unique_ptr<ExecContext> Context(Device d, Precision p = Precision::kFp32) {
  auto ctx = ExecContext::Create(d, p);
  EXPECT_TRUE(ctx.ok()) << ctx.status();
  return ctx.ok() ? std::move(*ctx) : nullptr;
}

TEST(DeviceOpsTest, GatherRowsCopiesAndNarrows) {
  for (Device d : Devices()) {
    SCOPED_TRACE(d.ToString());
    auto ctx = Context(d);
    ASSERT_TRUE(ctx);
    Tensor src =
        Tensor::FromVector({0, 1, 2, 10, 11, 12, 20, 21, 22.5f}, {3, 3});
    Tensor rows = Tensor::Empty(DType::kInt64, {4});
    const int64_t r[] = {2, 0, 2, 1};
    std::memcpy(rows.raw_data(), r, sizeof(r));
    Tensor dsrc = *ctx->ToDevice(src), drows = *ctx->ToDevice(rows);
    Tensor out = *ctx->Empty(DType::kFloat32, {4, 3});
    ASSERT_TRUE(GatherRows(*ctx, dsrc, drows, &out).ok());
    Tensor host = *ctx->ToHost(out);
    const std::vector<float> want = {20, 21, 22.5f, 0,  1,  2,
                                     20, 21, 22.5f, 10, 11, 12};
    EXPECT_EQ(std::vector<float>(host.data<float>(), host.data<float>() + 12),
              want);
    Tensor low = *ctx->Empty(DType::kBFloat16, {4, 3});
    ASSERT_TRUE(GatherRows(*ctx, dsrc, drows, &low).ok());
    Tensor wide = *ctx->ToHost(*ctx->Cast(low, DType::kFloat32));
    EXPECT_EQ(wide.data<float>()[2], 22.5f);  // exact in bfloat16
    Tensor bad = *ctx->Empty(DType::kFloat32, {4, 2});
    EXPECT_EQ(GatherRows(*ctx, dsrc, drows, &bad).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(GatherRows(*ctx, src, drows, &out).code(),
              absl::StatusCode::kInvalidArgument);  // a host tensor
  }
}

TEST(DeviceOpsTest, FindNonFiniteRecordsTheFirstOne) {
  for (Device d : Devices()) {
    SCOPED_TRACE(d.ToString());
    auto ctx = Context(d);
    ASSERT_TRUE(ctx);
    std::vector<float> v(1000, 1.0f);
    v[637] = std::numeric_limits<float>::infinity();
    v[999] = std::nanf("");
    Tensor t = *ctx->ToDevice(Tensor::FromVector(v, {10, 100}));
    Tensor slot = *ctx->Zeros(DType::kFloat64, {4});
    double* s = static_cast<double*>(slot.ptr());
    ASSERT_TRUE(FindNonFinite(*ctx, t, s).ok());
    Tensor clean = *ctx->ToDevice(Tensor::FromVector({1, 2, 3}, {3}));
    ASSERT_TRUE(FindNonFinite(*ctx, clean, s + 2).ok());
    Tensor host = *ctx->ToHost(slot);
    const NonFinite got = DecodeNonFinite(host.data<double>());
    EXPECT_TRUE(got.found);
    EXPECT_EQ(got.index, 637);
    EXPECT_TRUE(std::isinf(got.value));
    EXPECT_FALSE(DecodeNonFinite(host.data<double>() + 2).found);
  }
}

TEST(DeviceOpsTest, DeviceTotalsAreTheHostFormulaAndSkipBadSteps) {
  for (Device d : Devices()) {
    SCOPED_TRACE(d.ToString());
    auto ctx = Context(d);
    ASSERT_TRUE(ctx);
    // 3 parameters, 2 microbatches of stride kCheckWords + 4.
    const int stride = kCheckWords + 4;
    std::vector<double> buf(3 + 2 * stride + kTotalsWords, 0.0);
    buf[0] = 0.25;
    buf[1] = 3.5;
    buf[2] = 1e-3;
    double* mb = buf.data() + 3;
    mb[kCheckWords + 0] = 8;    // w
    mb[kCheckWords + 1] = 8.8;  // w L
    mb[stride + kCheckWords + 0] = 5;
    mb[stride + kCheckWords + 1] = 0.7;
    auto run = [&](const std::vector<double>& values) {
      Tensor host =
          Tensor::Empty(DType::kFloat64, {static_cast<int64_t>(values.size())});
      std::memcpy(host.raw_data(), values.data(), values.size() * 8);
      Tensor t = *ctx->ToDevice(host);
      double* p = static_cast<double*>(t.ptr());
      DeviceTotalsArgs a;
      a.sums_of_squares = p;
      a.num_params = 3;
      a.microbatches = p + 3;
      a.num_microbatches = 2;
      a.stride = stride;
      a.clip = 0.5;
      a.totals = p + 3 + 2 * stride;
      EXPECT_TRUE(DeviceTotals(*ctx, a).ok());
      Tensor back = *ctx->ToHost(t);
      const double* b = back.data<double>() + 3 + 2 * stride;
      return std::vector<double>(b, b + kTotalsWords);
    };
    const std::vector<double> got = run(buf);
    const StepTotalsValues want =
        ComputeStepTotals(buf.data(), 3, 8.0 + 5.0, 8.8 + 0.7, 0.5);
    EXPECT_EQ(got[0], want.loss);
    EXPECT_EQ(got[1], want.grad_norm);
    EXPECT_EQ(got[2], want.grad_scale);
    EXPECT_EQ(got[3], 0.0);
    std::vector<double> bad = buf;
    bad[3 + stride + kCheckWords + 2] = 4;  // a plugin's bad-input marker
    EXPECT_EQ(run(bad)[3], 1.0);
    bad = buf;
    bad[1] = std::nan("");
    EXPECT_EQ(run(bad)[3], 1.0);
    bad = buf;
    const uint64_t found = 12345;
    std::memcpy(&bad[3 + kCheckGrad], &found, 8);
    EXPECT_EQ(run(bad)[3], 1.0);
  }
}

}  // namespace
}  // namespace trainyard
