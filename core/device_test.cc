#include "core/device.h"

#include <string>

#include "gtest/gtest.h"

namespace trainyard {
namespace {

TEST(DeviceTest, ParsesCpuAndCuda) {
  EXPECT_EQ(*ParseDevice("cpu"), Device::Cpu());
  EXPECT_EQ(*ParseDevice("cuda:0"), Device::Cuda(0));
  EXPECT_EQ(*ParseDevice("cuda:12"), Device::Cuda(12));
  EXPECT_EQ(ParseDevice("cuda:3")->ToString(), "cuda:3");
  EXPECT_EQ(Device::Cuda(1).KindName(), std::string("cuda"));
}

TEST(DeviceTest, ParsesTheSimulatedDevice) {
  EXPECT_EQ(*ParseDevice("sim:0"), Device::Sim(0));
  EXPECT_EQ(*ParseDevice("sim:7"), Device::Sim(7));
  EXPECT_EQ(Device::Sim(3).ToString(), "sim:3");
  EXPECT_EQ(Device::Sim(3).KindName(), std::string("sim"));
  EXPECT_TRUE(Device::Sim(0).is_sim());
  EXPECT_FALSE(Device::Sim(0).is_cpu());
  EXPECT_FALSE(Device::Sim(0).is_cuda());
  EXPECT_NE(Device::Sim(0), Device::Cuda(0));
  EXPECT_FALSE(ParseDevice("sim").ok());
  EXPECT_EQ(*ParseDevice("sim", /*allow_bare_cuda=*/true), Device::Sim(0));
  EXPECT_FALSE(ParseDevice("sim:-1").ok());
  EXPECT_FALSE(ParseDevice("sim:1024").ok());
}

TEST(DeviceTest, BareCudaNeedsAnIndexUnlessAllowed) {
  auto d = ParseDevice("cuda");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("name the GPU"), std::string::npos)
      << d.status();
  EXPECT_EQ(*ParseDevice("cuda", /*allow_bare_cuda=*/true), Device::Cuda(0));
}

TEST(DeviceTest, RejectsMalformedWithBoundedMessage) {
  for (const char* bad : {"", "gpu", "cuda:", "cuda:-1", "cuda:1x", "CPU",
                          "cuda: 1", "cuda:99999", "cuda:+1"}) {
    auto d = ParseDevice(bad);
    EXPECT_FALSE(d.ok()) << bad;
    EXPECT_NE(d.status().message().find("expected \"cpu\" or \"cuda:N\""),
              std::string::npos)
        << d.status();
  }
  auto d = ParseDevice(std::string(100000, 'x'));
  ASSERT_FALSE(d.ok());
  EXPECT_LT(d.status().message().size(), 200u);
}

}  // namespace
}  // namespace trainyard
