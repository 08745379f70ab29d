#include "core/sim_device.h"

#include <cstring>

#include "gtest/gtest.h"

namespace trainyard {
namespace {

TEST(SimDeviceTest, TensorsAreOnTheSimDevice) {
  absl::StatusOr<Tensor> t =
      Tensor::Create(DType::kFloat32, {3, 4}, SimAllocator(2));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->device(), Device::Sim(2));
  EXPECT_EQ(t->device().ToString(), "sim:2");
  EXPECT_NE(t->ptr(), nullptr);
  EXPECT_EQ(SimAllocator(2), SimAllocator(2));
  EXPECT_NE(SimAllocator(2), SimAllocator(3));
}

TEST(SimDeviceDeathTest, HostAccessIsABug) {
  Tensor t = *Tensor::Create(DType::kFloat32, {4}, SimAllocator(0));
  EXPECT_DEATH(t.data<float>(), "host access to a tensor on sim:0");
  EXPECT_DEATH(t.Fill(1.0f), "host access to a tensor on sim:0");
}

TEST(SimDeviceTest, HostViewAndAdoptShareMemory) {
  Tensor t = *Tensor::Create(DType::kFloat32, {2, 2}, SimAllocator(0));
  Tensor view = SimDeviceAccess::HostView(t);
  EXPECT_TRUE(view.device().is_cpu());
  EXPECT_EQ(view.ptr(), t.ptr());
  view.Fill(3.5f);
  Tensor host = Tensor::Zeros(DType::kFloat32, {2, 2});
  Tensor adopted = SimDeviceAccess::Adopt(host, Device::Sim(0));
  EXPECT_EQ(adopted.device(), Device::Sim(0));
  EXPECT_EQ(adopted.ptr(), host.ptr());
  float got;
  std::memcpy(&got, t.ptr(), sizeof(got));
  EXPECT_EQ(got, 3.5f);
}

}  // namespace
}  // namespace trainyard
