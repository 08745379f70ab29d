#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/tcp_handshake.h"
#include "transport/tcp_test_util.h"
#include "transport/tcp_transport.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;

// `from` sends a small activation to `to`, which must receive it bitwise.
void ExpectFrameGetsThrough(Transport* from, Transport* to, uint64_t seed) {
  Message m;
  m.tensors = {{"x", RandomFloats({3, 5}, seed)}};
  ASSERT_TRUE(from->Send(to->rank(), m).ok());
  auto got = to->Recv(from->rank(), absl::Seconds(5));
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->tensors.size(), 1u);
  EXPECT_TRUE(BitwiseEqual(got->tensors[0].second, RandomFloats({3, 5}, seed)));
}

TEST(TcpTransportAuthTest, RanksWithTheSameSecretConnectAndExchangeFrames) {
  Cluster c = Connect(3, "secret-ok", RandomBytes(32));
  ExpectFrameGetsThrough(c.ranks[0].get(), c.ranks[1].get(), 1);
  ExpectFrameGetsThrough(c.ranks[2].get(), c.ranks[1].get(), 2);
  ExpectFrameGetsThrough(c.ranks[1].get(), c.ranks[0].get(), 3);
  std::vector<std::thread> threads;
  std::vector<std::vector<double>> v(3);
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      v[r] = {double(r + 1)};
      ASSERT_TRUE(c.ranks[r]->AllReduceSum(&v[r], absl::Seconds(5)).ok());
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r) EXPECT_EQ(v[r][0], 6.0);
}

TEST(TcpTransportAuthTest, WrongSecretIsRejectedAndTheRealPeerStillConnects) {
  auto l0 = MustListen();
  auto l1 = MustListen();
  const std::string secret = RandomBytes(32);
  absl::StatusOr<std::unique_ptr<Transport>> t0;
  std::thread rank0([&] {
    t0 =
        ConnectRank(0, l0.get(), l1->address(), "j", secret, absl::Seconds(10));
  });
  const std::string rejected =
      "rank 0 (" + l0->address() +
      "): handshake rejected: rank 1 of job \"j\" for rank 0: data-plane "
      "authentication failed (wrong or missing job secret)";
  for (const std::string& wrong : {RandomBytes(32), std::string()}) {
    auto bad =
        ConnectRank(1, l1.get(), l0->address(), "j", wrong, absl::Seconds(1));
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_THAT(bad.status().message(), HasSubstr(rejected));
  }
  // The registration stayed open: the rank with the secret gets in.
  auto t1 =
      ConnectRank(1, l1.get(), l0->address(), "j", secret, absl::Seconds(5));
  rank0.join();
  ASSERT_TRUE(t1.ok()) << t1.status();
  ASSERT_TRUE(t0.ok()) << t0.status();
  ExpectFrameGetsThrough(t1->get(), t0->get(), 4);
  ExpectFrameGetsThrough(t0->get(), t1->get(), 5);
}

// A listener that does not hold the secret answers every dial with a
// challenge and an accept whose proof it made up.
TEST(TcpTransportAuthTest, ListenerWithoutTheSecretFailsTheDialAttempt) {
  int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  ASSERT_EQ(::listen(lfd, 16), 0);
  socklen_t len = sizeof(sa);
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&sa), &len);
  const std::string impostor = absl::StrCat("127.0.0.1:", ntohs(sa.sin_port));
  std::atomic<bool> stop{false};
  std::atomic<int> answered{0};
  std::thread fake([&] {
    while (!stop.load()) {
      const int fd = ::accept(lfd, nullptr, nullptr);
      if (fd < 0) {
        absl::SleepFor(absl::Milliseconds(5));
        continue;
      }
      ::fcntl(fd, F_SETFL, 0);  // blocking
      std::string hello(kHandshakePrefixSize + kHandshakeNonceSize + 1, '\0');
      if (::recv(fd, hello.data(), hello.size(), MSG_WAITALL) ==
          static_cast<ssize_t>(hello.size())) {
        const std::string c = EncodeHandshakeReply(
            HandshakeReplyCode::kChallenge, NewHandshakeNonce());
        ::send(fd, c.data(), c.size(), MSG_NOSIGNAL);
        char proof[kHandshakeProofSize];
        ::recv(fd, proof, sizeof(proof), MSG_WAITALL);
        const std::string a = EncodeHandshakeReply(
            HandshakeReplyCode::kAccepted, RandomBytes(32));
        ::send(fd, a.data(), a.size(), MSG_NOSIGNAL);
        ++answered;
      }
      ::close(fd);
    }
  });
  auto mine = MustListen();
  auto t = ConnectRank(1, mine.get(), impostor, "k", RandomBytes(32),
                       absl::Seconds(1));
  stop.store(true);
  fake.join();
  ::close(lfd);
  EXPECT_GE(answered.load(), 1);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(t.status().message(),
              HasSubstr("rank 0 (" + impostor +
                        "): handshake: data-plane authentication of the "
                        "listener failed: its proof does not match this "
                        "job's secret"));
}

// Threads of this process (Linux: /proc/self/task).
int ThreadCount() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

// One thread multiplexes every pending handshake: 200 silent connections
// and 20 half hellos cost no thread and do not hold up a real job, which
// connects in well under the 5 s handshake timeout they are waiting out.
TEST(TcpTransportAuthTest, IdleConnectionsDoNotDelayARealHandshake) {
  auto l0 = MustListen();
  auto l1 = MustListen();
  const int before = ThreadCount();
  std::vector<std::unique_ptr<RawPeer>> idle;
  for (int i = 0; i < 220; ++i) {
    idle.push_back(std::make_unique<RawPeer>(l0->address()));
    if (i >= 200) idle.back()->Write("TYHS");
  }
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_LE(ThreadCount(), before);
  const std::string secret = RandomBytes(32);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<Transport>> t0;
  std::thread rank0([&] {
    t0 = ConnectRank(0, l0.get(), l1->address(), "busy", secret,
                     absl::Seconds(5));
  });
  auto t1 =
      ConnectRank(1, l1.get(), l0->address(), "busy", secret, absl::Seconds(5));
  rank0.join();
  const absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(t0.ok()) << t0.status();
  ASSERT_TRUE(t1.ok()) << t1.status();
  EXPECT_LT(took, absl::Seconds(1));
  ExpectFrameGetsThrough(t1->get(), t0->get(), 6);
}

TEST(TcpTransportAuthTest, ConnectionsBeyondTheCapAreClosedUnread) {
  PeerListenerOptions o;
  o.handshake_timeout = absl::Seconds(3);
  o.max_pending_handshakes = 8;
  auto listener = MustListen(o);
  std::vector<std::unique_ptr<RawPeer>> idle;
  for (int i = 0; i < 8; ++i) {
    idle.push_back(std::make_unique<RawPeer>(listener->address()));
  }
  // The ninth is closed at once, with no reply, long before the timeout.
  RawPeer extra(listener->address());
  const absl::Time start = absl::Now();
  EXPECT_EQ(extra.ReadAll(), "");
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  // Closing the idle ones frees their places at once; a real job connects.
  idle.clear();
  absl::SleepFor(absl::Milliseconds(100));
  auto imp = Impersonate(listener.get(), "after-cap");
  imp.rank1->Write(FrameBytes("after-cap", RandomFloats({2, 2}, 3), false));
  auto m = imp.rank0->Recv(1, absl::Seconds(5));
  ASSERT_TRUE(m.ok()) << m.status();
  PeerListenerOptions bad;
  bad.max_pending_handshakes = 0;
  EXPECT_THAT(PeerListener::Listen("127.0.0.1:0", bad).status().message(),
              HasSubstr("max_pending_handshakes must be >= 1"));
}

}  // namespace
}  // namespace trainyard
