#include "core/rendezvous.h"

#include <string>
#include <thread>
#include <vector>

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

}  // namespace
}  // namespace trainyard
