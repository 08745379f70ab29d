#include "kernels/cuda/device_allocator.h"

#include "gtest/gtest.h"
#include "kernels/cuda/test_util.h"

namespace trainyard {
namespace gpu {
namespace {

TEST(DeviceAllocatorTest, SteadyStateLoopDoesNotCallCudaMalloc) {
  SKIP_WITHOUT_CUDA_DEVICE();
  DeviceAllocator* a = *DeviceAllocator::ForDevice(0);
  const int64_t sizes[] = {1, 1009, 4 << 20, 17 << 20};
  auto step = [&] {
    std::vector<DeviceBuffer> live;
    for (int64_t s : sizes) live.push_back(*DeviceBuffer::Allocate(0, s));
  };
  step();
  const AllocatorStats before = a->stats();
  for (int i = 0; i < 5; ++i) step();
  const AllocatorStats after = a->stats();
  EXPECT_EQ(after.device_mallocs, before.device_mallocs);
  EXPECT_EQ(after.cache_hits - before.cache_hits, 20);
  EXPECT_EQ(after.bytes_in_use, before.bytes_in_use);
  EXPECT_GT(after.bytes_cached, 0);
  ASSERT_TRUE(a->EmptyCache().ok());
  EXPECT_EQ(a->stats().bytes_cached, 0);
}

TEST(DeviceAllocatorTest, CopiesRoundTripAndFreeRejectsForeignPointer) {
  SKIP_WITHOUT_CUDA_DEVICE();
  std::vector<float> v = {1, 2, 3, 4.5f};
  DeviceBuffer b = testing::Upload(v, DType::kFloat32);
  EXPECT_EQ(testing::Download(b, 4, DType::kFloat32), v);
  DeviceAllocator* a = *DeviceAllocator::ForDevice(0);
  int host = 0;
  EXPECT_EQ(a->Free(&host).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gpu
}  // namespace trainyard
