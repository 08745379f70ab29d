#include "transport/rendezvous.h"

#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;

TEST(InProcessRendezvousTest, GetReturnsWhatWasPut) {
  InProcessRendezvous rdv;
  ASSERT_TRUE(rdv.Put("job/a", std::string("\x00\x01xyz", 5)).ok());
  absl::StatusOr<std::string> got = rdv.Get("job/a", absl::Seconds(1));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, std::string("\x00\x01xyz", 5));
}

TEST(InProcessRendezvousTest, GetWaitsForALaterPut) {
  InProcessRendezvous rdv;
  std::thread putter([&] {
    absl::SleepFor(absl::Milliseconds(50));
    ASSERT_TRUE(rdv.Put("job/nccl_id", "id-bytes").ok());
  });
  absl::StatusOr<std::string> got = rdv.Get("job/nccl_id", absl::Seconds(10));
  putter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "id-bytes");
}

TEST(InProcessRendezvousTest, GetTimesOutNamingTheKey) {
  InProcessRendezvous rdv;
  ASSERT_TRUE(rdv.Put("job/other", "x").ok());
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> got =
      rdv.Get("job/nccl_id", absl::Milliseconds(30));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(30));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(got.status().message(), HasSubstr("\"job/nccl_id\""));
  EXPECT_THAT(got.status().message(), HasSubstr("30ms"));
}

TEST(InProcessRendezvousTest, SamePutTwiceIsANoOp) {
  InProcessRendezvous rdv;
  ASSERT_TRUE(rdv.Put("k", "v").ok());
  EXPECT_TRUE(rdv.Put("k", "v").ok());
  EXPECT_EQ(*rdv.Get("k", absl::ZeroDuration()), "v");
}

TEST(InProcessRendezvousTest, DifferentPutIsAlreadyExistsAndKeepsTheFirst) {
  InProcessRendezvous rdv;
  ASSERT_TRUE(rdv.Put("k", "first").ok());
  absl::Status st = rdv.Put("k", "second");
  EXPECT_EQ(st.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(st.message(), HasSubstr("\"k\""));
  EXPECT_EQ(*rdv.Get("k", absl::ZeroDuration()), "first");
}

TEST(InProcessRendezvousTest, EmptyKeyIsInvalid) {
  InProcessRendezvous rdv;
  EXPECT_EQ(rdv.Put("", "v").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rdv.Get("", absl::ZeroDuration()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Many ranks as threads: rank 0 publishes, every other rank reads it.
TEST(InProcessRendezvousTest, ManyReadersSeeOneWriter) {
  InProcessRendezvous rdv;
  constexpr int kRanks = 8;
  std::vector<std::string> seen(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      if (r == 0) {
        ASSERT_TRUE(rdv.Put("job/nccl_id", "unique").ok());
        seen[r] = "unique";
      } else {
        absl::StatusOr<std::string> v =
            rdv.Get("job/nccl_id", absl::Seconds(10));
        ASSERT_TRUE(v.ok()) << v.status();
        seen[r] = *v;
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(seen[r], "unique") << "rank " << r;
}

// The far side of a RemoteRendezvous, as the controller is for a worker: a
// server thread per request answers it from an InProcessRendezvous (a Get
// waits there on its own thread, so replies come back out of order,
// matched only by request id).
class FakeStore {
 public:
  using Request = RemoteRendezvous::Request;

  ~FakeStore() {
    for (std::thread& t : threads_) t.join();
  }

  // Where replies go; set before the first call.
  void Attach(RemoteRendezvous* rdv) {
    absl::MutexLock lock(&mu_);
    rdv_ = rdv;
  }
  // The sender to hand a RemoteRendezvous.
  RemoteRendezvous::Sender Sender() {
    return [this](const Request& request) {
      absl::MutexLock lock(&mu_);
      if (!up_) return false;
      ++requests_;
      if (!answering_) return true;  // swallowed: no reply ever comes
      threads_.emplace_back([this, rdv = rdv_, request] {
        if (request.kind == Request::Kind::kPut) {
          absl::Status st = store_.Put(request.key, request.value);
          rdv->OnReply(request.id, st.ok() ? absl::StatusOr<std::string>("")
                                           : absl::StatusOr<std::string>(st));
        } else {
          rdv->OnReply(request.id, store_.Get(request.key, request.timeout));
        }
      });
      return true;
    };
  }
  // Down: the sender fails. Not answering: requests vanish.
  void SetUp(bool up) {
    absl::MutexLock lock(&mu_);
    up_ = up;
  }
  void SetAnswering(bool answering) {
    absl::MutexLock lock(&mu_);
    answering_ = answering;
  }
  int requests() {
    absl::MutexLock lock(&mu_);
    return requests_;
  }

 private:
  InProcessRendezvous store_;
  absl::Mutex mu_;
  RemoteRendezvous* rdv_ = nullptr;
  bool up_ = true;
  bool answering_ = true;
  int requests_ = 0;
  std::vector<std::thread> threads_;
};

TEST(RemoteRendezvousTest, PutAndGetGoThroughTheStore) {
  FakeStore store;
  RemoteRendezvous rdv("controller c:1", store.Sender());
  store.Attach(&rdv);
  // Two Gets wait; the later key is put first, so the replies cross.
  absl::StatusOr<std::string> a, b;
  std::thread get_a([&] { a = rdv.Get("job/a", absl::Seconds(10)); });
  std::thread get_b([&] { b = rdv.Get("job/b", absl::Seconds(10)); });
  absl::SleepFor(absl::Milliseconds(50));
  ASSERT_TRUE(rdv.Put("job/b", "bee").ok());
  ASSERT_TRUE(rdv.Put("job/a", "ay").ok());
  get_a.join();
  get_b.join();
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(*a, "ay");
  EXPECT_EQ(*b, "bee");
}

TEST(RemoteRendezvousTest, StoreErrorsComeBackAsTheyAre) {
  FakeStore store;
  RemoteRendezvous rdv("controller c:1", store.Sender());
  store.Attach(&rdv);
  ASSERT_TRUE(rdv.Put("k", "first").ok());
  EXPECT_TRUE(rdv.Put("k", "first").ok());
  absl::Status st = rdv.Put("k", "second");
  EXPECT_EQ(st.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(st.message(), HasSubstr("\"k\""));
  absl::StatusOr<std::string> got = rdv.Get("missing", absl::Milliseconds(20));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(got.status().message(), HasSubstr("\"missing\""));
}

TEST(RemoteRendezvousTest, AbortFailsAWaitingGetAtOnce) {
  FakeStore store;
  store.SetAnswering(false);
  RemoteRendezvous rdv("controller c:1", store.Sender());
  absl::StatusOr<std::string> got;
  const absl::Time start = absl::Now();
  std::thread getter([&] { got = rdv.Get("job/nccl_id", absl::Minutes(5)); });
  while (store.requests() == 0) absl::SleepFor(absl::Milliseconds(1));
  rdv.Abort(absl::UnavailableError(
      "worker w lost its connection to the controller at c:1"));
  getter.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(got.status().message(), HasSubstr("controller at c:1"));
  // Later calls fail the same way without sending anything.
  EXPECT_EQ(rdv.Put("k", "v").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(store.requests(), 1);
}

TEST(RemoteRendezvousTest, ConnectionDownIsUnavailableNamingTheRemote) {
  FakeStore store;
  store.SetUp(false);
  RemoteRendezvous rdv("controller c:1", store.Sender());
  absl::StatusOr<std::string> got = rdv.Get("job/nccl_id", absl::Seconds(5));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(got.status().message(),
            "rendezvous: cannot send the Get of key \"job/nccl_id\" to "
            "controller c:1: the connection is down");
}

TEST(RemoteRendezvousTest, NoReplyIsDeadlineExceededNamingRemoteAndKey) {
  FakeStore store;
  store.SetAnswering(false);
  RemoteRendezvous rdv("controller c:1", store.Sender(),
                       /*reply_timeout=*/absl::Milliseconds(30));
  const absl::Time start = absl::Now();
  absl::Status st = rdv.Put("job/nccl_id", "v");
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(30));
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(st.message(),
            "rendezvous: no reply from controller c:1 to the Put of key "
            "\"job/nccl_id\" by its deadline");
}

// A reply for a call that gave up is dropped, and request ids are unique in
// the process, so it can answer no later call, of this or another
// RemoteRendezvous (one per job on a worker's stream).
TEST(RemoteRendezvousTest, LateRepliesAreIgnored) {
  std::vector<int64_t> ids;
  auto record = [&ids](const RemoteRendezvous::Request& r) {
    ids.push_back(r.id);
    return true;
  };
  RemoteRendezvous first("controller c:1", record, absl::Milliseconds(10));
  RemoteRendezvous second("controller c:1", record, absl::Milliseconds(10));
  EXPECT_EQ(first.Put("k", "v").code(), absl::StatusCode::kDeadlineExceeded);
  first.OnReply(ids[0], std::string("late"));  // after the call gave up
  EXPECT_EQ(second.Get("k", absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_NE(ids[0], ids[1]);
  second.OnReply(ids[0], std::string("for someone else"));  // dropped
}

}  // namespace
}  // namespace trainyard
