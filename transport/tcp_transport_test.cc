#include "transport/tcp_transport.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/crc32c.h"
#include "core/random.h"
#include "core/sha256.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/frame.h"
#include "transport/in_process_transport.h"
#include "transport/tcp_handshake.h"
#include "transport/tcp_test_util.h"

namespace trainyard {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(TcpTransportTest, RoundTripsOddShapesBitwiseBothWays) {
  Cluster c = Connect(2, "roundtrip");
  Tensor x = RandomFloats({3, 7, 5}, 1);
  Tensor ids = Tensor::Empty(DType::kInt64, {13});
  for (int i = 0; i < 13; ++i)
    ids.data<int64_t>()[i] = (int64_t{1} << 40) * i - 7;
  Tensor empty = Tensor::Zeros(DType::kFloat32, {0, 3});
  Tensor big = RandomFloats({257, 1031}, 2);  // > one 256 KiB chunk, odd
  for (int from : {0, 1}) {
    const int to = 1 - from;
    Message m;
    m.kind = from == 0 ? MessageKind::kActivation : MessageKind::kGradient;
    m.step = 123456789012 + from;
    m.microbatch = 7;
    m.tensors = {{"x", x}, {"ids", ids}, {"empty", empty}, {"big", big}};
    ASSERT_TRUE(c.ranks[from]->Send(to, m).ok());
    auto got = c.ranks[to]->Recv(from, absl::Seconds(5));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->kind, m.kind);
    EXPECT_EQ(got->step, m.step);
    EXPECT_EQ(got->microbatch, 7);
    ASSERT_EQ(got->tensors.size(), 4u);
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(got->tensors[i].first, m.tensors[i].first);
      EXPECT_TRUE(BitwiseEqual(got->tensors[i].second, m.tensors[i].second))
          << m.tensors[i].first;
    }
  }
}

TEST(TcpTransportTest, MessagesArriveWithTheirChunk) {
  Cluster c = Connect(2, "chunk");
  for (int32_t chunk : {3, 0, kMaxFrameChunk}) {
    Message m;
    m.kind = MessageKind::kGradient;
    m.microbatch = 5;
    m.chunk = chunk;
    m.tensors = {{"x", RandomFloats({4}, 9)}};
    ASSERT_TRUE(c.ranks[1]->Send(0, std::move(m)).ok());
    auto got = c.ranks[0]->Recv(1, absl::Seconds(5));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->chunk, chunk);
    EXPECT_EQ(got->microbatch, 5);
  }
}

TEST(TcpTransportTest, SendRejectsAChunkTheFrameCannotCarry) {
  Cluster c = Connect(2, "bad-chunk");
  Message m;
  m.chunk = kMaxFrameChunk + 1;
  const absl::Status s = c.ranks[0]->Send(1, m);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("rank 0: send to rank 1: frame: chunk must be in "
                        "[0, 65535], got 65536"));
  // Nothing went out and the transport still works.
  m.chunk = 1;
  ASSERT_TRUE(c.ranks[0]->Send(1, m).ok());
  auto got = c.ranks[1]->Recv(0, absl::Seconds(5));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->chunk, 1);
}

TEST(TcpTransportTest, CountsTheTensorBytesSentAndReceived) {
  Cluster c = Connect(2, "bytes");
  const int64_t before_sent = c.ranks[0]->payload_bytes_sent();
  const int64_t before_received = c.ranks[1]->payload_bytes_received();
  Message m;
  m.tensors.emplace_back("x", RandomFloats({2, 3}, 1));  // 24 bytes
  m.tensors.emplace_back("y", RandomFloats({5}, 2));     // 20 bytes
  ASSERT_TRUE(c.ranks[0]->Send(1, std::move(m)).ok());
  ASSERT_TRUE(c.ranks[1]->Recv(0, absl::Seconds(5)).ok());
  EXPECT_EQ(c.ranks[1]->payload_bytes_received() - before_received, 44);
  for (int i = 0;
       i < 100 && c.ranks[0]->payload_bytes_sent() - before_sent < 44; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(c.ranks[0]->payload_bytes_sent() - before_sent, 44);
}

TEST(TcpTransportTest, ManyMessagesOfMixedKindsArriveInSendOrder) {
  Cluster c = Connect(2, "order");
  const int n = 400;
  for (int i = 0; i < n; ++i) {
    Message m;
    m.kind = static_cast<MessageKind>(i % 3);
    m.step = i / 4;
    m.microbatch = i;
    m.tensors = {{"x", Tensor::FromVector({float(i)}, {1})}};
    ASSERT_TRUE(c.ranks[0]->Send(1, std::move(m)).ok());
  }
  for (int i = 0; i < n; ++i) {
    auto m = c.ranks[1]->Recv(0, absl::Seconds(5));
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->microbatch, i);
    EXPECT_EQ(m->kind, static_cast<MessageKind>(i % 3));
    EXPECT_EQ(m->tensors[0].second.data<float>()[0], float(i));
  }
}

TEST(TcpTransportTest, AllReduceEqualsInProcessBitwiseOverManyRounds) {
  const int n = 4, rounds = 60, len = 37;
  // Values of very different magnitudes so that summation order matters.
  auto input = [&](int rank, int round) {
    Rng rng(rank * 1000 + round);
    std::vector<double> v(len);
    for (double& x : v) x = rng.Normal() * std::pow(10.0, rng.Below(30) - 15.0);
    return v;
  };
  std::vector<std::vector<std::vector<double>>> want(n), got(n);
  auto run = [&](std::vector<Transport*> ranks,
                 std::vector<std::vector<std::vector<double>>>* out) {
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        for (int k = 0; k < rounds; ++k) {
          std::vector<double> v = input(r, k);
          absl::Status s = ranks[r]->AllReduceSum(&v, absl::Seconds(5));
          ASSERT_TRUE(s.ok()) << s;
          (*out)[r].push_back(v);
        }
      });
    }
    for (auto& t : threads) t.join();
  };
  InProcessHub hub(n);
  run({hub.rank(0), hub.rank(1), hub.rank(2), hub.rank(3)}, &want);
  Cluster c = Connect(n, "allreduce");
  run({c.ranks[0].get(), c.ranks[1].get(), c.ranks[2].get(), c.ranks[3].get()},
      &got);
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(got[r].size(), static_cast<size_t>(rounds));
    for (int k = 0; k < rounds; ++k) {
      ASSERT_EQ(std::memcmp(got[r][k].data(), want[0][k].data(),
                            len * sizeof(double)),
                0)
          << "rank " << r << " round " << k;
    }
  }
}

TEST(TcpTransportTest, AllReduceLengthMismatchFailsEveryRank) {
  Cluster c = Connect(3, "mismatch");
  std::vector<absl::Status> status(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      std::vector<double> v(r == 2 ? 5 : 4, 1.0);
      status[r] = c.ranks[r]->AllReduceSum(&v, absl::Seconds(5));
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kInvalidArgument) << r;
    EXPECT_THAT(status[r].message(),
                HasSubstr("rank 2 sent 5 values, rank 0 sent 4"));
  }
}

TEST(TcpTransportTest, RecvTimesOutNamingThePeer) {
  Cluster c = Connect(2, "timeout");
  const absl::Time start = absl::Now();
  auto m = c.ranks[1]->Recv(0, absl::Milliseconds(150));
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(m.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(m.status().message(),
              HasSubstr("no message from rank 0 (" + c.addresses[0] + ")"));
  EXPECT_GE(took, absl::Milliseconds(150));
  EXPECT_LT(took, absl::Seconds(2));
  EXPECT_EQ(c.ranks[1]->Send(1, Message()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TcpTransportTest, AbortedRankFailsItsOwnCallsAndThePeersNamingIt) {
  Cluster c = Connect(3, "abort");
  absl::Status recv0, reduce2;
  absl::Time failed0, failed2;
  std::thread t0([&] {
    recv0 = c.ranks[0]->Recv(1, absl::Seconds(30)).status();
    failed0 = absl::Now();
  });
  std::thread t2([&] {
    std::vector<double> v = {1.0};
    reduce2 = c.ranks[2]->AllReduceSum(&v, absl::Seconds(30));
    failed2 = absl::Now();
  });
  absl::SleepFor(absl::Milliseconds(100));
  const absl::Time aborted = absl::Now();
  c.ranks[1]->Abort(absl::InternalError("stage 1 failed: disk full"));
  auto own = c.ranks[1]->Recv(0, absl::Seconds(1));
  EXPECT_EQ(own.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(own.status().message(), HasSubstr("stage 1 failed: disk full"));
  EXPECT_EQ(c.ranks[1]->Send(0, Message()).code(), absl::StatusCode::kAborted);
  t0.join();
  t2.join();
  const std::string rank1 = "rank 1 (" + c.addresses[1] + ")";
  EXPECT_THAT(recv0.message(),
              HasSubstr(rank1 + " aborted: stage 1 failed: disk full"));
  EXPECT_EQ(recv0.code(), absl::StatusCode::kInternal);
  // Rank 2 waits for rank 0's result; it hears rank 1's abort on its own
  // connection.
  EXPECT_THAT(reduce2.message(),
              HasSubstr(rank1 + " aborted: stage 1 failed: disk full"));
  EXPECT_EQ(reduce2.code(), absl::StatusCode::kInternal);
  EXPECT_LT(failed0 - aborted, absl::Seconds(2));
  EXPECT_LT(failed2 - aborted, absl::Seconds(2));
}

// Rank 0 aborts with `reason` while rank 1 waits in Recv; returns what
// rank 1's Recv got and checks it came within 1 s.
absl::Status PeerSeesAbort(const absl::Status& reason, Cluster* c) {
  absl::Status got;
  absl::Time failed;
  std::thread waiter([&] {
    got = c->ranks[1]->Recv(0, absl::Seconds(30)).status();
    failed = absl::Now();
  });
  absl::SleepFor(absl::Milliseconds(100));
  const absl::Time aborted = absl::Now();
  c->ranks[0]->Abort(reason);
  waiter.join();
  EXPECT_LT(failed - aborted, absl::Seconds(1));
  return got;
}

TEST(TcpTransportTest, PeerOfCancelledRankFailsWithCancelledAndTheReason) {
  Cluster c = Connect(2, "cancel");
  absl::Status s =
      PeerSeesAbort(absl::CancelledError("cancelled by request: test"), &c);
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(s.message(), HasSubstr("rank 0 (" + c.addresses[0] +
                                     ") aborted: cancelled by request: test"));
  // Later calls fail the same way.
  absl::Status send = c.ranks[1]->Send(0, Message());
  EXPECT_EQ(send.code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(send.message(), HasSubstr("cancelled by request: test"));
  std::vector<double> v = {1.0};
  EXPECT_EQ(c.ranks[1]->AllReduceSum(&v, absl::Seconds(5)).code(),
            absl::StatusCode::kCancelled);
  // The aborting rank's own calls say Aborted, with the reason.
  auto own = c.ranks[0]->Recv(1, absl::Seconds(1)).status();
  EXPECT_EQ(own.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(own.message(), HasSubstr("cancelled by request: test"));
}

TEST(TcpTransportTest, PeerOfFailedRankFailsWithInternalAndTheReason) {
  Cluster c = Connect(2, "internal");
  absl::Status s = PeerSeesAbort(
      absl::InternalError("stage 0 failed: plugin \"x\": boom"), &c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(s.message(),
              HasSubstr("rank 0 (" + c.addresses[0] +
                        ") aborted: stage 0 failed: plugin \"x\": boom"));
}

TEST(TcpTransportTest, ConcurrentAbortsDeliverOneReason) {
  // As in a worker: the cancel aborts the transport while the stage, failing
  // because of it, aborts it again.
  for (int i = 0; i < 5; ++i) {
    Cluster c = Connect(2, absl::StrCat("double-", i));
    std::thread a(
        [&] { c.ranks[0]->Abort(absl::CancelledError("cancelled: first")); });
    std::thread b(
        [&] { c.ranks[0]->Abort(absl::InternalError("stage 0: second")); });
    a.join();
    b.join();
    absl::Status s = c.ranks[1]->Recv(0, absl::Seconds(5)).status();
    EXPECT_THAT(s.message(),
                HasSubstr("rank 0 (" + c.addresses[0] + ") aborted: "));
    EXPECT_TRUE((s.code() == absl::StatusCode::kCancelled &&
                 absl::StrContains(s.message(), "cancelled: first")) ||
                (s.code() == absl::StatusCode::kInternal &&
                 absl::StrContains(s.message(), "stage 0: second")))
        << s;
  }
}

TEST(TcpTransportTest, AbortReachesThePeerBehindQueuedSends) {
  Cluster c = Connect(2, "queued");
  // 32 MiB queued to rank 1 (which does read): the abort must not wait for
  // the queue, only for the frame in flight.
  for (int i = 0; i < 8; ++i) {
    Message m;
    m.tensors = {{"x", Tensor::Zeros(DType::kFloat32, {1024, 1024})}};
    ASSERT_TRUE(c.ranks[0]->Send(1, m).ok());
  }
  const absl::Time start = absl::Now();
  c.ranks[0]->Abort(absl::CancelledError("cancelled by request: queued"));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(600));
  // Whatever arrived before the abort may be read or dropped; the abort
  // reason must come.
  absl::Status s;
  for (int i = 0; i < 10 && s.ok(); ++i) {
    s = c.ranks[1]->Recv(0, absl::Seconds(5)).status();
  }
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_THAT(s.message(), HasSubstr("cancelled by request: queued"));
}

TEST(TcpTransportTest, DestroyedRankFlushesThenPeersFailNamingIt) {
  Cluster c = Connect(2, "destroy");
  for (int i = 0; i < 3; ++i) {
    Message m;
    m.microbatch = i;
    m.tensors = {{"x", RandomFloats({512, 512}, i)}};
    ASSERT_TRUE(c.ranks[1]->Send(0, m).ok());
  }
  c.ranks[1].reset();
  for (int i = 0; i < 3; ++i) {
    auto m = c.ranks[0]->Recv(1, absl::Seconds(5));
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->microbatch, i);
  }
  const absl::Time start = absl::Now();
  auto m = c.ranks[0]->Recv(1, absl::Seconds(30));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(m.status().message(), HasSubstr("rank 1 (" + c.addresses[1] +
                                              ") closed its transport"));
}

TEST(TcpTransportTest, ConnectionArrivingBeforeRegistrationWaits) {
  auto l0 = MustListen();
  auto l1 = MustListen();
  std::vector<std::string> addrs = {l0->address(), l1->address()};
  TcpTransportOptions o;
  o.job_id = "late";
  o.peer_addresses = addrs;
  o.connect_timeout = absl::Seconds(5);
  absl::StatusOr<std::unique_ptr<Transport>> t1;
  std::thread dialer([&] {
    TcpTransportOptions o1 = o;
    o1.rank = 1;
    t1 = ConnectTcpTransport(l1.get(), o1);
  });
  absl::SleepFor(absl::Milliseconds(300));  // rank 1's handshake is waiting
  auto t0 = ConnectTcpTransport(l0.get(), o);
  dialer.join();
  ASSERT_TRUE(t0.ok()) << t0.status();
  ASSERT_TRUE(t1.ok()) << t1.status();
  ASSERT_TRUE((*t1)->Send(0, Message()).ok());
  EXPECT_TRUE((*t0)->Recv(1, absl::Seconds(5)).ok());
}

TEST(TcpTransportTest, ConnectTimeoutNamesTheMissingRanks) {
  auto l0 = MustListen();
  auto l1 = MustListen();
  // Rank 2's listener never existed: take a port and close it again.
  std::string missing;
  {
    auto l2 = MustListen();
    missing = l2->address();
  }
  std::vector<std::string> addrs = {l0->address(), l1->address(), missing};
  absl::StatusOr<std::unique_ptr<Transport>> t1;
  std::thread other([&] {
    TcpTransportOptions o;
    o.job_id = "missing";
    o.rank = 1;
    o.peer_addresses = addrs;
    o.connect_timeout = absl::Milliseconds(500);
    t1 = ConnectTcpTransport(l1.get(), o);
  });
  TcpTransportOptions o;
  o.job_id = "missing";
  o.rank = 0;
  o.peer_addresses = addrs;
  o.connect_timeout = absl::Milliseconds(500);
  const absl::Time start = absl::Now();
  auto t0 = ConnectTcpTransport(l0.get(), o);
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  other.join();
  EXPECT_EQ(t0.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(t0.status().message(),
              HasSubstr("rank 2 (" + missing + "): never connected"));
  EXPECT_THAT(t0.status().message(), Not(HasSubstr("rank 1 (")));
  // Rank 2 is the higher rank for both; rank 1 reached rank 0.
  EXPECT_THAT(t1.status().message(), HasSubstr("rank 2 (" + missing + ")"));

  // A dialer whose target is not listening says so.
  TcpTransportOptions o2;
  o2.job_id = "refused";
  o2.rank = 1;
  o2.peer_addresses = {missing, l1->address()};
  o2.connect_timeout = absl::Milliseconds(300);
  auto t = ConnectTcpTransport(l1.get(), o2);
  EXPECT_THAT(t.status().message(), AllOf(HasSubstr("rank 0 (" + missing + ")"),
                                          HasSubstr("Connection refused")));
}

// Rank `rank` of a 2-rank job whose other rank never shows up, cancelled
// through TcpTransportOptions::cancel after 200 ms.
absl::Status ConnectAndCancel(int rank, absl::Duration* took) {
  auto mine = MustListen();
  std::string absent;  // a port nobody listens on
  {
    auto gone = MustListen();
    absent = gone->address();
  }
  std::atomic<bool> cancel{false};
  TcpTransportOptions o;
  o.job_id = absl::StrCat("cancel-connect-", rank);
  o.rank = rank;
  o.peer_addresses = rank == 0
                         ? std::vector<std::string>{mine->address(), absent}
                         : std::vector<std::string>{absent, mine->address()};
  o.connect_timeout = absl::Seconds(30);
  o.cancel = &cancel;
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(200));
    cancel.store(true);
  });
  const absl::Time start = absl::Now();
  auto t = ConnectTcpTransport(mine.get(), o);
  *took = absl::Now() - start;
  canceller.join();
  return t.status();
}

TEST(TcpTransportTest, CancelStopsWaitingForAPeerToDialIn) {
  absl::Duration took;
  const absl::Status s = ConnectAndCancel(/*rank=*/0, &took);
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_THAT(s.message(), AllOf(HasSubstr("job \"cancel-connect-0\" rank 0"),
                                 HasSubstr("connection setup cancelled")));
  EXPECT_GE(took, absl::Milliseconds(200));
  EXPECT_LT(took, absl::Seconds(1));
}

TEST(TcpTransportTest, CancelStopsDialingAPeerThatIsNotThere) {
  absl::Duration took;
  const absl::Status s = ConnectAndCancel(/*rank=*/1, &took);
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_THAT(s.message(), HasSubstr("connection setup cancelled"));
  EXPECT_GE(took, absl::Milliseconds(200));
  EXPECT_LT(took, absl::Seconds(1));
}

TEST(TcpTransportTest, AlreadyCancelledConnectReturnsAtOnce) {
  auto l = MustListen();
  std::atomic<bool> cancel{true};
  TcpTransportOptions o;
  o.job_id = "cancelled-before";
  o.rank = 0;
  o.peer_addresses = {l->address(), "127.0.0.1:1"};
  o.cancel = &cancel;
  const absl::Time start = absl::Now();
  auto t = ConnectTcpTransport(l.get(), o);
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(100));
  EXPECT_EQ(t.status().code(), absl::StatusCode::kCancelled) << t.status();
  // The registration is gone: the same job and rank can connect again.
  cancel.store(false);
  o.connect_timeout = absl::Milliseconds(100);
  EXPECT_EQ(ConnectTcpTransport(l.get(), o).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

// An unset cancel flag changes nothing: the pair connects.
TEST(TcpTransportTest, UnsetCancelFlagLetsTheConnectionsComeUp) {
  auto l0 = MustListen();
  auto l1 = MustListen();
  std::atomic<bool> cancel{false};
  std::vector<absl::StatusOr<std::unique_ptr<Transport>>> t(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      TcpTransportOptions o;
      o.job_id = "flag-unset";
      o.rank = r;
      o.peer_addresses = {l0->address(), l1->address()};
      o.connect_timeout = absl::Seconds(5);
      o.cancel = &cancel;
      t[r] = ConnectTcpTransport(r == 0 ? l0.get() : l1.get(), o);
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_TRUE(t[0].ok()) << t[0].status();
  ASSERT_TRUE(t[1].ok()) << t[1].status();
  ASSERT_TRUE((*t[1])->Send(0, Message()).ok());
  EXPECT_TRUE((*t[0])->Recv(1, absl::Seconds(5)).ok());
}

absl::Status RecvError(Transport* t) {
  const absl::Time start = absl::Now();
  absl::Status s = t->Recv(1, absl::Seconds(10)).status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2)) << s;
  return s;
}

class FaultInjectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PeerListenerOptions o;
    o.handshake_timeout = absl::Milliseconds(500);
    o.unknown_job_timeout = absl::Milliseconds(200);
    listener_ = MustListen(o);
  }
  void TearDown() override {
    // The listener still serves a real job after every fault.
    auto imp = Impersonate(listener_.get(), "after-fault");
    imp.rank1->Write(FrameBytes("after-fault", RandomFloats({2, 3}, 9), false));
    auto m = imp.rank0->Recv(1, absl::Seconds(5));
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_TRUE(BitwiseEqual(m->tensors[0].second, RandomFloats({2, 3}, 9)));
  }
  std::unique_ptr<PeerListener> listener_;
};

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

// Rank 0 of job `job` on `listener` with `secret`, connecting in the
// background until the test's real rank 1 (a RawPeer) comes.
struct WaitingRank0 {
  WaitingRank0(PeerListener* listener, const std::string& job,
               const std::string& secret)
      : thread([=] {
          t = ConnectRank(0, listener, "127.0.0.1:1", job, secret,
                          absl::Seconds(5));
        }) {}
  Transport* Join() {
    thread.join();
    CHECK(t.ok()) << t.status();
    return t->get();
  }
  absl::StatusOr<std::unique_ptr<Transport>> t;
  std::thread thread;
};

TEST_F(FaultInjectionTest, GarbageProofIsRejectedBeforeAnyFrameIsRead) {
  const std::string secret = RandomBytes(32);
  WaitingRank0 rank0(listener_.get(), "proof", secret);
  // A valid hello, a made-up proof and a frame right behind it.
  RawPeer attacker(listener_->address());
  Handshake hello{"proof", 1, 0};
  std::string error;
  ASSERT_NE(attacker.Hello(&hello, &error), "") << error;
  attacker.Write(EncodeHandshakeProof(RandomBytes(32)) +
                 FrameBytes("proof", RandomFloats({2, 2}, 66), false));
  EXPECT_EQ(attacker.ReadReply(),
            "rank 1 of job \"proof\" for rank 0: data-plane authentication "
            "failed (wrong or missing job secret)");
  // Not even a proof's shape.
  RawPeer garbage(listener_->address());
  ASSERT_NE(garbage.Hello(&hello, &error), "") << error;
  garbage.Write(std::string(kHandshakeProofSize, 'Z'));
  EXPECT_THAT(garbage.ReadReply(),
              HasSubstr("rank 1 of job \"proof\" for rank 0: data-plane "
                        "authentication failed: bad handshake proof magic"));
  // The real rank 1 still connects; rank 0 gets its frame, not the
  // attacker's.
  RawPeer real(listener_->address());
  ASSERT_EQ(real.Authenticate("proof", 1, 0, secret), "");
  Transport* t0 = rank0.Join();
  real.Write(FrameBytes("proof", RandomFloats({2, 2}, 7), false));
  auto m = t0->Recv(1, absl::Seconds(5));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(BitwiseEqual(m->tensors[0].second, RandomFloats({2, 2}, 7)));
}

TEST_F(FaultInjectionTest, SilenceAfterTheChallengeTimesOut) {
  WaitingRank0 rank0(listener_.get(), "mute", "s");
  RawPeer mute(listener_->address());
  Handshake hello{"mute", 1, 0};
  std::string error;
  ASSERT_NE(mute.Hello(&hello, &error), "") << error;
  mute.Write("TYHP");
  EXPECT_EQ(mute.ReadReply(),
            "rank 1 of job \"mute\" for rank 0: handshake: no proof of the job "
            "secret within 500ms (got 4 of 36 bytes)");
  RawPeer real(listener_->address());
  ASSERT_EQ(real.Authenticate("mute", 1, 0, "s"), "");
  Transport* t0 = rank0.Join();
  real.Write(FrameBytes("mute", RandomFloats({1}, 8), false));
  EXPECT_TRUE(t0->Recv(1, absl::Seconds(5)).ok());
}

// A version-2 dialer (no nonce, no proof) learns why at once.
TEST_F(FaultInjectionTest, OlderHandshakeVersionIsRejectedClearly) {
  std::string v2 = EncodeHandshake({"old", 1, 0});
  const uint16_t two = 2;
  std::memcpy(&v2[4], &two, 2);
  v2.resize(kHandshakePrefixSize);
  v2 += "old";  // version 2: the job id right after the prefix
  RawPeer old(listener_->address());
  old.Write(v2);
  // Not a timeout waiting for the nonce it will never send.
  EXPECT_THAT(old.ReadReply(),
              HasSubstr("unsupported handshake version 2 (expected 3"));
}

TEST_F(FaultInjectionTest, GarbageHandshakeIsRejectedWithReason) {
  RawPeer raw(listener_->address());
  raw.Write("GET / HTTP/1.1\r\n\r\n");
  EXPECT_THAT(raw.ReadReply(), HasSubstr("bad handshake magic 0x20544547"));
}

TEST_F(FaultInjectionTest, SilentConnectionTimesOutInHandshake) {
  RawPeer raw(listener_->address());
  raw.Write("TY");
  EXPECT_THAT(raw.ReadReply(), HasSubstr("handshake: timed out after 2 of 16"));
}

TEST_F(FaultInjectionTest, HandshakeForUnknownJobIsRejectedAfterTimeout) {
  RawPeer raw(listener_->address());
  const absl::Time start = absl::Now();
  raw.Write(EncodeHandshake({"no-such-job", 1, 0}));
  EXPECT_THAT(raw.ReadReply(),
              AllOf(HasSubstr("job \"no-such-job\" for rank 0"),
                    HasSubstr("no such job/rank registered")));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));
}

TEST_F(FaultInjectionTest, GarbageFrameMagic) {
  auto imp = Impersonate(listener_.get(), "magic");
  imp.rank1->Write(std::string(64, 'Z'));
  absl::Status s = RecvError(imp.rank0.get());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("rank 1 (127.0.0.1:1)"),
                                 HasSubstr("bad frame magic")));
  // Later calls fail the same way.
  EXPECT_THAT(imp.rank0->Send(1, Message()).message(),
              HasSubstr("bad frame magic"));
}

TEST_F(FaultInjectionTest, FrameOfAnOlderReleaseNamesBothVersions) {
  auto imp = Impersonate(listener_.get(), "old");
  std::string frame = FrameBytes("old", RandomFloats({2}, 8), false);
  const uint16_t two = 2;  // a release before the chunk field
  std::memcpy(&frame[4], &two, 2);
  imp.rank1->Write(frame);
  absl::Status s = RecvError(imp.rank0.get());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(),
              HasSubstr("rank 1 (127.0.0.1:1): unsupported frame version 2 "
                        "(expected 3; the sender runs an older Trainyard "
                        "release)"));
}

TEST_F(FaultInjectionTest, HeaderPromisingMoreBytesThenClose) {
  auto imp = Impersonate(listener_.get(), "truncated");
  std::string frame =
      FrameBytes("truncated", RandomFloats({1024, 1024}, 3), false);
  const std::string header_and_1k =
      frame.substr(0, frame.size() - 4 - (4 << 20) + 1024);
  imp.rank1->Write(header_and_1k);
  imp.rank1->Close();
  absl::Status s = RecvError(imp.rank0.get());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(),
              HasSubstr(absl::StrCat(
                  "rank 1 (127.0.0.1:1): connection closed in the middle of "
                  "a frame (got ",
                  header_and_1k.size(), " of ", frame.size(), " bytes)")));
}

TEST_F(FaultInjectionTest, CorruptedChecksum) {
  auto imp = Impersonate(listener_.get(), "crc");
  imp.rank1->Write(FrameBytes("crc", RandomFloats({5, 3}, 4), true));
  absl::Status s = RecvError(imp.rank0.get());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("rank 1 (127.0.0.1:1)"),
                                 HasSubstr("checksum mismatch")));
}

TEST_F(FaultInjectionTest, OversizedFrameClaimIsRejectedBeforeReading) {
  auto imp = Impersonate(listener_.get(), "huge");
  std::string frame = FrameBytes("huge", RandomFloats({2}, 5), false);
  const uint64_t claim = uint64_t{3} << 30;
  std::memcpy(&frame[32], &claim, 8);
  imp.rank1->Write(frame.substr(0, kFramePrefixSize));
  absl::Status s = RecvError(imp.rank0.get());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(),
              HasSubstr("rank 1 (127.0.0.1:1): frame claims a payload of "
                        "3221225472 bytes, limit 2147483648"));
}

TEST_F(FaultInjectionTest, FrameForAnotherJob) {
  auto imp = Impersonate(listener_.get(), "mine");
  imp.rank1->Write(FrameBytes("theirs", RandomFloats({2}, 6), false));
  absl::Status s = RecvError(imp.rank0.get());
  EXPECT_THAT(s.message(),
              HasSubstr("rank 1 (127.0.0.1:1): received a frame for job "
                        "\"theirs\"; this transport serves job \"mine\""));
}

TEST_F(FaultInjectionTest, StalledFrameTimesOut) {
  auto imp = Impersonate(listener_.get(), "stall", absl::Seconds(1));
  // A partial prefix, then silence.
  std::string frame = FrameBytes("stall", RandomFloats({2}, 7), false);
  imp.rank1->Write(frame.substr(0, 10));
  const absl::Time start = absl::Now();
  absl::Status s = imp.rank0->Recv(1, absl::Seconds(10)).status();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(900));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.message(),
              HasSubstr("rank 1 (127.0.0.1:1): frame not complete "
                        "within 1s (got 10 of a frame prefix of 40 bytes)"));
}

TEST_F(FaultInjectionTest, PeerThatDiesWithoutAbortStillSaysNoGoodbye) {
  auto imp = Impersonate(listener_.get(), "crash");
  imp.rank1->Close();  // a process crash: the kernel closes its sockets
  absl::Status s = RecvError(imp.rank0.get());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(),
              HasSubstr("rank 1 (127.0.0.1:1): connection closed by the peer "
                        "between frames (no goodbye: the peer process died "
                        "or aborted)"));
}

TEST_F(FaultInjectionTest, AbortFrameOnTheWire) {
  auto imp = Impersonate(listener_.get(), "wire");
  const absl::Time start = absl::Now();
  imp.rank0->Abort(absl::CancelledError("cancelled by request: wire"));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));
  const std::string bytes = imp.rank1->ReadAll();
  ASSERT_GE(bytes.size(), kFramePrefixSize);
  auto prefix = DecodeFramePrefix(bytes.data());
  ASSERT_TRUE(prefix.ok()) << prefix.status();
  EXPECT_EQ(prefix->kind, FrameKind::kAbort);
  EXPECT_EQ(prefix->chunk, 0);
  ASSERT_EQ(bytes.size(),
            prefix->header_size + prefix->payload_size + kFrameTrailerSize);
  auto header = DecodeFrameHeader(
      *prefix, absl::string_view(bytes).substr(
                   kFramePrefixSize, prefix->header_size - kFramePrefixSize));
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->job_id, "wire");
  ASSERT_EQ(header->tensors.size(), 2u);
  const char* payload = bytes.data() + prefix->header_size;
  int32_t code;
  std::memcpy(&code, payload, 4);
  EXPECT_EQ(code, static_cast<int32_t>(absl::StatusCode::kCancelled));
  EXPECT_EQ(std::string(payload + 4, prefix->payload_size - 4),
            "cancelled by request: wire");
  uint32_t crc;
  std::memcpy(&crc, bytes.data() + bytes.size() - 4, 4);
  EXPECT_EQ(crc, Crc32cExtend(0, bytes.data(), bytes.size() - 4));
}

TEST_F(FaultInjectionTest, AbortDoesNotWaitForAPeerThatStoppedReading) {
  auto imp = Impersonate(listener_.get(), "stuck");
  // The raw peer never reads: 64 MiB fill both socket buffers and leave the
  // sender blocked in the middle of a frame.
  for (int i = 0; i < 4; ++i) {
    Message m;
    m.tensors = {{"x", Tensor::Zeros(DType::kFloat32, {4 << 20})}};
    ASSERT_TRUE(imp.rank0->Send(1, m).ok());
  }
  absl::SleepFor(absl::Milliseconds(200));
  const absl::Time start = absl::Now();
  imp.rank0->Abort(absl::InternalError("stage 0 failed: stuck"));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(600));
  auto own = imp.rank0->Recv(1, absl::Seconds(1)).status();
  EXPECT_EQ(own.code(), absl::StatusCode::kAborted);
}

// A frame of any kind with a valid checksum.
std::string RawFrame(FrameKind kind, const std::string& job, int64_t step,
                     const std::vector<std::pair<std::string, Tensor>>& ts) {
  absl::StatusOr<std::string> h = EncodeFrameHeader(kind, job, step, 0, 0, ts);
  CHECK(h.ok()) << h.status();
  std::string frame = *h;
  for (const auto& [name, t] : ts) {
    frame.append(static_cast<const char*>(t.raw_data()), t.nbytes());
  }
  const uint32_t crc = Crc32cExtend(0, frame.data(), frame.size());
  frame.append(reinterpret_cast<const char*>(&crc), 4);
  return frame;
}

// Rank 1 of a 2-rank job whose rank 0 is a raw socket in the test: it
// accepts rank 1's dial and answers the handshake, then the test writes
// whatever bytes it likes as rank 0.
struct FakeRank0 {
  int listen_fd = -1;
  int fd = -1;
  std::string address;
  std::unique_ptr<PeerListener> listener1;
  std::unique_ptr<Transport> rank1;

  explicit FakeRank0(const std::string& job) {
    listen_fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK_EQ(::bind(listen_fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)),
             0);
    CHECK_EQ(::listen(listen_fd, 4), 0);
    socklen_t len = sizeof(sa);
    ::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&sa), &len);
    address = absl::StrCat("127.0.0.1:", ntohs(sa.sin_port));
    listener1 = MustListen();
    absl::StatusOr<std::unique_ptr<Transport>> t;
    std::thread connect([&] {
      TcpTransportOptions o;
      o.job_id = job;
      o.rank = 1;
      o.peer_addresses = {address, listener1->address()};
      o.connect_timeout = absl::Seconds(5);
      o.io_timeout = absl::Seconds(5);
      t = ConnectTcpTransport(listener1.get(), o);
    });
    fd = ::accept(listen_fd, nullptr, nullptr);
    CHECK_GE(fd, 0);
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    // The listener's side of the handshake, with the empty secret.
    char prefix[kHandshakePrefixSize];
    CHECK_EQ(::recv(fd, prefix, sizeof(prefix), MSG_WAITALL),
             static_cast<ssize_t>(sizeof(prefix)));
    uint16_t job_len = 0;
    absl::StatusOr<Handshake> hello = DecodeHandshakePrefix(prefix, &job_len);
    CHECK(hello.ok()) << hello.status();
    std::string rest(HandshakeRestSize(job_len), '\0');
    CHECK_EQ(::recv(fd, rest.data(), rest.size(), MSG_WAITALL),
             static_cast<ssize_t>(rest.size()));
    CHECK(DecodeHandshakeRest(rest, &*hello).ok());
    CHECK_EQ(hello->job_id, job);
    const std::string nonce = NewHandshakeNonce();
    Write(EncodeHandshakeReply(HandshakeReplyCode::kChallenge, nonce));
    char proof[kHandshakeProofSize];
    CHECK_EQ(::recv(fd, proof, sizeof(proof), MSG_WAITALL),
             static_cast<ssize_t>(sizeof(proof)));
    CHECK(HandshakeMacMatches(
        HandshakeMac("", HandshakeRole::kDialer, *hello, nonce),
        *DecodeHandshakeProof(proof)));
    Write(EncodeHandshakeReply(
        HandshakeReplyCode::kAccepted,
        HandshakeMac("", HandshakeRole::kListener, *hello, nonce)));
    connect.join();
    CHECK(t.ok()) << t.status();
    rank1 = *std::move(t);
  }
  ~FakeRank0() {
    rank1.reset();
    ::close(fd);
    ::close(listen_fd);
  }
  void Write(const std::string& s) {
    CHECK_EQ(::send(fd, s.data(), s.size(), MSG_NOSIGNAL),
             static_cast<ssize_t>(s.size()));
  }
  // Reads one whole frame from rank 1 and returns its prefix.
  FramePrefix ReadFrame() {
    char prefix_bytes[kFramePrefixSize];
    CHECK_EQ(::recv(fd, prefix_bytes, sizeof(prefix_bytes), MSG_WAITALL),
             static_cast<ssize_t>(kFramePrefixSize));
    absl::StatusOr<FramePrefix> prefix = DecodeFramePrefix(prefix_bytes);
    CHECK(prefix.ok()) << prefix.status();
    std::string rest(prefix->header_size - kFramePrefixSize +
                         prefix->payload_size + kFrameTrailerSize,
                     '\0');
    CHECK_EQ(::recv(fd, rest.data(), rest.size(), MSG_WAITALL),
             static_cast<ssize_t>(rest.size()));
    return *prefix;
  }
};

Tensor Bytes(const std::string& s) {
  Tensor t = Tensor::Empty(DType::kUInt8, {static_cast<int64_t>(s.size())});
  std::memcpy(t.raw_data(), s.data(), s.size());
  return t;
}

// Rank 1 is blocked in AllReduceSum (its contribution has reached rank 0)
// when rank 0 sends `frame`; returns what AllReduceSum returned.
absl::Status AllReduceAnswer(FakeRank0* rank0, const std::string& frame) {
  absl::Status s;
  std::thread reducer([&] {
    std::vector<double> v = {1.0, 2.0};
    s = rank0->rank1->AllReduceSum(&v, absl::Seconds(10));
  });
  const FramePrefix contribution = rank0->ReadFrame();
  EXPECT_EQ(contribution.kind, FrameKind::kAllReduceContribution);
  EXPECT_EQ(contribution.chunk, 0);
  const absl::Time start = absl::Now();
  rank0->Write(frame);
  reducer.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  return s;
}

TEST(TcpTransportMalformedFrameTest, AllReduceErrorWithoutTensorIsDataLoss) {
  const std::string job = "no-tensor";
  FakeRank0 rank0(job);
  const absl::Status s =
      AllReduceAnswer(&rank0, RawFrame(FrameKind::kAllReduceError, job, 0, {}));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr("rank 0 (" + rank0.address + ")"),
                    HasSubstr("malformed all-reduce-error frame")));
  // Later calls fail the same way.
  EXPECT_THAT(rank0.rank1->Send(0, Message()).message(),
              HasSubstr("rank 0 (" + rank0.address + ")"));
}

TEST(TcpTransportMalformedFrameTest, EveryInternalKindChecksItsTensors) {
  const Tensor one_double = Tensor::Empty(DType::kFloat64, {2});
  const struct {
    const char* what;
    FrameKind kind;
    std::vector<std::pair<std::string, Tensor>> tensors;
    const char* expect;
  } cases[] = {
      {"error as int64",
       FrameKind::kAllReduceError,
       {{"message", Tensor::Empty(DType::kInt64, {3})}},
       "malformed all-reduce-error frame"},
      {"error 2-d",
       FrameKind::kAllReduceError,
       {{"message", Tensor::Empty(DType::kUInt8, {2, 3})}},
       "malformed all-reduce-error frame"},
      {"error too long",
       FrameKind::kAllReduceError,
       {{"message", Bytes(std::string(kMaxAbortMessageLength + 1, 'x'))}},
       "limit 4096"},
      {"error and more",
       FrameKind::kAllReduceError,
       {{"message", Bytes("a")}, {"message", Bytes("b")}},
       "malformed all-reduce-error frame"},
      {"result without tensor",
       FrameKind::kAllReduceResult,
       {},
       "malformed all-reduce-result frame"},
      {"result as float",
       FrameKind::kAllReduceResult,
       {{"values", Tensor::Zeros(DType::kFloat32, {2})}},
       "malformed all-reduce-result frame"},
      {"result misnamed",
       FrameKind::kAllReduceResult,
       {{"sums", one_double}},
       "malformed all-reduce-result frame"},
      {"contribution to rank 1",
       FrameKind::kAllReduceContribution,
       {{"values", one_double}},
       "only rank 0"},
      {"goodbye with a tensor",
       FrameKind::kGoodbye,
       {{"x", Bytes("x")}},
       "malformed goodbye frame"},
  };
  int i = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string job = absl::StrCat("kinds-", i++);
    FakeRank0 rank0(job);
    const absl::Status s =
        AllReduceAnswer(&rank0, RawFrame(c.kind, job, 0, c.tensors));
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_THAT(s.message(), AllOf(HasSubstr("rank 0 (" + rank0.address + ")"),
                                   HasSubstr(c.expect)));
  }
}

TEST(TcpTransportMalformedFrameTest, WellFormedAllReduceErrorCarriesTheReason) {
  const std::string job = "good-error";
  FakeRank0 rank0(job);
  const absl::Status s = AllReduceAnswer(
      &rank0, RawFrame(FrameKind::kAllReduceError, job, 0,
                       {{"message", Bytes("rank 3 sent 5 values")}}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(),
              HasSubstr("rank 0 failed the round: rank 3 sent 5 values"));
}

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
