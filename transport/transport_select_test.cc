#include "transport/transport_select.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;

TransportChoice Choose(const std::vector<StagePlacement>& stages,
                       bool nccl_built = true) {
  absl::StatusOr<TransportChoice> c = ChooseTransport(stages, nccl_built);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : TransportChoice{};
}

TEST(TransportSelectTest, DistinctGpusUseNccl) {
  TransportChoice c =
      Choose({{"a", "cuda:0"}, {"a", "cuda:1"}, {"b", "cuda:0"}});
  EXPECT_EQ(c.kind, TransportKind::kNccl);
  EXPECT_FALSE(c.host_staging);
  EXPECT_EQ(c.reason, "all 3 stages are on distinct GPUs: using NCCL");
}

TEST(TransportSelectTest, SharedGpuUsesTcpWithHostStaging) {
  TransportChoice c =
      Choose({{"a", "cuda:1"}, {"a", "cuda:0"}, {"a", "cuda:0"}});
  EXPECT_EQ(c.kind, TransportKind::kTcp);
  EXPECT_TRUE(c.host_staging);
  EXPECT_EQ(
      c.reason,
      "stages 1 and 2 share cuda:0 on host a: using TCP with host staging");
}

TEST(TransportSelectTest, SimulatedDevicesUseTcpWithHostStaging) {
  TransportChoice c = Choose({{"a", "sim:0"}, {"a", "sim:1"}});
  EXPECT_EQ(c.kind, TransportKind::kTcp);
  EXPECT_TRUE(c.host_staging);
  EXPECT_EQ(c.reason,
            "stages 0, 1 are on a simulated device: using TCP with host "
            "staging");
}

TEST(TransportSelectTest, SameIndexOnDifferentHostsIsDistinct) {
  EXPECT_EQ(Choose({{"a", "cuda:0"}, {"b", "cuda:0"}}).kind,
            TransportKind::kNccl);
}

TEST(TransportSelectTest, BuildWithoutNcclUsesTcp) {
  TransportChoice c = Choose({{"a", "cuda:0"}, {"a", "cuda:1"}},
                             /*nccl_built=*/false);
  EXPECT_EQ(c.kind, TransportKind::kTcp);
  EXPECT_TRUE(c.host_staging);
  EXPECT_THAT(c.reason, HasSubstr("this build has no NCCL"));
}

TEST(TransportSelectTest, AllCpuUsesTcpWithoutStaging) {
  TransportChoice c = Choose({{"a", "cpu"}, {"b", "cpu"}});
  EXPECT_EQ(c.kind, TransportKind::kTcp);
  EXPECT_FALSE(c.host_staging);
  EXPECT_EQ(c.reason, "every stage is on cpu: using TCP");
}

TEST(TransportSelectTest, MixedCpuAndGpuUsesTcpWithStaging) {
  TransportChoice c = Choose({{"a", "cuda:0"}, {"a", "cpu"}, {"b", "cuda:0"}});
  EXPECT_EQ(c.kind, TransportKind::kTcp);
  EXPECT_TRUE(c.host_staging);
  EXPECT_EQ(c.reason, "stage 1 is on cpu: using TCP with host staging");
  EXPECT_EQ(Choose({{"a", "cpu"}, {"a", "cuda:0"}, {"b", "cpu"}}).reason,
            "stages 0, 2 are on cpu: using TCP with host staging");
}

TEST(TransportSelectTest, OneStageNeedsNoTransport) {
  TransportChoice c = Choose({{"a", "cuda:3"}});
  EXPECT_EQ(c.kind, TransportKind::kNone);
  EXPECT_EQ(c.reason, "one stage on cuda:3 on host a: no transport needed");
}

TEST(TransportSelectTest, BadInputsAreErrorsNamingTheStage) {
  auto code_and_message = [](const std::vector<StagePlacement>& stages) {
    absl::StatusOr<TransportChoice> c = ChooseTransport(stages, true);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(c.status().message());
  };
  EXPECT_THAT(code_and_message({}), HasSubstr("no stages"));
  EXPECT_THAT(code_and_message({{"a", "cpu"}, {"", "cpu"}}),
              HasSubstr("stage 1 has an empty host"));
  EXPECT_THAT(
      code_and_message({{"a", "cuda"}, {"a", "cuda:1"}}),
      HasSubstr("stage 0 device \"cuda\": expected \"cpu\" or \"cuda:N\""));
  EXPECT_THAT(code_and_message({{"a", "cuda:0"}, {"a", "gpu0"}}),
              HasSubstr("stage 1 device \"gpu0\""));
  EXPECT_THAT(code_and_message({{"a", "cuda:-1"}, {"a", "cuda:1"}}),
              HasSubstr("stage 0 device \"cuda:-1\""));
  EXPECT_THAT(code_and_message({{"a", "cuda:1x"}, {"a", "cuda:1"}}),
              HasSubstr("stage 0 device \"cuda:1x\""));
}

TEST(TransportSelectTest, KindNames) {
  EXPECT_STREQ(TransportKindName(TransportKind::kNone), "none");
  EXPECT_STREQ(TransportKindName(TransportKind::kTcp), "tcp");
  EXPECT_STREQ(TransportKindName(TransportKind::kNccl), "nccl");
}

}  // namespace
}  // namespace trainyard
