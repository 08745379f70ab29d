#include "engine/job_log.h"

#include <mutex>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

// What a forwarder sent.
class Sent {
 public:
  std::function<bool(const v1::WorkerMessage&)> Sender() {
    return [this](const v1::WorkerMessage& m) {
      std::lock_guard<std::mutex> l(mu_);
      lines_.push_back(m.log());
      return true;
    };
  }
  std::vector<v1::StageLogLine> lines() {
    std::lock_guard<std::mutex> l(mu_);
    return lines_;
  }
  std::vector<std::string> texts() {
    std::vector<std::string> out;
    for (const auto& l : lines()) out.push_back(l.text());
    return out;
  }

 private:
  std::mutex mu_;
  std::vector<v1::StageLogLine> lines_;
};

TEST(JobLogTest, LinesLoggedInAScopeAreSentAsTheJobsLines) {
  Sent sent;
  JobLogForwarder forwarder(sent.Sender());
  const int64_t before = absl::ToUnixMillis(absl::Now());
  {
    ScopedJobLog scope(&forwarder, "job-4", 2);
    LOG(INFO) << "stage started";
    LOG(WARNING) << "peer slow";
  }
  LOG(INFO) << "not in a scope";
  forwarder.Flush();
  std::vector<v1::StageLogLine> lines = sent.lines();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].job_id(), "job-4");
  EXPECT_EQ(lines[0].stage(), 2);
  EXPECT_EQ(lines[0].text(), "stage started");
  EXPECT_EQ(lines[0].severity(), v1::LOG_SEVERITY_INFO);
  EXPECT_GE(lines[0].time_ms(), before - 1);
  EXPECT_LE(lines[0].time_ms(), absl::ToUnixMillis(absl::Now()));
  EXPECT_EQ(lines[1].severity(), v1::LOG_SEVERITY_WARNING);
}

TEST(JobLogTest, OtherThreadsLinesAreNotTheJobs) {
  Sent sent;
  JobLogForwarder forwarder(sent.Sender());
  ScopedJobLog scope(&forwarder, "job-1", 0);
  std::thread other([] { LOG(INFO) << "from another thread"; });
  other.join();
  LOG(INFO) << "mine";
  forwarder.Flush();
  EXPECT_THAT(sent.texts(), ::testing::ElementsAre("mine"));
}

TEST(JobLogTest, AnInnerScopeWinsUntilItEnds) {
  Sent a, b;
  JobLogForwarder fa(a.Sender());
  JobLogForwarder fb(b.Sender());
  ScopedJobLog outer(&fa, "job-1", 0);
  {
    ScopedJobLog inner(&fb, "job-2", 1);
    LOG(INFO) << "inner";
  }
  LOG(INFO) << "outer";
  fa.Flush();
  fb.Flush();
  EXPECT_THAT(a.texts(), ::testing::ElementsAre("outer"));
  ASSERT_EQ(b.lines().size(), 1u);
  EXPECT_EQ(b.lines()[0].job_id(), "job-2");
}

TEST(JobLogTest, TheSenderThreadSendsWithoutAFlush) {
  Sent sent;
  JobLogForwarder forwarder(sent.Sender());
  {
    ScopedJobLog scope(&forwarder, "job-1", 0);
    LOG(INFO) << "eventually";
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (sent.lines().empty() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_THAT(sent.texts(), ::testing::ElementsAre("eventually"));
}

TEST(JobLogTest, LinesBeyondTheRateAreDroppedAndCounted) {
  Sent sent;
  JobLogOptions options;
  options.burst = 3;
  options.lines_per_second = 20;
  JobLogForwarder forwarder(sent.Sender(), options);
  ScopedJobLog scope(&forwarder, "job-1", 0);
  for (int i = 0; i < 100; ++i) LOG(INFO) << "spam " << i;
  forwarder.Flush();
  const size_t taken = sent.lines().size();
  EXPECT_GE(taken, 3u);
  EXPECT_LT(taken, 10u);
  EXPECT_EQ(forwarder.dropped(), static_cast<int64_t>(100 - taken));
  absl::SleepFor(absl::Milliseconds(200));
  LOG(INFO) << "later";
  forwarder.Flush();
  std::vector<std::string> texts = sent.texts();
  ASSERT_EQ(texts.size(), taken + 2);
  EXPECT_THAT(texts[taken], ::testing::HasSubstr("line(s) dropped"));
  EXPECT_EQ(texts.back(), "later");
}

TEST(JobLogTest, TheWorkersOwnPrefixIsDropped) {
  Sent sent;
  JobLogOptions options;
  options.drop_prefix = "trainyard-worker w1: ";
  JobLogForwarder forwarder(sent.Sender(), options);
  ScopedJobLog scope(&forwarder, "job-1", 0);
  LOG(INFO) << "trainyard-worker w1: job job-1 stage 0 done";
  LOG(INFO) << "trainyard-worker w2: someone else";
  forwarder.Flush();
  EXPECT_THAT(sent.texts(),
              ::testing::ElementsAre("job job-1 stage 0 done",
                                     "trainyard-worker w2: someone else"));
}

TEST(JobLogTest, LinesAreValidUtf8AndCut) {
  EXPECT_EQ(SanitizeUtf8("plain", 100), "plain");
  EXPECT_EQ(SanitizeUtf8("caf\xC3\xA9", 100), "caf\xC3\xA9");
  EXPECT_EQ(SanitizeUtf8("bad \xFF\xC3 end", 100), "bad ?? end");
  EXPECT_EQ(SanitizeUtf8("\xED\xA0\x80", 100), "???");  // a surrogate
  // Cut before a character that would not fit whole.
  EXPECT_EQ(SanitizeUtf8("ab\xE2\x82\xAC", 4), "ab");
  Sent sent;
  JobLogOptions options;
  options.max_line_bytes = 10;
  JobLogForwarder forwarder(sent.Sender(), options);
  ScopedJobLog scope(&forwarder, "job-1", 0);
  LOG(INFO) << std::string(50, 'x');
  forwarder.Flush();
  EXPECT_THAT(sent.texts(), ::testing::ElementsAre(std::string(10, 'x')));
}

}  // namespace
}  // namespace trainyard
