#include "kernels/stream_timer.h"

#include <thread>

#include "gtest/gtest.h"
#include "kernels/cuda/test_util.h"

namespace trainyard {
namespace {

TEST(StreamTimerTest, HostMarksFollowTheClock) {
  for (Device d : {Device::Cpu(), Device::Sim(0)}) {
    auto ctx = ExecContext::Create(d, Precision::kFp32);
    ASSERT_TRUE(ctx.ok());
    StreamTimer timer(ctx->get());
    ASSERT_TRUE(timer.Start().ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    absl::StatusOr<int> a = timer.Mark();
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(*a, 1);
    EXPECT_EQ(*timer.Micros(0), 0);
    EXPECT_GE(*timer.Micros(*a), 20000);
    EXPECT_FALSE(timer.Micros(2).ok());
    ASSERT_TRUE(timer.Start().ok());  // a new step forgets the old marks
    EXPECT_EQ(timer.marks(), 1);
  }
}

TEST(StreamTimerGpuTest, EventsTimeTheStream) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto ctx = ExecContext::Create(Device::Cuda(0), Precision::kFp32);
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  StreamTimer timer(ctx->get());
  ASSERT_TRUE(timer.Start().ok());
  // Work on the stream between two marks: a 256 MiB fill.
  absl::StatusOr<Tensor> big =
      (*ctx)->Zeros(DType::kFloat32, {int64_t{64} << 20});
  ASSERT_TRUE(big.ok());
  absl::StatusOr<int> end = timer.Mark();
  ASSERT_TRUE(end.ok());
  ASSERT_TRUE((*ctx)->Synchronize().ok());
  absl::StatusOr<int64_t> us = timer.Micros(*end);
  ASSERT_TRUE(us.ok()) << us.status();
  EXPECT_GT(*us, 0);
}

}  // namespace
}  // namespace trainyard
