#include "controller/rendezvous_table.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;
using Reply = RendezvousTable::Reply;

const absl::Time kT0 = absl::FromUnixSeconds(1000);

v1::RendezvousPut Put(int64_t id, const std::string& key,
                      const std::string& value,
                      const std::string& job = "job-1") {
  v1::RendezvousPut p;
  p.set_request_id(id);
  p.set_job_id(job);
  p.set_key(key);
  p.set_value(value);
  return p;
}

v1::RendezvousGet Get(int64_t id, const std::string& key, int64_t timeout_ms,
                      const std::string& job = "job-1") {
  v1::RendezvousGet g;
  g.set_request_id(id);
  g.set_job_id(job);
  g.set_key(key);
  g.set_timeout_ms(timeout_ms);
  return g;
}

absl::StatusCode Code(const Reply& r) {
  return static_cast<absl::StatusCode>(r.reply.code());
}

TEST(RendezvousTableTest, GetAfterPutAnswersAtOnce) {
  RendezvousTable table;
  table.Open("job-1");
  std::vector<Reply> put = table.Put("w-1", Put(1, "job-1/nccl_id", "id"));
  ASSERT_EQ(put.size(), 1u);
  EXPECT_EQ(put[0].worker_id, "w-1");
  EXPECT_EQ(put[0].reply.request_id(), 1);
  EXPECT_EQ(Code(put[0]), absl::StatusCode::kOk);
  std::vector<Reply> got = table.Get("w-2", Get(7, "job-1/nccl_id", 0), kT0);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].worker_id, "w-2");
  EXPECT_EQ(got[0].reply.request_id(), 7);
  EXPECT_EQ(Code(got[0]), absl::StatusCode::kOk);
  EXPECT_EQ(got[0].reply.value(), "id");
}

TEST(RendezvousTableTest, WaitingGetsAreAnsweredByThePut) {
  RendezvousTable table;
  table.Open("job-1");
  EXPECT_TRUE(table.Get("w-2", Get(5, "k", 1000), kT0).empty());
  EXPECT_TRUE(table.Get("w-3", Get(6, "k", 1000), kT0).empty());
  EXPECT_TRUE(table.Get("w-3", Get(8, "other", 1000), kT0).empty());
  EXPECT_EQ(table.PendingGets("job-1"), 3);
  std::vector<Reply> out = table.Put("w-1", Put(1, "k", "v"));
  ASSERT_EQ(out.size(), 3u);  // the Put's own reply, then the two Gets
  EXPECT_EQ(out[0].reply.request_id(), 1);
  EXPECT_EQ(out[1].worker_id, "w-2");
  EXPECT_EQ(out[1].reply.request_id(), 5);
  EXPECT_EQ(out[1].reply.value(), "v");
  EXPECT_EQ(out[2].worker_id, "w-3");
  EXPECT_EQ(out[2].reply.request_id(), 6);
  EXPECT_EQ(table.PendingGets("job-1"), 1);  // still waiting for "other"
}

TEST(RendezvousTableTest, KeysAreWriteOnce) {
  RendezvousTable table;
  table.Open("job-1");
  ASSERT_EQ(Code(table.Put("w-1", Put(1, "k", "first"))[0]),
            absl::StatusCode::kOk);
  // A retry with the same value is a no-op.
  EXPECT_EQ(Code(table.Put("w-1", Put(2, "k", "first"))[0]),
            absl::StatusCode::kOk);
  std::vector<Reply> other = table.Put("w-2", Put(3, "k", "second"));
  ASSERT_EQ(other.size(), 1u);
  EXPECT_EQ(Code(other[0]), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(other[0].reply.error(),
              HasSubstr("rendezvous of job job-1: key \"k\" already holds a "
                        "different 5-byte value"));
  EXPECT_EQ(table.Get("w-3", Get(4, "k", 0), kT0)[0].reply.value(), "first");
}

TEST(RendezvousTableTest, GetTimesOutNamingTheKey) {
  RendezvousTable table;
  table.Open("job-1");
  EXPECT_TRUE(table.Get("w-2", Get(5, "job-1/nccl_id", 1500), kT0).empty());
  EXPECT_TRUE(table.Expire(kT0 + absl::Milliseconds(1499)).empty());
  std::vector<Reply> out = table.Expire(kT0 + absl::Milliseconds(1500));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].worker_id, "w-2");
  EXPECT_EQ(out[0].reply.request_id(), 5);
  EXPECT_EQ(Code(out[0]), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(out[0].reply.error(),
            "rendezvous of job job-1: key \"job-1/nccl_id\" was not put "
            "within 1.5s");
  EXPECT_EQ(table.PendingGets("job-1"), 0);
}

TEST(RendezvousTableTest, PostponeMovesEveryWaitingDeadline) {
  RendezvousTable table;
  table.Open("job-1");
  table.Open("job-2");
  EXPECT_TRUE(table.Get("w-2", Get(5, "a", 1500), kT0).empty());
  EXPECT_TRUE(table.Get("w-3", Get(6, "b", 1000, "job-2"), kT0).empty());
  table.Postpone(absl::Seconds(3));
  EXPECT_TRUE(table.Expire(kT0 + absl::Milliseconds(3999)).empty());
  std::vector<Reply> out = table.Expire(kT0 + absl::Seconds(4));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].reply.request_id(), 6);
  // The message names the timeout asked for, not the postponed one.
  EXPECT_THAT(out[0].reply.error(), HasSubstr("was not put within 1s"));
  out = table.Expire(kT0 + absl::Milliseconds(4500));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].reply.request_id(), 5);
}

TEST(RendezvousTableTest, GetTimeoutIsCapped) {
  RendezvousLimits limits;
  limits.max_get_timeout = absl::Seconds(2);
  RendezvousTable table(limits);
  table.Open("job-1");
  // An hour asked, two seconds given.
  EXPECT_TRUE(table.Get("w-2", Get(5, "k", 3600 * 1000), kT0).empty());
  std::vector<Reply> out = table.Expire(kT0 + absl::Seconds(2));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_THAT(out[0].reply.error(), HasSubstr("was not put within 2s (the "
                                              "controller caps a Get's "
                                              "timeout there)"));
}

TEST(RendezvousTableTest, GetWithoutTimeoutDoesNotWait) {
  RendezvousTable table;
  table.Open("job-1");
  std::vector<Reply> out = table.Get("w-2", Get(5, "k", 0), kT0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(Code(out[0]), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(table.PendingGets("job-1"), 0);
}

TEST(RendezvousTableTest, CloseAnswersWaitingGetsAndDropsTheStore) {
  RendezvousTable table;
  table.Open("job-1");
  table.Open("job-2");
  ASSERT_EQ(Code(table.Put("w-1", Put(1, "k", "v"))[0]), absl::StatusCode::kOk);
  EXPECT_TRUE(table.Get("w-2", Get(5, "missing", 60000), kT0).empty());
  EXPECT_TRUE(table.Get("w-9", Get(6, "missing", 60000, "job-2"), kT0).empty());
  std::vector<Reply> out = table.Close(
      "job-1", absl::AbortedError("job job-1 ended CANCELLED: by request"));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].worker_id, "w-2");
  EXPECT_EQ(Code(out[0]), absl::StatusCode::kAborted);
  EXPECT_EQ(out[0].reply.error(), "job job-1 ended CANCELLED: by request");
  EXPECT_FALSE(table.IsOpen("job-1"));
  EXPECT_TRUE(table.IsOpen("job-2"));
  EXPECT_EQ(table.PendingGets("job-2"), 1);  // other jobs are untouched
  // The values went with the store.
  std::vector<Reply> late = table.Get("w-2", Get(7, "k", 0), kT0);
  ASSERT_EQ(late.size(), 1u);
  EXPECT_EQ(Code(late[0]), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(late[0].reply.error(), HasSubstr("job job-1: the job is not "
                                               "running"));
  EXPECT_TRUE(table.Close("job-1", absl::AbortedError("again")).empty());
}

TEST(RendezvousTableTest, KeyAndValueSizesAreBounded) {
  RendezvousTable table;
  table.Open("job-1");
  const std::string long_key(257, 'k');
  std::vector<Reply> out = table.Put("w-1", Put(1, long_key, "v"));
  EXPECT_EQ(Code(out[0]), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out[0].reply.error(),
              HasSubstr("is 257 bytes; the limit is 256"));
  EXPECT_LT(out[0].reply.error().size(), 200u);  // the key is shortened
  out = table.Get("w-1", Get(2, long_key, 1000), kT0);
  EXPECT_EQ(Code(out[0]), absl::StatusCode::kInvalidArgument);
  out = table.Put("w-1", Put(3, "", "v"));
  EXPECT_EQ(Code(out[0]), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out[0].reply.error(), HasSubstr("the key is empty"));

  ASSERT_EQ(Code(table.Put("w-1", Put(4, std::string(256, 'k'),
                                      std::string(64 * 1024, 'v')))[0]),
            absl::StatusCode::kOk);
  out = table.Put("w-1", Put(5, "big", std::string(64 * 1024 + 1, 'v')));
  EXPECT_EQ(Code(out[0]), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out[0].reply.error(),
            "rendezvous of job job-1: the value of key \"big\" is 65537 "
            "bytes; the limit is 65536");
}

TEST(RendezvousTableTest, KeysPerJobAreBounded) {
  RendezvousTable table;
  table.Open("job-1");
  for (int i = 0; i < 64; ++i) {
    ASSERT_EQ(Code(table.Put("w-1", Put(i, absl::StrCat("k", i), "v"))[0]),
              absl::StatusCode::kOk);
  }
  std::vector<Reply> out = table.Put("w-1", Put(99, "one-more", "v"));
  EXPECT_EQ(Code(out[0]), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(out[0].reply.error(),
            "rendezvous of job job-1: cannot add key \"one-more\": the job "
            "already holds 64 keys; the limit is 64");
  // Re-putting an existing key is still fine.
  EXPECT_EQ(Code(table.Put("w-1", Put(100, "k3", "v"))[0]),
            absl::StatusCode::kOk);
}

TEST(RendezvousTableTest, WaitingGetsPerJobAreBounded) {
  RendezvousLimits limits;
  limits.max_pending_gets_per_job = 2;
  RendezvousTable table(limits);
  table.Open("job-1");
  EXPECT_TRUE(table.Get("w-1", Get(1, "a", 1000), kT0).empty());
  EXPECT_TRUE(table.Get("w-1", Get(2, "b", 1000), kT0).empty());
  std::vector<Reply> out = table.Get("w-1", Get(3, "c", 1000), kT0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(Code(out[0]), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(out[0].reply.error(),
              HasSubstr("cannot wait for key \"c\": 2 Gets already wait in "
                        "this job; the limit is 2"));
}

TEST(RendezvousTableTest, JobsWithoutAStoreAreRefused) {
  RendezvousTable table;
  std::vector<Reply> out = table.Put("w-1", Put(1, "k", "v", "job-9"));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(Code(out[0]), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(out[0].reply.error(),
            "rendezvous of job job-9: the job is not running");
}

}  // namespace
}  // namespace trainyard
