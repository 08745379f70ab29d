#include "core/host_info.h"

#include <unistd.h>

#include "gtest/gtest.h"

namespace trainyard {
namespace {

TEST(HostInfoTest, HostnameIsTheSystemsOrLocalhost) {
  char buf[256] = {};
  const std::string want =
      gethostname(buf, sizeof(buf) - 1) == 0 ? buf : "localhost";
  EXPECT_EQ(Hostname(), want);
  EXPECT_FALSE(Hostname().empty());
}

TEST(HostInfoTest, MemoryIsPhysicalCappedByTheCgroup) {
  const uint64_t physical = PhysicalMemoryBytes();
  EXPECT_GT(physical, uint64_t{64} << 20);  // any machine that runs tests
  const uint64_t usable = UsableMemoryBytes();
  EXPECT_GT(usable, 0u);
  EXPECT_LE(usable, physical);
}

TEST(HostInfoTest, ProcessStatusBytesReadsKiBFields) {
  absl::StatusOr<uint64_t> rss = ProcessStatusBytes("VmRSS");
  ASSERT_TRUE(rss.ok()) << rss.status();
  EXPECT_GT(*rss, uint64_t{1} << 20);
  EXPECT_EQ(*rss % 1024, 0u);
  absl::StatusOr<uint64_t> peak = ProcessStatusBytes("VmHWM");
  ASSERT_TRUE(peak.ok()) << peak.status();
  EXPECT_GE(*peak, *rss);
  EXPECT_EQ(ProcessStatusBytes("NoSuchField").status().code(),
            absl::StatusCode::kNotFound);
  // A line that is not a count of kB.
  EXPECT_EQ(ProcessStatusBytes("Name").status().code(),
            absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace trainyard
