#include "engine/checkpoint_writer.h"

#include <atomic>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

TEST(CheckpointWriterTest, RunsTasksInOrderInTheBackground) {
  CheckpointWriter writer;
  absl::Notification release;
  std::vector<int> order;
  EXPECT_EQ(writer.Submit([&] {
    release.WaitForNotification();
    order.push_back(1);
    return absl::OkStatus();
  }),
            1);
  EXPECT_EQ(writer.Submit([&] {
    order.push_back(2);
    return absl::OkStatus();
  }),
            2);
  // The caller was not blocked by the first task.
  EXPECT_EQ(writer.completed(), 0);
  release.Notify();
  EXPECT_TRUE(writer.Drain().ok());
  EXPECT_EQ(writer.completed(), 2);
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
}

TEST(CheckpointWriterTest, FirstErrorStaysAndLaterTasksAreSkipped) {
  CheckpointWriter writer;
  std::atomic<int> ran{0};
  writer.Submit([&] {
    ++ran;
    return absl::DataLossError("disk full: /ckpt/step_00000005");
  });
  writer.Submit([&] {
    ++ran;
    return absl::OkStatus();
  });
  absl::Status st = writer.Drain();
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(st.message(), "disk full: /ckpt/step_00000005");
  EXPECT_EQ(ran.load(), 1);
  EXPECT_EQ(writer.completed(), 2);
  EXPECT_EQ(writer.status().code(), absl::StatusCode::kDataLoss);
}

TEST(CheckpointWriterTest, DestructorFinishesQueuedWork) {
  std::atomic<int> ran{0};
  {
    CheckpointWriter writer;
    for (int i = 0; i < 5; ++i) {
      writer.Submit([&] {
        ++ran;
        return absl::OkStatus();
      });
    }
  }
  EXPECT_EQ(ran.load(), 5);
}

}  // namespace
}  // namespace trainyard
