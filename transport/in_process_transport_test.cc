#include "transport/in_process_transport.h"

#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

using ::testing::HasSubstr;

Message Mb(int mb) {
  Message m;
  m.microbatch = mb;
  m.tensors.push_back({"x", Tensor::FromVector({float(mb)}, {1})});
  return m;
}

TEST(InProcessTransportTest, DeliversInOrder) {
  InProcessHub hub(2);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(hub.rank(0)->Send(1, Mb(i)).ok());
  for (int i = 0; i < 5; ++i) {
    auto m = hub.rank(1)->Recv(0, absl::Seconds(1));
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->microbatch, i);
    EXPECT_EQ(m->tensors[0].second.data<float>()[0], float(i));
  }
}

TEST(InProcessTransportTest, RecvTimesOut) {
  InProcessHub hub(2);
  auto m = hub.rank(1)->Recv(0, absl::Milliseconds(20));
  EXPECT_EQ(m.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(m.status().message(), HasSubstr("no message from rank 0"));
}

TEST(InProcessTransportTest, AbortWakesWaiters) {
  InProcessHub hub(3);
  absl::Status recv_status, reduce_status;
  std::thread waiter(
      [&] { recv_status = hub.rank(1)->Recv(0, absl::Seconds(30)).status(); });
  std::thread reducer([&] {
    std::vector<double> v = {1.0};
    reduce_status = hub.rank(2)->AllReduceSum(&v, absl::Seconds(30));
  });
  absl::SleepFor(absl::Milliseconds(20));
  hub.rank(0)->Abort(absl::InternalError("stage 0 failed: disk full"));
  waiter.join();
  reducer.join();
  EXPECT_EQ(recv_status.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(recv_status.message(), HasSubstr("stage 0 failed: disk full"));
  EXPECT_EQ(reduce_status.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(hub.rank(1)->Send(2, Mb(0)).code(), absl::StatusCode::kAborted);
}

TEST(InProcessTransportTest, AllReduceSumsEveryRoundOnEveryRank) {
  const int n = 4, rounds = 50;
  InProcessHub hub(n);
  std::vector<std::vector<double>> last(n);
  std::vector<absl::Status> status(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      for (int k = 0; k < rounds; ++k) {
        std::vector<double> v = {double(r), double(k * (r + 1))};
        status[r] = hub.rank(r)->AllReduceSum(&v, absl::Seconds(10));
        if (!status[r].ok()) return;
        // sum over r of r = 6; sum over r of k*(r+1) = 10k
        if (v[0] != 6.0 || v[1] != 10.0 * k) {
          status[r] = absl::InternalError("wrong sum");
          return;
        }
        last[r] = v;
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(status[r].ok()) << r << ": " << status[r];
    EXPECT_EQ(last[r], (std::vector<double>{6.0, 10.0 * (rounds - 1)}));
  }
}

TEST(InProcessTransportTest, AllReduceTimesOutWhenARankIsMissing) {
  InProcessHub hub(2);
  std::vector<double> v = {1.0};
  absl::Status st = hub.rank(0)->AllReduceSum(&v, absl::Milliseconds(20));
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(st.message(), HasSubstr("did not arrive"));
}

TEST(InProcessTransportTest, RejectsBadPeer) {
  InProcessHub hub(2);
  EXPECT_EQ(hub.rank(0)->Send(0, Mb(0)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(hub.rank(0)->Send(5, Mb(0)).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trainyard
