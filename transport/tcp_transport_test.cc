#include "transport/tcp_transport.h"

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/random.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/in_process_transport.h"
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

}  // namespace
}  // namespace trainyard
