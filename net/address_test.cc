#include "net/address.h"

#include <arpa/inet.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;

TEST(AddressTest, HostOfAddress) {
  EXPECT_EQ(HostOfAddress("10.0.0.5:7100"), "10.0.0.5");
  EXPECT_EQ(HostOfAddress("worker-3:7000"), "worker-3");
  EXPECT_EQ(HostOfAddress("[::1]:7100"), "::1");
  EXPECT_EQ(HostOfAddress("[::]:0"), "::");
  EXPECT_EQ(HostOfAddress("localhost"), "localhost");
  EXPECT_EQ(HostOfAddress(":7100"), "");
}

TEST(AddressTest, ResolvesNumericAndNamedHosts) {
  absl::StatusOr<sockaddr_in> a = ResolveIpv4("127.0.0.1:7100");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(ntohs(a->sin_port), 7100);
  EXPECT_EQ(ntohl(a->sin_addr.s_addr), 0x7F000001u);
  absl::StatusOr<sockaddr_in> b = ResolveIpv4("localhost:0");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(ntohs(b->sin_port), 0);
}

TEST(AddressTest, BadAddressesNameThemselves) {
  for (const char* bad :
       {"127.0.0.1", "127.0.0.1:70000", "127.0.0.1:-1", "127.0.0.1:x"}) {
    absl::StatusOr<sockaddr_in> a = ResolveIpv4(bad);
    ASSERT_FALSE(a.ok()) << bad;
    EXPECT_THAT(a.status().message(), HasSubstr(bad));
    EXPECT_THAT(a.status().message(), HasSubstr("host:port"));
  }
  absl::StatusOr<sockaddr_in> a = ResolveIpv4("no-such-host.invalid:7");
  ASSERT_FALSE(a.ok());
  EXPECT_THAT(a.status().message(), HasSubstr("cannot resolve host"));
}

}  // namespace
}  // namespace trainyard
