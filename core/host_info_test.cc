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

}  // namespace
}  // namespace trainyard
