#include "controller/job_event_log.h"

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

v1::JobEvent StepEvent(int64_t step) {
  v1::JobEvent e;
  e.mutable_step()->set_step(step);
  return e;
}

// A job's stored events (event i is step i) and the reads asked of them.
struct FakeStore {
  std::vector<v1::JobEvent> events;
  std::vector<std::pair<int64_t, int64_t>> reads;  // (from, count)
  absl::Status error;

  JobEventLog::StoredEvents Reader() {
    return [this](int64_t from,
                  int64_t count) -> absl::StatusOr<std::vector<v1::JobEvent>> {
      reads.push_back({from, count});
      if (!error.ok()) return error;
      return std::vector<v1::JobEvent>(events.begin() + from,
                                       events.begin() + from + count);
    };
  }
  // Appends step events first..last to the store and to `log`.
  void Append(JobEventLog& log, int64_t first, int64_t last) {
    for (int64_t i = first; i <= last; ++i) {
      events.push_back(StepEvent(i));
      EXPECT_EQ(log.Append(StepEvent(i)), i);
    }
  }
};

std::vector<int64_t> Steps(const std::vector<v1::JobEvent>& events) {
  std::vector<int64_t> steps;
  for (const v1::JobEvent& e : events) steps.push_back(e.step().step());
  return steps;
}

TEST(JobEventLogTest, HoldsTheNewestEventsAndReadsOlderOnesFromTheStore) {
  FakeStore store;
  JobEventLog log(0, {}, v1::JobStateChange(), /*max_in_memory=*/4,
                  store.Reader());
  store.Append(log, 0, 9);
  EXPECT_EQ(log.size(), 10);
  EXPECT_EQ(log.first_in_memory(), 6);

  // From memory: no store read.
  std::vector<v1::JobEvent> out;
  ASSERT_TRUE(log.Read(7, 100, &out).ok());
  EXPECT_THAT(Steps(out), ElementsAre(7, 8, 9));
  EXPECT_TRUE(store.reads.empty());

  // Across the boundary: the older part from the store, the rest from
  // memory.
  out.clear();
  ASSERT_TRUE(log.Read(3, 5, &out).ok());
  EXPECT_THAT(Steps(out), ElementsAre(3, 4, 5, 6, 7));
  EXPECT_THAT(store.reads, ElementsAre(Pair(3, 3)));

  // Past the end: nothing, and no error.
  out.clear();
  ASSERT_TRUE(log.Read(10, 5, &out).ok());
  EXPECT_TRUE(out.empty());
}

TEST(JobEventLogTest, StartsFromTheStoresTailAndItsState) {
  FakeStore store;
  for (int64_t i = 0; i < 10; ++i) store.events.push_back(StepEvent(i));
  v1::JobStateChange running;
  running.set_state(v1::RUNNING);
  // A tail longer than the log may hold: the newest 3 are kept.
  std::vector<v1::JobEvent> tail(store.events.begin() + 5, store.events.end());
  JobEventLog log(5, std::move(tail), running, 3, store.Reader());
  EXPECT_EQ(log.size(), 10);
  EXPECT_EQ(log.first_in_memory(), 7);
  JobEventLog::Snapshot snap = log.Subscribe({});
  EXPECT_EQ(snap.state.state(), v1::RUNNING);
  EXPECT_EQ(snap.size, 10);
  std::vector<v1::JobEvent> out;
  for (int64_t i = 0; i < log.size(); i = out.size()) {
    ASSERT_TRUE(log.Read(i, JobEventLog::kEventsPerRead, &out).ok());
  }
  EXPECT_THAT(Steps(out), ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8, 9));
}

TEST(JobEventLogTest, AStoreErrorNamesTheEvents) {
  FakeStore store;
  JobEventLog log(0, {}, v1::JobStateChange(), 2, store.Reader());
  store.Append(log, 0, 4);
  store.error = absl::InternalError("disk I/O error");
  std::vector<v1::JobEvent> out;
  absl::Status st = log.Read(1, 10, &out);
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(st.message(),
              HasSubstr("reading events 1..2 from the store: disk I/O error"));
  EXPECT_TRUE(out.empty());
  // What memory holds is still read.
  ASSERT_TRUE(log.Read(3, 10, &out).ok());
  EXPECT_THAT(Steps(out), ElementsAre(3, 4));
}

}  // namespace
}  // namespace trainyard
