// Runs on every machine (not tagged gpu): without a usable device, or
// without CUDA at all, every entry point fails with a clean Status.
#include "core/block_config.h"
#include "core/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_mlp_block.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/cuda/elementwise_kernels.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/norm_kernels.h"
#include "kernels/cuda/runtime.h"

namespace trainyard {
namespace gpu {
namespace {

bool HaveDevice() { return CheckDevice(0).ok(); }

TEST(NoDeviceTest, DeviceCountFailsCleanly) {
  if (HaveDevice()) GTEST_SKIP() << "a CUDA device is present";
  absl::StatusOr<int> n = DeviceCount();
  if (n.ok()) {
    EXPECT_EQ(*n, 0);
  } else {
    EXPECT_FALSE(n.status().message().empty());
  }
  EXPECT_FALSE(CheckDevice(0).ok());
}

TEST(NoDeviceTest, AllocatorReturnsErrorNamingDevice) {
  if (HaveDevice()) GTEST_SKIP() << "a CUDA device is present";
  absl::StatusOr<DeviceAllocator*> a = DeviceAllocator::ForDevice(0);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("cuda:0"), std::string::npos)
      << a.status();
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(0, 1024);
  EXPECT_FALSE(b.ok());
}

TEST(NoDeviceTest, GemmAndBlockCreateFail) {
  if (HaveDevice()) GTEST_SKIP() << "a CUDA device is present";
  absl::StatusOr<std::unique_ptr<GemmLt>> g = GemmLt::Create(0);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("GemmLt on cuda:0"), std::string::npos)
      << g.status();
  MlpBlockConfig c;
  c.in_features = c.out_features = 8;
  c.ffn_hidden_size = 32;
  EXPECT_FALSE(CudaMlpBlock::Create(c, ComputeMode::kFloat32, 0).ok());
}

TEST(NoDeviceTest, InvalidConfigIsReportedBeforeDevice) {
  MlpBlockConfig c;  // zero sizes
  absl::StatusOr<std::unique_ptr<CudaMlpBlock>> b =
      CudaMlpBlock::Create(c, ComputeMode::kFloat32, 0);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(NoDeviceTest, LauncherRejectsNullPointersWithoutCrashing) {
  absl::Status s = BiasActivationForward(Activation::kGelu, DType::kFloat32, 3,
                                         5, nullptr, nullptr, nullptr, nullptr);
  EXPECT_FALSE(s.ok());
}

using ::testing::HasSubstr;

TEST(NoDeviceTest, ActivationDTypeCheckNamesTheDType) {
  EXPECT_TRUE(CheckActivationDType("k", DType::kFloat32).ok());
  EXPECT_TRUE(CheckActivationDType("k", DType::kBFloat16).ok());
  absl::Status s = CheckActivationDType("k", DType::kInt64);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "k: dtype int64 is not supported (float32 or bfloat16)");
}

// Argument checks come before any CUDA call, so they answer without a
// device; stub builds (no toolkit) answer Unimplemented instead.
#ifndef TRAINYARD_NO_CUDA
TEST(NoDeviceTest, LaunchersRejectUnsupportedDTypeNamingIt) {
  int dummy = 0;
  absl::Status s = BiasActivationForward(Activation::kRelu, DType::kInt32, 3, 5,
                                         nullptr, &dummy, &dummy, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("BiasActivationForward: dtype int32"));
  s = ColumnSums(DType::kUInt8, 3, 5, &dummy, false,
                 reinterpret_cast<float*>(&dummy), nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("ColumnSums: dtype uint8"));
  s = RmsNormForward(DType::kInt64, 3, 5, &dummy, nullptr, 1e-5f, &dummy,
                     nullptr, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("RmsNormForward: dtype int64"));
}

TEST(NoDeviceTest, ElementwiseActivationLaunchersRejectSwiglu) {
  int dummy = 0;
  absl::Status s =
      BiasActivationForward(Activation::kSwiglu, DType::kFloat32, 3, 5, nullptr,
                            &dummy, &dummy, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("activation swiglu is not supported"));
  s = ActivationBackward(Activation::kSwiglu, DType::kBFloat16, 15, &dummy,
                         &dummy, &dummy, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("ActivationBackward: activation swiglu"));
}
#endif  // TRAINYARD_NO_CUDA

TEST(AllocatorSizeClassTest, RoundSizeCoversRequestWithBoundedWaste) {
  for (size_t bytes :
       {size_t{0}, size_t{1}, size_t{511}, size_t{513}, size_t{1} << 20,
        (size_t{1} << 20) + 1, size_t{3} << 22, (size_t{5} << 27) + 7}) {
    const size_t r = DeviceAllocator::RoundSize(bytes);
    EXPECT_GE(r, bytes);
    EXPECT_EQ(r % 512, 0u) << bytes;
    if (bytes > 4096) {
      EXPECT_LE(r, bytes + bytes / 4 + 512) << bytes;
    }
    EXPECT_EQ(DeviceAllocator::RoundSize(r), r) << bytes;
  }
}

}  // namespace
}  // namespace gpu
}  // namespace trainyard
