#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/tcp_test_util.h"
#include "transport/tcp_transport.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;

// The sockets of this process connected to or accepted from `address`.
std::vector<int> SocketsTo(const std::string& address) {
  std::vector<int> fds;
  for (int fd = 0; fd < 4096; ++fd) {
    sockaddr_in sa{};
    socklen_t len = sizeof(sa);
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0 ||
        sa.sin_family != AF_INET) {
      continue;
    }
    char host[INET_ADDRSTRLEN];
    ::inet_ntop(AF_INET, &sa.sin_addr, host, sizeof(host));
    if (absl::StrCat(host, ":", ntohs(sa.sin_port)) == address) {
      fds.push_back(fd);
    }
  }
  return fds;
}

int GetIntOption(int fd, int level, int name) {
  int value = -1;
  socklen_t len = sizeof(value);
  EXPECT_EQ(::getsockopt(fd, level, name, &value, &len), 0);
  return value;
}

TEST(TcpTransportOptionsTest, KeepaliveAndUserTimeoutAreAppliedToConnections) {
  auto l0 = MustListen();
  auto l1 = MustListen();
  std::vector<std::string> addrs = {l0->address(), l1->address()};
  std::vector<absl::StatusOr<std::unique_ptr<Transport>>> t(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      TcpTransportOptions o;
      o.job_id = "keepalive";
      o.rank = r;
      o.peer_addresses = addrs;
      o.connect_timeout = absl::Seconds(5);
      o.keepalive_idle = absl::Seconds(7);
      o.keepalive_interval = absl::Seconds(3);
      o.keepalive_count = 2;
      o.tcp_user_timeout = absl::Milliseconds(9500);
      t[r] = ConnectTcpTransport(r == 0 ? l0.get() : l1.get(), o);
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_TRUE(t[0].ok()) << t[0].status();
  ASSERT_TRUE(t[1].ok()) << t[1].status();
  // Rank 1 dialed rank 0's listener; rank 0 accepted it there. The accepted
  // end's peer is rank 1's ephemeral port, found through the dialed end.
  const std::vector<int> dialed = SocketsTo(addrs[0]);
  ASSERT_EQ(dialed.size(), 1u);
  sockaddr_in local{};
  socklen_t len = sizeof(local);
  ASSERT_EQ(::getsockname(dialed[0], reinterpret_cast<sockaddr*>(&local), &len),
            0);
  const std::vector<int> accepted =
      SocketsTo(absl::StrCat("127.0.0.1:", ntohs(local.sin_port)));
  ASSERT_EQ(accepted.size(), 1u);
  for (int fd : {dialed[0], accepted[0]}) {
    EXPECT_EQ(GetIntOption(fd, SOL_SOCKET, SO_KEEPALIVE), 1) << fd;
    EXPECT_EQ(GetIntOption(fd, IPPROTO_TCP, TCP_KEEPIDLE), 7) << fd;
    EXPECT_EQ(GetIntOption(fd, IPPROTO_TCP, TCP_KEEPINTVL), 3) << fd;
    EXPECT_EQ(GetIntOption(fd, IPPROTO_TCP, TCP_KEEPCNT), 2) << fd;
    EXPECT_EQ(GetIntOption(fd, IPPROTO_TCP, TCP_USER_TIMEOUT), 9500) << fd;
  }
}

TEST(TcpTransportOptionsTest, DefaultsDetectADeadPeerWithinFifteenSeconds) {
  TcpTransportOptions o;
  EXPECT_LE(o.keepalive_idle + o.keepalive_interval * o.keepalive_count,
            absl::Seconds(15));
  EXPECT_GE(o.keepalive_idle + o.keepalive_interval * o.keepalive_count,
            absl::Seconds(10));
  EXPECT_EQ(o.tcp_user_timeout,
            o.keepalive_idle + o.keepalive_interval * o.keepalive_count);
}

TEST(TcpTransportOptionsTest, BadKeepaliveOptionsAreRejected) {
  auto l = MustListen();
  TcpTransportOptions o;
  o.job_id = "bad-keepalive";
  o.peer_addresses = {l->address()};
  o.keepalive_interval = absl::Milliseconds(500);
  auto t = ConnectTcpTransport(l.get(), o);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(t.status().message(), HasSubstr("keepalive_interval"));
}

}  // namespace
}  // namespace trainyard
